package broker_test

import (
	"testing"
	"time"

	"github.com/natstone/natstone/subjects"
)

// TestRetry: an errored message is pending again with its attempts anew, keeping its id and its
// history; a canceled one too, invisible for a delay_ms first. The retry is fenced by the version
// the caller saw, is a no-op on a message that is not finished (the same retry sent again), is
// refused on a completed one, and leaves the message out of the collection of finished messages.
func TestRetry(t *testing.T) {
	e := setup(t)
	e.create("q", subjects.CreateQueueRequest{MaxAttempts: 1, RetentionMS: ptr[int64](1000)})
	e.enqueue("q", subjects.EnqueueRequest{ID: "m", Payload: "x", Metadata: map[string]string{"k": "v"}})
	m := e.dequeueOne("q")
	errored := must[subjects.Message](e, subjects.OpRelease, "q", subjects.ReleaseRequest{ID: "m", LeaseID: m.LeaseID, Error: "boom"})
	if errored.State != subjects.StateErrored {
		t.Fatalf("released on its last attempt: %s, want errored", errored.State)
	}

	before := e.snap()
	fails(e, subjects.CodeRevisionMismatch, subjects.OpRetry, "q", subjects.RetryRequest{ID: "m", Version: errored.Version - 1})
	fails(e, subjects.CodeOutOfRange, subjects.OpRetry, "q", subjects.RetryRequest{ID: "m", DelayMS: -1})
	fails(e, subjects.CodeMessageNotFound, subjects.OpRetry, "q", subjects.RetryRequest{ID: "nope"})
	fails(e, subjects.CodeInvalidID, subjects.OpRetry, "q", subjects.RetryRequest{})
	fails(e, subjects.CodeQueueNotFound, subjects.OpRetry, "nope", subjects.RetryRequest{ID: "m"})
	e.unchanged(before)

	retried := must[subjects.Message](e, subjects.OpRetry, "q", subjects.RetryRequest{ID: "m", Version: errored.Version})
	if retried.State != subjects.StatePending || retried.Attempts != 0 || retried.AttemptsLeft != 1 ||
		retried.Version != errored.Version+1 || retried.LeaseID != "" || retried.EndedAt != nil {
		t.Fatalf("retried: %+v, want pending, no attempt spent of 1, the next version, no lease, not ended", retried)
	}
	// The same retry sent again (its reply lost) changes nothing.
	before = e.snap()
	if again := must[subjects.Message](e, subjects.OpRetry, "q", subjects.RetryRequest{ID: "m", Version: errored.Version}); again.Version != retried.Version || again.State != subjects.StatePending {
		t.Fatalf("retry sent again: %+v", again)
	}
	// Not finished, it is left as it is whatever the version: this retry, or another, happened.
	if again := must[subjects.Message](e, subjects.OpRetry, "q", subjects.RetryRequest{ID: "m", Version: 999}); again.Version != retried.Version {
		t.Fatalf("retry of a pending message at another version: %+v", again)
	}
	e.unchanged(before)

	// Past the retention of the errored message, the pending one is still there, and runs.
	e.advance(2 * time.Second)
	if got := e.get("q", "m"); got.State != subjects.StatePending {
		t.Fatalf("after the errored message's retention: %s, want pending", got.State)
	}
	m = e.dequeueOne("q")
	if m.ID != "m" || m.Attempts != 1 || string(m.PayloadBytes()) != "x" || m.Metadata["k"] != "v" {
		t.Fatalf("retried message dequeued as %+v", m)
	}
	// Leased since: a retry is left as it is, with or without the errored version.
	for _, v := range []uint64{errored.Version, 0} {
		if got := must[subjects.Message](e, subjects.OpRetry, "q", subjects.RetryRequest{ID: "m", Version: v}); got.State != subjects.StateRunning || got.LeaseID != m.LeaseID {
			t.Fatalf("retry at version %d of a running message: %+v, want it left running under its lease", v, got)
		}
	}
	// The lease before the retry is no longer the message's.
	fails(e, subjects.CodeLeaseMismatch, subjects.OpComplete, "q", subjects.LeaseRequest{ID: "m", LeaseID: errored.LeaseID})
	done := must[subjects.Message](e, subjects.OpComplete, "q", subjects.LeaseRequest{ID: "m", LeaseID: m.LeaseID})
	fails(e, subjects.CodeInvalidState, subjects.OpRetry, "q", subjects.RetryRequest{ID: "m", Version: done.Version})

	checkHistory(t, e.history("q", "m"), []step{
		{subjects.EventEnqueued, subjects.StatePending, ""},
		{subjects.EventLeased, subjects.StateRunning, ""},
		{subjects.EventErrored, subjects.StateErrored, subjects.ReasonReleased},
		{subjects.EventRetried, subjects.StatePending, ""},
		{subjects.EventLeased, subjects.StateRunning, ""},
		{subjects.EventCompleted, subjects.StateCompleted, ""},
	})

	// A canceled message, retried for later: invisible, then pending.
	e.enqueue("q", subjects.EnqueueRequest{ID: "c", Payload: "y"})
	must[subjects.Message](e, subjects.OpCancel, "q", subjects.LeaseRequest{ID: "c"})
	later := must[subjects.Message](e, subjects.OpRetry, "q", subjects.RetryRequest{ID: "c", DelayMS: 500})
	if later.State != subjects.StateInvisible || later.VisibleAt.Sub(later.UpdatedAt) != 500*time.Millisecond {
		t.Fatalf("retried with delay_ms 500: %+v", later)
	}
	e.advance(500 * time.Millisecond)
	if got := e.get("q", "c"); got.State != subjects.StatePending {
		t.Fatalf("after its delay: %s, want pending", got.State)
	}
	st := must[subjects.StatsReply](e, subjects.OpStats, "q", subjects.StatsRequest{})
	if st.Totals.Retried != 2 {
		t.Errorf("stats: %d retried, want 2", st.Totals.Retried)
	}
}

