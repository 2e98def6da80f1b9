package broker

import (
	"context"
	"errors"
	"log/slog"
	"strconv"
	"strings"
	"time"

	"github.com/nats-io/nats.go"
	"github.com/nats-io/nats.go/micro"

	"github.com/natstone/natstone/subjects"
)

// requestTimeout bounds one request's work, a long poll included.
const requestTimeout = subjects.MaxWait + 30*time.Second

// dispatch runs one request on a goroutine of its own (b.runner), so a request waiting on storage
// or a long poll never holds up the others: that is what lets the writes of many requests be in
// flight at once.
// The endpoint's statistics are recorded when the reply is sent, so they count the real processing
// time and every error reply.
func (b *Broker) dispatch(ep *endpoint, msg *nats.Msg) {
	if why := b.replyRefusal(ep.op, msg.Reply); why != "" {
		b.refuse(ep, msg.Subject, msg.Reply, why)
		return
	}
	received := time.Now()
	if !b.track() {
		if b.claim.silent() { // stopping because its claim was lost: the broker that took it answers
			b.unanswered(msg.Subject)
			return
		}
		_, out := b.errorReply(msg, subjects.Errorf(subjects.CodeUnavailable, "the broker is stopping"))
		b.respond(msg, out)
		return
	}
	b.runner.run(func() {
		defer b.wg.Done()
		ctx, cancel := context.WithTimeout(b.ctx, requestTimeout)
		defer cancel()
		// Without the claim, another broker may serve the store: a request is not run (a broker
		// resumed after a pause would otherwise work through the requests queued up meanwhile, on
		// stale indexes), nor answered with what it did (an error from stale indexes would not be
		// true either). Once the claim has gone unrenewed for its ttl it is not answered at all:
		// the broker that may have taken over gets the same request and answers it, and an
		// "unavailable" from this one could reach the client first.
		var reply any
		var err error
		if b.claim.held() {
			reply, err = b.handle(ctx, ep.op, msg)
		}
		if !b.claim.held() {
			if b.claim.silent() {
				b.unanswered(msg.Subject)
				return
			}
			err = errNotServing
		}
		if err != nil {
			err = stopping(err, b.ctx.Err() != nil) // asked of failures only: not on every reply's path
		}
		var out *nats.Msg
		if err == nil {
			var data []byte
			if data, err = encodeReply(reply); err == nil {
				out = &nats.Msg{Data: data, Reply: b.unheard.replyTo(msg, reply)}
			}
		}
		var failed *subjects.Error
		if err != nil {
			failed, out = b.errorReply(msg, err)
		}
		// Counted before the reply leaves, so a client that got its reply sees it in the stats.
		took := time.Since(received)
		ep.record(took, failed)
		var code subjects.Code
		if failed != nil {
			code = failed.Code
		}
		b.observer.Request(ep.op, code, took)
		b.respond(msg, out)
	})
}

// stopping says why a request failed unavailable while the broker stopped (its ctx ended: Stop, or
// the claim lost), which ended the request's waits on storage: "the broker is stopping", rather
// than only what it waited for ("store payload: context canceled"), which a client cannot act on.
func stopping(err error, stopped bool) error {
	var e *subjects.Error
	if !stopped || !errors.As(err, &e) || e.Code != subjects.CodeUnavailable || strings.HasPrefix(e.Message, "the broker") {
		return err
	}
	return subjects.Errorf(subjects.CodeUnavailable, "the broker is stopping: %s", e.Message)
}

// encodeReply returns the JSON of a reply, with HTML escaping off. Messages, the replies of every
// dequeue and complete (with or without next), are written without reflection
// (subjects.AppendMessage); the rest go through encoding/json.
func encodeReply(reply any) ([]byte, error) {
	switch r := reply.(type) {
	case subjects.DequeueReply:
		n := 64
		for i := range r.Messages {
			n += replySize(&r.Messages[i])
		}
		return subjects.AppendDequeueReply(make([]byte, 0, n), &r)
	case subjects.Message:
		return subjects.AppendMessage(make([]byte, 0, replySize(&r)), &r)
	case subjects.SettleReply:
		n := 64 + replySize(&r.Message)
		for i := range r.Next.Messages {
			n += replySize(&r.Next.Messages[i])
		}
		return subjects.AppendSettleReply(make([]byte, 0, n), &r)
	}
	return subjects.Marshal(reply) // HTML escaping off, as in messages: browse's metadata counts it so
}

