package broker

import (
	"context"
	"errors"
	"fmt"
	"io"
	"log/slog"
	"slices"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/nats-io/nats.go"
	"github.com/nats-io/nats.go/jetstream"

	"github.com/natstone/natstone/broker/clock"
	"github.com/natstone/natstone/kv"
	"github.com/natstone/natstone/subjects"
	"github.com/natstone/natstone/test/natstest"
)

func internalBroker(t testing.TB) (*Broker, *clock.Fake) {
	t.Helper()
	return internalBrokerLogging(t, slog.New(slog.NewTextHandler(io.Discard, nil)))
}

// internalBrokerLogging is internalBroker logging to log.
func internalBrokerLogging(t testing.TB, log *slog.Logger) (*Broker, *clock.Fake) {
	t.Helper()
	srv := natstest.Start(t, nil)
	clk := clock.NewFake(time.UnixMilli(1_700_000_000_000))
	return startedBroker(t, &Config{Conn: srv.Connect(t), Clock: clk, Logger: log}), clk
}

// queueQ makes queue q, of the default configuration, on b.
func queueQ(t testing.TB, b *Broker) *queue {
	t.Helper()
	q, _, err := b.createQueue(context.Background(), "q", subjects.CreateQueueRequest{})
	if err != nil {
		t.Fatal(err)
	}
	return q
}

// startedBroker starts a broker of cfg, stopped when the test ends.
func startedBroker(t testing.TB, cfg *Config) *Broker {
	t.Helper()
	b, err := New(cfg)
	if err != nil {
		t.Fatal(err)
	}
	if err := b.Start(context.Background()); err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() {
		if err := b.Stop(context.Background()); err != nil {
			t.Error(err)
		}
	})
	return b
}

// recordedLogs is a slog.Handler that keeps every record, its attributes (the logger's too) as
// strings, for a test to look through.
type recordedLogs struct {
	mu      sync.Mutex
	records []recordedLog
	attrs   []slog.Attr // the logger's own (With), on a handler sharing records with its parent
	parent  *recordedLogs
}

type recordedLog struct {
	level slog.Level
	msg   string
	attrs map[string]string
}

func (h *recordedLogs) root() *recordedLogs {
	if h.parent != nil {
		return h.parent
	}
	return h
}

func (h *recordedLogs) Enabled(context.Context, slog.Level) bool { return true }

func (h *recordedLogs) Handle(_ context.Context, r slog.Record) error {
	attrs := map[string]string{}
	for _, a := range h.attrs {
		attrs[a.Key] = a.Value.String()
	}
	r.Attrs(func(a slog.Attr) bool {
		attrs[a.Key] = a.Value.String()
		return true
	})
	root := h.root()
	root.mu.Lock()
	defer root.mu.Unlock()
	root.records = append(root.records, recordedLog{level: r.Level, msg: r.Message, attrs: attrs})
	return nil
}

func (h *recordedLogs) WithAttrs(as []slog.Attr) slog.Handler {
	return &recordedLogs{attrs: slices.Concat(h.attrs, as), parent: h.root()}
}

func (h *recordedLogs) WithGroup(string) slog.Handler { return h }

// find returns the attributes of the records at level with message msg.
func (h *recordedLogs) find(level slog.Level, msg string) []map[string]string {
	root := h.root()
	root.mu.Lock()
	defer root.mu.Unlock()
	var out []map[string]string
	for _, r := range root.records {
		if r.level == level && r.msg == msg {
			out = append(out, r.attrs)
		}
	}
	return out
}

// internalQueue is internalBroker with queue "q" created by req.
func internalQueue(t testing.TB, req subjects.CreateQueueRequest) (*Broker, *clock.Fake, *queue) {
	t.Helper()
	b, clk := internalBroker(t)
	q, _, err := b.createQueue(context.Background(), "q", req)
	if err != nil {
		t.Fatal(err)
	}
	return b, clk, q
}

// putLock stores data as the lock of value in queue q, behind the broker's back.
func putLock(t testing.TB, b *Broker, value string, data []byte) {
	t.Helper()
	ctx := context.Background()
	js, err := jetstream.New(b.cfg.Conn)
	if err != nil {
		t.Fatal(err)
	}
	locks, err := js.KeyValue(ctx, kv.DefaultPrefix+"-locks")
	if err != nil {
		t.Fatal(err)
	}
	if _, err := locks.Put(ctx, kv.LockKey("q", value), data); err != nil {
		t.Fatal(err)
	}
}

// TestWaiterReservation: a message handed to a long-polling dequeue is reserved until the dequeue's
// goroutine leases it. A cancel that comes in between waits, and then cancels the running message —
// it must not be undone by the dequeue (it once was: the cancel was acknowledged and the message
// came back running).
func TestWaiterReservation(t *testing.T) {
	b, clk, q := internalQueue(t, subjects.CreateQueueRequest{})
	ctx := context.Background()
	if _, err := q.enqueue(ctx, []subjects.EnqueueRequest{{ID: "M", Metadata: map[string]string{"k": "b"}}}); err != nil {
		t.Fatal(err)
	}
	type result struct {
		ms  []subjects.Message
		err error
	}
	dequeued := make(chan result, 1)
	go func() {
		ms, err := q.dequeue(ctx, subjects.DequeueRequest{WaitMS: 60_000, Filter: map[string]string{"k": "a"}})
		dequeued <- result{ms, err}
	}()
	wctx, cancel := context.WithTimeout(ctx, 10*time.Second)
	defer cancel()
	if err := clk.WaitForTimers(wctx, 1); err != nil { // the long poll is parked
		t.Fatal(err)
	}
	canceled := make(chan result, 1)
	q.mu.Lock()
	q.waiters[0].filter = nil // M becomes what it waits for
	q.serveWaiters()
	go func() { // the cancel starts while M is handed over but not yet leased
		m, err := q.cancel(ctx, subjects.LeaseRequest{ID: "M"})
		canceled <- result{[]subjects.Message{m}, err}
	}()
	q.mu.Unlock()

	d := <-dequeued
	c := <-canceled
	if d.err != nil || len(d.ms) != 1 || d.ms[0].ID != "M" {
		t.Fatalf("dequeue: %+v %v", d.ms, d.err)
	}
	if c.err != nil || c.ms[0].State != subjects.StateCanceled {
		t.Fatalf("cancel: %+v %v", c.ms, c.err)
	}
	stored, _, err := b.store.GetMessage(ctx, "q", "M")
	if err != nil || stored.State != subjects.StateCanceled {
		t.Fatalf("stored: %s %v", stored.State, err)
	}
	if _, err := q.complete(ctx, subjects.LeaseRequest{ID: "M", LeaseID: d.ms[0].LeaseID}); !errors.Is(err, &subjects.Error{Code: subjects.CodeInvalidState}) {
		t.Fatalf("completing the canceled message: %v", err)
	}
}

