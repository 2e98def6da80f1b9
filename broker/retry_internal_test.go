package broker

import (
	"context"
	"errors"
	"testing"

	"github.com/nats-io/nats.go/jetstream"

	"github.com/natstone/natstone/subjects"
)

// TestRetryRefusedOnceCollectionBegan: a finished message whose collection began (its payload
// deleted, its record's removal failed: it is collected again later) is not retried. It used to go
// back to pending without a payload: out of the collection for good, failing every dequeue that
// picked it, the other messages of such a batch leased unseen, and dropped at the next start anyway.
func TestRetryRefusedOnceCollectionBegan(t *testing.T) {
	b, _, q := internalQueue(t, subjects.CreateQueueRequest{})
	ctx := context.Background()
	if _, err := q.enqueue(ctx, []subjects.EnqueueRequest{{ID: "a", Payload: "pa"}, {ID: "b", Payload: "pb"}}); err != nil {
		t.Fatal(err)
	}
	if _, err := q.cancel(ctx, subjects.LeaseRequest{ID: "a"}); err != nil {
		t.Fatal(err)
	}
	js, err := jetstream.New(b.cfg.Conn)
	if err != nil {
		t.Fatal(err)
	}
	stream, err := js.Stream(ctx, "KV_natstone-messages")
	if err != nil {
		t.Fatal(err)
	}
	cfg := stream.CachedInfo().Config
	setMaxMsgSize := func(n int32) {
		c := cfg
		c.MaxMsgSize = n
		if _, err := js.UpdateStream(ctx, c); err != nil {
			t.Fatal(err)
		}
	}
	// The record's removal, a stored write, is refused: the payload is deleted, the record stays.
	q.testCollected = func() { setMaxMsgSize(1) }
	q.mu.Lock()
	e := q.entries.get("a")
	q.collect([]*entry{e})
	q.testCollected = nil
	stayed := q.entries.get("a") == e
	q.mu.Unlock()
	setMaxMsgSize(cfg.MaxMsgSize)
	if !stayed {
		t.Fatal("the collection removed the record it was to fail to remove")
	}

	_, err = q.retry(ctx, subjects.RetryRequest{ID: "a"})
	if !errors.Is(err, &subjects.Error{Code: subjects.CodeMessageNotFound}) {
		t.Fatalf("retry once the collection began: %v, want message_not_found", err)
	}
	ms, err := q.dequeue(ctx, subjects.DequeueRequest{Batch: 2})
	if err != nil || len(ms) != 1 || ms[0].ID != "b" {
		t.Fatalf("dequeue: %v, %v; want b alone", ms, err)
	}
}
