package broker_test

import (
	"context"
	"fmt"
	"sync"
	"testing"
	"time"

	"github.com/natstone/natstone/kv"
	"github.com/natstone/natstone/subjects"
)

// Regression tests for races found in review. Each drives the public API concurrently and checks
// that acknowledged operations stuck.

// TestCancelRacesDequeue: cancels of pending messages while workers dequeue and complete them. A
// cancel in flight once let a dequeue write the same message (and crashed the broker).
func TestCancelRacesDequeue(t *testing.T) {
	t.Parallel()
	e := setup(t)
	const n = 150
	var batch subjects.EnqueueBatchRequest
	for i := range n {
		batch.Messages = append(batch.Messages, subjects.EnqueueRequest{ID: fmt.Sprintf("m%d", i)})
	}
	must[subjects.EnqueueBatchReply](e, subjects.OpEnqueueBatch, "q", batch)

	var mu sync.Mutex
	canceled, completed := map[string]bool{}, map[string]bool{}
	var wg sync.WaitGroup
	for w := range 4 {
		wg.Add(1)
		go func() {
			defer wg.Done()
			nc := e.srv.Connect(t)
			for range n {
				msg, err := nc.Request(e.space.Subject(subjects.OpDequeue, "q"), nil, 10*time.Second)
				if err != nil {
					t.Error(err)
					return
				}
				rep, rerr := decodeReply[subjects.DequeueReply](t, msg)
				if rerr != nil || len(rep.Messages) == 0 {
					return
				}
				m := rep.Messages[0]
				reply, err := nc.Request(e.space.Subject(subjects.OpComplete, "q"), mustJSON(t, subjects.LeaseRequest{ID: m.ID, LeaseID: m.LeaseID}), 10*time.Second)
				if err != nil {
					t.Error(err)
					return
				}
				if _, rerr := decodeReply[subjects.Message](t, reply); rerr == nil {
					mu.Lock()
					completed[m.ID] = true
					mu.Unlock()
				}
			}
			_ = w
		}()
	}
	wg.Add(1)
	go func() {
		defer wg.Done()
		nc := e.srv.Connect(t)
		for i := range n {
			id := fmt.Sprintf("m%d", i)
			reply, err := nc.Request(e.space.Subject(subjects.OpCancel, "q"), mustJSON(t, subjects.LeaseRequest{ID: id}), 10*time.Second)
			if err != nil {
				t.Error(err)
				return
			}
			if _, rerr := decodeReply[subjects.Message](t, reply); rerr == nil {
				mu.Lock()
				canceled[id] = true
				mu.Unlock()
			}
		}
	}()
	wg.Wait()
	for i := range n {
		id := fmt.Sprintf("m%d", i)
		m := e.get("q", id)
		switch {
		case canceled[id] && completed[id]:
			t.Errorf("%s both canceled and completed", id)
		case canceled[id] && m.State != subjects.StateCanceled:
			t.Errorf("%s: cancel acknowledged, but it is %s", id, m.State)
		case completed[id] && m.State != subjects.StateCompleted:
			t.Errorf("%s: complete acknowledged, but it is %s", id, m.State)
		}
	}
	// The broker's memory agrees with storage.
	before := e.depth("q", nil)
	e.restartBroker()
	if after := e.depth("q", nil); after != before {
		t.Fatalf("depth %+v before restart, %+v after", before, after)
	}
}

// TestConcurrentEnqueuesOfOneID: a payload shared by concurrent enqueues of one id was once deleted
// as an orphan by the loser.
func TestConcurrentEnqueuesOfOneID(t *testing.T) {
	t.Parallel()
	e := setup(t)
	var wg sync.WaitGroup
	for c := range 4 {
		wg.Add(1)
		go func() {
			defer wg.Done()
			nc := e.srv.Connect(t)
			for i := range 40 {
				body := mustJSON(t, subjects.EnqueueRequest{ID: fmt.Sprintf("id-%d", i), Payload: fmt.Sprintf("from %d", c)})
				msg, err := nc.Request(e.space.Subject(subjects.OpEnqueue, "q"), body, 10*time.Second)
				if err != nil {
					t.Error(err)
					return
				}
				if _, rerr := decodeReply[subjects.EnqueueReply](t, msg); rerr != nil {
					t.Error(rerr)
				}
			}
		}()
	}
	wg.Wait()
	for i := range 40 {
		if m := e.get("q", fmt.Sprintf("id-%d", i)); m.Payload == nil || len(*m.Payload) == 0 {
			t.Fatalf("id-%d lost its payload: %+v", i, m)
		}
	}
	if c := e.depth("q", nil); c.Pending != 40 {
		t.Fatalf("depth %+v", c)
	}
}

