package broker

import (
	"context"
	"testing"

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
