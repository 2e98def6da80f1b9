package broker_test

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"slices"
	"strings"
	"testing"
	"time"

	"github.com/nats-io/nats.go/jetstream"

	"github.com/natstone/natstone/kv"
	"github.com/natstone/natstone/subjects"
	"github.com/natstone/natstone/test/natstest"
)

// TestStateDiagram walks every transition of Timestone's figure 4 (and release, our addition).
func TestStateDiagram(t *testing.T) {
	t.Parallel()
	e := setup(t)
	e.create("q", subjects.CreateQueueRequest{MaxAttempts: 2, LeaseMS: 10_000, RetentionMS: ptr[int64](60_000)})

	t.Run("invisible becomes pending when its window ends", func(t *testing.T) {
		r := e.enqueue("q", subjects.EnqueueRequest{ID: "inv", InvisibleMS: ptr[int64](5_000)})
		if r.State != subjects.StateInvisible || !r.VisibleAt.Equal(e.clk.Now().Add(5*time.Second)) {
			t.Fatalf("enqueue: %+v", r)
		}
		if ms := e.dequeue("q", subjects.DequeueRequest{}); len(ms) != 0 {
			t.Fatalf("dequeued an invisible message: %v", ids(ms))
		}
		e.advance(4_999 * time.Millisecond)
		if got := e.get("q", "inv").State; got != subjects.StateInvisible {
			t.Fatalf("state before window end = %s", got)
		}
		e.advance(time.Millisecond)
		m := e.get("q", "inv")
		if m.State != subjects.StatePending || m.Version != 2 {
			t.Fatalf("after window: %s v%d", m.State, m.Version)
		}
		got := e.dequeueOne("q")
		must[subjects.Message](e, subjects.OpComplete, "q", subjects.LeaseRequest{ID: got.ID, LeaseID: got.LeaseID})
	})

	t.Run("dequeue leases, complete ends", func(t *testing.T) {
		e.enqueue("q", subjects.EnqueueRequest{ID: "c", Payload: "p"})
		m := e.dequeueOne("q")
		if m.State != subjects.StateRunning || m.Attempts != 1 || m.AttemptsLeft != 1 || m.LeaseID == "" {
			t.Fatalf("dequeued: %+v", m)
		}
		if want := e.clk.Now().Add(10 * time.Second); m.LeaseExpiresAt == nil || !m.LeaseExpiresAt.Equal(want) {
			t.Fatalf("lease expires %v, want %v", m.LeaseExpiresAt, want)
		}
		done := must[subjects.Message](e, subjects.OpComplete, "q", subjects.LeaseRequest{ID: "c", LeaseID: m.LeaseID})
		if done.State != subjects.StateCompleted || done.EndedAt == nil || done.Version != 3 {
			t.Fatalf("completed: %+v", done)
		}
	})

	t.Run("extend pushes the lease", func(t *testing.T) {
		e.enqueue("q", subjects.EnqueueRequest{ID: "x"})
		m := e.dequeueOne("q")
		e.advance(8 * time.Second)
		ext := must[subjects.Message](e, subjects.OpExtend, "q", subjects.ExtendRequest{ID: "x", LeaseID: m.LeaseID, LeaseMS: 20_000})
		if want := e.clk.Now().Add(20 * time.Second); !ext.LeaseExpiresAt.Equal(want) {
			t.Fatalf("extended to %v, want %v", ext.LeaseExpiresAt, want)
		}
		e.advance(15 * time.Second) // past the original expiry, within the extension
		if got := e.get("q", "x").State; got != subjects.StateRunning {
			t.Fatalf("state after original expiry = %s, want running", got)
		}
		must[subjects.Message](e, subjects.OpComplete, "q", subjects.LeaseRequest{ID: "x", LeaseID: m.LeaseID})
	})

	t.Run("lease expiry spends an attempt, the last one errors", func(t *testing.T) {
		e.enqueue("q", subjects.EnqueueRequest{ID: "exp"})
		m1 := e.dequeueOne("q")
		e.advance(10 * time.Second)
		m := e.get("q", "exp")
		if m.State != subjects.StatePending || m.Attempts != 1 || m.AttemptsLeft != 1 {
			t.Fatalf("after first expiry: %+v", m)
		}
		if !m.VisibleAt.Equal(m.UpdatedAt) || m.VisibleAt.Before(*m1.LeaseExpiresAt) {
			t.Fatalf("visible_at %v, want when it became pending again, at its lease's end %v", m.VisibleAt, m1.LeaseExpiresAt)
		}
		m2 := e.dequeueOne("q")
		if m2.Attempts != 2 || m2.LeaseID == m1.LeaseID {
			t.Fatalf("second lease: %+v", m2)
		}
		e.advance(10 * time.Second)
		m = e.get("q", "exp")
		if m.State != subjects.StateErrored || m.AttemptsLeft != 0 || m.EndedAt == nil {
			t.Fatalf("after last expiry: %+v", m)
		}
	})

	t.Run("release gives back now or after a delay", func(t *testing.T) {
		e.enqueue("q", subjects.EnqueueRequest{ID: "rel"})
		m := e.dequeueOne("q")
		r := must[subjects.Message](e, subjects.OpRelease, "q", subjects.ReleaseRequest{ID: "rel", LeaseID: m.LeaseID, DelayMS: 3_000})
		if r.State != subjects.StateInvisible || !r.VisibleAt.Equal(e.clk.Now().Add(3*time.Second)) {
			t.Fatalf("released with delay: %+v", r)
		}
		e.advance(3 * time.Second)
		m = e.dequeueOne("q")
		if m.ID != "rel" || m.Attempts != 2 {
			t.Fatalf("re-dequeued: %+v", m)
		}
		// Out of attempts: a release errors it rather than make it pending forever.
		r = must[subjects.Message](e, subjects.OpRelease, "q", subjects.ReleaseRequest{ID: "rel", LeaseID: m.LeaseID})
		if r.State != subjects.StateErrored {
			t.Fatalf("release of the last attempt: %s", r.State)
		}
	})

	t.Run("cancel works on pending, invisible and running", func(t *testing.T) {
		e.enqueue("q", subjects.EnqueueRequest{ID: "cp"})
		e.enqueue("q", subjects.EnqueueRequest{ID: "ci", InvisibleMS: ptr[int64](1_000)})
		for _, id := range []string{"cp", "ci"} {
			c := must[subjects.Message](e, subjects.OpCancel, "q", subjects.LeaseRequest{ID: id})
			if c.State != subjects.StateCanceled {
				t.Fatalf("cancel %s: %s", id, c.State)
			}
		}
		e.enqueue("q", subjects.EnqueueRequest{ID: "cr"})
		m := e.dequeueOne("q")
		c := must[subjects.Message](e, subjects.OpCancel, "q", subjects.LeaseRequest{ID: "cr", LeaseID: m.LeaseID})
		if c.State != subjects.StateCanceled {
			t.Fatalf("cancel running: %s", c.State)
		}
		e.advance(time.Second) // the invisible one's window ends: it must stay canceled
		if got := e.get("q", "ci").State; got != subjects.StateCanceled {
			t.Fatalf("canceled invisible became %s", got)
		}
	})

	t.Run("terminal messages are collected after retention", func(t *testing.T) {
		before := e.depth("q", nil)
		if before.Completed == 0 || before.Canceled == 0 || before.Errored == 0 {
			t.Fatalf("expected terminal messages before GC: %+v", before)
		}
		e.advance(60 * time.Second)
		after := e.depth("q", nil)
		if after != (subjects.Counts{}) {
			t.Fatalf("after retention: %+v", after)
		}
		fails(e, subjects.CodeMessageNotFound, subjects.OpGet, "q", subjects.GetRequest{ID: "c"})
		// The id is free again once collected.
		if r := e.enqueue("q", subjects.EnqueueRequest{ID: "c"}); r.Duplicate || r.Version != 1 {
			t.Fatalf("re-enqueue after GC: %+v", r)
		}
	})
}

