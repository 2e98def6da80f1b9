package faults

import (
	"fmt"
	"strings"
	"testing"
	"time"

	"github.com/natstone/natstone/subjects"
)

// ticksQueue holds the messages of the run's schedule, which fires every second through the kills.
// Its requests are kept out of the checker's history: checkTicks judges them.
const ticksQueue = "ticks"

// ticksSchedule is the schedule's name.
const ticksSchedule = "tick"

// startTicks creates ticksQueue and its schedule, each request sent again until its outcome is
// known (a kill may come first).
func startTicks(t *testing.T, admin *client) {
	t.Helper()
	retention := time.Hour.Milliseconds()
	untilKnown(t, "create "+ticksQueue, func() (Outcome, string) {
		var info subjects.QueueInfo
		return admin.call(subjects.OpCreate, ticksQueue, subjects.CreateQueueRequest{RetentionMS: &retention}, &info)
	})
	untilKnown(t, "schedule "+ticksSchedule, func() (Outcome, string) {
		var info subjects.ScheduleInfo
		return admin.call(subjects.OpSchedule, ticksQueue, subjects.ScheduleRequest{Name: ticksSchedule, Cron: "@every 1s", Payload: "tick"}, &info)
	})
}

// untilKnown calls call until its outcome is known, for up to a minute; a refusal fails the test.
func untilKnown(t *testing.T, what string, call func() (Outcome, string)) {
	t.Helper()
	deadline := time.Now().Add(time.Minute)
	for {
		o, code := call()
		switch {
		case o == OK:
			return
		case o == Failed && code != "no_responders":
			t.Fatalf("%s: %s", what, code)
		case time.Now().After(deadline):
			t.Fatalf("%s: still %s %s after a minute", what, o, code)
		}
		<-time.After(50 * time.Millisecond)
	}
}

// checkTicks checks the schedule after the run, natstone serving: every message of ticksQueue is
// the fire of a second of the schedule's (its id names it), none after the last fire; every
// second from the first fire to the last either enqueued its message or is counted skipped (no
// fire lost, whatever the kills did); no fire said it enqueued nothing; and the schedule still
// fires. Two messages for one second cannot be: the id is the second's. It returns the messages
// fired and the seconds skipped.
func checkTicks(t *testing.T, admin *client) (fired, skipped int) {
	t.Helper()
	var s subjects.ScheduleInfo
	untilKnown(t, "schedules", func() (Outcome, string) {
		var r subjects.SchedulesReply
		o, code := admin.call(subjects.OpSchedules, ticksQueue, nil, &r)
		if o == OK && len(r.Schedules) != 1 {
			t.Fatalf("schedules of %s: %+v, want %s alone", ticksQueue, r.Schedules, ticksSchedule)
		}
		if o == OK {
			s = r.Schedules[0]
		}
		return o, code
	})
	if s.LastAt == nil || s.LastError != "" {
		t.Fatalf("schedule %+v: want fires, the last without an error", s)
	}
	if late := time.Since(s.NextAt); late > 3*time.Second {
		t.Errorf("schedule %+v: its next fire is %v late, the schedule no longer fires", s, late)
	}
	first := time.UnixMilli(s.UpdatedAt.UnixMilli()).Truncate(time.Second).Add(time.Second)
	last := *s.LastAt
	var msgs []subjects.Message
	for after, more := "", true; more; {
		untilKnown(t, "browse "+ticksQueue, func() (Outcome, string) {
			var r subjects.BrowseReply
			o, code := admin.call(subjects.OpBrowse, ticksQueue, subjects.BrowseRequest{State: subjects.StatePending, Limit: subjects.MaxBrowseLimit, After: after}, &r)
			if o == OK {
				msgs, after, more = append(msgs, r.Messages...), r.Next, r.More
			}
			return o, code
		})
	}
	seen := make(map[int64]bool) // by Unix second
	for _, m := range msgs {
		at, err := time.Parse(time.RFC3339, strings.TrimPrefix(m.ID, ticksSchedule+"@"))
		switch {
		case err != nil || !strings.HasPrefix(m.ID, ticksSchedule+"@"):
			t.Errorf("%s holds %s, not a fire of %s", ticksQueue, m.ID, ticksSchedule)
		case at.Before(first) || at.Sub(first)%time.Second != 0:
			t.Errorf("%s: fired at %v, not a second of the schedule from %v", m.ID, at, first)
		case m.Priority != at.UnixMilli():
			t.Errorf("%s: priority %d, want its fire time %d", m.ID, m.Priority, at.UnixMilli())
		case !at.After(last):
			seen[at.Unix()] = true
		}
	}
	seconds := int(last.Sub(first)/time.Second) + 1
	if missing := seconds - len(seen); missing != int(s.Skipped) {
		var lost []string
		for at := first; !at.After(last) && len(lost) < 10; at = at.Add(time.Second) {
			if !seen[at.Unix()] {
				lost = append(lost, at.Format(time.TimeOnly))
			}
		}
		t.Errorf("schedule %s: %d seconds from %v to %v, %d fired, %d skipped: %d unaccounted for (first seconds without a message: %s)",
			ticksSchedule, seconds, first.Format(time.TimeOnly), last.Format(time.TimeOnly), len(seen), s.Skipped, missing-int(s.Skipped), strings.Join(lost, " "))
	}
	return len(seen), int(s.Skipped)
}

// tickSummary is the schedule's part of a run's summary.
func tickSummary(fired, skipped int) string {
	return fmt.Sprintf("ticks_fired=%d ticks_skipped=%d", fired, skipped)
}
