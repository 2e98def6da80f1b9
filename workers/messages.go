package workers

import (
	"context"
	"errors"
	"fmt"
	"strconv"
	"strings"
	"time"

	"github.com/nats-io/nats.go"
	"github.com/nats-io/nuid"

	"github.com/natstone/natstone/subjects"
)

// Message is a message as the broker describes it, with Go types: the payload as bytes, timestamps
// as time.Time (the zero time when the broker sent none).
type Message struct {
	ID       string
	Queue    string
	State    subjects.State
	Priority int64 // lower is dequeued first; by convention a deadline in Unix ms
	Metadata map[string]string
	// Payload is present in the messages of Dequeue and Get only; nil elsewhere.
	Payload        []byte
	Version        uint64    // incremented by every write of the message
	Attempts       int       // dequeues so far, this one included
	AttemptsLeft   int       // dequeues still allowed
	LeaseID        string    // the current lease, while running
	LeaseExpiresAt time.Time // while running: when the lease ends unless extended
	EnqueuedAt     time.Time
	VisibleAt      time.Time // when it became (or becomes) pending
	UpdatedAt      time.Time // its last write
	EndedAt        time.Time // when it reached a terminal state
}

// newMessage converts a wire message.
func newMessage(m *subjects.Message) Message {
	return Message{
		ID:             m.ID,
		Queue:          m.Queue,
		State:          m.State,
		Priority:       m.Priority,
		Metadata:       m.Metadata,
		Payload:        m.PayloadBytes(),
		Version:        m.Version,
		Attempts:       m.Attempts,
		AttemptsLeft:   m.AttemptsLeft,
		LeaseID:        m.LeaseID,
		LeaseExpiresAt: timeOrZero(m.LeaseExpiresAt),
		EnqueuedAt:     m.EnqueuedAt,
		VisibleAt:      m.VisibleAt,
		UpdatedAt:      m.UpdatedAt,
		EndedAt:        timeOrZero(m.EndedAt),
	}
}

// EnqueueOpts are the optional attributes of an enqueued message. Durations are sent in whole
// milliseconds, rounded down; a zero duration takes the queue's default.
type EnqueueOpts struct {
	// ID is the client-chosen id that makes the enqueue idempotent: enqueueing an existing id returns
	// the existing message with Duplicate set. Default: the broker generates one.
	ID string
	// Priority orders the queue: lower is dequeued first. Default Deadline's Unix ms if set, else the
	// time the message can run: the enqueue time, or the end of its invisibility (FIFO by readiness).
	Priority *int64
	// Deadline, when set and Priority is nil, is the priority: Deadline.UnixMilli().
	Deadline time.Time
	// Metadata are string pairs for filters; an exclusive queue requires its exclusivity key.
	Metadata map[string]string
	// Invisible keeps the message invisible this long before it is pending. Default (0) the queue's
	// invisibility; negative: pending at once, whatever the queue's (as net.Dialer's KeepAlive).
	Invisible time.Duration
	// VisibleAt, when set, keeps the message invisible until then, by the broker's clock: River's
	// ScheduledAt, asynq's ProcessAt. A time that has come makes it pending at once. Set either
	// VisibleAt or Invisible (ErrBadRequest for both); at most subjects.MaxInvisible ahead
	// (ErrOutOfRange).
	VisibleAt time.Time
	// Lease is this message's lease when a dequeue does not ask for one (subjects.MinLease to
	// subjects.MaxLease, else ErrOutOfRange). Default (0) the queue's.
	Lease time.Duration
	// MaxAttempts is how many times this message may be leased (1 to subjects.MaxAttemptsLimit).
	// Default (0) the queue's max_attempts.
	MaxAttempts int
}

// priority returns the priority to send, or nil for the broker's default.
func (o *EnqueueOpts) priority() *int64 {
	if o.Priority != nil {
		return o.Priority
	}
	if !o.Deadline.IsZero() {
		p := o.Deadline.UnixMilli()
		return &p
	}
	return nil
}

// invisibleMS returns the invisibility to send, in milliseconds, and false for the queue's.
func (o *EnqueueOpts) invisibleMS() (int64, bool) {
	if o.Invisible > 0 {
		// A fraction of a millisecond up, not down to 0, which would say "pending at once" and
		// override the queue's invisibility instead of asking for some.
		return (o.Invisible + time.Millisecond - 1).Milliseconds(), true
	}
	return 0, o.Invisible != 0
}