// TestCollectionsBatched: a queue's garbage collections are at least 100 ms apart. The first
// message due is collected when its retention ends; one that comes due less than 100 ms later waits
// for the next collection, 100 ms after the first, and so does everything due by then.
func TestCollectionsBatched(t *testing.T) {
	t.Parallel()
	e := setup(t)
	e.create("q", subjects.CreateQueueRequest{RetentionMS: ptr[int64](1000)})
	complete := func(id string) {
		e.enqueue("q", subjects.EnqueueRequest{ID: id})
		m := e.dequeueOne("q")
		must[subjects.Message](e, subjects.OpComplete, "q", subjects.LeaseRequest{ID: m.ID, LeaseID: m.LeaseID})
	}
	exists := func(id string) bool {
		_, err := call[subjects.Message](e, subjects.OpGet, "q", subjects.GetRequest{ID: id})
		return err == nil
	}
	complete("a") // ends at t0, due at t0+1s
	e.advance(40 * time.Millisecond)
	complete("b") // due at t0+1.04s
	e.advance(960 * time.Millisecond)
	if exists("a") || !exists("b") {
		t.Fatalf("at a's deadline: a exists %v, b exists %v; want a collected, b not yet", exists("a"), exists("b"))
	}
	e.advance(40 * time.Millisecond)
	complete("c") // due at t0+2.04s
	if !exists("b") {
		t.Fatal("b was collected at its own deadline, less than 100 ms after the last collection")
	}
	e.advance(60 * time.Millisecond) // t0+1.1s: the next collection
	if exists("b") || !exists("c") {
		t.Fatalf("100 ms after the first collection: b exists %v, c exists %v; want b collected, c not yet", exists("b"), exists("c"))
	}
	e.advance(940 * time.Millisecond) // t0+2.04s: c's deadline, long after the last collection
	if exists("c") {
		t.Fatal("c still there at its deadline, with no collection in the 100 ms before")
	}
}

func TestEDFOrderWithTies(t *testing.T) {
	t.Parallel()
	e := setup(t)
	prios := []int64{50, 10, 30, 10, 50, -5, 30, 10}
	for i, p := range prios {
		e.enqueue("q", subjects.EnqueueRequest{ID: string(rune('a' + i)), Priority: ptr(p)})
	}
	// Ascending priority, ties in enqueue order.
	want := []string{"f", "b", "d", "h", "c", "g", "a", "e"}
	var got []string
	for range prios {
		got = append(got, e.dequeueOne("q").ID)
	}
	if !slices.Equal(got, want) {
		t.Fatalf("order %v, want %v", got, want)
	}
	if ms := e.dequeue("q", subjects.DequeueRequest{}); len(ms) != 0 {
		t.Fatalf("queue should be empty, got %v", ids(ms))
	}
}

