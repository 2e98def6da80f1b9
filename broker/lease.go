package broker

import (
	"context"
	"errors"
	"runtime"
	"slices"

	"github.com/natstone/natstone/kv"
	"github.com/natstone/natstone/subjects"
)

// find returns the entry of id once it has no write in flight. Called and returns with q.mu held.
func (q *queue) find(ctx context.Context, id string) (*entry, error) {
	if err := subjects.ValidateID(id); err != nil {
		return nil, err
	}
	for {
		if err := q.usable(); err != nil {
			return nil, err
		}
		e := q.entries.get(id)
		if e == nil || (e.rev == 0 && !e.busy()) {
			return nil, subjects.Errorf(subjects.CodeMessageNotFound, "queue %s has no message %q", q.name, id)
		}
		if !e.busy() {
			return e, nil
		}
		if err := q.waitIdle(ctx, e); err != nil {
			return nil, unavailable("wait for message", err)
		}
	}
}

// fence checks that leaseID is e's current, unexpired lease. It returns nil when it is, and a typed
// error otherwise; idempotent tells the caller the same call already succeeded and must change nothing.
// A lease that passes was used: the request id of the dequeue that took it is forgotten, and the
// caller's write clears it from the record (usedLease).
func (q *queue) fence(e *entry, leaseID string, op subjects.Op) (idempotent bool, err error) {
	if leaseID == "" {
		return false, subjects.Errorf(subjects.CodeBadRequest, "%s needs the lease_id the dequeue returned", op)
	}
	r := e.record()
	if r.LeaseID != leaseID {
		return false, leaseMismatch(r.ID, leaseID)
	}
	switch r.State {
	case subjects.StateRunning:
		if q.now() >= r.LeaseExpires {
			return false, subjects.Errorf(subjects.CodeLeaseExpired, "message %q: lease %q has expired", r.ID, leaseID)
		}
		q.forgetRequest(e) // the lease's holder had its dequeue's reply
		return false, nil
	case subjects.StateCompleted:
		if op == subjects.OpComplete {
			return true, nil
		}
		return false, subjects.Errorf(subjects.CodeInvalidState, "message %q is completed", r.ID)
	case subjects.StateCanceled:
		return false, subjects.Errorf(subjects.CodeInvalidState, "message %q was canceled", r.ID)
	default: // pending, invisible, errored after this lease
		if r.Released {
			if op == subjects.OpRelease {
				return true, nil
			}
			return false, subjects.Errorf(subjects.CodeInvalidState, "message %q: lease %q was released", r.ID, leaseID)
		}
		return false, subjects.Errorf(subjects.CodeLeaseExpired, "message %q: lease %q has expired", r.ID, leaseID)
	}
}

// atVersion is nil when want is 0 or e's version, else the revision_mismatch of an operation
// fenced by the version its caller saw (want).
func atVersion(e *entry, want uint64) error {
	if want == 0 || want == e.Version() {
		return nil
	}
	return subjects.Errorf(subjects.CodeRevisionMismatch, "message %q is at version %d, not %d: it changed since", e.ID, e.Version(), want)
}

// visibleIn makes r pending from now, or invisible until delayMS from now when it is positive. It
// is the one place a write makes a message pending other than its enqueue and its invisibility's
// end, so every pending record's visible_at is when it became pending (the waiting ages count on
// it).
func visibleIn(r *kv.Record, now, delayMS int64) {
	if delayMS > 0 {
		r.State, r.VisibleAt = subjects.StateInvisible, now+delayMS
		return
	}
	r.State, r.VisibleAt = subjects.StatePending, now
}

// leaseMismatch is the error of a lease operation with a lease that is not message id's last.
func leaseMismatch(id, leaseID string) error {
	return subjects.Errorf(subjects.CodeLeaseMismatch, "message %q: lease %q is not its current lease", id, leaseID)
}

// transition writes e's record as edit changes it and returns the message's new view.
// Called with q.mu held.
func (q *queue) transition(e *entry, edit func(r *kv.Record, now int64)) (subjects.Message, error) {
	return q.transitionWith(&change{e: e}, edit)
}

// transitionWith is transition with c's attributes for the event (a release's failure and refund).
func (q *queue) transitionWith(c *change, edit func(r *kv.Record, now int64)) (subjects.Message, error) {
	return q.transitionAt(c, q.now(), edit)
}

