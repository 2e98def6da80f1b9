package broker

import (
	"context"
	"errors"
	"log/slog"
	"sync"
	"time"

	"github.com/nats-io/nuid"

	"github.com/natstone/natstone/broker/index"
	"github.com/natstone/natstone/kv"
	"github.com/natstone/natstone/subjects"
)

// entry is the broker's in-memory record of one message: its index item, its stored record and the
// record's KV revision. Payloads are never held here.
type entry struct {
	index.Item           // Priority, Seq (the body sequence), Meta, Value: immutable
	rec        kv.Record // the record as last stored (or, for a new entry, about to be)
	rev        uint64    // the record's KV revision; 0 until first stored
	heapIdx    int       // position in the deadline heap of its state; -1 if in none
	// busy is non-nil while a write on this entry is in flight and closed when it ends. Operations
	// that find it non-nil wait for it and look again, so each entry has at most one write in flight
	// and every write's expected revision is the one before it.
	busy chan struct{}
}

// IndexItem implements index.Elem.
func (e *entry) IndexItem() *index.Item { return &e.Item }

// lock is the in-memory mirror of an exclusivity lock key.
type lock struct {
	rev    uint64
	holder string // message id; "" if free
}

// queue is one queue's engine. Its mutex serialises every decision on the queue; KV writes are
// issued under it but awaited outside it, so a queue's writes are pipelined.
type queue struct {
	name string
	b    *Broker

	// mu guards every field below.
	mu        sync.Mutex
	cfg       subjects.QueueConfig
	cfgRev    uint64
	createdAt int64
	closed    error // why the queue takes no more work (deleted, broker stopping); nil while open

	entries   map[string]*entry
	pending   *index.Index[*entry]
	counts    [numStates]int
	invisible deadlines // invisible entries by VisibleAt
	leases    deadlines // running entries by LeaseExpires
	gc        deadlines // terminal entries by EndedAt + retention
	locks     map[string]*lock
	waiters   []*waiter
	requests  map[string]*dequeueRecord // dequeue request id → its leases
	ids       *nuid.NUID                // message and lease ids; the package's global one is behind a lock
	reqOrder  []reqStamp                // request ids by time, for expiry
}

const numStates = 6

func stateIndex(s subjects.State) int {
	switch s {
	case subjects.StateInvisible:
		return 0
	case subjects.StatePending:
		return 1
	case subjects.StateRunning:
		return 2
	case subjects.StateCompleted:
		return 3
	case subjects.StateCanceled:
		return 4
	case subjects.StateErrored:
		return 5
	}
	return -1
}

func newQueue(b *Broker, name string, rec kv.QueueRecord, rev uint64) *queue {
	q := &queue{
		name:      name,
		b:         b,
		cfg:       rec.Config,
		cfgRev:    rev,
		createdAt: rec.CreatedAt,
		entries:   make(map[string]*entry),
		pending:   index.New[*entry](rec.Config.Type == subjects.Exclusive),
		locks:     make(map[string]*lock),
		requests:  make(map[string]*dequeueRecord),
		ids:       nuid.New(),
	}
	q.invisible.key = func(e *entry) int64 { return e.rec.VisibleAt }
	q.leases.key = func(e *entry) int64 { return e.rec.LeaseExpires }
	q.gc.key = func(e *entry) int64 { return e.rec.EndedAt + q.cfg.RetentionMS }
	return q
}

func (q *queue) exclusive() bool { return q.cfg.Type == subjects.Exclusive }

func (q *queue) now() int64 { return q.b.clock.Now().UnixMilli() }

func (q *queue) log() *slog.Logger { return q.b.log.With("queue", q.name) }

// newEntry builds the entry of a record (not yet placed anywhere).
func (q *queue) newEntry(r kv.Record, rev uint64) *entry {
	e := &entry{rec: r, rev: rev, heapIdx: -1}
	e.Priority = r.Priority
	e.Seq = r.BodySeq
	if len(r.Metadata) > 0 {
		e.Meta = make([]index.Pair, 0, len(r.Metadata))
		for k, v := range r.Metadata {
			e.Meta = append(e.Meta, index.Pair{Key: k, Value: v})
		}
	}
	if q.exclusive() {
		e.Value = r.Metadata[q.cfg.ExclusivityKey]
	}
	return e
}

// place puts e into the structures of its state: the pending index or one deadline heap.
func (q *queue) place(e *entry) {
	i := stateIndex(e.rec.State)
	if i < 0 {
		return
	}
	q.counts[i]++
	switch e.rec.State {
	case subjects.StatePending:
		q.pending.Add(e)
	case subjects.StateInvisible:
		q.invisible.add(e)
	case subjects.StateRunning:
		q.leases.add(e)
	default:
		q.gc.add(e)
	}
}