// wireVisibleAt returns a visible_at to send, in UTC, and false for none (the zero time). RFC 3339
// writes the years 0 to 9999: an earlier time has come just as well (the Unix epoch is sent), and
// a later one is refused by checkVisibleAt before anything is sent.
func wireVisibleAt(t time.Time) (time.Time, bool) {
	if t.IsZero() {
		return time.Time{}, false
	}
	if t.UTC().Year() < 0 {
		return time.Unix(0, 0).UTC(), true
	}
	return t.UTC(), true
}

// checkVisibleAt refuses a visible_at past the years RFC 3339 writes, as the broker would (it is
// more than subjects.MaxInvisible ahead); where prefixes the error's message.
func checkVisibleAt(t time.Time, where string) error {
	if t.UTC().Year() > 9999 {
		return apiError(subjects.Errorf(subjects.CodeOutOfRange, "%svisible_at must be at most %d days ahead of the broker's clock, got %s", where, subjects.MaxInvisible/(24*time.Hour), t))
	}
	return nil
}

// request returns the JSON form of o with payload.
func (o *EnqueueOpts) request(payload []byte) subjects.EnqueueRequest {
	r := subjects.EnqueueRequest{
		ID:            o.ID,
		Priority:      o.priority(),
		PayloadBase64: payload,
		Metadata:      o.Metadata,
	}
	if inv, ok := o.invisibleMS(); ok {
		r.InvisibleMS = &inv
	}
	if at, ok := wireVisibleAt(o.VisibleAt); ok {
		r.VisibleAt = &at
	}
	if o.Lease != 0 {
		r.LeaseMS = msPtr(&o.Lease)
	}
	if o.MaxAttempts != 0 {
		n := int64(o.MaxAttempts)
		r.MaxAttempts = &n
	}
	return r
}

// Enqueue adds one message with payload (any bytes) to queue, creating the queue with the defaults
// if it does not exist and the broker auto-creates. opts may be nil. It uses the enqueue_raw form: the
// payload travels as the request body and the attributes in Natstone-* headers, so nothing is
// base64-encoded.
//
// Errors: ErrInvalidID, ErrInvalidMetadata, ErrMissingExclusivityKey, ErrPayloadTooLarge,
// ErrOutOfRange, ErrBadRequest (Invisible with VisibleAt), ErrQueueNotFound (auto-create off),
// ErrQueueBlocked.
func (c *Client) Enqueue(ctx context.Context, queue string, payload []byte, opts *EnqueueOpts) (subjects.EnqueueReply, error) {
	var o EnqueueOpts
	if opts != nil {
		o = *opts
	}
	var reply subjects.EnqueueReply
	if err := checkVisibleAt(o.VisibleAt, ""); err != nil {
		return reply, err
	}
	if !headerSafe(o.ID) {
		// A header would alter this id (NATS trims header values and ends them at a line break): send
		// the JSON form, and let the broker judge the id.
		err := c.request(ctx, subjects.OpEnqueue, queue, o.request(payload), &reply)
		return reply, err
	}
	msg := &nats.Msg{Data: payload, Header: nats.Header{}}
	if o.ID != "" {
		msg.Header.Set(subjects.HeaderID, o.ID)
	}
	if p := o.priority(); p != nil {
		msg.Header.Set(subjects.HeaderPriority, strconv.FormatInt(*p, 10))
	}
	if len(o.Metadata) > 0 {
		md, err := encodeRequest(subjects.OpEnqueueRaw, queue, o.Metadata) // escapes control characters: one header line
		if err != nil {
			return reply, err
		}
		msg.Header.Set(subjects.HeaderMetadata, string(md))
	}
	if inv, ok := o.invisibleMS(); ok {
		msg.Header.Set(subjects.HeaderInvisibleMS, strconv.FormatInt(inv, 10))
	}
	if at, ok := wireVisibleAt(o.VisibleAt); ok {
		msg.Header.Set(subjects.HeaderVisibleAt, at.Format(time.RFC3339Nano))
	}
	if o.Lease != 0 {
		msg.Header.Set(subjects.HeaderLeaseMS, strconv.FormatInt(ms(o.Lease), 10))
	}
	if o.MaxAttempts != 0 {
		msg.Header.Set(subjects.HeaderMaxAttempts, strconv.Itoa(o.MaxAttempts))
	}
	err := c.send(ctx, subjects.OpEnqueueRaw, queue, msg, 0, &reply)
	return reply, err
}

