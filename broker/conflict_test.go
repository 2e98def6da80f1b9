package broker_test

import (
	"context"
	"errors"
	"strings"
	"testing"
	"time"

	"github.com/nats-io/nats.go/jetstream"

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

// TestLockConflictWithAnotherWritersHolder: another writer wrote a value's lock behind the broker's
// back. A lock that names a message which has ended here holds nothing, so after the conflict the
// value is free at once. A lock that names a message the broker does not know holds the value until
// the doubt timer has read that message's record and fenced it with a write at the revision read
// (the other writer's lease, expecting an older one, then cannot land): gone, ended or pending (a
// message known here too), the message can no longer run under the lock's lease, and the value is
// free; running with the lock's value, it may be another writer's, and the value stays held until a
// restart reconciles the locks with the messages in storage.
func TestLockConflictWithAnotherWritersHolder(t *testing.T) {
	t.Parallel()
	e := setup(t)
	ctx := context.Background()
	e.create("x", subjects.CreateQueueRequest{Type: subjects.Exclusive, ExclusivityKey: "p"})
	for i, id := range []string{"a", "b", "c", "d", "f", "g", "h", "j", "k"} {
		e.enqueue("x", subjects.EnqueueRequest{ID: id, Priority: ptr(int64(i)), Metadata: map[string]string{"p": "foo"}})
	}
	overwrite := func(holder string) {
		t.Helper()
		e.storeLock("x", "foo", 0, holder, "elsewhere")
	}
	// stranger stores a record of another writer's, in state, that this broker never loaded, and
	// returns it with its revision.
	stranger := func(id string, state subjects.State, value string) (kv.Record, uint64) {
		t.Helper()
		r := kv.Record{ID: id, State: state, Priority: 100, Metadata: map[string]string{"p": value}, Version: 2, MaxAttempts: 3}
		rev, err := e.store().WriteMessage("x", &r, 0).Wait(ctx)
		if err != nil {
			t.Fatal(err)
		}
		return r, rev
	}
	next := func(want string) {
		t.Helper()
		m := e.dequeueOne("x")
		if m.ID != want {
			t.Fatalf("dequeued %s, want %s", m.ID, want)
		}
		must[subjects.Message](e, subjects.OpComplete, "x", subjects.LeaseRequest{ID: m.ID, LeaseID: m.LeaseID})
	}
	held := func(why string) {
		t.Helper()
		if got := e.dequeue("x", subjects.DequeueRequest{}); len(got) != 0 {
			t.Fatalf("foo is held (%s), yet dequeued %v", why, ids(got))
		}
	}
	conflict := func(holder string) {
		t.Helper()
		overwrite(holder)
		fails(e, subjects.CodeUnavailable, subjects.OpDequeue, "x", subjects.DequeueRequest{})
		held("until the record of " + holder + " is fenced")
	}

	next("a")
	overwrite("a")
	fails(e, subjects.CodeUnavailable, subjects.OpDequeue, "x", subjects.DequeueRequest{})
	next("b") // a has ended here: its lock held nothing

	conflict("gone") // a message without a record
	e.advance(2 * time.Second)
	if _, _, err := e.store().GetMessage(ctx, "x", "gone"); !errors.Is(err, kv.ErrNotFound) {
		t.Fatalf("gone after its fence: %v, want not found", err)
	}
	next("c")

	stranger("done", subjects.StateCompleted, "foo")
	conflict("done")
	e.advance(2 * time.Second)
	next("d")

	// A pending message, whose lease the other writer may be writing: the fence makes that write
	// conflict.
	waiting, rev := stranger("waiting", subjects.StatePending, "foo")
	conflict("waiting")
	e.advance(2 * time.Second)
	waiting.State, waiting.LeaseID, waiting.Version = subjects.StateRunning, "elsewhere", 3
	if _, err := e.store().WriteMessage("x", &waiting, rev).Wait(ctx); !errors.Is(err, kv.ErrConflict) {
		t.Fatalf("the other writer's lease of waiting after the fence: %v, want a conflict", err)
	}
	next("f")

	// A message pending here, which another writer may be leasing: fenced the same way. This
	// broker's first lease of it then conflicts, and it is reloaded.
	conflict("h")
	e.advance(2 * time.Second)
	next("g")
	fails(e, subjects.CodeUnavailable, subjects.OpDequeue, "x", subjects.DequeueRequest{})
	next("h")

	// Running with another value: its id was enqueued again since the lock's take, which it fences.
	stranger("reused", subjects.StateRunning, "bar")
	conflict("reused")
	e.advance(2 * time.Second)
	next("j")

	stranger("running", subjects.StateRunning, "foo")
	conflict("running")
	for range 2 {
		e.advance(2 * time.Second)
		held("by another writer's running message")
	}
	e.restartAll()
	if got := e.dequeueOne("x"); got.ID != "k" {
		t.Fatalf("after the restart: dequeued %s, want k", got.ID)
	}
}

// TestLockConflictNamingAnIDReusedWithAnotherValue: another writer's lock of value foo names x, an
// id that has since come back with value bar and runs here. Its end here would free bar's slot, not
// foo's: x is fenced as a stranger (its running record written again as it is), which frees foo,
// and x's complete, whose expected revision the fence moved, is refused once (unavailable: retry)
// and then taken.
func TestLockConflictNamingAnIDReusedWithAnotherValue(t *testing.T) {
	t.Parallel()
	e := setup(t)
	e.create("x", subjects.CreateQueueRequest{Type: subjects.Exclusive, ExclusivityKey: "p", LeaseMS: time.Hour.Milliseconds()})
	e.enqueue("x", subjects.EnqueueRequest{ID: "x", Priority: ptr(int64(0)), Metadata: map[string]string{"p": "bar"}})
	x := e.dequeueOne("x")
	e.enqueue("x", subjects.EnqueueRequest{ID: "y", Priority: ptr(int64(1)), Metadata: map[string]string{"p": "foo"}})
	e.storeLock("x", "foo", 0, "x", "elsewhere")
	fails(e, subjects.CodeUnavailable, subjects.OpDequeue, "x", subjects.DequeueRequest{})
	e.advance(2 * time.Second)
	if got := e.dequeueOne("x"); got.ID != "y" {
		t.Fatalf("once x was fenced: dequeued %s, want y", got.ID)
	}
	complete := subjects.LeaseRequest{ID: x.ID, LeaseID: x.LeaseID}
	fails(e, subjects.CodeUnavailable, subjects.OpComplete, "x", complete) // its record reloaded
	if m := must[subjects.Message](e, subjects.OpComplete, "x", complete); m.State != subjects.StateCompleted {
		t.Fatalf("x after its complete: %s", m.State)
	}
}

// TestLockConflictWithAMessageRunningElsewhere: another writer leased m, which this broker has
// pending, and took the lock of its value for it. The take here conflicts; the doubt timer reads m
// running under the other writer's lease and takes that record in, as a restart would: the value
// stays held while the lease runs, and its expiry here, a write at m's revision, frees it.
func TestLockConflictWithAMessageRunningElsewhere(t *testing.T) {
	t.Parallel()
	e := setup(t)
	ctx := context.Background()
	e.create("x", subjects.CreateQueueRequest{Type: subjects.Exclusive, ExclusivityKey: "p"})
	for i, id := range []string{"m", "n"} {
		e.enqueue("x", subjects.EnqueueRequest{ID: id, Priority: ptr(int64(i)), Metadata: map[string]string{"p": "foo"}})
	}
	st := e.store()
	r, rev, err := st.GetMessage(ctx, "x", "m")
	if err != nil {
		t.Fatal(err)
	}
	r.State, r.LeaseID, r.Attempts, r.Version = subjects.StateRunning, "elsewhere", r.Attempts+1, r.Version+1
	r.LeaseExpires = e.clk.Now().Add(10 * time.Second).UnixMilli()
	if _, err := st.WriteMessage("x", &r, rev).Wait(ctx); err != nil {
		t.Fatal(err)
	}
	e.storeLock("x", "foo", 0, "m", "elsewhere")
	fails(e, subjects.CodeUnavailable, subjects.OpDequeue, "x", subjects.DequeueRequest{})
	e.advance(2 * time.Second)
	if m := e.get("x", "m"); m.State != subjects.StateRunning || m.LeaseID != "elsewhere" {
		t.Fatalf("m once its record was read: %s under %q, want running under the other writer's lease", m.State, m.LeaseID)
	}
	if got := e.dequeue("x", subjects.DequeueRequest{}); len(got) != 0 {
		t.Fatalf("foo is held by m's lease elsewhere, yet dequeued %v", ids(got))
	}
	e.advance(10 * time.Second) // m's lease runs out here
	if got := e.dequeueOne("x"); got.ID != "m" {
		t.Fatalf("once m's lease ran out: dequeued %s, want m", got.ID)
	}
}

// TestLockConflictWithAHolderBeingCollected: another writer's lock names a message whose key holds a
// marker, here one the server keeps (as it was seen to after unclean stops). The fence is a marker
// at that marker's revision: until it lands (here: while the stream refuses roll-ups) the value
// stays held and the holder is asked about again at each doubt timer; once it lands the value is
// free, and the new marker goes by itself.
func TestLockConflictWithAHolderBeingCollected(t *testing.T) {
	t.Parallel()
	e := setup(t)
	ctx := context.Background()
	e.create("x", subjects.CreateQueueRequest{Type: subjects.Exclusive, ExclusivityKey: "p"})
	e.enqueue("x", subjects.EnqueueRequest{ID: "b", Metadata: map[string]string{"p": "foo"}})
	key := "$KV.natstone-messages." + kv.MessageKey("x", "a")
	// A marker without a TTL: it stays.
	if _, err := e.jetStream().PublishMsg(ctx, natsMsg(key, nil, map[string]string{"KV-Operation": "PURGE"})); err != nil {
		t.Fatal(err)
	}
	rollups := func(allow bool) {
		t.Helper()
		st, err := e.jetStream().Stream(ctx, "KV_natstone-messages")
		if err != nil {
			t.Fatal(err)
		}
		cfg := st.CachedInfo().Config
		cfg.AllowRollup = allow
		if _, err := e.jetStream().UpdateStream(ctx, cfg); err != nil {
			t.Fatal(err)
		}
	}
	e.storeLock("x", "foo", 0, "a", "elsewhere")
	fails(e, subjects.CodeUnavailable, subjects.OpDequeue, "x", subjects.DequeueRequest{})
	rollups(false)
	for range 2 {
		e.advance(2 * time.Second)
		if got := e.dequeue("x", subjects.DequeueRequest{}); len(got) != 0 {
			t.Fatalf("foo is held while a's fence does not land, yet dequeued %v", ids(got))
		}
	}
	rollups(true)
	e.advance(2 * time.Second)
	if got := e.dequeueOne("x"); got.ID != "b" {
		t.Fatalf("once a's fence landed: dequeued %s, want b", got.ID)
	}
	e.waitNoKeys("KV_natstone-messages", key)
}

// TestFailedEnqueueLeavesNoPayload: when some payloads of a batch cannot be stored, the enqueue
// fails and deletes those that were: a failed request writes nothing. Here the bodies stream is
// given room for two of three payloads.
func TestFailedEnqueueLeavesNoPayload(t *testing.T) {
	t.Parallel()
	e := setup(t)
	e.create("q", subjects.CreateQueueRequest{})
	ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
	defer cancel()
	js := e.jetStream()
	st, err := js.Stream(ctx, "natstone-bodies")
	if err != nil {
		t.Fatal(err)
	}
	cfg := st.CachedInfo().Config
	cfg.MaxBytes, cfg.Discard = 2500, jetstream.DiscardNew
	if _, err := js.UpdateStream(ctx, cfg); err != nil {
		t.Fatal(err)
	}
	var batch subjects.EnqueueBatchRequest
	for _, id := range []string{"a", "b", "c"} {
		batch.Messages = append(batch.Messages, subjects.EnqueueRequest{ID: id, Payload: strings.Repeat(id, 1000)})
	}

	fails(e, subjects.CodeUnavailable, subjects.OpEnqueueBatch, "q", batch)

	e.waitStreamMsgs("natstone-bodies", 0)
	e.waitStreamMsgs("KV_natstone-messages", 0)
	if c := e.depth("q", nil); c != (subjects.Counts{}) {
		t.Fatalf("depth after the failed enqueue: %+v", c)
	}
	cfg.MaxBytes = -1
	if _, err := js.UpdateStream(ctx, cfg); err != nil {
		t.Fatal(err)
	}
	if r := must[subjects.EnqueueBatchReply](e, subjects.OpEnqueueBatch, "q", batch); len(r.Messages) != 3 || r.Messages[2].Duplicate {
		t.Fatalf("the batch again: %+v", r)
	}
	e.waitStreamMsgs("natstone-bodies", 3)
}

// TestEnqueueReplacesARecordWithoutPayload: a record the broker does not know, whose payload is
// gone, is what a broker stopped past its claim on the store leaves when it writes after another
// took over and deleted its payload as an orphan. An enqueue of that id replaces it instead of
// answering with a message whose payload cannot be read.
func TestEnqueueReplacesARecordWithoutPayload(t *testing.T) {
	t.Parallel()
	e := setup(t)
	e.create("q", subjects.CreateQueueRequest{})
	ctx := context.Background()
	store, err := kv.Open(ctx, &kv.Config{JS: e.jetStream()})
	if err != nil {
		t.Fatal(err)
	}
	left := kv.Record{ID: "x", State: subjects.StatePending, BodySeq: 1 << 40, Version: 1, MaxAttempts: 3}
	if _, err := store.WriteMessage("q", &left, 0).Wait(ctx); err != nil {
		t.Fatal(err)
	}
	r := e.enqueue("q", subjects.EnqueueRequest{ID: "x", Payload: "hi"})
	if r.Duplicate || r.State != subjects.StatePending {
		t.Fatalf("enqueue over the record without payload: %+v, want a new pending message", r)
	}
	m := e.dequeueOne("q")
	if m.ID != "x" || m.Payload == nil || *m.Payload != "hi" {
		t.Fatalf("dequeue: %+v, want x with payload hi", m)
	}
}
