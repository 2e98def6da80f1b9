package broker

import (
	"maps"
	"math"

	"github.com/natstone/natstone/broker/index"
	"github.com/natstone/natstone/kv"
	"github.com/natstone/natstone/subjects"
)

// entry is the broker's in-memory record of one message: its index item, its stored record and the
// record's KV revision. Payloads are never held here. It is kept small because the broker holds one
// per message (see docs/design.md, "Memory").
type entry struct {
	index.Item        // Priority, Seq (the body sequence), Meta(), Value(): changed only while unplaced
	rec        stored // the record as last stored (or, for a new entry, about to be)
	heapIdx    int    // position in the deadline heap of its state; -1 if in none
	rev        uint64 // the record's KV revision; 0 until first stored
	// busy is non-nil while a write on this entry is in flight and closed when it ends. Operations
	// that find it non-nil wait for it and look again, so each entry has at most one write in flight
	// and every write's expected revision is the one before it.
	busy chan struct{}
}

// IndexItem implements index.Elem.
func (e *entry) IndexItem() *index.Item { return &e.Item }

// stored is an entry's copy of its kv.Record, compact: Priority and BodySeq are the Item's Priority
// and Seq, which never change; the fields most messages leave zero — a lease, a request, an end,
// metadata, a lease default of their own, a visibility that is not the enqueue time — sit behind
// one pointer, nil while they are all zero. entry.record rebuilds the kv.Record for a write or a
// reply.
type stored struct {
	ID          string
	Version     uint64
	EnqueuedAt  int64
	UpdatedAt   int64
	Attempts    int32 // at most subjects.MaxAttemptsLimit in anything natstone writes
	MaxAttempts int32
	PayloadSize int32 // at most subjects.MaxPayloadBytes
	state       uint8 // 1 + stateIndex(State); 0 for a record not stored yet (State "")
	Released    bool
	more        *storedMore
}

// storedStates maps stored.state back to the state.
var storedStates = [1 + numStates]subjects.State{"", subjects.StateInvisible, subjects.StatePending,
	subjects.StateRunning, subjects.StateCompleted, subjects.StateCanceled, subjects.StateErrored}

// State is the record's state.
func (s *stored) State() subjects.State { return storedStates[s.state] }

// VisibleAt is the record's visible_at: its enqueue time unless it was made invisible (a delay).
func (s *stored) VisibleAt() int64 { return s.EnqueuedAt + s.extra().VisibleDelta }

// storedMore holds the fields of a stored record that most messages leave zero.
type storedMore struct {
	Metadata     map[string]string
	LeaseMS      int64
	LeaseID      string
	LeaseExpires int64
	RequestID    string
	EndedAt      int64
	VisibleDelta int64 // visible_at minus enqueued_at
}

// set makes s the compact copy of r (whose Priority and BodySeq are the entry's Item already).
func (s *stored) set(r *kv.Record) {
	*s = stored{
		ID:          r.ID,
		state:       uint8(1 + stateIndex(r.State)), // kv.DecodeRecord and the broker only make known states
		Version:     r.Version,
		EnqueuedAt:  r.EnqueuedAt,
		UpdatedAt:   r.UpdatedAt,
		Attempts:    clamp32(r.Attempts),
		MaxAttempts: clamp32(r.MaxAttempts),
		PayloadSize: clamp32(r.PayloadSize),
		Released:    r.Released,
	}
	delta := r.VisibleAt - r.EnqueuedAt
	if len(r.Metadata) > 0 || r.LeaseMS != 0 || r.LeaseID != "" || r.LeaseExpires != 0 || r.RequestID != "" || r.EndedAt != 0 || delta != 0 {
		s.more = &storedMore{Metadata: r.Metadata, LeaseMS: r.LeaseMS, LeaseID: r.LeaseID,
			LeaseExpires: r.LeaseExpires, RequestID: r.RequestID, EndedAt: r.EndedAt, VisibleDelta: delta}
	}
}

// clamp32 narrows n, which natstone keeps far below 2^31, saturating rather than wrapping should a
// record from storage say otherwise.
func clamp32(n int) int32 { return int32(max(min(n, math.MaxInt32), math.MinInt32)) }

// noMore is what more reads as while it is nil. Read only.
var noMore storedMore

// extra returns the fields kept out of line, all zero when there are none. Read only: set replaces
// them as a whole.
func (s *stored) extra() *storedMore {
	if s.more == nil {
		return &noMore
	}
	return s.more
}

// record returns e's record in full, as stored.
func (e *entry) record() kv.Record {
	s := &e.rec
	r := kv.Record{
		ID:          s.ID,
		State:       s.State(),
		Priority:    e.Priority,
		BodySeq:     e.Seq,
		PayloadSize: int(s.PayloadSize),
		Version:     s.Version,
		Attempts:    int(s.Attempts),
		MaxAttempts: int(s.MaxAttempts),
		Released:    s.Released,
		EnqueuedAt:  s.EnqueuedAt,
		VisibleAt:   s.VisibleAt(),
		UpdatedAt:   s.UpdatedAt,
	}
	if m := s.more; m != nil {
		r.Metadata, r.LeaseMS, r.LeaseID, r.LeaseExpires, r.RequestID, r.EndedAt =
			m.Metadata, m.LeaseMS, m.LeaseID, m.LeaseExpires, m.RequestID, m.EndedAt
	}
	return r
}

// newEntry builds the entry of a record (not yet placed anywhere).
func (q *queue) newEntry(r kv.Record, rev uint64) *entry {
	e := &entry{rev: rev, heapIdx: -1}
	q.setItem(e, &r)
	e.rec.set(&r)
	return e
}

// setRecord makes r e's record. The broker's own writes never change what the index item holds
// (priority, payload sequence, metadata), but a record read back from storage after a conflict —
// another writer's — may, and then the item follows it. e must be out of every index and heap.
func (q *queue) setRecord(e *entry, r *kv.Record) {
	if r.Priority != e.Priority || r.BodySeq != e.Seq || !maps.Equal(r.Metadata, e.rec.extra().Metadata) {
		q.setItem(e, r)
	}
	e.rec.set(r)
}

// setItem sets e's index item from r.
func (q *queue) setItem(e *entry, r *kv.Record) {
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
