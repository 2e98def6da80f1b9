package broker

import (
	"cmp"
	"context"
	"errors"
	"fmt"
	"maps"
	"slices"
	"strings"
	"sync"
	"time"

	"github.com/natstone/natstone/broker/index"
	"github.com/natstone/natstone/kv"
	"github.com/natstone/natstone/subjects"
)

// recover rebuilds every queue from storage: configs, then message records into the indexes and
// deadline orders, then exclusivity locks, reconciled with the messages' states. It returns how many
// messages it loaded, and from where: "snapshot" (that of the last clean stop, when storage is
// still as that stop left it) or "records". Leases and invisibility windows that ended while no
// broker ran are due at once and handled by the timers as soon as they are armed.
//
// The message records are read first, each decoded into its entry as it arrives, and indexed once
// all are in (see recovering.index): a million random insertions into the pending index cost more
// than reading the records.
//
// A load that a replica behind its leader served (kv.ErrStale) may have missed records or read
// older ones, so everything is read again, up to staleLoads times, a moment later each time; one
// that found the snapshot broken part way, or whose write conflicted with what it read from the
// snapshot, reads every record at once instead.
func (b *Broker) recover(ctx context.Context) (int, string, error) {
	wait := 100 * time.Millisecond
	for try := 1; ; try++ {
		n, snapshot, err := b.load(ctx)
		if ctx.Err() != nil {
			return 0, "", ctx.Err() // a Stop, or the claim lost: not a broken snapshot
		}
		var unusable string // why the snapshot read cannot serve: every record is read at once
		switch {
		case errors.Is(err, errSnapshotBroken):
			unusable = "the snapshot could not be read; reading every record"
		case errors.Is(err, kv.ErrStale) && snapshot:
			// Checked against the streams' state, the snapshot matched it, yet a write that relies
			// on it conflicted: storage holds something the broker that took it never knew of (a
			// write of a broker paused past its claim that landed after that broker's start read
			// storage, design.md). Read again, the same snapshot would conflict the same way, at
			// every start.
			unusable = "a write conflicted with what the snapshot holds; reading every record"
		}
		if unusable != "" {
			b.log.Warn(unusable, "error", err)
			b.snapshotBroken = true
			b.queues = make(map[string]*queue)
			try--
			continue
		}
		if err == nil && !b.cfg.DisableSnapshot {
			// Read or not (stale, broken), a snapshot could never be read again once the broker
			// writes: the next clean stop writes another. A broker with the snapshot off leaves it.
			if derr := b.store.DeleteSnapshot(ctx); derr != nil {
				b.log.Warn("the snapshot could not be deleted", "error", derr)
			}
		}
		if err == nil && snapshot {
			return n, "snapshot", nil
		}
		if !errors.Is(err, kv.ErrStale) || try == staleLoads {
			return n, "records", err
		}
		b.log.Warn("a replica behind its leader served the load; reading again", "error", err, "attempt", try)
		b.queues = make(map[string]*queue)
		select {
		case <-time.After(wait):
		case <-ctx.Done():
			return 0, "", ctx.Err()
		}
		wait = min(2*wait, 2*time.Second)
	}
}

// errClaimRanOut fails what needs the claim on the store once it no longer holds: a start that lost
// it while it recovered, a queue's delete.
var errClaimRanOut = errors.New("natstone: the claim on the store ran out")

// staleLoads bounds how many times recover reads storage when replicas behind their leaders
// serve the loads.
const staleLoads = 10

