package broker

import (
	"container/heap"
	"context"
	"errors"
	"slices"
	"time"

	"github.com/natstone/natstone/broker/index"
	"github.com/natstone/natstone/kv"
	"github.com/natstone/natstone/subjects"
)

// waiter is a dequeue long-polling for messages.
type waiter struct {
	filter index.Filter
	n      int
	got    chan []*entry // buffered: the entries popped for it
	gone   chan struct{} // closed when the queue closes
	ended  chan struct{} // closed when its request id is abandoned; nil without one
}

// dequeueRecord remembers what a dequeue with a request id leased, so a retry returns the same leases.
// A record is kept up to five minutes (about 190 bytes, 320 with a settle; an abandoned one 50 more),
// less once a lease of it is used (forgetRequest) or when it is a settle's next that leased nothing
// (keepSettled), unless it is abandoned (AbandonedIDWindow for one no dequeue brought). So what
// only a retry racing the first dequeue needs is made for it: the channel it waits on (a channel
// each took another 110 bytes).
type dequeueRecord struct {
	leases   []leaseRef
	settled  *settledAs    // the settle whose next this dequeue was, if any
	inFlight bool          // the first dequeue with the id has not finished
	finished chan struct{} // closed when it finishes; made by a retry that waits for that
	waiting  *waiter       // the first dequeue's long poll while it waits, for abandon to end it
	gaveUp   *abandoned    // set once the id is abandoned: a dequeue with it leases nothing
	// givenBack: its leases are being given back, its reply having reached nobody; used: it was
	// forgotten because its requester used a lease of it, so had the reply (a retry waiting for it
	// then leases nothing new, where after a give back it leases as a new dequeue).
	givenBack, used bool
	id              string // the request id: the record's key in q.requests
	until           int64  // when it is forgotten at the latest, in Unix ms
	slot            int    // its index in q.reqEnds; -1 once out of it
}

// settleKey names a settle with next: its op, message and lease. Its retry names the same.
type settleKey struct {
	op          subjects.Op
	id, leaseID string
}

// settledAs is what a stored settle made of its message, kept with the dequeue its next ran so that
// the settle's retry gets the same reply: the fields a settle changes, beside the entry, which holds
// the others (no later transition changes them). About 130 bytes, where the message's view would
// take some 250: a worker pool settling thousands of messages a second keeps a lease's worth of these.
type settledAs struct {
	settleKey
	e                             *entry
	state                         subjects.State
	lease                         string // the message's lease_id in the reply
	version                       uint64
	attempts                      int
	visibleAt, updatedAt, endedAt int64
	leaseEnd                      int64 // when the settled lease would have run out (0: unknown): its holder retries the settle until then
}

// newSettledAs records m, the reply of the settle k.
func newSettledAs(k settleKey, m *subjects.Message) *settledAs {
	s := &settledAs{settleKey: k, state: m.State, lease: m.LeaseID, version: m.Version, attempts: m.Attempts,
		visibleAt: m.VisibleAt.UnixMilli(), updatedAt: m.UpdatedAt.UnixMilli()}
	if m.EndedAt != nil {
		s.endedAt = m.EndedAt.UnixMilli()
	}
	return s
}

// view is the message as the settle's reply gave it. Called with q.mu held.
func (s *settledAs) view(q *queue) subjects.Message {
	m := q.view(s.e)
	m.State, m.LeaseID, m.Version, m.Attempts = s.state, s.lease, s.version, s.attempts
	m.AttemptsLeft = max(int(s.e.MaxAttempts)-s.attempts, 0)
	m.LeaseExpiresAt = nil // a settle leaves running
	m.VisibleAt, m.UpdatedAt = time.UnixMilli(s.visibleAt).UTC(), time.UnixMilli(s.updatedAt).UTC()
	m.EndedAt = nil
	if s.endedAt != 0 {
		t := time.UnixMilli(s.endedAt).UTC()
		m.EndedAt = &t
	}
	return m
}

type leaseRef struct {
	e       *entry
	leaseID string
}

// stillHeld reports whether l is still held: its entry is the queue's, running under that lease.
// Called with q.mu held.
func (q *queue) stillHeld(l leaseRef) bool {
	return q.entries.get(l.e.ID) == l.e && l.e.State() == subjects.StateRunning && l.e.extra().LeaseID == l.leaseID
}