// TestReenqueueAfterCollectionAndDelete: an id enqueued again soon after its message was collected
// (or its queue deleted) gets a new, readable payload.
func TestReenqueueAfterCollectionAndDelete(t *testing.T) {
	t.Parallel()
	e := setup(t)
	e.create("q", subjects.CreateQueueRequest{RetentionMS: ptr[int64](0)})
	e.enqueue("q", subjects.EnqueueRequest{ID: "x", Payload: "one"})
	m := e.dequeueOne("q")
	must[subjects.Message](e, subjects.OpComplete, "q", subjects.LeaseRequest{ID: "x", LeaseID: m.LeaseID})
	e.advance(0)
	fails(e, subjects.CodeMessageNotFound, subjects.OpGet, "q", subjects.GetRequest{ID: "x"})
	e.enqueue("q", subjects.EnqueueRequest{ID: "x", Payload: "two"})
	if m := e.dequeueOne("q"); *m.Payload != "two" {
		t.Fatalf("after collection: %q", *m.Payload)
	}

	e.enqueue("d", subjects.EnqueueRequest{ID: "y", Payload: "one"})
	must[subjects.DeleteReply](e, subjects.OpDelete, "d", nil)
	e.enqueue("d", subjects.EnqueueRequest{ID: "y", Payload: "two"})
	if m := e.dequeueOne("d"); *m.Payload != "two" {
		t.Fatalf("after delete: %q", *m.Payload)
	}
}

// TestDeleteRacesAutoCreate: a delete racing an auto-creating enqueue once left a queue alive in
// memory whose config and messages the delete had purged. Whatever the interleaving, memory and
// storage must agree.
func TestDeleteRacesAutoCreate(t *testing.T) {
	t.Parallel()
	e := setup(t)
	const n = 20
	for i := range n {
		name := fmt.Sprintf("q%d", i)
		e.enqueue(name, subjects.EnqueueRequest{ID: "a"})
		var wg sync.WaitGroup
		wg.Add(2)
		go func() {
			defer wg.Done()
			_, _ = call[subjects.DeleteReply](e, subjects.OpDelete, name, nil)
		}()
		go func() {
			defer wg.Done()
			_, _ = call[subjects.EnqueueReply](e, subjects.OpEnqueue, name, subjects.EnqueueRequest{ID: "b"})
		}()
		wg.Wait()
	}
	before := must[subjects.ListReply](e, subjects.OpList, "", nil)
	e.restartBroker()
	after := must[subjects.ListReply](e, subjects.OpList, "", nil)
	if len(before.Queues) != len(after.Queues) {
		t.Fatalf("%d queues before restart, %d after", len(before.Queues), len(after.Queues))
	}
	for i := range before.Queues {
		if before.Queues[i].Name != after.Queues[i].Name || before.Queues[i].Counts != after.Queues[i].Counts {
			t.Fatalf("queue %s: %+v before restart, %+v after", before.Queues[i].Name, before.Queues[i].Counts, after.Queues[i].Counts)
		}
	}
}

// TestStaleHolderCannotCancel: a holder whose lease ran out must not cancel the message that is
// pending again for someone else.
func TestStaleHolderCannotCancel(t *testing.T) {
	t.Parallel()
	e := setup(t)
	e.create("q", subjects.CreateQueueRequest{LeaseMS: 1_000})
	e.enqueue("q", subjects.EnqueueRequest{ID: "m"})
	old := e.dequeueOne("q")
	e.advance(time.Second)
	fails(e, subjects.CodeLeaseExpired, subjects.OpCancel, "q", subjects.LeaseRequest{ID: "m", LeaseID: old.LeaseID})
	if got := e.get("q", "m"); got.State != subjects.StatePending {
		t.Fatalf("state %s", got.State)
	}
}

// TestUnreadableRecordDoesNotStopTheBroker: one corrupted value is reported and skipped at start.
func TestUnreadableRecordDoesNotStopTheBroker(t *testing.T) {
	t.Parallel()
	e := setup(t)
	e.enqueue("q", subjects.EnqueueRequest{ID: "good"})
	js := e.jetStream()
	bucket, err := js.KeyValue(context.Background(), "natstone-messages")
	if err != nil {
		t.Fatal(err)
	}
	if _, err := bucket.Put(context.Background(), kv.MessageKey("q", "bad"), []byte("not json")); err != nil {
		t.Fatal(err)
	}
	e.restartBroker()
	if got := e.get("q", "good"); got.State != subjects.StatePending {
		t.Fatalf("good message after restart: %+v", got)
	}
}
