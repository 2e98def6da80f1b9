package broker

import (
	"context"
	"errors"
	"slices"
	"time"

	"github.com/natstone/natstone/kv"
	"github.com/natstone/natstone/subjects"
)

// change is one record write: e's record becomes next.
type change struct {
	e        *entry
	next     kv.Record
	prev     subjects.State     // e's state before the change
	expect   uint64             // e's revision before the change: the write's compare-and-swap
	create   bool               // the message is new (expect was 0 when the write was first issued)
	rev      uint64             // the stored revision, when err is nil
	err      error              // nil: stored; kv.ErrConflict: storage holds truth; else: unknown
	truth    *kv.Record         // on a conflict: what storage holds instead (nil: the key is gone)
	worker   string             // a lease's: the dequeue's worker, for its event
	failure  string             // a release's: why the attempt failed, for its event
	refund   bool               // a release's: the attempt was given back, as its event says
	kind     subjects.EventKind // the event's kind, when the states alone do not tell it (a reschedule)
	skipped  bool               // never issued: its exclusivity lock was not taken (err says why)
	reissued bool               // issued again for an unknown outcome at least once (and logged so)
	leasing  bool               // counted in queue.leasing until its outcome is known and applied
}

// lease reports whether c leases its message: from another state into running.
func (c *change) lease() bool {
	return c.next.State == subjects.StateRunning && c.prev != subjects.StateRunning
}

// leased ends c's count in q.leasing, if it has one. Called with q.mu held.
func (q *queue) leased(c *change) {
	if c.leasing {
		c.leasing = false
		q.leasing--
	}
}

// rewrites bounds how often a write whose outcome is unknown is issued again (each waits up to the
// write timeout) before the broker gives up on learning its outcome.
const rewrites = 2

// commit stores every change and applies the ones stored. It is called with q.mu held and returns
// with it held, releasing it while writes are in flight. The entries must be idle.
//
// While its write is in flight an entry is busy and out of the pending index, so no other request
// can pick it or write it; when the write's outcome is unknown the same write is issued again (with
// the same expected revision) until storage says what happened, so the broker's memory never
// guesses. In an exclusive queue a message's lock is taken before its lease is written, so that a
// crash between the two leaves only a lock whose holder is not running, which holds nothing; leaving
// running frees the lock without a write of its own (freeLocks).
func (q *queue) commit(cs []*change) {
	kept := cs[:0:0]
	for _, c := range cs {
		if c.e.busy() {
			q.log().Error("write on a busy message skipped", "message_id", c.e.ID)
			c.err = subjects.Errorf(subjects.CodeInternal, "message %q has a write in flight", c.e.ID)
			continue
		}
		c.prev = c.e.State()
		c.expect = c.e.rev
		c.create = c.expect == 0
		c.e.setBusy(true)
		if c.prev == subjects.StatePending {
			q.pending.Remove(c.e) // a popped entry is gone already; others were never there
		}
		kept = append(kept, c)
	}
	cs = kept
	if !q.b.claim.held() {
		// Another broker may serve the store (this one went on after a pause, its renewal not run
		// yet): nothing is written from indexes it may have overtaken. A long poll parked before
		// the pause and served since would otherwise lease from them.
		for _, c := range cs {
			c.err, c.skipped = errNotServing, true
			q.apply(c.e, c.e.record(), c.e.rev) // back where it was (a popped entry too)
			if q.exclusive() && c.next.State == subjects.StateRunning && c.prev != subjects.StateRunning {
				q.pending.Release(c.e.Value()) // held by the pop for this lease, free before it
			}
			q.endWrite(c.e)
			if c.create {
				q.untrack(c.e) // never stored
			}
		}
		return
	}
	for _, c := range cs {
		if c.lease() {
			c.leasing = true
			q.leasing++
		}
	}
	if q.exclusive() {
		cs = q.takeLocks(cs)
	}
	q.mu.Unlock()
	writes := make([]kv.Write, len(cs))
	issued, acked := time.Now(), q.b.msgAcks.current()
	for i, c := range cs {
		writes[i] = q.b.store.WriteMessage(q.name, &c.next, c.expect)
	}
	for i, c := range cs {
		c.rev, c.err = q.b.msgAcks.wait(context.Background(), acked, writes[i])
		q.b.observer.Write(time.Since(issued), c.err)
		if c.err != nil {
			q.resolve(c)
		}
	}
	q.mu.Lock()
	q.finish(cs)
}