// TestResolveLearnsAWriteThatLanded: a write whose acknowledgement was lost (here: reported as a
// timeout though it was stored) is settled by issuing it again — the conflict that follows shows
// storage holds exactly what it wrote.
func TestResolveLearnsAWriteThatLanded(t *testing.T) {
	logs := &recordedLogs{}
	b, _ := internalBrokerLogging(t, slog.New(logs))
	ctx := context.Background()
	q := queueQ(t, b)
	rev, next := pendingM(t, b)
	landed, err := b.store.WriteMessage("q", &next, rev).Wait(ctx)
	if err != nil {
		t.Fatal(err)
	}
	c := &change{next: next, expect: rev, err: errors.New("nats: timeout")}
	q.resolve(c)
	if c.err != nil || c.rev != landed {
		t.Fatalf("resolve: err %v rev %d, want nil and %d", c.err, c.rev, landed)
	}
	// Settled without a doubt left, but the message was held meanwhile (up to a write timeout for
	// each issue): that is logged, or a value held past its lease would have no trace.
	if got := logs.find(slog.LevelWarn, "message write outcome not known yet; issuing it again"); len(got) != 1 || got[0]["message_id"] != "m" {
		t.Fatalf("warnings of the write issued again: %v, want one naming m", got)
	}

	// Somebody else's write: a conflict with the truth attached.
	other := next
	other.Version, other.UpdatedAt, other.LeaseID = 3, 3, "L2"
	if _, err := b.store.WriteMessage("q", &other, landed).Wait(ctx); err != nil {
		t.Fatal(err)
	}
	mine := next
	mine.Version, mine.UpdatedAt, mine.State = 3, 4, subjects.StateCompleted
	c = &change{next: mine, expect: landed, err: kv.ErrConflict}
	q.resolve(c)
	if !errors.Is(c.err, kv.ErrConflict) || c.truth == nil || c.truth.LeaseID != "L2" {
		t.Fatalf("conflict: err %v truth %+v", c.err, c.truth)
	}
}

// TestResolveReadAskedAgainWhenUnanswered: the read that settles a write's conflict, of a message
// record or of a lock slot, is asked again when a try gets no answer within a tick, as a payload
// read is (ackWatch.read). A read that a stream's leader took and lost with itself is answered by
// nobody; the read waited out the store's 10 s before it was asked again. Here the server sends
// the first try nowhere (a subject mapping, taken away once the try is seen), and the write is
// settled within seconds of that, with a tick of half a second.
func TestResolveReadAskedAgainWhenUnanswered(t *testing.T) {
	t.Parallel()
	srv := natstest.Start(t, nil)
	b := startedBroker(t, &Config{Conn: srv.Connect(t), Clock: clock.NewFake(time.UnixMilli(1_700_000_000_000)),
		Logger: slog.New(slog.NewTextHandler(io.Discard, nil)), WriteTimeout: 2 * time.Second})
	q := queueQ(t, b)
	ctx := context.Background()

	rec := kv.Record{ID: "m", State: subjects.StatePending, Version: 1, UpdatedAt: 1}
	landed, err := b.store.WriteMessage("q", &rec, 0).Wait(ctx)
	if err != nil {
		t.Fatal(err)
	}
	want := kv.Lock{MessageID: "m", LeaseID: "L"}
	slotLanded, err := b.store.WriteSlot("q", "v", 1, want, 0).Wait(ctx)
	if err != nil {
		t.Fatal(err)
	}

	for _, tc := range []struct {
		stream  string
		resolve func() (uint64, error)
		landed  uint64
	}{
		{"KV_" + kv.DefaultPrefix + "-messages", func() (uint64, error) {
			c := &change{next: rec, err: kv.ErrConflict, create: true}
			q.resolve(c)
			return c.rev, c.err
		}, landed},
		{"KV_" + kv.DefaultPrefix + "-locks", func() (uint64, error) {
			w := &lockWrite{value: "v", slot: 1, want: want, err: kv.ErrConflict}
			q.resolveLock(ctx, w)
			return w.rev, w.err
		}, slotLanded},
	} {
		acc := srv.NATS().GlobalAccount()
		get, lost := "$JS.API.STREAM.MSG.GET."+tc.stream, "lost.get"
		seen := make(chan struct{}, 1)
		watch := srv.Connect(t)
		if _, err := watch.Subscribe(lost, func(*nats.Msg) {
			select {
			case seen <- struct{}{}:
			default:
			}
		}); err != nil {
			t.Fatal(err)
		}
		if err := watch.Flush(); err != nil {
			t.Fatal(err)
		}
		if err := acc.AddMapping(get, lost); err != nil {
			t.Fatal(err)
		}
		type result struct {
			rev uint64
			err error
		}
		done := make(chan result, 1)
		go func() {
			rev, err := tc.resolve()
			done <- result{rev, err}
		}()
		waitOn(t, seen)
		acc.RemoveMapping(get)
		select {
		case r := <-done:
			if r.err != nil || r.rev != tc.landed {
				t.Fatalf("%s: resolved to revision %d, %v; want %d", tc.stream, r.rev, r.err, tc.landed)
			}
		case <-time.After(5 * time.Second):
			t.Fatalf("%s: the write not settled within 5 s of its read's first try lost", tc.stream)
		}
	}
}

// pendingM stores message m of queue q pending, and returns its revision and the record of its
// lease L, not stored.
func pendingM(t *testing.T, b *Broker) (uint64, kv.Record) {
	t.Helper()
	rec := kv.Record{ID: "m", State: subjects.StatePending, Version: 1, UpdatedAt: 1}
	rev, err := b.store.WriteMessage("q", &rec, 0).Wait(context.Background())
	if err != nil {
		t.Fatal(err)
	}
	rec.State, rec.Version, rec.UpdatedAt, rec.LeaseID = subjects.StateRunning, 2, 2, "L"
	return rev, rec
}