// transitionAt is transitionWith at now, a time the caller read before it decided the change.
func (q *queue) transitionAt(c *change, now int64, edit func(r *kv.Record, now int64)) (subjects.Message, error) {
	e := c.e
	r := e.record()
	edit(&r, now)
	q.stamp(&r, now)
	c.next = r
	q.commit([]*change{c})
	if c.err != nil {
		return subjects.Message{}, unavailable("store message", c.err)
	}
	return q.view(e), nil
}

// complete moves a running message to completed. Completing it again with the same lease succeeds
// and writes nothing.
func (q *queue) complete(ctx context.Context, req subjects.LeaseRequest) (subjects.Message, error) {
	q.mu.Lock()
	defer q.mu.Unlock()
	e, err := q.find(ctx, req.ID)
	if err != nil {
		return subjects.Message{}, err
	}
	if done, err := q.fence(e, req.LeaseID, subjects.OpComplete); err != nil || done {
		return q.view(e), err
	}
	return q.transition(e, func(r *kv.Record, _ int64) {
		r.State = subjects.StateCompleted
		usedLease(r)
	})
}

// extend moves a running message's lease expiry to LeaseMS from now.
func (q *queue) extend(ctx context.Context, req subjects.ExtendRequest) (subjects.Message, error) {
	q.mu.Lock()
	defer q.mu.Unlock()
	if req.LeaseMS != 0 {
		if err := checkRange("lease_ms", req.LeaseMS, subjects.MinLease.Milliseconds(), subjects.MaxLease); err != nil {
			return subjects.Message{}, err
		}
	}
	e, err := q.find(ctx, req.ID)
	if err != nil {
		return subjects.Message{}, err
	}
	if _, err := q.fence(e, req.LeaseID, subjects.OpExtend); err != nil {
		return subjects.Message{}, err
	}
	lease := q.leaseMS(req.LeaseMS, e)
	return q.transition(e, func(r *kv.Record, now int64) {
		r.LeaseExpires = now + lease
		usedLease(r)
	})
}

// usedLease clears the request id from the record of a message whose lease its holder used (an
// extend, a settle): the holder had the dequeue's reply, so that dequeue will not be sent again, and
// after a restart the id must not bring this lease back to a dequeue that reuses it (recovery's
// rebuildRequests). An id stays on a record whose lease ran out unused.
func usedLease(r *kv.Record) { r.RequestID = "" }

// release gives a running message back: pending now, or invisible for DelayMS. The attempt it used
// stays spent, unless req.Refund says the holder never ran the message; with none left the message
// is errored. Its event (released or errored) carries req.Error. Releasing it again with the same
// lease succeeds and writes nothing (its error is not kept).
func (q *queue) release(ctx context.Context, req subjects.ReleaseRequest) (subjects.Message, error) {
	return q.releaseUnlessReplayed(ctx, req, notGiving)
}

// errLeaseKept is releaseUnlessReplayed's answer for a lease it keeps.
var errLeaseKept = errors.New("the lease is kept")

