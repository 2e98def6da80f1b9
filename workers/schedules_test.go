package workers_test

import (
	"bytes"
	"encoding/json"
	"errors"
	"fmt"
	"strings"
	"testing"
	"time"

	"github.com/natstone/natstone/subjects"
	"github.com/natstone/natstone/workers"
)

// TestSchedule: a Go client schedules a binary payload on an exclusive queue, with overlap skip,
// sees the schedule, gets its fired message, sees the next fire skipped while that message is
// pending, and unschedules it.
func TestSchedule(t *testing.T) {
	t.Parallel()
	e := setupFake(t)
	c := ctx(t)
	e.createQueue("x", &workers.QueueOpts{Type: subjects.Exclusive, ExclusivityKey: "project"})
	payload := []byte{0, 1, 2, 0xff}
	info, err := e.c.Schedule(c, "x", "nightly", workers.ScheduleOpts{
		Cron: "@every 1h", Payload: payload, Metadata: map[string]string{"project": "foo"},
		Deadline: 10 * time.Minute, Lease: time.Minute, MaxAttempts: 3, Overlap: subjects.OverlapSkip,
	})
	if err != nil {
		t.Fatal(err)
	}
	if !info.NextAt.Equal(t0.Add(time.Hour)) || info.PayloadBytes != len(payload) || info.DeadlineMS != 600_000 || *info.LeaseMS != 60_000 || *info.MaxAttempts != 3 || info.Overlap != subjects.OverlapSkip {
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
	e.clk.Advance(time.Hour)
	if all, err := e.c.Schedules(c, "x"); err != nil || len(all) != 1 || all[0].OverlapSkipped != 1 || all[0].LastID != m.ID {
		t.Fatalf("Schedules an hour later: %+v, %v; want the fire skipped, its message pending", all, err)
	}
	if _, err := e.c.Schedule(c, "x", "nightly", workers.ScheduleOpts{Cron: "@hourly", Metadata: map[string]string{"project": "foo"}, Overlap: "never"}); !errors.Is(err, workers.ErrInvalidSchedule) {
		t.Fatalf("Schedule with overlap never: %v, want ErrInvalidSchedule", err)
	}
	for i, want := range []bool{true, false} {
		if removed, err := e.c.Unschedule(c, "x", "nightly"); err != nil || removed != want {
			t.Fatalf("Unschedule #%d: %v, %v; want %v", i+1, removed, err, want)
		}
	}
}

// TestSchedulePauseAndFire: a Go client pauses a schedule with a note, which then fires at none of
// its times, fires it by hand by an id, twice (one message), and resumes it, which fires it at its
// next time; a schedule that does not exist is ErrScheduleNotFound.
func TestSchedulePauseAndFire(t *testing.T) {
	t.Parallel()
	e := setupFake(t)
	c := ctx(t)
	if _, err := e.c.Schedule(c, "q", "tick", workers.ScheduleOpts{Cron: "@every 1m", Payload: []byte("p")}); err != nil {
		t.Fatal(err)
	}
	paused, err := e.c.PauseSchedule(c, "q", "tick", "maintenance")
	if err != nil || !paused.Paused || paused.Note != "maintenance" {
		t.Fatalf("PauseSchedule: %+v, %v", paused, err)
	}
	e.clk.Advance(3 * time.Minute)
	for range 2 {
		fired, err := e.c.FireSchedule(c, "q", "tick", "by-hand")
		if err != nil || fired.LastID != "by-hand" || !fired.Paused {
			t.Fatalf("FireSchedule: %+v, %v; want last_id by-hand, still paused", fired, err)
		}
	}
	if d, err := e.c.Depth(c, "q", nil); err != nil || d.Pending != 1 {
		t.Fatalf("Depth: %+v, %v; want the one message fired by hand", d, err)
	}
	resumed, err := e.c.ResumeSchedule(c, "q", "tick", "")
	if err != nil || resumed.Paused || resumed.Note != "" || !resumed.NextAt.Equal(t0.Add(4*time.Minute)) {
		t.Fatalf("ResumeSchedule: %+v, %v; want not paused, next a minute after now", resumed, err)
	}
	e.clk.Advance(time.Minute)
	if all, err := e.c.Schedules(c, "q"); err != nil || len(all) != 1 || all[0].LastID != "tick@"+t0.Add(4*time.Minute).Format(time.RFC3339) {
		t.Fatalf("Schedules after the resume: %+v, %v; want tick fired a minute after it", all, err)
	}
	for name, call := range map[string]func() error{
		"PauseSchedule":  func() error { _, err := e.c.PauseSchedule(c, "q", "none", ""); return err },
		"ResumeSchedule": func() error { _, err := e.c.ResumeSchedule(c, "q", "none", ""); return err },
		"FireSchedule":   func() error { _, err := e.c.FireSchedule(c, "q", "none", ""); return err },
	} {
		if err := call(); !errors.Is(err, workers.ErrScheduleNotFound) {
			t.Errorf("%s of a schedule that does not exist: %v, want ErrScheduleNotFound", name, err)
		}
	}
}

// TestSchedulesPages: a queue's schedules with large metadata take more than one reply (1 MiB):
// the broker says more, and Schedules asks again after the last name until it has them all.
func TestSchedulesPages(t *testing.T) {
	t.Parallel()
	e := setupFake(t)
	c := ctx(t)
	e.createQueue("q", &workers.QueueOpts{MaxMetadataPairs: subjects.MaxMetadataPairs})
	md := make(map[string]string, subjects.MaxMetadataPairs)
	for i := range subjects.MaxMetadataPairs {
		md[fmt.Sprintf("k%02d", i)] = strings.Repeat("v", subjects.MaxMetadataValueLen)
	}
	for i := range subjects.MaxSchedules {
		if _, err := e.c.Schedule(c, "q", fmt.Sprintf("s%03d", i), workers.ScheduleOpts{Cron: "@hourly", Metadata: md}); err != nil {
			t.Fatal(err)
		}
	}
	all, err := e.c.Schedules(c, "q")
	if err != nil || len(all) != subjects.MaxSchedules || all[0].Name != "s000" || all[len(all)-1].Name != fmt.Sprintf("s%03d", subjects.MaxSchedules-1) {
		t.Fatalf("Schedules: %d, %v; want all %d in order", len(all), err, subjects.MaxSchedules)
	}
	for i := 1; i < len(all); i++ {
		if all[i-1].Name >= all[i].Name {
			t.Fatalf("Schedules: %s before %s", all[i-1].Name, all[i].Name)
		}
	}
	msg, err := e.srv.Connect(t).Request(e.space.Subject(subjects.OpSchedules, "q"), nil, 10*time.Second)
	if err != nil {
		t.Fatal(err)
	}
	var r subjects.SchedulesReply
	if err := json.Unmarshal(msg.Data, &r); err != nil || !r.More || len(r.Schedules) >= subjects.MaxSchedules || len(msg.Data) > 1<<20 {
		t.Fatalf("one schedules reply: %d schedules in %d bytes, more %v (%v); want a page under 1 MiB, and more", len(r.Schedules), len(msg.Data), r.More, err)
	}
}