// unplace takes e out of the structures of its state. Safe on an entry already popped from the index.
func (q *queue) unplace(e *entry) {
	i := stateIndex(e.rec.State)
	if i < 0 {
		return
	}
	q.counts[i]--
	switch e.rec.State {
	case subjects.StatePending:
		q.pending.Remove(e)
	case subjects.StateInvisible:
		q.invisible.remove(e)
	case subjects.StateRunning:
		q.leases.remove(e)
	default:
		q.gc.remove(e)
	}
}

// apply makes r (stored at rev) e's record and moves e to its new state's structures.
func (q *queue) apply(e *entry, r kv.Record, rev uint64) {
	q.unplace(e)
	e.rec, e.rev = r, rev
	q.place(e)
}

// change is one record write: e's record becomes next.
type change struct {
	e      *entry
	next   kv.Record
	prev   subjects.State // e's state before the change
	expect uint64         // e's revision before the change: the write's compare-and-swap
	rev    uint64
	err    error
}

// waitIdle waits, with q.mu held on entry and exit, until e has no write in flight.
func (q *queue) waitIdle(ctx context.Context, e *entry) error {
	for e.busy != nil {
		ch := e.busy
		q.mu.Unlock()
		select {
		case <-ch:
		case <-ctx.Done():
			q.mu.Lock()
			return ctx.Err()
		}
		q.mu.Lock()
	}
	return nil
}

// commit stores every change and applies the ones stored. It is called with q.mu held and returns
// with it held, releasing it while writes are in flight; the entries must not be busy.
//
// In an exclusive queue the writes are ordered so that a crash between two of them leaves only a
// conservative state that recovery repairs: a message's lock is taken before its lease is written,
// and freed only after the message has left running.
func (q *queue) commit(cs []*change) {
	for _, c := range cs {
		c.prev = c.e.rec.State
		c.expect = c.e.rev
		c.e.busy = make(chan struct{})
	}
	if q.exclusive() {
		cs = q.takeLocks(cs)
	}
	// Encode and publish outside the lock: the entries are busy, so nothing else touches them, and
	// their expected revisions are fixed.
	q.mu.Unlock()
	writes := make([]kv.Write, len(cs))
	for i, c := range cs {
		writes[i] = q.b.store.WriteMessage(q.name, &c.next, c.expect)
	}
	for i, c := range cs {
		c.rev, c.err = writes[i].Wait(context.Background())
	}
	q.mu.Lock()
	var failed []*change
	var free []*entry
	for _, c := range cs {
		if c.err != nil {
			failed = append(failed, c)
			continue
		}
		q.apply(c.e, c.next, c.rev)
		if c.prev == subjects.StateRunning && c.next.State != subjects.StateRunning && q.exclusive() {
			free = append(free, c.e)
		}
	}
	if len(failed) > 0 {
		free = append(free, q.resync(failed)...)
	}
	for _, c := range cs {
		if c.err == nil {
			close(c.e.busy)
			c.e.busy = nil
		}
	}
	if len(free) > 0 {
		q.freeLocks(free)
	}
	q.unpark()
	q.settle()
}

// parked is deadlines.armedAt while its due entries all have writes in flight.
const parked = -1

// unpark lets parked timers re-arm: a write just ended.
func (q *queue) unpark() {
	for _, d := range []*deadlines{&q.invisible, &q.leases, &q.gc} {
		if d.armedAt == parked {
			d.armedAt = 0
		}
	}
}

// resync reloads the records whose writes failed: a conflict means the record changed under us
// (another broker), any other failure leaves the outcome unknown. It returns entries that took a lock
// for a lease that did not happen, whose locks must be freed. Called and returns with q.mu held.
func (q *queue) resync(failed []*change) []*entry {
	q.mu.Unlock()
	type got struct {
		r   kv.Record
		rev uint64
		err error
	}
	res := make([]got, len(failed))
	for i, c := range failed {
		res[i].r, res[i].rev, res[i].err = q.b.store.GetMessage(context.Background(), q.name, c.e.rec.ID)
	}
	q.mu.Lock()
	var free []*entry
	for i, c := range failed {
		e := c.e
		q.log().Warn("message write failed; reloaded", "message_id", e.rec.ID, "error", c.err)
		switch {
		case errors.Is(res[i].err, kv.ErrNotFound):
			q.unplace(e)
			delete(q.entries, e.rec.ID)
		case res[i].err != nil:
			// Storage is unreachable: keep the last known record. The next write on this entry
			// expects its old revision, so it cannot overwrite a change it has not seen.
			q.apply(e, e.rec, e.rev)
		default:
			q.apply(e, res[i].r, res[i].rev)
		}
		if q.exclusive() && c.next.State == subjects.StateRunning && e.rec.State != subjects.StateRunning {
			free = append(free, e)
		}
		close(e.busy)
		e.busy = nil
	}
	return free
}