// finish applies what the writes of cs did. A write whose outcome is still unknown keeps its entry
// busy — reserved, out of the index, untouched — and goes to the doubtful list, whose timer issues
// it again until storage tells what happened; nothing is guessed. Called with q.mu held.
func (q *queue) finish(cs []*change) {
	var free, unfenced []*entry
	var unknown []*change
	for _, c := range cs {
		e := c.e
		gone := false
		switch {
		case c.err == nil:
			q.apply(e, c.next, c.rev)
			kind, reason := eventKind(c.create, c.prev, &c.next)
			if c.refund && kind == subjects.EventReleased {
				reason = subjects.ReasonRefunded
			}
			if c.kind != "" {
				kind, reason = c.kind, ""
			}
			q.transitioned(&pendingEvent{kind: kind, reason: reason, prev: c.prev, rec: c.next, worker: c.worker, err: c.failure, at: c.next.UpdatedAt})
		case errors.Is(c.err, kv.ErrConflict) && c.truth != nil:
			q.log().Warn("message changed in storage; reloaded", "message_id", e.ID, "revision", c.rev, "expected", c.expect, "state", c.truth.State)
			q.apply(e, *c.truth, c.rev)
		case errors.Is(c.err, kv.ErrConflict):
			q.log().Warn("message gone from storage", "message_id", e.ID)
			gone = true
			q.unplace(e)
			q.untrack(e)
		default:
			// A lease stays counted (leasing) while in doubt: it may have landed.
			unknown = append(unknown, c)
			q.doubtful = append(q.doubtful, c)
			continue
		}
		q.leased(c)
		if q.exclusive() && (e.State() != subjects.StateRunning || gone) &&
			(c.prev == subjects.StateRunning || c.next.State == subjects.StateRunning) {
			// It left running (or, gone, runs no more), or its lease did not happen after its
			// lock was taken. Only a write that landed fences every other write of the message
			// (every one expecting an older revision: under the claim, every other writer's).
			if c.err == nil {
				free = append(free, e)
			} else {
				unfenced = append(unfenced, e)
			}
		}
		q.endWrite(e)
	}
	if len(unknown) > 0 {
		// One line for them all: a storage that refuses every write (full, say) leaves hundreds in
		// doubt, asked again every doubtRetry.
		q.log().Warn("message writes' outcome unknown; will ask storage again", "messages", len(unknown), "message_id", unknown[0].e.ID, "error", unknown[0].err)
		// Their entries stay busy: a queue's delete waiting for them asks storage itself, as the
		// closed queue's doubt timer no longer does.
		q.wakeIdle()
	}
	if len(free) > 0 {
		q.freeLocks(free, true)
	}
	if len(unfenced) > 0 {
		q.freeLocks(unfenced, false)
	}
	q.unpark()
	q.settle()
}

// errNotServing is the error of a request not run, or a write not issued, because the claim on
// the store did not hold. It names the common cause first: an operator's trial read "another
// broker may serve it" while the claims bucket of a cluster was only electing a leader.
var errNotServing = subjects.Errorf(subjects.CodeUnavailable, "the broker has not renewed its claim on the store in time (storage slow to answer, as while it elects a leader; or another broker took the store over): retry")

// doubtRetry is how often writes of unknown outcome are issued again.
const doubtRetry = 2 * time.Second

// fireDoubt issues the doubtful writes again (same record, same expected revision) and applies
// whatever storage now says; it asks, too, about the messages the strangers' slots name.
func (q *queue) fireDoubt() {
	q.mu.Lock()
	defer q.mu.Unlock()
	q.doubtArmed = false
	if q.closed != nil || !q.doubting() {
		return
	}
	if !q.b.claim.held() {
		// Issued again now, a write could land after the broker that took the store over read
		// its record: wait for the claim to hold again (or for the renewal to find it lost).
		q.doubtArmed = true
		q.doubt.Reset(doubtRetry)
		return
	}
	if !q.b.track() {
		return
	}
	defer q.b.wg.Done()
	if q.doubts() > 0 {
		q.resolveDoubts()
	}
	if len(q.strangers) > 0 {
		q.askStrangers()
	}
}