func TestDefaultPriorityIsEnqueueTime(t *testing.T) {
	t.Parallel()
	e := setup(t)
	a := e.enqueue("q", subjects.EnqueueRequest{ID: "a"})
	if a.Priority != e.clk.Now().UnixMilli() {
		t.Fatalf("default priority %d, want now %d", a.Priority, e.clk.Now().UnixMilli())
	}
	e.advance(time.Millisecond)
	e.enqueue("q", subjects.EnqueueRequest{ID: "b"})
	e.enqueue("q", subjects.EnqueueRequest{ID: "urgent", Priority: ptr(a.Priority - 1)})
	if got := ids(e.dequeue("q", subjects.DequeueRequest{Batch: 3})); !slices.Equal(got, []string{"urgent", "a", "b"}) {
		t.Fatalf("order %v", got)
	}
}

// TestExclusiveFigure5 is the article's figure 5: with foo leased, the next dequeue skips the more
// urgent msg_1 (foo) and leases msg_2 (bar).
func TestExclusiveFigure5(t *testing.T) {
	t.Parallel()
	e := setup(t)
	e.create("x", subjects.CreateQueueRequest{Type: subjects.Exclusive, ExclusivityKey: "project"})
	e.enqueue("x", subjects.EnqueueRequest{ID: "msg_0", Priority: ptr[int64](0), Metadata: map[string]string{"project": "foo"}})
	e.enqueue("x", subjects.EnqueueRequest{ID: "msg_1", Priority: ptr[int64](1), Metadata: map[string]string{"project": "foo"}})
	e.enqueue("x", subjects.EnqueueRequest{ID: "msg_2", Priority: ptr[int64](2), Metadata: map[string]string{"project": "bar"}})

	w1 := e.dequeueOne("x")
	if w1.ID != "msg_0" {
		t.Fatalf("worker_1 got %s", w1.ID)
	}
	w2 := e.dequeueOne("x")
	if w2.ID != "msg_2" {
		t.Fatalf("worker_2 got %s, want msg_2 (foo is leased)", w2.ID)
	}
	if ms := e.dequeue("x", subjects.DequeueRequest{}); len(ms) != 0 {
		t.Fatalf("both values are leased, yet got %v", ids(ms))
	}
	must[subjects.Message](e, subjects.OpComplete, "x", subjects.LeaseRequest{ID: "msg_0", LeaseID: w1.LeaseID})
	if got := e.dequeueOne("x").ID; got != "msg_1" {
		t.Fatalf("after foo is free: got %s, want msg_1", got)
	}
}

func TestExclusiveBatchTakesOnePerValue(t *testing.T) {
	t.Parallel()
	e := setup(t)
	e.create("x", subjects.CreateQueueRequest{Type: subjects.Exclusive, ExclusivityKey: "p"})
	for i, v := range []string{"a", "a", "b", "a", "c", "b"} {
		e.enqueue("x", subjects.EnqueueRequest{ID: string(rune('0' + i)), Priority: ptr(int64(i)), Metadata: map[string]string{"p": v}})
	}
	got := e.dequeue("x", subjects.DequeueRequest{Batch: 10})
	if !slices.Equal(ids(got), []string{"0", "2", "4"}) {
		t.Fatalf("batch %v, want one per value [0 2 4]", ids(got))
	}
	// An expired lease frees its value too.
	e.advance(30 * time.Second)
	got = e.dequeue("x", subjects.DequeueRequest{Batch: 10})
	if !slices.Equal(ids(got), []string{"0", "2", "4"}) {
		t.Fatalf("after expiry %v, want the same three again", ids(got))
	}
}

func TestFilters(t *testing.T) {
	t.Parallel()
	e := setup(t)
	md := []map[string]string{
		{"region": "eu", "kind": "video"},
		{"region": "us", "kind": "video"},
		{"region": "eu", "kind": "audio"},
		{"region": "eu", "kind": "video", "tier": "gold"},
		nil,
	}
	for i, m := range md {
		e.enqueue("q", subjects.EnqueueRequest{ID: string(rune('a' + i)), Priority: ptr(int64(10 - i)), Metadata: m})
	}
	if c := e.depth("q", map[string]string{"region": "eu", "kind": "video"}); c.Pending != 2 {
		t.Fatalf("filtered depth %+v, want 2 pending", c)
	}
	got := e.dequeue("q", subjects.DequeueRequest{Batch: 5, Filter: map[string]string{"region": "eu", "kind": "video"}})
	if !slices.Equal(ids(got), []string{"d", "a"}) {
		t.Fatalf("filtered dequeue %v, want [d a] (EDF among matches)", ids(got))
	}
	if c := e.depth("q", map[string]string{"region": "eu", "kind": "video"}); c.Pending != 0 || c.Running != 2 {
		t.Fatalf("filtered depth after dequeue %+v", c)
	}
	if got := e.dequeue("q", subjects.DequeueRequest{Filter: map[string]string{"region": "mars"}}); len(got) != 0 {
		t.Fatalf("no message matches, got %v", ids(got))
	}
	if got := ids(e.dequeue("q", subjects.DequeueRequest{Batch: 5})); !slices.Equal(got, []string{"e", "c", "b"}) {
		t.Fatalf("unfiltered rest %v", got)
	}
}