// noLongerHeld reports whether err, a release's, says the lease was no longer there to release:
// settled, canceled or run out meanwhile, or the message gone.
func noLongerHeld(err error) bool {
	var se *subjects.Error
	return errors.As(err, &se) && slices.Contains([]subjects.Code{subjects.CodeLeaseMismatch, subjects.CodeLeaseExpired, subjects.CodeInvalidState, subjects.CodeMessageNotFound}, se.Code)
}

// recordHeap holds a queue's dequeue records by until, earliest first (container/heap): those a
// lease's use or a settle forgets early leave it at once, so it holds the remembered records only.
type recordHeap []*dequeueRecord

func (h recordHeap) Len() int           { return len(h) }
func (h recordHeap) Less(i, j int) bool { return h[i].until < h[j].until }
func (h recordHeap) Swap(i, j int) {
	h[i], h[j] = h[j], h[i]
	h[i].slot, h[j].slot = i, j
}
func (h *recordHeap) Push(x any) {
	r := x.(*dequeueRecord)
	r.slot = len(*h)
	*h = append(*h, r)
}
func (h *recordHeap) Pop() any {
	old := *h
	r := old[len(old)-1]
	old[len(old)-1] = nil
	*h = trimmed(old[:len(old)-1])
	r.slot = -1
	return r
}

// trimmed returns s, or a copy of it with half its capacity once it is under a quarter full: a
// heap's array would otherwise keep the room of the largest backlog it held (a copy costs O(len(s))
// once for every quarter of the capacity popped). Arrays under 2048 are left alone.
func trimmed[T any](s []T) []T {
	if c := cap(s); c < 2048 || len(s)*4 >= c {
		return s
	}
	return append(make([]T, 0, cap(s)/2), s...)
}

// remember keeps rec as the record of request id until until (Unix ms): a dequeue's, the
// RequestIDWindow from it. Called with q.mu held.
func (q *queue) remember(id string, rec *dequeueRecord, until int64) {
	rec.id, rec.until = id, until
	q.requests[id] = rec
	heap.Push(&q.reqEnds, rec)
	q.armRequests()
}

// reqSweepGapMS is the least time between two firings of a queue's request sweep.
const reqSweepGapMS = 1000

// armRequests arms the request sweep for the earliest record's end (at least reqSweepGapMS from
// now), unless it is armed for no more than a reqSweepGapMS after that: dequeues forget the records
// whose time is up as they come (expireRequests), but a queue whose dequeues stop (its workers
// scaled to zero) would otherwise keep its last RequestIDWindow of them, and the entries they point
// to, collected messages among them, for good (a soak saw 16 MB so, held after the load). A busy
// queue's records end later and later, so it is armed again about once a reqSweepGapMS at most.
// Called with q.mu held, whenever the earliest end may have moved sooner.
func (q *queue) armRequests() {
	if len(q.reqEnds) == 0 || q.closed != nil {
		return
	}
	now := q.now()
	at := max(q.reqEnds[0].until, now+reqSweepGapMS)
	if q.reqSweepAt != 0 && q.reqSweepAt <= at+reqSweepGapMS {
		return
	}
	q.reqSweepAt = at
	wait := time.Duration(at-now) * time.Millisecond
	if q.reqSweep == nil {
		q.reqSweep = q.b.clock.AfterFunc(wait, q.sweepRequests)
		return
	}
	q.reqSweep.Reset(wait)
}

// sweepRequests forgets the request ids whose time is up, and arms itself again while some are
// remembered.
func (q *queue) sweepRequests() {
	q.mu.Lock()
	defer q.mu.Unlock()
	if q.closed != nil || !q.b.track() {
		return
	}
	defer q.b.wg.Done()
	q.reqSweepAt = 0
	q.expireRequests(q.now())
	q.armRequests()
}

// forget drops rec, now or early. Called with q.mu held.
func (q *queue) forget(rec *dequeueRecord) {
	if q.requests[rec.id] == rec {
		delete(q.requests, rec.id)
		q.requests = index.Trim(q.requests, &q.requestsMost)
	}
	if rec.slot >= 0 {
		heap.Remove(&q.reqEnds, rec.slot)
	}
}