// replySize guesses the length of m's JSON, so that its buffer is allocated once: 512 bytes for the
// fields besides the id and the queue's name (a leased message with a 26-byte id, no payload and no
// metadata takes under 400 in all), those two, the metadata, and the payload (base64 grows it by a
// third; escapes are rare, an eighth more is left for them).
func replySize(m *subjects.Message) int {
	n := 512 + len(m.ID) + len(m.Queue) + len(m.PayloadBase64)*4/3
	if m.Payload != nil {
		n += len(*m.Payload) + len(*m.Payload)/8
	}
	for k, v := range m.Metadata {
		n += len(k) + len(v) + 6
	}
	return n
}

// respond publishes a reply to the request's reply subject.
func (b *Broker) respond(req *nats.Msg, reply *nats.Msg) {
	reply.Subject = req.Reply
	if reply.Subject == "" {
		return // a publish, not a request: nobody to answer
	}
	err := b.cfg.Conn.PublishMsg(reply)
	if reply.Reply != "" {
		b.unheard.published(reply.Reply, err)
	}
	if err != nil {
		level := slog.LevelDebug // the connection is closing, or down: nothing the operator can mend
		if errors.Is(err, nats.ErrMaxPayload) {
			level = slog.LevelError // the request's effect stands, unseen (a dequeue's leases are given back: unheard)
		}
		b.log.Log(context.Background(), level, "reply not sent", "subject", req.Subject, "size", len(reply.Data), "error", err)
	}
}

