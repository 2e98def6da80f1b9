package broker_test

import (
	"slices"
	"testing"
	"time"

	"github.com/natstone/natstone/subjects"
)

// TestReschedule: a pending message given a new priority is dequeued in its new place; an invisible
// one is made pending at once, and a pending one invisible for a delay. Bad requests and messages
// that are not waiting to run write nothing, a version fences the change, and the same reschedule
// sent again finds its work done.
func TestReschedule(t *testing.T) {
	e := setup(t)
	e.create("q", subjects.CreateQueueRequest{})
	for i, id := range []string{"a", "b", "c"} {
		e.enqueue("q", subjects.EnqueueRequest{ID: id, Payload: id, Priority: ptr(int64(10 * (i + 1)))})
	}
	e.enqueue("q", subjects.EnqueueRequest{ID: "later", Payload: "l", Priority: ptr[int64](1), InvisibleMS: ptr[int64](60_000)})
	c := e.get("q", "c")

	before := e.snap()
	fails(e, subjects.CodeBadRequest, subjects.OpReschedule, "q", subjects.RescheduleRequest{ID: "c"})
	fails(e, subjects.CodeOutOfRange, subjects.OpReschedule, "q", subjects.RescheduleRequest{ID: "c", DelayMS: ptr[int64](-1)})
	fails(e, subjects.CodeOutOfRange, subjects.OpReschedule, "q", subjects.RescheduleRequest{ID: "c", DelayMS: ptr(subjects.MaxInvisible.Milliseconds() + 1)})
	fails(e, subjects.CodeRevisionMismatch, subjects.OpReschedule, "q", subjects.RescheduleRequest{ID: "c", Version: c.Version + 1, Priority: ptr[int64](5)})
	fails(e, subjects.CodeMessageNotFound, subjects.OpReschedule, "q", subjects.RescheduleRequest{ID: "nope", Priority: ptr[int64](5)})
	fails(e, subjects.CodeInvalidID, subjects.OpReschedule, "q", subjects.RescheduleRequest{Priority: ptr[int64](5)})
	fails(e, subjects.CodeQueueNotFound, subjects.OpReschedule, "nope", subjects.RescheduleRequest{ID: "c", Priority: ptr[int64](5)})
	// Already as asked: its own priority, or pending at once while pending. Nothing is written.
	must[subjects.Message](e, subjects.OpReschedule, "q", subjects.RescheduleRequest{ID: "c", Priority: ptr[int64](30)})
	must[subjects.Message](e, subjects.OpReschedule, "q", subjects.RescheduleRequest{ID: "c", DelayMS: ptr[int64](0), Version: 999})
	e.unchanged(before)

	bumped := must[subjects.Message](e, subjects.OpReschedule, "q", subjects.RescheduleRequest{ID: "c", Version: c.Version, Priority: ptr[int64](5)})
	if bumped.State != subjects.StatePending || bumped.Priority != 5 || bumped.Version != c.Version+1 {
		t.Fatalf("rescheduled to priority 5: %+v, want pending at priority 5, the next version", bumped)
	}
	// Sent again at the version it was sent with: the message is as asked, so it succeeds.
	before = e.snap()
	if again := must[subjects.Message](e, subjects.OpReschedule, "q", subjects.RescheduleRequest{ID: "c", Version: c.Version, Priority: ptr[int64](5)}); again.Version != bumped.Version {
		t.Fatalf("reschedule sent again: %+v, want it left at version %d", again, bumped.Version)
	}
	e.unchanged(before)

	// "later" is made pending at once: it has the earliest priority of all.
	promoted := must[subjects.Message](e, subjects.OpReschedule, "q", subjects.RescheduleRequest{ID: "later", DelayMS: ptr[int64](0)})
	if promoted.State != subjects.StatePending || !promoted.VisibleAt.Equal(promoted.UpdatedAt) {
		t.Fatalf("invisible message rescheduled with delay_ms 0: %+v, want pending from now", promoted)
	}
	// "a" waits 5 s, and "b" moves behind everything.
	hidden := must[subjects.Message](e, subjects.OpReschedule, "q", subjects.RescheduleRequest{ID: "a", DelayMS: ptr[int64](5000)})
	if hidden.State != subjects.StateInvisible || hidden.VisibleAt.Sub(hidden.UpdatedAt) != 5*time.Second || hidden.Priority != 10 {
		t.Fatalf("pending message rescheduled with delay_ms 5000: %+v, want invisible for 5 s at its priority", hidden)
	}
	must[subjects.Message](e, subjects.OpReschedule, "q", subjects.RescheduleRequest{ID: "b", Priority: ptr[int64](100)})
	if got := ids(e.dequeue("q", subjects.DequeueRequest{Batch: 10})); !slices.Equal(got, []string{"later", "c", "b"}) {
		t.Fatalf("dequeued %v, want [later c b]: the new priorities' order, without the hidden a", got)
	}
	e.advance(5 * time.Second)
	m := e.dequeueOne("q")
	if m.ID != "a" {
		t.Fatalf("after its delay dequeued %s, want a", m.ID)
	}

	// Running and finished messages are not rescheduled.
	fails(e, subjects.CodeInvalidState, subjects.OpReschedule, "q", subjects.RescheduleRequest{ID: "a", Priority: ptr[int64](1)})
	must[subjects.Message](e, subjects.OpComplete, "q", subjects.LeaseRequest{ID: "a", LeaseID: m.LeaseID})
	fails(e, subjects.CodeInvalidState, subjects.OpReschedule, "q", subjects.RescheduleRequest{ID: "a", Priority: ptr[int64](1)})

	checkHistory(t, e.history("q", "a"), []step{
		{subjects.EventEnqueued, subjects.StatePending, ""},
		{subjects.EventRescheduled, subjects.StateInvisible, ""},
		{subjects.EventPending, subjects.StatePending, ""},
		{subjects.EventLeased, subjects.StateRunning, ""},
		{subjects.EventCompleted, subjects.StateCompleted, ""},
	})
	if h := e.history("q", "b").Events; h[len(h)-2].Kind != subjects.EventRescheduled || h[len(h)-2].Priority != 100 {
		t.Errorf("b's history: %+v, want its reschedule's event with priority 100", h)
	}
	st := must[subjects.StatsReply](e, subjects.OpStats, "q", subjects.StatsRequest{})
	if st.Totals.Rescheduled != 4 {
		t.Errorf("stats: %d rescheduled, want 4", st.Totals.Rescheduled)
	}
}

