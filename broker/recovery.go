package broker

import (
	"context"
	"fmt"

	"github.com/natstone/natstone/kv"
	"github.com/natstone/natstone/subjects"
)

// recover rebuilds every queue from storage: configs, then message records into the indexes and
// deadline heaps, then exclusivity locks, reconciled with the messages' states. It returns how many
// messages it loaded. Leases and invisibility windows that ended while no broker ran are due at once
// and handled by the timers as soon as they are armed.
func (b *Broker) recover(ctx context.Context) (int, error) {
	err := b.store.LoadQueues(ctx, func(name string, rec kv.QueueRecord, rev uint64) error {
		b.queues[name] = newQueue(b, name, rec, rev)
		return nil
	})
	if err != nil {
		return 0, err
	}
	n, orphans := 0, 0
	err = b.store.LoadMessages(ctx, "", func(name string, r kv.Record, rev uint64, bad error) error {
		if bad != nil {
			// One corrupted value must not keep every queue down: report it and go on.
			b.log.Error("unreadable message record skipped", "queue", name, "error", bad)
			return nil
		}
		q := b.queues[name]
		if q == nil {
			orphans++ // a queue deleted part way; deleting it again removes them
			return nil
		}
		e := q.newEntry(r, rev)
		q.entries[r.ID] = e
		q.place(e)
		n++
		return nil
	})
	if err != nil {
		return 0, err
	}
	if orphans > 0 {
		b.log.Warn("message records of unknown queues ignored", "records", orphans)
	}
	locks := make(map[string]map[string]kv.Lock)
	err = b.store.LoadLocks(ctx, "", func(name, value string, l kv.Lock, rev uint64) error {
		q := b.queues[name]
		if q == nil {
			return nil
		}
		q.locks[value] = &lock{rev: rev, holder: l.MessageID}
		if locks[name] == nil {
			locks[name] = make(map[string]kv.Lock)
		}
		locks[name][value] = l
		return nil
	})
	if err != nil {
		return 0, err
	}
	for name, q := range b.queues {
		q.mu.Lock()
		err := q.reconcile(ctx, locks[name])
		q.rebuildRequests()
		q.settle()
		q.mu.Unlock()
		if err != nil {
			return 0, err
		}
	}
	return n, nil
}

// reconcile makes the exclusivity locks agree with the running messages after a restart. The write
// order (lock before lease, lease end before unlock) means a crash can only leave a lock whose holder
// is no longer running under it, which is freed here; a running message whose lock another holds is
// reported and its value kept held. Called with q.mu held, before the queue serves requests.
func (q *queue) reconcile(ctx context.Context, stored map[string]kv.Lock) error {
	if !q.exclusive() {
		return nil
	}
	running := make(map[string]*entry)
	for _, e := range q.entries {
		if e.rec.State() != subjects.StateRunning {
			continue
		}
		if other := running[e.Value]; other != nil {
			q.log().Error("two running messages share an exclusivity value", "value", e.Value, "message_id", e.rec.ID, "other_message_id", other.rec.ID)
		}
		running[e.Value] = e
		q.pending.Hold(e.Value)
	}
	for value, l := range stored {
		if l.MessageID == "" {
			continue
		}
		if e := running[value]; e != nil && e.rec.ID == l.MessageID && e.rec.extra().LeaseID == l.LeaseID {
			continue
		}
		if running[value] != nil {
			continue // taken below for its running message
		}
		// The holder is no longer running under that lease: free the lock.
		lk := q.locks[value]
		rev, err := q.b.store.WriteLock(q.name, value, kv.Lock{}, lk.rev).Wait(ctx)
		if err != nil {
			return fmt.Errorf("natstone: recover queue %s: free lock %q: %w", q.name, value, err)
		}
		lk.rev, lk.holder = rev, ""
	}
	for value, e := range running {
		lk := q.lockOf(value)
		if lk.holder == e.rec.ID {
			continue
		}
		rev, err := q.b.store.WriteLock(q.name, value, kv.Lock{MessageID: e.rec.ID, LeaseID: e.rec.extra().LeaseID}, lk.rev).Wait(ctx)
		if err != nil {
			return fmt.Errorf("natstone: recover queue %s: take lock %q: %w", q.name, value, err)
		}
		lk.rev, lk.holder = rev, e.rec.ID
	}
	return nil
}

// rebuildRequests restores the dequeue request ids of running leases, so a client retrying a dequeue
// across a broker restart gets its leases back instead of new ones.
func (q *queue) rebuildRequests() {
	now := q.now()
	for _, e := range q.entries {
		if e.rec.State() != subjects.StateRunning || e.rec.extra().RequestID == "" {
			continue
		}
		r := q.requests[e.rec.extra().RequestID]
		if r == nil {
			r = &dequeueRecord{done: make(chan struct{})}
			close(r.done)
			q.requests[e.rec.extra().RequestID] = r
			q.reqOrder = append(q.reqOrder, reqStamp{id: e.rec.extra().RequestID, rec: r, at: now})
		}
		r.leases = append(r.leases, leaseRef{e: e, leaseID: e.rec.extra().LeaseID})
	}
}