// handle decodes a request, runs it and returns the reply body.
func (b *Broker) handle(ctx context.Context, op subjects.Op, req *nats.Msg) (any, error) {
	_, name, err := b.space.Parse(req.Subject)
	if err != nil {
		return nil, err
	}
	data := req.Data
	switch op {
	case subjects.OpList:
		var r subjects.ListRequest
		if err := subjects.Decode(data, &r); err != nil {
			return nil, err
		}
		return b.list(r)
	case subjects.OpCreate:
		var r subjects.CreateQueueRequest
		if err := subjects.Decode(data, &r); err != nil {
			return nil, err
		}
		_, info, err := b.createQueue(ctx, name, r)
		return info, err
	case subjects.OpEnqueue, subjects.OpEnqueueBatch, subjects.OpEnqueueRaw:
		reqs, err := decodeEnqueue(op, req)
		if err != nil {
			return nil, err
		}
		q, err := b.lookupForEnqueue(ctx, name, reqs)
		if err != nil {
			return nil, err
		}
		replies, err := q.enqueue(ctx, reqs)
		if err != nil {
			return nil, err
		}
		if op == subjects.OpEnqueueBatch {
			return subjects.EnqueueBatchReply{Messages: replies}, nil
		}
		return replies[0], nil
	case subjects.OpSchedule:
		// A schedule, as an enqueue, creates its queue unless auto-create is off.
		var r subjects.ScheduleRequest
		if err := subjects.Decode(data, &r); err != nil {
			return nil, err
		}
		return b.putSchedule(ctx, name, r)
	case subjects.OpHistory:
		// The events outlive their messages, and their queue: no queue is looked up.
		var r subjects.HistoryRequest
		if err := subjects.Decode(data, &r); err != nil {
			return nil, err
		}
		return b.history(ctx, name, r)
	case subjects.OpUnschedule:
		// A queue not there has no schedule to remove: it looks the queue up itself.
		var r subjects.UnscheduleRequest
		if err := subjects.Decode(data, &r); err != nil {
			return nil, err
		}
		return b.unschedule(ctx, name, r)
	}

	q, err := b.lookup(ctx, name, false)
	if err != nil {
		return nil, err
	}
	switch op {
	case subjects.OpInfo:
		if err := subjects.Decode(data, &struct{}{}); err != nil {
			return nil, err
		}
		q.mu.Lock()
		defer q.mu.Unlock()
		if err := q.usable(); err != nil {
			return nil, err
		}
		return q.info(), nil
	case subjects.OpUpdate:
		var r subjects.UpdateQueueRequest
		if err := subjects.Decode(data, &r); err != nil {
			return nil, err
		}
		return q.update(ctx, r)
	case subjects.OpDelete:
		if err := subjects.Decode(data, &struct{}{}); err != nil {
			return nil, err
		}
		return b.deleteQueue(ctx, q)
	case subjects.OpDequeue:
		r, err := subjects.DecodeDequeue(data)
		if err != nil {
			return nil, err
		}
		msgs, err := q.dequeue(ctx, r)
		if msgs == nil {
			msgs = []subjects.Message{}
		}
		return subjects.DequeueReply{Messages: msgs}, err
	case subjects.OpAbandon:
		var r subjects.AbandonRequest
		if err := subjects.Decode(data, &r); err != nil {
			return nil, err
		}
		return q.abandon(ctx, r)
	case subjects.OpComplete:
		r, err := subjects.DecodeLease(data)
		if err != nil {
			return nil, err
		}
		if r.Version != 0 {
			return nil, subjects.Errorf(subjects.CodeBadRequest, "complete takes no version: its lease_id fences it")
		}
		if r.Error != "" {
			return nil, subjects.Errorf(subjects.CodeBadRequest, "complete takes no error: a release or a cancel says why")
		}
		return q.andNext(ctx, settleKey{op: subjects.OpComplete, id: r.ID, leaseID: r.LeaseID}, nextFor(req, r.Next), func() (subjects.Message, error) { return q.complete(ctx, r) })
	case subjects.OpExtend:
		var r subjects.ExtendRequest
		if err := subjects.Decode(data, &r); err != nil {
			return nil, err
		}
		return q.extend(ctx, r)
	case subjects.OpRelease:
		var r subjects.ReleaseRequest
		if err := subjects.Decode(data, &r); err != nil {
			return nil, err
		}
		return q.andNext(ctx, settleKey{op: subjects.OpRelease, id: r.ID, leaseID: r.LeaseID}, nextFor(req, r.Next), func() (subjects.Message, error) { return q.release(ctx, r) })
	case subjects.OpCancel:
		r, err := subjects.DecodeLease(data)
		if err != nil {
			return nil, err
		}
		if r.LeaseID == "" && subjects.EmptyLeaseID(data) {
			// A holder whose lease id went missing: its cancel would be an operator's, unfenced.
			return nil, subjects.Errorf(subjects.CodeBadRequest, "cancel: lease_id is empty: give the lease_id the dequeue returned, or leave it out for an operator's cancel")
		}
		return q.andNext(ctx, settleKey{op: subjects.OpCancel, id: r.ID, leaseID: r.LeaseID}, nextFor(req, r.Next), func() (subjects.Message, error) { return q.cancel(ctx, r) })
	case subjects.OpRetry:
		var r subjects.RetryRequest
		if err := subjects.Decode(data, &r); err != nil {
			return nil, err
		}
		return q.retry(ctx, r)
	case subjects.OpReschedule:
		var r subjects.RescheduleRequest
		if err := subjects.Decode(data, &r); err != nil {
			return nil, err
		}
		return q.reschedule(ctx, r)
	case subjects.OpGet:
		var r subjects.GetRequest
		if err := subjects.Decode(data, &r); err != nil {
			return nil, err
		}
		return q.get(ctx, r.ID)
	case subjects.OpDepth:
		var r subjects.DepthRequest
		if err := subjects.Decode(data, &r); err != nil {
			return nil, err
		}
		counts, err := q.depth(r.Filter)
		return subjects.DepthReply{Queue: name, Counts: counts}, err
	case subjects.OpStats:
		var r subjects.StatsRequest
		if err := subjects.Decode(data, &r); err != nil {
			return nil, err
		}
		return q.stats(r)
	case subjects.OpBrowse:
		var r subjects.BrowseRequest
		if err := subjects.Decode(data, &r); err != nil {
			return nil, err
		}
		return q.browse(r)
	case subjects.OpSchedules:
		var r subjects.SchedulesRequest
		if err := subjects.Decode(data, &r); err != nil {
			return nil, err
		}
		return b.schedules(q, r)
	case subjects.OpSchedulePause, subjects.OpScheduleResume:
		var r subjects.SchedulePauseRequest
		if err := subjects.Decode(data, &r); err != nil {
			return nil, err
		}
		return b.setPaused(ctx, q, r, op == subjects.OpSchedulePause)
	case subjects.OpScheduleFire:
		r, err := subjects.DecodeScheduleFire(data)
		if err != nil {
			return nil, err
		}
		return b.fireNow(ctx, q, r)
	}
	return nil, subjects.Errorf(subjects.CodeBadRequest, "unknown operation %q", op)
}

