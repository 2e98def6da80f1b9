package broker

import (
	"context"
	"testing"
	"time"

	"github.com/natstone/natstone/kv"
	"github.com/natstone/natstone/subjects"
)

// TestLeasesAtAStopReachTheirWorker: a dequeue that leases messages as the broker begins to stop
// (its cancel of the requests under way, before it closes their queues) hands them over with their
// payloads. It used to read the payloads on the cancelled ctx and answer unavailable, leaving its
// leases to run out unseen, each spending an attempt: on a queue of max_attempts 1 a deploy could
// so error a message no worker ever saw.
func TestLeasesAtAStopReachTheirWorker(t *testing.T) {
	b, _, q := internalQueue(t, subjects.CreateQueueRequest{})
	if _, err := q.enqueue(context.Background(), []subjects.EnqueueRequest{{ID: "a", Payload: "pay-a"}, {ID: "b", Payload: "pay-b"}}); err != nil {
		t.Fatal(err)
	}
	q.testLeasing = b.cancel                                  // what Stop does first to the requests under way
	ctx, cancel := context.WithTimeout(b.ctx, requestTimeout) // a request's ctx, as dispatch makes it
	defer cancel()
	ms, err := q.dequeue(ctx, subjects.DequeueRequest{Batch: 2})
	if err != nil {
		t.Fatalf("a dequeue at the stop: %v", err)
	}
	if len(ms) != 2 {
		t.Fatalf("a dequeue at the stop leased %d messages, want 2", len(ms))
	}
	for i, want := range []string{"pay-a", "pay-b"} {
		m := ms[i]
		if got := string(m.PayloadBytes()); m.State != subjects.StateRunning || got != want {
			t.Errorf("message %d: %s with payload %q, want running with %q", i, m.State, got, want)
		}
	}
}

// TestLeasesAReplyWentWithoutGivenBack: a dequeue of two, one of whose lease writes has an outcome
// still unknown when it answers, answers with the other. Once that write turns out to have landed,
// its lease is given back, its attempt refunded: no reply carried it, so it used to run nowhere
// until it ran out, spending the attempt. A retry of the dequeue with its request id (its reply
// lost) still gets the lease the reply carried, and leases nothing more.
func TestLeasesAReplyWentWithoutGivenBack(t *testing.T) {
	for _, requestID := range []string{"", "r1"} {
		t.Run("request_id="+requestID, func(t *testing.T) {
			b, _, q := internalQueue(t, subjects.CreateQueueRequest{})
			ctx := context.Background()
			one, two, three := int64(1), int64(2), int64(3)
			if _, err := q.enqueue(ctx, []subjects.EnqueueRequest{{ID: "A", Priority: &one}, {ID: "B", Priority: &two}, {ID: "C", Priority: &three}}); err != nil {
				t.Fatal(err)
			}
			gaveBack := make(chan struct{}, 1)
			q.mu.Lock()
			a := q.entries.get("A")
			stored := a.rev
			// A's lease write expects a revision storage never had: it conflicts, and the read
			// back finds an older one, as from a server behind, which leaves its outcome unknown.
			a.rev = stored + 3
			q.testGaveBack = func() { gaveBack <- struct{}{} }
			q.mu.Unlock()
			ms, err := q.dequeue(ctx, subjects.DequeueRequest{Batch: 2, RequestID: requestID})
			if err != nil {
				t.Fatal(err)
			}
			if len(ms) != 1 || ms[0].ID != "B" {
				t.Fatalf("dequeue of two with A's write in doubt: %+v, want B alone", ms)
			}
			q.mu.Lock()
			var lease *kv.Record
			for _, c := range q.doubtful {
				if c.e.ID == "A" {
					lease = &c.next
				}
			}
			q.mu.Unlock()
			if lease == nil {
				t.Fatal("A's lease write is not in doubt: the test tests nothing")
			}
			// Storage took A's lease after all, past the revision the broker expects.
			rev := stored
			for range 4 {
				if rev, err = b.store.WriteMessage("q", lease, rev).Wait(ctx); err != nil {
					t.Fatal(err)
				}
			}
			q.fireDoubt()
			waitOn(t, gaveBack)
			r, _, err := b.store.GetMessage(ctx, "q", "A")
			if err != nil {
				t.Fatal(err)
			}
			if r.State != subjects.StatePending || r.Attempts != 0 || !r.Released || r.LeaseID != lease.LeaseID {
				t.Errorf("A once its lease landed: %s, %d attempts, released %v, lease %q; want pending, released from lease %s, its attempt refunded", r.State, r.Attempts, r.Released, r.LeaseID, lease.LeaseID)
			}
			if r, _, err := b.store.GetMessage(ctx, "q", "B"); err != nil || r.State != subjects.StateRunning || r.LeaseID != ms[0].LeaseID {
				t.Errorf("B, which the reply carried: %+v, %v; want it running under lease %s", r, err, ms[0].LeaseID)
			}
			if requestID == "" {
				return
			}
			// The reply may have been lost: a retry with its request id gets B again, and leases
			// nothing more.
			again, err := q.dequeue(ctx, subjects.DequeueRequest{Batch: 2, RequestID: requestID})
			if err != nil || len(again) != 1 || again[0].ID != "B" || again[0].LeaseID != ms[0].LeaseID {
				t.Errorf("retry of the dequeue: %+v, %v; want B again, under lease %s", again, err, ms[0].LeaseID)
			}
			if r, _, err := b.store.GetMessage(ctx, "q", "C"); err != nil || r.State != subjects.StatePending {
				t.Errorf("C after the retry: %+v, %v; want it pending", r, err)
			}
		})
	}
}