// headerSafe reports whether id reaches the broker unchanged as a header value.
func headerSafe(id string) bool {
	return id == strings.TrimSpace(id) && !strings.ContainsAny(id, "\r\n\x00")
}

// BatchMessage is one message of EnqueueBatch: its payload and its optional attributes.
type BatchMessage struct {
	Payload []byte
	EnqueueOpts
}

// EnqueueBatch adds 1 to subjects.MaxEnqueueBatch messages to queue in one request and returns their
// replies in order. Every message is validated before anything is written: one bad message fails the
// whole batch. An id given twice is one message (the second reply is a duplicate). Payloads travel
// base64-encoded in JSON. Errors: as Enqueue (a bad message's error names its index, messages[i]),
// ErrOutOfRange for an empty batch or one of more than subjects.MaxEnqueueBatch messages, and
// ErrPayloadTooLarge for a request larger than the NATS server takes (max_payload): send such a
// batch in parts.
func (c *Client) EnqueueBatch(ctx context.Context, queue string, msgs []BatchMessage) ([]subjects.EnqueueReply, error) {
	req := subjects.EnqueueBatchRequest{Messages: make([]subjects.EnqueueRequest, len(msgs))}
	for i := range msgs {
		if t := msgs[i].VisibleAt; !t.IsZero() { // the prefix made only for a time given
			if err := checkVisibleAt(t, "messages["+strconv.Itoa(i)+"]: "); err != nil {
				return nil, err
			}
		}
		req.Messages[i] = msgs[i].request(msgs[i].Payload)
	}
	var r subjects.EnqueueBatchReply
	if err := c.request(ctx, subjects.OpEnqueueBatch, queue, req, &r); err != nil {
		return nil, err
	}
	return r.Messages, nil
}

// DequeueOpts are the optional settings of a dequeue. Durations are sent in whole milliseconds,
// rounded down.
type DequeueOpts struct {
	// Batch is how many messages to lease at most (1 to subjects.MaxDequeueBatch). Default 1.
	Batch int
	// Lease is the lease of the messages (subjects.MinLease to subjects.MaxLease). Default each
	// message's own lease, else the queue's.
	Lease time.Duration
	// Wait long-polls: when nothing is eligible, wait up to this long (at most subjects.MaxWait) for
	// a first message. Default 0: reply at once.
	Wait time.Duration
	// Filter leases only messages whose metadata has every pair.
	Filter map[string]string
	// RequestID makes the dequeue retry-safe: a dequeue with the same id within 5 minutes returns the
	// leases the first one took that are still held, and never leases more, until one of those
	// leases is used (extended or settled), which shows the reply arrived. A first dequeue that
	// leased nothing is not remembered: its retry leases as a new dequeue would. Use a fresh id per
	// dequeue, and the same one to retry it after a timeout.
	RequestID string
	// Worker names who dequeues (at most subjects.MaxWorkerLen bytes); the leased events carry it.
	Worker string
}

