package broker_test

import (
	"slices"
	"strings"
	"testing"
	"time"

	"github.com/natstone/natstone/subjects"
)

// TestSchedulePause: a paused schedule fires at none of its times, through a restart and a
// replace, and counts none of them skipped; a resume fires it from its next time after the resume.
// A pause or resume that changes nothing writes nothing.
func TestSchedulePause(t *testing.T) {
	cleanRestarts(t, func(t *testing.T, restart func(e *env)) {
		e := setup(t)
		req := subjects.ScheduleRequest{Name: "tick", Cron: "@every 1m", Payload: "p"}
		created := must[subjects.ScheduleInfo](e, subjects.OpSchedule, "q", req)
		pause := subjects.SchedulePauseRequest{Name: "tick", Note: "the reports' database migrates"}
		e.advance(30 * time.Second)
		paused := must[subjects.ScheduleInfo](e, subjects.OpSchedulePause, "q", pause)
		at := t0.Add(30 * time.Second)
		if !paused.Paused || paused.PausedAt == nil || !paused.PausedAt.Equal(at) || paused.Note != pause.Note || paused.Revision <= created.Revision ||
			!paused.NextAt.Equal(at.Add(time.Minute)) {
			t.Fatalf("pause reply %+v, want paused at %v with its note, a new revision, next_at a minute after now", paused, at)
		}
		before := e.snap()
		if again := must[subjects.ScheduleInfo](e, subjects.OpSchedulePause, "q", pause); again.Revision != paused.Revision || !again.Paused {
			t.Fatalf("the same pause sent again: %+v, want revision %d (nothing written)", again, paused.Revision)
		}
		e.unchanged(before)
		if again := must[subjects.ScheduleInfo](e, subjects.OpSchedulePause, "q", subjects.SchedulePauseRequest{Name: "tick"}); again.Revision != paused.Revision || again.Note != pause.Note {
			t.Fatalf("a pause without a note of the paused schedule: %+v, want its note kept, revision %d (nothing written)", again, paused.Revision)
		}
		e.unchanged(before)

		e.advance(5 * time.Minute)
		if got := e.pendingIDs("q"); len(got) != 0 {
			t.Fatalf("a paused schedule enqueued %v", got)
		}
		s := e.schedules("q")["tick"]
		if !s.Paused || s.Skipped != 0 || s.LastAt != nil || !s.NextAt.Equal(e.clk.Now().Add(time.Minute)) {
			t.Fatalf("paused after 5 minutes: %+v, want paused, nothing skipped or fired, next_at a minute after now", s)
		}

		// A replace keeps the pause; so does a restart.
		req.Payload = "q"
		if got := must[subjects.ScheduleInfo](e, subjects.OpSchedule, "q", req); !got.Paused || got.Note != pause.Note || !got.PausedAt.Equal(at) {
			t.Fatalf("replaced: %+v, want it still paused, with its note and time", got)
		}
		restart(e)
		e.advance(5 * time.Minute)
		if got := e.pendingIDs("q"); len(got) != 0 {
			t.Fatalf("a paused schedule enqueued %v after a restart", got)
		}

		resumed := must[subjects.ScheduleInfo](e, subjects.OpScheduleResume, "q", subjects.SchedulePauseRequest{Name: "tick"})
		now := e.clk.Now()
		if resumed.Paused || resumed.PausedAt != nil || resumed.Note != "" || !resumed.NextAt.Equal(now.Add(time.Minute)) {
			t.Fatalf("resume reply %+v, want not paused, no note, next_at %v", resumed, now.Add(time.Minute))
		}
		before = e.snap()
		must[subjects.ScheduleInfo](e, subjects.OpScheduleResume, "q", subjects.SchedulePauseRequest{Name: "tick"})
		e.unchanged(before)
		back := subjects.SchedulePauseRequest{Name: "tick", Note: "the migration is done"}
		if got := must[subjects.ScheduleInfo](e, subjects.OpScheduleResume, "q", back); got.Paused || got.Note != back.Note {
			t.Fatalf("a resume with a note of a running schedule: %+v, want it running with the note", got)
		}
		before = e.snap()
		if got := must[subjects.ScheduleInfo](e, subjects.OpScheduleResume, "q", subjects.SchedulePauseRequest{Name: "tick"}); got.Note != back.Note {
			t.Fatalf("a resume without a note of a running schedule: %+v, want its note kept", got)
		}
		e.unchanged(before)
		e.advance(2 * time.Minute)
		want := []string{fireAt("tick", now.Add(time.Minute)), fireAt("tick", now.Add(2*time.Minute))}
		if got := e.pendingIDs("q"); !slices.Equal(got, want) {
			t.Fatalf("after the resume: pending %v, want %v (the times paused not fired)", got, want)
		}
		if s := e.schedules("q")["tick"]; s.Skipped != 0 || s.LastID != want[1] {
			t.Fatalf("after the resume: %+v, want nothing skipped, last %s", s, want[1])
		}
		if m := e.get("q", want[0]); m.Payload == nil || *m.Payload != "q" {
			t.Fatalf("the resumed schedule enqueued %+v, want the replaced payload", m)
		}
	})
}

