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
		VisibleAt: 1_700_000_000_000, UpdatedAt: 1_700_000_000_000}
	running := base
	running.State, running.LeaseID, running.LeaseExpires, running.RequestID = subjects.StateRunning, "l1", 1_700_000_060_000, "r1"
	running.Metadata, running.LeaseMS = map[string]string{"project": "foo", "kind": "encode"}, subjects.MaxLease.Milliseconds()
	running.UpdatedAt = 1_700_000_001_000
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
	retried := base
	retried.UpdatedAt, retried.Attempts = base.EnqueuedAt+90_000, 1 // pending again, written since its enqueue
	records["retried"] = retried
	released := base
	released.Released = true
	records["released"] = released
	versions := base
	versions.Version = 1<<40 + 7 // past the entry's 32 bits
	records["many versions"] = versions
	for name, r := range records {
		e := q.newEntry(r, 9)
		if got := e.record(); !reflect.DeepEqual(got, r) {
			t.Errorf("%s: newEntry then record:\n got %+v\nwant %+v", name, got, r)
		}
		wantMore := r.LeaseID != "" || r.Metadata != nil || r.EndedAt != 0 || r.VisibleAt != r.EnqueuedAt ||
			r.UpdatedAt != r.EnqueuedAt || r.Version > math.MaxUint32
		if (e.more != nil) != wantMore {
			t.Errorf("%s: out-of-line fields allocated: %v, want %v", name, e.more != nil, wantMore)
		}
		if r.Metadata != nil && e.Value() != "foo" {
			t.Errorf("%s: exclusivity value %q, want foo", name, e.Value())
		}
		// A record set over another one — as after a conflict, another writer's — replaces all of it:
		// the old optional fields go, and the index item follows its priority, payload and metadata.
		// The busy flag is the entry's, not the record's: it stays.
		other := ended
		other.Priority, other.BodySeq, other.Metadata = 99, 12, map[string]string{"project": "bar"}
		e2 := q.newEntry(other, 1)
		e2.setBusy(true)
		q.setRecord(e2, &r)
		if got := e2.record(); !reflect.DeepEqual(got, r) {
			t.Errorf("%s: set over another record:\n got %+v\nwant %+v", name, got, r)
		}
		if !e2.busy() {
			t.Errorf("%s: setting the record cleared the entry's busy flag", name)
		}
		if wantValue := r.Metadata["project"]; e2.Value() != wantValue || len(e2.Meta()) != len(r.Metadata) {
			t.Errorf("%s: after set over another record: value %q, %d pairs; want %q, %d", name, e2.Value(), len(e2.Meta()), wantValue, len(r.Metadata))
		}
		e2.setBusy(false)
		if got := e2.record(); e2.busy() || !reflect.DeepEqual(got, r) {
			t.Errorf("%s: after its write ended: busy %v, record\n got %+v\nwant %+v", name, e2.busy(), got, r)
		}
	}
	// Counts, sizes and lease defaults beyond what natstone writes saturate instead of wrapping.
	huge := running
	huge.Attempts, huge.MaxAttempts, huge.PayloadSize, huge.LeaseMS = math.MaxInt32+5, 1<<16, 1<<30, 1<<40
	got := q.newEntry(huge, 1).record()
	if got.Attempts != math.MaxUint16 || got.MaxAttempts != math.MaxUint16 || got.PayloadSize != 1<<24-1 || got.LeaseMS != math.MaxInt32 {
		t.Errorf("attempts %d, max %d, payload size %d, lease %d: want each saturated (%d, %d, %d, %d)",
			got.Attempts, got.MaxAttempts, got.PayloadSize, got.LeaseMS, math.MaxUint16, math.MaxUint16, 1<<24-1, math.MaxInt32)
	}
	if got.State != huge.State || got.Released != huge.Released {
		t.Errorf("a saturated payload size changed the state or released flag: %s %v, want %s %v", got.State, got.Released, huge.State, huge.Released)
	}
	var unstored entry
	if unstored.State() != "" {
		t.Errorf("a record not stored yet has state %q, want none", unstored.State())
	}
}

// TestEntrySize: the broker holds one entry per message, so its size is most of the broker's memory
// per pending message. The allocator rounds it up to a size class; past 80 bytes the next class is
// 96, so growing it beyond 80 costs 16 bytes a message. The index item keeps metadata and the
// exclusivity value behind one pointer, and the entry the record's rarely set fields, for this
// reason. The out-of-line fields, which running, retained and retried messages carry, are held to
// the 80-byte class too.
func TestEntrySize(t *testing.T) {
	if got := unsafe.Sizeof(entry{}); got > 80 {
		t.Errorf("sizeof(entry) = %d bytes, want at most 80 (the 80-byte size class); "+
			"keep rarely set fields out of line", got)
	}
	if got := unsafe.Sizeof(storedMore{}); got > 80 {
		t.Errorf("sizeof(storedMore) = %d bytes, want at most 80 (the 80-byte size class)", got)
	}
}
