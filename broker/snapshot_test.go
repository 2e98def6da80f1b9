package broker_test

import (
	"bytes"
	"context"
	"errors"
	"log/slog"
	"reflect"
	"slices"
	"sync"
	"testing"
	"time"

	"github.com/nats-io/nats.go/jetstream"

	"github.com/natstone/natstone/broker"
	"github.com/natstone/natstone/kv"
	"github.com/natstone/natstone/subjects"
	"github.com/natstone/natstone/test/natstest"
)

// startLog is a broker's logger that keeps what its starts and stops said about the snapshot:
// where each recovery read the records from ("snapshot" or "records"), and the messages of the
// lines that mention the snapshot.
type startLog struct {
	mu    sync.Mutex
	froms []string
	lines []string
}

func (l *startLog) Enabled(context.Context, slog.Level) bool { return true }

func (l *startLog) Handle(_ context.Context, r slog.Record) error {
	l.mu.Lock()
	defer l.mu.Unlock()
	if r.Message == "recovered" {
		r.Attrs(func(a slog.Attr) bool {
			if a.Key == "from" {
				l.froms = append(l.froms, a.Value.String())
			}
			return true
		})
	}
	if bytes.Contains([]byte(r.Message), []byte("snapshot")) {
		l.lines = append(l.lines, r.Message)
	}
	return nil
}

func (l *startLog) WithAttrs([]slog.Attr) slog.Handler { return l }
func (l *startLog) WithGroup(string) slog.Handler      { return l }

// from returns where the last start read the records from.
func (l *startLog) from() string {
	l.mu.Lock()
	defer l.mu.Unlock()
	if len(l.froms) == 0 {
		return ""
	}
	return l.froms[len(l.froms)-1]
}

// said reports whether a line about the snapshot had msg as its message.
func (l *startLog) said(msg string) bool {
	l.mu.Lock()
	defer l.mu.Unlock()
	return slices.Contains(l.lines, msg)
}

// setupLogged is setup with a startLog as the broker's logger.
func setupLogged(t *testing.T, mod ...func(*broker.Config)) (*env, *startLog) {
	l := &startLog{}
	return setup(t, append([]func(*broker.Config){func(c *broker.Config) { c.Logger = slog.New(l) }}, mod...)...), l
}

// view is everything a client can see of the queues: each queue's info, and each message, by
// get and by browse in its state's order.
type view struct {
	Queues   []subjects.QueueInfo
	Messages map[string]subjects.Message
	Browse   map[string][]string
}

func (e *env) view(byQueue map[string][]string) view {
	e.t.Helper()
	v := view{Messages: make(map[string]subjects.Message), Browse: make(map[string][]string)}
	v.Queues = must[subjects.ListReply](e, subjects.OpList, "", nil).Queues
	for q, list := range byQueue {
		for _, id := range list {
			v.Messages[q+"/"+id] = e.get(q, id)
		}
		for _, st := range []subjects.State{subjects.StatePending, subjects.StateInvisible, subjects.StateRunning, subjects.StateCompleted} {
			rep := must[subjects.BrowseReply](e, subjects.OpBrowse, q, subjects.BrowseRequest{State: st})
			v.Browse[q+"/"+string(st)] = ids(rep.Messages)
		}
	}
	return v
}