// releaseUnlessReplayed is release, or the give back of a lease (how): a current lease that went
// out again in a retry's reply (entry.replayed, looked at under q.mu) is then kept (errLeaseKept,
// with nothing written or forgotten). A lease of a reply that reached nobody (givingUnheard) marks
// its dequeue's record given back, its requester never having had the lease
// (dequeueRecord.givenBack). A lease its dequeue's reply went without (givingUnanswered) leaves
// that record: the reply carried the dequeue's other leases, which a retry with its request id must
// still get, and only this one is dropped from it.
func (q *queue) releaseUnlessReplayed(ctx context.Context, req subjects.ReleaseRequest, how giving) (subjects.Message, error) {
	q.mu.Lock()
	defer q.mu.Unlock()
	if err := checkRange("delay_ms", req.DelayMS, 0, subjects.MaxInvisible); err != nil {
		return subjects.Message{}, err
	}
	if err := subjects.ValidateError(req.Error); err != nil {
		return subjects.Message{}, err
	}
	e, err := q.find(ctx, req.ID)
	if err != nil {
		return subjects.Message{}, err
	}
	if how != notGiving && q.stillHeld(leaseRef{e, req.LeaseID}) {
		// Before fence, which would forget the lease's request id: a retry with it must still get
		// a lease a retry's reply carried, and a retry waiting for the dequeue must learn that its
		// requester never had the lease (not a use of it: fence's forgetting says nothing else).
		if e.replayed() {
			return q.view(e), errLeaseKept
		}
		if r := q.requests[e.extra().RequestID]; r != nil {
			switch how {
			case givingUnheard:
				r.givenBack = true
			case givingUnanswered:
				// Out of the record, fence finds nothing of the dequeue to forget.
				r.leases = slices.DeleteFunc(r.leases, func(l leaseRef) bool { return l.e == e && l.leaseID == req.LeaseID })
			}
		}
	}
	if done, err := q.fence(e, req.LeaseID, subjects.OpRelease); err != nil || done {
		return q.view(e), err
	}
	return q.transitionWith(&change{e: e, failure: req.Error, refund: req.Refund}, func(r *kv.Record, now int64) {
		r.Released = true
		usedLease(r)
		if req.Refund && r.Attempts > 0 {
			r.Attempts-- // the holder never ran it: this lease spent nothing
		}
		if r.Attempts >= r.MaxAttempts {
			r.State = subjects.StateErrored
		} else {
			visibleIn(r, now, req.DelayMS)
		}
	})
}

// cancel moves a message that is not terminal to canceled. With a lease id it is the lease holder's
// cancel, fenced like complete: the lease must be the current, unexpired one (a holder whose lease
// ran out must not cancel a message that is pending again for someone else). Without one it is
// unconditional (an operator's). With a version it cancels the message only at that version. Its
// canceled event carries req.Error, why. Canceling a canceled message succeeds and writes nothing
// (its error is not kept).
func (q *queue) cancel(ctx context.Context, req subjects.LeaseRequest) (subjects.Message, error) {
	if err := subjects.ValidateError(req.Error); err != nil {
		return subjects.Message{}, err
	}
	q.mu.Lock()
	defer q.mu.Unlock()
	e, err := q.find(ctx, req.ID)
	if err != nil {
		return subjects.Message{}, err
	}
	switch e.State() {
	case subjects.StateCanceled:
		if req.LeaseID != "" && req.LeaseID != e.extra().LeaseID {
			return q.view(e), leaseMismatch(e.ID, req.LeaseID) // not the holder's retry: as complete answers
		}
		return q.view(e), nil
	case subjects.StateCompleted, subjects.StateErrored:
		if req.LeaseID != "" {
			// The holder's cancel is answered as its complete would be: a lease that ran out into
			// errored is lease_expired, another lease lease_mismatch.
			if _, err := q.fence(e, req.LeaseID, subjects.OpCancel); err != nil {
				return q.view(e), err
			}
		}
		return q.view(e), subjects.Errorf(subjects.CodeInvalidState, "message %q is %s", e.ID, e.State())
	}
	if err := atVersion(e, req.Version); err != nil {
		return q.view(e), err
	}
	if req.LeaseID != "" {
		if _, err := q.fence(e, req.LeaseID, subjects.OpCancel); err != nil {
			return q.view(e), err
		}
	}
	return q.transitionWith(&change{e: e, failure: req.Error}, func(r *kv.Record, _ int64) {
		r.State = subjects.StateCanceled
		if req.LeaseID != "" {
			usedLease(r)
		}
	})
}

