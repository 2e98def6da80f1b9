package broker_test

import (
	"context"
	"testing"

	"github.com/natstone/natstone/kv"
	"github.com/natstone/natstone/subjects"
)

// TestLockConflictIsRecovered: another writer changed an exclusivity lock behind the broker's back
// (as a second broker would). The dequeue that hits the conflict leases nothing and says so; the
// broker reloads the lock, and the next dequeue succeeds. (It once crashed: the dropped change
// left a nil in the slice the dequeue was reading.)
func TestLockConflictIsRecovered(t *testing.T) {
	t.Parallel()
	e := setup(t)
	e.create("x", subjects.CreateQueueRequest{Type: subjects.Exclusive, ExclusivityKey: "p"})
	e.enqueue("x", subjects.EnqueueRequest{ID: "a", Metadata: map[string]string{"p": "foo"}})
	e.enqueue("x", subjects.EnqueueRequest{ID: "b", Metadata: map[string]string{"p": "bar"}})

	js := e.jetStream()
	locks, err := js.KeyValue(context.Background(), "natstone-locks")
	if err != nil {
		t.Fatal(err)
	}
	for _, v := range []string{"foo", "bar"} {
		if _, err := locks.Put(context.Background(), kv.LockKey("x", v), []byte(`{}`)); err != nil {
			t.Fatal(err)
		}
	}
	fails(e, subjects.CodeUnavailable, subjects.OpDequeue, "x", subjects.DequeueRequest{Batch: 2})
	for _, id := range []string{"a", "b"} {
		if m := e.get("x", id); m.State != subjects.StatePending || m.Version != 1 {
			t.Fatalf("%s after the failed dequeue: %s v%d", id, m.State, m.Version)
		}
	}
	if got := e.dequeue("x", subjects.DequeueRequest{Batch: 2}); len(got) != 2 {
		t.Fatalf("after the reload: %v", ids(got))
	}
}