// validateDequeue checks a dequeue request and fills in its defaults.
func validateDequeue(r *subjects.DequeueRequest) (index.Filter, error) {
	if r.Batch == 0 {
		r.Batch = 1
	}
	if r.Batch < 1 || r.Batch > subjects.MaxDequeueBatch {
		return nil, subjects.Errorf(subjects.CodeOutOfRange, "batch must be 1 to %d, got %d", subjects.MaxDequeueBatch, r.Batch)
	}
	if r.LeaseMS != 0 {
		if err := checkRange("lease_ms", r.LeaseMS, subjects.MinLease.Milliseconds(), subjects.MaxLease); err != nil {
			return nil, err
		}
	}
	if err := checkRange("wait_ms", r.WaitMS, 0, subjects.MaxWait); err != nil {
		return nil, err
	}
	if err := subjects.ValidateMetadata(r.Filter, subjects.MaxMetadataPairs); err != nil {
		return nil, err
	}
	if err := subjects.ValidateRequestID(r.RequestID); err != nil {
		return nil, err
	}
	if err := subjects.ValidateWorker(r.Worker); err != nil {
		return nil, err
	}
	return toFilter(r.Filter), nil
}

func toFilter(md map[string]string) index.Filter {
	if len(md) == 0 {
		return nil
	}
	f := make(index.Filter, 0, len(md))
	for k, v := range md {
		f = append(f, index.Pair{Key: k, Value: v})
	}
	return f
}

// dequeue leases up to r.Batch earliest-deadline pending messages matching the filter, waiting up to
// r.WaitMS for a first one, and returns them with their payloads.
func (q *queue) dequeue(ctx context.Context, r subjects.DequeueRequest) ([]subjects.Message, error) {
	filter, err := validateDequeue(&r)
	if err != nil {
		return nil, err
	}
	return q.leaseBest(ctx, r, filter, nil, 0)
}