// retry makes an errored or canceled message pending again, or invisible for DelayMS, with its
// attempts anew: an operator's re-drive of a failed message, which keeps its id and its history.
// With a Version, a finished message is retried only at that version (revision_mismatch
// otherwise): one that finished again since is not retried twice. A message that is not finished
// is left as it is, whatever the version, and the retry succeeds writing nothing: this retry, or
// another, happened (a record does not say which). A completed message is not retried.
func (q *queue) retry(ctx context.Context, req subjects.RetryRequest) (subjects.Message, error) {
	q.mu.Lock()
	defer q.mu.Unlock()
	if err := checkRange("delay_ms", req.DelayMS, 0, subjects.MaxInvisible); err != nil {
		return subjects.Message{}, err
	}
	e, err := q.find(ctx, req.ID)
	if err != nil {
		return subjects.Message{}, err
	}
	mismatch := atVersion(e, req.Version)
	switch state := e.State(); {
	case !state.Terminal():
		return q.view(e), nil
	case state == subjects.StateCompleted:
		return q.view(e), subjects.Errorf(subjects.CodeInvalidState, "message %q is completed: only errored or canceled messages are retried", e.ID)
	case e.collecting():
		// Its retention ended and its collection began: its payload may be deleted already.
		return q.view(e), subjects.Errorf(subjects.CodeMessageNotFound, "message %q is being garbage-collected (its retention ended): it cannot be retried", e.ID)
	case mismatch != nil:
		return q.view(e), mismatch
	}
	return q.transition(e, func(r *kv.Record, now int64) {
		visibleIn(r, now, req.DelayMS)
		r.Attempts = 0
		r.LeaseID, r.LeaseExpires, r.RequestID, r.Released = "", 0, "", false
		r.EndedAt = 0
	})
}

// reschedule gives a message waiting to run (pending or invisible) a new priority, or makes it
// pending DelayMS from now (at once for 0) or at VisibleAt, or both: an operator's or a producer's
// change of plan for work not started. With a Version, only at that version. A message already as
// asked (its priority, and pending when DelayMS is 0 or VisibleAt has come, invisible until
// VisibleAt otherwise) is left as it is, whatever the version, and the reschedule succeeds writing
// nothing: sent again, it finds its own work done. A positive DelayMS always writes, from now. A
// running or finished message is invalid_state.
//
// A message whose priority is the time it became, or becomes, visible — the default priority
// (validateMessage) — keeps it so: a reschedule that moves when it runs, without a priority, moves
// the priority with it, so that a message run now queues from now (FIFO by readiness) rather than
// from the time it was to run, and one put off queues from its new time.
func (q *queue) reschedule(ctx context.Context, req subjects.RescheduleRequest) (subjects.Message, error) {
	q.mu.Lock()
	defer q.mu.Unlock()
	switch {
	case req.Priority == nil && req.DelayMS == nil && req.VisibleAt == nil:
		return subjects.Message{}, subjects.Errorf(subjects.CodeBadRequest, "reschedule needs a priority, a delay_ms or a visible_at, or a priority with either")
	case req.DelayMS != nil && req.VisibleAt != nil:
		return subjects.Message{}, subjects.Errorf(subjects.CodeBadRequest, "give delay_ms or visible_at, not both")
	case req.DelayMS != nil:
		if err := checkRange("delay_ms", *req.DelayMS, 0, subjects.MaxInvisible); err != nil {
			return subjects.Message{}, err
		}
	}
	var visibleAt int64 // VisibleAt's Unix ms, checked before anything is looked up
	if req.VisibleAt != nil {
		var err error
		if visibleAt, err = visibleAtMS(*req.VisibleAt, q.now()); err != nil {
			return subjects.Message{}, err
		}
	}
	e, err := q.find(ctx, req.ID)
	if err != nil {
		return subjects.Message{}, err
	}
	// After find, which may let go of q.mu while a write of the message lands (seconds, in an
	// election): one time for the checks and the write, not older than that write's.
	now := q.now()
	at := now // when it is to run: VisibleAt, or the delay's end
	switch {
	case req.VisibleAt != nil:
		at = visibleAt
	case req.DelayMS != nil:
		at = now + *req.DelayMS
	}
	state, mismatch := e.State(), atVersion(e, req.Version)
	// Whether it is to move, and if so, whether it is where it is to be already: pending once the
	// time asked has come, otherwise invisible until then (a positive delay_ms always counts from
	// now, so only a visible_at finds that).
	moves := req.DelayMS != nil || req.VisibleAt != nil
	asAsked := at <= now && state == subjects.StatePending ||
		req.VisibleAt != nil && state == subjects.StateInvisible && e.VisibleAt() == at
	switch {
	case state != subjects.StatePending && state != subjects.StateInvisible:
		return q.view(e), subjects.Errorf(subjects.CodeInvalidState, "message %q is %s: only a pending or invisible message is rescheduled", e.ID, state)
	case (req.Priority == nil || *req.Priority == e.Priority) && (!moves || asAsked):
		return q.view(e), nil
	case mismatch != nil:
		return q.view(e), mismatch
	}
	return q.transitionAt(&change{e: e, kind: subjects.EventRescheduled}, now, func(r *kv.Record, now int64) {
		readiness := r.Priority == r.VisibleAt // the default priority, which follows when it can run
		if req.Priority != nil {
			r.Priority = *req.Priority
		}
		if moves && !asAsked {
			visibleIn(r, now, at-now)
			if req.Priority == nil && readiness {
				r.Priority = r.VisibleAt
			}
		}
	})
}

