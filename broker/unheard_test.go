package broker_test

import (
	"encoding/base64"
	"strings"
	"testing"
	"time"

	"github.com/natstone/natstone/subjects"
)

// TestRepliesThatReachNobodyGiveTheirLeasesBack: a dequeue whose requester is gone by the time its
// reply is sent (its connection closed, its inbox unsubscribed after a timeout) would lease messages
// that run nowhere until their leases run out, each with an attempt spent: on a queue of one
// attempt, errored without ever running; on an exclusive queue, with the value held meanwhile. The
// server tells the broker that the reply reached nobody, and the leases are given back, their
// attempts refunded. So is the lease of a settle's next whose reply reaches nobody; the settle
// itself stands.
func TestRepliesThatReachNobodyGiveTheirLeasesBack(t *testing.T) {
	t.Parallel()
	e := setup(t)
	e.create("q", subjects.CreateQueueRequest{Type: subjects.Exclusive, ExclusivityKey: "project", MaxAttempts: 1})
	for i, id := range []string{"a", "b"} {
		e.enqueue("q", subjects.EnqueueRequest{ID: id, Priority: ptr(int64(i)), Metadata: map[string]string{"project": "foo"}})
	}
	released := e.events("natstone.events.q.released.>")
	waitReleased := func(id string) {
		t.Helper()
		select {
		case m := <-released:
			if want := base64.RawURLEncoding.EncodeToString([]byte(id)); !strings.HasSuffix(m.Subject, "."+want) {
				t.Fatalf("released %s, want %s", m.Subject, id)
			}
		case <-time.After(10 * time.Second):
			t.Fatalf("%s's lease, whose reply reached nobody, was not given back", id)
		}
	}

	// A requester gone: nothing subscribes its inbox by the time the broker answers.
	gone := e.srv.Connect(t)
	inbox := gone.NewInbox()
	if err := gone.PublishRequest(e.space.Subject(subjects.OpDequeue, "q"), inbox, nil); err != nil {
		t.Fatal(err)
	}
	waitReleased("a")
	if a := e.get("q", "a"); a.State != subjects.StatePending || a.Attempts != 0 {
		t.Fatalf("a after its reply reached nobody: %s, attempts %d; want pending, attempt refunded", a.State, a.Attempts)
	}
	// Its one attempt is still there, and its value is free.
	a := e.dequeueOne("q")
	if a.ID != "a" || a.Attempts != 1 {
		t.Fatalf("dequeued %s at attempt %d, want a at its first", a.ID, a.Attempts)
	}

	body := mustJSON(t, subjects.LeaseRequest{ID: a.ID, LeaseID: a.LeaseID, Next: &subjects.DequeueRequest{}})
	if err := gone.PublishRequest(e.space.Subject(subjects.OpComplete, "q"), inbox, body); err != nil {
		t.Fatal(err)
	}
	waitReleased("b")
	if a := e.get("q", "a"); a.State != subjects.StateCompleted {
		t.Fatalf("a after a complete whose reply reached nobody: %s", a.State)
	}
	if b := e.get("q", "b"); b.State != subjects.StatePending || b.Attempts != 0 {
		t.Fatalf("b, the next of a settle whose reply reached nobody: %s, attempts %d; want pending, attempt refunded", b.State, b.Attempts)
	}

	// A reply taken keeps its lease.
	b := e.dequeueOne("q")
	if b.ID != "b" {
		t.Fatalf("dequeued %s, want b", b.ID)
	}
	must[subjects.Message](e, subjects.OpComplete, "q", subjects.LeaseRequest{ID: b.ID, LeaseID: b.LeaseID})
	select {
	case m := <-released:
		t.Fatalf("released %s, whose reply was taken", m.Subject)
	default:
	}
}