func TestBatchEnqueueAndDequeue(t *testing.T) {
	t.Parallel()
	e := setup(t)
	var batch subjects.EnqueueBatchRequest
	for i := range 20 {
		batch.Messages = append(batch.Messages, subjects.EnqueueRequest{Priority: ptr(int64(20 - i)), Payload: string(rune('A' + i))})
	}
	// The same client id twice in one batch is one message.
	batch.Messages = append(batch.Messages, subjects.EnqueueRequest{ID: "dup", Priority: ptr[int64](100)}, subjects.EnqueueRequest{ID: "dup", Priority: ptr[int64](100)})
	rep := must[subjects.EnqueueBatchReply](e, subjects.OpEnqueueBatch, "q", batch)
	if len(rep.Messages) != 22 || rep.Messages[20].Duplicate || !rep.Messages[21].Duplicate || rep.Messages[21].ID != "dup" {
		t.Fatalf("batch reply: %+v", rep.Messages[19:])
	}
	if c := e.depth("q", nil); c.Pending != 21 {
		t.Fatalf("depth %+v, want 21 pending", c)
	}
	got := e.dequeue("q", subjects.DequeueRequest{Batch: 10})
	if len(got) != 10 || *got[0].Payload != "T" || *got[9].Payload != "K" {
		t.Fatalf("batch dequeue: %d messages, first %q last %q", len(got), *got[0].Payload, *got[len(got)-1].Payload)
	}
}

func TestRawEnqueueBinaryPayload(t *testing.T) {
	t.Parallel()
	e := setup(t)
	payload := []byte{0, 1, 2, 0xff, 0xfe, '\n'}
	msg := natsMsg(e.space.Subject(subjects.OpEnqueueRaw, "bin"), payload, map[string]string{
		subjects.HeaderID:       "raw-1",
		subjects.HeaderPriority: "-7",
		subjects.HeaderMetadata: `{"k":"v"}`,
	})
	reply, err := e.nc.RequestMsg(msg, 5*time.Second)
	if err != nil {
		t.Fatal(err)
	}
	r, rerr := decodeReply[subjects.EnqueueReply](t, reply)
	if rerr != nil || r.ID != "raw-1" || r.Priority != -7 {
		t.Fatalf("raw enqueue: %+v %v", r, rerr)
	}
	m := e.dequeueOne("bin")
	if string(m.PayloadBytes()) != string(payload) || m.Payload != nil || m.Metadata["k"] != "v" {
		t.Fatalf("dequeued %+v", m)
	}
}

// TestExclusiveValueFreedWithoutLockWrite: a lock holds its value only while the message that took
// it runs under that lease, so leaving running (complete, release, expiry, cancel) frees the value
// with no write to the locks bucket, and a restart that finds a lock whose holder does not run
// writes nothing either. Each take writes the lock once, over the last holder's.
func TestExclusiveValueFreedWithoutLockWrite(t *testing.T) {
	t.Parallel()
	e := setup(t)
	e.create("x", subjects.CreateQueueRequest{Type: subjects.Exclusive, ExclusivityKey: "p", LeaseMS: 60_000})
	for i, id := range []string{"a1", "a2", "a3", "a4"} {
		e.enqueue("x", subjects.EnqueueRequest{ID: id, Priority: ptr(int64(i)), Metadata: map[string]string{"p": "a"}})
	}
	locks := func() jetstream.KeyValue { // on the connection of the moment: restarts replace it
		t.Helper()
		bucket, err := e.jetStream().KeyValue(context.Background(), "natstone-locks")
		if err != nil {
			t.Fatal(err)
		}
		return bucket
	}
	lockWrites := func() uint64 {
		t.Helper()
		st, err := e.jetStream().Stream(context.Background(), "KV_natstone-locks")
		if err != nil {
			t.Fatal(err)
		}
		return st.CachedInfo().State.LastSeq
	}
	take := func(want string) subjects.Message {
		t.Helper()
		before := lockWrites()
		m := e.dequeueOne("x")
		if m.ID != want {
			t.Fatalf("dequeued %s, want %s", m.ID, want)
		}
		if got := lockWrites(); got != before+1 {
			t.Fatalf("the take of %s wrote %d locks, want 1", want, got-before)
		}
		v, err := locks().Get(context.Background(), kv.LockKey("x", "a"))
		if err != nil {
			t.Fatal(err)
		}
		var l kv.Lock
		if err := json.Unmarshal(v.Value(), &l); err != nil {
			t.Fatal(err)
		}
		if l.MessageID != m.ID || l.LeaseID != m.LeaseID {
			t.Fatalf("lock %+v after %s's take under %s", l, m.ID, m.LeaseID)
		}
		return m
	}
	noLockWrite := func(what string, do func()) {
		t.Helper()
		before := lockWrites()
		do()
		if got := lockWrites(); got != before {
			t.Fatalf("%s wrote %d locks, want none", what, got-before)
		}
	}

	a1 := take("a1")
	noLockWrite("a complete", func() {
		must[subjects.Message](e, subjects.OpComplete, "x", subjects.LeaseRequest{ID: a1.ID, LeaseID: a1.LeaseID})
	})
	a2 := take("a2") // over a1's lock, which still names a1
	noLockWrite("a release", func() {
		must[subjects.Message](e, subjects.OpRelease, "x", subjects.ReleaseRequest{ID: a2.ID, LeaseID: a2.LeaseID})
	})
	take("a2")
	noLockWrite("a lease's expiry", func() {
		e.advance(61 * time.Second)
		if m := e.get("x", "a2"); m.State != subjects.StatePending || m.Attempts != 2 {
			t.Fatalf("a2 after its lease expired: %s, %d attempts", m.State, m.Attempts)
		}
	})
	a2 = take("a2")
	noLockWrite("a cancel", func() {
		must[subjects.Message](e, subjects.OpCancel, "x", subjects.LeaseRequest{ID: a2.ID, LeaseID: a2.LeaseID})
	})

	// The lock names a2, which is canceled: after a restart the value is free, and the recovery
	// wrote nothing to free it.
	noLockWrite("a restart", e.restartAll)
	a3 := take("a3")
	must[subjects.Message](e, subjects.OpComplete, "x", subjects.LeaseRequest{ID: a3.ID, LeaseID: a3.LeaseID})

	// A crash between a take and its lease leaves a lock naming a pending message: it holds nothing.
	// The start fences the message's record (a lease write still on its way from an earlier broker
	// would land otherwise) and frees the lock, once: the next start finds nothing to fence.
	if _, err := locks().Put(context.Background(), kv.LockKey("x", "a"), []byte(`{"message_id":"a4","lease_id":"never"}`)); err != nil {
		t.Fatal(err)
	}
	before := lockWrites()
	e.restartAll()
	if got := lockWrites() - before; got != 1 {
		t.Fatalf("a restart over a lock of a lease never stored wrote %d locks, want 1 (it frees it)", got)
	}
	noLockWrite("the next restart", e.restartAll)
	take("a4")
}

