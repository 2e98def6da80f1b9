package workers_test

import (
	"bytes"
	"testing"
	"time"

	"github.com/natstone/natstone/subjects"
	"github.com/natstone/natstone/workers"
)

// TestSchedule: a Go client schedules a binary payload on an exclusive queue, sees the schedule,
// gets its fired message, and unschedules it.
func TestSchedule(t *testing.T) {
	t.Parallel()
	e := setupFake(t)
	c := ctx(t)
	e.createQueue("x", &workers.QueueOpts{Type: subjects.Exclusive, ExclusivityKey: "project"})
	payload := []byte{0, 1, 2, 0xff}
	info, err := e.c.Schedule(c, "x", "nightly", workers.ScheduleOpts{
		Cron: "@every 1h", Payload: payload, Metadata: map[string]string{"project": "foo"},
		Deadline: 10 * time.Minute, Lease: time.Minute, MaxAttempts: 3,
	})
	if err != nil {
		t.Fatal(err)
	}
	if !info.NextAt.Equal(t0.Add(time.Hour)) || info.PayloadBytes != len(payload) || info.DeadlineMS != 600_000 || *info.LeaseMS != 60_000 || *info.MaxAttempts != 3 {
		t.Fatalf("Schedule: %+v", info)
	}
	e.clk.Advance(time.Hour)
	all, err := e.c.Schedules(c, "x")
	if err != nil || len(all) != 1 || all[0].LastID == "" {
		t.Fatalf("Schedules: %+v, %v; want nightly, fired once", all, err)
	}
	m := e.get("x", all[0].LastID)
	if !bytes.Equal(m.Payload, payload) || m.Priority != t0.Add(time.Hour+10*time.Minute).UnixMilli() || m.Metadata["project"] != "foo" || m.AttemptsLeft != 3 {
		t.Fatalf("fired message %+v", m)
	}
	for i, want := range []bool{true, false} {
		if removed, err := e.c.Unschedule(c, "x", "nightly"); err != nil || removed != want {
			t.Fatalf("Unschedule #%d: %v, %v; want %v", i+1, removed, err, want)
		}
	}
}
