package broker_test

import (
	"context"
	"log/slog"
	"slices"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/natstone/natstone/broker"
	"github.com/natstone/natstone/kv"
	"github.com/natstone/natstone/subjects"
)

// enqueueValues enqueues each id with the value of its first letter for key p, in the order given.
func (e *env) enqueueValues(queue string, ids ...string) {
	e.t.Helper()
	for i, id := range ids {
		e.enqueue(queue, subjects.EnqueueRequest{ID: id, Priority: ptr(int64(i)), Metadata: subjects.Pairs{"p": id[:1]}})
	}
}

// complete completes the running message id of queue under its current lease.
func (e *env) complete(queue, id string) {
	e.t.Helper()
	m := e.get(queue, id)
	must[subjects.Message](e, subjects.OpComplete, queue, subjects.LeaseRequest{ID: id, LeaseID: m.LeaseID})
}

// store opens the KV store the broker uses, on the test's own connection.
func (e *env) store() *kv.Store {
	e.t.Helper()
	s, err := kv.Open(context.Background(), &kv.Config{JS: e.jetStream()})
	if err != nil {
		e.t.Fatal(err)
	}
	return s
}

// TestMaxRunningPerValue: an exclusive queue with max_running_per_value 2 runs up to two messages
// of a value at once (one batch may take both), each in a lock slot of its own; a third waits until one ends, and a parked poll gets it. Lowering the limit below what
// runs leases nothing of the value until enough have ended; raising it serves at once.
func TestMaxRunningPerValue(t *testing.T) {
	t.Parallel()
	e := setup(t)
	info := e.create("x", subjects.CreateQueueRequest{Type: subjects.Exclusive, ExclusivityKey: "p", MaxRunningPerValue: 2, LeaseMS: time.Minute.Milliseconds()})
	if info.Config.MaxRunningPerValue != 2 {
		t.Fatalf("created with %+v, want max_running_per_value 2", info.Config)
	}
	e.enqueueValues("x", "a1", "a2", "a3", "b1", "a4")

	if got := ids(e.dequeue("x", subjects.DequeueRequest{Batch: 10})); !slices.Equal(got, []string{"a1", "a2", "b1"}) {
		t.Fatalf("a batch of 10 leased %v, want a1, a2, b1: two of a, in EDF order", got)
	}
	if got := e.dequeue("x", subjects.DequeueRequest{Batch: 10}); len(got) != 0 {
		t.Fatalf("with two of a running, a dequeue leased %v", ids(got))
	}
	for slot, id := range []string{"a1", "a2"} {
		l, _, err := e.store().GetSlot(context.Background(), "x", "a", slot)
		if err != nil || l.MessageID != id {
			t.Fatalf("slot %d of a: %+v, %v; want %s's", slot, l, err, id)
		}
	}

	polled := e.asyncDequeue("x", subjects.DequeueRequest{WaitMS: 60_000})
	e.waitTimers(2) // the leases' timer, and the poll's
	e.complete("x", "a1")
	if got := ids(receive(t, polled)); !slices.Equal(got, []string{"a3"}) {
		t.Fatalf("the parked poll got %v after a1 completed, want a3", got)
	}

	// Lowered to 1 with a2 and a3 running: nothing of a until both ended.
	if info := must[subjects.QueueInfo](e, subjects.OpUpdate, "x", subjects.UpdateQueueRequest{MaxRunningPerValue: ptr(1)}); info.Config.MaxRunningPerValue != 1 {
		t.Fatalf("updated: %+v", info.Config)
	}
	e.complete("x", "a2")
	if got := e.dequeue("x", subjects.DequeueRequest{}); len(got) != 0 {
		t.Fatalf("with a3 running under max_running_per_value 1, a dequeue leased %v", ids(got))
	}
	must[subjects.QueueInfo](e, subjects.OpUpdate, "x", subjects.UpdateQueueRequest{MaxRunningPerValue: ptr(3)})
	if got := ids(e.dequeue("x", subjects.DequeueRequest{})); !slices.Equal(got, []string{"a4"}) {
		t.Fatalf("raised to 3 with a3 running: leased %v, want a4", got)
	}
}

