package broker

import (
	"context"
	"encoding/json"
	"testing"
	"time"

	"github.com/nats-io/nats.go"

	"github.com/natstone/natstone/subjects"
)

// TestAReplayedLeaseIsNotGivenBack: a lease can go out in two replies, a dequeue's and its retry's
// with the same request id. When the first reaches nobody (its requester gave up on it, and retried
// from another inbox) and the retry's reaches its requester, the lease is kept: given back, it
// would be leased to another worker while the retry's requester runs the message. So it is when
// the retry's requester extended the lease before the first's status is read; and when it did not,
// a further retry with the id still gets the lease (the give back forgot nothing).
func TestAReplayedLeaseIsNotGivenBack(t *testing.T) {
	t.Parallel()
	for _, extend := range []bool{true, false} {
		t.Run(map[bool]string{true: "extended", false: "retried again"}[extend], func(t *testing.T) {
			t.Parallel()
			replayedLeaseKept(t, extend)
		})
	}
}

func replayedLeaseKept(t *testing.T, extend bool) {
	b, _, q := internalQueue(t, subjects.CreateQueueRequest{LeaseMS: 600_000})
	connect := func() *nats.Conn {
		nc, err := nats.Connect(b.cfg.Conn.ConnectedUrl())
		if err != nil {
			t.Fatal(err)
		}
		t.Cleanup(nc.Close)
		return nc
	}
	retrying := make(chan struct{})
	q.mu.Lock()
	q.testRetryWaits = func() { close(retrying) }
	q.mu.Unlock()
	proceed := make(chan struct{})
	gaveBack := make(chan struct{}, 1)
	b.unheard.mu.Lock()
	b.unheard.hearing = func() { <-proceed } // the first's status read once the retry has its lease
	b.unheard.gaveBack = func() { gaveBack <- struct{}{} }
	b.unheard.mu.Unlock()

	poll := []byte(`{"wait_ms": 60000, "request_id": "r"}`)
	dequeue := b.space.Subject(subjects.OpDequeue, "q")
	gone := connect()
	if err := gone.PublishRequest(dequeue, gone.NewInbox(), poll); err != nil { // nothing listens
		t.Fatal(err)
	}
	if err := gone.Flush(); err != nil {
		t.Fatal(err)
	}
	live := connect()
	retry := func() <-chan subjects.DequeueReply {
		replied := make(chan subjects.DequeueReply, 1)
		go func() {
			m, err := live.Request(dequeue, poll, 30*time.Second)
			if err != nil {
				t.Error(err)
				return
			}
			var reply subjects.DequeueReply
			if err := json.Unmarshal(m.Data, &reply); err != nil {
				t.Error(err)
			}
			replied <- reply
		}()
		return replied
	}
	replied := retry()
	select {
	case <-retrying: // the retry waits for the first dequeue with its id, which long-polls
	case <-time.After(10 * time.Second):
		t.Fatal("the retry did not wait for the first dequeue")
	}
	if _, err := q.enqueue(context.Background(), []subjects.EnqueueRequest{{ID: "a"}}); err != nil {
		t.Fatal(err)
	}
	var reply subjects.DequeueReply
	select {
	case reply = <-replied:
		if len(reply.Messages) != 1 {
			t.Fatalf("the retry's reply %+v, want a", reply)
		}
	case <-time.After(10 * time.Second):
		t.Fatal("no reply to the retry")
	}
	a := reply.Messages[0]
	if extend {
		if _, err := q.extend(context.Background(), subjects.ExtendRequest{ID: a.ID, LeaseID: a.LeaseID, LeaseMS: 600_000}); err != nil {
			t.Fatal(err)
		}
	}
	close(proceed)
	select {
	case <-gaveBack:
	case <-time.After(10 * time.Second):
		t.Fatal("the first reply, which reached nobody, was not heard of")
	}
	if !extend {
		if _, err := q.enqueue(context.Background(), []subjects.EnqueueRequest{{ID: "b"}}); err != nil {
			t.Fatal(err)
		}
		select {
		case again := <-retry():
			if len(again.Messages) != 1 || again.Messages[0].LeaseID != a.LeaseID {
				t.Fatalf("a further retry got %+v, want a's lease %s again", again.Messages, a.LeaseID)
			}
		case <-time.After(10 * time.Second):
			t.Fatal("no reply to the further retry")
		}
	}
	if _, err := q.complete(context.Background(), subjects.LeaseRequest{ID: a.ID, LeaseID: a.LeaseID}); err != nil {
		t.Fatalf("the retry's lease of a, after the first reply reached nobody: %v", err)
	}
}

// TestReplayLeavesOutLeasesEndedMeanwhile: a retry finds the first dequeue's leases held under the
// queue's lock, then lets go of it to read their payloads. A lease that ends in between, its
// message leased again, is left out of the retry's reply: it would otherwise go out with the new
// holder's lease, which two requesters would then hold.
func TestReplayLeavesOutLeasesEndedMeanwhile(t *testing.T) {
	t.Parallel()
	ctx := context.Background()
	_, _, q := internalQueue(t, subjects.CreateQueueRequest{LeaseMS: 600_000})
	if _, err := q.enqueue(ctx, []subjects.EnqueueRequest{{ID: "a"}}); err != nil {
		t.Fatal(err)
	}
	ms, err := q.dequeue(ctx, subjects.DequeueRequest{RequestID: "r"})
	if err != nil || len(ms) != 1 {
		t.Fatal(ms, err)
	}
	q.mu.Lock()
	prior := q.requests["r"]
	q.mu.Unlock()
	held, err := q.heldBy(ctx, prior) // the retry's check
	if err != nil || len(held) != 1 {
		t.Fatal(held, err)
	}
	// Between the check and the payloads, the lease ends (a release, as an expiry would) and
	// another dequeue leases a.
	if _, err := q.release(ctx, subjects.ReleaseRequest{ID: "a", LeaseID: ms[0].LeaseID}); err != nil {
		t.Fatal(err)
	}
	other, err := q.dequeue(ctx, subjects.DequeueRequest{})
	if err != nil || len(other) != 1 {
		t.Fatal(other, err)
	}
	views, err := q.withPayloads(ctx, held)
	if err != nil {
		t.Fatal(err)
	}
	if len(views) != 0 {
		t.Fatalf("the retry's reply carries %s with lease %s (the other dequeue's: %s), want nothing", views[0].ID, views[0].LeaseID, other[0].LeaseID)
	}
}