// TestRescheduleExclusive: in an exclusive queue a rescheduled message takes its new place among
// the values that are free.
func TestRescheduleExclusive(t *testing.T) {
	e := setup(t)
	e.create("x", subjects.CreateQueueRequest{Type: subjects.Exclusive, ExclusivityKey: "p"})
	e.enqueue("x", subjects.EnqueueRequest{ID: "a1", Payload: "1", Priority: ptr[int64](1), Metadata: map[string]string{"p": "a"}})
	e.enqueue("x", subjects.EnqueueRequest{ID: "a2", Payload: "2", Priority: ptr[int64](2), Metadata: map[string]string{"p": "a"}})
	e.enqueue("x", subjects.EnqueueRequest{ID: "b1", Payload: "3", Priority: ptr[int64](3), Metadata: map[string]string{"p": "b"}})
	must[subjects.Message](e, subjects.OpReschedule, "x", subjects.RescheduleRequest{ID: "a2", Priority: ptr[int64](0)})
	must[subjects.Message](e, subjects.OpReschedule, "x", subjects.RescheduleRequest{ID: "b1", Priority: ptr[int64](-1)})
	if got := ids(e.dequeue("x", subjects.DequeueRequest{Batch: 10})); !slices.Equal(got, []string{"b1", "a2"}) {
		t.Fatalf("dequeued %v, want [b1 a2]: each value's earliest after the reschedules", got)
	}
}