// Dequeue leases up to opts.Batch pending messages of queue in earliest-deadline-first order, waiting
// up to opts.Wait for a first one; it returns none when nothing was eligible in time. opts may be
// nil. The request's timeout is the Client's plus opts.Wait.
//
// Each message is running under the returned LeaseID until Complete, Release, Cancel or the lease's
// end. Errors: ErrQueueNotFound, ErrQueueBlocked, ErrOutOfRange, ErrInvalidMetadata, ErrBadRequest
// (a bad RequestID).
//
// A long poll (opts.Wait of a millisecond or more) that ctx ends before its reply goes on at the broker, which would
// lease it a message nobody then runs. Given no RequestID, Dequeue makes one up, and abandons the
// poll with it (Abandon, a try of at most a second) when ctx ends first, or when its outcome is
// unknown (no reply in time, or ErrUnavailable), since the caller cannot send it again. Given one,
// the caller decides: send the dequeue again with it to get its leases back, or Abandon it. Such a
// long poll does not wait past a reconnect of the Client's connection, nor past a broker's
// announcement that it began to serve (subjects.Space.Serving; unless Config.IgnoreAnnouncements):
// its reply may never come (the broker it waited at may be gone, with its NATS server or replaced
// by another), so it fails then with ErrPollCut, as one of unknown outcome (nats.ErrTimeout), to be
// sent again at once, as a Worker does.
func (c *Client) Dequeue(ctx context.Context, queue string, opts *DequeueOpts) ([]Message, error) {
	req := opts.request()
	madeID := req.WaitMS > 0 && req.RequestID == ""
	if madeID {
		req.RequestID = nuid.Next()
	}
	body, err := encodeRequest(subjects.OpDequeue, queue, req)
	if err != nil {
		return nil, err
	}
	var r subjects.DequeueReply
	sctx := ctx
	if req.WaitMS > 0 && !madeID {
		// Cut at a reconnect, to be sent again with the caller's request id (a Worker's polls);
		// one whose id was made up here would be abandoned, not sent again, and so is left to
		// wait.
		var stop func()
		sctx, stop = c.untilGone(ctx)
		defer stop()
	}
	if err := c.send(sctx, subjects.OpDequeue, queue, &nats.Msg{Data: body}, max(time.Duration(req.WaitMS)*time.Millisecond, 0), &r); err != nil {
		if cause := context.Cause(sctx); ctx.Err() == nil && errors.Is(err, context.Canceled) && errors.Is(cause, ErrPollCut) {
			// Its reply may never come: the broker it waited at may be gone (a natstone killed
			// with its embedded server, or replaced). Sent again with its request id, it gets
			// what it leased.
			err = fmt.Errorf("natstone: %s: %w (%w)", opOn(subjects.OpDequeue, queue), nats.ErrTimeout, cause)
		}
		if madeID && (ctx.Err() != nil || unknownOutcome(err)) {
			actx, cancel := context.WithTimeout(context.WithoutCancel(ctx), abandonTimeout)
			_, _ = c.Abandon(actx, queue, req.RequestID) // best effort: the caller has ctx's error
			cancel()
		}
		return nil, err
	}
	return newMessages(r.Messages), nil
}

// abandonTimeout bounds the abandon of a long poll that the caller's context ended.
const abandonTimeout = time.Second

// Abandon ends the dequeue of queue sent with requestID, for a caller that gave up on its reply (its
// context ended during a long poll, say): a poll still waiting at the broker ends, leasing nothing;
// the messages it leased that are still held are pending again at once, their attempts given back;
// and a dequeue with that id that reaches the broker later leases nothing. It returns the ids of the
// messages given back. Without it, a long poll the caller left can still lease a message, which
// then stays running, unprocessed, until its lease ends. Errors: ErrQueueNotFound, ErrBadRequest
// (no requestID, or a bad one).
func (c *Client) Abandon(ctx context.Context, queue, requestID string) ([]string, error) {
	var r subjects.AbandonReply
	if err := c.request(ctx, subjects.OpAbandon, queue, subjects.AbandonRequest{RequestID: requestID}, &r); err != nil {
		return nil, err
	}
	return r.Released, nil
}

// request returns the wire form of o (nil: the defaults).
func (o *DequeueOpts) request() subjects.DequeueRequest {
	if o == nil {
		return subjects.DequeueRequest{}
	}
	return subjects.DequeueRequest{
		Batch:     o.Batch,
		LeaseMS:   ms(o.Lease),
		WaitMS:    ms(o.Wait),
		Filter:    o.Filter,
		RequestID: o.RequestID,
		Worker:    o.Worker,
	}
}

func newMessages(ms []subjects.Message) []Message {
	out := make([]Message, len(ms))
	for i := range ms {
		out[i] = newMessage(&ms[i])
	}
	return out
}

// Settled is what CompleteNext and ReleaseNext return: the settled message, and what the dequeue
// that ran after it leased.
type Settled struct {
	// Message is the settled message, without payload.
	Message Message
	// Next are the messages the dequeue leased, in earliest-deadline-first order; none when none
	// was eligible, or when the dequeue failed.
	Next []Message
	// NextErr is why the dequeue failed (an *APIError: ErrQueueBlocked, ErrUnavailable, …), or nil.
	// The message was settled all the same.
	NextErr error
}