// fillForSnapshot makes two queues with messages in every state: pending with metadata and
// payloads, invisible, running under a lease taken with a request id, released with a delay,
// completed and kept; in the exclusive queue a value held by a running message, with another
// message waiting for it. It returns the ids by queue, and the running messages.
func fillForSnapshot(e *env) (map[string][]string, []subjects.Message) {
	e.create("s", subjects.CreateQueueRequest{LeaseMS: 60_000, RetentionMS: ptr[int64](3_600_000)})
	e.create("x", subjects.CreateQueueRequest{Type: subjects.Exclusive, ExclusivityKey: "p", LeaseMS: 60_000})
	for i, id := range []string{"s1", "s2", "s3", "s4", "s5", "s6"} {
		e.enqueue("s", subjects.EnqueueRequest{ID: id, Priority: ptr(int64(100 - i)), Payload: "payload of " + id, Metadata: map[string]string{"k": id[1:]}})
	}
	e.enqueue("s", subjects.EnqueueRequest{ID: "inv", Priority: ptr[int64](1), InvisibleMS: ptr[int64](30_000)})
	leased := e.dequeue("s", subjects.DequeueRequest{Batch: 3, RequestID: "req-1"}) // s6, s5, s4
	must[subjects.Message](e, subjects.OpComplete, "s", subjects.LeaseRequest{ID: leased[0].ID, LeaseID: leased[0].LeaseID})
	must[subjects.Message](e, subjects.OpRelease, "s", subjects.ReleaseRequest{ID: leased[1].ID, LeaseID: leased[1].LeaseID, DelayMS: 20_000})
	for i, v := range []string{"a", "a", "b"} {
		e.enqueue("x", subjects.EnqueueRequest{ID: "x" + string(rune('0'+i)), Priority: ptr(int64(i)), Metadata: map[string]string{"p": v}})
	}
	held := e.dequeueOne("x") // x0, holding a; x1 waits for it
	return map[string][]string{
		"s": {"s1", "s2", "s3", "s4", "s5", "s6", "inv"},
		"x": {"x0", "x1", "x2"},
	}, []subjects.Message{leased[2], held}
}

// TestSnapshotGivesWhatTheRecordsGive: a broker started from the snapshot of a clean stop serves
// what one that read every record serves — every message as it was, in the same order, with its
// lease, its request id, its deadlines and its exclusivity value held — and the snapshot is gone
// once it has been read.
func TestSnapshotGivesWhatTheRecordsGive(t *testing.T) {
	t.Parallel()
	cleanRestarts(t, func(t *testing.T, restart func(e *env)) {
		e, log := setupLogged(t)
		all, running := fillForSnapshot(e)
		before := e.view(all)
		restart(e)
		if got := log.from(); got != "snapshot" || !log.said("snapshot written") {
			t.Fatalf("the clean restart read the %q (log: %v)", got, log.lines)
		}
		fromSnapshot := e.view(all)
		if !reflect.DeepEqual(fromSnapshot, before) {
			t.Fatalf("after a start from the snapshot:\n%+v\nbefore:\n%+v", fromSnapshot, before)
		}
		js := e.jetStream()
		obs, err := js.ObjectStore(context.Background(), "natstone-snapshots")
		if err != nil {
			t.Fatal(err)
		}
		if _, err := obs.GetInfo(context.Background(), kv.SnapshotObject); !errors.Is(err, jetstream.ErrObjectNotFound) {
			t.Fatalf("the snapshot read is still there: %v", err)
		}

		// The same store read record by record gives the same.
		e.cfg.DisableSnapshot = true
		e.restartBroker()
		if got := log.from(); got != "records" {
			t.Fatalf("a start with the snapshot off read the %q", got)
		}
		if fromRecords := e.view(all); !reflect.DeepEqual(fromRecords, before) {
			t.Fatalf("after a start from the records:\n%+v\nbefore:\n%+v", fromRecords, before)
		}
		// That broker writes no snapshot at its stop, and the one written before it started is
		// stale once anything is written.
		e.enqueue("s", subjects.EnqueueRequest{ID: "late"})
		e.cfg.DisableSnapshot = false
		e.restartBroker()
		if got := log.from(); got != "records" {
			t.Fatalf("a start after a stop with the snapshot off read the %q", got)
		}
		e.restartBroker()
		if got := log.from(); got != "snapshot" {
			t.Fatalf("the second clean restart read the %q", got)
		}

		// What the snapshot restored works: the leases, the retried dequeue, the value held, the
		// timers.
		again := e.dequeue("s", subjects.DequeueRequest{Batch: 3, RequestID: "req-1"})
		if !slices.Contains(ids(again), running[0].ID) {
			t.Fatalf("retried dequeue after the restart: %v, want the lease of %s back", ids(again), running[0].ID)
		}
		for _, m := range running {
			must[subjects.Message](e, subjects.OpComplete, m.Queue, subjects.LeaseRequest{ID: m.ID, LeaseID: m.LeaseID})
		}
		if got := ids(e.dequeue("x", subjects.DequeueRequest{Batch: 10})); !slices.Equal(got, []string{"x1", "x2"}) {
			t.Fatalf("exclusive dequeue once x0 completed: %v", got)
		}
		e.advance(30 * time.Second)
		if got := e.get("s", "inv").State; got != subjects.StatePending {
			t.Fatalf("invisible message 30 s on: %s", got)
		}
	})
}

