package broker_test

import (
	"slices"
	"strings"
	"testing"
	"time"

	"github.com/natstone/natstone/broker"
	"github.com/natstone/natstone/subjects"
)

// abandon abandons the dequeue of queue with request id id, and returns the ids it gave back.
func (e *env) abandon(queue, id string) []string {
	e.t.Helper()
	r := must[subjects.AbandonReply](e, subjects.OpAbandon, queue, subjects.AbandonRequest{RequestID: id})
	if r.RequestID != id || r.Released == nil {
		e.t.Fatalf("abandon %s: %+v, want its request id and a list of what it gave back", id, r)
	}
	return r.Released
}

// TestAbandonEndsAWaitingPoll: a long poll whose requester gave up (a worker stopping) ends at once
// when its request id is abandoned, empty; a message enqueued after is not leased to it, nor to a
// dequeue with the id sent again, but to the next dequeue.
func TestAbandonEndsAWaitingPoll(t *testing.T) {
	t.Parallel()
	e := setup(t)
	e.create("q", subjects.CreateQueueRequest{})
	got := e.asyncDequeue("q", subjects.DequeueRequest{WaitMS: 60_000, RequestID: "poll-1"})
	e.waitTimers(1) // the poll is parked
	if released := e.abandon("q", "poll-1"); len(released) != 0 {
		t.Fatalf("abandoning a waiting poll gave back %v", released)
	}
	if ms := receive(t, got); len(ms) != 0 {
		t.Fatalf("the abandoned poll got %v", ids(ms))
	}
	e.enqueue("q", subjects.EnqueueRequest{ID: "a"})
	if ms := e.dequeue("q", subjects.DequeueRequest{RequestID: "poll-1"}); len(ms) != 0 {
		t.Fatalf("a dequeue with the abandoned id leased %v", ids(ms))
	}
	if c := e.depth("q", nil); c.Pending != 1 || c.Running != 0 {
		t.Fatalf("depth after the abandon: %+v, want a pending", c)
	}
	if m := e.dequeueOne("q"); m.ID != "a" || m.Attempts != 1 {
		t.Fatalf("the next dequeue got %s at attempt %d, want a at its first", m.ID, m.Attempts)
	}
}

// TestAbandonGivesBackWhatTheDequeueLeased: the leases a dequeue took whose reply its requester
// did not take are released by its abandon, with their attempts given back (a queue of one attempt
// does not error them); abandoning again answers the same and writes nothing; and the id leases
// nothing more.
func TestAbandonGivesBackWhatTheDequeueLeased(t *testing.T) {
	t.Parallel()
	e := setup(t)
	e.create("q", subjects.CreateQueueRequest{MaxAttempts: 1})
	e.enqueueInOrder("q", "a", "b", "c")
	taken := e.dequeue("q", subjects.DequeueRequest{Batch: 2, RequestID: "r"})
	if !slices.Equal(ids(taken), []string{"a", "b"}) {
		t.Fatalf("dequeued %v", ids(taken))
	}
	if released := e.abandon("q", "r"); !slices.Equal(released, []string{"a", "b"}) {
		t.Fatalf("the abandon gave back %v, want [a b]", released)
	}
	versions := map[string]uint64{}
	for _, id := range []string{"a", "b"} {
		m := e.get("q", id)
		if m.State != subjects.StatePending || m.Attempts != 0 {
			t.Fatalf("%s after the abandon: %s at %d attempts, want pending with its attempt given back", id, m.State, m.Attempts)
		}
		versions[id] = m.Version
	}
	if released := e.abandon("q", "r"); !slices.Equal(released, []string{"a", "b"}) {
		t.Fatalf("the abandon again answered %v, want [a b]", released)
	}
	for id, v := range versions {
		if m := e.get("q", id); m.Version != v {
			t.Fatalf("the abandon again wrote %s: version %d, was %d", id, m.Version, v)
		}
	}
	if ms := e.dequeue("q", subjects.DequeueRequest{Batch: 3, RequestID: "r"}); len(ms) != 0 {
		t.Fatalf("a dequeue with the abandoned id got %v", ids(ms))
	}
	// The abandoned leases are no one's: their holder's complete is refused.
	fails(e, subjects.CodeInvalidState, subjects.OpComplete, "q", subjects.LeaseRequest{ID: "a", LeaseID: taken[0].LeaseID})
	if got := ids(e.dequeue("q", subjects.DequeueRequest{Batch: 3})); !slices.Equal(got, []string{"a", "b", "c"}) {
		t.Fatalf("the next dequeue got %v, want [a b c]", got)
	}
}

// TestAbandonBeforeItsDequeue: each operation has a subscription of its own, so an abandon may be
// read before the dequeue it abandons: that dequeue then leases nothing.
func TestAbandonBeforeItsDequeue(t *testing.T) {
	t.Parallel()
	e := setup(t)
	e.enqueue("q", subjects.EnqueueRequest{ID: "a"})
	if released := e.abandon("q", "early"); len(released) != 0 {
		t.Fatalf("abandoning an id no dequeue sent gave back %v", released)
	}
	if ms := e.dequeue("q", subjects.DequeueRequest{RequestID: "early", WaitMS: 60_000}); len(ms) != 0 {
		t.Fatalf("the dequeue after its abandon got %v", ids(ms))
	}
	if c := e.depth("q", nil); c.Pending != 1 {
		t.Fatalf("depth %+v, want a pending", c)
	}
	// An id no dequeue brought is remembered for AbandonedIDWindow only: then it leases again.
	e.abandon("q", "later")
	e.advance(broker.AbandonedIDWindow - time.Millisecond)
	if ms := e.dequeue("q", subjects.DequeueRequest{RequestID: "later"}); len(ms) != 0 {
		t.Fatalf("a dequeue within the window of its abandon got %v", ids(ms))
	}
	e.advance(2 * time.Millisecond)
	if got := ids(e.dequeue("q", subjects.DequeueRequest{RequestID: "later"})); !slices.Equal(got, []string{"a"}) {
		t.Fatalf("a dequeue past the window of its abandon got %v, want [a]", got)
	}
}

