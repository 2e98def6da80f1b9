package broker_test

import (
	"reflect"
	"slices"
	"strings"
	"testing"
	"time"

	"github.com/natstone/natstone/subjects"
)

// settleNext sends op (complete, release or cancel) with body and returns its reply, which must
// succeed.
func settleNext(e *env, op subjects.Op, queue string, body any) subjects.SettleReply {
	e.t.Helper()
	r := must[subjects.SettleReply](e, op, queue, body)
	if r.Next == nil {
		e.t.Fatalf("%s %s: a reply without next: %+v", op, queue, r)
	}
	return r
}

// TestSettleThenNext: complete, release and cancel with next settle their message and then lease
// the earliest-deadline pending messages in the same request, with their payloads; the dequeue sees
// what the settle did.
func TestSettleThenNext(t *testing.T) {
	t.Parallel()
	e := setup(t)
	for i, id := range []string{"a", "b", "c", "d", "e"} {
		e.enqueue("q", subjects.EnqueueRequest{ID: id, Priority: ptr(int64(i)), Payload: "p-" + id})
	}
	a := e.dequeueOne("q")

	r := settleNext(e, subjects.OpComplete, "q", subjects.LeaseRequest{ID: "a", LeaseID: a.LeaseID,
		Next: &subjects.DequeueRequest{Batch: 2, Worker: "w1"}})
	if r.ID != "a" || r.State != subjects.StateCompleted || r.Payload != nil {
		t.Fatalf("settled %s %s (payload %v), want a completed without payload", r.ID, r.State, r.Payload)
	}
	if got := ids(r.Next.Messages); !slices.Equal(got, []string{"b", "c"}) || r.Next.Error != nil {
		t.Fatalf("next %v (error %v), want [b c]", got, r.Next.Error)
	}
	for _, m := range r.Next.Messages {
		if m.State != subjects.StateRunning || m.LeaseID == "" || m.Payload == nil || *m.Payload != "p-"+m.ID {
			t.Fatalf("next message %+v: want running, leased, with its payload", m)
		}
	}
	b, c := r.Next.Messages[0], r.Next.Messages[1]

	// A release puts b back before its next dequeue runs: b is leased again at once.
	r = settleNext(e, subjects.OpRelease, "q", subjects.ReleaseRequest{ID: "b", LeaseID: b.LeaseID, Next: &subjects.DequeueRequest{}})
	if r.State != subjects.StatePending || len(r.Next.Messages) != 1 || r.Next.Messages[0].ID != "b" || r.Next.Messages[0].Attempts != 2 {
		t.Fatalf("release then next: settled %s, next %+v; want b pending, then b again (attempt 2)", r.State, r.Next.Messages)
	}
	r = settleNext(e, subjects.OpCancel, "q", subjects.LeaseRequest{ID: "c", LeaseID: c.LeaseID, Next: &subjects.DequeueRequest{Batch: 10}})
	if r.State != subjects.StateCanceled || !slices.Equal(ids(r.Next.Messages), []string{"d", "e"}) {
		t.Fatalf("cancel then next: settled %s, next %v; want canceled, then [d e]", r.State, ids(r.Next.Messages))
	}

	// Nothing left: the settle succeeds with an empty next, at once (no long poll).
	d := r.Next.Messages[0]
	r = settleNext(e, subjects.OpComplete, "q", subjects.LeaseRequest{ID: "d", LeaseID: d.LeaseID, Next: &subjects.DequeueRequest{}})
	if r.State != subjects.StateCompleted || r.Next.Messages == nil || len(r.Next.Messages) != 0 {
		t.Fatalf("complete with nothing pending: %s, next %v; want completed and an empty list", r.State, r.Next.Messages)
	}
	if c := e.depth("q", nil); c.Running != 2 || c.Pending != 0 {
		t.Fatalf("depth %+v, want b and e running", c)
	}
	// Without next the reply is a plain message, as before.
	if raw := string(e.request(subjects.OpComplete, "q", subjects.LeaseRequest{ID: "d", LeaseID: d.LeaseID}).Data); strings.Contains(raw, `"next":`) {
		t.Fatalf("a complete without next answered %s", raw)
	}
}

// TestSettleThenNextExclusive: in an exclusive queue the complete frees its value before the next
// dequeue runs, so the same value's next message is leased in the same request.
func TestSettleThenNextExclusive(t *testing.T) {
	t.Parallel()
	e := setup(t)
	e.create("x", subjects.CreateQueueRequest{Type: subjects.Exclusive, ExclusivityKey: "project"})
	e.enqueue("x", subjects.EnqueueRequest{ID: "foo1", Priority: ptr[int64](0), Metadata: map[string]string{"project": "foo"}})
	e.enqueue("x", subjects.EnqueueRequest{ID: "foo2", Priority: ptr[int64](1), Metadata: map[string]string{"project": "foo"}})
	e.enqueue("x", subjects.EnqueueRequest{ID: "bar1", Priority: ptr[int64](2), Metadata: map[string]string{"project": "bar"}})
	foo1 := e.dequeueOne("x")
	r := settleNext(e, subjects.OpComplete, "x", subjects.LeaseRequest{ID: "foo1", LeaseID: foo1.LeaseID, Next: &subjects.DequeueRequest{}})
	if got := ids(r.Next.Messages); !slices.Equal(got, []string{"foo2"}) {
		t.Fatalf("next %v, want [foo2]: the complete frees foo first", got)
	}
	if got := ids(e.dequeue("x", subjects.DequeueRequest{Batch: 5})); !slices.Equal(got, []string{"bar1"}) {
		t.Fatalf("then %v, want [bar1]: foo is leased again", got)
	}
}