// doubts returns how many writes of unknown outcome wait to be issued again. Called with q.mu held.
func (q *queue) doubts() int { return len(q.doubtful) + len(q.doubtfulLocks) }

// doubting reports whether the doubt timer has work: writes of unknown outcome, or strangers'
// holders to ask about. Called with q.mu held.
func (q *queue) doubting() bool { return q.doubts() > 0 || len(q.strangers) > 0 }

// resolveDoubts issues the doubtful writes again and applies what storage says; those whose
// outcome is still unknown stay doubtful. Called and returns with q.mu held, released meanwhile.
func (q *queue) resolveDoubts() {
	cs, ws := q.doubtful, q.doubtfulLocks
	q.doubtful, q.doubtfulLocks = nil, nil
	q.mu.Unlock()
	ctx := context.Background()
	for _, c := range cs {
		q.resolve(c)
	}
	for _, w := range ws {
		q.resolveLock(ctx, w)
	}
	q.mu.Lock()
	for _, w := range ws {
		q.dropLock(w)
	}
	q.finish(cs)
}

// askStrangers asks storage whether the messages the strangers' slots name can still run under
// the slots' leases (askHolder), frees the slots of those that cannot, and hands what that frees
// to waiting dequeues. Called and returns with q.mu held, released meanwhile.
func (q *queue) askStrangers() {
	ss, key := q.strangers, q.cfg.ExclusivityKey
	q.strangers = nil
	q.mu.Unlock()
	said := make([]holderSays, len(ss))
	for i, w := range ss {
		said[i] = q.askHolder(w, key)
	}
	q.mu.Lock()
	for i, w := range ss {
		q.settleStranger(w, said[i])
	}
	q.settle()
}

// holderSays is what storage says of the message a stranger's slot names (askHolder).
type holderSays struct {
	state holderState
	run   *kv.Record // holderRuns: the running record, if it decodes
	rev   uint64     // run's revision
}

// holderState is what holderSays says of the message.
type holderState int

const (
	holderUnknown holderState = iota // no answer yet: ask again
	holderFenced                     // it can never run under the slot's lease
	holderRuns                       // it is running (or its record does not decode): it may hold the slot
)

// strangerAsksWarned is how many doubt timers in a row ask about a stranger's holder without an
// answer (a minute's worth) before that is logged at WARN, once; they go on asking.
const strangerAsksWarned = 30

// askHolder learns whether the message another writer's take of w's slot names can still run under
// the slot's lease. It reads the message's record, then fences it with a write at the revision
// read: a record not running, or running with another value of key than the slot's (its id enqueued
// again since), is written again as it is, and a key without one gets a purge marker (expecting the
// marker there, or no message; the server drops it a second later). Either write makes every write
// of the message expecting an older revision conflict, the other writer's lease among them, so the
// message can never run under that lease: a lease needs a new take of the slot, which moves the
// slot's revision. The write, not the read, decides: a read may come from a stream's leader just
// elected, before it has applied what it committed. A conflict (the key changed since the read) or
// a failure is asked about again at the next doubt. Called without q.mu.
//
// A message that runs in storage with the slot's value keeps the slot; its record comes with the
// answer, for adoptRunning.
func (q *queue) askHolder(w *lockWrite, key string) holderSays {
	id := w.truth.MessageID
	var r kv.Record
	var rev uint64
	err := q.b.readAgain(context.Background(), q.b.msgAcks, func(ctx context.Context) (err error) {
		r, rev, err = q.b.store.GetMessage(ctx, q.name, id)
		return err
	})
	var fence func() kv.Write
	switch {
	case errors.Is(err, kv.ErrNotFound): // rev: the marker's, or 0
		fence = func() kv.Write { return q.b.store.CollectMessage(q.name, id, rev) }
	case err == nil && (r.State != subjects.StateRunning || r.Metadata[key] != w.value):
		fence = func() kv.Write { return q.b.store.WriteMessage(q.name, &r, rev) }
	case err == nil:
		return holderSays{state: holderRuns, run: &r, rev: rev}
	case rev != 0: // a record that does not decode is stored all the same
		return holderSays{state: holderRuns}
	default:
		q.log().Debug("exclusivity lock slot's holder not read; asking again", "value", w.value, "slot", w.slot, "message_id", id, "error", err)
		return holderSays{state: holderUnknown}
	}
	// Not issued once another broker may serve the store: it would make that broker's next write
	// of the message conflict.
	ctx, cancel, err := q.b.claim.bound(context.Background())
	if err != nil {
		return holderSays{state: holderUnknown}
	}
	defer cancel()
	ctx, stop := context.WithTimeout(ctx, q.b.cfg.WriteTimeout)
	defer stop()
	if _, err := q.b.msgAcks.issue(ctx, fence); err != nil {
		q.log().Debug("exclusivity lock slot's holder not fenced; asking again", "value", w.value, "slot", w.slot, "message_id", id, "error", err)
		return holderSays{state: holderUnknown}
	}
	return holderSays{state: holderFenced}
}