// load is one attempt of recover. Anything it writes (dropCollected, dropOrphans, reconcile) is
// written after the loads it depends on were checked against their leaders. It reports whether the
// records came from the snapshot.
func (b *Broker) load(ctx context.Context) (n int, snapshot bool, err error) {
	err = b.store.LoadQueues(ctx, func(name string, rec kv.QueueRecord, rev uint64) error {
		b.queues[name] = newQueue(b, name, rec, rev)
		return nil
	})
	if err != nil {
		return 0, snapshot, err
	}
	// Every payload of the records about to be read was stored before this (see dropOrphans).
	lastBody, err := b.store.LastBodySeq(ctx)
	if err != nil {
		return 0, snapshot, err
	}
	loaded := make(map[string]*recovering, len(b.queues))
	var last *recovering                 // the queue of the record before, which the next one most likely shares
	var unloaded []uint64                // the payloads of the records of unknown queues
	unknown := make(map[string][]*entry) // those records, by queue: only what removing them needs
	snapshot, err = b.loadRecords(ctx, func(name string, r kv.Record, rev uint64, bad error) error {
		if bad == nil && r.BodySeq == 0 {
			// Every record natstone writes names its payload; the checks below would ask the
			// bodies stream for sequence 0, which it refuses, at every start.
			bad = fmt.Errorf("message %q names no payload", r.ID)
		}
		if bad != nil {
			// One corrupted value must not keep every queue down: report it and go on.
			b.log.Error("unreadable message record skipped", "queue", name, "error", bad)
			return nil
		}
		if last == nil || last.q.name != name {
			if last = loaded[name]; last == nil {
				q := b.queues[name]
				if q == nil {
					unloaded = append(unloaded, r.BodySeq)
					e := &entry{ID: r.ID, rev: rev}
					e.Seq = r.BodySeq
					unknown[name] = append(unknown[name], e)
					return nil
				}
				last = &recovering{q: q}
				loaded[name] = last
			}
		}
		last.entries = append(last.entries, last.q.newEntry(r, rev))
		n++
		return nil
	})
	if err != nil {
		return 0, snapshot, err
	}
	// Read after the records: every loaded record's payload was stored before this state. Records
	// read from storage (a start after a crash) may be ones the server brought back, which only
	// their payloads' absence tells: so the payloads held are listed when the stream has too many
	// deleted sequences to list them. The snapshot's records were the broker's own at its stop.
	bodies, err := b.store.ReadBodies(ctx, !snapshot)
	if err != nil {
		return 0, snapshot, err
	}
	if err := b.claim.waitHeld(ctx); err != nil { // what follows writes: not once another broker may serve the store
		return 0, snapshot, err
	}
	if n, err = b.dropCollected(ctx, bodies, loaded, n); err != nil {
		return 0, snapshot, err
	}
	if err := b.dropDeleted(ctx, bodies, unknown); err != nil {
		return 0, snapshot, err
	}
	b.dropOrphans(ctx, bodies, lastBody, loaded, unloaded)
	running := make(map[string][]*entry, len(loaded))
	for name, rq := range loaded {
		running[name] = rq.index()
	}
	locks := make(map[string]map[slotKey]kv.Lock)
	stray := make(map[string]int) // locks of queues that are gone, by queue
	err = b.store.LoadLocks(ctx, "", func(name, value string, slot int, l kv.Lock, rev uint64, bad error) error {
		q := b.queues[name]
		if q == nil {
			stray[name]++
			return nil
		}
		if bad != nil {
			// It names no holder, so it holds nothing: the reconcile below, or the value's next
			// take, overwrites it at its revision.
			b.log.Error("unreadable exclusivity lock taken as free", "queue", name, "error", bad)
		}
		*q.lockOf(value, slot) = lock{rev: rev, holder: l.MessageID}
		if locks[name] == nil {
			locks[name] = make(map[slotKey]kv.Lock)
		}
		locks[name][slotKey{value, slot}] = l
		return nil
	})
	if err == nil && b.loaded != nil {
		err = b.loaded()
	}
	if err == nil {
		err = b.claim.waitHeld(ctx)
	}
	if err != nil {
		return 0, snapshot, err
	}
	b.dropStrayLocks(ctx, stray)
	for name, q := range b.queues {
		q.mu.Lock()
		err := q.reconcile(ctx, running[name], locks[name])
		q.rebuildRequests()
		q.settle()
		q.mu.Unlock()
		if err != nil {
			return 0, snapshot, err
		}
	}
	return n, snapshot, nil
}