// TestRequestIDsForgottenWithoutADequeue: the record of a dequeue's request id is forgotten once its
// time is up although no dequeue of the queue comes after it. Dequeues forget the records whose
// time is up as they come; a queue whose workers stopped used to keep its last RequestIDWindow of
// records, and the entries they point to, for good (a soak saw 16 MB of heap held so).
func TestRequestIDsForgottenWithoutADequeue(t *testing.T) {
	_, clk, q := internalQueue(t, subjects.CreateQueueRequest{})
	ctx := context.Background()
	if _, err := q.enqueue(ctx, []subjects.EnqueueRequest{{ID: "A"}}); err != nil {
		t.Fatal(err)
	}
	day := (24 * time.Hour).Milliseconds() // its lease outlasts the window: its end forgets nothing
	if ms, err := q.dequeue(ctx, subjects.DequeueRequest{RequestID: "r1", LeaseMS: day}); err != nil || len(ms) != 1 {
		t.Fatalf("dequeue: %+v, %v", ms, err)
	}
	remembered := func() int {
		q.mu.Lock()
		defer q.mu.Unlock()
		return len(q.requests) + len(q.reqEnds)
	}
	if n := remembered(); n != 2 {
		t.Fatalf("%d records and ends after the dequeue, want the dequeue's: the test tests nothing", n)
	}
	clk.Advance(RequestIDWindow - time.Second)
	if n := remembered(); n != 2 {
		t.Fatalf("the dequeue's request id forgotten within its window (%d left)", n)
	}
	clk.Advance(time.Second + 2*reqSweepGapMS*time.Millisecond)
	if n := remembered(); n != 0 {
		t.Fatalf("the dequeue's request id still remembered past its window, no dequeue since (%d left)", n)
	}
}

// TestRequestIDsForgottenInTheirOrder: the sweep armed for a dequeue's request id, 5 minutes
// ahead, is armed again for an abandon of an id no dequeue brought, remembered 30 seconds: it is
// forgotten then, not at the dequeue's end.
func TestRequestIDsForgottenInTheirOrder(t *testing.T) {
	_, clk, q := internalQueue(t, subjects.CreateQueueRequest{})
	ctx := context.Background()
	if _, err := q.enqueue(ctx, []subjects.EnqueueRequest{{ID: "A"}}); err != nil {
		t.Fatal(err)
	}
	day := (24 * time.Hour).Milliseconds()
	if ms, err := q.dequeue(ctx, subjects.DequeueRequest{RequestID: "r1", LeaseMS: day}); err != nil || len(ms) != 1 {
		t.Fatalf("dequeue: %+v, %v", ms, err)
	}
	if _, err := q.abandon(ctx, subjects.AbandonRequest{RequestID: "x"}); err != nil {
		t.Fatal(err)
	}
	remembered := func(id string) bool {
		q.mu.Lock()
		defer q.mu.Unlock()
		return q.requests[id] != nil
	}
	if !remembered("x") || !remembered("r1") {
		t.Fatal("the abandon or the dequeue is not remembered: the test tests nothing")
	}
	clk.Advance(time.Minute)
	if remembered("x") {
		t.Errorf("the abandon of an unknown id remembered a minute on, no dequeue since")
	}
	if !remembered("r1") {
		t.Errorf("the dequeue's request id forgotten within its window")
	}
}