// TestResolveTakesNoTruthFromAServerBehind: a write that conflicted proves storage holds a revision
// past the one it expected, so a read back that finds that revision or an older one came from a
// server behind (a stream's leader just elected, before it applied what it had committed: a run of
// TestFaultsClusterServersUnannounced reloaded two messages so, dropping leases its dequeue had
// taken). Such a read leaves the write's outcome unknown, to be asked again, rather than making
// the record read the truth. Here the server is not behind: the write expects a revision storage
// never had, which looks the same from the broker.
func TestResolveTakesNoTruthFromAServerBehind(t *testing.T) {
	t.Parallel()
	b, _ := internalBroker(t)
	ctx := context.Background()
	q := queueQ(t, b)
	rev, next := pendingM(t, b)
	c := &change{next: next, expect: rev + 100, err: kv.ErrConflict}
	q.resolve(c)
	if !errors.Is(c.err, errStaleRead) || c.truth != nil {
		t.Fatalf("resolve after a read of revision %d for a write expecting %d: err %v, truth %+v; want errStaleRead and no truth", rev, rev+100, c.err, c.truth)
	}
	slot, err := b.store.WriteSlot("q", "v", 1, kv.Lock{MessageID: "m", LeaseID: "L"}, 0).Wait(ctx)
	if err != nil {
		t.Fatal(err)
	}
	w := &lockWrite{value: "v", slot: 1, want: kv.Lock{MessageID: "m", LeaseID: "L2"}, expect: slot + 100, err: kv.ErrConflict}
	q.resolveLock(ctx, w)
	if !errors.Is(w.err, errStaleRead) || w.truth != nil {
		t.Fatalf("resolveLock after a read of revision %d for a write expecting %d: err %v, truth %+v; want errStaleRead and no truth", slot, slot+100, w.err, w.truth)
	}
}

// TestConflictTakesOtherWritersRecord: another writer stored message x (its own payload and
// priority) after this broker looked and before its create landed. The create conflicts, and the
// broker must take the stored record whole — priority, payload and metadata included — rather than
// keep what it meant to write: the reply, the dequeue and the next write all follow storage.
func TestConflictTakesOtherWritersRecord(t *testing.T) {
	b, clk, q := internalQueue(t, subjects.CreateQueueRequest{})
	ctx := context.Background()
	seq, err := b.store.WriteBody("q", "x", []byte("theirs")).Wait(ctx)
	if err != nil {
		t.Fatal(err)
	}
	now := clk.Now().UnixMilli()
	theirs := kv.Record{ID: "x", State: subjects.StatePending, Priority: 5, BodySeq: seq, PayloadSize: 6,
		Metadata: map[string]string{"who": "them"}, Version: 1, MaxAttempts: 5, EnqueuedAt: now, VisibleAt: now, UpdatedAt: now}
	if _, err := b.store.WriteMessage("q", &theirs, 0).Wait(ctx); err != nil {
		t.Fatal(err)
	}
	replies, err := q.enqueue(ctx, []subjects.EnqueueRequest{{ID: "x", Payload: "ours", Metadata: map[string]string{"who": "us"}}})
	if err != nil {
		t.Fatal(err)
	}
	if r := replies[0]; r.Priority != 5 || r.Version != 1 || !r.Duplicate {
		t.Errorf("enqueue reply %+v: want the stored record's priority 5, version 1, a duplicate", r)
	}
	if gone, err := b.store.BodyGone(ctx, seq+1); err != nil || !gone {
		t.Errorf("the payload the enqueue stored and no record references: gone %v, %v", gone, err)
	}
	ms, err := q.dequeue(ctx, subjects.DequeueRequest{Filter: map[string]string{"who": "them"}})
	if err != nil {
		t.Fatal(err)
	}
	if len(ms) != 1 || ms[0].Payload == nil || *ms[0].Payload != "theirs" || ms[0].Priority != 5 || ms[0].Metadata["who"] != "them" {
		t.Fatalf("dequeue by the stored metadata: %+v, want x with the stored payload, priority and metadata", ms)
	}
	stored, _, err := b.store.GetMessage(ctx, "q", "x")
	if err != nil {
		t.Fatal(err)
	}
	if stored.BodySeq != seq || stored.Priority != 5 || stored.Metadata["who"] != "them" || stored.State != subjects.StateRunning {
		t.Errorf("stored after the lease: %+v; want the other writer's payload, priority and metadata, running", stored)
	}
}

// TestRunningMessageGoneFreesItsValue: a running message whose settle finds its record gone from
// storage (removed behind the broker's back) no longer runs, so its exclusivity value is free: the
// next message of the value is leased. It stayed held until a restart.
func TestRunningMessageGoneFreesItsValue(t *testing.T) {
	b, _, q := internalQueue(t, subjects.CreateQueueRequest{Type: subjects.Exclusive, ExclusivityKey: "g"})
	ctx := context.Background()
	one, two := int64(1), int64(2)
	if _, err := q.enqueue(ctx, []subjects.EnqueueRequest{
		{ID: "A", Priority: &one, Metadata: map[string]string{"g": "v"}},
		{ID: "B", Priority: &two, Metadata: map[string]string{"g": "v"}},
	}); err != nil {
		t.Fatal(err)
	}
	ms, err := q.dequeue(ctx, subjects.DequeueRequest{})
	if err != nil || len(ms) != 1 || ms[0].ID != "A" {
		t.Fatalf("dequeue: %+v, %v; want A", ms, err)
	}
	js, err := jetstream.New(b.cfg.Conn)
	if err != nil {
		t.Fatal(err)
	}
	messages, err := js.KeyValue(ctx, kv.DefaultPrefix+"-messages")
	if err != nil {
		t.Fatal(err)
	}
	if err := messages.Purge(ctx, kv.MessageKey("q", "A")); err != nil {
		t.Fatal(err)
	}
	if _, err := q.complete(ctx, subjects.LeaseRequest{ID: "A", LeaseID: ms[0].LeaseID}); err == nil {
		t.Fatal("A's complete succeeded over a record that is gone")
	}
	if q.holds("A") {
		t.Fatal("A is still in the queue after its record was found gone")
	}
	ms, err = q.dequeue(ctx, subjects.DequeueRequest{})
	if err != nil || len(ms) != 1 || ms[0].ID != "B" {
		t.Fatalf("dequeue after A went: %+v, %v; want B, its value free", ms, err)
	}
}

// zeroRetentionQueue creates queue q, which collects what ends at once (retention 0), and enqueues
// messages of ids into it.
func zeroRetentionQueue(t *testing.T, b *Broker, ids ...string) *queue {
	t.Helper()
	ctx := context.Background()
	zero := int64(0)
	q, _, err := b.createQueue(ctx, "q", subjects.CreateQueueRequest{RetentionMS: &zero})
	if err != nil {
		t.Fatal(err)
	}
	reqs := make([]subjects.EnqueueRequest, len(ids))
	for i, id := range ids {
		reqs[i].ID = id
	}
	if _, err := q.enqueue(ctx, reqs); err != nil {
		t.Fatal(err)
	}
	return q
}