// dropCollected removes, from storage and from what was loaded, the records whose payload is gone:
// they belong to messages that were being collected, since a collection deletes the payload before
// the record. Such a record is one whose collection a crash interrupted, or one that JetStream
// brought back after an unclean stop of the server: an earlier revision of a removed record, which
// a block rebuilt after the stop can hold (nats-server#8505; see queue.collect). It returns how
// many records are left.
//
// bodies, the bodies stream's state, was read after the records, so every loaded record's payload
// was stored before it, and each payload it says is gone is asked of the stream's leader again
// before its record goes. A record that cannot be removed fails the start: left in storage, it
// could come back with the next enqueue of its id.
func (b *Broker) dropCollected(ctx context.Context, bodies *kv.Bodies, loaded map[string]*recovering, n int) (int, error) {
	if !bodies.Complete {
		b.log.Info("the bodies stream has too many deleted sequences to list at a start from the snapshot: its records' payloads are only looked for before the stream's first sequence")
	}
	removed := 0
	for _, rq := range loaded {
		var candidates []*entry
		for _, e := range rq.entries {
			if bodies.Gone(e.Seq) {
				candidates = append(candidates, e)
			}
		}
		if len(candidates) == 0 {
			continue
		}
		drop, err := b.confirmGone(ctx, rq.q.name, candidates)
		if err != nil {
			return 0, err
		}
		kept := rq.entries[:0]
		for _, e := range rq.entries {
			if !drop[e] {
				kept = append(kept, e)
			}
		}
		clear(rq.entries[len(kept):])
		rq.entries = kept
		removed += len(drop)
	}
	if removed > 0 {
		b.log.Warn("records of collected messages removed (collections a crash interrupted, or records the server brought back)", "records", removed)
	}
	return n - removed, nil
}

// dropDeleted removes the records of queues that are gone whose payloads are gone too: records
// that JetStream brought back after an unclean stop (nats-server#8505), from a queue that was
// deleted. A queue's delete purges its records, but a revision that a later write of the same key
// had superseded was removed without a tombstone, and a block rebuilt after the stop can hold it
// again. Left there, it would stay in storage for good (the queue's delete cannot be repeated once
// its config is gone) and be found by an enqueue of its id if the queue is created again. Removed,
// it still comes back at the next unclean restart (a purge marker does not hold against the
// rebuild either, and a KV stream denies deletes by sequence), to be removed again by that start.
// Its payload went first with the delete, and is asked of the stream's leader again before the
// record goes, as in dropCollected. A record whose payload is stored is left, and logged: natstone
// writes none (a queue's config goes last in its delete).
func (b *Broker) dropDeleted(ctx context.Context, bodies *kv.Bodies, unknown map[string][]*entry) error {
	removed, kept := 0, 0
	for name, es := range unknown {
		var candidates []*entry
		for _, e := range es {
			if bodies.Gone(e.Seq) {
				candidates = append(candidates, e)
			}
		}
		if len(candidates) > 0 {
			drop, err := b.confirmGone(ctx, name, candidates)
			if err != nil {
				return err
			}
			removed += len(drop)
		}
		kept += len(es) - len(candidates)
	}
	if removed > 0 {
		b.log.Warn("records of deleted queues removed (records the server brought back)", "records", removed)
	}
	if kept > 0 {
		b.log.Warn("message records of unknown queues ignored (their payloads are stored)", "records", kept)
	}
	return nil
}