// TestSnapshotNotReadOnceStorageChanged: a snapshot is read only if storage is as the stop left
// it. Whatever was written since — a record, a collection, a payload's delete, a lock, a config, a
// queue's delete — the start reads every record and sees it.
func TestSnapshotNotReadOnceStorageChanged(t *testing.T) {
	t.Parallel()
	changes := []struct {
		name   string
		change func(e *env, s *kv.Store)
		check  func(e *env)
	}{
		{"a record", func(e *env, s *kv.Store) {
			r, rev, err := s.GetMessage(context.Background(), "s", "s1")
			if err != nil {
				e.t.Fatal(err)
			}
			r.Priority, r.Version = -1, r.Version+1
			if _, err := s.WriteMessage("s", &r, rev).Wait(context.Background()); err != nil {
				e.t.Fatal(err)
			}
		}, func(e *env) {
			if m := e.dequeueOne("s"); m.ID != "s1" {
				e.t.Fatalf("dequeued %s, want s1, whose priority was changed", m.ID)
			}
		}},
		{"a payload's delete", func(e *env, s *kv.Store) {
			r, _, err := s.GetMessage(context.Background(), "s", "s1")
			if err != nil {
				e.t.Fatal(err)
			}
			if err := s.DeleteBody(context.Background(), r.BodySeq); err != nil {
				e.t.Fatal(err)
			}
		}, func(e *env) {
			fails(e, subjects.CodeMessageNotFound, subjects.OpGet, "s", subjects.GetRequest{ID: "s1"})
		}},
		{"a lock", func(e *env, s *kv.Store) {
			_, rev, err := s.GetSlot(context.Background(), "x", "b", 0)
			if err != nil && !errors.Is(err, kv.ErrNotFound) {
				e.t.Fatal(err)
			}
			if _, err := s.WriteSlot("x", "b", 0, kv.Lock{}, rev).Wait(context.Background()); err != nil {
				e.t.Fatal(err)
			}
		}, func(e *env) {}},
		{"a config", func(e *env, s *kv.Store) {
			if _, err := s.PutQueue(context.Background(), "new", kv.QueueRecord{Config: subjects.QueueConfig{Type: subjects.Simple, LeaseMS: 1000, MaxAttempts: 1}}, 0); err != nil {
				e.t.Fatal(err)
			}
		}, func(e *env) {
			if info := must[subjects.QueueInfo](e, subjects.OpInfo, "new", nil); info.Config.LeaseMS != 1000 {
				e.t.Fatalf("queue written behind the stopped broker: %+v", info)
			}
		}},
		{"a queue's delete", func(e *env, s *kv.Store) {
			if err := s.DeleteQueue(context.Background(), "x"); err != nil {
				e.t.Fatal(err)
			}
		}, func(e *env) {
			fails(e, subjects.CodeQueueNotFound, subjects.OpInfo, "x", nil)
		}},
	}
	for _, c := range changes {
		t.Run(c.name, func(t *testing.T) {
			t.Parallel()
			e, log := setupLogged(t)
			fillForSnapshot(e)
			e.stopBroker(e.b)
			ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
			defer cancel()
			s, err := kv.Open(ctx, &kv.Config{JS: e.jetStream()})
			if err != nil {
				t.Fatal(err)
			}
			if _, err := s.SnapshotInfo(ctx); err != nil {
				t.Fatalf("the clean stop wrote no snapshot: %v", err)
			}
			c.change(e, s)
			e.startBroker()
			if got := log.from(); got != "records" || !log.said("the snapshot is not read: storage was written since it was taken; reading every record") {
				t.Fatalf("the start read the %q (log: %v)", got, log.lines)
			}
			if _, err := s.SnapshotInfo(ctx); !errors.Is(err, kv.ErrNoSnapshot) {
				t.Fatalf("the stale snapshot is still there after the start: %v", err)
			}
			c.check(e)
		})
	}
}