// TestCollectionsGatherWhileOneIsInFlight: with retention 0, what completes while a collection is
// in flight waits for the next batch, gcGapMS later and not before the one in flight ended, instead
// of being collected on its own at once (as it was: under load every collection took one or two
// messages).
func TestCollectionsGatherWhileOneIsInFlight(t *testing.T) {
	b, clk := internalBroker(t)
	ctx := context.Background()
	q := zeroRetentionQueue(t, b, "A", "B", "C")
	ms, err := q.dequeue(ctx, subjects.DequeueRequest{Batch: 3})
	if err != nil || len(ms) != 3 {
		t.Fatalf("dequeue: %d messages, %v", len(ms), err)
	}
	complete := func(i int) {
		t.Helper()
		if _, err := q.complete(ctx, subjects.LeaseRequest{ID: ms[i].ID, LeaseID: ms[i].LeaseID}); err != nil {
			t.Fatal(err)
		}
	}
	stored := func(id string) bool {
		t.Helper()
		q.mu.Lock()
		inMemory := q.entries.get(id) != nil
		q.mu.Unlock()
		_, _, err := b.store.GetMessage(ctx, "q", id)
		if inMemory != (err == nil) || (err != nil && !errors.Is(err, kv.ErrNotFound)) {
			t.Fatalf("message %s: in memory %v, in storage: %v", id, inMemory, err)
		}
		return inMemory
	}

	// The first completed message's collection is in flight (its entry is busy) when the timer
	// fires for the second.
	complete(0)
	complete(1)
	q.mu.Lock()
	first := q.entries.get(ms[0].ID)
	first.setBusy(true)
	q.mu.Unlock()
	clk.Advance(0)
	if stored(ms[1].ID) {
		t.Fatalf("%s was not collected", ms[1].ID)
	}

	// The third completes meanwhile: it waits for the next batch.
	complete(2)
	clk.Advance(0)
	clk.Advance(gcGapMS*time.Millisecond - time.Millisecond)
	if !stored(ms[2].ID) {
		t.Fatalf("%s was collected before the next batch was due", ms[2].ID)
	}
	clk.Advance(time.Millisecond)
	if stored(ms[2].ID) {
		t.Fatalf("%s was not collected in the next batch", ms[2].ID)
	}

	// While a collection is in flight (as collect marks it), the timer does not start another,
	// however long it takes.
	q.mu.Lock()
	q.endWrite(first)
	q.collecting = true
	q.unpark()
	q.settle()
	q.mu.Unlock()
	clk.Advance(10 * gcGapMS * time.Millisecond)
	if !stored(ms[0].ID) {
		t.Fatalf("%s was collected while another collection was in flight", ms[0].ID)
	}
	q.mu.Lock()
	q.collectionEnded()
	q.settle()
	q.mu.Unlock()
	clk.Advance(0)
	if stored(ms[0].ID) {
		t.Fatalf("%s was not collected when the collection in flight ended", ms[0].ID)
	}
}

// TestCollectionTakesAnotherRevision: a collection whose record removal conflicts, because storage
// holds another revision of the record (an earlier write of unknown outcome landed, or one that
// does not even decode), removes that revision instead of retrying the same conflict forever: the
// payload is gone already.
func TestCollectionTakesAnotherRevision(t *testing.T) {
	for _, unreadable := range []bool{false, true} {
		t.Run(map[bool]string{false: "readable", true: "unreadable"}[unreadable], func(t *testing.T) {
			testCollectionTakesAnotherRevision(t, unreadable)
		})
	}
}

func testCollectionTakesAnotherRevision(t *testing.T, unreadable bool) {
	b, clk := internalBroker(t)
	ctx := context.Background()
	q := zeroRetentionQueue(t, b, "m")
	ms, err := q.dequeue(ctx, subjects.DequeueRequest{})
	if err != nil || len(ms) != 1 {
		t.Fatalf("dequeue: %v %v", ms, err)
	}
	if _, err := q.complete(ctx, subjects.LeaseRequest{ID: "m", LeaseID: ms[0].LeaseID}); err != nil {
		t.Fatal(err)
	}
	q.mu.Lock()
	e := q.entries.get("m")
	r, rev := e.record(), e.rev
	q.mu.Unlock()
	r.Version++ // the same write again, landed behind the broker's back: a newer revision
	rev, err = b.store.WriteMessage("q", &r, rev).Wait(ctx)
	if err != nil {
		t.Fatal(err)
	}
	if unreadable {
		js, err := jetstream.New(b.cfg.Conn)
		if err != nil {
			t.Fatal(err)
		}
		bucket, err := js.KeyValue(ctx, "natstone-messages")
		if err != nil {
			t.Fatal(err)
		}
		if _, err := bucket.Update(ctx, kv.MessageKey("q", "m"), []byte("not a record"), rev); err != nil {
			t.Fatal(err)
		}
	}

	clk.Advance(0)
	q.mu.Lock()
	kept := q.entries.get("m") != nil
	q.mu.Unlock()
	if kept {
		t.Fatal("the message was not collected")
	}
	if _, _, err := b.store.GetMessage(ctx, "q", "m"); !errors.Is(err, kv.ErrNotFound) {
		t.Fatalf("the record after the collection: %v, want ErrNotFound", err)
	}
}

// TestLockWritesResolvedOneByOne: a lock write whose outcome stays unknown (here: its key holds
// what no lock decodes from, so every read back fails) does not keep the batch's other lock writes
// from being waited for. It once did: they counted as taken at revision 0, whatever storage said.
func TestLockWritesResolvedOneByOne(t *testing.T) {
	b, _, q := internalQueue(t, subjects.CreateQueueRequest{Type: subjects.Exclusive, ExclusivityKey: "g"})
	ctx := context.Background()
	one, two := int64(1), int64(2)
	if _, err := q.enqueue(ctx, []subjects.EnqueueRequest{
		{ID: "A", Priority: &one, Metadata: map[string]string{"g": "v1"}},
		{ID: "B", Priority: &two, Metadata: map[string]string{"g": "v2"}},
	}); err != nil {
		t.Fatal(err)
	}
	putLock(t, b, "v1", []byte("not a lock"))

	ms, err := q.dequeue(ctx, subjects.DequeueRequest{Batch: 2})
	if err != nil {
		t.Fatal(err)
	}
	if len(ms) != 1 || ms[0].ID != "B" {
		t.Fatalf("dequeued %+v, want B alone: A's lock was not taken", ms)
	}
	_, rev, err := b.store.GetSlot(ctx, "q", "v2", 0)
	if err != nil {
		t.Fatal(err)
	}
	q.mu.Lock()
	got := *q.lockOf("v2", 0)
	q.mu.Unlock()
	if got.rev != rev || got.holder != "B" {
		t.Fatalf("v2's lock as the broker knows it: %+v; storage has revision %d", got, rev)
	}
}