// TestMaxRunningPerValueAcrossRestarts: two running messages of a value, each in its slot, survive a
// restart: the value stays full, both complete under their leases, and then the next runs.
func TestMaxRunningPerValueAcrossRestarts(t *testing.T) {
	cleanRestarts(t, func(t *testing.T, restart func(e *env)) {
		e := setup(t)
		e.create("x", subjects.CreateQueueRequest{Type: subjects.Exclusive, ExclusivityKey: "p", MaxRunningPerValue: 2, LeaseMS: time.Hour.Milliseconds()})
		e.enqueueValues("x", "a1", "a2", "a3")
		e.dequeue("x", subjects.DequeueRequest{})
		e.dequeue("x", subjects.DequeueRequest{})
		restart(e)
		if got := e.dequeue("x", subjects.DequeueRequest{}); len(got) != 0 {
			t.Fatalf("after a restart with a1 and a2 running, a dequeue leased %v", ids(got))
		}
		e.complete("x", "a2")
		if got := ids(e.dequeue("x", subjects.DequeueRequest{})); !slices.Equal(got, []string{"a3"}) {
			t.Fatalf("after a2 completed: leased %v, want a3", got)
		}
		e.complete("x", "a1")
		e.complete("x", "a3")
	})
}

// TestLoweredMaxRunningPerValueAcrossARestart: a start that finds more running messages of a value
// than a lowered max_running_per_value, each under a slot of its own, says so at INFO: that is
// what the lowering leaves. One of them under no slot (another take overwrote it) is an ERROR.
func TestLoweredMaxRunningPerValueAcrossARestart(t *testing.T) {
	t.Parallel()
	logs := &levels{}
	e := setup(t, func(c *broker.Config) { c.Logger = slog.New(logs) })
	e.create("x", subjects.CreateQueueRequest{Type: subjects.Exclusive, ExclusivityKey: "p", MaxRunningPerValue: 2, LeaseMS: time.Hour.Milliseconds()})
	e.enqueueValues("x", "a1", "a2")
	e.dequeue("x", subjects.DequeueRequest{Batch: 2})
	must[subjects.QueueInfo](e, subjects.OpUpdate, "x", subjects.UpdateQueueRequest{MaxRunningPerValue: ptr(1)})
	over := "more running messages share an exclusivity value than max_running_per_value"
	e.restartAll()
	if got := logs.of(over); !slices.Equal(got, []slog.Level{slog.LevelInfo}) {
		t.Fatalf("a restart after the lowering logged %v, want one INFO", got)
	}
	e.storeLock("x", "a", 1, "a3", "elsewhere")
	e.restartAll()
	if got := logs.of(over); !slices.Equal(got, []slog.Level{slog.LevelInfo, slog.LevelError}) {
		t.Fatalf("a restart with a running message under no slot logged %v, want an ERROR after the INFO", got)
	}
}

// levels records the level of every message logged.
type levels struct {
	mu   sync.Mutex
	msgs []string
	lvls []slog.Level
}

func (h *levels) Enabled(context.Context, slog.Level) bool { return true }

func (h *levels) Handle(_ context.Context, r slog.Record) error {
	h.mu.Lock()
	defer h.mu.Unlock()
	h.msgs, h.lvls = append(h.msgs, r.Message), append(h.lvls, r.Level)
	return nil
}

func (h *levels) WithAttrs([]slog.Attr) slog.Handler { return h }
func (h *levels) WithGroup(string) slog.Handler      { return h }

// of returns the levels of the messages logged so far that begin with prefix.
func (h *levels) of(prefix string) []slog.Level {
	h.mu.Lock()
	defer h.mu.Unlock()
	var got []slog.Level
	for i, m := range h.msgs {
		if strings.HasPrefix(m, prefix) {
			got = append(got, h.lvls[i])
		}
	}
	return got
}

