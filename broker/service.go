package broker

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"sync"
	"time"

	"github.com/nats-io/nats.go"
	"github.com/nats-io/nats.go/micro"
	"github.com/nats-io/nuid"

	"github.com/natstone/natstone/subjects"
)

// ServiceName is the name natstone registers under in NATS service discovery.
const ServiceName = "natstone"

// The broker speaks the NATS service protocol ($SRV.PING, $SRV.INFO, $SRV.STATS — what
// `nats micro ls|info|stats` read) itself instead of through the micro package: micro counts a
// request when its handler returns, but natstone answers from the request's own goroutine later,
// so micro could count neither the processing time nor the errors. The bodies are micro's types.

// endpoint is one operation's subscription and statistics.
type endpoint struct {
	op      subjects.Op
	subject string

	// mu guards stats.
	mu    sync.Mutex
	stats micro.EndpointStats
}

// record counts one request that took d and ended with err (nil on success).
func (ep *endpoint) record(d time.Duration, err *subjects.Error) {
	ep.mu.Lock()
	defer ep.mu.Unlock()
	ep.stats.NumRequests++
	ep.stats.ProcessingTime += d
	ep.stats.AverageProcessingTime = ep.stats.ProcessingTime / time.Duration(ep.stats.NumRequests)
	if err != nil {
		ep.stats.NumErrors++
		ep.stats.LastError = fmt.Sprintf("%d:%s", err.Code.Status(), err.Message)
	}
}

func (ep *endpoint) snapshot() *micro.EndpointStats {
	ep.mu.Lock()
	defer ep.mu.Unlock()
	s := ep.stats
	return &s
}

// service is the broker's presence on NATS: its endpoints and its discovery responders.
type service struct {
	id        string
	started   time.Time
	endpoints []*endpoint
	subs      []*nats.Subscription
}

func (s *service) identity(b *Broker) micro.ServiceIdentity {
	meta := map[string]string{"prefix": b.space.Prefix()}
	if b.events.enabled() {
		meta["events"] = b.events.store.Prefix()
	}
	return micro.ServiceIdentity{Name: ServiceName, ID: s.id, Version: Version, Metadata: meta}
}

// serve subscribes one endpoint per operation (<prefix>.<op>.*, and <prefix>.list) and the
// discovery subjects.
func (b *Broker) serve() error {
	s := &service{id: nuid.Next(), started: time.Now().UTC()}
	b.svc = s
	sub, err := b.listen()
	if err != nil {
		return fmt.Errorf("subscribe the inbox of unheard replies: %w", err)
	}
	s.subs = append(s.subs, sub)
	for _, op := range subjects.Ops {
		subj := b.space.Wildcard(op)
		if op == subjects.OpList {
			subj = b.space.Subject(op, "")
		}
		ep := &endpoint{op: op, subject: subj}
		// Not in a queue group: every broker subscribed gets every request. Only the broker that
		// serves is, but for one frozen (SIGSTOP, a stalled VM) past its claim, whose
		// subscriptions stay until it goes on or its server drops it: in a queue group it took
		// half of the requests, which timed out; now the broker that took over answers each, and
		// the frozen one answers none (claimer.silent).
		ep.stats.Name, ep.stats.Subject = string(op), subj
		sub, err := b.cfg.Conn.Subscribe(subj, func(m *nats.Msg) { b.dispatch(ep, m) })
		if err != nil {
			return fmt.Errorf("subscribe %s: %w", subj, err)
		}
		s.endpoints = append(s.endpoints, ep)
		s.subs = append(s.subs, sub)
	}
	for _, verb := range []micro.Verb{micro.PingVerb, micro.InfoVerb, micro.StatsVerb} {
		for _, subj := range []struct{ name, id string }{{"", ""}, {ServiceName, ""}, {ServiceName, s.id}} {
			control, err := micro.ControlSubject(verb, subj.name, subj.id)
			if err != nil {
				return err
			}
			sub, err := b.cfg.Conn.Subscribe(control, func(m *nats.Msg) { b.discover(verb, m) })
			if err != nil {
				return fmt.Errorf("subscribe %s: %w", control, err)
			}
			s.subs = append(s.subs, sub)
		}
	}
	return nil
}

// discover answers one discovery request.
func (b *Broker) discover(verb micro.Verb, m *nats.Msg) {
	if why := b.replyRefusal("", m.Reply); why != "" {
		b.refuse(nil, m.Subject, m.Reply, why)
		return
	}
	s := b.svc
	var body any
	switch verb {
	case micro.PingVerb:
		body = micro.Ping{ServiceIdentity: s.identity(b), Type: micro.PingResponseType}
	case micro.InfoVerb:
		info := micro.Info{ServiceIdentity: s.identity(b), Type: micro.InfoResponseType,
			Description: "earliest-deadline-first priority queues with exclusive queues, on JetStream"}
		for _, ep := range s.endpoints {
			info.Endpoints = append(info.Endpoints, micro.EndpointInfo{Name: string(ep.op), Subject: ep.subject})
		}
		body = info
	case micro.StatsVerb:
		stats := micro.Stats{ServiceIdentity: s.identity(b), Type: micro.StatsResponseType, Started: s.started}
		for _, ep := range s.endpoints {
			stats.Endpoints = append(stats.Endpoints, ep.snapshot())
		}
		body = stats
	}
	data, err := json.Marshal(body)
	if err == nil {
		err = m.Respond(data)
	}
	if err != nil && !errors.Is(err, nats.ErrMsgNoReply) {
		b.log.Debug("discovery reply not sent", "verb", verb.String(), "error", err)
	}
}

// announce publishes that the broker serves the store now (subjects.Space.Serving, once per start):
// a client cuts the long polls it sent before, parked at a broker that is gone (killed, or frozen
// past its claim) which will never answer them, and sends them again with their request ids,
// instead of waiting out their waits.
func (b *Broker) announce(ctx context.Context) {
	data, err := json.Marshal(subjects.Serving{ID: b.svc.id, Started: b.svc.started.Truncate(time.Millisecond)}) // as the replies' times
	if err == nil {
		err = b.cfg.Conn.Publish(b.space.Serving(), data)
	}
	if err != nil {
		b.log.Warn("serving, but not announced: long polls parked at a broker before this one wait out their waits",
			"subject", b.space.Serving(), "error", err)
		return
	}
	// Flushed before Start returns, so that the server has it before any request sent after the
	// start. A client may still hear it after it sent a poll (its subscription's callback not run
	// yet): that poll is cut once, for nothing, sent again and one with itself. Should the flush
	// fail (Start's ctx ending), the announcement still goes with the connection's next flush.
	_ = flush(ctx, b.cfg.Conn)
}

// stop unsubscribes everything; requests already received finish on their own.
func (s *service) stop() error {
	var errs []error
	for _, sub := range s.subs {
		if err := sub.Unsubscribe(); err != nil && !errors.Is(err, nats.ErrConnectionClosed) && !errors.Is(err, nats.ErrBadSubscription) {
			errs = append(errs, err)
		}
	}
	return errors.Join(errs...)
}