// TestUnknownLockWriteAskedAgain: a take whose lock write's outcome stays unknown leases nothing and
// keeps its value held, and the doubt timer asks storage again: once storage shows the lock landed
// (naming a lease that never ran), the value is free, and a retry of the dequeue with the same
// request id leases. Both once waited for a restart. With max_running 1, the lease not written
// leaves no count behind (it would starve the queue).
func TestUnknownLockWriteAskedAgain(t *testing.T) {
	logs := &recordedLogs{}
	b, _ := internalBrokerLogging(t, slog.New(logs))
	ctx := context.Background()
	q, _, err := b.createQueue(ctx, "q", subjects.CreateQueueRequest{Type: subjects.Exclusive, ExclusivityKey: "g", MaxRunning: 1})
	if err != nil {
		t.Fatal(err)
	}
	if _, err := q.enqueue(ctx, []subjects.EnqueueRequest{{ID: "A", Metadata: map[string]string{"g": "v1"}}}); err != nil {
		t.Fatal(err)
	}
	putLock(t, b, "v1", []byte("not a lock")) // every read back fails

	ms, err := q.dequeue(ctx, subjects.DequeueRequest{RequestID: "r1"})
	if !errors.Is(err, &subjects.Error{Code: subjects.CodeUnavailable}) {
		t.Fatalf("dequeue: %+v, %v; want unavailable", ms, err)
	}
	q.mu.Lock()
	doubtful, armed := slices.Clone(q.doubtfulLocks), q.doubtArmed
	q.mu.Unlock()
	if len(doubtful) != 1 || !armed {
		t.Fatalf("doubtful lock writes %d, timer armed %v; want 1 and armed", len(doubtful), armed)
	}
	const reissued = "exclusivity lock write outcome not known yet; issuing it again"
	if got := logs.find(slog.LevelWarn, reissued); len(got) != 1 || got[0]["value"] != "v1" || got[0]["message_id"] != "A" {
		t.Fatalf("warnings of the lock write issued again: %v, want one naming v1 and A", got)
	}
	if ms, err := q.dequeue(ctx, subjects.DequeueRequest{}); err != nil || len(ms) != 0 {
		t.Fatalf("dequeue while the lock is in doubt: %+v, %v; want nothing", ms, err)
	}

	// Storage answers again, and shows that the first write landed.
	putLock(t, b, "v1", kv.EncodeLock(doubtful[0].want))
	q.fireDoubt() // what the timer does when it fires
	q.mu.Lock()
	left := len(q.doubtfulLocks)
	q.mu.Unlock()
	if left != 0 {
		t.Fatalf("%d lock writes still in doubt", left)
	}
	if got := logs.find(slog.LevelWarn, reissued); len(got) != 1 {
		t.Fatalf("warnings of the lock write issued again: %v; want still one (once a write)", got)
	}
	ms, err = q.dequeue(ctx, subjects.DequeueRequest{RequestID: "r1"})
	if err != nil || len(ms) != 1 || ms[0].ID != "A" {
		t.Fatalf("the dequeue's retry: %+v, %v; want A", ms, err)
	}
}

// TestIdleValuesSlotCollectedOnceItsDoubtEnds: a value whose last message is collected while a take
// of its slot is in doubt keeps its slot (not free to remove); once the doubt ends, the slot is
// removed by the next sweep, as it would have been after the value's last message.
func TestIdleValuesSlotCollectedOnceItsDoubtEnds(t *testing.T) {
	b, clk := internalBroker(t)
	ctx := context.Background()
	zero := int64(0)
	q, _, err := b.createQueue(ctx, "q", subjects.CreateQueueRequest{Type: subjects.Exclusive, ExclusivityKey: "g", RetentionMS: &zero})
	if err != nil {
		t.Fatal(err)
	}
	if _, err := q.enqueue(ctx, []subjects.EnqueueRequest{{ID: "A", Metadata: map[string]string{"g": "v1"}}}); err != nil {
		t.Fatal(err)
	}
	putLock(t, b, "v1", []byte("not a lock")) // every read back fails: the take stays in doubt
	if ms, err := q.dequeue(ctx, subjects.DequeueRequest{}); !errors.Is(err, &subjects.Error{Code: subjects.CodeUnavailable}) {
		t.Fatalf("dequeue: %+v, %v; want unavailable", ms, err)
	}
	if _, err := q.cancel(ctx, subjects.LeaseRequest{ID: "A"}); err != nil { // an operator's
		t.Fatal(err)
	}
	clk.Advance(time.Second) // A is collected; v1's slot, in doubt, stays
	if q.holds("A") {
		t.Fatal("A not collected")
	}
	q.mu.Lock()
	doubtful := slices.Clone(q.doubtfulLocks)
	q.mu.Unlock()
	if len(doubtful) != 1 {
		t.Fatalf("%d lock writes in doubt, want 1", len(doubtful))
	}

	putLock(t, b, "v1", kv.EncodeLock(doubtful[0].want)) // storage answers: the take landed
	q.fireDoubt()
	if _, err := q.enqueue(ctx, []subjects.EnqueueRequest{{ID: "B", Metadata: map[string]string{"g": "v2"}}}); err != nil {
		t.Fatal(err)
	}
	ms, err := q.dequeue(ctx, subjects.DequeueRequest{})
	if err != nil || len(ms) != 1 {
		t.Fatalf("dequeue B: %+v, %v", ms, err)
	}
	if _, err := q.complete(ctx, subjects.LeaseRequest{ID: "B", LeaseID: ms[0].LeaseID}); err != nil {
		t.Fatal(err)
	}
	clk.Advance(time.Second) // B's collection, then the sweep, which takes v1's slot, and v2's
	for _, v := range []string{"v1", "v2"} {
		if l, _, err := b.store.GetSlot(ctx, "q", v, 0); !errors.Is(err, kv.ErrNotFound) {
			t.Errorf("%s's slot after the sweep: %+v, %v; want none", v, l, err)
		}
	}
	q.mu.Lock()
	left := len(q.locks)
	q.mu.Unlock()
	if left != 0 {
		t.Errorf("the broker still mirrors the slots of %d values", left)
	}
}

