package broker

import (
	"context"
	"errors"
	"log/slog"
	"math"
	"slices"
	"sync"
	"sync/atomic"
	"time"

	"github.com/nats-io/nuid"

	"github.com/natstone/natstone/broker/clock"
	"github.com/natstone/natstone/broker/index"
	"github.com/natstone/natstone/kv"
	"github.com/natstone/natstone/subjects"
)

// lock is the in-memory mirror of one slot of an exclusivity value's lock: a key of its own
// (kv.SlotKey), taken by one running message at a time. A value has max_running_per_value slots (1
// by default); a recovery may find more, taken before the config lowered it.
type lock struct {
	rev    uint64
	holder string // message id; "" if free
	// taking: a take's write is in flight, or of unknown outcome (doubtfulLocks), or a removal's
	// (collectLocks): the slot is not free, whoever holder names.
	taking bool
	// foreign: holder is another writer's take, read back after a conflict (dropLock): only a
	// fence of the holder's record frees it (askHolder), or the holder's own write out of running
	// here (freeLocks).
	foreign bool
}

// free reports whether no message holds l and no write of it is in flight.
func (l *lock) free() bool { return l.holder == "" && !l.taking }

// queue is one queue's engine. Its mutex serialises every decision on the queue; the KV writes
// decided under it are published and awaited outside it, so a queue's writes are pipelined.
type queue struct {
	name string
	b    *Broker

	// mu guards every field below.
	mu        sync.Mutex
	cfg       subjects.QueueConfig
	cfgRev    uint64
	createdAt int64
	closed    error // why the queue takes no more work (deleted, broker stopping); nil while open
	deleting  bool  // a delete has started (it may be retried until storage has forgotten the queue)
	deleted   int   // how many messages the delete removes

	entries       idTable
	pending       *index.Index[*entry]
	counts        [numStates]int
	invisible     deadlines     // invisible entries by VisibleAt
	leases        deadlines     // running entries by LeaseExpires
	gc            deadlines     // terminal entries by state, then EndedAt (+ retention: the deadline)
	collecting    bool          // a garbage collection is in flight; the gc timer waits for its end
	idle          chan struct{} // closed when a write ends while someone waits for one (waitIdle); nil while nobody does
	locks         map[string][]*lock
	values        map[string]int32 // an exclusive queue's messages in entries, by exclusivity value
	idleValues    []string         // values whose last message left entries: their slots go at the next sweep (collectLocks)
	sweep         clock.Timer      // runs collectLocks, gcGapMS after a value became idle
	sweepArmed    bool             // sweep is armed or running
	waiters       []*waiter
	requests      map[string]*dequeueRecord // dequeue request id → its leases
	doubtful      []*change                 // writes of unknown outcome, their entries kept busy
	doubtfulLocks []*lockWrite              // lock writes of unknown outcome, for leases not written; their values kept held
	strangers     []*lockWrite              // slots another writer took for a message not running here (dropLock): their values held until askHolder has fenced it
	doubt         clock.Timer               // issues the doubtful writes again
	doubtArmed    bool
	ids           *nuid.NUID  // message and lease ids; the package's global one is behind a lock
	reqEnds       recordHeap  // the records of requests, by when they are forgotten
	reqSweep      clock.Timer // forgets the records whose time is up when no dequeue does (sweepRequests)
	reqSweepAt    int64       // when reqSweep is armed for (Unix ms); 0: not armed
	widest        int         // the most any message stored since the start can add to a dequeue's reply (replyShare)
	// locksMost, valuesMost and requestsMost are the most entries locks, values and requests held
	// since index.Trim last copied them.
	locksMost, valuesMost, requestsMost int

	// leasing counts the leases being written or of unknown outcome (counted in commit, until
	// finish applies a known outcome or takeLocks drops them) and reserved the messages popped for
	// parked dequeues that have not taken them yet: with the running ones, what a max_running queue
	// has in use (room).
	leasing, reserved int

	totals  subjects.Totals // transitions since the broker started
	rates   rateWindow      // transitions over the last minute
	waiting waitingAges     // pending entries by the second they became pending

	// testAfterBodies, when a test sets it, runs after an enqueue has stored its payloads and
	// before it takes mu again to store the records. Nil outside tests.
	testAfterBodies func()
	// testLeasing, when a test sets it, runs when a dequeue has taken its messages from the index,
	// before it reads their payloads and writes their leases, with mu held. Nil outside tests.
	testLeasing func()
	// testGaveBack, when a test sets it, runs once the leases of unknown outcome that a dequeue's
	// reply went without have been given back (or found not stored). Nil outside tests.
	testGaveBack func()
	// testCollected, when a test sets it, runs when a collection has deleted its payloads, before it
	// removes their records, without mu. Nil outside tests.
	testCollected func()
	// testRetryWaits, when a test sets it, runs when a retried dequeue starts waiting for the first
	// with its request id, with mu held. Nil outside tests.
	testRetryWaits func()
	// testAbandonReleases, when a test sets it, runs when an abandon has found the leases its
	// dequeue still holds, before it releases them, without mu. Nil outside tests.
	testAbandonReleases func()
	// testParked, when a test sets it, runs when a long poll parks to wait for messages, with mu
	// held. Nil outside tests.
	testParked func()
	// testPausing, when a test sets it, runs as a long walk (a filtered count or browse) lets the
	// other requests in between two steps (letOthersIn), without mu. Nil outside tests.
	testPausing func()
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
		pending:   index.New[*entry](rec.Config.Type == subjects.Exclusive),
		locks:     make(map[string][]*lock),
		values:    make(map[string]int32),
		requests:  make(map[string]*dequeueRecord),
		ids:       nuid.New(),
		waiting:   waitingAges{bySec: make(map[int64]int)},
	}
	withPerValue(&q.cfg)
	q.pending.SetPerValue(q.cfg.MaxRunningPerValue)
	q.rates.start = b.clock.Now().UnixMilli()
	q.invisible.key = func(e *entry) int64 { return e.VisibleAt() }
	q.leases.key = func(e *entry) int64 { return e.extra().LeaseExpires }
	q.gc.key = func(e *entry) int64 { return e.extra().EndedAt }
	q.gc.offset = q.cfg.RetentionMS
	q.gc.group = stateGroup // each finished state in an order of its own, for browse
	return q
}