// leaseBest is dequeue once r is validated (with its defaults) and its filter built; s is the settle
// whose next it is, if any, and taken what the settle's message takes of the reply.
func (q *queue) leaseBest(ctx context.Context, r subjects.DequeueRequest, filter index.Filter, s *settledAs, taken int) ([]subjects.Message, error) {
	q.mu.Lock()
	if err := q.usable(); err != nil {
		q.mu.Unlock()
		return nil, err
	}
	q.expireRequests(q.now())
	if prior := q.requests[r.RequestID]; r.RequestID != "" && prior != nil {
		if prior.gaveUp != nil {
			q.mu.Unlock()
			return nil, nil // abandoned: its requester does not read the reply
		}
		// A retry leases nothing new, so it gets its leases back even while dequeue is blocked.
		arrived := q.now()
		q.mu.Unlock()
		msgs, err := q.replayRequest(ctx, prior)
		if err == nil && len(msgs) == 0 && q.forgotten(r.RequestID, prior) {
			// The id was forgotten while this retry waited for the first dequeue, whose requester
			// never had a lease of it: it leased nothing, or its leases were given back (its reply
			// reached nobody). This is then a dequeue of its own, as it would be had it come a
			// moment later, with what is left of its wait, rather than an empty answer to a
			// requester still waiting.
			r.WaitMS = max(r.WaitMS-(q.now()-arrived), 0)
			return q.leaseBest(ctx, r, filter, s, taken)
		}
		return msgs, err
	}
	if q.cfg.DequeueBlocked {
		q.mu.Unlock()
		return nil, subjects.Errorf(subjects.CodeQueueBlocked, "queue %s: dequeue is blocked", q.name)
	}
	var rec *dequeueRecord
	if r.RequestID != "" {
		rec = &dequeueRecord{inFlight: true}
		if s != nil {
			// (Collected meanwhile, it has no entry: a retry of the settle then gets its error.)
			if s.e = q.entries.get(s.id); s.e != nil {
				rec.settled = s
				if x := s.e.extra(); x.LeaseID == s.leaseID {
					s.leaseEnd = x.LeaseExpires // the settle keeps the lease's end (its extends too)
				}
			}
		}
		q.remember(r.RequestID, rec, q.now()+RequestIDWindow.Milliseconds())
		defer func() {
			q.mu.Lock()
			rec.inFlight = false
			if rec.finished != nil {
				close(rec.finished)
			}
			q.mu.Unlock()
		}()
	}

	var es []*entry
	if room := q.room(); room > 0 {
		es = q.pending.Pop(filter, min(q.fitting(filter, r.Batch, taken), room))
	}
	if len(es) == 0 && r.WaitMS > 0 {
		es = q.wait(ctx, filter, r.Batch, time.Duration(r.WaitMS)*time.Millisecond, rec)
		q.reserved -= len(es) // taken: counted as leasing from the commit below
		// The entries were reserved for this waiter (busy) when they were popped; take the
		// reservation over: the commit below marks them busy again in the same lock hold.
		for _, e := range es {
			q.endWrite(e) // and wake whoever waited for them, should the queue have closed meanwhile
		}
		if err := q.usable(); err != nil {
			deleted := q.deleting
			q.mu.Unlock()
			if deleted {
				return nil, nil // the queue was deleted while it waited: a long poll ends empty
			}
			return nil, err // the broker stops: unavailable, for the poll to be sent again
		}
		if len(es) == 0 && ctx.Err() != nil {
			// The broker stops (or lost its claim), and the wait saw it before the stop closed
			// this queue: unavailable too, not an empty answer.
			q.mu.Unlock()
			return nil, subjects.Errorf(subjects.CodeUnavailable, "queue %s: the broker stopped during the wait", q.name)
		}
	}
	if len(es) == 0 {
		if rec != nil {
			// Nothing was leased: a retry may lease, like any new dequeue. (A settle's retry gets
			// its reply again, with no message.)
			q.keepSettled(rec)
		}
		q.mu.Unlock()
		return nil, nil
	}
	now := q.now()
	cs := make([]*change, len(es))
	seqs := make([]uint64, len(es))
	for i, e := range es {
		next := e.record()
		next.State = subjects.StateRunning
		next.Attempts++
		next.LeaseID = q.ids.Next()
		next.LeaseExpires = now + q.leaseMS(r.LeaseMS, e)
		next.RequestID = r.RequestID
		next.Released = false
		q.stamp(&next, now)
		cs[i] = &change{e: e, next: next, worker: r.Worker}
		seqs[i] = e.Seq
	}
	if q.testLeasing != nil {
		q.testLeasing()
	}
	bodies := q.readBodies(ctx, seqs) // in parallel with the lease writes: payloads are immutable
	q.commit(cs)
	var held, maybe []leaseRef
	var heldBodies []chan bodyResult
	for i, c := range cs {
		switch {
		case c.err == nil:
			held = append(held, leaseRef{e: c.e, leaseID: c.next.LeaseID})
			heldBodies = append(heldBodies, bodies[i])
		case !c.skipped && !errors.Is(c.err, kv.ErrConflict):
			maybe = append(maybe, leaseRef{e: c.e, leaseID: c.next.LeaseID}) // outcome unknown
		}
	}
	if rec != nil {
		// A retry must get back every lease this dequeue may have taken, the unknown ones too.
		rec.leases = slices.Concat(held, maybe)
		if len(rec.leases) == 0 {
			q.keepSettled(rec) // nothing leased: a retry may lease
		}
	}
	views := make([]subjects.Message, len(held))
	for i, h := range held {
		views[i] = q.view(h.e)
	}
	var unanswered []heardLease
	if len(held) > 0 || rec == nil {
		// The reply goes without the leases of unknown outcome: the requester it reaches never
		// has them (a retry of a dequeue without a request id cannot get them back; one with it
		// is sent only if the reply was lost). Those that land are given back, their attempts
		// refunded, rather than left to run out (givingUnanswered).
		for _, l := range maybe {
			unanswered = append(unanswered, heardLease{id: l.e.ID, leaseID: l.leaseID})
		}
	}
	hook := q.testGaveBack
	q.mu.Unlock()
	if len(unanswered) > 0 {
		q.b.giveBackLater(sentReply{queue: q.name, leases: unanswered}, givingUnanswered, hook)
	}
	if len(held) == 0 && len(cs) > 0 {
		return nil, subjects.Errorf(subjects.CodeUnavailable, "queue %s: storage did not take the leases; retry", q.name)
	}
	for i := range views {
		b := <-heldBodies[i]
		if b.err != nil {
			return nil, unavailable("read payload", b.err)
		}
		views[i].SetPayload(b.data)
	}
	return views, nil
}