// settle re-arms the timers and hands newly eligible messages to waiting dequeues.
func (q *queue) settle() {
	if q.closed != nil {
		return
	}
	q.invisible.arm(q.b.clock, func() { q.fire(&q.invisible) })
	q.leases.arm(q.b.clock, func() { q.fire(&q.leases) })
	q.gc.arm(q.b.clock, func() { q.fire(&q.gc) })
	q.serveWaiters()
}

// maxFire bounds how many transitions one timer firing writes, so a backlog (after a restart) is
// worked off in pipelined batches without starving requests.
const maxFire = 1024

// fire runs the due time-driven transitions of one kind: invisible → pending, lease expiry →
// pending or errored, and garbage collection of terminal messages.
func (q *queue) fire(d *deadlines) {
	q.mu.Lock()
	defer q.mu.Unlock()
	if q.closed != nil || !q.b.track() {
		return
	}
	defer q.b.wg.Done()
	d.armedAt = 0
	now := q.now()
	var due []*entry
	skipped := false
	for _, e := range d.due(now, maxFire) {
		if e.busy == nil {
			due = append(due, e)
		} else {
			skipped = true
		}
	}
	if len(due) == 0 && skipped {
		// Everything due has a write in flight; that write's commit unparks and re-arms the
		// timer, which would otherwise fire again at once and spin.
		d.armedAt = parked
		return
	}
	if d == &q.gc {
		q.collect(due)
		q.settle()
		return
	}
	cs := make([]*change, 0, len(due))
	for _, e := range due {
		next := e.rec
		if d == &q.invisible {
			next.State = subjects.StatePending
		} else {
			q.expire(&next)
		}
		q.stamp(&next, now)
		cs = append(cs, &change{e: e, next: next})
	}
	q.commit(cs)
}

// expire ends a lease that ran out: back to pending while attempts are left, else errored.
func (q *queue) expire(r *kv.Record) {
	if r.Attempts >= r.MaxAttempts {
		r.State = subjects.StateErrored
	} else {
		r.State = subjects.StatePending
	}
	r.Released = false
}

// stamp marks r as the next version written at now.
func (q *queue) stamp(r *kv.Record, now int64) {
	r.Version++
	r.UpdatedAt = now
	if r.State.Terminal() && r.EndedAt == 0 {
		r.EndedAt = now
	}
}

// collect garbage-collects terminal entries: their records and payloads are deleted.
// Called and returns with q.mu held.
func (q *queue) collect(es []*entry) {
	if len(es) == 0 {
		return
	}
	for _, e := range es {
		e.busy = make(chan struct{})
	}
	q.mu.Unlock()
	ctx := context.Background()
	errs := make([]error, len(es))
	for i, e := range es {
		if errs[i] = q.b.store.PurgeMessage(ctx, q.name, e.rec.ID); errs[i] == nil {
			errs[i] = q.b.store.DeleteBody(ctx, e.rec.BodySeq)
		}
	}
	q.mu.Lock()
	for i, e := range es {
		if errs[i] != nil {
			q.log().Warn("garbage collection failed; will retry", "message_id", e.rec.ID, "error", errs[i])
			// Push its deadline out so a storage outage does not spin the timer.
			q.unplace(e)
			e.rec.EndedAt = q.now() - q.cfg.RetentionMS + int64(time.Second/time.Millisecond)
			q.place(e)
		} else {
			q.unplace(e)
			delete(q.entries, e.rec.ID)
		}
		close(e.busy)
		e.busy = nil
	}
	q.unpark()
}

