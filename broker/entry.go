package broker

import (
	"maps"
	"math"

	"github.com/natstone/natstone/broker/index"
	"github.com/natstone/natstone/kv"
	"github.com/natstone/natstone/subjects"
)

// entry is the broker's in-memory record of one message: its index item, its record as last stored
// and the record's KV revision. Payloads are never held here. It is kept small because the broker
// holds one per message (see docs/design.md, "Memory"): 80 bytes, an allocation of the 80-byte size
// class. The record's fields most messages leave zero — a lease, a request, an end, metadata, a
// visibility or an update time other than the enqueue time, a version past 2^32 — sit behind one
// pointer, nil while they are all zero; counts and the payload size are kept in the widths natstone's
// limits allow. record rebuilds the kv.Record for a write or a reply, and set takes one apart.
type entry struct {
	index.Item // Priority, Seq (the body sequence), Meta(), Value(): changed only while unplaced

	ID         string
	EnqueuedAt int64
	rev        uint64      // the record's KV revision; 0 until first stored
	more       *storedMore // the fields most messages leave zero; nil while all are
	version    uint32      // the low half of the record's version; the high half is in more
	// Attempts and MaxAttempts are at most subjects.MaxAttemptsLimit in anything natstone writes;
	// larger counts from storage saturate.
	Attempts    uint16
	MaxAttempts uint16
	// bits holds the payload size (the low 24 bits, saturating; at most subjects.MaxPayloadBytes in
	// anything natstone writes), the state (1 + stateIndex; 0 for a record not stored yet), the
	// released flag, the busy flag and the collecting flag.
	bits uint32
}

const (
	sizeBits     = 24
	maxSize      = 1<<sizeBits - 1
	stateShift   = sizeBits
	stateMask    = 0xf << stateShift
	releasedFlag = 1 << 28
	// busyFlag is set while a write on the entry is in flight. Operations that find it set wait for
	// the queue's writes to end (queue.waitIdle) and look again, so each entry has at most one write
	// in flight and every write's expected revision is the one before it.
	busyFlag = 1 << 29
	// collectingFlag is set once a collection of the (finished) entry began: its payload may be
	// deleted, so it is never retried; it leaves memory when a collection removes its record.
	collectingFlag = 1 << 30
	// replayedFlag is set once the entry's current lease went out again, in the reply of a retry
	// with the first dequeue's request id: a reply of it that reached nobody does not give it back
	// (unheard). It stays while the lease does.
	replayedFlag = 1 << 31
)

// IndexItem implements index.Elem.
func (e *entry) IndexItem() *index.Item { return &e.Item }

// storedStates maps an entry's state bits back to the state.
var storedStates = [1 + numStates]subjects.State{"", subjects.StateInvisible, subjects.StatePending,
	subjects.StateRunning, subjects.StateCompleted, subjects.StateCanceled, subjects.StateErrored}

// State is the record's state; "" for a record not stored yet.
func (e *entry) State() subjects.State { return storedStates[e.bits&stateMask>>stateShift] }

// Released is the record's released flag.
func (e *entry) Released() bool { return e.bits&releasedFlag != 0 }

// PayloadSize is the record's payload size.
func (e *entry) PayloadSize() int { return int(e.bits & maxSize) }

// Version is the record's version.
func (e *entry) Version() uint64 { return uint64(e.extra().VersionHigh)<<32 | uint64(e.version) }

// VisibleAt is the record's visible_at: its enqueue time unless it was made invisible (a delay).
func (e *entry) VisibleAt() int64 { return e.EnqueuedAt + e.extra().VisibleDelta }

// UpdatedAt is the record's updated_at: its enqueue time until it is written again.
func (e *entry) UpdatedAt() int64 { return e.EnqueuedAt + e.extra().UpdatedDelta }

// busy reports whether a write on e is in flight.
func (e *entry) busy() bool { return e.bits&busyFlag != 0 }

// replayed reports whether e's current lease went out in more than one reply (replayedFlag).
func (e *entry) replayed() bool { return e.bits&replayedFlag != 0 }

// collecting reports whether a collection of e began (its payload may be gone).
func (e *entry) collecting() bool { return e.bits&collectingFlag != 0 }

// setBusy marks e as having a write in flight, or not. A write ends through queue.endWrite, which
// also wakes whoever waits for it.
func (e *entry) setBusy(busy bool) {
	if busy {
		e.bits |= busyFlag
	} else {
		e.bits &^= busyFlag
	}
}

// storedMore holds the fields of a stored record that most messages leave zero. 80 bytes, an
// allocation of the 80-byte size class.
type storedMore struct {
	Metadata     map[string]string
	LeaseID      string
	RequestID    string
	LeaseExpires int64
	EndedAt      int64
	VisibleDelta int64 // visible_at minus enqueued_at
	UpdatedDelta int64 // updated_at minus enqueued_at
	LeaseMS      int32 // at most subjects.MaxLease; larger values from storage saturate
	VersionHigh  uint32
}