// replyRoom is what a reply's messages or events leave of the server's max_payload for the rest of
// it: its headers and its JSON around them.
const replyRoom = 4 << 10

// replyBudget is how many bytes the messages or events of one reply may take: the server drops a
// reply over its max_payload (1 MiB by default).
func (b *Broker) replyBudget() int { return int(b.cfg.Conn.MaxPayload()) - replyRoom }

// fitting returns how many of the n best pending messages matching f one reply can carry beside
// taken bytes of it (a settle's message, before its next's): n, unless their shares of the reply
// (replyShare) would add up to more than the server takes (max_payload, 1 MiB by default), which
// would drop the reply and leave the leases to run out unseen. Then as many as fit: always one in a
// dequeue's own reply (an enqueue refuses a message that does not fit alone), and none beside a
// settle's message that leaves too little room (the worker's next poll gets it). Called with q.mu
// held.
func (q *queue) fitting(f index.Filter, n, taken int) int {
	if n == 1 && taken == 0 {
		return 1
	}
	budget := q.b.replyBudget() - taken
	if n*q.widest <= budget {
		return n // the common case: no walk
	}
	size := 0
	for i, e := range q.pending.Peek(f, n) {
		size += replyShare(q.name, e.ID, e.PayloadSize(), e.extra().Metadata)
		if size > budget {
			if i == 0 && taken == 0 {
				return 1
			}
			return i
		}
	}
	return n
}

// replyShare is the most a message adds to a reply (subjects.AppendMessage): its id, queue name and
// metadata as JSON strings, its payload as JSON at its largest (subjects.MaxPayloadJSON), a comma, and
// fixedShare for the rest. FuzzReplyShare checks that it is a bound.
func replyShare(queue, id string, payloadSize int, metadata map[string]string) int {
	n := fixedShare + subjects.StringLen(queue) + subjects.StringLen(id) + subjects.MaxPayloadJSON(payloadSize)
	for k, v := range metadata {
		n += subjects.StringLen(k) + subjects.StringLen(v) + 2 // the colon, and the comma between pairs
	}
	return n
}

// fixedShare bounds what a message's JSON holds beside its id, queue name, metadata pairs and payload:
// the field names (the longer payload_base64's), the state, the numbers at their longest, the lease id
// and the times: about 430 bytes at most, 500 through encoding/json's fallback (other time zones).
const fixedShare = 512

// leaseMS picks a lease duration: the request's, else the message's own, else the queue's.
func (q *queue) leaseMS(requested int64, e *entry) int64 {
	switch {
	case requested > 0:
		return requested
	case e.extra().LeaseMS > 0:
		return int64(e.extra().LeaseMS)
	default:
		return q.cfg.LeaseMS
	}
}

// wait parks a dequeue until messages matching f are popped for it, d elapses, the context ends,
// the queue closes, or its request id (rec's, if any) is abandoned. Called and returns with q.mu
// held.
func (q *queue) wait(ctx context.Context, f index.Filter, n int, d time.Duration, rec *dequeueRecord) []*entry {
	w := &waiter{filter: f, n: n, got: make(chan []*entry, 1), gone: make(chan struct{})}
	if rec != nil {
		w.ended = make(chan struct{})
		rec.waiting = w
		defer func() { rec.waiting = nil }() // with q.mu held again
	}
	q.waiters = append(q.waiters, w)
	if q.testParked != nil {
		q.testParked()
	}
	timeout := make(chan struct{})
	t := q.b.clock.AfterFunc(d, func() { close(timeout) })
	q.mu.Unlock()
	var es []*entry
	select {
	case es = <-w.got:
	case <-timeout:
	case <-ctx.Done():
	case <-w.gone:
	case <-w.ended:
	}
	t.Stop()
	q.mu.Lock()
	if es != nil {
		return es
	}
	select {
	case es = <-w.got: // served just as it gave up
		return es
	default:
	}
	for i, o := range q.waiters {
		if o == w {
			q.waiters = append(q.waiters[:i], q.waiters[i+1:]...)
			break
		}
	}
	return nil
}