// dropStrayLocks removes the exclusivity locks of queues that are gone (stray: how many each has):
// locks that JetStream brought back after an unclean stop (nats-server#8505), from a queue that was
// deleted, as it brings back records (dropDeleted). Left there, they would stay in storage for
// good, and a queue created again under the name would find its values' slots taken, by messages
// of its own when it reuses their ids, until its next start reconciled them. No broker takes a lock
// of a queue that does not exist, and this one holds the claim, so the queue's locks are purged
// whole — within the claim as it stands (claimer.bound), as a queue's delete purges: a broker that
// went on after a pause past its claim must not purge the locks of a queue the broker that took the
// store over created since. A purge that fails leaves them to the next start; it does not fail
// this one.
func (b *Broker) dropStrayLocks(ctx context.Context, stray map[string]int) {
	removed := 0
	for name, n := range stray {
		bctx, cancel, err := b.claim.bound(ctx)
		if err == nil {
			err = b.store.PurgeLocks(bctx, name)
			cancel()
		}
		if err != nil {
			b.log.Warn("exclusivity locks of a deleted queue not removed; the next start tries again", "queue", name, "locks", n, "error", err)
			continue
		}
		removed += n
	}
	if removed > 0 {
		b.log.Warn("exclusivity locks of deleted queues removed (locks the server brought back)", "locks", removed)
	}
}

// dropOrphans deletes the payloads that no record references. An enqueue stores its payloads
// before its records, so a crash between the two, or a payload write whose outcome stayed unknown,
// leaves payloads behind that nothing would ever read or delete. bodies is the stream's state read
// after the records, and unloaded the payloads of records that were read but not loaded (of
// unknown queues).
//
// The payloads that no record read references are only candidates: the records were read through
// a consumer that any replica may serve, one that has not caught up would miss the newest records,
// and deleting the payload of a record it missed would lose that message for good. So each
// candidate is asked of the streams' leaders (kv.Store.BodyReferenced: the record of the message
// its header names) and deleted only if that record does not reference it. Only payloads stored
// before the records were read (at or before lastBody) are candidates. Nothing is looked for when
// every payload the stream holds is accounted for, the usual case, or when the stream's state is
// not all known (a start from the snapshot, past 2^20 deleted sequences: kv.Store.ReadBodies). A
// payload that cannot be checked or deleted stays until the next
// start; it does not fail this one.
func (b *Broker) dropOrphans(ctx context.Context, bodies *kv.Bodies, lastBody uint64, loaded map[string]*recovering, unloaded []uint64) {
	var referenced uint64
	for _, rq := range loaded {
		referenced += uint64(len(rq.entries)) // each one's payload is stored: dropCollected kept no other
	}
	for _, seq := range unloaded {
		if !bodies.Gone(seq) {
			referenced++
		}
	}
	if bodies.Msgs <= referenced || !bodies.Complete {
		return
	}
	to := min(lastBody, bodies.Last)
	if to < bodies.First {
		return
	}
	first := bodies.First
	refs := make([]uint64, (to-first)/64+1) // a bit per sequence from first to to
	mark := func(seq uint64) {
		if seq >= first && seq <= to {
			refs[(seq-first)/64] |= 1 << ((seq - first) % 64)
		}
	}
	for _, rq := range loaded {
		for _, e := range rq.entries {
			mark(e.Seq)
		}
	}
	for _, seq := range unloaded {
		mark(seq)
	}
	var candidates []uint64
	for seq := range bodies.Stored(to) {
		if refs[(seq-first)/64]&(1<<((seq-first)%64)) == 0 {
			candidates = append(candidates, seq)
		}
	}
	if len(candidates) == 0 {
		return
	}
	deleted := make([]bool, len(candidates))
	errs := inParallel(len(candidates), func(i int) error {
		ref, err := b.store.BodyReferenced(ctx, candidates[i])
		if err != nil || ref {
			return err
		}
		if err := b.claim.waitHeld(ctx); err != nil { // another broker may serve the store by now
			return err
		}
		deleted[i] = true
		return b.store.DeleteBody(ctx, candidates[i])
	})
	var n, kept int
	for i := range candidates {
		switch {
		case errs[i] != nil:
		case deleted[i]:
			n++
		default:
			kept++
		}
	}
	log := b.log.With("payloads", n)
	if kept > 0 {
		log = log.With("referenced_by_unread_records", kept)
	}
	if err := errors.Join(errs...); err != nil {
		log = log.With("not_deleted", len(candidates)-n-kept, "error", err)
	}
	log.Warn("payloads without a record deleted: enqueues that a stop, a crash or a failed write interrupted before their record was stored, none of them acknowledged")
}