// TestExclusiveLockGoesWithItsValuesLastMessage: a value's lock key stays while the queue has a
// message of the value, in any state, and goes with the collection of its last one, so that an
// exclusive queue keeps keys only for the values of the messages it holds, not for every value it
// has seen. The value taken again creates its key anew, over the marker the removal left. A key
// of a value without messages found at a start (an earlier version kept them all) goes soon after
// it, whether the queue collects anything or not.
func TestExclusiveLockGoesWithItsValuesLastMessage(t *testing.T) {
	t.Parallel()
	e := setup(t)
	ctx := context.Background()
	e.create("x", subjects.CreateQueueRequest{Type: subjects.Exclusive, ExclusivityKey: "p", RetentionMS: ptr[int64](0)})
	for i, id := range []string{"a1", "a2", "b1"} {
		e.enqueue("x", subjects.EnqueueRequest{ID: id, Priority: ptr(int64(i)), Metadata: map[string]string{"p": id[:1]}})
	}
	slot := func(value string) (kv.Lock, error) {
		t.Helper()
		l, _, err := e.store().GetSlot(ctx, "x", value, 0)
		return l, err
	}
	run := func(ids ...string) {
		t.Helper()
		for _, id := range ids {
			m := e.dequeueOne("x")
			if m.ID != id {
				t.Fatalf("dequeued %s, want %s", m.ID, id)
			}
			must[subjects.Message](e, subjects.OpComplete, "x", subjects.LeaseRequest{ID: m.ID, LeaseID: m.LeaseID})
		}
		e.advance(time.Second)
		for _, id := range ids {
			fails(e, subjects.CodeMessageNotFound, subjects.OpGet, "x", subjects.GetRequest{ID: id}) // collected
		}
	}

	values := func(want int) {
		t.Helper()
		for _, qs := range e.b.Snapshot().Queues {
			if qs.Name == "x" {
				if qs.ExclusivityValues != want {
					t.Fatalf("the snapshot counts %d exclusivity values, want %d", qs.ExclusivityValues, want)
				}
				return
			}
		}
		t.Fatal("x is not in the snapshot")
	}
	values(2)
	run("a1")
	values(2)
	if l, err := slot("a"); err != nil || l.MessageID != "a1" {
		t.Fatalf("a's lock once a1 is collected and a2 waits: %+v, %v; want it naming a1", l, err)
	}
	run("a2", "b1")
	values(0)
	for _, v := range []string{"a", "b"} {
		if l, err := slot(v); !errors.Is(err, kv.ErrNotFound) {
			t.Fatalf("%s's lock once its last message is collected: %+v, %v; want none", v, l, err)
		}
	}

	// Taken again at once, over the marker, and gone again with the value's last message.
	e.enqueue("x", subjects.EnqueueRequest{ID: "a3", Metadata: map[string]string{"p": "a"}})
	m := e.dequeueOne("x")
	if l, err := slot("a"); err != nil || l.MessageID != "a3" || l.LeaseID != m.LeaseID {
		t.Fatalf("a's lock taken again by %s under %s: %+v, %v", m.ID, m.LeaseID, l, err)
	}
	must[subjects.Message](e, subjects.OpComplete, "x", subjects.LeaseRequest{ID: m.ID, LeaseID: m.LeaseID})
	e.advance(time.Second)
	if l, err := slot("a"); !errors.Is(err, kv.ErrNotFound) {
		t.Fatalf("a's lock once a3 is collected: %+v, %v; want none", l, err)
	}

	// A start counts the messages it loads: d's key stays while d2 waits. A key left behind for a
	// value without messages goes soon after the start.
	e.enqueue("x", subjects.EnqueueRequest{ID: "d1", Priority: ptr[int64](0), Metadata: map[string]string{"p": "d"}})
	e.enqueue("x", subjects.EnqueueRequest{ID: "d2", Priority: ptr[int64](1), Metadata: map[string]string{"p": "d"}})
	m = e.dequeueOne("x")
	must[subjects.Message](e, subjects.OpComplete, "x", subjects.LeaseRequest{ID: m.ID, LeaseID: m.LeaseID})
	e.storeLock("x", "z", 0, "z1", "earlier")
	e.restartAll()
	if l, err := slot("z"); err != nil || l.MessageID != "z1" {
		t.Fatalf("z's lock right after the start: %+v, %v", l, err)
	}
	e.advance(time.Second)
	fails(e, subjects.CodeMessageNotFound, subjects.OpGet, "x", subjects.GetRequest{ID: "d1"}) // collected
	if l, err := slot("d"); err != nil || l.MessageID != "d1" {
		t.Fatalf("d's lock once d1 is collected after a start and d2 waits: %+v, %v; want it naming d1", l, err)
	}
	if l, err := slot("z"); !errors.Is(err, kv.ErrNotFound) {
		t.Fatalf("z's lock a second after the start: %+v, %v; want none", l, err)
	}
	run("d2")
	e.waitNoKeys("KV_natstone-locks", "$KV.natstone-locks.x.>") // the markers go too

	// A queue with nothing to collect sweeps such keys too.
	e.storeLock("x", "y", 0, "y1", "earlier")
	e.restartAll()
	e.advance(time.Second)
	if l, err := slot("y"); !errors.Is(err, kv.ErrNotFound) {
		t.Fatalf("y's lock a second after a start, the queue empty: %+v, %v; want none", l, err)
	}
}

