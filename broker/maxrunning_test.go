package broker_test

import (
	"slices"
	"testing"
	"time"

	"github.com/natstone/natstone/subjects"
)

// TestMaxRunning: a queue with max_running leases no more than that many messages at once, in a
// batch or across dequeues; a message leaving running (completed, its lease run out) makes room,
// which a parked long poll gets; raising the limit serves a parked poll at once, lowering it below
// what runs leases nothing until enough have ended, and 0 lifts it. The limit and what runs survive
// a restart.
func TestMaxRunning(t *testing.T) {
	t.Parallel()
	e := setup(t)
	info := e.create("q", subjects.CreateQueueRequest{MaxRunning: 2, LeaseMS: time.Minute.Milliseconds()})
	if info.Config.MaxRunning != 2 {
		t.Fatalf("created with %+v, want max_running 2", info.Config)
	}
	e.enqueueInOrder("q", "a", "b", "c", "d", "e", "f")

	if got := ids(e.dequeue("q", subjects.DequeueRequest{Batch: 5})); !slices.Equal(got, []string{"a", "b"}) {
		t.Fatalf("a batch of 5 under max_running 2 leased %v, want a, b", got)
	}
	if got := e.dequeue("q", subjects.DequeueRequest{}); len(got) != 0 {
		t.Fatalf("a dequeue with 2 running leased %v", ids(got))
	}

	// A parked poll gets the room a complete makes.
	polled := e.asyncDequeue("q", subjects.DequeueRequest{WaitMS: 60_000, Batch: 3})
	e.waitTimers(2) // the leases' timer, and the poll's
	a := e.get("q", "a")
	must[subjects.Message](e, subjects.OpComplete, "q", subjects.LeaseRequest{ID: "a", LeaseID: a.LeaseID})
	if got := ids(receive(t, polled)); !slices.Equal(got, []string{"c"}) {
		t.Fatalf("the parked poll got %v after a completed, want c alone", got)
	}

	// Two parked polls, room for one: one gets it, the other waits on.
	timers := e.clk.Pending() // the leases' and a's collection's: the polls are parked once theirs are armed too
	first, second := e.asyncDequeue("q", subjects.DequeueRequest{WaitMS: 30_000}), e.asyncDequeue("q", subjects.DequeueRequest{WaitMS: 30_000})
	e.waitTimers(timers + 2)
	b := e.get("q", "b")
	must[subjects.Message](e, subjects.OpComplete, "q", subjects.LeaseRequest{ID: "b", LeaseID: b.LeaseID})
	var served []subjects.Message
	other := second
	select {
	case served = <-first:
	case served = <-second:
		other = first
	case <-time.After(15 * time.Second):
		t.Fatal("no parked poll got the room b made")
	}
	if got := ids(served); !slices.Equal(got, []string{"d"}) || len(e.dequeue("q", subjects.DequeueRequest{})) != 0 {
		t.Fatalf("a parked poll got %v after b completed, want d; and nothing more leased", got)
	}
	e.advance(30 * time.Second) // the other poll gives up
	if got := receive(t, other); len(got) != 0 {
		t.Fatalf("the other poll got %v, with c and d running under max_running 2", ids(got))
	}

	// Leases that run out make room too.
	e.advance(30 * time.Second)
	if got := ids(e.dequeue("q", subjects.DequeueRequest{Batch: 5})); !slices.Equal(got, []string{"c", "d"}) {
		t.Fatalf("after the leases ran out: leased %v, want c, d again", got)
	}

	// Raising the limit serves a parked poll at once.
	timers = e.clk.Pending()
	polled = e.asyncDequeue("q", subjects.DequeueRequest{WaitMS: 60_000, Batch: 3})
	e.waitTimers(timers + 1)
	info = must[subjects.QueueInfo](e, subjects.OpUpdate, "q", subjects.UpdateQueueRequest{MaxRunning: ptr(3)})
	if got := ids(receive(t, polled)); !slices.Equal(got, []string{"e"}) {
		t.Fatalf("the parked poll got %v after max_running 3, want e alone", got)
	}

	// Lowered below what runs: nothing is leased until fewer than the limit run.
	must[subjects.QueueInfo](e, subjects.OpUpdate, "q", subjects.UpdateQueueRequest{MaxRunning: ptr(1)})
	for _, id := range []string{"c", "d"} {
		if got := e.dequeue("q", subjects.DequeueRequest{}); len(got) != 0 {
			t.Fatalf("3 running under max_running 1: leased %v", ids(got))
		}
		m := e.get("q", id)
		must[subjects.Message](e, subjects.OpComplete, "q", subjects.LeaseRequest{ID: id, LeaseID: m.LeaseID})
	}
	if got := e.dequeue("q", subjects.DequeueRequest{}); len(got) != 0 {
		t.Fatalf("1 running under max_running 1: leased %v", ids(got))
	}

	e.restartBroker()
	if d := e.depth("q", nil); d.Running != 1 {
		t.Fatalf("after a restart: %+v, want e running", d)
	}
	if got := e.dequeue("q", subjects.DequeueRequest{}); len(got) != 0 {
		t.Fatalf("after a restart, 1 running under max_running 1: leased %v", ids(got))
	}
	must[subjects.QueueInfo](e, subjects.OpUpdate, "q", subjects.UpdateQueueRequest{MaxRunning: ptr(0)})
	if got := ids(e.dequeue("q", subjects.DequeueRequest{Batch: 5})); !slices.Equal(got, []string{"f"}) {
		t.Fatalf("max_running 0 (no limit): leased %v, want f", got)
	}
}

// TestMaxRunningExclusive: in an exclusive queue max_running bounds the running messages of all
// values together, each value still one at a time.
func TestMaxRunningExclusive(t *testing.T) {
	t.Parallel()
	e := setup(t)
	e.create("x", subjects.CreateQueueRequest{Type: subjects.Exclusive, ExclusivityKey: "p", MaxRunning: 2})
	for i, p := range []string{"p1", "p1", "p2", "p3"} {
		e.enqueue("x", subjects.EnqueueRequest{ID: string(rune('a' + i)), Metadata: subjects.Pairs{"p": p}, Priority: ptr(int64(i))})
	}
	if got := ids(e.dequeue("x", subjects.DequeueRequest{Batch: 4})); !slices.Equal(got, []string{"a", "c"}) {
		t.Fatalf("leased %v, want a (p1) and c (p2): one per value, two in all", got)
	}
	m := e.get("x", "c")
	must[subjects.Message](e, subjects.OpComplete, "x", subjects.LeaseRequest{ID: "c", LeaseID: m.LeaseID})
	if got := ids(e.dequeue("x", subjects.DequeueRequest{Batch: 4})); !slices.Equal(got, []string{"d"}) {
		t.Fatalf("after c completed: leased %v, want d (b waits for p1)", got)
	}
}
