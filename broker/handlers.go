package broker

import (
	"context"
	"encoding/json"
	"errors"
	"strconv"
	"time"

	"github.com/nats-io/nats.go"
	"github.com/nats-io/nats.go/micro"

	"github.com/natstone/natstone/subjects"
)

// requestTimeout bounds one request's work, a long poll included.
const requestTimeout = subjects.MaxWait + 30*time.Second

// serve registers the broker with the NATS micro service framework: one endpoint per operation,
// on <prefix>.<op>.* (and <prefix>.list), so `nats micro ls|info|stats` describe it.
func (b *Broker) serve() error {
	svc, err := micro.AddService(b.cfg.Conn, micro.Config{
		Name:        "natstone",
		Version:     Version,
		Description: "earliest-deadline-first priority queues with exclusive queues, on JetStream",
		Metadata:    map[string]string{"prefix": b.space.Prefix()},
	})
	if err != nil {
		return err
	}
	b.svc = svc
	for _, op := range subjects.Ops {
		h := micro.HandlerFunc(func(req micro.Request) { b.dispatch(op, req) })
		subj := b.space.Wildcard(op)
		if op == subjects.OpList {
			subj = b.space.Subject(op, "")
		}
		if err := svc.AddEndpoint(string(op), h, micro.WithEndpointSubject(subj)); err != nil {
			_ = svc.Stop()
			return err
		}
	}
	return nil
}

// dispatch runs one request in its own goroutine, so a request waiting on storage or a long poll
// never holds up the others: that is what lets the writes of many requests be in flight at once.
func (b *Broker) dispatch(op subjects.Op, req micro.Request) {
	if !b.track() {
		b.replyError(req, subjects.Errorf(subjects.CodeUnavailable, "the broker is stopping"))
		return
	}
	go func() {
		defer b.wg.Done()
		ctx, cancel := context.WithTimeout(b.ctx, requestTimeout)
		defer cancel()
		reply, err := b.handle(ctx, op, req)
		if err != nil {
			b.replyError(req, err)
			return
		}
		data, err := json.Marshal(reply)
		if err != nil {
			b.replyError(req, err)
			return
		}
		b.respond(req, &nats.Msg{Data: data})
	}()
}

// respond publishes a reply to the request's reply subject. It does not use req.Respond or
// req.Error: the micro framework reads the request's error state right after the handler returns,
// which races with a reply sent later from the request's own goroutine. (So the framework's
// per-endpoint error counts stay zero; requests are counted.)
func (b *Broker) respond(req micro.Request, msg *nats.Msg) {
	msg.Subject = req.Reply()
	if msg.Subject == "" {
		return // a publish, not a request: nobody to answer
	}
	if err := b.cfg.Conn.PublishMsg(msg); err != nil {
		b.log.Debug("reply not sent", "subject", req.Subject(), "error", err)
	}
}

// handle decodes a request, runs it and returns the reply body.
func (b *Broker) handle(ctx context.Context, op subjects.Op, req micro.Request) (any, error) {
	_, name, err := b.space.Parse(req.Subject())
	if err != nil {
		return nil, err
	}
	data := req.Data()
	switch op {
	case subjects.OpList:
		if err := subjects.Decode(data, &struct{}{}); err != nil {
			return nil, err
		}
		return b.list(), nil
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
		var r subjects.DequeueRequest
		if err := subjects.Decode(data, &r); err != nil {
			return nil, err
		}
		msgs, err := q.dequeue(ctx, r)
		if msgs == nil {
			msgs = []subjects.Message{}
		}
		return subjects.DequeueReply{Messages: msgs}, err
	case subjects.OpComplete:
		var r subjects.LeaseRequest
		if err := subjects.Decode(data, &r); err != nil {
			return nil, err
		}
		return q.complete(ctx, r)
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
		return q.release(ctx, r)
	case subjects.OpCancel:
		var r subjects.LeaseRequest
		if err := subjects.Decode(data, &r); err != nil {
			return nil, err
		}
		return q.cancel(ctx, r)
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
	}
	return nil, subjects.Errorf(subjects.CodeBadRequest, "unknown operation %q", op)
}

// decodeEnqueue decodes the three enqueue forms into a list of messages.
func decodeEnqueue(op subjects.Op, req micro.Request) ([]subjects.EnqueueRequest, error) {
	switch op {
	case subjects.OpEnqueueRaw:
		r, err := subjects.DecodeRawEnqueue(req.Headers(), req.Data())
		if err != nil {
			return nil, err
		}
		return []subjects.EnqueueRequest{r}, nil
	case subjects.OpEnqueueBatch:
		var r subjects.EnqueueBatchRequest
		if err := subjects.Decode(req.Data(), &r); err != nil {
			return nil, err
		}
		if len(r.Messages) == 0 || len(r.Messages) > subjects.MaxEnqueueBatch {
			return nil, subjects.Errorf(subjects.CodeOutOfRange, "enqueue_batch takes 1 to %d messages, got %d", subjects.MaxEnqueueBatch, len(r.Messages))
		}
		return r.Messages, nil
	default:
		var r subjects.EnqueueRequest
		if err := subjects.Decode(req.Data(), &r); err != nil {
			return nil, err
		}
		return []subjects.EnqueueRequest{r}, nil
	}
}

// replyError answers a failed request with an ErrorReply body and the micro error headers.
func (b *Broker) replyError(req micro.Request, err error) {
	var e *subjects.Error
	if !errors.As(err, &e) {
		b.log.Error("request failed", "subject", req.Subject(), "error", err)
		e = subjects.Errorf(subjects.CodeInternal, "%v", err)
	}
	data, _ := json.Marshal(subjects.ErrorReply{Error: e})
	msg := &nats.Msg{Data: data, Header: nats.Header{}}
	msg.Header.Set(micro.ErrorHeader, e.Message)
	msg.Header.Set(micro.ErrorCodeHeader, strconv.Itoa(e.Code.Status()))
	b.respond(req, msg)
}