// TestAbandonLeavesUsedLeases: a lease its holder used (here, completed) had its reply: the
// abandon of its dequeue leaves it.
func TestAbandonLeavesUsedLeases(t *testing.T) {
	t.Parallel()
	e := setup(t)
	e.enqueueInOrder("q", "a")
	a := e.dequeue("q", subjects.DequeueRequest{RequestID: "r"})[0]
	must[subjects.Message](e, subjects.OpComplete, "q", subjects.LeaseRequest{ID: "a", LeaseID: a.LeaseID})
	if released := e.abandon("q", "r"); len(released) != 0 {
		t.Fatalf("the abandon gave back %v", released)
	}
	if m := e.get("q", "a"); m.State != subjects.StateCompleted {
		t.Fatalf("a after the abandon: %s, want completed", m.State)
	}
}

// TestAbandonBadRequests: an abandon without a request id, with a bad one, with an unknown field
// or of a queue that does not exist is refused, and makes nothing (no queue).
func TestAbandonBadRequests(t *testing.T) {
	t.Parallel()
	e := setup(t)
	e.create("q", subjects.CreateQueueRequest{})
	fails(e, subjects.CodeBadRequest, subjects.OpAbandon, "q", subjects.AbandonRequest{})
	fails(e, subjects.CodeBadRequest, subjects.OpAbandon, "q", subjects.AbandonRequest{RequestID: strings.Repeat("r", subjects.MaxRequestIDLen+1)})
	fails(e, subjects.CodeBadRequest, subjects.OpAbandon, "q", map[string]any{"request_id": "r", "wait_ms": 1})
	fails(e, subjects.CodeQueueNotFound, subjects.OpAbandon, "nope", subjects.AbandonRequest{RequestID: "r"})
	fails(e, subjects.CodeQueueNotFound, subjects.OpInfo, "nope", nil)
	// The refused abandons remembered nothing: the id still leases.
	e.enqueue("q", subjects.EnqueueRequest{ID: "a"})
	if got := ids(e.dequeue("q", subjects.DequeueRequest{RequestID: "r"})); !slices.Equal(got, []string{"a"}) {
		t.Fatalf("a dequeue with the id of a refused abandon got %v, want [a]", got)
	}
}

// TestAbandonFreesTheSlots: what an abandon gives back frees what its lease held: the value of an
// exclusive queue, and a place under max_running.
func TestAbandonFreesTheSlots(t *testing.T) {
	t.Parallel()
	e := setup(t)
	e.create("x", subjects.CreateQueueRequest{Type: subjects.Exclusive, ExclusivityKey: "p", MaxRunning: 1})
	e.enqueue("x", subjects.EnqueueRequest{ID: "a1", Priority: ptr[int64](1), Metadata: map[string]string{"p": "a"}})
	e.enqueue("x", subjects.EnqueueRequest{ID: "a2", Priority: ptr[int64](2), Metadata: map[string]string{"p": "a"}})
	if got := ids(e.dequeue("x", subjects.DequeueRequest{RequestID: "r"})); !slices.Equal(got, []string{"a1"}) {
		t.Fatalf("dequeued %v, want [a1]", got)
	}
	if ms := e.dequeue("x", subjects.DequeueRequest{}); len(ms) != 0 {
		t.Fatalf("a second dequeue while a1 runs got %v", ids(ms))
	}
	if released := e.abandon("x", "r"); !slices.Equal(released, []string{"a1"}) {
		t.Fatalf("the abandon gave back %v, want [a1]", released)
	}
	if got := ids(e.dequeue("x", subjects.DequeueRequest{})); !slices.Equal(got, []string{"a1"}) {
		t.Fatalf("the dequeue after the abandon got %v, want a1: value a and the queue's one place free again", got)
	}
}

// TestAbandonNearTheWindowsEnd: an abandon near the end of its id's window still marks the id for
// AbandonedIDWindow from the abandon.
func TestAbandonNearTheWindowsEnd(t *testing.T) {
	t.Parallel()
	e := setup(t)
	e.create("q", subjects.CreateQueueRequest{LeaseMS: 3_600_000})
	e.enqueueInOrder("q", "a")
	e.dequeue("q", subjects.DequeueRequest{RequestID: "r"})
	e.advance(broker.RequestIDWindow - 10*time.Second)
	if released := e.abandon("q", "r"); !slices.Equal(released, []string{"a"}) {
		t.Fatalf("the abandon gave back %v, want [a]", released)
	}
	e.advance(20 * time.Second) // past the window of the dequeue, within the abandon's
	if ms := e.dequeue("q", subjects.DequeueRequest{RequestID: "r"}); len(ms) != 0 {
		t.Fatalf("a dequeue with the id %v after its abandon got %v", 20*time.Second, ids(ms))
	}
	e.advance(broker.AbandonedIDWindow)
	if got := ids(e.dequeue("q", subjects.DequeueRequest{RequestID: "r"})); !slices.Equal(got, []string{"a"}) {
		t.Fatalf("a dequeue with the id past the abandon's window got %v, want [a]", got)
	}
}