// TestRescheduleAcrossARestart: the new priority and visibility are stored.
func TestRescheduleAcrossARestart(t *testing.T) {
	cleanRestarts(t, func(t *testing.T, restart func(e *env)) {
		e := setup(t)
		e.create("q", subjects.CreateQueueRequest{})
		e.enqueue("q", subjects.EnqueueRequest{ID: "a", Payload: "a", Priority: ptr[int64](1)})
		e.enqueue("q", subjects.EnqueueRequest{ID: "b", Payload: "b", Priority: ptr[int64](2)})
		e.enqueue("q", subjects.EnqueueRequest{ID: "c", Payload: "c", Priority: ptr[int64](3), InvisibleMS: ptr[int64](60_000)})
		must[subjects.Message](e, subjects.OpReschedule, "q", subjects.RescheduleRequest{ID: "a", Priority: ptr[int64](9)})
		must[subjects.Message](e, subjects.OpReschedule, "q", subjects.RescheduleRequest{ID: "c", DelayMS: ptr[int64](0)})
		restart(e)
		if got := ids(e.dequeue("q", subjects.DequeueRequest{Batch: 10})); !slices.Equal(got, []string{"b", "c", "a"}) {
			t.Fatalf("dequeued %v after a restart, want [b c a]", got)
		}
	})
}

// TestRescheduleKeepsTheWait: a new priority does not hide how long a message has been waiting;
// made pending from invisible, it waits from then.
func TestRescheduleKeepsTheWait(t *testing.T) {
	e := setup(t)
	e.create("q", subjects.CreateQueueRequest{})
	e.enqueue("q", subjects.EnqueueRequest{ID: "m", Payload: "x", Metadata: map[string]string{"k": "v"}})
	e.enqueue("q", subjects.EnqueueRequest{ID: "later", Payload: "y", InvisibleMS: ptr[int64](3_600_000)})
	e.advance(10 * time.Minute)
	must[subjects.Message](e, subjects.OpReschedule, "q", subjects.RescheduleRequest{ID: "m", Priority: ptr[int64](1000)})
	for _, filter := range []map[string]string{nil, {"k": "v"}} {
		st := must[subjects.StatsReply](e, subjects.OpStats, "q", subjects.StatsRequest{Filter: filter})
		if st.OldestPendingMS != 600_000 {
			t.Errorf("filter %v: oldest pending %d ms after a new priority, want 600000", filter, st.OldestPendingMS)
		}
	}
	must[subjects.Message](e, subjects.OpReschedule, "q", subjects.RescheduleRequest{ID: "m", DelayMS: ptr[int64](60_000)})
	must[subjects.Message](e, subjects.OpReschedule, "q", subjects.RescheduleRequest{ID: "later", DelayMS: ptr[int64](0)})
	e.advance(5 * time.Second)
	if st := must[subjects.StatsReply](e, subjects.OpStats, "q", subjects.StatsRequest{}); st.OldestPendingMS != 5000 {
		t.Errorf("oldest pending %d ms, want 5000: later waits from its reschedule, m is invisible", st.OldestPendingMS)
	}
}