// Complete moves a running message to completed. Completing it again with the same lease succeeds.
// The returned message has no payload. Errors: ErrLeaseMismatch, ErrLeaseExpired, ErrInvalidState
// (e.g. released or canceled), ErrMessageNotFound, ErrBadRequest (empty leaseID).
func (c *Client) Complete(ctx context.Context, queue, id, leaseID string) (Message, error) {
	return c.leaseOp(ctx, subjects.OpComplete, queue, subjects.LeaseRequest{ID: id, LeaseID: leaseID})
}

// CompleteNext completes a running message as Complete does and, once that is stored, dequeues as
// Dequeue would with next (nil: one message with the defaults) — one round trip instead of two, for
// a worker that goes on to its next message. next.Wait must be 0: the dequeue does not long-poll.
// The error is the complete's (as Complete's, or ErrOutOfRange and the like for a bad next, which
// then completes nothing); a failed dequeue is Settled.NextErr. A retry after a timeout should reuse
// next.RequestID, to get back the leases the first try may have taken.
func (c *Client) CompleteNext(ctx context.Context, queue, id, leaseID string, next *DequeueOpts) (Settled, error) {
	n := next.request()
	return c.settleNext(ctx, subjects.OpComplete, queue, subjects.LeaseRequest{ID: id, LeaseID: leaseID, Next: &n})
}

// ReleaseNext releases a running message as Release does, then dequeues as CompleteNext does.
func (c *Client) ReleaseNext(ctx context.Context, queue, id, leaseID string, opts *ReleaseOpts, next *DequeueOpts) (Settled, error) {
	r := opts.request(id, leaseID)
	n := next.request()
	r.Next = &n
	return c.settleNext(ctx, subjects.OpRelease, queue, r)
}

// settleNext sends a settle whose body carries next.
func (c *Client) settleNext(ctx context.Context, op subjects.Op, queue string, body any) (Settled, error) {
	var r subjects.SettleReply
	if err := c.request(ctx, op, queue, body, &r); err != nil {
		return Settled{}, err
	}
	s := Settled{Message: newMessage(&r.Message)}
	if r.Next != nil {
		s.Next = newMessages(r.Next.Messages)
		if r.Next.Error != nil {
			s.NextErr = apiError(r.Next.Error)
		}
	}
	return s, nil
}

// Extend makes the lease end lease from now (0: the message's lease, else the queue's). Errors: as
// Complete, and ErrOutOfRange for a lease outside subjects.MinLease to subjects.MaxLease.
func (c *Client) Extend(ctx context.Context, queue, id, leaseID string, lease time.Duration) (Message, error) {
	return c.leaseOp(ctx, subjects.OpExtend, queue, subjects.ExtendRequest{ID: id, LeaseID: leaseID, LeaseMS: ms(lease)})
}

// ReleaseOpts are the options of Release and ReleaseNext; nil means none.
type ReleaseOpts struct {
	// Delay keeps the message invisible this long before it is pending again (0: pending at once),
	// up to subjects.MaxInvisible. Sent in whole milliseconds, rounded down.
	Delay time.Duration
	// Error says why the attempt failed (a handler's error, say): the message's released event keeps
	// it, or its errored event when no attempt is left, and History shows it. At most
	// subjects.MaxErrorLen bytes of UTF-8 (FailureText makes any error's text so).
	Error string
	// Refund gives the attempt back: the holder never ran the message (a worker handing back what
	// it leased as it stops, say). The message is pending again with the attempts it had before
	// this lease, and its history does not count it as a failure.
	Refund bool
}

// request is the release of the lease leaseID of message id with o.
func (o *ReleaseOpts) request(id, leaseID string) subjects.ReleaseRequest {
	r := subjects.ReleaseRequest{ID: id, LeaseID: leaseID}
	if o != nil {
		r.DelayMS, r.Error, r.Refund = ms(o.Delay), o.Error, o.Refund
	}
	return r
}