// get returns a message with its payload.
func (q *queue) get(ctx context.Context, id string) (subjects.Message, error) {
	// A write of the message in flight is waited for, but not for longer than a write is: one of
	// unknown outcome waits for storage to answer it (the doubt timer asks every 2 s), which a
	// storage that refuses every write never does.
	wctx, cancel := context.WithTimeout(ctx, q.b.cfg.WriteTimeout)
	defer cancel()
	q.mu.Lock()
	e, err := q.find(wctx, id)
	if err != nil {
		q.mu.Unlock()
		if ctx.Err() == nil && wctx.Err() != nil && subjects.CodeOf(err) == subjects.CodeUnavailable { // the wait's, not another answer
			err = subjects.Errorf(subjects.CodeUnavailable, "message %q has a write whose outcome storage has not told yet: retry", id)
		}
		return subjects.Message{}, err
	}
	m := q.view(e)
	seq := e.Seq
	q.mu.Unlock()
	b := <-q.readBodies(ctx, []uint64{seq})[0]
	if b.err != nil {
		return subjects.Message{}, unavailable("read payload", b.err)
	}
	m.SetPayload(b.data)
	return m, nil
}

// depth counts the queue's messages by state, only those whose metadata matches filter if given.
func (q *queue) depth(filter map[string]string) (subjects.Counts, error) {
	if err := subjects.ValidateMetadata(filter, subjects.MaxMetadataPairs); err != nil {
		return subjects.Counts{}, err
	}
	q.mu.Lock()
	defer q.mu.Unlock()
	if err := q.usable(); err != nil {
		return subjects.Counts{}, err
	}
	if len(filter) == 0 {
		return q.countsLocked(), nil
	}
	c, _, err := q.countMatching(filter)
	return c, err
}

// countStep is how many slots of the entries' table a filtered count reads per hold of the
// queue's lock, about a millisecond's work.
const countStep = 4096

// countMatching walks the queue for the stored messages whose metadata matches filter: their counts
// by state, and when the longest-waiting pending one among them became pending (0: none).
//
// It lets go of q.mu every countStep slots, for the requests waiting on it: on a queue of a
// million and a half messages the walk takes about 300 ms, which held every dequeue of the queue
// up that long (a dashboard's page with a filter, every 2 s). With 600,000 messages, dequeues
// during filtered depths waited at most 348 ms before, 15 to 41 ms after (steps of 2048 to 8192
// slots gave 15 to 60 ms; the walk itself takes longer the smaller they are). So the counts are not of one
// instant: a message that changes state meanwhile counts in either state, and one that the table
// moved (an insert, a removal, a resize: the walk goes on over the slots it started with) may be
// missed or counted twice. An error says the queue closed meanwhile.
// Called with q.mu held, which it releases and takes again.
func (q *queue) countMatching(filter map[string]string) (c subjects.Counts, oldestPending int64, err error) {
	tags, slots := q.entries.tags, q.entries.slots
	for i := range tags {
		if i > 0 && i%countStep == 0 {
			if err := q.letOthersIn(); err != nil {
				return subjects.Counts{}, 0, err
			}
		}
		if tags[i] == 0 { // read after the pause: the slot may have emptied during it
			continue
		}
		e := slots[i]
		if e.rev == 0 || !matches(e.extra().Metadata, filter) {
			continue
		}
		addCount(&c, e.State(), 1)
		if e.State() == subjects.StatePending && (oldestPending == 0 || e.VisibleAt() < oldestPending) {
			oldestPending = e.VisibleAt()
		}
	}
	return c, oldestPending, nil
}

