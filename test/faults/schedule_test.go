package faults

import (
	"fmt"
	"math/rand/v2"
	"slices"
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

// soloQueue holds the messages of a second schedule, every second with overlap skip, whose messages
// one worker (workSolo) runs for 1.2 to 2.7 s each: most fires find the last message unfinished.
// checkSolo judges it.
const soloQueue = "solo"

// haltedQueue holds the messages of a third schedule, every second, paused before the kills and
// fired once by hand: checkHalted judges it.
const haltedQueue = "halted"

// haltedByHand is the id of haltedQueue's fire by hand.
const haltedByHand = "halted-by-hand"

// startTicks creates ticksQueue, soloQueue and haltedQueue with their schedules, pauses haltedQueue's
// and fires it by hand, each request sent again until its outcome is known (a kill may come first).
func startTicks(t *testing.T, admin *client) {
	t.Helper()
	retention, lease := time.Hour.Milliseconds(), (3 * time.Second).Milliseconds()
	for _, s := range []struct {
		queue string
		req   subjects.ScheduleRequest
	}{
		{ticksQueue, subjects.ScheduleRequest{Name: ticksSchedule, Cron: "@every 1s", Payload: "tick"}},
		{soloQueue, subjects.ScheduleRequest{Name: soloQueue, Cron: "@every 1s", Payload: "solo", Overlap: subjects.OverlapSkip}},
		{haltedQueue, subjects.ScheduleRequest{Name: haltedQueue, Cron: "@every 1s", Payload: "halted"}},
	} {
		untilKnown(t, "create "+s.queue, func() (Outcome, string) {
			var info subjects.QueueInfo
			return admin.call(subjects.OpCreate, s.queue, subjects.CreateQueueRequest{RetentionMS: &retention, LeaseMS: lease}, &info)
		})
		untilKnown(t, "schedule "+s.req.Name, func() (Outcome, string) {
			var info subjects.ScheduleInfo
			return admin.call(subjects.OpSchedule, s.queue, s.req, &info)
		})
	}
	untilKnown(t, "pause "+haltedQueue, func() (Outcome, string) {
		var info subjects.ScheduleInfo
		return admin.call(subjects.OpSchedulePause, haltedQueue, subjects.SchedulePauseRequest{Name: haltedQueue, Note: "the fault test"}, &info)
	})
	untilKnown(t, "fire "+haltedQueue, func() (Outcome, string) {
		var info subjects.ScheduleInfo
		return admin.call(subjects.OpScheduleFire, haltedQueue, subjects.ScheduleFireRequest{Name: haltedQueue, ID: haltedByHand}, &info)
	})
}

// checkHalted checks haltedQueue's schedule after the run: it is still paused, its last fire is
// the one by hand, and none of its messages is of a time after its pause, whatever the kills did.
// It returns how long it was paused.
func checkHalted(t *testing.T, admin *client) time.Duration {
	t.Helper()
	s := scheduleOf(t, admin, haltedQueue)
	if !s.Paused || s.PausedAt == nil || s.Note != "the fault test" {
		t.Errorf("schedule %+v: want it paused, with its note", s)
		return 0
	}
	if s.LastID != haltedByHand {
		t.Errorf("schedule %+v: its last fire is not the one by hand, %s", s, haltedByHand)
	}
	byHand := false
	for _, m := range messagesOf(t, admin, haltedQueue, subjects.StateInvisible, subjects.StatePending, subjects.StateRunning,
		subjects.StateCompleted, subjects.StateCanceled, subjects.StateErrored) {
		if m.ID == haltedByHand {
			byHand = true
			continue
		}
		at, err := time.Parse(time.RFC3339, strings.TrimPrefix(m.ID, haltedQueue+"@"))
		if err != nil || !strings.HasPrefix(m.ID, haltedQueue+"@") || at.After(*s.PausedAt) {
			t.Errorf("%s holds %s, not a fire of %s before its pause at %v", haltedQueue, m.ID, haltedQueue, s.PausedAt)
		}
	}
	if !byHand {
		t.Errorf("%s does not hold %s, its fire by hand", haltedQueue, haltedByHand)
	}
	return time.Since(*s.PausedAt)
}

// workSolo runs soloQueue's messages until stop: each for 1.2 to 2.7 s, longer than the schedule's
// interval, then completed (sent again while its outcome is unknown, for up to 5 s).
func workSolo(c *client, stop <-chan struct{}) {
	rng := rand.New(rand.NewPCG(uint64(time.Now().UnixNano()), 11))
	pollUntil(c, stop, soloQueue, func() subjects.DequeueRequest { return subjects.DequeueRequest{WaitMS: 500} }, func(ms []subjects.Message) {
		m := ms[0]
		select {
		case <-stop:
			return
		case <-time.After(time.Duration(1200+rng.IntN(1500)) * time.Millisecond): // the work
		}
		for deadline := time.Now().Add(5 * time.Second); time.Now().Before(deadline); {
			var done subjects.Message
			if o, _ := c.call(subjects.OpComplete, soloQueue, subjects.LeaseRequest{ID: m.ID, LeaseID: m.LeaseID}, &done); o != Unknown {
				break
			}
			<-time.After(50 * time.Millisecond)
		}
	})
}

// pollUntil dequeues from queue with next's requests until stop, and hands what each leases to
// handle; when a dequeue leases nothing (no broker, nothing to lease) it waits 10 ms, not to spin.
func pollUntil(c *client, stop <-chan struct{}, queue string, next func() subjects.DequeueRequest, handle func([]subjects.Message)) {
	for {
		select {
		case <-stop:
			return
		default:
		}
		var r subjects.DequeueReply
		if o, _ := c.call(subjects.OpDequeue, queue, next(), &r); o != OK || len(r.Messages) == 0 {
			select {
			case <-stop:
				return
			case <-time.After(10 * time.Millisecond):
			}
			continue
		}
		handle(r.Messages)
	}
}

// scheduleOf returns queue's schedule, asked until the answer is known; it must be queue's alone.
func scheduleOf(t *testing.T, admin *client, queue string) subjects.ScheduleInfo {
	t.Helper()
	var s subjects.ScheduleInfo
	untilKnown(t, "schedules "+queue, func() (Outcome, string) {
		var r subjects.SchedulesReply
		o, code := admin.call(subjects.OpSchedules, queue, nil, &r)
		if o == OK && len(r.Schedules) != 1 {
			t.Fatalf("schedules of %s: %+v, want one", queue, r.Schedules)
		}
		if o == OK {
			s = r.Schedules[0]
		}
		return o, code
	})
	return s
}

// firing returns queue's one schedule once it is seen firing: its next fire no more than 3 s past.
// The checks run just after natstone was stopped and started again, which may have taken a few
// seconds (a stop waits up to 2 s for the collections' markers to go before it writes its
// snapshot), and the schedule fires what came due meanwhile once the start serves; one that is
// still 3 s late 10 s on no longer fires.
func firing(t *testing.T, admin *client, queue string) subjects.ScheduleInfo {
	t.Helper()
	deadline := time.Now().Add(10 * time.Second)
	for {
		s := scheduleOf(t, admin, queue)
		late := time.Since(s.NextAt)
		if late <= 3*time.Second {
			return s
		}
		if time.Now().After(deadline) {
			t.Fatalf("schedule %+v: its next fire is %v late, the schedule no longer fires", s, late)
		}
		<-time.After(50 * time.Millisecond)
	}
}

// messagesOf returns queue's messages in states, asked until each answer is known.
func messagesOf(t *testing.T, admin *client, queue string, states ...subjects.State) []subjects.Message {
	t.Helper()
	var msgs []subjects.Message
	for _, state := range states {
		for after, more := "", true; more; {
			untilKnown(t, "browse "+queue, func() (Outcome, string) {
				var r subjects.BrowseReply
				o, code := admin.call(subjects.OpBrowse, queue, subjects.BrowseRequest{State: state, Limit: subjects.MaxBrowseLimit, After: after}, &r)
				if o == OK {
					msgs, after, more = append(msgs, r.Messages...), r.Next, r.More
				}
				return o, code
			})
		}
	}
	return msgs
}

// checkSolo checks soloQueue's schedule after the run: no message of it was enqueued before the
// one before it had finished (ended_at no later than the next one's enqueued_at), so at most one
// was ever unfinished, whatever the kills did; every second from its first fire to the last time
// it handled (next_at - 1 s, read before the messages: those of later fires are checked for their
// order alone) either enqueued its message, or is counted skipped (no broker) or overlap_skipped;
// no fire said it enqueued nothing; and the schedule still fires. It returns the messages up to
// that time and the seconds left out by the overlap.
func checkSolo(t *testing.T, admin *client) (fired, overlapped int) {
	t.Helper()
	s := firing(t, admin, soloQueue)
	if s.LastAt == nil || s.LastError != "" || s.Overlap != subjects.OverlapSkip {
		t.Fatalf("schedule %+v: want fires with overlap skip, the last without an error", s)
	}
	first := time.UnixMilli(s.UpdatedAt.UnixMilli()).Truncate(time.Second).Add(time.Second)
	last := s.NextAt.Add(-time.Second)
	type fire struct {
		at time.Time
		m  subjects.Message
	}
	var fires []fire
	for _, m := range messagesOf(t, admin, soloQueue, subjects.StateInvisible, subjects.StatePending, subjects.StateRunning,
		subjects.StateCompleted, subjects.StateCanceled, subjects.StateErrored) {
		at, err := time.Parse(time.RFC3339, strings.TrimPrefix(m.ID, soloQueue+"@"))
		if err != nil || !strings.HasPrefix(m.ID, soloQueue+"@") || at.Before(first) || at.Sub(first)%time.Second != 0 {
			t.Errorf("%s holds %s, not a fire of %s from %v", soloQueue, m.ID, soloQueue, first)
			continue
		}
		fires = append(fires, fire{at, m})
		if !at.After(last) {
			fired++
		}
	}
	slices.SortFunc(fires, func(a, b fire) int { return a.at.Compare(b.at) })
	for i := 1; i < len(fires); i++ {
		a, b := fires[i-1].m, fires[i].m
		if a.EndedAt == nil || b.EnqueuedAt.Before(*a.EndedAt) {
			t.Errorf("%s: %s enqueued at %v while %s was %s (ended at %v): two unfinished at once",
				soloQueue, b.ID, b.EnqueuedAt, a.ID, a.State, a.EndedAt)
		}
	}
	seconds := int(last.Sub(first)/time.Second) + 1
	if got := fired + int(s.Skipped+s.OverlapSkipped); got != seconds {
		t.Errorf("schedule %s: %d seconds from %v to %v, %d fired, %d skipped, %d overlap_skipped: %d unaccounted for",
			soloQueue, seconds, first.Format(time.TimeOnly), last.Format(time.TimeOnly), fired, s.Skipped, s.OverlapSkipped, seconds-got)
	}
	return fired, int(s.OverlapSkipped)
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
	s := firing(t, admin, ticksQueue)
	if s.LastAt == nil || s.LastError != "" {
		t.Fatalf("schedule %+v: want fires, the last without an error", s)
	}
	first := time.UnixMilli(s.UpdatedAt.UnixMilli()).Truncate(time.Second).Add(time.Second)
	last := *s.LastAt
	msgs := messagesOf(t, admin, ticksQueue, subjects.StatePending)
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

// tickSummary is the schedules' part of a run's summary.
func tickSummary(s *runStats) string {
	return fmt.Sprintf("ticks_fired=%d ticks_skipped=%d solo_fired=%d solo_overlapped=%d halted_for=%v capped_leases=%d capped_most=%d",
		s.ticksFired, s.ticksSkipped, s.soloFired, s.soloOverlapped, s.haltedFor.Round(time.Second), s.cappedLeases, s.cappedMost)
}