// inParallel calls f for every index below n, at most 64 at a time, and returns their errors.
func inParallel(n int, f func(i int) error) []error {
	errs := make([]error, n)
	var wg sync.WaitGroup
	slots := make(chan struct{}, 64)
	for i := range n {
		slots <- struct{}{}
		wg.Go(func() {
			defer func() { <-slots }()
			errs[i] = f(i)
		})
	}
	wg.Wait()
	return errs
}

// confirmGone asks the bodies stream's leader about the payloads of candidates, 64 at a time, and
// removes the records of those it says are gone (maxFire at a time). It returns the entries whose
// records went.
func (b *Broker) confirmGone(ctx context.Context, queue string, candidates []*entry) (map[*entry]bool, error) {
	sure := make([]bool, len(candidates))
	errs := inParallel(len(candidates), func(i int) (err error) {
		sure[i], err = b.store.BodyGone(ctx, candidates[i].Seq)
		return err
	})
	if err := errors.Join(errs...); err != nil {
		return nil, fmt.Errorf("natstone: recover queue %s: %w", queue, err)
	}
	drop := make(map[*entry]bool)
	for from := 0; from < len(candidates); from += maxFire {
		batch := candidates[from:min(from+maxFire, len(candidates))]
		writes := make([]kv.Write, len(batch))
		for i, e := range batch {
			if sure[from+i] {
				writes[i] = b.store.CollectMessage(queue, e.ID, e.rev)
			}
		}
		for i, e := range batch {
			if !sure[from+i] {
				continue
			}
			if err := b.removed(ctx, queue, e, writes[i]); err != nil {
				return nil, fmt.Errorf("natstone: recover queue %s: remove the record of collected message %q: %w", queue, e.ID, err)
			}
			drop[e] = true
		}
	}
	return drop, nil
}

// removed waits for w, the removal of e's record (kv.Store.CollectMessage) once e's payload is
// gone. When it conflicts, storage holds another revision: an earlier write of unknown outcome
// landed, or another broker wrote. That revision goes too, the payload being gone, and so does one
// that does not decode; a record of another payload is another message of that id, and stays.
// Called without q.mu.
func (b *Broker) removed(ctx context.Context, queue string, e *entry, w kv.Write) error {
	_, err := w.Wait(ctx)
	if !errors.Is(err, kv.ErrConflict) {
		return err
	}
	r, rev, err := b.store.GetMessage(ctx, queue, e.ID)
	switch {
	case errors.Is(err, kv.ErrNotFound):
		return nil
	case err != nil && rev == 0: // the read failed
		return err
	case err == nil && r.BodySeq != e.Seq:
		return nil
	}
	if err := ctx.Err(); err != nil {
		return err // a collection's, bound by the claim: past it, nothing more is removed
	}
	_, err = b.store.CollectMessage(queue, e.ID, rev).Wait(ctx)
	return err
}

// recovering holds the entries of one queue's message records, in the order they were read, until
// they are indexed.
type recovering struct {
	q       *queue
	entries []*entry
}

// pendingKey is a pending entry's place in EDF order: the index's key (Priority, Seq). Sorting
// these, not the entries, reads no entry.
type pendingKey struct {
	priority int64
	seq      uint64
	e        *entry
}