// adoptRunning takes r, the record at rev of a message that runs in storage under another
// writer's lease, into the entry of a message this broker has waiting (pending or invisible, with
// no write in flight), as a restart's load would: the lease's end here, its expiry written at rev,
// then frees the value, where the broker could otherwise not lease the message to learn better (a
// value of one slot, held by that lease). It reports whether it did. Called with q.mu held.
func (q *queue) adoptRunning(r *kv.Record, rev uint64) bool {
	e := q.entries.get(r.ID)
	if e == nil || e.busy() || e.rev >= rev || (e.State() != subjects.StatePending && e.State() != subjects.StateInvisible) {
		return false
	}
	q.log().Warn("message running in storage under another writer's lease; reloaded: its lease's end here frees its exclusivity value", "message_id", e.ID, "revision", rev, "lease_id", r.LeaseID)
	q.apply(e, *r, rev)
	return true
}

// settleStranger frees w's slot if its holder can no longer run under the slot's lease and the slot
// is as dropLock left it. A holder that runs keeps it until it ends here (adoptRunning, for one this
// broker has waiting) or a restart reconciles the slots with the messages (recovery), and one
// without an answer is asked about again at the next doubt. Called with q.mu held.
func (q *queue) settleStranger(w *lockWrite, said holderSays) {
	if q.closed != nil {
		return
	}
	switch said.state {
	case holderUnknown:
		if w.asks++; w.asks == strangerAsksWarned {
			q.log().Warn("exclusivity lock slot held for another writer's message that storage has not told of for a minute; still asking", "value", w.value, "slot", w.slot, "message_id", w.truth.MessageID)
		}
		q.addStranger(w)
		return
	case holderRuns:
		if said.run != nil && q.adoptRunning(said.run, said.rev) {
			return
		}
		q.log().Warn("exclusivity lock slot held for a message that may run elsewhere: the value is held until it ends here or a restart", "value", w.value, "slot", w.slot, "message_id", w.truth.MessageID)
		return
	}
	ls := q.locks[w.value]
	if w.slot >= len(ls) {
		return
	}
	if l := ls[w.slot]; l.rev == w.rev && l.holder == w.truth.MessageID && !l.taking {
		q.log().Info("exclusivity lock slot freed: the message another writer took it for cannot run", "value", w.value, "slot", w.slot, "message_id", w.truth.MessageID)
		l.holder, l.foreign = "", false
		q.releaseSlot(w.value)
	}
}

