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
// the retry's requester extended the lease before the first's status is read.
func TestAReplayedLeaseIsNotGivenBack(t *testing.T) {
	t.Parallel()
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
	extended := make(chan struct{})
	gaveBack := make(chan struct{}, 1)
	b.unheard.mu.Lock()
	b.unheard.hearing = func() { <-extended } // the first's status read once the retry's lease is extended
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
	retried := make(chan *nats.Msg, 1)
	go func() {
		m, err := live.Request(dequeue, poll, 30*time.Second)
		if err != nil {
			t.Error(err)
			return
		}
		retried <- m
	}()
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
	case m := <-retried:
		if err := json.Unmarshal(m.Data, &reply); err != nil || len(reply.Messages) != 1 {
			t.Fatalf("the retry's reply %s: %v", m.Data, err)
		}
	case <-time.After(10 * time.Second):
		t.Fatal("no reply to the retry")
	}
	a := reply.Messages[0]
	if _, err := q.extend(context.Background(), subjects.ExtendRequest{ID: a.ID, LeaseID: a.LeaseID, LeaseMS: 600_000}); err != nil {
		t.Fatal(err)
	}
	close(extended)
	select {
	case <-gaveBack:
	case <-time.After(10 * time.Second):
		t.Fatal("the first reply, which reached nobody, was not heard of")
	}
	if _, err := q.complete(context.Background(), subjects.LeaseRequest{ID: a.ID, LeaseID: a.LeaseID}); err != nil {
		t.Fatalf("the retry's lease of a, after the first reply reached nobody: %v", err)
	}
}