// TestSchedulePauseOtherCron: a schedule replaced with another cron while paused does not walk
// the times due meanwhile; resumed, it fires at the new cron's times.
func TestSchedulePauseOtherCron(t *testing.T) {
	e := setup(t)
	must[subjects.ScheduleInfo](e, subjects.OpSchedule, "q", subjects.ScheduleRequest{Name: "s", Cron: "@every 1m"})
	must[subjects.ScheduleInfo](e, subjects.OpSchedulePause, "q", subjects.SchedulePauseRequest{Name: "s"})
	e.advance(10 * time.Minute)
	got := must[subjects.ScheduleInfo](e, subjects.OpSchedule, "q", subjects.ScheduleRequest{Name: "s", Cron: "@every 2m"})
	if !got.Paused || got.Skipped != 0 || got.LastAt != nil {
		t.Fatalf("replaced while paused: %+v, want paused, nothing skipped or fired", got)
	}
	must[subjects.ScheduleInfo](e, subjects.OpScheduleResume, "q", subjects.SchedulePauseRequest{Name: "s"})
	now := e.clk.Now()
	e.advance(4 * time.Minute)
	if got, want := e.pendingIDs("q"), []string{fireAt("s", now.Add(2*time.Minute)), fireAt("s", now.Add(4*time.Minute))}; !slices.Equal(got, want) {
		t.Fatalf("pending %v, want %v", got, want)
	}
}