// resolve learns the outcome of a write that failed. An unknown outcome (a timeout) is resolved by
// issuing the same write again: the expected revision makes that idempotent. A conflict is resolved
// by reading the record: if it is exactly what this change wrote, an earlier attempt landed.
// Called without q.mu.
func (q *queue) resolve(c *change) {
	ctx := context.Background()
	again := reissue{elections: electionIssues}
	for try := 0; c.err != nil; try++ {
		if again.free(q.b.ctx, q.b, q.b.msgAcks, c.err) {
			try--
		}
		if !errors.Is(c.err, kv.ErrConflict) {
			if try >= rewrites {
				return // unknown it stays
			}
			// Until it is answered the message is held as it was, its lease (and exclusivity
			// value) too, past the lease's end: say so, once, since nothing else would.
			if !c.reissued {
				c.reissued = true
				q.log().Warn("message write outcome not known yet; issuing it again", "message_id", c.next.ID, "error", c.err)
			}
			issued := time.Now()
			c.rev, c.err = q.b.msgAcks.issue(ctx, func() kv.Write { return q.b.store.WriteMessage(q.name, &c.next, c.expect) })
			q.b.observer.Write(time.Since(issued), c.err) // a storage that keeps refusing keeps counting
			continue
		}
		var r kv.Record
		rev, err := q.readBack(ctx, q.b.msgAcks, c.expect, func(ctx context.Context) (rev uint64, err error) {
			r, rev, err = q.b.store.GetMessage(ctx, q.name, c.next.ID)
			return rev, err
		}, "message_id", c.next.ID)
		switch {
		case errors.Is(err, kv.ErrNotFound):
			c.truth = nil
		case err != nil:
			c.err = err // the read failed: unknown
			if try >= rewrites {
				return
			}
			continue
		case sameWrite(&r, &c.next):
			c.rev, c.err = rev, nil
		case c.create && try < rewrites && r.BodySeq != c.next.BodySeq && q.bodyGone(ctx, r.BodySeq):
			// The record of an enqueue that failed: a broker stopped past its claim on the store
			// wrote it after this one had deleted its payload as an orphan (recovery would remove
			// it too). This create takes its place.
			q.log().Warn("message record without payload replaced by an enqueue", "message_id", c.next.ID, "body_seq", r.BodySeq)
			c.expect = rev
			c.rev, c.err = q.b.msgAcks.issue(ctx, func() kv.Write { return q.b.store.WriteMessage(q.name, &c.next, c.expect) })
			continue
		default:
			c.truth, c.rev = &r, rev
		}
		return
	}
}

// readBack reads, with get, what storage holds of a record or lock whose write conflicted at
// expect, and its revision, asking again as readAgain does (on w, its stream's watch). The conflict
// proves storage is past expect: a read at expect or before came from a server behind (a stream's
// leader just elected, before it applied what it had committed), says nothing, and is
// errStaleRead, logged with what (the record's or lock's names).
func (q *queue) readBack(ctx context.Context, w *ackWatch, expect uint64, get func(context.Context) (uint64, error), what ...any) (uint64, error) {
	var rev uint64
	err := q.b.readAgain(ctx, w, func(ctx context.Context) (err error) {
		rev, err = get(ctx)
		return err
	})
	if err == nil && rev <= expect {
		q.log().Warn("read back after a conflict from a server behind; asking again", append(what, "revision", rev, "expected", expect)...)
		return rev, errStaleRead
	}
	return rev, err
}

// errStaleRead is the outcome of a write whose conflict's read back found the revision the write
// expected, or an older one: a read from a server behind the write's conflict, which says nothing.
var errStaleRead = errors.New("natstone: the record read back after a conflict is not past the revision the write expected: read again")

// bodyGone reports whether the payload at seq is known to be gone; a failed read says no.
func (q *queue) bodyGone(ctx context.Context, seq uint64) bool {
	gone, err := q.b.store.BodyGone(ctx, seq)
	return err == nil && gone
}

// sameWrite reports whether stored is the record want: the fields every write changes, and those a
// reschedule changes.
func sameWrite(stored, want *kv.Record) bool {
	return stored.Version == want.Version && stored.UpdatedAt == want.UpdatedAt &&
		stored.State == want.State && stored.LeaseID == want.LeaseID && stored.BodySeq == want.BodySeq &&
		stored.Priority == want.Priority && stored.VisibleAt == want.VisibleAt
}

// lockWrite is one write of a slot of an exclusivity value's lock.
type lockWrite struct {
	value  string
	slot   int
	want   kv.Lock
	expect uint64
	rev    uint64
	err    error
	truth  *kv.Lock // on a conflict: what storage holds (nil: no key)
	asks   int      // a stranger's (dropLock): the doubt timers that asked about its holder without an answer
	// reissued: issued again for an unknown outcome at least once (and logged so)
	reissued bool
}