// TestDequeueReplyFitsMaxPayload: a batch whose payloads would make the reply larger than the
// server's max_payload (1 MiB) leases only as many messages as the reply can carry: a reply over it
// is dropped, and the leases would run out unseen, a retry with the request id failing the same way.
func TestDequeueReplyFitsMaxPayload(t *testing.T) {
	t.Parallel()
	e := setup(t)
	payload := strings.Repeat("x", subjects.DefaultMaxPayloadBytes)
	for i := range 40 {
		e.enqueue("q", subjects.EnqueueRequest{ID: fmt.Sprintf("m%02d", i), Payload: payload})
	}
	first := e.dequeue("q", subjects.DequeueRequest{Batch: 40, RequestID: "big"})
	if n := len(first); n < 2 || n >= 32 {
		t.Fatalf("leased %d messages of 32 KiB in one reply, want as many as fit in 1 MiB", n)
	}
	if c := e.depth("q", nil); c.Running != len(first) || c.Pending != 40-len(first) {
		t.Fatalf("depth %+v after a reply of %d: a message was leased that the reply does not carry", c, len(first))
	}
	for _, m := range first {
		if m.Payload == nil || *m.Payload != payload {
			t.Fatalf("%s came without its payload", m.ID)
		}
	}
	if retry := e.dequeue("q", subjects.DequeueRequest{Batch: 40, RequestID: "big"}); !slices.Equal(ids(retry), ids(first)) {
		t.Fatalf("the retry got %v, want %v", ids(retry), ids(first))
	}
	// A message alone is always leased, whatever its size.
	big := strings.Repeat("y", 600<<10)
	must[subjects.QueueInfo](e, subjects.OpCreate, "big", subjects.CreateQueueRequest{MaxPayloadBytes: subjects.MaxPayloadBytes})
	e.enqueue("big", subjects.EnqueueRequest{ID: "a", Payload: big[:subjects.MaxPayloadBytes]})
	e.enqueue("big", subjects.EnqueueRequest{ID: "b", Payload: big[:subjects.MaxPayloadBytes]})
	if got := ids(e.dequeue("big", subjects.DequeueRequest{Batch: 2})); !slices.Equal(got, []string{"a"}) {
		t.Fatalf("two of 512 KiB: leased %v, want a alone", got)
	}
	// The messages count, not the queue's limits, which apply to later enqueues only: lowered, they
	// say nothing of the messages already there.
	must[subjects.QueueInfo](e, subjects.OpCreate, "lowered", subjects.CreateQueueRequest{MaxPayloadBytes: subjects.MaxPayloadBytes})
	for i := range 15 {
		e.enqueue("lowered", subjects.EnqueueRequest{ID: fmt.Sprintf("m%02d", i), Payload: big[:100<<10]})
	}
	must[subjects.QueueInfo](e, subjects.OpUpdate, "lowered", subjects.UpdateQueueRequest{MaxPayloadBytes: ptr(subjects.DefaultMaxPayloadBytes)})
	if n := len(e.dequeue("lowered", subjects.DequeueRequest{Batch: 15})); n < 2 || n > 9 {
		t.Fatalf("leased %d messages of 100 KiB in one reply, want as many as fit in 1 MiB", n)
	}
}

// escapedMetadata is as much metadata as a queue takes by default, of the character that JSON
// escapes grow the most among those metadata may hold: the quote, two bytes each.
func escapedMetadata() map[string]string {
	md := make(map[string]string, subjects.DefaultMaxMetadataPairs)
	for k := range subjects.DefaultMaxMetadataPairs {
		md[fmt.Sprintf("k%d", k)] = strings.Repeat(`"`, subjects.MaxMetadataValueLen)
	}
	return md
}