// FailureText is err's text as a release's error: valid UTF-8 (each run of invalid bytes becomes one
// U+FFFD), cut to subjects.MaxErrorLen bytes at a character's boundary. The worker releases the
// message of a failed handler with it.
func FailureText(err error) string {
	if err == nil {
		return ""
	}
	return subjects.CutText(strings.ToValidUTF8(err.Error(), "\uFFFD"), subjects.MaxErrorLen)
}

// Release gives a running message back: pending at once, or invisible for opts.Delay. The attempt
// stays spent, unless opts.Refund gives it back; with none left the message is errored. opts.Error,
// if given, says why (see ReleaseOpts). Releasing it again with the same lease succeeds, and keeps the first release's error.
// Errors: as Complete, ErrOutOfRange for a delay outside 0 to subjects.MaxInvisible, and
// ErrBadRequest for an error over subjects.MaxErrorLen bytes or not UTF-8.
func (c *Client) Release(ctx context.Context, queue, id, leaseID string, opts *ReleaseOpts) (Message, error) {
	return c.leaseOp(ctx, subjects.OpRelease, queue, opts.request(id, leaseID))
}

// Cancel moves a message that is not terminal to canceled. With a leaseID the cancel of a running
// message is fenced by it (ErrLeaseMismatch, ErrLeaseExpired); with an empty leaseID it is
// unconditional, an operator's. Canceling a canceled message succeeds. Errors: ErrInvalidState
// (completed or errored), ErrMessageNotFound.
func (c *Client) Cancel(ctx context.Context, queue, id, leaseID string) (Message, error) {
	return c.CancelWith(ctx, queue, id, leaseID, nil)
}

// CancelOpts are the options of CancelWith.
type CancelOpts struct {
	// Version cancels the message only at this version, as CancelAt does; given with a leaseID,
	// both must hold.
	Version uint64
	// Error says why: the message's canceled event carries it, and History shows it. At most
	// subjects.MaxErrorLen bytes of UTF-8 (FailureText makes one of an error). A message canceled
	// already keeps its first cancel's event: this Error is not recorded.
	Error string
}

// CancelWith is Cancel, or CancelAt with opts.Version, with opts (given both a leaseID and a
// Version, both must hold). Errors: as those, and ErrBadRequest for an Error too long or not
// UTF-8.
func (c *Client) CancelWith(ctx context.Context, queue, id, leaseID string, opts *CancelOpts) (Message, error) {
	r := subjects.LeaseRequest{ID: id, LeaseID: leaseID}
	if opts != nil {
		r.Version, r.Error = opts.Version, opts.Error
	}
	return c.leaseOp(ctx, subjects.OpCancel, queue, r)
}

// CancelAt is an operator's cancel of message id only at version: the message the caller looked
// at (from Get or Browse), so that a cancel decided on what it was never ends what it became. A
// message canceled since (this cancel, sent again) is left as it is, and CancelAt succeeds.
// Errors: ErrRevisionMismatch (at another version), ErrInvalidState (completed or errored),
// ErrMessageNotFound.
func (c *Client) CancelAt(ctx context.Context, queue, id string, version uint64) (Message, error) {
	if version == 0 {
		return Message{}, apiError(subjects.Errorf(subjects.CodeBadRequest, "CancelAt needs the message's version (Cancel cancels whatever it is)"))
	}
	return c.CancelWith(ctx, queue, id, "", &CancelOpts{Version: version})
}

// RetryOpts are the options of Retry; nil means none.
type RetryOpts struct {
	// Version, if not 0, retries a finished message only at this version: the errored or canceled
	// message the caller looked at (ErrRevisionMismatch if it finished again since).
	Version uint64
	// Delay keeps the message invisible this long before it is pending again (0: pending at once).
	Delay time.Duration
}

// Retry makes an errored or canceled message pending again (or invisible for opts.Delay), with its
// attempts anew; it keeps its id, payload, metadata and history. A message that is not finished
// (the same retry sent again, say) is left as it is, and Retry succeeds whatever opts.Version.
// Errors: ErrInvalidState (completed), ErrRevisionMismatch (finished, at another version than
// opts.Version), ErrMessageNotFound (never enqueued, collected, or being collected), ErrOutOfRange
// (a delay outside 0 to subjects.MaxInvisible).
func (c *Client) Retry(ctx context.Context, queue, id string, opts *RetryOpts) (Message, error) {
	r := subjects.RetryRequest{ID: id}
	if opts != nil {
		r.Version, r.DelayMS = opts.Version, ms(opts.Delay)
	}
	return c.leaseOp(ctx, subjects.OpRetry, queue, r)
}

