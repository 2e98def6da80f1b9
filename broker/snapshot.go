package broker

import (
	"cmp"
	"context"
	"errors"
	"fmt"
	"maps"
	"slices"
	"time"

	"github.com/natstone/natstone/kv"
)

// A clean stop writes a snapshot of every message record the broker's memory holds, and the next
// start reads it instead of every record of the messages bucket when storage is still as the stop
// left it (kv.Store.WriteSnapshot; design.md, "After a clean stop"). What a start does with the
// records is the same either way: the checks against the bodies stream, the locks'
// reconciliation and the indexes.

// writeSnapshot writes the snapshot of a clean stop. Stop calls it once no request, timer or
// collection runs any more and before it releases the claim. It writes none when memory may not be
// what storage holds — a write whose outcome is unknown, a message still busy — or when the claim no
// longer holds, since another broker may serve the store by then. A snapshot not written only
// makes the next start read every record.
func (b *Broker) writeSnapshot(ctx context.Context) {
	if b.cfg.DisableSnapshot || b.store == nil {
		return
	}
	b.mu.Lock()
	started := b.started
	qs := slices.Collect(maps.Values(b.queues))
	b.mu.Unlock()
	if !started {
		return
	}
	slices.SortFunc(qs, func(a, b *queue) int { return cmp.Compare(a.name, b.name) })
	counts := make([]int, len(qs))
	for i, q := range qs {
		q.mu.Lock()
		n, why := q.snapshotCount()
		q.mu.Unlock()
		if why != "" {
			b.log.Warn("no snapshot written: the next start reads every record", "queue", q.name, "reason", why)
			return
		}
		counts[i] = n
	}
	if !b.claim.held() {
		b.log.Warn("no snapshot written: the claim on the store ran out")
		return
	}
	var records uint64
	for _, n := range counts {
		records += uint64(n)
	}
	// Nothing writes any more: the streams' state now is what the entries reflect.
	fence, err := b.settledFence(ctx, records)
	if err != nil {
		b.log.Warn("no snapshot written: the next start reads every record", "error", err)
		return
	}
	if !b.claim.held() {
		// The fence may have been read after another broker took the store over and wrote.
		// Held now, it was held when the fence was read: only this broker's writes are in it.
		b.log.Warn("no snapshot written: the claim on the store ran out")
		return
	}
	start := time.Now()
	info, err := b.store.WriteSnapshot(ctx, fence, records, b.claim.mine.Broker, func(w *kv.SnapshotWriter) error {
		for i, q := range qs {
			q.mu.Lock()
			err := q.snapshot(w, counts[i])
			q.mu.Unlock()
			if err != nil {
				return err
			}
		}
		return nil
	})
	switch {
	case errors.Is(err, kv.ErrSnapshotLeftovers):
		b.log.Warn("chunks of an earlier snapshot left in storage", "error", err)
	case err != nil:
		b.log.Warn("no snapshot written", "error", err)
		return
	}
	b.log.Info("snapshot written", "queues", len(qs), "messages", records, "bytes", info.Size,
		"took", time.Since(start).Round(time.Millisecond))
}

// settledFence returns the streams' state for a snapshot of records records, once the messages
// bucket holds just those: the collections' markers go a second after they were written, and a
// start reads the snapshot only if the bucket holds as many messages as it has records
// (snapshotCurrent). Under a steady load with retention 0 a stop always finds some; without this
// wait the start after it would read every record. It waits for at most two of the markers' lives,
// and fails if the bucket still holds other messages then (records that no queue of the broker's
// has, say), when the snapshot could never be read, or if a reading of the streams' states takes
// longer than the write timeout.
func (b *Broker) settledFence(ctx context.Context, records uint64) (kv.Fence, error) {
	deadline := time.Now().Add(2 * kv.MarkerTTL)
	for {
		// Each reading of the streams' states gets the write timeout: while a stream elects a
		// leader nothing answers, and a stop that waited longer would have no time left to release
		// the claim (for a standby to take over at once) when it is given up.
		rctx, cancel := context.WithTimeout(ctx, b.cfg.WriteTimeout)
		fence, stored, err := b.store.Fence(rctx)
		cancel()
		switch {
		case err != nil:
			return kv.Fence{}, err
		case stored == records:
			return fence, nil
		case time.Now().After(deadline):
			return kv.Fence{}, fmt.Errorf("the messages bucket holds %d messages, the broker %d records", stored, records)
		}
		select {
		case <-time.After(50 * time.Millisecond):
		case <-ctx.Done():
			return kv.Fence{}, ctx.Err()
		}
	}
}