// TestReplyFitsWhateverTheEscapes: payloads and metadata that JSON escapes grow the most — bytes that
// are valid UTF-8 but control characters, six bytes each in a JSON string, and quotes — still come
// in a reply the server takes: such a payload comes as payload_base64, and a reply carries as many
// messages as are sure to fit. So does a settle's next, beside the settled message.
func TestReplyFitsWhateverTheEscapes(t *testing.T) {
	t.Parallel()
	e := setup(t)
	nuls := []byte(strings.Repeat("\x00", subjects.DefaultMaxPayloadBytes))
	for i := range 40 {
		e.enqueue("q", subjects.EnqueueRequest{ID: fmt.Sprintf("m%02d", i), PayloadBase64: nuls, Metadata: escapedMetadata()})
	}
	first := e.dequeue("q", subjects.DequeueRequest{Batch: 40})
	if n := len(first); n < 2 || n >= 20 {
		t.Fatalf("leased %d messages of 32 KiB of NULs in one reply, want as many as fit in 1 MiB", n)
	}
	if c := e.depth("q", nil); c.Running != len(first) {
		t.Fatalf("depth %+v after a reply of %d: a message was leased that the reply does not carry", c, len(first))
	}
	for _, m := range first {
		if m.Payload != nil || string(m.PayloadBase64) != string(nuls) {
			t.Fatalf("%s: payload %.20q, base64 %d bytes: want the NULs as payload_base64", m.ID, m.PayloadBytes(), len(m.PayloadBase64))
		}
	}
	r := settleNext(e, subjects.OpComplete, "q", subjects.LeaseRequest{ID: first[0].ID, LeaseID: first[0].LeaseID,
		Next: &subjects.DequeueRequest{Batch: 40}})
	if r.Next.Error != nil || len(r.Next.Messages) < 2 || len(r.Next.Messages) >= len(first)+1 {
		t.Fatalf("complete with next: %d messages (%v), want as many as fit beside the completed one", len(r.Next.Messages), r.Next.Error)
	}
	if c := e.depth("q", nil); c.Running != len(first)-1+len(r.Next.Messages) {
		t.Fatalf("depth %+v after a next of %d: a message was leased that the reply does not carry", c, len(r.Next.Messages))
	}
}

// TestSettleNextLeavesRoomForTheSettledMessage: a settle's next leases a message only if it fits in
// the reply beside the settled message. On a server that takes 256 KiB, a message of some 249 KB in
// a reply (a payload that is half quotes) fits alone, but not beside a settled message with 16 KB of
// metadata: the next leases nothing, and a dequeue gets it alone.
func TestSettleNextLeavesRoomForTheSettledMessage(t *testing.T) {
	t.Parallel()
	e := setupOn(t, &natstest.Options{MaxPayload: 256 << 10})
	e.create("q", subjects.CreateQueueRequest{MaxPayloadBytes: subjects.MaxPayloadBytes})
	e.enqueue("q", subjects.EnqueueRequest{ID: "settled", Priority: ptr(int64(0)), Metadata: escapedMetadata()})
	big := strings.Repeat(`a"`, 83_000)
	e.enqueue("q", subjects.EnqueueRequest{ID: "big", Priority: ptr(int64(1)), Payload: big})
	m := e.dequeueOne("q")
	r := settleNext(e, subjects.OpComplete, "q", subjects.LeaseRequest{ID: m.ID, LeaseID: m.LeaseID, Next: &subjects.DequeueRequest{}})
	if r.State != subjects.StateCompleted || len(r.Next.Messages) != 0 || r.Next.Error != nil {
		t.Fatalf("complete with next: %s, next %v (%v); want completed, and nothing leased", r.State, ids(r.Next.Messages), r.Next.Error)
	}
	if got := e.dequeueOne("q"); got.ID != "big" || got.Payload == nil || *got.Payload != big {
		t.Fatalf("dequeued %s with %d bytes of payload, want big whole", got.ID, len(got.PayloadBytes()))
	}
}

// TestEnqueueRefusesWhatNoReplyCarries: on a server with a small max_payload, a message that a
// dequeue's reply could not carry even alone is refused (payload_too_large): it could never be
// delivered. Nothing is written, not even the queue the enqueue would have created.
func TestEnqueueRefusesWhatNoReplyCarries(t *testing.T) {
	t.Parallel()
	e := setupOn(t, &natstest.Options{MaxPayload: 64 << 10})
	payload := strings.Repeat("x", subjects.DefaultMaxPayloadBytes)
	err := fails(e, subjects.CodePayloadTooLarge, subjects.OpEnqueue, "q", subjects.EnqueueRequest{ID: "big", Payload: payload, Metadata: escapedMetadata()})
	if !strings.Contains(err.Message, "max_payload") {
		t.Errorf("the error does not name max_payload: %s", err.Message)
	}
	fails(e, subjects.CodeQueueNotFound, subjects.OpInfo, "q", nil)
	// Without the metadata it fits, and comes back whole.
	e.enqueue("q", subjects.EnqueueRequest{ID: "fits", Payload: payload})
	if m := e.dequeueOne("q"); m.ID != "fits" || m.Payload == nil || *m.Payload != payload {
		t.Fatalf("dequeued %s with a payload of %d bytes, want fits with %d", m.ID, len(m.PayloadBytes()), len(payload))
	}
}

