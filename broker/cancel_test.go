package broker_test

import (
	"testing"

	"github.com/natstone/natstone/subjects"
)

// TestCancelAtVersion: an operator's cancel with a version cancels the message only at that
// version, so a cancel decided on what a listing showed never hits a message that moved on; sent
// again once it landed, it succeeds and writes nothing. A complete takes no version.
func TestCancelAtVersion(t *testing.T) {
	e := setup(t)
	e.create("q", subjects.CreateQueueRequest{})
	e.enqueue("q", subjects.EnqueueRequest{ID: "m", Payload: "x"})
	listed := e.get("q", "m")
	leased := e.dequeueOne("q")

	before := e.snap()
	fails(e, subjects.CodeRevisionMismatch, subjects.OpCancel, "q", subjects.LeaseRequest{ID: "m", Version: listed.Version})
	fails(e, subjects.CodeBadRequest, subjects.OpComplete, "q", subjects.LeaseRequest{ID: "m", LeaseID: leased.LeaseID, Version: leased.Version})
	e.unchanged(before)

	canceled := must[subjects.Message](e, subjects.OpCancel, "q", subjects.LeaseRequest{ID: "m", Version: leased.Version})
	if canceled.State != subjects.StateCanceled || canceled.Version != leased.Version+1 {
		t.Fatalf("cancel at the leased version: %+v, want canceled at the next version", canceled)
	}
	before = e.snap()
	if again := must[subjects.Message](e, subjects.OpCancel, "q", subjects.LeaseRequest{ID: "m", Version: leased.Version}); again.Version != canceled.Version {
		t.Fatalf("the cancel sent again: %+v, want it left at version %d", again, canceled.Version)
	}
	e.unchanged(before)
	// The holder's lease no longer completes it.
	fails(e, subjects.CodeInvalidState, subjects.OpComplete, "q", subjects.LeaseRequest{ID: "m", LeaseID: leased.LeaseID})
}

// TestCancelWithAnEmptyLeaseID: a cancel whose lease_id is given empty is refused, as a complete's
// is, and writes nothing: left out, the cancel is an operator's, which ends the message whoever
// holds it, and a holder that lost its lease id must not get that by mistake.
func TestCancelWithAnEmptyLeaseID(t *testing.T) {
	e := setup(t)
	e.create("q", subjects.CreateQueueRequest{})
	e.enqueue("q", subjects.EnqueueRequest{ID: "m"})
	leased := e.dequeueOne("q")

	before := e.snap()
	for _, body := range []string{`{"id":"m","lease_id":""}`, `{"id":"m","lease_id":"","version":2}`, `{"id":"m","error":"gone","lease_id":""}`} {
		fails(e, subjects.CodeBadRequest, subjects.OpCancel, "q", body)
	}
	e.unchanged(before)
	if got := e.get("q", "m"); got.State != subjects.StateRunning || got.LeaseID != leased.LeaseID {
		t.Fatalf("after the cancels with an empty lease id: %+v, want it running under %s", got, leased.LeaseID)
	}
	// Left out or null, it is the operator's cancel.
	if got := must[subjects.Message](e, subjects.OpCancel, "q", `{"id":"m","lease_id":null}`); got.State != subjects.StateCanceled {
		t.Fatalf("an operator's cancel: %+v, want canceled", got)
	}
}