// TestRescheduleVisibleAt: a reschedule's visible_at makes a message waiting to run invisible until
// then (a fraction of a millisecond rounded up), or pending at once if that time has come; sent
// again it finds its work done, at any version, and writes nothing. With delay_ms, past 366 days,
// or not a time, it is refused and writes nothing.
func TestRescheduleVisibleAt(t *testing.T) {
	t.Parallel()
	e := setup(t)
	e.create("q", subjects.CreateQueueRequest{})
	e.enqueue("q", subjects.EnqueueRequest{ID: "m", Priority: ptr[int64](1)})
	now := e.clk.Now()
	at := now.Add(time.Minute + 300*time.Microsecond)
	want := time.UnixMilli(at.UnixMilli() + 1)

	before := e.snap()
	tooFar := now.Add(subjects.MaxInvisible + time.Millisecond)
	fails(e, subjects.CodeBadRequest, subjects.OpReschedule, "q", subjects.RescheduleRequest{ID: "m", VisibleAt: &at, DelayMS: ptr[int64](5)})
	fails(e, subjects.CodeOutOfRange, subjects.OpReschedule, "q", subjects.RescheduleRequest{ID: "m", VisibleAt: &tooFar})
	fails(e, subjects.CodeBadRequest, subjects.OpReschedule, "q", `{"id": "m", "visible_at": "in a minute"}`)
	past := now.Add(-time.Hour)
	must[subjects.Message](e, subjects.OpReschedule, "q", subjects.RescheduleRequest{ID: "m", VisibleAt: &past, Version: 999}) // pending already
	e.unchanged(before)

	m := must[subjects.Message](e, subjects.OpReschedule, "q", subjects.RescheduleRequest{ID: "m", VisibleAt: &at})
	if m.State != subjects.StateInvisible || !m.VisibleAt.Equal(want) || m.Priority != 1 {
		t.Fatalf("rescheduled visible at %v: %+v, want invisible until %v at its priority", at, m, want)
	}
	e.advance(time.Second)
	before = e.snap()
	if again := must[subjects.Message](e, subjects.OpReschedule, "q", subjects.RescheduleRequest{ID: "m", VisibleAt: &at, Version: 999}); again.Version != m.Version {
		t.Fatalf("sent again: %+v, want it left at version %d", again, m.Version)
	}
	e.unchanged(before)

	later := at.Add(time.Hour)
	if m = must[subjects.Message](e, subjects.OpReschedule, "q", subjects.RescheduleRequest{ID: "m", VisibleAt: &later}); !m.VisibleAt.Equal(time.UnixMilli(later.UnixMilli() + 1)) {
		t.Fatalf("rescheduled an hour later: %+v", m)
	}
	if m = must[subjects.Message](e, subjects.OpReschedule, "q", subjects.RescheduleRequest{ID: "m", VisibleAt: &past}); m.State != subjects.StatePending || !m.VisibleAt.Equal(e.clk.Now()) {
		t.Fatalf("rescheduled to a time that has come: %+v, want pending from now", m)
	}
}

// TestRescheduleMovesADefaultPriority: a message whose priority is the default, the time it can
// run, keeps it so when a reschedule moves that time without giving a priority: run now, it queues
// from now, behind what was enqueued before and ahead of what comes after; put off, it queues from
// its new time. A priority given at enqueue stays as it is.
func TestRescheduleMovesADefaultPriority(t *testing.T) {
	t.Parallel()
	e := setup(t)
	e.create("q", subjects.CreateQueueRequest{})
	day := ptr(int64(24 * time.Hour / time.Millisecond))
	e.enqueue("q", subjects.EnqueueRequest{ID: "late", InvisibleMS: day})
	e.enqueue("q", subjects.EnqueueRequest{ID: "given", Priority: ptr[int64](5), InvisibleMS: day})
	e.advance(time.Second)
	e.enqueue("q", subjects.EnqueueRequest{ID: "before"})
	e.advance(time.Second)
	now := e.clk.Now()
	if m := must[subjects.Message](e, subjects.OpReschedule, "q", subjects.RescheduleRequest{ID: "late", DelayMS: ptr[int64](0)}); m.State != subjects.StatePending || m.Priority != now.UnixMilli() {
		t.Fatalf("late run now: %+v, want pending at priority %d (now)", m, now.UnixMilli())
	}
	if m := must[subjects.Message](e, subjects.OpReschedule, "q", subjects.RescheduleRequest{ID: "given", DelayMS: ptr[int64](0)}); m.Priority != 5 {
		t.Fatalf("given run now: %+v, want its priority 5", m)
	}
	e.advance(time.Second)
	e.enqueue("q", subjects.EnqueueRequest{ID: "after"})
	put := e.enqueue("q", subjects.EnqueueRequest{ID: "put off"})
	at := e.clk.Now().Add(time.Hour)
	if m := must[subjects.Message](e, subjects.OpReschedule, "q", subjects.RescheduleRequest{ID: "put off", VisibleAt: &at}); m.Priority != at.UnixMilli() || m.Priority == put.Priority {
		t.Fatalf("put off an hour: %+v, want priority %d", m, at.UnixMilli())
	}
	if got := ids(e.dequeue("q", subjects.DequeueRequest{Batch: 5})); !slices.Equal(got, []string{"given", "before", "late", "after"}) {
		t.Fatalf("dequeued %v, want [given before late after]", got)
	}
}