// decodeEnqueue decodes the three enqueue forms into a list of messages.
func decodeEnqueue(op subjects.Op, req *nats.Msg) ([]subjects.EnqueueRequest, error) {
	switch op {
	case subjects.OpEnqueueRaw:
		if headerLost(req) {
			return nil, subjects.Errorf(subjects.CodeBadRequest, "the message's header block is malformed (see the NATS header format): its Natstone-* headers cannot be read")
		}
		r, err := subjects.DecodeRawEnqueue(req.Header, req.Data)
		if err != nil {
			return nil, err
		}
		return []subjects.EnqueueRequest{r}, nil
	case subjects.OpEnqueueBatch:
		r, err := subjects.DecodeEnqueueBatch(req.Data)
		if err != nil {
			return nil, err
		}
		if len(r.Messages) == 0 || len(r.Messages) > subjects.MaxEnqueueBatch {
			return nil, subjects.Errorf(subjects.CodeOutOfRange, "enqueue_batch takes 1 to %d messages, got %d", subjects.MaxEnqueueBatch, len(r.Messages))
		}
		return r.Messages, nil
	default:
		r, err := subjects.DecodeEnqueue(req.Data)
		if err != nil {
			return nil, err
		}
		return []subjects.EnqueueRequest{r}, nil
	}
}

// headerLost reports whether a received message came with a header block that nats.go could not
// decode. It delivers such a message with no headers (and reports ErrBadHeaderMsg to the
// connection's error handler, apart from the message), so an enqueue_raw would lose its id and
// attributes and go ahead without them. Its size still counts the block.
func headerLost(m *nats.Msg) bool {
	return m.Header == nil && m.Size() != len(m.Subject)+len(m.Reply)+len(m.Data)
}

// maxErrorMessage bounds the message of an error reply, in bytes.
const maxErrorMessage = 1024

// errorReply builds the answer to a failed request: an ErrorReply body and the NATS service error
// headers (Nats-Service-Error, Nats-Service-Error-Code). It returns the typed error it carries.
func (b *Broker) errorReply(req *nats.Msg, err error) (*subjects.Error, *nats.Msg) {
	var e *subjects.Error
	if !errors.As(err, &e) {
		b.log.Error("request failed", "subject", req.Subject, "error", err)
		e = subjects.Errorf(subjects.CodeInternal, "%v", err)
	}
	if len(e.Message) > maxErrorMessage {
		// A message may quote the request (a field's value, an unknown field's name): cut, it
		// stays well within the server's max_payload, body and header together.
		e = &subjects.Error{Code: e.Code, Message: subjects.CutText(e.Message, maxErrorMessage) + " …"}
	}
	data, _ := subjects.Marshal(subjects.ErrorReply{Error: e})
	msg := &nats.Msg{Data: data, Header: nats.Header{}}
	msg.Header.Set(micro.ErrorHeader, e.Message)
	msg.Header.Set(micro.ErrorCodeHeader, strconv.Itoa(e.Code.Status()))
	return e, msg
}