// writeLocks writes the locks, resolving unknown outcomes and conflicts. Called without q.mu.
func (q *queue) writeLocks(ws []*lockWrite) {
	ctx, acked := context.Background(), q.b.lockAcks.current()
	pending := make([]kv.Write, len(ws))
	for i, w := range ws {
		pending[i] = q.b.store.WriteSlot(q.name, w.value, w.slot, w.want, w.expect)
	}
	for i, w := range ws {
		w.rev, w.err = q.b.lockAcks.wait(ctx, acked, pending[i])
		q.resolveLock(ctx, w)
	}
}

// resolveLock learns the outcome of a lock write that failed, as resolve does a message write's.
func (q *queue) resolveLock(ctx context.Context, w *lockWrite) {
	again := reissue{elections: electionIssues}
	for try := 0; w.err != nil; try++ {
		if again.free(q.b.ctx, q.b, q.b.lockAcks, w.err) {
			try--
		}
		if !errors.Is(w.err, kv.ErrConflict) {
			if try >= rewrites {
				return // unknown it stays
			}
			if !w.reissued {
				w.reissued = true
				q.log().Warn("exclusivity lock write outcome not known yet; issuing it again", "value", w.value, "slot", w.slot, "message_id", w.want.MessageID, "error", w.err)
			}
			w.rev, w.err = q.b.lockAcks.issue(ctx, func() kv.Write { return q.b.store.WriteSlot(q.name, w.value, w.slot, w.want, w.expect) })
			continue
		}
		var l kv.Lock
		rev, err := q.readBack(ctx, q.b.lockAcks, w.expect, func(ctx context.Context) (rev uint64, err error) {
			l, rev, err = q.b.store.GetSlot(ctx, q.name, w.value, w.slot)
			return rev, err
		}, "value", w.value, "slot", w.slot)
		switch {
		case errors.Is(err, kv.ErrNotFound):
			w.truth, w.rev = nil, 0
		case err != nil:
			w.err = err // the read failed: unknown
			if try >= rewrites {
				return
			}
			continue
		case l == w.want:
			w.rev, w.err = rev, nil
		default:
			w.truth, w.rev = &l, rev
		}
		return
	}
}

// takeLocks takes a free slot of the exclusivity lock of every change that leases a message,
// before its lease is written. Changes whose slot could not be taken are dropped and their entries
// put back. Called and returns with q.mu held; the returned slice is new (the caller still reads
// every change it passed).
func (q *queue) takeLocks(cs []*change) []*change {
	var ws []*lockWrite
	var takes []*change
	dropped := map[*change]bool{}
	drop := func(c *change, err error) {
		c.err, c.skipped = err, true
		dropped[c] = true
		q.leased(c)
		q.apply(c.e, c.e.record(), c.e.rev) // back to pending
		q.endWrite(c.e)
	}
	for _, c := range cs {
		if !c.lease() {
			continue
		}
		slot, l := q.freeSlot(c.e.Value())
		if l == nil {
			// The index should never offer a full value; refuse rather than overwrite a holder's
			// slot.
			q.log().Error("exclusivity value offered while full", "value", c.e.Value(), "message_id", c.next.ID)
			drop(c, subjects.Errorf(subjects.CodeInternal, "exclusivity value %q offered while full", c.e.Value()))
			q.pending.Release(c.e.Value()) // held by the pop for this lease
			continue
		}
		// Marked taking, the slot is not free for another take until this one's outcome is known:
		// the index may offer the value again meanwhile, if it may run more than one message.
		l.taking = true
		ws = append(ws, &lockWrite{value: c.e.Value(), slot: slot, want: kv.Lock{MessageID: c.next.ID, LeaseID: c.next.LeaseID, Version: c.next.Version, BodySeq: c.next.BodySeq}, expect: l.rev})
		takes = append(takes, c)
	}
	if len(ws) > 0 {
		q.mu.Unlock()
		q.writeLocks(ws)
		q.mu.Lock()
	}
	for i, c := range takes {
		w, l := ws[i], q.lockOf(ws[i].value, ws[i].slot)
		if w.err == nil {
			l.rev, l.holder, l.taking, l.foreign = w.rev, c.next.ID, false, false
			continue
		}
		q.log().Warn("exclusivity lock not taken", "value", c.e.Value(), "slot", w.slot, "message_id", c.next.ID, "error", w.err)
		drop(c, w.err)
		q.dropLock(w)
	}
	if len(dropped) == 0 {
		return cs
	}
	kept := make([]*change, 0, len(cs)-len(dropped))
	for _, c := range cs {
		if !dropped[c] {
			kept = append(kept, c)
		}
	}
	return kept
}