// TestEnqueueVisibleAt: visible_at keeps a message invisible until that time, by the broker's
// clock (a fraction of a millisecond up to the next one: not before the time asked), in the JSON
// form and in the raw one's header; a time that has come is
// pending at once, whatever the queue's invisibility. With invisible_ms, or further ahead than
// subjects.MaxInvisible, or a header that is no RFC 3339 time, the enqueue is refused and writes
// nothing.
func TestEnqueueVisibleAt(t *testing.T) {
	t.Parallel()
	e := setup(t)
	e.create("q", subjects.CreateQueueRequest{InvisibleMS: 60_000})
	now := e.clk.Now()
	at := now.Add(90*time.Second + 700*time.Microsecond)
	want := time.UnixMilli(at.UnixMilli() + 1)
	if r := e.enqueue("q", subjects.EnqueueRequest{ID: "json", VisibleAt: &at}); r.State != subjects.StateInvisible || !r.VisibleAt.Equal(want) {
		t.Fatalf("enqueue visible at %v: %+v, want invisible until %v", at, r, want)
	}
	if r := e.rawOK("q", map[string]string{subjects.HeaderID: "raw", subjects.HeaderVisibleAt: at.In(time.FixedZone("", 3600)).Format(time.RFC3339Nano)}, []byte("p")); r.State != subjects.StateInvisible || !r.VisibleAt.Equal(want) {
		t.Fatalf("raw enqueue visible at %v: %+v, want invisible until %v", at, r, want)
	}
	past := now.Add(-time.Hour)
	if r := e.enqueue("q", subjects.EnqueueRequest{ID: "past", VisibleAt: &past}); r.State != subjects.StatePending || !r.VisibleAt.Equal(now) {
		t.Fatalf("enqueue visible at an hour ago: %+v, want pending now", r)
	}
	m := e.dequeueOne("q")
	if m.ID != "past" {
		t.Fatalf("dequeued %s, want past", m.ID)
	}
	must[subjects.Message](e, subjects.OpComplete, "q", subjects.LeaseRequest{ID: m.ID, LeaseID: m.LeaseID})

	tooFar := now.Add(subjects.MaxInvisible + time.Millisecond)
	farthest := now.Add(subjects.MaxInvisible)
	runErrCases(t, e, nil, []errCase{
		{"with invisible_ms", subjects.OpEnqueue, "q", subjects.EnqueueRequest{ID: "x", VisibleAt: &at, InvisibleMS: ptr[int64](1)}, subjects.CodeBadRequest},
		{"too far", subjects.OpEnqueue, "q", subjects.EnqueueRequest{ID: "x", VisibleAt: &tooFar}, subjects.CodeOutOfRange},
		{"not a time", subjects.OpEnqueue, "q", `{"id": "x", "visible_at": "tomorrow"}`, subjects.CodeBadRequest},
		{"third too far", subjects.OpEnqueueBatch, "q", subjects.EnqueueBatchRequest{Messages: []subjects.EnqueueRequest{{ID: "x"}, {ID: "y"}, {ID: "z", VisibleAt: &tooFar}}}, subjects.CodeOutOfRange},
	})
	se := e.on(t)
	before := se.snap()
	se.checkErrReply(se.raw("q", map[string]string{subjects.HeaderID: "x", subjects.HeaderVisibleAt: "2026-11-28 09:00"}, []byte("p")), subjects.CodeBadRequest, "raw, not RFC 3339")
	se.checkErrReply(se.raw("q", map[string]string{subjects.HeaderID: "x", subjects.HeaderVisibleAt: at.Format(time.RFC3339), subjects.HeaderInvisibleMS: "5"}, []byte("p")), subjects.CodeBadRequest, "raw, with invisible")
	se.unchanged(before)
	if r := e.enqueue("q", subjects.EnqueueRequest{ID: "farthest", VisibleAt: &farthest}); r.State != subjects.StateInvisible || !r.VisibleAt.Equal(farthest) {
		t.Fatalf("enqueue visible at the bound: %+v", r)
	}

	e.advance(90 * time.Second) // 0.7 ms before the time asked
	if c := e.depth("q", nil); c.Invisible != 3 || c.Pending != 0 {
		t.Fatalf("before the time: %+v, want json, raw and farthest invisible", c)
	}
	e.advance(time.Millisecond)
	if c := e.depth("q", nil); c.Invisible != 1 || c.Pending != 2 {
		t.Fatalf("past the time: %+v, want json and raw pending", c)
	}
}

// TestDelayedMessageQueuesByReadiness: a message enqueued without a priority gets the time it can
// run, so one made invisible takes its place behind those enqueued before its time came and ahead
// of those after, as a schedule's fire does; it does not jump the queue when it comes due.
func TestDelayedMessageQueuesByReadiness(t *testing.T) {
	t.Parallel()
	e := setup(t)
	e.create("q", subjects.CreateQueueRequest{})
	start := e.clk.Now()
	if r := e.enqueue("q", subjects.EnqueueRequest{ID: "in 5s", InvisibleMS: ptr[int64](5_000)}); r.Priority != start.Add(5*time.Second).UnixMilli() {
		t.Fatalf("invisible 5 s: priority %d, want %d", r.Priority, start.Add(5*time.Second).UnixMilli())
	}
	at := start.Add(3 * time.Second)
	if r := e.enqueue("q", subjects.EnqueueRequest{ID: "at 3s", VisibleAt: &at}); r.Priority != at.UnixMilli() {
		t.Fatalf("visible at 3 s: priority %d, want %d", r.Priority, at.UnixMilli())
	}
	e.advance(time.Second)
	e.enqueue("q", subjects.EnqueueRequest{ID: "1s"})
	e.advance(5 * time.Second)
	e.enqueue("q", subjects.EnqueueRequest{ID: "6s"})
	if got := ids(e.dequeue("q", subjects.DequeueRequest{Batch: 4})); !slices.Equal(got, []string{"1s", "at 3s", "in 5s", "6s"}) {
		t.Fatalf("dequeued %v, want each by when it could run", got)
	}
}