// TestSnapshotConflictingWithStorageIsReadPast: a broker paused past its claim that goes on writes
// an exclusive message's lock, then its lease (design.md, "Exclusive queues"). Landing after the
// broker that took the store over read storage, they are not in that broker's memory, and its
// clean stop's snapshot holds the message pending, under a fence that includes them. The next
// start's reconciliation finds the lock naming a lease the record does not have, writes the record
// at the snapshot's revision to fence that lease off, and conflicts: the start then reads every
// record. Before, it read the same snapshot again, ten times, failed, and left it there for every
// later start to fail on alike.
func TestSnapshotConflictingWithStorageIsReadPast(t *testing.T) {
	t.Parallel()
	e, log := setupLogged(t)
	e.create("x", subjects.CreateQueueRequest{Type: subjects.Exclusive, ExclusivityKey: "p", LeaseMS: 60_000})
	e.enqueue("x", subjects.EnqueueRequest{ID: "m", Metadata: map[string]string{"p": "a"}})
	strayLease(e, "x", "m", "a", "stray-lease")
	e.restartBroker()
	if got := log.from(); got != "records" || !log.said("snapshot written") ||
		!log.said("a write conflicted with what the snapshot holds; reading every record") {
		t.Fatalf("the start read the %q (log: %v); want the snapshot tried, then every record", got, log.lines)
	}
	if m := e.get("x", "m"); m.State != subjects.StateRunning || m.LeaseID != "stray-lease" {
		t.Fatalf("m after the start: %s under lease %q, want running under the stray lease, as stored", m.State, m.LeaseID)
	}
}

// strayLease writes behind the broker's back what a broker paused past its claim writes when it
// goes on: the lock of value in queue, naming id under lease, then id's record, running under that
// lease.
func strayLease(e *env, queue, id, value, lease string) {
	e.t.Helper()
	ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
	defer cancel()
	s, err := kv.Open(ctx, &kv.Config{JS: e.jetStream()})
	if err != nil {
		e.t.Fatal(err)
	}
	r, rev, err := s.GetMessage(ctx, queue, id)
	if err != nil {
		e.t.Fatal(err)
	}
	now := e.clk.Now().UnixMilli()
	r.State, r.LeaseID, r.LeaseExpires, r.Version, r.Attempts, r.UpdatedAt = subjects.StateRunning, lease, now+60_000, r.Version+1, r.Attempts+1, now
	_, lrev, err := s.GetSlot(ctx, queue, value, 0)
	if err != nil && !errors.Is(err, kv.ErrNotFound) {
		e.t.Fatal(err)
	}
	if _, err := s.WriteSlot(queue, value, 0, kv.Lock{MessageID: id, LeaseID: lease, Version: r.Version, BodySeq: r.BodySeq}, lrev).Wait(ctx); err != nil {
		e.t.Fatal(err)
	}
	if _, err := s.WriteMessage(queue, &r, rev).Wait(ctx); err != nil {
		e.t.Fatal(err)
	}
}

