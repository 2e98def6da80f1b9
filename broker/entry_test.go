package broker

import (
	"math"
	"reflect"
	"testing"
	"unsafe"

	"github.com/natstone/natstone/kv"
	"github.com/natstone/natstone/subjects"
)

// TestEntryRecordRoundTrip: an entry gives back, field for field, the record it was built from or
// last set to — whatever its state and whichever optional fields are set — and keeps the optional
// ones out of line only when one of them is set.
func TestEntryRecordRoundTrip(t *testing.T) {
	q := &queue{cfg: subjects.QueueConfig{Type: subjects.Exclusive, ExclusivityKey: "project"}}
	base := kv.Record{ID: "m1", State: subjects.StatePending, Priority: -42, BodySeq: 7, PayloadSize: subjects.MaxPayloadBytes,
		Version: 3, Attempts: 2, MaxAttempts: subjects.MaxAttemptsLimit, EnqueuedAt: 1_700_000_000_000,
		VisibleAt: 1_700_000_000_000, UpdatedAt: 1_700_000_001_000}
	running := base
	running.State, running.LeaseID, running.LeaseExpires, running.RequestID = subjects.StateRunning, "l1", 1_700_000_060_000, "r1"
	running.Metadata, running.LeaseMS = map[string]string{"project": "foo", "kind": "encode"}, 30_000
	ended := running
	ended.State, ended.Released, ended.EndedAt = subjects.StateErrored, true, 1_700_000_070_000
	records := map[string]kv.Record{"pending": base, "running": running, "errored": ended}
	for _, s := range []subjects.State{subjects.StateInvisible, subjects.StateCompleted, subjects.StateCanceled} {
		r := base
		r.State = s
		records[string(s)] = r
	}
	delayed := base
	delayed.State, delayed.VisibleAt = subjects.StateInvisible, base.EnqueuedAt+500 // visible later than enqueued
	records["delayed"] = delayed
	for name, r := range records {
		e := q.newEntry(r, 9)
		if got := e.record(); !reflect.DeepEqual(got, r) {
			t.Errorf("%s: newEntry then record:\n got %+v\nwant %+v", name, got, r)
		}
		if wantMore := r.LeaseID != "" || r.Metadata != nil || r.EndedAt != 0 || r.VisibleAt != r.EnqueuedAt; (e.rec.more != nil) != wantMore {
			t.Errorf("%s: out-of-line fields allocated: %v, want %v", name, e.rec.more != nil, wantMore)
		}
		if r.Metadata != nil && e.Value() != "foo" {
			t.Errorf("%s: exclusivity value %q, want foo", name, e.Value())
		}
		// A record set over another one — as after a conflict, another writer's — replaces all of it:
		// the old optional fields go, and the index item follows its priority, payload and metadata.
		other := ended
		other.Priority, other.BodySeq, other.Metadata = 99, 12, map[string]string{"project": "bar"}
		e2 := q.newEntry(other, 1)
		q.setRecord(e2, &r)
		if got := e2.record(); !reflect.DeepEqual(got, r) {
			t.Errorf("%s: set over another record:\n got %+v\nwant %+v", name, got, r)
		}
		if wantValue := r.Metadata["project"]; e2.Value() != wantValue || len(e2.Meta()) != len(r.Metadata) {
			t.Errorf("%s: after set over another record: value %q, %d pairs; want %q, %d", name, e2.Value(), len(e2.Meta()), wantValue, len(r.Metadata))
		}
	}
	// A count beyond int32 (never written by natstone) saturates instead of wrapping.
	huge := base
	huge.Attempts, huge.MaxAttempts = math.MaxInt32+5, math.MinInt32-5
	if got := q.newEntry(huge, 1).record(); got.Attempts != math.MaxInt32 || got.MaxAttempts != math.MinInt32 {
		t.Errorf("attempts %d, max %d: want saturated at the int32 bounds", got.Attempts, got.MaxAttempts)
	}
	var unstored stored
	if unstored.State() != "" {
		t.Errorf("a record not stored yet has state %q, want none", unstored.State())
	}
}

// TestEntrySize: the broker holds one entry per message, so its size is most of the broker's memory
// per pending message. The allocator rounds it up to a size class; past 112 bytes the next class is
// 128, so growing it beyond 112 costs 16 bytes a message. The index item keeps
// metadata and the exclusivity value behind one pointer, and the stored record its rarely set
// fields, for this reason.
func TestEntrySize(t *testing.T) {
	if got := unsafe.Sizeof(entry{}); got > 112 {
		t.Errorf("sizeof(entry) = %d bytes, want at most 112 (the 112-byte size class); "+
			"keep rarely set fields out of line", got)
	}
}