// index makes the loaded entries the queue's: its table of entries and, through place, its
// pending index, deadline orders and counts. It returns the running entries in load order. The
// result is the same as placing the entries one by one in load order (of two entries with one id
// the later is in the table; of two with one index key the earlier is indexed), but faster: the
// pending entries go into the index in EDF order, so every insertion lands at the right edge of
// the index's trees, whose nodes are in the cache, instead of at a random leaf; and the table is
// sized once and filled on another goroutine meanwhile. Nothing else touches the queue yet.
func (rq *recovering) index() (running []*entry) {
	q := rq.q
	var wg sync.WaitGroup
	wg.Go(func() {
		q.entries.reserve(q.entries.len() + len(rq.entries))
		for _, e := range rq.entries {
			q.entries.put(e) // reads only e.ID, which place does not touch
		}
	})
	keys := make([]pendingKey, 0, len(rq.entries))
	for _, e := range rq.entries {
		switch e.State() {
		case subjects.StatePending:
			keys = append(keys, pendingKey{priority: e.Priority, seq: e.Seq, e: e})
			continue
		case subjects.StateRunning:
			running = append(running, e)
		}
		q.place(e)
	}
	sortKeys(keys)
	for _, k := range keys {
		q.place(k.e)
	}
	wg.Wait()
	if q.exclusive() {
		for _, e := range rq.entries {
			if q.entries.get(e.ID) == e { // the one the table kept for its id
				q.countValue(e.Value(), 1)
			}
		}
	}
	// Only the entry the table kept for an id counts as running (the others are a corruption).
	kept := running[:0]
	for _, e := range running {
		if q.entries.get(e.ID) == e {
			kept = append(kept, e)
		}
	}
	clear(running[len(kept):])
	return kept
}

// radixBits is the digit of sortKeys' passes: 2^11 counters fit in the L1 cache.
const radixBits = 11

// sortKeys sorts keys in EDF order, keeping the order of equal keys. It is a least significant
// digit first radix sort: passes over the digits of seq, then over those of priority, each pass
// stable, and only over the bits in which the keys differ: a few passes, three times as fast as
// a comparison sort of a million keys.
func sortKeys(keys []pendingKey) {
	if len(keys) < 1<<radixBits {
		slices.SortStableFunc(keys, func(a, b pendingKey) int {
			if c := cmp.Compare(a.priority, b.priority); c != 0 {
				return c
			}
			return cmp.Compare(a.seq, b.seq)
		})
		return
	}
	src, dst := keys, make([]pendingKey, len(keys))
	for _, prio := range []bool{false, true} {
		lo, hi := ^uint64(0), uint64(0)
		for i := range src {
			u := src[i].radixKey(prio)
			lo, hi = min(lo, u), max(hi, u)
		}
		for shift := uint(0); shift < 64 && (hi-lo)>>shift != 0; shift += radixBits {
			radixPass(src, dst, prio, lo, shift)
			src, dst = dst, src
		}
	}
	if &src[0] != &keys[0] {
		copy(keys, src)
	}
}

// radixKey is the key's priority (prio) or seq as an unsigned number in the same order.
func (k *pendingKey) radixKey(prio bool) uint64 {
	if prio {
		return uint64(k.priority) ^ 1<<63
	}
	return k.seq
}

// radixPass moves src to dst stably ordered by the digit at shift of radixKey(prio) - lo.
func radixPass(src, dst []pendingKey, prio bool, lo uint64, shift uint) {
	var at [1 << radixBits]int
	for i := range src {
		at[(src[i].radixKey(prio)-lo)>>shift&(1<<radixBits-1)]++
	}
	n := 0
	for d, c := range at {
		at[d], n = n, n+c
	}
	for i := range src {
		d := (src[i].radixKey(prio) - lo) >> shift & (1<<radixBits - 1)
		dst[at[d]] = src[i]
		at[d]++
	}
}

// slotKey names one slot of an exclusivity value's lock.
type slotKey struct {
	value string
	slot  int
}