// TestSettleThenNextRetry: a settle with next that is sent again (its reply lost) settles nothing
// more, and with the same request_id gets back the leases the first one took instead of new ones.
func TestSettleThenNextRetry(t *testing.T) {
	t.Parallel()
	e := setup(t)
	e.enqueueInOrder("q", "a", "b", "c")
	a := e.dequeueOne("q")
	req := subjects.LeaseRequest{ID: "a", LeaseID: a.LeaseID, Next: &subjects.DequeueRequest{RequestID: "w1-7"}}
	first := settleNext(e, subjects.OpComplete, "q", req)
	again := settleNext(e, subjects.OpComplete, "q", req)
	if first.Version != again.Version || again.State != subjects.StateCompleted {
		t.Fatalf("the retry wrote again: version %d then %d", first.Version, again.Version)
	}
	if len(first.Next.Messages) != 1 || len(again.Next.Messages) != 1 ||
		again.Next.Messages[0].ID != "b" || again.Next.Messages[0].LeaseID != first.Next.Messages[0].LeaseID {
		t.Fatalf("next %+v then %+v, want the same lease of b", first.Next.Messages, again.Next.Messages)
	}
	if c := e.depth("q", nil); c.Running != 1 || c.Pending != 1 {
		t.Fatalf("depth %+v, want b running and c pending", c)
	}
}

// TestSettleThenNextRetryAfterTheSettle: a settle with next sent again (its reply lost) once the
// settle itself would fail — the message collected meanwhile, or leased again by that next — gets the
// first reply again, the leases of its next included, instead of an error that strands them.
func TestSettleThenNextRetryAfterTheSettle(t *testing.T) {
	t.Parallel()
	e := setup(t)
	e.create("q", subjects.CreateQueueRequest{RetentionMS: ptr[int64](0)})
	e.enqueue("q", subjects.EnqueueRequest{ID: "a", Priority: ptr[int64](0)})
	e.enqueue("q", subjects.EnqueueRequest{ID: "b", Priority: ptr[int64](1), Payload: "pb"})
	e.enqueue("q", subjects.EnqueueRequest{ID: "c", Priority: ptr[int64](2)})

	// A complete whose message is collected before the retry.
	a := e.dequeueOne("q")
	req := subjects.LeaseRequest{ID: "a", LeaseID: a.LeaseID, Next: &subjects.DequeueRequest{RequestID: "w1-1"}}
	first := settleNext(e, subjects.OpComplete, "q", req)
	e.advance(time.Second)
	fails(e, subjects.CodeMessageNotFound, subjects.OpGet, "q", subjects.GetRequest{ID: "a"}) // collected
	again := settleNext(e, subjects.OpComplete, "q", req)
	if again.ID != "a" || again.State != subjects.StateCompleted || !reflect.DeepEqual(again.Message, first.Message) {
		t.Fatalf("the retry answered %+v, want the first reply's %+v", again.Message, first.Message)
	}
	if !slices.Equal(ids(again.Next.Messages), []string{"b"}) || again.Next.Messages[0].LeaseID != first.Next.Messages[0].LeaseID {
		t.Fatalf("next %v then %v, want the same lease of b", first.Next.Messages, again.Next.Messages)
	}
	if p := again.Next.Messages[0].Payload; p == nil || *p != "pb" {
		t.Fatalf("the retry's next lost its payload: %+v", again.Next.Messages[0])
	}

	// A release whose next leased the released message again.
	b := again.Next.Messages[0]
	rel := subjects.ReleaseRequest{ID: "b", LeaseID: b.LeaseID, Next: &subjects.DequeueRequest{RequestID: "w1-2"}}
	first = settleNext(e, subjects.OpRelease, "q", rel)
	if !slices.Equal(ids(first.Next.Messages), []string{"b"}) {
		t.Fatalf("the release's next leased %v, want b again", ids(first.Next.Messages))
	}
	again = settleNext(e, subjects.OpRelease, "q", rel)
	if again.State != subjects.StatePending || !reflect.DeepEqual(again.Message, first.Message) ||
		len(again.Next.Messages) != 1 || again.Next.Messages[0].LeaseID != first.Next.Messages[0].LeaseID {
		t.Fatalf("the retry answered %+v next %+v, want the first reply", again.Message, again.Next.Messages)
	}
	if c := e.depth("q", nil); c.Running != 1 || c.Pending != 1 {
		t.Fatalf("depth %+v, want b running and c pending", c)
	}

	// The same settle with another request id, another op or another lease is not a retry.
	fails(e, subjects.CodeLeaseMismatch, subjects.OpRelease, "q", subjects.ReleaseRequest{ID: "b", LeaseID: b.LeaseID, Next: &subjects.DequeueRequest{RequestID: "w1-3"}})
	fails(e, subjects.CodeLeaseMismatch, subjects.OpComplete, "q", subjects.LeaseRequest{ID: "b", LeaseID: b.LeaseID, Next: &subjects.DequeueRequest{RequestID: "w1-2"}})
	fails(e, subjects.CodeLeaseMismatch, subjects.OpRelease, "q", subjects.ReleaseRequest{ID: "b", LeaseID: "other", Next: &subjects.DequeueRequest{RequestID: "w1-2"}})

	// A settle whose next leased nothing: its retry gets the same reply, no message, once the
	// settled message is collected.
	c := settleNext(e, subjects.OpComplete, "q", subjects.LeaseRequest{ID: "b", LeaseID: again.Next.Messages[0].LeaseID, Next: &subjects.DequeueRequest{RequestID: "w1-4"}}).Next.Messages[0]
	req = subjects.LeaseRequest{ID: "c", LeaseID: c.LeaseID, Next: &subjects.DequeueRequest{RequestID: "w1-5"}}
	first = settleNext(e, subjects.OpComplete, "q", req)
	e.advance(time.Second)
	fails(e, subjects.CodeMessageNotFound, subjects.OpGet, "q", subjects.GetRequest{ID: "c"}) // collected
	again = settleNext(e, subjects.OpComplete, "q", req)
	if len(first.Next.Messages) != 0 || !reflect.DeepEqual(again.Message, first.Message) || len(again.Next.Messages) != 0 {
		t.Fatalf("the retry answered %+v next %v, want %+v and nothing", again.Message, ids(again.Next.Messages), first.Message)
	}
}

