package broker

import (
	"context"
	"testing"

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
// its lease is given back, its attempt refunded: no reply carried it, and nobody asks for it
// again, so it used to run nowhere until it ran out, spending the attempt.
func TestLeasesAReplyWentWithoutGivenBack(t *testing.T) {
	for _, requestID := range []string{"", "r1"} {
		t.Run("request_id="+requestID, func(t *testing.T) {
			b, _, q := internalQueue(t, subjects.CreateQueueRequest{})
			ctx := context.Background()
			one, two := int64(1), int64(2)
			if _, err := q.enqueue(ctx, []subjects.EnqueueRequest{{ID: "A", Priority: &one}, {ID: "B", Priority: &two}}); err != nil {
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
		})
	}
}