// landedCompleteInDoubt leases M of queue q and makes up a complete of it whose write landed but
// whose acknowledgement was lost: the change in doubt, its entry busy, not yet on the doubtful list.
func landedCompleteInDoubt(t *testing.T, b *Broker, q *queue) *change {
	t.Helper()
	ctx := context.Background()
	if _, err := q.enqueue(ctx, []subjects.EnqueueRequest{{ID: "M"}}); err != nil {
		t.Fatal(err)
	}
	ms, err := q.dequeue(ctx, subjects.DequeueRequest{})
	if err != nil || len(ms) != 1 {
		t.Fatalf("dequeue: %+v, %v", ms, err)
	}
	q.mu.Lock()
	e := q.entries.get("M")
	next := e.record()
	next.State, next.EndedAt = subjects.StateCompleted, next.UpdatedAt
	next.Version++
	c := &change{e: e, next: next, prev: subjects.StateRunning, expect: e.rev, err: errors.New("nats: timeout")}
	e.setBusy(true)
	q.mu.Unlock()
	if _, err := b.store.WriteMessage("q", &next, c.expect).Wait(ctx); err != nil {
		t.Fatal(err)
	}
	return c
}

// deleteOfM deletes queue q within ctx, and checks that it deleted its one message, M.
func deleteOfM(ctx context.Context, b *Broker, q *queue) error {
	rep, err := b.deleteQueue(ctx, q)
	if err == nil && rep.Messages != 1 {
		err = fmt.Errorf("delete of %d messages, want 1", rep.Messages)
	}
	if err == nil {
		if _, _, gerr := b.store.GetMessage(context.Background(), "q", "M"); !errors.Is(gerr, kv.ErrNotFound) {
			err = fmt.Errorf("M after the delete: %w, want not found", gerr)
		}
	}
	return err
}

// TestDeleteAsksAboutWritesInDoubt: a queue whose write's outcome is unknown can be deleted: the
// delete asks storage about the write itself (the closed queue's timer no longer does) rather than
// wait for the write's entry until it times out, at every retry.
func TestDeleteAsksAboutWritesInDoubt(t *testing.T) {
	b, _, q := internalQueue(t, subjects.CreateQueueRequest{})
	c := landedCompleteInDoubt(t, b, q)
	q.mu.Lock()
	q.doubtful = append(q.doubtful, c)
	q.mu.Unlock()
	ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
	defer cancel()
	if err := deleteOfM(ctx, b, q); err != nil {
		t.Fatal(err)
	}
}

// TestDeleteAsksAboutWritesBackInDoubt: a write the doubt timer was asking about as the queue's
// delete began (out of the doubtful list, its entry busy) and whose outcome stayed unknown goes back
// into doubt while the delete waits for its entry: the delete asks storage about it itself, rather
// than wait for an entry nobody would end until the request timed out (330 s, an operator's probe).
func TestDeleteAsksAboutWritesBackInDoubt(t *testing.T) {
	b, _, q := internalQueue(t, subjects.CreateQueueRequest{})
	c := landedCompleteInDoubt(t, b, q) // taken by the doubt timer to ask about (q.mu released)
	ctx, cancel := context.WithTimeout(context.Background(), 20*time.Second)
	defer cancel()
	deleted := make(chan error, 1)
	go func() { deleted <- deleteOfM(ctx, b, q) }()
	eventually(t, "the delete waiting for M's write", func() bool {
		q.mu.Lock()
		defer q.mu.Unlock()
		return q.idle != nil
	})
	q.mu.Lock()
	q.finish([]*change{c}) // the timer's ask: no answer, so back into doubt
	q.mu.Unlock()
	select {
	case err := <-deleted:
		if err != nil {
			t.Fatalf("delete: %v", err)
		}
	case <-ctx.Done():
		t.Fatal("the delete still waits for the write back in doubt")
	}
}

// TestUpdateLearnsStoragesConfig: an update whose write landed though its acknowledgement was lost
// left the broker's config and revision behind storage's, and every later update then conflicted,
// and so did its retry at the revision info showed. The next update now reads storage's config on
// a conflict: the same change succeeds, another with a revision gets revision_mismatch with the
// revision a retry needs, and one without a revision applies onto storage's config.
func TestUpdateLearnsStoragesConfig(t *testing.T) {
	b, _, q := internalQueue(t, subjects.CreateQueueRequest{})
	ctx := context.Background()
	landed := func(change func(*subjects.QueueConfig)) uint64 { // an update stored behind the broker's back
		t.Helper()
		stored, rev, err := b.store.GetQueue(ctx, "q")
		if err != nil {
			t.Fatal(err)
		}
		change(&stored.Config)
		rev, err = b.store.PutQueue(ctx, "q", stored, rev)
		if err != nil {
			t.Fatal(err)
		}
		return rev
	}

	rev := landed(func(c *subjects.QueueConfig) { c.DequeueBlocked = true })
	got, err := q.update(ctx, subjects.UpdateQueueRequest{DequeueBlocked: ptrTo(true)})
	if err != nil || !got.Config.DequeueBlocked || got.Revision != rev {
		t.Fatalf("the update again: %+v, %v; want it blocked at revision %d", got, err, rev)
	}

	rev = landed(func(c *subjects.QueueConfig) { c.MaxAttempts = 7 })
	_, err = q.update(ctx, subjects.UpdateQueueRequest{Revision: got.Revision, MaxAttempts: ptrTo(9)})
	if !errors.Is(err, &subjects.Error{Code: subjects.CodeRevisionMismatch}) {
		t.Fatalf("another update: %v, want revision_mismatch", err)
	}
	q.mu.Lock()
	now := q.info()
	q.mu.Unlock()
	if now.Revision != rev || now.Config.MaxAttempts != 7 {
		t.Fatalf("info after the conflict: revision %d, max_attempts %d; want %d and 7", now.Revision, now.Config.MaxAttempts, rev)
	}
	got, err = q.update(ctx, subjects.UpdateQueueRequest{Revision: now.Revision, MaxAttempts: ptrTo(9)})
	if err != nil || got.Config.MaxAttempts != 9 {
		t.Fatalf("the retry at the revision info showed: %+v, %v", got, err)
	}

	// Without a revision an update applies whatever the config, storage's too.
	landed(func(c *subjects.QueueConfig) { c.LeaseMS = 45_000 })
	got, err = q.update(ctx, subjects.UpdateQueueRequest{MaxAttempts: ptrTo(4)})
	if err != nil || got.Config.MaxAttempts != 4 || got.Config.LeaseMS != 45_000 || !got.Config.DequeueBlocked {
		t.Fatalf("an update without a revision: %+v, %v", got, err)
	}
	stored, rev, err := b.store.GetQueue(ctx, "q")
	if err != nil || stored.Config != got.Config || rev != got.Revision {
		t.Fatalf("stored: %+v at %d, %v; the reply: %+v", stored.Config, rev, err, got)
	}
}