// set makes r e's record, as stored (its Priority and BodySeq are e's Item already). It keeps e's
// busy and collecting flags, which belong to e, not to its record, and its replayed flag while the
// lease is the same.
func (e *entry) set(r *kv.Record) {
	replayed := e.bits&replayedFlag != 0 && r.LeaseID != "" && r.LeaseID == e.extra().LeaseID
	e.ID = r.ID
	e.EnqueuedAt = r.EnqueuedAt
	e.version = uint32(r.Version)
	e.Attempts = clamp16(r.Attempts)
	e.MaxAttempts = clamp16(r.MaxAttempts)
	bits := uint32(min(max(r.PayloadSize, 0), maxSize)) | uint32(1+stateIndex(r.State))<<stateShift | e.bits&(busyFlag|collectingFlag)
	if r.Released {
		bits |= releasedFlag
	}
	if replayed {
		bits |= replayedFlag
	}
	e.bits = bits // kv.DecodeRecord and the broker only make known states
	e.more = nil
	visible, updated, high := r.VisibleAt-r.EnqueuedAt, r.UpdatedAt-r.EnqueuedAt, uint32(r.Version>>32)
	if len(r.Metadata) > 0 || r.LeaseMS != 0 || r.LeaseID != "" || r.LeaseExpires != 0 || r.RequestID != "" ||
		r.EndedAt != 0 || visible != 0 || updated != 0 || high != 0 {
		e.more = &storedMore{Metadata: r.Metadata, LeaseMS: int32(min(max(r.LeaseMS, math.MinInt32), math.MaxInt32)),
			LeaseID: r.LeaseID, LeaseExpires: r.LeaseExpires, RequestID: r.RequestID, EndedAt: r.EndedAt,
			VisibleDelta: visible, UpdatedDelta: updated, VersionHigh: high}
	}
}

// clamp16 narrows n, which natstone keeps far below 2^16, saturating rather than wrapping should a
// record from storage say otherwise (kv.DecodeRecord refuses negative counts).
func clamp16(n int) uint16 { return uint16(min(max(n, 0), math.MaxUint16)) }

// noMore is what more reads as while it is nil. Read only.
var noMore storedMore

// extra returns the fields kept out of line, all zero when there are none. Read only: set replaces
// them as a whole.
func (e *entry) extra() *storedMore {
	if e.more == nil {
		return &noMore
	}
	return e.more
}

// record returns e's record in full, as stored.
func (e *entry) record() kv.Record {
	m := e.extra()
	return kv.Record{
		ID:           e.ID,
		State:        e.State(),
		Priority:     e.Priority,
		BodySeq:      e.Seq,
		PayloadSize:  e.PayloadSize(),
		Version:      e.Version(),
		Attempts:     int(e.Attempts),
		MaxAttempts:  int(e.MaxAttempts),
		Released:     e.Released(),
		EnqueuedAt:   e.EnqueuedAt,
		VisibleAt:    e.EnqueuedAt + m.VisibleDelta,
		UpdatedAt:    e.EnqueuedAt + m.UpdatedDelta,
		Metadata:     m.Metadata,
		LeaseMS:      int64(m.LeaseMS),
		LeaseID:      m.LeaseID,
		LeaseExpires: m.LeaseExpires,
		RequestID:    m.RequestID,
		EndedAt:      m.EndedAt,
	}
}

// newEntry builds the entry of a record (not yet placed anywhere).
func (q *queue) newEntry(r kv.Record, rev uint64) *entry {
	e := &entry{rev: rev}
	q.setItem(e, &r)
	e.set(&r)
	return e
}

// setRecord makes r e's record. Of what the index item holds (priority, payload sequence,
// metadata), the broker's own writes change only the priority, by a reschedule; a record read back
// from storage after a conflict — another writer's — may change any of it. The item follows the
// record. e must be out of every index and deadline order.
func (q *queue) setRecord(e *entry, r *kv.Record) {
	if r.Priority != e.Priority || r.BodySeq != e.Seq || !maps.Equal(r.Metadata, e.extra().Metadata) {
		old := e.Value()
		q.setItem(e, r)
		if e.Value() != old && q.entries.get(e.ID) == e { // another writer's record, read back
			q.countValue(e.Value(), 1)
			q.countValue(old, -1)
		}
	}
	e.set(r)
}

// setItem sets e's index item from r.
func (q *queue) setItem(e *entry, r *kv.Record) {
	q.widest = max(q.widest, replyShare(q.name, r.ID, r.PayloadSize, r.Metadata))
	e.Priority = r.Priority
	e.Seq = r.BodySeq
	var meta []index.Pair
	if len(r.Metadata) > 0 {
		meta = make([]index.Pair, 0, len(r.Metadata))
		for k, v := range r.Metadata {
			meta = append(meta, index.Pair{Key: k, Value: v})
		}
	}
	var value string
	if q.exclusive() {
		value = r.Metadata[q.cfg.ExclusivityKey]
	}
	e.SetAttrs(meta, value)
}