// TestForeignSlotOutlivesAConflictingLease: another writer moved a message's record and took a slot
// of its value for it, its lease on the way. This broker's take of that slot conflicts, and so does
// its own lease of the message, on another slot: that frees its own slot, not the other writer's,
// whose lease could still land, so the value (two running at most) has room for one message, not
// two. The message's complete here, a write that lands, frees both.
func TestForeignSlotOutlivesAConflictingLease(t *testing.T) {
	t.Parallel()
	e := setup(t)
	ctx := context.Background()
	e.create("x", subjects.CreateQueueRequest{Type: subjects.Exclusive, ExclusivityKey: "p", MaxRunningPerValue: 2, LeaseMS: time.Hour.Milliseconds()})
	e.enqueueValues("x", "a1", "a2", "a3")
	st := e.store()
	r, rev, err := st.GetMessage(ctx, "x", "a1")
	if err != nil {
		t.Fatal(err)
	}
	if _, err := st.WriteMessage("x", &r, rev).Wait(ctx); err != nil { // the other writer's read of a1, moved on
		t.Fatal(err)
	}
	e.storeLock("x", "a", 0, "a1", "elsewhere")
	fails(e, subjects.CodeUnavailable, subjects.OpDequeue, "x", subjects.DequeueRequest{}) // slot 0's take conflicts
	fails(e, subjects.CodeUnavailable, subjects.OpDequeue, "x", subjects.DequeueRequest{}) // a1's lease, on slot 1, conflicts
	if got := ids(e.dequeue("x", subjects.DequeueRequest{Batch: 3})); !slices.Equal(got, []string{"a1"}) {
		t.Fatalf("with slot 0 still the other writer's: leased %v, want a1 alone", got)
	}
	e.complete("x", "a1")
	if got := ids(e.dequeue("x", subjects.DequeueRequest{Batch: 3})); !slices.Equal(got, []string{"a2", "a3"}) {
		t.Fatalf("once a1 completed here: leased %v, want a2 and a3", got)
	}
}

// TestMaxRunningPerValueBadConfig: max_running_per_value is 1 to MaxPerValueLimit, for exclusive
// queues only; an exclusive queue created without it has 1, a simple queue none.
func TestMaxRunningPerValueBadConfig(t *testing.T) {
	t.Parallel()
	e := setup(t)
	before := e.snap()
	for _, r := range []subjects.CreateQueueRequest{
		{MaxRunningPerValue: 2},
		{Type: subjects.Exclusive, ExclusivityKey: "p", MaxRunningPerValue: -1},
		{Type: subjects.Exclusive, ExclusivityKey: "p", MaxRunningPerValue: subjects.MaxPerValueLimit + 1},
	} {
		fails(e, subjects.CodeInvalidConfig, subjects.OpCreate, "q", r)
	}
	e.unchanged(before)
	if c := e.create("x", subjects.CreateQueueRequest{Type: subjects.Exclusive, ExclusivityKey: "p"}).Config; c.MaxRunningPerValue != 1 {
		t.Fatalf("an exclusive queue's default: %+v, want max_running_per_value 1", c)
	}
	if c := e.create("s", subjects.CreateQueueRequest{}).Config; c.MaxRunningPerValue != 0 {
		t.Fatalf("a simple queue: %+v, want no max_running_per_value", c)
	}
	if c := e.create("y", subjects.CreateQueueRequest{Type: subjects.Exclusive, ExclusivityKey: "p", MaxRunningPerValue: subjects.MaxPerValueLimit}).Config; c.MaxRunningPerValue != subjects.MaxPerValueLimit {
		t.Fatalf("at the limit: %+v", c)
	}
	before = e.snap()
	fails(e, subjects.CodeInvalidConfig, subjects.OpUpdate, "x", subjects.UpdateQueueRequest{MaxRunningPerValue: ptr(0)})
	fails(e, subjects.CodeInvalidConfig, subjects.OpUpdate, "s", subjects.UpdateQueueRequest{MaxRunningPerValue: ptr(1)})
	e.unchanged(before)
	// The same create again (without the field, or with its default) is the same queue.
	e.create("x", subjects.CreateQueueRequest{Type: subjects.Exclusive, ExclusivityKey: "p", MaxRunningPerValue: 1})
	fails(e, subjects.CodeQueueExists, subjects.OpCreate, "x", subjects.CreateQueueRequest{Type: subjects.Exclusive, ExclusivityKey: "p", MaxRunningPerValue: 2})
}