func ptrTo[T any](v T) *T { return &v }

// TestFailedCollectionRetriedLater: a collection that storage refuses (here: the bodies stream
// denies deletes) leaves the message as it was, ended_at included (it once showed a made-up time),
// and the next collection waits gcRetryMS rather than spinning.
func TestFailedCollectionRetriedLater(t *testing.T) {
	b, clk := internalBroker(t)
	ctx := context.Background()
	q := zeroRetentionQueue(t, b, "A")
	ms, err := q.dequeue(ctx, subjects.DequeueRequest{})
	if err != nil || len(ms) != 1 {
		t.Fatalf("dequeue: %+v, %v", ms, err)
	}
	js, err := jetstream.New(b.cfg.Conn)
	if err != nil {
		t.Fatal(err)
	}
	natstest.DenyDeletes(t, js, kv.DefaultPrefix+"-bodies")
	done, err := q.complete(ctx, subjects.LeaseRequest{ID: "A", LeaseID: ms[0].LeaseID})
	if err != nil || done.EndedAt == nil {
		t.Fatalf("complete: %+v, %v", done, err)
	}
	for try, wait := range []time.Duration{0, gcRetryMS * time.Millisecond} {
		clk.Advance(wait) // a collection, which fails
		q.mu.Lock()
		e := q.entries.get("A")
		var m subjects.Message
		if e != nil {
			m = q.view(e)
		}
		armed, want := q.gc.armedAt, clk.Now().UnixMilli()+gcRetryMS
		q.mu.Unlock()
		if e == nil || m.EndedAt == nil || !m.EndedAt.Equal(*done.EndedAt) {
			t.Fatalf("collection %d: A after it failed: %+v; want it there, ended at %v", try+1, m, done.EndedAt)
		}
		if armed != want {
			t.Fatalf("collection %d: the next one is due at %d, want %d (gcRetryMS later)", try+1, armed, want)
		}
	}
	if _, _, err := b.store.GetMessage(ctx, "q", "A"); err != nil {
		t.Fatalf("A's record after failed collections: %v", err)
	}
}

// TestMaxRunningCountsLeasesInDoubt: a lease whose write's outcome is unknown counts against
// max_running, also while the doubt timer asks storage again (the queue's lock released meanwhile),
// so that no dequeue leases beside it; once storage shows it landed, its message is running.
func TestMaxRunningCountsLeasesInDoubt(t *testing.T) {
	b, clk, q := internalQueue(t, subjects.CreateQueueRequest{MaxRunning: 1})
	ctx := context.Background()
	if _, err := q.enqueue(ctx, []subjects.EnqueueRequest{{ID: "A", Priority: ptrTo(int64(1))}, {ID: "B", Priority: ptrTo(int64(2))}}); err != nil {
		t.Fatal(err)
	}
	// A lease of A whose write landed but whose acknowledgement was lost, as commit issues it.
	q.mu.Lock()
	e := q.entries.get("A")
	q.pending.Remove(e)
	next := e.record()
	next.State, next.LeaseID, next.LeaseExpires = subjects.StateRunning, "L", clk.Now().Add(time.Hour).UnixMilli()
	next.Attempts++
	next.Version++
	c := &change{e: e, next: next, prev: subjects.StatePending, expect: e.rev, leasing: true}
	q.leasing++
	e.setBusy(true)
	q.mu.Unlock()
	if _, err := b.store.WriteMessage("q", &next, c.expect).Wait(ctx); err != nil {
		t.Fatal(err)
	}
	c.err = errors.New("nats: timeout")
	q.mu.Lock()
	q.finish([]*change{c})
	doubts := q.doubts()
	q.mu.Unlock()
	if doubts != 1 {
		t.Fatalf("%d writes in doubt, want A's lease", doubts)
	}
	if ms, err := q.dequeue(ctx, subjects.DequeueRequest{}); err != nil || len(ms) != 0 {
		t.Fatalf("dequeue while A's lease is in doubt: %+v, %v; want nothing", ms, err)
	}

	done := make(chan struct{})
	go func() {
		defer close(done)
		q.fireDoubt() // what the timer does when it fires
	}()
	for asked := false; !asked; {
		select {
		case <-done:
			asked = true
		default:
		}
		if ms, err := q.dequeue(ctx, subjects.DequeueRequest{}); err != nil || len(ms) != 0 {
			t.Fatalf("dequeue while A's lease is asked about: %+v, %v; want nothing", ms, err)
		}
	}
	q.mu.Lock()
	state, running, leasing := e.State(), q.counts[stateIndex(subjects.StateRunning)], q.leasing
	q.mu.Unlock()
	if state != subjects.StateRunning || running != 1 || leasing != 0 {
		t.Fatalf("after storage answered: A %s, %d running, %d leasing; want A running alone", state, running, leasing)
	}
	if ms, err := q.dequeue(ctx, subjects.DequeueRequest{}); err != nil || len(ms) != 0 {
		t.Fatalf("dequeue with A running under max_running 1: %+v, %v; want nothing", ms, err)
	}
}

