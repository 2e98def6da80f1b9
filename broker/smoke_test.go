package broker_test

import (
	"testing"

	"github.com/natstone/natstone/subjects"
)

func TestSmoke(t *testing.T) {
	t.Parallel()
	e := setup(t)
	e.create("jobs", subjects.CreateQueueRequest{})
	r := e.enqueue("jobs", subjects.EnqueueRequest{ID: "a", Payload: "hello"})
	if r.State != subjects.StatePending || r.Version != 1 {
		t.Fatalf("enqueue: %+v", r)
	}
	m := e.dequeueOne("jobs")
	if m.ID != "a" || m.Payload == nil || *m.Payload != "hello" || m.State != subjects.StateRunning {
		t.Fatalf("dequeue: %+v", m)
	}
	c := must[subjects.Message](e, subjects.OpComplete, "jobs", subjects.LeaseRequest{ID: "a", LeaseID: m.LeaseID})
	if c.State != subjects.StateCompleted || c.Version != 3 {
		t.Fatalf("complete: %+v", c)
	}
}