// TestSnapshotNotReadWhenTheServerBroughtRecordsBack: after an unclean stop of the server,
// JetStream can bring back revisions of records that later writes had superseded, with no write
// that moves the fence (nats-server#8505). The messages bucket then holds more than the snapshot's
// records, and the start reads every record, so that it sees and removes them.
func TestSnapshotNotReadWhenTheServerBroughtRecordsBack(t *testing.T) {
	t.Parallel()
	e, log := setupLogged(t)
	e.create("q", subjects.CreateQueueRequest{RetentionMS: ptr[int64](0)})
	for _, id := range []string{"a", "b"} {
		e.enqueue("q", subjects.EnqueueRequest{ID: id, Priority: ptr[int64](int64(id[0]))})
	}
	m := e.dequeueOne("q")
	must[subjects.Message](e, subjects.OpComplete, "q", subjects.LeaseRequest{ID: m.ID, LeaseID: m.LeaseID})
	e.advance(0) // collects a
	e.waitStreamMsgs("KV_natstone-messages", 1)

	e.restartAllUnclean()

	if got := log.from(); got != "records" ||
		!log.said("the snapshot is not read: the messages bucket holds other messages than its records; reading every record") {
		t.Fatalf("the start after an unclean stop read the %q (log: %v)", got, log.lines)
	}
	fails(e, subjects.CodeMessageNotFound, subjects.OpGet, "q", subjects.GetRequest{ID: "a"})
	if ms := e.dequeue("q", subjects.DequeueRequest{Batch: 10}); !slices.Equal(ids(ms), []string{"b"}) {
		t.Fatalf("dequeued %v after the restart, want [b]", ids(ms))
	}
}

// TestBrokenSnapshotIsNotRead: a snapshot whose bytes do not match their digest is dropped part
// way, and the start reads every record instead.
func TestBrokenSnapshotIsNotRead(t *testing.T) {
	t.Parallel()
	e, log := setupLogged(t)
	all, _ := fillForSnapshot(e)
	before := e.view(all)
	e.stopBroker(e.b)

	ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
	defer cancel()
	// The last message id's first letter: the records before it are read before the digest fails.
	natstest.ChangeObjectByte(t, e.jetStream(), "natstone-snapshots", kv.SnapshotObject, []byte("x2"), 'y')

	e.startBroker()
	if got := log.from(); got != "records" || !log.said("the snapshot could not be read; reading every record") {
		t.Fatalf("the start read the %q (log: %v)", got, log.lines)
	}
	obs, err := e.jetStream().ObjectStore(ctx, "natstone-snapshots")
	if err != nil {
		t.Fatal(err)
	}
	if _, err := obs.GetInfo(ctx, kv.SnapshotObject); !errors.Is(err, jetstream.ErrObjectNotFound) {
		t.Fatalf("the broken snapshot is still there after the start: %v", err)
	}
	if after := e.view(all); !reflect.DeepEqual(after, before) {
		t.Fatalf("after a start from the records:\n%+v\nbefore:\n%+v", after, before)
	}
}

// TestSnapshotAfterCollections: a stop right after collections (retention 0) waits for their
// markers to go before it takes the snapshot, so that the start after it can read it.
func TestSnapshotAfterCollections(t *testing.T) {
	t.Parallel()
	e, log := setupLogged(t)
	e.create("q", subjects.CreateQueueRequest{RetentionMS: ptr[int64](0)})
	for _, id := range []string{"a", "b", "c"} {
		e.enqueue("q", subjects.EnqueueRequest{ID: id, Priority: ptr[int64](int64(id[0]))})
	}
	for range 2 {
		m := e.dequeueOne("q")
		must[subjects.Message](e, subjects.OpComplete, "q", subjects.LeaseRequest{ID: m.ID, LeaseID: m.LeaseID})
	}
	e.advance(0) // collects a and b: their markers stay a second
	e.restartBroker()
	if got := log.from(); got != "snapshot" {
		t.Fatalf("the start right after collections read the %q (log: %v)", got, log.lines)
	}
	if ms := e.dequeue("q", subjects.DequeueRequest{Batch: 10}); !slices.Equal(ids(ms), []string{"c"}) {
		t.Fatalf("dequeued %v after the restart, want [c]", ids(ms))
	}
}