// stateGroup is an entry's group in the deadlines of the finished states (garbage collection): its
// state, groupOfState of it.
func stateGroup(e *entry) int { return int(e.bits & stateMask >> stateShift) }

// groupOfState is the group of state s's entries in the deadlines of the finished states: 1 +
// stateIndex, as the state is kept in an entry's bits.
func groupOfState(s subjects.State) int { return 1 + stateIndex(s) }

func (q *queue) exclusive() bool { return q.cfg.Type == subjects.Exclusive }

// withPerValue gives an exclusive queue's config without max_running_per_value (a create that does
// not set it, or one stored before the field was) its default, 1.
func withPerValue(c *subjects.QueueConfig) {
	if c.Type == subjects.Exclusive && c.MaxRunningPerValue == 0 {
		c.MaxRunningPerValue = 1
	}
}

func (q *queue) now() int64 { return q.b.clock.Now().UnixMilli() }

func (q *queue) log() *slog.Logger { return q.b.log.With("queue", q.name) }

// place puts e into the structures of its state: the pending index or one deadline order.
func (q *queue) place(e *entry) {
	i := stateIndex(e.State())
	if i < 0 {
		return
	}
	q.counts[i]++
	switch e.State() {
	case subjects.StatePending:
		q.pending.Add(e)
		q.waiting.add(e.VisibleAt())
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
	i := stateIndex(e.State())
	if i < 0 {
		return
	}
	q.counts[i]--
	switch e.State() {
	case subjects.StatePending:
		q.pending.Remove(e)
		q.waiting.remove(e.VisibleAt())
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
	q.setRecord(e, &r)
	e.rev = rev
	q.place(e)
}

// waitIdle waits, with q.mu held on entry and exit, until e has no write in flight.
func (q *queue) waitIdle(ctx context.Context, e *entry) error {
	for e.busy() {
		if err := q.awaitIdle(ctx); err != nil {
			return err
		}
	}
	return nil
}

// awaitIdle waits, with q.mu held on entry and exit, until a write of the queue ends (wakeIdle),
// or ctx does.
func (q *queue) awaitIdle(ctx context.Context) error {
	if q.idle == nil {
		q.idle = make(chan struct{})
	}
	ch := q.idle
	q.mu.Unlock()
	defer q.mu.Lock()
	select {
	case <-ch:
		return nil
	case <-ctx.Done():
		return ctx.Err()
	}
}

// wakeIdle wakes those waiting in awaitIdle. Called with q.mu held.
func (q *queue) wakeIdle() {
	if q.idle != nil {
		close(q.idle)
		q.idle = nil
	}
}

// endWrite marks e's write as ended, and wakes whoever waits for a write of the queue to end
// (waitIdle) to look again. Called with q.mu held.
func (q *queue) endWrite(e *entry) {
	e.setBusy(false)
	q.wakeIdle()
}

// parked is deadlines.armedAt while its due entries all have writes in flight.
const parked = -1

// unpark lets parked timers re-arm: a write just ended. The gc timer stays parked while a
// collection is in flight: it is the collection's end that re-arms it.
func (q *queue) unpark() {
	for _, d := range []*deadlines{&q.invisible, &q.leases, &q.gc} {
		if d.armedAt == parked && (d != &q.gc || !q.collecting) {
			d.armedAt = 0
		}
	}
}

// settle re-arms the timers and hands newly eligible messages to waiting dequeues.
func (q *queue) settle() {
	if q.closed != nil {
		return
	}
	if q.doubting() && !q.doubtArmed {
		q.doubtArmed = true
		if q.doubt == nil {
			q.doubt = q.b.clock.AfterFunc(doubtRetry, q.fireDoubt)
		} else {
			q.doubt.Reset(doubtRetry)
		}
	}
	if len(q.idleValues) > 0 && !q.sweepArmed {
		// Values that empty within gcGapMS are swept together.
		q.sweepArmed = true
		if q.sweep == nil {
			q.sweep = q.b.clock.AfterFunc(gcGapMS*time.Millisecond, q.fireSweep)
		} else {
			q.sweep.Reset(gcGapMS * time.Millisecond)
		}
	}
	q.arm()
	q.serveWaiters()
}

// arm re-arms the timers of the deadline orders.
func (q *queue) arm() {
	q.invisible.arm(q.b.clock, func() { q.fire(&q.invisible) })
	q.leases.arm(q.b.clock, func() { q.fire(&q.leases) })
	q.gc.arm(q.b.clock, func() { q.fire(&q.gc) })
}

// claimRetryMS is how long a timer that fired while the claim did not hold waits to try again.
const claimRetryMS = 500

// gcRetryMS is how long a collection that failed holds the next one back.
const gcRetryMS = 1000

// gcGapMS is the least time between two garbage collections of a queue that has caught up: what
// comes due in between is collected together, up to gcGapMS late. Collecting in batches rather than
// one message at a time matters to the server as much as to the broker: each collection deletes the
// message's record, and whenever that empties the messages bucket's last block — every record in it
// superseded or collected, as happens with little work in flight — JetStream removes the block and
// starts a new one, a file and a 256 KiB buffer each time (see docs/performance.md). A second's gap
// was tried too: under a saturating load it let the collections fall behind (15,000 messages
// uncollected after 10 s of S1); 100 ms kept up.
const gcGapMS = 100

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
	if d == &q.gc && q.collecting {
		d.armedAt = parked // one collection at a time: its end re-arms the timer
		return
	}
	d.armedAt = 0
	now := q.now()
	if !q.b.claim.held() {
		// Another broker may serve the store (this one went on after a pause, and its renewal has
		// not told it yet): write nothing from these indexes, nor wake a long poll to lease. Try
		// again later: a renewal makes the claim hold again, or finds it lost and stops the broker.
		d.notBefore = max(d.notBefore, now+claimRetryMS)
		q.arm()
		return
	}
	var due []*entry
	skipped := false
	for _, e := range d.due(now, maxFire) {
		if !e.busy() {
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
		// One collection at a time (see collecting). Unless this one is a full batch, a backlog to
		// work off, the next waits until gcGapMS after it started, so that what comes due meanwhile
		// is collected together. (The timer used to fire again at every commit while a collection
		// was in flight: under load each collection took one or two messages, 59,248 firings for
		// 73,678 messages in 10 s of S1.)
		if len(due) > 0 && len(due) < maxFire {
			d.notBefore = now + gcGapMS
		} else {
			d.notBefore = 0
		}
		q.collect(due)
		q.settle()
		return
	}
	cs := make([]*change, 0, len(due))
	for _, e := range due {
		next := e.record()
		if d == &q.invisible {
			next.State = subjects.StatePending
		} else {
			q.expire(&next, now)
		}
		q.stamp(&next, now)
		cs = append(cs, &change{e: e, next: next})
	}
	q.commit(cs)
}

// expire ends a lease that ran out at now: back to pending (visible from now, as after a release)
// while attempts are left, else errored.
func (q *queue) expire(r *kv.Record, now int64) {
	if r.Attempts >= r.MaxAttempts {
		r.State = subjects.StateErrored
	} else {
		visibleIn(r, now, 0)
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

// collectParallel bounds the payload deletes (JetStream API requests) one garbage collection has in
// flight; its record removals are pipelined publishes.
const collectParallel = 128

// collect garbage-collects terminal entries: their records and payloads are deleted.
// Called and returns with q.mu held.
func (q *queue) collect(es []*entry) {
	if len(es) == 0 {
		return
	}
	for _, e := range es {
		e.setBusy(true)
		e.bits |= collectingFlag
	}
	q.collecting = true
	q.mu.Unlock()
	// The payloads go first, then the records. JetStream cannot promise that a record it removed
	// stays removed: after a server's unclean stop, a rebuilt block can bring an earlier revision of
	// a collected record back (nats-server issue 8505). A payload is deleted for good (by sequence,
	// with a tombstone), so a record whose payload is gone is known to be collected, and recovery
	// removes any it finds (Broker.dropCollected). The payload deletes are JetStream API requests,
	// issued by up to collectParallel of the runner's goroutines (as requests are, see runner) so
	// that a backlog costs round trips in parallel; the record removals are stored writes,
	// pipelined.
	errs := make([]error, len(es))
	// The payload deletes are fenced by no revision: a broker that went on past its claim (a pause
	// between the timer's firing and here) must not delete what the broker that took the store
	// over may have made live again since (a retry). Its deletes end with the claim.
	ctx, cancel, err := q.b.claim.bound(context.Background())
	if err != nil {
		ctx, cancel = context.WithCancel(context.Background())
		cancel()
	}
	defer cancel()
	var wg sync.WaitGroup
	var next atomic.Int64
	for range min(collectParallel, len(es)) {
		wg.Add(1)
		q.b.runner.run(func() {
			defer wg.Done()
			for {
				i := int(next.Add(1) - 1)
				if i >= len(es) {
					return
				}
				if errs[i] = ctx.Err(); errs[i] == nil {
					errs[i] = q.b.store.DeleteBody(ctx, es[i].Seq)
				}
			}
		})
	}
	wg.Wait()
	if q.testCollected != nil {
		q.testCollected()
	}
	writes := make([]kv.Write, len(es))
	for i, e := range es {
		if errs[i] == nil {
			writes[i] = q.b.store.CollectMessage(q.name, e.ID, e.rev)
		}
	}
	for i, e := range es {
		if errs[i] == nil {
			errs[i] = q.b.removed(ctx, q.name, e, writes[i])
		}
	}
	q.mu.Lock()
	q.collectionEnded()
	for i, e := range es {
		if errs[i] != nil {
			q.log().Warn("garbage collection failed; will retry", "message_id", e.ID, "error", errs[i])
			// Hold the next collection back so a storage outage does not spin the timer. (Its
			// deadline stays: the record's ended_at is what storage has.)
			q.gc.notBefore = max(q.gc.notBefore, q.now()+gcRetryMS)
		} else {
			q.unplace(e)
			q.untrack(e)
			r := e.record()
			q.transitioned(&pendingEvent{kind: subjects.EventCollected, prev: r.State, rec: r, at: q.now()})
		}
		q.endWrite(e)
	}
	q.unpark()
}

// collectionEnded lets the gc timer fire again. Called with q.mu held.
func (q *queue) collectionEnded() {
	q.collecting = false
	if q.gc.armedAt == parked {
		q.gc.armedAt = 0
	}
}

// track puts e, not stored yet or just loaded, in entries, and counts it under its exclusivity
// value. Called with q.mu held.
func (q *queue) track(e *entry) {
	q.entries.put(e)
	q.countValue(e.Value(), 1)
}

// untrack takes e out of entries: collected, gone from storage, or never stored. An entry the
// table does not hold (the one of two loaded with one id that a start did not keep) is neither in
// it nor counted. Called with q.mu held.
func (q *queue) untrack(e *entry) {
	if q.entries.get(e.ID) != e {
		return
	}
	q.entries.remove(e.ID)
	q.countValue(e.Value(), -1)
}

// countValue adds d to the count of an exclusive queue's messages of value. A value left with none
// waits in idleValues for the sweep to collect its lock slots (settle arms it). Called with q.mu
// held.
func (q *queue) countValue(value string, d int32) {
	if !q.exclusive() {
		return
	}
	if n := q.values[value] + d; n > 0 {
		q.values[value] = n
		return
	}
	delete(q.values, value)
	q.values = index.Trim(q.values, &q.valuesMost)
	if q.locks[value] != nil {
		q.idleValues = append(q.idleValues, value)
	}
}

// fireSweep runs collectLocks when the sweep timer fires, then lets settle arm it again while
// values wait.
func (q *queue) fireSweep() {
	q.mu.Lock()
	defer q.mu.Unlock()
	if q.closed != nil || !q.b.track() {
		return
	}
	defer q.b.wg.Done()
	// The removals carry revisions, but none is issued once another broker may serve the store.
	if ctx, cancel, err := q.b.claim.bound(context.Background()); err == nil {
		q.collectLocks(ctx)
		cancel()
	}
	q.sweepArmed = false
	q.settle()
}

// collectLocks removes the lock slots of values that the queue no longer has any message of
// (idleValues, up to maxFire of them per call), so that an exclusive queue keeps a key and an entry
// in memory only for the values of the messages it holds, not for every value it has seen. A slot
// is removed at the revision known here, with a marker that the server drops a second later
// (kv.Store.CollectSlot); a take of the value anew creates it again, over the marker if it is still
// there. A value with a slot held, or whose take is in flight or in doubt, is skipped (dropLock
// queues it again once it frees the slot). While its removal is in flight a slot is not free
// (taking) and holds its value in the index. A removal that conflicts (another writer's take)
// leaves the slot as it was known, for the value's next take to read back when it conflicts too;
// one whose outcome is unknown, or not issued for want of the claim, is tried again at the next
// sweep. Called and returns with q.mu held; it releases it while the writes are in flight.
func (q *queue) collectLocks(ctx context.Context) {
	n := min(len(q.idleValues), maxFire)
	if n == 0 || ctx.Err() != nil { // nothing to do, or the claim does not hold: nothing is written
		return
	}
	values := q.idleValues[:n]
	if q.idleValues = q.idleValues[n:]; len(q.idleValues) == 0 {
		q.idleValues = nil
	}
	var ws []*lockWrite
	for _, v := range values {
		ls := q.locks[v]
		if ls == nil || q.values[v] > 0 || !allLocks(ls, (*lock).free) {
			// Collected already, or a message of the value came since; or a slot is taken or being
			// taken, which dropLock queues the value again for once it frees the slot.
			continue
		}
		before := len(ws)
		for slot, l := range ls {
			if l.rev != 0 {
				l.taking = true
				q.pending.Hold(v)
				ws = append(ws, &lockWrite{value: v, slot: slot, expect: l.rev})
			}
		}
		if len(ws) == before { // nothing stored: only the mirror to drop
			q.dropValue(v)
		}
	}
	if len(ws) == 0 {
		return
	}
	// Not free while their removals are in flight, these slots are skipped by a take meanwhile (one
	// sweep runs at a time, but a queue's delete does not wait for it).
	q.mu.Unlock()
	acked := q.b.lockAcks.current()
	writes := make([]kv.Write, len(ws))
	for i, w := range ws {
		writes[i] = q.b.store.CollectSlot(q.name, w.value, w.slot, w.expect)
	}
	for i, w := range ws {
		w.rev, w.err = q.b.lockAcks.wait(ctx, acked, writes[i])
	}
	q.mu.Lock()
	for _, w := range ws {
		l := q.lockOf(w.value, w.slot)
		l.taking = false
		q.pending.Release(w.value)
		switch {
		case errors.Is(w.err, kv.ErrConflict):
			// Written since (another broker's take, or an earlier try of this removal that
			// landed): the value's next take reads it back.
			q.log().Warn("exclusivity lock slot not collected: it changed in storage", "value", w.value, "slot", w.slot)
			continue
		case w.err != nil:
			// Unknown, or not issued (the claim ended): the next sweep tries again, and finds it
			// conflicting if it landed, which the value's next take then reads back.
			q.log().Warn("exclusivity lock slot not collected; will retry", "value", w.value, "slot", w.slot, "error", w.err)
			q.idleValues = append(q.idleValues, w.value)
			continue
		}
		l.rev = 0
	}
	for _, w := range ws {
		ls := q.locks[w.value]
		if ls != nil && q.values[w.value] == 0 && allLocks(ls, func(l *lock) bool { return l.free() && l.rev == 0 }) {
			q.dropValue(w.value)
		}
	}
}

// dropValue forgets value's lock mirror, which holds nothing storage has. Called with q.mu held.
func (q *queue) dropValue(value string) {
	delete(q.locks, value)
	q.locks = index.Trim(q.locks, &q.locksMost)
}

// allLocks reports whether every lock of ls satisfies f.
func allLocks(ls []*lock, f func(*lock) bool) bool {
	return !slices.ContainsFunc(ls, func(l *lock) bool { return !f(l) })
}

// lockOf returns slot of value's lock mirror, made (with the slots below it) on first use.
func (q *queue) lockOf(value string, slot int) *lock {
	ls := q.locks[value]
	if slot < len(ls) {
		return ls[slot]
	}
	for len(ls) <= slot {
		ls = append(ls, &lock{})
	}
	q.locks[value] = ls
	return ls[slot]
}

// freeSlot returns the lowest slot of value below max_running_per_value that no message holds and
// no take is writing, or -1 and nil if there is none. Called with q.mu held.
func (q *queue) freeSlot(value string) (int, *lock) {
	for slot := range q.cfg.MaxRunningPerValue {
		if l := q.lockOf(value, slot); l.free() {
			return slot, l
		}
	}
	return -1, nil
}

// usable returns why the queue takes no more work, or nil.
func (q *queue) usable() error { return q.closed }

// room is how many more messages the queue may lease now: its max_running less those running,
// being leased or leased by a write of unknown outcome (which may have landed: leasing), and
// reserved for parked dequeues; unlimited without max_running. Called with q.mu held.
func (q *queue) room() int {
	if q.cfg.MaxRunning == 0 {
		return math.MaxInt
	}
	return q.cfg.MaxRunning - q.counts[stateIndex(subjects.StateRunning)] - q.leasing - q.reserved
}

// holds reports whether the queue has a message id, in any state, until it is collected.
func (q *queue) holds(id string) bool {
	q.mu.Lock()
	defer q.mu.Unlock()
	return q.entries.get(id) != nil
}

// enqueuedAt returns when the queue's message id was enqueued (Unix ms), if the queue holds it.
func (q *queue) enqueuedAt(id string) (int64, bool) {
	q.mu.Lock()
	defer q.mu.Unlock()
	e := q.entries.get(id)
	if e == nil {
		return 0, false
	}
	return e.EnqueuedAt, true
}

// unfinished reports whether the queue has a message id that is not finished: pending, invisible,
// running, or not stored yet.
func (q *queue) unfinished(id string) bool {
	q.mu.Lock()
	defer q.mu.Unlock()
	e := q.entries.get(id)
	return e != nil && !e.State().Terminal()
}

// close stops the queue's timers and answers its waiting dequeues with nothing; later requests get
// why. Called with q.mu held.
func (q *queue) close(why error) {
	q.closed = why
	q.invisible.stop()
	q.leases.stop()
	q.gc.stop()
	if q.doubt != nil {
		q.doubt.Stop()
	}
	if q.sweep != nil {
		q.sweep.Stop()
	}
	if q.reqSweep != nil {
		q.reqSweep.Stop()
	}
	for _, w := range q.waiters {
		close(w.gone)
	}
	q.waiters = nil
}