// serveWaiters hands eligible messages to waiting dequeues in arrival order.
func (q *queue) serveWaiters() {
	if len(q.waiters) == 0 || q.cfg.DequeueBlocked {
		return
	}
	kept := q.waiters[:0]
	for i, w := range q.waiters {
		room := q.room()
		if q.pending.Len() == 0 || room <= 0 {
			kept = append(kept, q.waiters[i:]...)
			break
		}
		if es := q.pending.Pop(w.filter, min(q.fitting(w.filter, w.n, 0), room)); len(es) > 0 {
			q.reserved += len(es)
			// Reserved until the waiter's goroutine takes them: nothing else may write them
			// (a cancel) or offer them to another dequeue meanwhile.
			for _, e := range es {
				e.setBusy(true)
			}
			w.got <- es
			continue
		}
		kept = append(kept, w)
	}
	clear(q.waiters[len(kept):])
	q.waiters = kept
}

// replayRequest is a retried dequeue's reply: the leases of prior, the first dequeue with its request
// id, that are still held, with their payloads. Called without q.mu.
func (q *queue) replayRequest(ctx context.Context, prior *dequeueRecord) ([]subjects.Message, error) {
	held, err := q.heldBy(ctx, prior)
	if err != nil {
		return nil, err
	}
	return q.withPayloads(ctx, held)
}

// forgotten reports whether prior, a dequeue with request id id, is no longer the one the queue
// remembers for it, though not for a use of its leases (its requester had them). Called without
// q.mu.
func (q *queue) forgotten(id string, prior *dequeueRecord) bool {
	q.mu.Lock()
	defer q.mu.Unlock()
	return q.requests[id] != prior && !prior.used
}

// heldBy returns the leases of prior, a dequeue with a request id, that are still held, once it
// has finished. Called without q.mu.
func (q *queue) heldBy(ctx context.Context, prior *dequeueRecord) ([]leaseRef, error) {
	q.mu.Lock()
	if prior.inFlight {
		if prior.finished == nil {
			prior.finished = make(chan struct{})
		}
		finished := prior.finished
		if q.testRetryWaits != nil {
			q.testRetryWaits()
		}
		q.mu.Unlock()
		select {
		case <-finished:
		case <-ctx.Done():
			return nil, unavailable("wait for the first dequeue with this request_id", ctx.Err())
		}
		q.mu.Lock()
	}
	defer q.mu.Unlock()
	return q.replay(ctx, prior)
}

// replay returns the leases of an earlier dequeue with the same request id that are still held,
// once any whose outcome was unknown is known. Called and returns with q.mu held.
func (q *queue) replay(ctx context.Context, r *dequeueRecord) ([]leaseRef, error) {
	var held []leaseRef
	for _, l := range r.leases {
		if err := q.waitIdle(ctx, l.e); err != nil {
			return nil, unavailable("wait for the leases of the first dequeue with this request_id", err)
		}
		if q.stillHeld(l) {
			l.e.bits |= replayedFlag // in this reply too (or an abandon's release, which needs none): see unheard
			held = append(held, l)
		}
	}
	return held, nil
}

// abandoned is what abandon made of a request id: the messages it gave back.
type abandoned struct{ released []string }

// abandon ends the dequeue with request id r.RequestID for a requester that gave up on its reply
// (a worker's long poll abandoned at its stop): a poll still waiting ends at once, empty; the leases
// it took that are still held are released, pending again with their attempts given back (its
// requester never had them); and a dequeue with the id that comes later (or that the broker has
// not read yet: each operation has a subscription of its own) leases nothing, for the
// RequestIDWindow. An id the queue does not know is remembered so all the same. Abandoning an id
// again gives back what leases were still held, if any, and answers every message given back.
func (q *queue) abandon(ctx context.Context, r subjects.AbandonRequest) (subjects.AbandonReply, error) {
	if r.RequestID == "" {
		return subjects.AbandonReply{}, subjects.Errorf(subjects.CodeBadRequest, "abandon needs the request_id of the dequeue to end")
	}
	if err := subjects.ValidateRequestID(r.RequestID); err != nil {
		return subjects.AbandonReply{}, err
	}
	q.mu.Lock()
	if err := q.usable(); err != nil {
		q.mu.Unlock()
		return subjects.AbandonReply{}, err
	}
	rec := q.markAbandoned(r.RequestID, q.now())
	q.mu.Unlock()
	// The dequeue's leases, once it has finished (one served just as it was abandoned is), and
	// any whose outcome was unknown is known.
	held, err := q.heldBy(ctx, rec)
	if err != nil {
		return subjects.AbandonReply{}, err
	}
	if q.testAbandonReleases != nil {
		q.testAbandonReleases()
	}
	for _, h := range held {
		_, err := q.release(ctx, subjects.ReleaseRequest{ID: h.e.ID, LeaseID: h.leaseID, Refund: true, Error: abandonedLease})
		if noLongerHeld(err) {
			continue
		}
		if err != nil {
			return subjects.AbandonReply{}, err
		}
		q.mu.Lock()
		if !slices.Contains(rec.gaveUp.released, h.e.ID) { // an abandon of the id at once released it too
			rec.gaveUp.released = append(rec.gaveUp.released, h.e.ID)
		}
		q.mu.Unlock()
	}
	q.mu.Lock()
	defer q.mu.Unlock()
	return subjects.AbandonReply{RequestID: r.RequestID, Released: append([]string{}, rec.gaveUp.released...)}, nil
}