// takeLocks takes the exclusivity lock of every change that leases a message, before its lease is
// written. Changes whose lock could not be taken are dropped (their entries put back). Called and
// returns with q.mu held.
func (q *queue) takeLocks(cs []*change) []*change {
	var takes []*change
	for _, c := range cs {
		if c.next.State == subjects.StateRunning && c.prev != subjects.StateRunning {
			takes = append(takes, c)
		}
	}
	if len(takes) == 0 {
		return cs
	}
	expect := make([]uint64, len(takes))
	for i, c := range takes {
		l := q.lockOf(c.e.Value)
		if l.holder != "" && l.holder != c.next.ID {
			// The index should never offer a held value; if it does, refuse rather than overwrite
			// the holder's lock with our own current revision.
			q.log().Error("exclusivity value offered while held", "value", c.e.Value, "message_id", c.next.ID, "holder", l.holder)
			expect[i] = l.rev + 1 // certain to conflict: the write fails and the change is dropped
			continue
		}
		expect[i] = l.rev
	}
	// The values are held in the index, so no other write on these locks can start meanwhile.
	q.mu.Unlock()
	writes := make([]kv.Write, len(takes))
	for i, c := range takes {
		writes[i] = q.b.store.WriteLock(q.name, c.e.Value, kv.Lock{MessageID: c.next.ID, LeaseID: c.next.LeaseID}, expect[i])
	}
	errs := make([]error, len(takes))
	revs := make([]uint64, len(takes))
	for i := range takes {
		revs[i], errs[i] = writes[i].Wait(context.Background())
	}
	q.mu.Lock()
	var dropped []*change
	for i, c := range takes {
		if errs[i] == nil {
			l := q.lockOf(c.e.Value)
			l.rev, l.holder = revs[i], c.next.ID
			continue
		}
		q.log().Warn("exclusivity lock not taken", "value", c.e.Value, "message_id", c.next.ID, "error", errs[i])
		c.err = errs[i]
		dropped = append(dropped, c)
	}
	if len(dropped) == 0 {
		return cs
	}
	// The entries stay as they were; their values stay held until the lock is known to be free.
	for _, c := range dropped {
		q.apply(c.e, c.e.rec, c.e.rev)
		close(c.e.busy)
		c.e.busy = nil
	}
	q.reloadLocks(dropped)
	// A new slice: the caller still reads every change it passed, dropped ones included.
	kept := make([]*change, 0, len(cs)-len(dropped))
	for _, c := range cs {
		if c.err == nil {
			kept = append(kept, c)
		}
	}
	return kept
}

// reloadLocks reads the locks of failed lock writes back and releases the values found free.
func (q *queue) reloadLocks(cs []*change) {
	q.mu.Unlock()
	type got struct {
		l   kv.Lock
		rev uint64
		err error
	}
	res := make([]got, len(cs))
	for i, c := range cs {
		res[i].l, res[i].rev, res[i].err = q.b.store.GetLock(context.Background(), q.name, c.e.Value)
	}
	q.mu.Lock()
	for i, c := range cs {
		l := q.lockOf(c.e.Value)
		switch {
		case errors.Is(res[i].err, kv.ErrNotFound):
			l.rev, l.holder = 0, ""
		case res[i].err != nil:
			continue // unknown: keep the value held; recovery reconciles it
		default:
			l.rev, l.holder = res[i].rev, res[i].l.MessageID
		}
		if l.holder == "" {
			q.pending.Release(c.e.Value)
		}
	}
}

// freeLocks frees the exclusivity locks held by entries that left running, and then releases their
// values in the index. Called and returns with q.mu held.
func (q *queue) freeLocks(es []*entry) {
	type free struct {
		value  string
		expect uint64
		w      kv.Write
		rev    uint64
		err    error
	}
	var fs []*free
	for _, e := range es {
		l := q.lockOf(e.Value)
		if l.holder != e.rec.ID {
			// Not ours (never taken, or already freed): the value is free unless another holds it.
			if l.holder == "" {
				q.pending.Release(e.Value)
			}
			continue
		}
		fs = append(fs, &free{value: e.Value, expect: l.rev})
	}
	if len(fs) == 0 {
		return
	}
	q.mu.Unlock()
	for _, f := range fs {
		f.w = q.b.store.WriteLock(q.name, f.value, kv.Lock{}, f.expect)
	}
	for _, f := range fs {
		f.rev, f.err = f.w.Wait(context.Background())
	}
	q.mu.Lock()
	for _, f := range fs {
		l := q.lockOf(f.value)
		if f.err != nil {
			// The value stays held (conservative); recovery frees a lock whose holder is not running.
			q.log().Warn("exclusivity lock not freed", "value", f.value, "error", f.err)
			continue
		}
		l.rev, l.holder = f.rev, ""
		q.pending.Release(f.value)
	}
}

func (q *queue) lockOf(value string) *lock {
	l := q.locks[value]
	if l == nil {
		l = &lock{}
		q.locks[value] = l
	}
	return l
}

// usable returns why the queue takes no more work, or nil.
func (q *queue) usable() error { return q.closed }

// close stops the queue's timers and answers its waiting dequeues with nothing; later requests get
// why. Called with q.mu held.
func (q *queue) close(why error) {
	q.closed = why
	q.invisible.stop()
	q.leases.stop()
	q.gc.stop()
	for _, w := range q.waiters {
		close(w.gone)
	}
	q.waiters = nil
}