// TestSettleThenNextFails: a bad next is refused before anything is written; a next dequeue that
// fails once the settle is stored leaves the settle standing and says why in the reply.
func TestSettleThenNextFails(t *testing.T) {
	t.Parallel()
	e := setup(t)
	e.enqueue("q", subjects.EnqueueRequest{ID: "a"})
	e.enqueue("q", subjects.EnqueueRequest{ID: "b"})
	a := e.dequeueOne("q")
	lease := func(next *subjects.DequeueRequest) subjects.LeaseRequest {
		return subjects.LeaseRequest{ID: "a", LeaseID: a.LeaseID, Next: next}
	}
	watch := []msgRef{{"q", "a"}, {"q", "b"}}
	runErrCases(t, e, watch, []errCase{
		{"long poll", subjects.OpComplete, "q", lease(&subjects.DequeueRequest{WaitMS: 1000}), subjects.CodeOutOfRange},
		{"batch", subjects.OpComplete, "q", lease(&subjects.DequeueRequest{Batch: subjects.MaxDequeueBatch + 1}), subjects.CodeOutOfRange},
		{"lease", subjects.OpCancel, "q", lease(&subjects.DequeueRequest{LeaseMS: 1}), subjects.CodeOutOfRange},
		{"filter", subjects.OpComplete, "q", lease(&subjects.DequeueRequest{Filter: map[string]string{"": "v"}}), subjects.CodeInvalidMetadata},
		{"release", subjects.OpRelease, "q", subjects.ReleaseRequest{ID: "a", LeaseID: a.LeaseID, Next: &subjects.DequeueRequest{Worker: "tab\there"}}, subjects.CodeBadRequest},
		{"unknown field", subjects.OpComplete, "q", `{"id":"a","lease_id":"` + a.LeaseID + `","next":{"batch":1,"wait":5}}`, subjects.CodeBadRequest},
		{"settle refused", subjects.OpComplete, "q", subjects.LeaseRequest{ID: "a", LeaseID: "other", Next: &subjects.DequeueRequest{}}, subjects.CodeLeaseMismatch},
	})
	if err := fails(e, subjects.CodeOutOfRange, subjects.OpComplete, "q", lease(&subjects.DequeueRequest{WaitMS: 1000})); !strings.HasPrefix(err.Message, "next: ") {
		t.Errorf("the error %q does not say it is next's", err.Message)
	}

	must[subjects.QueueInfo](e, subjects.OpUpdate, "q", subjects.UpdateQueueRequest{DequeueBlocked: ptr(true)})
	r := settleNext(e, subjects.OpComplete, "q", lease(&subjects.DequeueRequest{}))
	if r.State != subjects.StateCompleted || len(r.Next.Messages) != 0 || r.Next.Error == nil || r.Next.Error.Code != subjects.CodeQueueBlocked {
		t.Fatalf("complete on a queue whose dequeues are blocked: %s, next %+v; want completed, and queue_blocked in next", r.State, r.Next)
	}
	if got := e.get("q", "a").State; got != subjects.StateCompleted {
		t.Fatalf("a is %s, want completed", got)
	}
}