// TestRetryAcrossARestart: a retried message is stored as pending, with its attempts anew.
func TestRetryAcrossARestart(t *testing.T) {
	e := setup(t)
	e.create("q", subjects.CreateQueueRequest{MaxAttempts: 1})
	e.enqueue("q", subjects.EnqueueRequest{ID: "m", Payload: "x"})
	m := e.dequeueOne("q")
	must[subjects.Message](e, subjects.OpRelease, "q", subjects.ReleaseRequest{ID: "m", LeaseID: m.LeaseID})
	retried := must[subjects.Message](e, subjects.OpRetry, "q", subjects.RetryRequest{ID: "m"})
	e.restartBroker()
	if got := e.get("q", "m"); got.State != subjects.StatePending || got.Attempts != 0 || got.Version != retried.Version {
		t.Fatalf("after a restart: %+v, want pending at version %d with no attempt spent", got, retried.Version)
	}
	if m := e.dequeueOne("q"); m.ID != "m" {
		t.Fatalf("dequeued %s after the restart, want m", m.ID)
	}
}

// TestReleaseRefund: a release with refund gives the lease's attempt back: on a queue of one
// attempt the message is pending again, not errored, and its history counts no failure. Sent again
// it writes nothing; without refund the attempt stays spent.
func TestReleaseRefund(t *testing.T) {
	e := setup(t)
	e.create("q", subjects.CreateQueueRequest{MaxAttempts: 1})
	e.enqueue("q", subjects.EnqueueRequest{ID: "m", Payload: "x"})
	m := e.dequeueOne("q")
	r := must[subjects.Message](e, subjects.OpRelease, "q", subjects.ReleaseRequest{ID: "m", LeaseID: m.LeaseID, Refund: true, Error: "not run"})
	if r.State != subjects.StatePending || r.Attempts != 0 || r.AttemptsLeft != 1 {
		t.Fatalf("released with refund: %+v, want pending with its one attempt left", r)
	}
	before := e.snap()
	if again := must[subjects.Message](e, subjects.OpRelease, "q", subjects.ReleaseRequest{ID: "m", LeaseID: m.LeaseID, Refund: true}); again.Version != r.Version {
		t.Fatalf("the release sent again: version %d, want %d", again.Version, r.Version)
	}
	e.unchanged(before)
	h := e.history("q", "m")
	checkHistory(t, h, []step{
		{subjects.EventEnqueued, subjects.StatePending, ""},
		{subjects.EventLeased, subjects.StateRunning, ""},
		{subjects.EventReleased, subjects.StatePending, subjects.ReasonRefunded},
	})
	if h.Failures != 0 || h.Events[2].Error != "not run" || h.Events[2].Attempts != 0 {
		t.Errorf("history: %d failures, released event %+v; want none, the error, attempts 0", h.Failures, h.Events[2])
	}
	// Its one attempt is real: released without refund, it is errored.
	m = e.dequeueOne("q")
	if r := must[subjects.Message](e, subjects.OpRelease, "q", subjects.ReleaseRequest{ID: "m", LeaseID: m.LeaseID}); r.State != subjects.StateErrored {
		t.Fatalf("released without refund on its last attempt: %s, want errored", r.State)
	}
}
