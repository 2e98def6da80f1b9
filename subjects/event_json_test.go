package subjects_test

import (
	"encoding/json"
	"testing"
	"time"

	"github.com/natstone/natstone/subjects"
)

// leasedEvent is the most common event: a dequeue leased a message.
func leasedEvent() *subjects.Event {
	exp := time.UnixMilli(1_790_000_030_123).UTC()
	return &subjects.Event{Queue: "orders", ID: "01JD0000000000000000000042", Kind: subjects.EventLeased,
		State: subjects.StateRunning, PrevState: subjects.StatePending, Version: 3, Attempts: 1, MaxAttempts: 3,
		Priority: 1_790_000_000_000, LeaseID: "01JDLEASE0000000000000001", LeaseExpiresAt: &exp,
		RequestID: "req-1", Worker: "w-17", At: time.UnixMilli(1_790_000_000_123).UTC()}
}

// FuzzAppendEvent holds AppendEvent to json.Marshal: the same bytes for every event, whether it
// takes the direct path or falls back.
func FuzzAppendEvent(f *testing.F) {
	f.Add("orders", "01JD42", "leased", "running", "pending", "", "L1", "req-1", "w-17", "", "", uint64(3), 1, 3, int64(-5), 0, int64(1_790_000_000_123), int64(1_790_000_030_123), byte(0x03))
	f.Add("q", "é<&>\"\\\n", "enqueued", "pending", "", "", "", "", "", "k", "v\u2028", uint64(1), 0, 1, int64(1)<<62, 2048, int64(-62_200_000_000_000), int64(0), byte(0x1c))
	f.Add("q", "m", "errored", "errored", "running", "lease_expired", "", "", "", "a", "b", uint64(9), 3, 3, int64(0), 0, int64(253_402_300_800_000), int64(1), byte(0x0f))
	f.Add("q", "m", "released", "pending", "running", "", "L2", "", "", "k", "upstream said 429 <retry>", uint64(4), 2, 5, int64(7), 0, int64(1_790_000_000_123), int64(0), byte(0x20))
	f.Fuzz(func(t *testing.T, queue, id, kind, state, prev, reason, lease, req, worker, mk, mv string,
		version uint64, attempts, maxAttempts int, priority int64, size int, at, other int64, flags byte) {
		zone := time.UTC
		if flags&0x10 != 0 {
			zone = time.FixedZone("x", 3600)
		}
		e := &subjects.Event{Queue: queue, ID: id, Kind: subjects.EventKind(kind), State: subjects.State(state),
			PrevState: subjects.State(prev), Reason: reason, Version: version, Attempts: attempts, MaxAttempts: maxAttempts,
			Priority: priority, PayloadSize: size, LeaseID: lease, RequestID: req, Worker: worker, At: time.UnixMilli(at).In(zone)}
		if flags&0x01 != 0 {
			t := time.UnixMilli(other).UTC()
			e.LeaseExpiresAt = &t
		}
		if flags&0x02 != 0 {
			t := time.UnixMilli(other / 3).UTC()
			e.VisibleAt = &t
		}
		if flags&0x04 != 0 {
			e.Metadata = map[string]string{mk: mv, "z" + mk: mv + mv}
		}
		if flags&0x08 != 0 {
			e.Metadata = map[string]string{} // empty, not nil: omitted all the same
		}
		if flags&0x20 != 0 {
			e.Error = mv + "\n\t" + reason // a release's error: any text, new lines too
		}
		want, wantErr := json.Marshal(e)
		got, err := subjects.AppendEvent([]byte("prefix"), e)
		if (err == nil) != (wantErr == nil) {
			t.Fatalf("error %v, json.Marshal says %v", err, wantErr)
		}
		if err == nil && string(got) != "prefix"+string(want) {
			t.Fatalf("\n got %s\nwant prefix%s", got, want)
		}
	})
}

// TestAppendEventDirect: the common event takes the direct path, which allocates nothing in a
// buffer large enough (encoding/json allocates several times per event).
func TestAppendEventDirect(t *testing.T) {
	e := leasedEvent()
	buf := make([]byte, 0, 1024)
	allocs := testing.AllocsPerRun(100, func() {
		if _, err := subjects.AppendEvent(buf[:0], e); err != nil {
			t.Fatal(err)
		}
	})
	if allocs != 0 {
		t.Errorf("AppendEvent of a leased event: %.0f allocations, want 0 (it went through encoding/json)", allocs)
	}
}

func BenchmarkAppendEvent(b *testing.B) {
	e := leasedEvent()
	b.Run("AppendEvent", func(b *testing.B) {
		b.ReportAllocs()
		buf := make([]byte, 0, 1024)
		for b.Loop() {
			buf, _ = subjects.AppendEvent(buf[:0], e)
		}
	})
	b.Run("encoding/json", func(b *testing.B) {
		b.ReportAllocs()
		for b.Loop() {
			_, _ = json.Marshal(e)
		}
	})
}