// reconcile makes the exclusivity locks agree with the running messages (runningEntries) after a
// restart. A slot holds its value only while its holder is running under its lease, so a slot whose
// holder is not is free, and stays as it is in storage. The write order (lock before lease) means a
// running message has a slot; one that no slot names under its lease is given a free one, and more
// running messages of a value than max_running_per_value are reported. Called with q.mu held,
// before the queue serves requests.
func (q *queue) reconcile(ctx context.Context, runningEntries []*entry, stored map[slotKey]kv.Lock) error {
	if !q.exclusive() {
		return nil
	}
	byValue := make(map[string]int)
	for _, e := range runningEntries {
		byValue[e.Value()]++
		q.pending.Hold(e.Value())
	}
	held := make(map[*entry]bool) // running messages that a slot names under their lease
	for _, k := range slices.SortedFunc(maps.Keys(stored), func(a, b slotKey) int {
		return cmp.Or(strings.Compare(a.value, b.value), cmp.Compare(a.slot, b.slot))
	}) {
		l := stored[k]
		if l.MessageID == "" {
			continue
		}
		e := q.entries.get(l.MessageID)
		if e != nil && e.State() == subjects.StateRunning && e.Value() == k.value && e.extra().LeaseID == l.LeaseID && !held[e] {
			held[e] = true
			continue
		}
		if e != nil && e.Value() == k.value && e.extra().LeaseID != l.LeaseID && (e.State() == subjects.StatePending || e.State() == subjects.StateInvisible) &&
			(l.Version == 0 || e.Version() < l.Version) && (l.BodySeq == 0 || l.BodySeq == e.Seq) {
			// The slot was taken for a lease its message's record never got: that lease's write
			// failed, or it is still on its way from a broker that served the store before this
			// one (it paused, say, between the two writes) and would land behind this broker's
			// back, one more running message of the value once this broker leases another. (A
			// lease is written over a record waiting to run, pending or invisible by its time; one
			// now running or ended has been written since, which such a late write conflicts with,
			// and so has one whose version reached the lease's, which the lock names: it got that
			// lease, or was written past it, as after a release or a retry. A lock of another value
			// or payload was taken for an earlier message of the id, collected or deleted since: a
			// message's value and payload never change. Locks of earlier versions name no record
			// version, or no payload: what they do not name does not spare the record.)
			if err := q.fenceRecord(ctx, e); err != nil {
				return err
			}
			lk := q.lockOf(k.value, k.slot)
			rev, err := q.b.store.WriteSlot(q.name, k.value, k.slot, kv.Lock{}, lk.rev).Wait(ctx)
			if err != nil {
				return fmt.Errorf("%w: recover queue %s: free lock %q slot %d: %w", kv.ErrStale, q.name, k.value, k.slot, err)
			}
			lk.rev = rev // so that the next start need not fence it again
		}
		// The holder is no longer running under that lease, so the slot is free; the key stays as
		// it is until the next take overwrites it.
		q.lockOf(k.value, k.slot).holder = ""
	}
	q.reportOverLimit(runningEntries, byValue, held)
	for _, e := range runningEntries {
		if held[e] {
			continue
		}
		slot := 0
		for ; q.lockOf(e.Value(), slot).holder != ""; slot++ { // the lowest free, past the limit if need be
		}
		lk := q.lockOf(e.Value(), slot)
		rev, err := q.b.store.WriteSlot(q.name, e.Value(), slot, kv.Lock{MessageID: e.ID, LeaseID: e.extra().LeaseID, Version: e.Version(), BodySeq: e.Seq}, lk.rev).Wait(ctx)
		if err != nil {
			return fmt.Errorf("natstone: recover queue %s: take lock %q slot %d: %w", q.name, e.Value(), slot, err)
		}
		lk.rev, lk.holder = rev, e.ID
		held[e] = true
	}
	// The slots of values the queue has no message of (their last one collected before this start,
	// or by a version that kept every value's slots) go with the sweeps after it.
	for v := range q.locks {
		if q.values[v] == 0 {
			q.idleValues = append(q.idleValues, v)
		}
	}
	return nil
}