// markAbandoned marks request id abandoned, and ends its dequeue's long poll if it waits; it
// returns the id's record. Called with q.mu held.
func (q *queue) markAbandoned(id string, now int64) *dequeueRecord {
	q.expireRequests(now)
	rec := q.requests[id]
	switch least := now + AbandonedIDWindow.Milliseconds(); {
	case rec == nil:
		// No dequeue with the id here, or none the broker has read yet: the mark waits for it a
		// while, not the whole window (any worker may abandon ids, none of which a dequeue sent).
		rec = &dequeueRecord{}
		q.remember(id, rec, least)
	case rec.until < least:
		// Near its end (a settle's next that leased nothing is kept only a minute past the
		// settled lease): the mark still lasts as long as for an id the queue did not know.
		rec.until = least
		heap.Fix(&q.reqEnds, rec.slot)
	}
	if rec.gaveUp == nil {
		rec.gaveUp = &abandoned{}
	}
	if w := rec.waiting; w != nil {
		close(w.ended)
		rec.waiting = nil
		// Served no more: a message that becomes pending before the poll's goroutine has
		// noticed goes to the next waiter.
		if i := slices.Index(q.waiters, w); i >= 0 {
			q.waiters = slices.Delete(q.waiters, i, i+1)
		}
	}
	return rec
}

// AbandonedIDWindow is how long an abandon of a request id no dequeue brought remembers it (and the
// least it remembers any id it marks): the dequeue it abandons may be on its way still, read after
// the abandon.
const AbandonedIDWindow = 30 * time.Second

// abandonedLease is the error the released events of the leases abandon gives back carry.
const abandonedLease = "the dequeue was abandoned: its requester did not take its reply"

// RequestIDWindow is how long a dequeue request id is remembered: a retry within it returns the same
// leases (those still held) instead of leasing more. An id is forgotten sooner once one of its leases
// is used (forgetRequest).
const RequestIDWindow = 5 * time.Minute

// expireRequests forgets the request ids whose time is up: the RequestIDWindow's, or a settle's
// (keepSettled). Called with q.mu held.
func (q *queue) expireRequests(now int64) {
	for len(q.reqEnds) > 0 && q.reqEnds[0].until < now {
		q.forget(q.reqEnds[0])
	}
}

// settleRetry is how long after a settled lease would have run out its settle is still remembered
// (keepSettled): its holder retries it until then, and the last try, sent just before, is answered
// within its request timeout (the Go client's is 10 s by default).
const settleRetry = time.Minute

// keepSettled is for the record of a dequeue that leased nothing: a retry may lease, like any new
// dequeue, so the id is forgotten; unless the dequeue is a settle's next, whose retry must get the
// settle's reply again. Then the id is kept, but only until a settleRetry after the settled lease
// would have run out (when the RequestIDWindow does not end first): with workers that keep up, most
// settles' next dequeues find nothing. Called with q.mu held.
func (q *queue) keepSettled(rec *dequeueRecord) {
	switch {
	case q.requests[rec.id] != rec: // forgotten meanwhile
	case rec.gaveUp != nil: // abandoned: kept, so that a dequeue with the id leases nothing
	case rec.settled == nil:
		q.forget(rec)
	case rec.settled.leaseEnd > 0:
		rec.until = min(rec.until, rec.settled.leaseEnd+settleRetry.Milliseconds())
		heap.Fix(&q.reqEnds, rec.slot)
		q.armRequests()
	}
}