// RescheduleOpts say what Reschedule changes: Priority (or Deadline), Delay (or VisibleAt), or both.
type RescheduleOpts struct {
	// Version, if not 0, reschedules the message only at this version: the message the caller
	// looked at (ErrRevisionMismatch if it changed since, unless it is already as asked).
	Version uint64
	// Priority, if not nil, is the message's new priority.
	Priority *int64
	// Deadline, if set, is the new priority instead: Deadline.UnixMilli(). Give Priority or
	// Deadline, not both.
	Deadline time.Time
	// Delay, if not nil, makes the message pending this long from now (in whole milliseconds: a
	// fraction is dropped): invisible until then, or pending at once for 0.
	Delay *time.Duration
	// VisibleAt, if set, makes the message pending at that time instead, by the broker's clock:
	// invisible until then, or pending at once if it has come. Give Delay or VisibleAt, not both.
	VisibleAt time.Time
}

// Reschedule changes the plan for a message waiting to run (pending or invisible): its priority,
// when it becomes pending, or both. A message already as asked (the same reschedule sent again,
// say) is left as it is, and Reschedule succeeds whatever opts.Version; a positive Delay always
// counts from the broker's now, so that with opts.Version a reschedule sent again once it landed
// gets ErrRevisionMismatch; VisibleAt sent again finds its work done. Errors: ErrInvalidState
// (running or finished), ErrBadRequest (neither a priority nor a delay nor a VisibleAt, both
// Priority and Deadline, or both Delay and VisibleAt), ErrRevisionMismatch (at another version than
// opts.Version), ErrMessageNotFound, ErrOutOfRange (a delay outside 0 to subjects.MaxInvisible, a
// VisibleAt further ahead).
func (c *Client) Reschedule(ctx context.Context, queue, id string, opts RescheduleOpts) (Message, error) {
	r := subjects.RescheduleRequest{ID: id, Version: opts.Version, Priority: opts.Priority, DelayMS: msPtr(opts.Delay)}
	if err := checkVisibleAt(opts.VisibleAt, ""); err != nil {
		return Message{}, err
	}
	if at, ok := wireVisibleAt(opts.VisibleAt); ok {
		r.VisibleAt = &at
	}
	switch {
	case opts.Priority != nil && !opts.Deadline.IsZero():
		return Message{}, apiError(subjects.Errorf(subjects.CodeBadRequest, "give Priority or Deadline, not both"))
	case opts.Delay != nil && *opts.Delay < 0:
		return Message{}, apiError(subjects.Errorf(subjects.CodeOutOfRange, "delay must be 0 to %s, got %s", subjects.MaxInvisible, *opts.Delay))
	case !opts.Deadline.IsZero():
		p := opts.Deadline.UnixMilli()
		r.Priority = &p
	}
	return c.leaseOp(ctx, subjects.OpReschedule, queue, r)
}

// Get returns the message id of queue, with its payload, in any state until it is garbage-collected.
// Errors: ErrMessageNotFound, ErrInvalidID, ErrQueueNotFound.
func (c *Client) Get(ctx context.Context, queue, id string) (Message, error) {
	return c.leaseOp(ctx, subjects.OpGet, queue, subjects.GetRequest{ID: id})
}

// Depth counts queue's messages by state; with a filter, only those whose metadata has every pair.
// Errors: ErrQueueNotFound, ErrInvalidMetadata.
func (c *Client) Depth(ctx context.Context, queue string, filter map[string]string) (subjects.Counts, error) {
	var r subjects.DepthReply
	err := c.request(ctx, subjects.OpDepth, queue, subjects.DepthRequest{Filter: filter}, &r)
	return r.Counts, err
}

// leaseOp sends a request whose reply is one message.
func (c *Client) leaseOp(ctx context.Context, op subjects.Op, queue string, body any) (Message, error) {
	var m subjects.Message
	if err := c.request(ctx, op, queue, body, &m); err != nil {
		return Message{}, err
	}
	return newMessage(&m), nil
}