// dropLock settles the slot of a take whose lease is not written, from what its lock write did. A
// lock that landed names a lease that never ran, so it holds nothing. A lock another writer wrote
// holds nothing if it names a message that has ended here, since an ended message runs again only
// once retried, and a retry, like a lease, reaches a client only from the broker holding the claim.
// One that names a message this broker does not know (collected here, or another writer's), or one
// it knows not to be running, is a stranger: the slot stays taken, the value held once more in the
// index, until the doubt timer has fenced that message's record (askHolder). One that names a
// message running here (under another lease) is freed with it (freeLocks). While the write's
// outcome is unknown the slot stays taken and the write is doubtful: the doubt timer asks storage
// again. Called with q.mu held.
func (q *queue) dropLock(w *lockWrite) {
	l := q.lockOf(w.value, w.slot)
	switch {
	case w.err == nil:
		l.rev, l.holder = w.rev, ""
	case errors.Is(w.err, kv.ErrConflict) && w.truth == nil:
		l.rev, l.holder = 0, ""
	case errors.Is(w.err, kv.ErrConflict):
		l.rev, l.holder, l.foreign = w.rev, w.truth.MessageID, true
		switch h := q.entries.get(l.holder); {
		case h != nil && h.State().Terminal():
			l.holder, l.foreign = "", false
		case h == nil || h.State() != subjects.StateRunning || h.Value() != w.value:
			// Unknown here, not running here, or running with another value (its id enqueued
			// again since): storage says whether it can still run (askHolder).
			q.addStranger(w)
		}
	default:
		q.doubtfulLocks = append(q.doubtfulLocks, w)
		return
	}
	l.taking = false
	if l.holder == "" {
		q.releaseSlot(w.value) // the pop's hold for this take
	}
}

// addStranger adds w to the strangers, unless they have its slot at its revision already. Called
// with q.mu held.
func (q *queue) addStranger(w *lockWrite) {
	if !slices.ContainsFunc(q.strangers, func(s *lockWrite) bool { return s.value == w.value && s.slot == w.slot && s.rev == w.rev }) {
		q.strangers = append(q.strangers, w)
	}
}

// releaseSlot releases value's hold in the index for a slot just freed that no message had held
// here. Called with q.mu held.
func (q *queue) releaseSlot(value string) {
	q.pending.Release(value)
	if q.values[value] == 0 {
		// The value's last message was collected while its slot was taken (a take in doubt, or
		// another writer's), and collectLocks skipped its slots: they go with the next sweep.
		q.idleValues = append(q.idleValues, value)
	}
}

// freeLocks frees the slots of entries that are no longer running and releases their values in the
// index, once for each slot freed. It writes nothing: a slot's key names the message and lease that
// took it, and it holds the slot only while that message is running under that lease, so the
// message's own write out of running is what freed it. The next take overwrites the key, expecting
// the revision known here. When that write landed (fenced), every slot naming the entry is freed:
// besides its own, one that a take found taken for it by another writer (dropLock, a foreign slot),
// whose lease can no longer land either. When it did not (it conflicted, or the record is gone: a
// lease of this broker's that did not happen, say), a foreign slot's holder is fenced first, as a
// stranger's. Called with q.mu held.
func (q *queue) freeLocks(es []*entry, fenced bool) {
	for _, e := range es {
		freed := false
		for slot, l := range q.locks[e.Value()] {
			switch {
			case l.holder != e.ID || l.taking:
			case l.foreign && !fenced:
				q.addStranger(&lockWrite{value: e.Value(), slot: slot, rev: l.rev, truth: &kv.Lock{MessageID: e.ID}})
				freed = true // held still, as a stranger's
			default:
				l.holder, l.foreign = "", false
				q.pending.Release(e.Value())
				freed = true
			}
		}
		if !freed {
			// A lease takes a slot first: a message leaving running that no slot names means the
			// index's count of the value's holds and the slots disagree (a value held for nothing).
			q.log().Error("no exclusivity lock slot names a message leaving running", "message_id", e.ID, "value", e.Value(), "holds", q.pending.Holds(e.Value()))
		}
	}
}