// TestOpenWaitsForServersToPlaceOn: opening the storage, refused because the cluster has not heard
// from enough of its servers to place a stream (nats-server's "no suitable peers for placement,
// peer offline": a server down, or not heard from yet after the cluster started or elected its
// meta leader; one CI run's start failed so), is tried again, saying so once, until it succeeds;
// another error ends it at once, and so does the context.
func TestOpenWaitsForServersToPlaceOn(t *testing.T) {
	t.Parallel()
	logs := &recordedLogs{}
	b := &Broker{log: slog.New(logs)}
	offline := fmt.Errorf("kv: open bucket natstone-messages: %w", &jetstream.APIError{Code: 400, ErrorCode: 10005,
		Description: "no suitable peers for placement, peer offline"})
	tries := 0
	err := b.placed(context.Background(), placementWait, func() error {
		if tries++; tries < 3 {
			return offline
		}
		return nil
	})
	if err != nil || tries != 3 {
		t.Fatalf("placed: %v after %d tries, want success at the third", err, tries)
	}
	if got := logs.find(slog.LevelWarn, "the cluster cannot place the store's streams yet: it has not heard from enough of its servers; trying again"); len(got) != 1 {
		t.Errorf("the waits' log: %v, want one line", got)
	}
	for name, refusal := range map[string]error{
		"insufficient storage": &jetstream.APIError{Code: 400, ErrorCode: 10005, Description: "no suitable peers for placement, insufficient storage"},
		"another error":        errors.New("kv: open bucket natstone-messages: nats: timeout"),
	} {
		tries = 0
		if err := b.placed(context.Background(), placementWait, func() error { tries++; return refusal }); !errors.Is(err, refusal) || tries != 1 {
			t.Errorf("%s: placed returned %v after %d tries, want it at once", name, err, tries)
		}
	}
	ctx, cancel := context.WithCancel(context.Background())
	tries = 0
	err = b.placed(ctx, placementWait, func() error {
		if tries++; tries == 2 {
			cancel()
		}
		return offline
	})
	if !errors.Is(err, offline) || tries != 2 {
		t.Fatalf("placed with its context ended: %v after %d tries, want the refusal after the second", err, tries)
	}
	// Refused for longer than it waits: the last refusal, once the wait is up. Pauses of 100, 200
	// and 400 ms make the fourth try the first past 500 ms, or an earlier one if the pauses ran
	// late; a tenth means no bound.
	tries = 0
	gaveUp := errors.New("still trying after ten tries")
	err = b.placed(context.Background(), 500*time.Millisecond, func() error {
		if tries++; tries == 10 {
			return gaveUp
		}
		return offline
	})
	if !errors.Is(err, offline) || tries < 2 || tries > 4 {
		t.Fatalf("placed refused throughout: %v after %d tries, want the refusal after the second to fourth", err, tries)
	}
}

// writeErrors is an Observer that counts the message writes that failed.
type writeErrors struct {
	nopObserver
	n atomic.Int64
}

func (w *writeErrors) Write(_ time.Duration, err error) {
	if err != nil {
		w.n.Add(1)
	}
}

// TestWritesIssuedAgainAreObserved: a write of unknown outcome is issued again, at once and then at
// every doubt timer, and each issue is a write the observer hears of. With only the first counted,
// natstone_kv_write_errors_total stood still while storage refused every write (a full bucket), and
// an alert on its rate cleared while the queue stayed stuck.
func TestWritesIssuedAgainAreObserved(t *testing.T) {
	srv := natstest.Start(t, nil)
	obs := &writeErrors{}
	b := startedBroker(t, &Config{Conn: srv.Connect(t), Clock: clock.NewFake(time.UnixMilli(1_700_000_000_000)),
		Logger: slog.New(slog.NewTextHandler(io.Discard, nil)), Observer: obs})
	q := queueQ(t, b)
	ctx := context.Background()
	if _, err := q.enqueue(ctx, []subjects.EnqueueRequest{{ID: "M"}}); err != nil {
		t.Fatal(err)
	}
	ms, err := q.dequeue(ctx, subjects.DequeueRequest{})
	if err != nil || len(ms) != 1 {
		t.Fatalf("dequeue: %+v, %v", ms, err)
	}
	// The messages bucket refuses every write from now on: it is full.
	js, err := jetstream.New(b.cfg.Conn)
	if err != nil {
		t.Fatal(err)
	}
	st, err := js.Stream(ctx, "KV_"+kv.DefaultPrefix+"-messages")
	if err != nil {
		t.Fatal(err)
	}
	cfg := st.CachedInfo().Config
	cfg.MaxBytes = int64(st.CachedInfo().State.Bytes)
	if _, err := js.UpdateStream(ctx, cfg); err != nil {
		t.Fatal(err)
	}
	if _, err := q.complete(ctx, subjects.LeaseRequest{ID: "M", LeaseID: ms[0].LeaseID}); err == nil {
		t.Fatal("a complete into a full bucket succeeded")
	}
	first := obs.n.Load()
	if first < 2 {
		t.Fatalf("%d failed writes observed for a complete issued and issued again, want 2 or more", first)
	}
	q.mu.Lock()
	doubts := q.doubts()
	q.mu.Unlock()
	if doubts != 1 {
		t.Fatalf("%d writes in doubt, want M's complete", doubts)
	}
	q.fireDoubt() // what the timer does when it fires
	if n := obs.n.Load(); n <= first {
		t.Fatalf("%d failed writes observed after the doubt timer issued M's complete again, as before it", n)
	}
}

// TestGetOfAMessageInDoubt: a get waits for a write of its message in flight, but not past the
// write timeout: a write whose outcome is unknown waits for storage, which may refuse every write
// for as long as it is full. It answered after the request timeout (minutes) instead.
func TestGetOfAMessageInDoubt(t *testing.T) {
	srv := natstest.Start(t, nil)
	b := startedBroker(t, &Config{Conn: srv.Connect(t), Clock: clock.NewFake(time.UnixMilli(1_700_000_000_000)),
		Logger: slog.New(slog.NewTextHandler(io.Discard, nil)), WriteTimeout: 200 * time.Millisecond})
	q := queueQ(t, b)
	ctx := context.Background()
	if _, err := q.enqueue(ctx, []subjects.EnqueueRequest{{ID: "M"}}); err != nil {
		t.Fatal(err)
	}
	// A write of M whose outcome is unknown, as finish leaves it.
	q.mu.Lock()
	e := q.entries.get("M")
	next := e.record()
	next.State, next.EndedAt = subjects.StateCanceled, next.UpdatedAt
	next.Version++
	e.setBusy(true)
	q.doubtful = append(q.doubtful, &change{e: e, next: next, prev: subjects.StatePending, expect: e.rev, err: errors.New("nats: timeout")})
	q.mu.Unlock()
	rctx, cancel := context.WithTimeout(ctx, 30*time.Second)
	defer cancel()
	if _, err := q.get(rctx, "M"); subjects.CodeOf(err) != subjects.CodeUnavailable {
		t.Fatalf("get of a message in doubt: %v, want unavailable", err)
	}
	if rctx.Err() != nil {
		t.Fatal("the get waited for its request's whole time")
	}
}