// forgetRequest forgets the request id of the dequeue that took e's current lease, once the lease is
// used (extended or settled): its holder had that dequeue's reply, so it will not send the dequeue
// again. A worker pool then keeps an id per lease it holds, not five minutes of every dequeue it made
// (about 170 bytes each). Called with q.mu held.
func (q *queue) forgetRequest(e *entry) {
	x := e.extra()
	if x.RequestID == "" {
		return
	}
	r := q.requests[x.RequestID]
	if r == nil || r.inFlight || r.gaveUp != nil { // abandoned: kept for the window (abandon)
		return
	}
	for _, l := range r.leases {
		if l.e == e && l.leaseID == x.LeaseID {
			r.used = !r.givenBack
			q.forget(r)
			return
		}
	}
}

// withPayloads builds the replies of held leases with their payloads, leaving out those that ended
// since they were found held (replay let go of q.mu): a message leased again meanwhile would
// otherwise go out with its new holder's lease.
func (q *queue) withPayloads(ctx context.Context, held []leaseRef) ([]subjects.Message, error) {
	q.mu.Lock()
	views := make([]subjects.Message, 0, len(held))
	seqs := make([]uint64, 0, len(held))
	for _, h := range held {
		if !q.stillHeld(h) {
			continue
		}
		views = append(views, q.view(h.e))
		seqs = append(seqs, h.e.Seq)
	}
	q.mu.Unlock()
	for i, ch := range q.readBodies(ctx, seqs) {
		b := <-ch
		if b.err != nil {
			return nil, unavailable("read payload", b.err)
		}
		views[i].SetPayload(b.data)
	}
	return views, nil
}

type bodyResult struct {
	data []byte
	err  error
}

// readBodies starts reading the payloads at seqs concurrently, on the runner's goroutines; each
// channel yields one result. Each read is bounded by the write timeout (storage that does not
// answer, or has no leader for the stream, is asked again until then): a try unanswered for a
// tick, or in flight when the payloads stream elects a leader, is made again (ackWatch.read). A
// read that the broker's stop cut short (the stop cancels ctx) is made again, bounded by the write
// timeout alone: a dequeue that leased messages just before the stop still hands them over, rather
// than leaving its leases to run out unseen, each spending an attempt.
func (q *queue) readBodies(ctx context.Context, seqs []uint64) []chan bodyResult {
	out := make([]chan bodyResult, len(seqs))
	for i, seq := range seqs {
		ch := make(chan bodyResult, 1)
		out[i] = ch
		q.b.runner.run(func() {
			var data []byte
			get := func(ctx context.Context) (err error) {
				data, err = q.b.store.GetBody(ctx, seq)
				return err
			}
			err := q.b.readAgain(ctx, q.b.bodyAcks, get)
			if err != nil && q.b.ctx.Err() != nil {
				err = q.b.readAgain(context.WithoutCancel(ctx), q.b.bodyAcks, get)
			}
			ch <- bodyResult{data, err}
		})
	}
	return out
}

// view describes e for a reply (without payload).
func (q *queue) view(e *entry) subjects.Message {
	r := e.record()
	m := subjects.Message{
		ID:           r.ID,
		Queue:        q.name,
		State:        r.State,
		Priority:     r.Priority,
		Metadata:     r.Metadata,
		Version:      r.Version,
		Attempts:     r.Attempts,
		AttemptsLeft: max(r.MaxAttempts-r.Attempts, 0),
		LeaseID:      r.LeaseID,
		EnqueuedAt:   time.UnixMilli(r.EnqueuedAt).UTC(),
		VisibleAt:    time.UnixMilli(r.VisibleAt).UTC(),
		UpdatedAt:    time.UnixMilli(r.UpdatedAt).UTC(),
	}
	if r.State == subjects.StateRunning {
		t := time.UnixMilli(r.LeaseExpires).UTC()
		m.LeaseExpiresAt = &t
	}
	if r.EndedAt != 0 {
		t := time.UnixMilli(r.EndedAt).UTC()
		m.EndedAt = &t
	}
	return m
}