// letOthersIn lets go of q.mu for a moment, between two steps of a long walk, for the requests
// waiting on it, and takes it again; an error says the queue closed meanwhile.
func (q *queue) letOthersIn() error {
	q.mu.Unlock()
	if q.testPausing != nil {
		q.testPausing()
	}
	runtime.Gosched() // a request waiting on the lock takes it now, not at the next step
	q.mu.Lock()
	return q.usable()
}

func matches(md, filter map[string]string) bool {
	for k, v := range filter {
		if got, ok := md[k]; !ok || got != v {
			return false
		}
	}
	return true
}

func (q *queue) countsLocked() subjects.Counts {
	var c subjects.Counts
	for _, s := range subjects.States {
		addCount(&c, s, q.counts[stateIndex(s)])
	}
	return c
}

func addCount(c *subjects.Counts, s subjects.State, n int) {
	switch s {
	case subjects.StateInvisible:
		c.Invisible += n
	case subjects.StatePending:
		c.Pending += n
	case subjects.StateRunning:
		c.Running += n
	case subjects.StateCompleted:
		c.Completed += n
	case subjects.StateCanceled:
		c.Canceled += n
	case subjects.StateErrored:
		c.Errored += n
	}
}

// andNext runs settle — k's complete, release or cancel — and then, if the request asked for one, the
// dequeue in next, so that a worker finishes a message and gets its next one in one round trip. A
// bad next is refused before anything is written. Once the settle is stored its reply stands: a
// dequeue that fails then says so in the reply's next, beside the settled message.
//
// A retry of a request whose next carried a request_id gets the first reply's settled message and
// that dequeue's leases back, even when the settle itself would now fail: the message collected
// meanwhile (message_not_found), or leased again, by that very next or another dequeue
// (lease_mismatch).
func (q *queue) andNext(ctx context.Context, k settleKey, next *subjects.DequeueRequest, settle func() (subjects.Message, error)) (any, error) {
	if next == nil {
		return settle()
	}
	if next.WaitMS != 0 {
		return nil, subjects.Errorf(subjects.CodeOutOfRange, "next: wait_ms must be 0 (a settle's dequeue does not long-poll), got %d", next.WaitMS)
	}
	r := *next
	filter, err := validateDequeue(&r)
	if err != nil {
		var e *subjects.Error
		if errors.As(err, &e) {
			err = subjects.Errorf(e.Code, "next: %s", e.Message)
		}
		return nil, err
	}
	m, err := settle()
	if err != nil {
		if prior, m, ok := q.settledBy(r.RequestID, k); ok {
			msgs, err := q.replayRequest(ctx, prior)
			return q.settleReply(m, msgs, err), nil
		}
		return nil, err
	}
	var s *settledAs // kept with the dequeue's request id, for the settle's retry
	if r.RequestID != "" {
		s = newSettledAs(k, &m)
	}
	msgs, err := q.leaseBest(ctx, r, filter, s, replyShare(q.name, m.ID, 0, m.Metadata))
	return q.settleReply(m, msgs, err), nil
}

// settleReply is the reply of a settle of m whose next dequeue returned msgs and err.
func (q *queue) settleReply(m subjects.Message, msgs []subjects.Message, err error) subjects.SettleReply {
	reply := subjects.SettleReply{Message: m, Next: &subjects.NextReply{Messages: msgs}}
	if msgs == nil {
		reply.Next.Messages = []subjects.Message{}
	}
	if err != nil {
		var e *subjects.Error
		if !errors.As(err, &e) {
			q.log().Error("next dequeue failed", "error", err)
			e = subjects.Errorf(subjects.CodeInternal, "%v", err)
		}
		reply.Next.Error = e
	}
	return reply
}

// settledBy returns the record of the dequeue with requestID, and the settled message as the reply
// gave it, if the settle k ran that dequeue: the settle was stored, and this is its retry.
func (q *queue) settledBy(requestID string, k settleKey) (*dequeueRecord, subjects.Message, bool) {
	if requestID == "" {
		return nil, subjects.Message{}, false
	}
	q.mu.Lock()
	defer q.mu.Unlock()
	q.expireRequests(q.now())
	prior := q.requests[requestID]
	if prior == nil || prior.settled == nil || prior.settled.settleKey != k {
		return nil, subjects.Message{}, false
	}
	return prior, prior.settled.view(q), true
}