// TestMaxRunningPerValueConflictNamingARunningMessage: a take whose CAS conflicts with a slot naming
// a message that runs here in another slot (under another lease, written by a broker that served
// before) keeps that slot taken for that message; when the message ends, both its slots are free,
// not one: the value is not left a slot short until a restart.
func TestMaxRunningPerValueConflictNamingARunningMessage(t *testing.T) {
	t.Parallel()
	e := setup(t)
	e.create("x", subjects.CreateQueueRequest{Type: subjects.Exclusive, ExclusivityKey: "p", MaxRunningPerValue: 2, LeaseMS: time.Minute.Milliseconds()})
	e.enqueueValues("x", "a1", "a2", "a3")
	a1 := e.dequeueOne("x") // slot 0
	if a1.ID != "a1" {
		t.Fatalf("dequeued %s", a1.ID)
	}
	locks, err := e.jetStream().KeyValue(context.Background(), "natstone-locks")
	if err != nil {
		t.Fatal(err)
	}
	// A late take of slot 1 by a broker that served before (split brain), naming a1 under a lease
	// a1 does not run under here.
	if _, err := locks.Put(context.Background(), kv.SlotKey("x", "a", 1), []byte(`{"message_id":"a1","lease_id":"elsewhere"}`)); err != nil {
		t.Fatal(err)
	}
	fails(e, subjects.CodeUnavailable, subjects.OpDequeue, "x", subjects.DequeueRequest{}) // a2's take of slot 1 conflicts
	e.complete("x", "a1")                                                                  // a1 ends: neither slot can hold anything now
	a2 := e.dequeueOne("x")
	if a2.ID != "a2" {
		t.Fatalf("dequeued %s, want a2", a2.ID)
	}
	if got := ids(e.dequeue("x", subjects.DequeueRequest{})); !slices.Equal(got, []string{"a3"}) {
		t.Fatalf("a1 ended, only a2 runs, max_running_per_value 2: dequeued %v, want a3", got)
	}
}

// TestMaxRunningPerValueRestartKeepsRunningRecords: with N > 1 a slot commonly keeps naming an
// earlier lease of a message leased again into another slot; a restart does not fence that
// message's record (a late write of that earlier lease would conflict with the writes since): its
// version stays.
func TestMaxRunningPerValueRestartKeepsRunningRecords(t *testing.T) {
	e := setup(t)
	e.create("x", subjects.CreateQueueRequest{Type: subjects.Exclusive, ExclusivityKey: "p", MaxRunningPerValue: 2, LeaseMS: time.Hour.Milliseconds()})
	e.enqueueValues("x", "a1", "a2", "a3")
	e.dequeueOne("x")       // a1, slot 0
	a2 := e.dequeueOne("x") // a2, slot 1
	e.complete("x", "a1")   // slot 0 free
	must[subjects.Message](e, subjects.OpRelease, "x", subjects.ReleaseRequest{ID: "a2", LeaseID: a2.LeaseID})
	if got := e.dequeueOne("x"); got.ID != "a2" { // a2 again, into slot 0; slot 1 still names its first lease
		t.Fatalf("got %s", got.ID)
	}
	before := e.get("x", "a2").Version
	e.restartAll()
	if after := e.get("x", "a2").Version; after != before {
		t.Fatalf("running a2's version moved across a restart: %d -> %d (fenced)", before, after)
	}
}