// TestScheduleFireNow: schedule_fire enqueues the schedule's message now, paused or not, with the
// id asked for or that of now, and makes it the last fire; sent again it enqueues nothing more.
// With overlap skip it is refused while the last fire's message is not finished.
func TestScheduleFireNow(t *testing.T) {
	e := setup(t)
	must[subjects.ScheduleInfo](e, subjects.OpSchedule, "q", subjects.ScheduleRequest{Name: "nightly", Cron: "0 2 * * *", Payload: "p", DeadlineMS: 5000})
	e.advance(1500 * time.Millisecond)
	now := e.clk.Now()
	fired := must[subjects.ScheduleInfo](e, subjects.OpScheduleFire, "q", subjects.ScheduleFireRequest{Name: "nightly"})
	id := "nightly@" + now.UTC().Format("2006-01-02T15:04:05.000Z07:00") // to the millisecond: never a cron time's id
	if fired.LastID != id || fired.LastAt == nil || !fired.LastAt.Equal(now) {
		t.Fatalf("fire reply %+v, want last_id %s at %v", fired, id, now)
	}
	if m := e.get("q", id); m.State != subjects.StatePending || m.Priority != now.UnixMilli()+5000 || m.Payload == nil || *m.Payload != "p" {
		t.Fatalf("fired message %+v, want pending at priority %d with the schedule's payload", m, now.UnixMilli()+5000)
	}
	before := e.snap()
	if again := must[subjects.ScheduleInfo](e, subjects.OpScheduleFire, "q", subjects.ScheduleFireRequest{Name: "nightly"}); again.Revision != fired.Revision {
		t.Fatalf("the fire sent again within its millisecond: %+v, want revision %d", again, fired.Revision)
	}
	e.unchanged(before)

	// By its own id, while paused: safe to send again at any time.
	must[subjects.ScheduleInfo](e, subjects.OpSchedulePause, "q", subjects.SchedulePauseRequest{Name: "nightly"})
	e.advance(time.Minute)
	byID := must[subjects.ScheduleInfo](e, subjects.OpScheduleFire, "q", subjects.ScheduleFireRequest{Name: "nightly", ID: "rerun-1"})
	if byID.LastID != "rerun-1" || !byID.Paused {
		t.Fatalf("fired while paused: %+v, want last_id rerun-1, still paused", byID)
	}
	e.advance(time.Minute)
	before = e.snap()
	must[subjects.ScheduleInfo](e, subjects.OpScheduleFire, "q", subjects.ScheduleFireRequest{Name: "nightly", ID: "rerun-1"})
	e.unchanged(before)
	if got, want := e.pendingIDs("q"), []string{id, "rerun-1"}; !slices.Equal(got, want) {
		t.Fatalf("pending %v, want %v", got, want)
	}

	// Refused: nothing written.
	must[subjects.ScheduleInfo](e, subjects.OpSchedule, "q", subjects.ScheduleRequest{Name: "solo", Cron: "@hourly", Overlap: subjects.OverlapSkip})
	solo := must[subjects.ScheduleInfo](e, subjects.OpScheduleFire, "q", subjects.ScheduleFireRequest{Name: "solo", ID: "solo-1"})
	before = e.snap()
	fails(e, subjects.CodeInvalidState, subjects.OpScheduleFire, "q", subjects.ScheduleFireRequest{Name: "solo", ID: "solo-2"})
	fails(e, subjects.CodeScheduleNotFound, subjects.OpScheduleFire, "q", subjects.ScheduleFireRequest{Name: "none"})
	fails(e, subjects.CodeInvalidID, subjects.OpScheduleFire, "q", subjects.ScheduleFireRequest{Name: "nightly", ID: "a\x01"})
	fails(e, subjects.CodeInvalidID, subjects.OpScheduleFire, "q", `{"name":"nightly","id":""}`) // not "no id": each retry would fire
	fails(e, subjects.CodeInvalidSchedule, subjects.OpScheduleFire, "q", subjects.ScheduleFireRequest{Name: "a.b"})
	fails(e, subjects.CodeQueueNotFound, subjects.OpScheduleFire, "nope", subjects.ScheduleFireRequest{Name: "nightly"})
	fails(e, subjects.CodeBadRequest, subjects.OpScheduleFire, "q", map[string]any{"name": "nightly", "at": 5})
	e.unchanged(before)
	must[subjects.QueueInfo](e, subjects.OpUpdate, "q", subjects.UpdateQueueRequest{EnqueueBlocked: ptr(true)})
	before = e.snap()
	fails(e, subjects.CodeQueueBlocked, subjects.OpScheduleFire, "q", subjects.ScheduleFireRequest{Name: "nightly", ID: "blocked"})
	e.unchanged(before)
	must[subjects.QueueInfo](e, subjects.OpUpdate, "q", subjects.UpdateQueueRequest{EnqueueBlocked: ptr(false)})

	// Once the solo message is finished, solo fires again.
	must[subjects.Message](e, subjects.OpCancel, "q", subjects.LeaseRequest{ID: "solo-1"})
	if got := must[subjects.ScheduleInfo](e, subjects.OpScheduleFire, "q", subjects.ScheduleFireRequest{Name: "solo", ID: "solo-2"}); got.LastID != "solo-2" || got.Revision <= solo.Revision {
		t.Fatalf("solo fired after its last message was canceled: %+v, want last_id solo-2", got)
	}
}