// snapshotCount returns how many entries the queue's snapshot holds, or why it cannot be written.
// Called with q.mu held.
func (q *queue) snapshotCount() (int, string) {
	if q.deleting {
		// A delete that stopped part way may have removed payloads whose records are still here
		// and in storage. A start from the snapshot trusts its records to have their payloads (it
		// lists them only when storage has few enough deleted ones), and would serve those
		// messages; one from the records removes them (dropCollected).
		return 0, "its delete stopped part way"
	}
	if n := q.doubts(); n > 0 {
		return 0, fmt.Sprintf("%d writes of unknown outcome", n)
	}
	n := 0
	for e := range q.entries.all() {
		if e.busy() {
			return 0, fmt.Sprintf("message %q has a write in flight", e.ID)
		}
		if e.rev > 0 {
			n++
		}
	}
	return n, ""
}

// snapshot writes the queue's n stored entries (snapshotCount) to w. Called with q.mu held.
func (q *queue) snapshot(w *kv.SnapshotWriter, n int) error {
	if err := w.Queue(q.name, n); err != nil {
		return err
	}
	for e := range q.entries.all() {
		if e.rev == 0 {
			continue // never stored: storage has no record of it
		}
		r := e.record()
		if err := w.Record(&r, e.rev); err != nil {
			return fmt.Errorf("queue %s: %w", q.name, err)
		}
	}
	return nil
}

// errSnapshotBroken fails a load that read part of a snapshot: recover reads every record instead.
var errSnapshotBroken = errors.New("natstone: the snapshot could not be read")

// loadRecords calls fn for every message record: from the snapshot of the last clean stop if
// storage is still as that stop left it, otherwise from the messages bucket (kv.Store.LoadMessages).
// It reports which.
func (b *Broker) loadRecords(ctx context.Context, fn func(name string, r kv.Record, rev uint64, bad error) error) (snapshot bool, err error) {
	if !b.cfg.DisableSnapshot && !b.snapshotBroken {
		info, use, err := b.snapshotCurrent(ctx)
		if err != nil {
			return false, err
		}
		if use {
			_, err := b.store.ReadSnapshot(ctx, info, func(name string, r kv.Record, rev uint64) error { return fn(name, r, rev, nil) })
			if errors.Is(err, kv.ErrSnapshotBroken) {
				return true, fmt.Errorf("%w: %w", errSnapshotBroken, err)
			}
			return true, err
		}
	}
	return false, b.store.LoadMessages(ctx, "", fn)
}

// snapshotCurrent returns the snapshot's info, and reports whether it was taken at the streams'
// present state. Besides the fence, the messages bucket's stream must hold as many messages as the
// snapshot has records: after an unclean stop of its server, JetStream can bring back revisions of
// records that later writes had superseded, or records that were collected (nats-server#8505),
// without a write of its own, and a start must see and remove those (dropCollected, dropDeleted).
// A collection's marker that has not expired yet also makes the counts differ: the start then
// reads every record too.
func (b *Broker) snapshotCurrent(ctx context.Context) (kv.SnapshotInfo, bool, error) {
	info, err := b.store.SnapshotInfo(ctx)
	switch {
	case errors.Is(err, kv.ErrNoSnapshot):
		return info, false, nil
	case err != nil:
		b.log.Warn("the snapshot is not read: reading every record", "error", err)
		return info, false, nil
	}
	fence, stored, err := b.store.Fence(ctx)
	if err != nil {
		return info, false, err
	}
	switch {
	case fence != info.Fence:
		b.log.Info("the snapshot is not read: storage was written since it was taken; reading every record",
			"snapshot_written_at", info.WrittenAt, "snapshot_fence", info.Fence.String(), "fence", fence.String())
		return info, false, nil
	case stored != info.Records:
		b.log.Info("the snapshot is not read: the messages bucket holds other messages than its records; reading every record",
			"snapshot_written_at", info.WrittenAt, "snapshot_records", info.Records, "stored", stored)
		return info, false, nil
	}
	return info, true, nil
}