// reportOverLimit logs the values that more running messages share than max_running_per_value
// (byValue counts them). When each of them runs under a slot of its own (held), that is what a
// lowered limit leaves until they end, which design.md describes; when one runs under no slot,
// another take overwrote its slot (two brokers at once), or storage brought an older revision of
// it back.
func (q *queue) reportOverLimit(running []*entry, byValue map[string]int, held map[*entry]bool) {
	unheld := make(map[string]string) // value → a running message no slot names
	for _, e := range running {
		if byValue[e.Value()] > q.cfg.MaxRunningPerValue && !held[e] {
			unheld[e.Value()] = e.ID
		}
	}
	for _, v := range slices.Sorted(maps.Keys(byValue)) {
		n := byValue[v]
		switch id, ok := unheld[v]; {
		case n <= q.cfg.MaxRunningPerValue:
		case ok:
			q.log().Error("more running messages share an exclusivity value than max_running_per_value, one of them under no lock slot", "value", v, "running", n, "message_id", id, "max_running_per_value", q.cfg.MaxRunningPerValue)
		default:
			q.log().Info("more running messages share an exclusivity value than max_running_per_value, each under a lock slot of its own (the limit was lowered while they ran): none more runs until they are fewer", "value", v, "running", n, "max_running_per_value", q.cfg.MaxRunningPerValue)
		}
	}
}

// fenceRecord rewrites e's record as it was loaded, at its revision, so that a write of it still on
// its way from a broker that served the store before conflicts instead of landing. Only its version
// moves. A conflict says such a write landed after the load, which is then read again (kv.ErrStale).
// Called with q.mu held, before the queue serves.
func (q *queue) fenceRecord(ctx context.Context, e *entry) error {
	r := e.record()
	r.Version++
	rev, err := q.b.store.WriteMessage(q.name, &r, e.rev).Wait(ctx)
	if err != nil {
		return fmt.Errorf("%w: recover queue %s: fence message %q: %w", kv.ErrStale, q.name, e.ID, err)
	}
	e.set(&r)
	e.rev = rev
	return nil
}

// rebuildRequests restores the dequeue request ids of the last RequestIDWindow from the records, so
// a client retrying a dequeue across a broker restart gets back the leases it took that are still
// held, and no new ones. A record names the dequeue of its last lease until that lease is used,
// extended or settled (usedLease: its holder had the reply, so the dequeue will not be retried; and
// a request id reused after its window must not bring back a lease another holder still extends).
// A running record that names one was therefore last written by that dequeue, at its updated_at,
// which is when the id is remembered from; an id whose records all left running since (their leases
// ran out) is remembered for a window from their last write, and its retries lease nothing.
//
// An id used again once one of its leases was used names the leases of two dequeues: the records
// of the first's other leases still name it (only the used lease's record was written). The latest
// dequeue is the id's: its leases are those of the latest lease time, the time of all the leases of
// one dequeue (one now). Without that a retry got both dequeues' leases, more than its batch.
// Called with q.mu held, before the queue serves.
func (q *queue) rebuildRequests() {
	cut := q.now() - RequestIDWindow.Milliseconds()
	leased := make(map[string]int64) // each id's latest lease time, read off its running records
	last := make(map[string]int64)   // the latest write of each id's records
	for e := range q.entries.all() {
		id, at := e.extra().RequestID, e.UpdatedAt()
		if id == "" || at < cut {
			continue
		}
		r := q.requests[id]
		if r == nil {
			r = &dequeueRecord{}
			q.requests[id] = r
		}
		last[id] = max(last[id], at)
		if e.State() == subjects.StateRunning {
			r.leases = append(r.leases, leaseRef{e: e, leaseID: e.extra().LeaseID})
			leased[id] = max(leased[id], at)
		}
	}
	for id, at := range last {
		r := q.requests[id]
		if t, ok := leased[id]; ok {
			at = t // the dequeue's own time: another of its messages left running later (its lease ran out)
			r.leases = slices.DeleteFunc(r.leases, func(l leaseRef) bool { return l.e.UpdatedAt() != t })
		}
		// In the order the dequeue gave them, EDF, as its retry must: not the entries' (a map's).
		slices.SortFunc(r.leases, func(a, b leaseRef) int { return index.Compare(a.e, b.e) })
		q.remember(id, r, at+RequestIDWindow.Milliseconds())
	}
}