// TestSchedulePauseBadRequests: pause and resume of a schedule that does not exist, with a bad
// name or note, or in a queue that does not exist, fail with their codes and write nothing; a note
// of MaxNoteLen bytes is taken.
func TestSchedulePauseBadRequests(t *testing.T) {
	e := setup(t)
	must[subjects.ScheduleInfo](e, subjects.OpSchedule, "q", subjects.ScheduleRequest{Name: "s", Cron: "@hourly"})
	before := e.snap()
	for _, op := range []subjects.Op{subjects.OpSchedulePause, subjects.OpScheduleResume} {
		fails(e, subjects.CodeScheduleNotFound, op, "q", subjects.SchedulePauseRequest{Name: "none"})
		fails(e, subjects.CodeInvalidSchedule, op, "q", subjects.SchedulePauseRequest{Name: ""})
		fails(e, subjects.CodeBadRequest, op, "q", subjects.SchedulePauseRequest{Name: "s", Note: strings.Repeat("n", subjects.MaxNoteLen+1)})
		fails(e, subjects.CodeBadRequest, op, "q", subjects.SchedulePauseRequest{Name: "s", Note: "two\nlines"})
		fails(e, subjects.CodeBadRequest, op, "q", map[string]any{"name": "s", "paused": true})
		fails(e, subjects.CodeQueueNotFound, op, "nope", subjects.SchedulePauseRequest{Name: "s"})
	}
	e.unchanged(before)
	note := strings.Repeat("n", subjects.MaxNoteLen)
	if got := must[subjects.ScheduleInfo](e, subjects.OpSchedulePause, "q", subjects.SchedulePauseRequest{Name: "s", Note: note}); got.Note != note {
		t.Fatalf("a note of %d bytes: %q", subjects.MaxNoteLen, got.Note)
	}
	// Unscheduled, it is not found.
	must[subjects.UnscheduleReply](e, subjects.OpUnschedule, "q", subjects.UnscheduleRequest{Name: "s"})
	fails(e, subjects.CodeScheduleNotFound, subjects.OpScheduleResume, "q", subjects.SchedulePauseRequest{Name: "s"})
}

// TestScheduleFireNowBesideTheCron: a fire by hand in the second of a cron time, without an id,
// enqueues a message of its own beside the cron's; and a fire by hand sent again after a timed fire
// superseded it changes nothing, so overlap skip goes on looking at the timed fire's message.
func TestScheduleFireNowBesideTheCron(t *testing.T) {
	e := setup(t)
	must[subjects.ScheduleInfo](e, subjects.OpSchedule, "q", subjects.ScheduleRequest{Name: "tick", Cron: "@every 1m"})
	e.advance(time.Minute) // the cron's fire at t0+1m
	cron := fireAt("tick", t0.Add(time.Minute))
	e.advance(400 * time.Millisecond)
	hand := must[subjects.ScheduleInfo](e, subjects.OpScheduleFire, "q", subjects.ScheduleFireRequest{Name: "tick"})
	if got := e.pendingIDs("q"); len(got) != 2 || got[0] != cron || got[1] != hand.LastID {
		t.Fatalf("pending %v, want the cron's %s and the fire by hand's %s", got, cron, hand.LastID)
	}

	must[subjects.ScheduleInfo](e, subjects.OpSchedule, "s", subjects.ScheduleRequest{Name: "solo", Cron: "@every 1m", Overlap: subjects.OverlapSkip})
	must[subjects.ScheduleInfo](e, subjects.OpScheduleFire, "s", subjects.ScheduleFireRequest{Name: "solo", ID: "m1"})
	must[subjects.Message](e, subjects.OpCancel, "s", subjects.LeaseRequest{ID: "m1"})
	e.advance(time.Minute) // a timed fire, its message pending
	timed := e.schedules("s")["solo"]
	if timed.LastID == "m1" || e.get("s", timed.LastID).State != subjects.StatePending {
		t.Fatalf("after the timed fire: %+v, want its message the last fire", timed)
	}
	before := e.snap()
	if again := must[subjects.ScheduleInfo](e, subjects.OpScheduleFire, "s", subjects.ScheduleFireRequest{Name: "solo", ID: "m1"}); again.LastID != timed.LastID || again.Revision != timed.Revision {
		t.Fatalf("the fire by hand sent again after a timed fire: %+v, want nothing changed (last_id %s)", again, timed.LastID)
	}
	e.unchanged(before)
	e.advance(time.Minute)
	if s := e.schedules("s")["solo"]; s.LastID != timed.LastID || s.OverlapSkipped != 1 {
		t.Fatalf("the next timed fire: %+v, want it left out, %s still pending", s, timed.LastID)
	}
}
