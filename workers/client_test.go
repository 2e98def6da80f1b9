package workers_test

import (
	"bytes"
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"slices"
	"strings"
	"sync"
	"testing"
	"time"
	"unicode/utf8"

	"github.com/nats-io/nats.go"

	"github.com/natstone/natstone/subjects"
	"github.com/natstone/natstone/test/natstest"
	"github.com/natstone/natstone/workers"
)

func TestNewClientValidates(t *testing.T) {
	t.Parallel()
	srv := natstest.Start(t, nil)
	nc := srv.Connect(t)
	if _, err := workers.NewClient(nil, nil); err == nil {
		t.Error("NewClient(nil conn) succeeded")
	}
	for _, prefix := range []string{"a..b", "a.*", "has space", ">"} {
		_, err := workers.NewClient(nc, &workers.Config{Prefix: prefix})
		if err == nil || !strings.Contains(err.Error(), "Config.Prefix") {
			t.Errorf("prefix %q: err = %v, want one naming Config.Prefix", prefix, err)
		}
	}
	if _, err := workers.NewClient(nc, &workers.Config{Timeout: -time.Second}); err == nil || !strings.Contains(err.Error(), "Config.Timeout") {
		t.Errorf("negative timeout: err = %v, want one naming Config.Timeout", err)
	}
	if _, err := workers.NewClient(nc, &workers.Config{Prefix: "acme.natstone", Timeout: time.Second}); err != nil {
		t.Errorf("valid config: %v", err)
	}
}

func TestQueueAdmin(t *testing.T) {
	t.Parallel()
	e := setup(t)
	c := ctx(t)
	opts := &workers.QueueOpts{
		Type: subjects.Exclusive, ExclusivityKey: "project", Lease: 90 * time.Second,
		Invisible: 2 * time.Second, MaxAttempts: 7, Retention: ptr(time.Duration(0)),
		MaxPayloadBytes: 1000, MaxMetadataPairs: 4, MaxRunning: 3, MaxRunningPerValue: 2, DequeueBlocked: true,
	}
	info, err := e.c.CreateQueue(c, "jobs", opts)
	if err != nil {
		t.Fatal(err)
	}
	want := subjects.QueueConfig{
		Type: subjects.Exclusive, ExclusivityKey: "project", LeaseMS: 90_000, InvisibleMS: 2000,
		MaxAttempts: 7, RetentionMS: 0, MaxPayloadBytes: 1000, MaxMetadataPairs: 4, MaxRunning: 3, MaxRunningPerValue: 2, DequeueBlocked: true,
	}
	if info.Name != "jobs" || info.Config != want || info.Revision == 0 || info.CreatedAt.IsZero() {
		t.Fatalf("create = %+v, want config %+v", info, want)
	}
	// Creating it again with the same config is idempotent.
	again, err := e.c.CreateQueue(c, "jobs", opts)
	if err != nil || again.Revision != info.Revision {
		t.Fatalf("create again = %+v, %v", again, err)
	}
	// Defaults, and sub-millisecond durations rounded down.
	def, err := e.c.CreateQueue(c, "defaults", &workers.QueueOpts{Lease: 1500*time.Millisecond + 999*time.Microsecond})
	if err != nil {
		t.Fatal(err)
	}
	if def.Config.Type != subjects.Simple || def.Config.LeaseMS != 1500 || def.Config.MaxAttempts != subjects.DefaultMaxAttempts ||
		def.Config.RetentionMS != subjects.DefaultRetention.Milliseconds() {
		t.Fatalf("defaults = %+v", def.Config)
	}
	if _, err := e.c.CreateQueue(c, "nil-opts", nil); err != nil {
		t.Fatal(err)
	}

	got, err := e.c.Queue(c, "jobs")
	if err != nil || got.Config != want || got.Revision != info.Revision {
		t.Fatalf("info = %+v, %v", got, err)
	}

	up, err := e.c.UpdateQueue(c, "jobs", &workers.QueueUpdate{
		Revision: info.Revision, Lease: ptr(time.Minute), DequeueBlocked: ptr(false), MaxAttempts: ptr(9),
		Retention: ptr(time.Hour), Invisible: ptr(time.Duration(0)), MaxPayloadBytes: ptr(2000),
		MaxMetadataPairs: ptr(5), MaxRunning: ptr(0), MaxRunningPerValue: ptr(3), EnqueueBlocked: ptr(true),
	})
	if err != nil {
		t.Fatal(err)
	}
	want.LeaseMS, want.DequeueBlocked, want.MaxAttempts, want.RetentionMS = 60_000, false, 9, time.Hour.Milliseconds()
	want.InvisibleMS, want.MaxPayloadBytes, want.MaxMetadataPairs, want.MaxRunning, want.EnqueueBlocked = 0, 2000, 5, 0, true
	want.MaxRunningPerValue = 3
	if up.Config != want || up.Revision <= info.Revision {
		t.Fatalf("update = %+v, want config %+v and a new revision", up, want)
	}
	// A nil update changes nothing.
	same, err := e.c.UpdateQueue(c, "jobs", nil)
	if err != nil || same.Config != want {
		t.Fatalf("nil update = %+v, %v", same, err)
	}

	list, err := e.c.Queues(c)
	if err != nil {
		t.Fatal(err)
	}
	var names []string
	for _, q := range list {
		names = append(names, q.Name)
	}
	if !slices.Equal(names, []string{"defaults", "jobs", "nil-opts"}) {
		t.Fatalf("queues = %v", names)
	}

	e.enqueue("defaults", "x", nil)
	del, err := e.c.DeleteQueue(c, "defaults")
	if err != nil || del.Name != "defaults" || del.Messages != 1 {
		t.Fatalf("delete = %+v, %v", del, err)
	}
	if _, err := e.c.Queue(c, "defaults"); !errors.Is(err, workers.ErrQueueNotFound) {
		t.Fatalf("info after delete: %v", err)
	}
}

func TestMessageLifecycle(t *testing.T) {
	t.Parallel()
	e := setup(t)
	c := ctx(t)
	e.createQueue("q", &workers.QueueOpts{Lease: time.Minute})
	enq := e.enqueue("q", "hello", &workers.EnqueueOpts{
		ID: "m1", Priority: ptr(int64(5)), Metadata: map[string]string{"kind": "a"},
	})
	if enq.ID != "m1" || enq.State != subjects.StatePending || enq.Priority != 5 || enq.Duplicate {
		t.Fatalf("enqueue = %+v", enq)
	}
	dup := e.enqueue("q", "other", &workers.EnqueueOpts{ID: "m1"})
	if !dup.Duplicate || dup.Priority != 5 {
		t.Fatalf("second enqueue of m1 = %+v, want a duplicate", dup)
	}
	e.enqueue("q", "second", &workers.EnqueueOpts{ID: "m2", Priority: ptr(int64(6)), Metadata: map[string]string{"kind": "b"}})

	counts, err := e.c.Depth(c, "q", map[string]string{"kind": "b"})
	if err != nil || counts != (subjects.Counts{Pending: 1}) {
		t.Fatalf("depth kind=b = %+v, %v", counts, err)
	}

	msgs, err := e.c.Dequeue(c, "q", &workers.DequeueOpts{Batch: 5, Lease: 20 * time.Second, Filter: map[string]string{"kind": "a"}, RequestID: "r1"})
	if err != nil || len(msgs) != 1 {
		t.Fatalf("dequeue = %+v, %v", msgs, err)
	}
	m := msgs[0]
	if m.ID != "m1" || m.Queue != "q" || m.State != subjects.StateRunning || string(m.Payload) != "hello" ||
		m.Attempts != 1 || m.AttemptsLeft != subjects.DefaultMaxAttempts-1 || m.LeaseID == "" ||
		m.Metadata["kind"] != "a" || m.EnqueuedAt.IsZero() || !m.EndedAt.IsZero() {
		t.Fatalf("dequeued %+v", m)
	}
	if lease := m.LeaseExpiresAt.Sub(m.UpdatedAt); lease != 20*time.Second {
		t.Fatalf("lease = %v, want the 20s asked for", lease)
	}
	// A retry with the same request id returns the same lease.
	retry, err := e.c.Dequeue(c, "q", &workers.DequeueOpts{Batch: 5, Filter: map[string]string{"kind": "a"}, RequestID: "r1"})
	if err != nil || len(retry) != 1 || retry[0].LeaseID != m.LeaseID {
		t.Fatalf("retried dequeue = %+v, %v", retry, err)
	}

	ext, err := e.c.Extend(c, "q", "m1", m.LeaseID, 40*time.Second)
	if err != nil || ext.LeaseExpiresAt.Sub(ext.UpdatedAt) != 40*time.Second || ext.Payload != nil {
		t.Fatalf("extend = %+v, %v", ext, err)
	}
	done, err := e.c.Complete(c, "q", "m1", m.LeaseID)
	if err != nil || done.State != subjects.StateCompleted || done.EndedAt.IsZero() || !done.LeaseExpiresAt.IsZero() {
		t.Fatalf("complete = %+v, %v", done, err)
	}
	if again, err := e.c.Complete(c, "q", "m1", m.LeaseID); err != nil || again.State != subjects.StateCompleted {
		t.Fatalf("complete again = %+v, %v", again, err)
	}

	// Release with a delay: invisible.
	m2 := dequeueOne(t, e, "q")
	rel, err := e.c.Release(c, "q", m2.ID, m2.LeaseID, &workers.ReleaseOpts{Delay: time.Hour})
	if err != nil || rel.State != subjects.StateInvisible || rel.VisibleAt.Sub(rel.UpdatedAt) != time.Hour {
		t.Fatalf("release = %+v, %v", rel, err)
	}
	// Cancel without a lease: unconditional.
	can, err := e.c.Cancel(c, "q", m2.ID, "")
	if err != nil || can.State != subjects.StateCanceled {
		t.Fatalf("cancel = %+v, %v", can, err)
	}
	got := e.get("q", "m2")
	if got.State != subjects.StateCanceled || string(got.Payload) != "second" || got.Attempts != 1 {
		t.Fatalf("get = %+v", got)
	}

	// An empty dequeue, waiting a little.
	empty, err := e.c.Dequeue(c, "q", &workers.DequeueOpts{Wait: 10 * time.Millisecond})
	if err != nil || len(empty) != 0 {
		t.Fatalf("dequeue of an empty queue = %+v, %v", empty, err)
	}
	// nil options everywhere.
	if _, err := e.c.Dequeue(c, "q", nil); err != nil {
		t.Fatal(err)
	}
	if counts, err := e.c.Depth(c, "q", nil); err != nil || counts != (subjects.Counts{Completed: 1, Canceled: 1}) {
		t.Fatalf("depth = %+v, %v", counts, err)
	}
}

// TestSettleNext: CompleteNext and ReleaseNext settle a message and return what their dequeue
// leased; a dequeue that fails after the settle is Settled.NextErr, a bad next the call's error.
func TestSettleNext(t *testing.T) {
	t.Parallel()
	e := setup(t)
	c := ctx(t)
	for i, id := range []string{"a", "b", "c"} {
		e.enqueue("q", "p-"+id, &workers.EnqueueOpts{ID: id, Priority: ptr(int64(i)), Metadata: map[string]string{"n": id}})
	}
	a := dequeueOne(t, e, "q")
	s, err := e.c.CompleteNext(c, "q", a.ID, a.LeaseID, &workers.DequeueOpts{Filter: map[string]string{"n": "c"}, Lease: 30 * time.Second})
	if err != nil || s.Message.State != subjects.StateCompleted || s.NextErr != nil || len(s.Next) != 1 {
		t.Fatalf("CompleteNext = %+v, %v", s, err)
	}
	if n := s.Next[0]; n.ID != "c" || string(n.Payload) != "p-c" || n.LeaseExpiresAt.Sub(n.UpdatedAt) != 30*time.Second {
		t.Fatalf("next %+v, want c with its payload and a 30s lease", n)
	}
	s, err = e.c.ReleaseNext(c, "q", "c", s.Next[0].LeaseID, &workers.ReleaseOpts{Delay: time.Hour}, nil)
	if err != nil || s.Message.State != subjects.StateInvisible || len(s.Next) != 1 || s.Next[0].ID != "b" {
		t.Fatalf("ReleaseNext = %+v, %v; want c invisible, then b", s, err)
	}
	b := s.Next[0]
	if _, err := e.c.CompleteNext(c, "q", b.ID, b.LeaseID, &workers.DequeueOpts{Wait: time.Second}); !errors.Is(err, workers.ErrOutOfRange) {
		t.Fatalf("CompleteNext with a wait: %v, want ErrOutOfRange", err)
	}
	if m := e.get("q", "b"); m.State != subjects.StateRunning {
		t.Fatalf("b is %s after a refused CompleteNext, want running", m.State)
	}
	if _, err := e.c.UpdateQueue(c, "q", &workers.QueueUpdate{DequeueBlocked: ptr(true)}); err != nil {
		t.Fatal(err)
	}
	s, err = e.c.CompleteNext(c, "q", b.ID, b.LeaseID, nil)
	if err != nil || s.Message.State != subjects.StateCompleted || len(s.Next) != 0 || !errors.Is(s.NextErr, workers.ErrQueueBlocked) {
		t.Fatalf("CompleteNext with dequeues blocked = %+v, %v; want completed, and NextErr ErrQueueBlocked", s, err)
	}
}

func dequeueOne(t *testing.T, e *env, queue string) workers.Message {
	t.Helper()
	msgs, err := e.c.Dequeue(ctx(t), queue, nil)
	if err != nil || len(msgs) != 1 {
		t.Fatalf("dequeue %s = %+v, %v; want one message", queue, msgs, err)
	}
	return msgs[0]
}

func TestEnqueueAttributes(t *testing.T) {
	t.Parallel()
	e := setup(t)
	c := ctx(t)
	e.createQueue("q", nil)
	r := e.enqueue("q", "p", &workers.EnqueueOpts{
		ID: "raw-1", Metadata: map[string]string{"k": "v ✓", "quote": `"{}"`}, Invisible: time.Hour, Lease: 1234 * time.Millisecond,
	})
	if r.State != subjects.StateInvisible {
		t.Fatalf("enqueue with Invisible = %+v", r)
	}
	m := e.get("q", "raw-1")
	if m.Metadata["k"] != "v ✓" || m.Metadata["quote"] != `"{}"` || m.VisibleAt.Sub(m.EnqueuedAt) != time.Hour {
		t.Fatalf("get = %+v", m)
	}
	// The message's own lease applies to a dequeue that asks for none.
	e.enqueue("q", "p", &workers.EnqueueOpts{ID: "raw-2", Lease: 1234 * time.Millisecond})
	d := dequeueOne(t, e, "q")
	if d.ID != "raw-2" || d.LeaseExpiresAt.Sub(d.UpdatedAt) != 1234*time.Millisecond {
		t.Fatalf("dequeue = %+v", d)
	}

	// MaxAttempts is the message's own, in the raw form (a header), as JSON (an id a header would
	// change), and in a batch.
	e.enqueue("q", "p", &workers.EnqueueOpts{ID: "attempts-raw", MaxAttempts: 2, Invisible: time.Hour})
	e.enqueue("q", "p", &workers.EnqueueOpts{ID: " attempts-json ", MaxAttempts: 3, Invisible: time.Hour})
	if _, err := e.c.EnqueueBatch(c, "q", []workers.BatchMessage{{EnqueueOpts: workers.EnqueueOpts{ID: "attempts-batch", MaxAttempts: 4, Invisible: time.Hour}}}); err != nil {
		t.Fatal(err)
	}
	for _, tc := range []struct {
		id   string
		want int
	}{{"attempts-raw", 2}, {" attempts-json ", 3}, {"attempts-batch", 4}, {"raw-1", subjects.DefaultMaxAttempts}} {
		if m := e.get("q", tc.id); m.AttemptsLeft != tc.want {
			t.Errorf("%q: %d attempts left, want %d", tc.id, m.AttemptsLeft, tc.want)
		}
	}
	if _, err := e.c.Enqueue(c, "q", []byte("p"), &workers.EnqueueOpts{MaxAttempts: subjects.MaxAttemptsLimit + 1}); !errors.Is(err, workers.ErrOutOfRange) {
		t.Fatalf("enqueue with MaxAttempts over the limit: %v, want ErrOutOfRange", err)
	}

	// VisibleAt keeps a message invisible until then, in the raw form, as JSON and in a batch; a time
	// that has come is pending at once, whatever the queue's invisibility.
	at := time.Now().Add(time.Hour).Truncate(time.Millisecond)
	e.enqueue("q", "p", &workers.EnqueueOpts{ID: "at-raw", VisibleAt: at})
	e.enqueue("q", "p", &workers.EnqueueOpts{ID: " at-json ", VisibleAt: at.In(time.FixedZone("", -7200))})
	if _, err := e.c.EnqueueBatch(c, "q", []workers.BatchMessage{{EnqueueOpts: workers.EnqueueOpts{ID: "at-batch", VisibleAt: at}}}); err != nil {
		t.Fatal(err)
	}
	for _, id := range []string{"at-raw", " at-json ", "at-batch"} {
		if m := e.get("q", id); m.State != subjects.StateInvisible || !m.VisibleAt.Equal(at) {
			t.Errorf("%q: %s until %v, want invisible until %v", id, m.State, m.VisibleAt, at)
		}
	}
	if _, err := e.c.Enqueue(c, "q", []byte("p"), &workers.EnqueueOpts{VisibleAt: at, Invisible: time.Minute}); !errors.Is(err, workers.ErrBadRequest) {
		t.Fatalf("enqueue with VisibleAt and Invisible: %v, want ErrBadRequest", err)
	}
	// Times RFC 3339 cannot write: one after the year 9999 is out of range, as the broker says of
	// any more than a year ahead; one before the year 0 has come.
	far := time.Date(10000, 1, 1, 0, 0, 0, 0, time.UTC)
	if _, err := e.c.Enqueue(c, "q", []byte("p"), &workers.EnqueueOpts{VisibleAt: far}); !errors.Is(err, workers.ErrOutOfRange) {
		t.Fatalf("enqueue visible in the year 10000: %v, want ErrOutOfRange", err)
	}
	if _, err := e.c.EnqueueBatch(c, "q", []workers.BatchMessage{{}, {EnqueueOpts: workers.EnqueueOpts{VisibleAt: far}}}); !errors.Is(err, workers.ErrOutOfRange) || !strings.Contains(err.Error(), "messages[1]: ") {
		t.Fatalf("batch with a message visible in the year 10000: %v, want ErrOutOfRange naming messages[1]", err)
	}
	ancient := time.Date(-50, 1, 1, 0, 0, 0, 0, time.UTC)
	if r := e.enqueue("q", "p", &workers.EnqueueOpts{ID: "ancient-raw", VisibleAt: ancient}); r.State != subjects.StatePending {
		t.Fatalf("enqueue visible in 51 BC: %+v, want pending", r)
	}
	if rs, err := e.c.EnqueueBatch(c, "q", []workers.BatchMessage{{EnqueueOpts: workers.EnqueueOpts{ID: "ancient-batch", VisibleAt: ancient}}}); err != nil || rs[0].State != subjects.StatePending {
		t.Fatalf("batch with a message visible in 51 BC: %+v, %v, want pending", rs, err)
	}

	// A negative Invisible is none, whatever the queue's default; 0 is the queue's.
	e.createQueue("later", &workers.QueueOpts{Invisible: time.Hour})
	if r := e.enqueue("later", "p", &workers.EnqueueOpts{Invisible: -1}); r.State != subjects.StatePending {
		t.Fatalf("enqueue with a negative Invisible = %+v, want pending", r)
	}
	if r := e.enqueue("later", "p", nil); r.State != subjects.StateInvisible {
		t.Fatalf("enqueue with the default = %+v, want the queue's invisibility", r)
	}
	if r := e.enqueue("later", "p", &workers.EnqueueOpts{VisibleAt: time.Now().Add(-time.Minute)}); r.State != subjects.StatePending {
		t.Fatalf("enqueue visible a minute ago = %+v, want pending", r)
	}
	rs, err := e.c.EnqueueBatch(c, "later", []workers.BatchMessage{{EnqueueOpts: workers.EnqueueOpts{Invisible: -time.Second}}, {}})
	if err != nil || rs[0].State != subjects.StatePending || rs[1].State != subjects.StateInvisible {
		t.Fatalf("batch with a negative Invisible and the default = %+v, %v", rs, err)
	}

	// An id a header would change goes as JSON, unchanged; one the broker refuses is refused.
	for _, id := range []string{" padded id ", "trailing ", "ünï côde"} {
		if _, err := e.c.Enqueue(c, "q", []byte("x"), &workers.EnqueueOpts{ID: id}); err != nil {
			t.Fatalf("enqueue id %q: %v", id, err)
		}
		if got := e.get("q", id); got.ID != id || string(got.Payload) != "x" {
			t.Fatalf("get %q = %+v", id, got)
		}
	}
	if _, err := e.c.Enqueue(c, "q", nil, &workers.EnqueueOpts{ID: "a\r\nNatstone-Priority: 1"}); !errors.Is(err, workers.ErrInvalidID) {
		t.Fatalf("enqueue with a line break in the id: %v, want ErrInvalidID", err)
	}
}

func TestBinaryPayloads(t *testing.T) {
	t.Parallel()
	e := setup(t)
	c := ctx(t)
	all := make([]byte, 256)
	for i := range all {
		all[i] = byte(i)
	}
	payloads := map[string][]byte{
		"all-bytes": all,
		"invalid":   {0xff, 0xfe, 0x00, 'a', 0x80},
		"nul":       {0},
		"text":      []byte("héllo ✓"),
		"empty":     {},
	}
	for id, p := range payloads {
		if _, err := e.c.Enqueue(c, "raw", p, &workers.EnqueueOpts{ID: id}); err != nil {
			t.Fatalf("enqueue %s: %v", id, err)
		}
	}
	var batch []workers.BatchMessage
	for id, p := range payloads {
		batch = append(batch, workers.BatchMessage{Payload: p, EnqueueOpts: workers.EnqueueOpts{ID: id}})
	}
	replies, err := e.c.EnqueueBatch(c, "batch", batch)
	if err != nil || len(replies) != len(batch) {
		t.Fatalf("enqueue batch = %+v, %v", replies, err)
	}
	for i, r := range replies {
		if r.ID != batch[i].ID || r.State != subjects.StatePending {
			t.Fatalf("batch reply %d = %+v, want id %s", i, r, batch[i].ID)
		}
	}
	for _, q := range []string{"raw", "batch"} {
		for id, p := range payloads {
			if got := e.get(q, id).Payload; !bytes.Equal(got, p) {
				t.Errorf("%s/%s: get payload = %v, want %v", q, id, got, p)
			}
		}
		msgs, err := e.c.Dequeue(c, q, &workers.DequeueOpts{Batch: len(payloads)})
		if err != nil || len(msgs) != len(payloads) {
			t.Fatalf("dequeue %s = %d messages, %v", q, len(msgs), err)
		}
		for _, m := range msgs {
			if !bytes.Equal(m.Payload, payloads[m.ID]) {
				t.Errorf("%s/%s: dequeued payload = %v, want %v", q, m.ID, m.Payload, payloads[m.ID])
			}
		}
	}
}

func TestDeadlineIsPriority(t *testing.T) {
	t.Parallel()
	e := setup(t)
	c := ctx(t)
	now := time.Now()
	late := e.enqueue("q", "late", &workers.EnqueueOpts{ID: "late", Deadline: now.Add(time.Hour)})
	soon := e.enqueue("q", "soon", &workers.EnqueueOpts{ID: "soon", Deadline: now.Add(time.Minute)})
	// Priority wins over Deadline.
	first := e.enqueue("q", "first", &workers.EnqueueOpts{ID: "first", Priority: ptr(int64(1)), Deadline: now})
	if late.Priority != now.Add(time.Hour).UnixMilli() || soon.Priority != now.Add(time.Minute).UnixMilli() || first.Priority != 1 {
		t.Fatalf("priorities = %d, %d, %d", late.Priority, soon.Priority, first.Priority)
	}
	// Batch too.
	rs, err := e.c.EnqueueBatch(c, "q", []workers.BatchMessage{{EnqueueOpts: workers.EnqueueOpts{ID: "b", Deadline: now.Add(2 * time.Minute)}}})
	if err != nil || rs[0].Priority != now.Add(2*time.Minute).UnixMilli() {
		t.Fatalf("batch = %+v, %v", rs, err)
	}
	msgs, err := e.c.Dequeue(c, "q", &workers.DequeueOpts{Batch: 10})
	if err != nil {
		t.Fatal(err)
	}
	var order []string
	for _, m := range msgs {
		order = append(order, m.ID)
	}
	if want := []string{"first", "soon", "b", "late"}; !slices.Equal(order, want) {
		t.Fatalf("dequeue order = %v, want %v (earliest deadline first)", order, want)
	}
}

// TestErrorCodes provokes each error code the broker returns (and invalid_queue_name, which the
// client detects itself) and checks errors.Is with the sentinel, errors.As to *APIError, and the
// status.
func TestErrorCodes(t *testing.T) {
	t.Parallel()
	e := setupFake(t)
	c := ctx(t)
	e.createQueue("q", &workers.QueueOpts{MaxPayloadBytes: 10, Lease: time.Second})
	e.createQueue("x", &workers.QueueOpts{Type: subjects.Exclusive, ExclusivityKey: "p"})
	e.createQueue("blocked", &workers.QueueOpts{EnqueueBlocked: true})
	info := e.createQueue("cas", nil)
	if _, err := e.c.UpdateQueue(c, "cas", &workers.QueueUpdate{MaxAttempts: ptr(3)}); err != nil {
		t.Fatal(err)
	}
	for i := range 3 {
		e.enqueue("q", "m", &workers.EnqueueOpts{ID: fmt.Sprint("m", i)})
	}
	m0 := dequeueOne(t, e, "q")
	m1 := dequeueOne(t, e, "q")
	m2 := dequeueOne(t, e, "q")
	if _, err := e.c.Release(c, "q", m1.ID, m1.LeaseID, nil); err != nil {
		t.Fatal(err)
	}
	e.clk.Advance(time.Second) // the leases of m0 and m2 run out

	tests := []struct {
		code subjects.Code
		want error
		call func() error
	}{
		{subjects.CodeBadRequest, workers.ErrBadRequest, func() error {
			_, err := e.c.Complete(c, "q", m0.ID, "")
			return err
		}},
		{subjects.CodeInvalidQueueName, workers.ErrInvalidQueueName, func() error {
			_, err := e.c.Queue(c, "a.b")
			return err
		}},
		{subjects.CodeInvalidID, workers.ErrInvalidID, func() error {
			_, err := e.c.Get(c, "q", strings.Repeat("i", subjects.MaxIDLen+1))
			return err
		}},
		{subjects.CodeInvalidMetadata, workers.ErrInvalidMetadata, func() error {
			_, err := e.c.Enqueue(c, "q", nil, &workers.EnqueueOpts{Metadata: map[string]string{"": "v"}})
			return err
		}},
		{subjects.CodeInvalidConfig, workers.ErrInvalidConfig, func() error {
			_, err := e.c.CreateQueue(c, "bad", &workers.QueueOpts{MaxAttempts: subjects.MaxAttemptsLimit + 1})
			return err
		}},
		{subjects.CodeMissingExclusivityKey, workers.ErrMissingExclusivityKey, func() error {
			_, err := e.c.Enqueue(c, "x", []byte("no key"), nil)
			return err
		}},
		{subjects.CodePayloadTooLarge, workers.ErrPayloadTooLarge, func() error {
			_, err := e.c.Enqueue(c, "q", []byte("eleven byte"), nil)
			return err
		}},
		{subjects.CodeOutOfRange, workers.ErrOutOfRange, func() error {
			_, err := e.c.Dequeue(c, "q", &workers.DequeueOpts{Batch: subjects.MaxDequeueBatch + 1})
			return err
		}},
		{subjects.CodeInvalidSchedule, workers.ErrInvalidSchedule, func() error {
			_, err := e.c.Schedule(c, "q", "s", workers.ScheduleOpts{Cron: "@every 1ms"})
			return err
		}},
		{subjects.CodeQueueNotFound, workers.ErrQueueNotFound, func() error {
			_, err := e.c.Depth(c, "nope", nil)
			return err
		}},
		{subjects.CodeQueueExists, workers.ErrQueueExists, func() error {
			_, err := e.c.CreateQueue(c, "q", &workers.QueueOpts{MaxPayloadBytes: 11})
			return err
		}},
		{subjects.CodeQueueBlocked, workers.ErrQueueBlocked, func() error {
			_, err := e.c.Enqueue(c, "blocked", []byte("x"), nil)
			return err
		}},
		{subjects.CodeMessageNotFound, workers.ErrMessageNotFound, func() error {
			_, err := e.c.Get(c, "q", "nope")
			return err
		}},
		{subjects.CodeInvalidState, workers.ErrInvalidState, func() error {
			_, err := e.c.Complete(c, "q", m1.ID, m1.LeaseID) // released
			return err
		}},
		{subjects.CodeLeaseMismatch, workers.ErrLeaseMismatch, func() error {
			_, err := e.c.Complete(c, "q", m2.ID, "not-the-lease")
			return err
		}},
		{subjects.CodeLeaseExpired, workers.ErrLeaseExpired, func() error {
			_, err := e.c.Complete(c, "q", m2.ID, m2.LeaseID)
			return err
		}},
		{subjects.CodeRevisionMismatch, workers.ErrRevisionMismatch, func() error {
			_, err := e.c.UpdateQueue(c, "cas", &workers.QueueUpdate{Revision: info.Revision, MaxAttempts: ptr(4)})
			return err
		}},
	}
	for _, tc := range tests {
		t.Run(string(tc.code), func(t *testing.T) {
			err := tc.call()
			if !errors.Is(err, tc.want) {
				t.Fatalf("err = %v, want %v", err, tc.want)
			}
			var apiErr *workers.APIError
			if !errors.As(err, &apiErr) {
				t.Fatalf("err = %T %v, want an *APIError", err, err)
			}
			if apiErr.Code != tc.code || apiErr.Status != tc.code.Status() || apiErr.Message == "" {
				t.Fatalf("APIError = %+v, want code %s status %d and a message", apiErr, tc.code, tc.code.Status())
			}
			if !errors.Is(err, &subjects.Error{Code: tc.code}) || !errors.Is(err, &workers.APIError{Code: tc.code}) {
				t.Error("errors.Is does not match a *subjects.Error or *APIError with the same code")
			}
			if errors.Is(err, workers.ErrInternal) || (tc.code != subjects.CodeLeaseExpired && errors.Is(err, workers.ErrLeaseExpired)) {
				t.Error("errors.Is matches the sentinel of another code")
			}
			if want := "natstone: " + string(tc.code) + ": "; !strings.HasPrefix(err.Error(), want) {
				t.Errorf("Error() = %q, want prefix %q", err, want)
			}
		})
	}
}

// TestAPIErrorIs checks that each code matches its own sentinel and no other.
func TestAPIErrorIs(t *testing.T) {
	t.Parallel()
	codes := map[subjects.Code]error{
		subjects.CodeBadRequest: workers.ErrBadRequest, subjects.CodeInvalidQueueName: workers.ErrInvalidQueueName,
		subjects.CodeInvalidID: workers.ErrInvalidID, subjects.CodeInvalidMetadata: workers.ErrInvalidMetadata,
		subjects.CodeInvalidConfig: workers.ErrInvalidConfig, subjects.CodeMissingExclusivityKey: workers.ErrMissingExclusivityKey,
		subjects.CodePayloadTooLarge: workers.ErrPayloadTooLarge, subjects.CodeOutOfRange: workers.ErrOutOfRange,
		subjects.CodeQueueNotFound: workers.ErrQueueNotFound, subjects.CodeQueueExists: workers.ErrQueueExists,
		subjects.CodeQueueBlocked: workers.ErrQueueBlocked, subjects.CodeMessageNotFound: workers.ErrMessageNotFound,
		subjects.CodeInvalidState: workers.ErrInvalidState, subjects.CodeLeaseMismatch: workers.ErrLeaseMismatch,
		subjects.CodeLeaseExpired: workers.ErrLeaseExpired, subjects.CodeRevisionMismatch: workers.ErrRevisionMismatch,
		subjects.CodeUnavailable: workers.ErrUnavailable, subjects.CodeInternal: workers.ErrInternal,
	}
	for code, sentinel := range codes {
		err := fmt.Errorf("wrapped: %w", &workers.APIError{Code: code, Message: "m", Status: code.Status()})
		for other, s := range codes {
			if got := errors.Is(err, s); got != (other == code) {
				t.Errorf("code %s: errors.Is(err, sentinel of %s) = %v", code, other, got)
			}
		}
		if errors.Is(err, errors.New(sentinel.Error())) {
			t.Errorf("code %s matches a look-alike error: Is must compare identity", code)
		}
	}
	unknown := &workers.APIError{Code: "from_the_future"}
	for _, s := range codes {
		if errors.Is(unknown, s) {
			t.Errorf("an unknown code matches %v", s)
		}
	}
	var nilErr *workers.APIError
	if nilErr.Is(workers.ErrInternal) {
		t.Error("a nil *APIError matches a sentinel")
	}
}

func TestNoResponders(t *testing.T) {
	t.Parallel()
	srv := natstest.Start(t, nil) // no broker
	c, err := workers.NewClient(srv.Connect(t), nil)
	if err != nil {
		t.Fatal(err)
	}
	cx := ctx(t)
	_, err = c.Queues(cx)
	if !errors.Is(err, nats.ErrNoResponders) {
		t.Fatalf("Queues without a broker: %v, want nats.ErrNoResponders", err)
	}
	var apiErr *workers.APIError
	if errors.As(err, &apiErr) {
		t.Fatalf("a transport error is an *APIError: %+v", apiErr)
	}
	if _, err := c.Enqueue(cx, "q", []byte("x"), nil); !errors.Is(err, nats.ErrNoResponders) || !strings.HasPrefix(err.Error(), "natstone: enqueue q: ") {
		t.Fatalf("Enqueue without a broker: %v, want it named as the caller's enqueue", err)
	}
	if _, err := c.Dequeue(cx, "q", &workers.DequeueOpts{Wait: time.Minute}); !errors.Is(err, nats.ErrNoResponders) {
		t.Fatalf("Dequeue without a broker: %v", err)
	}
}

// TestTimeouts checks the client's own timeout (nats.ErrTimeout), that a dequeue's wait extends it,
// and the caller's context.
func TestTimeouts(t *testing.T) {
	t.Parallel()
	srv := natstest.Start(t, nil)
	space, _ := subjects.NewSpace("")
	// A responder that answers nothing but dequeues, after their wait.
	silent := srv.Connect(t)
	if _, err := silent.Subscribe(space.Wildcard(subjects.OpInfo), func(*nats.Msg) {}); err != nil {
		t.Fatal(err)
	}
	if _, err := silent.Subscribe(space.Wildcard(subjects.OpDequeue), func(m *nats.Msg) {
		r := decode[subjects.DequeueRequest](t, m.Data)
		// A long poll's empty answer comes after its wait, well past the client's own timeout.
		time.AfterFunc(time.Duration(r.WaitMS)*time.Millisecond, func() { _ = m.Respond([]byte(`{"messages":[]}`)) })
	}); err != nil {
		t.Fatal(err)
	}
	if err := silent.Flush(); err != nil {
		t.Fatal(err)
	}
	c, err := workers.NewClient(srv.Connect(t), &workers.Config{Timeout: 50 * time.Millisecond})
	if err != nil {
		t.Fatal(err)
	}
	if _, err := c.Queue(ctx(t), "q"); !errors.Is(err, nats.ErrTimeout) {
		t.Fatalf("no reply: %v, want nats.ErrTimeout", err)
	}
	// The reply comes after the wait, later than the timeout alone but well within timeout + wait.
	slow, err := workers.NewClient(srv.Connect(t), &workers.Config{Timeout: time.Second})
	if err != nil {
		t.Fatal(err)
	}
	msgs, err := slow.Dequeue(ctx(t), "q", &workers.DequeueOpts{Wait: 1500 * time.Millisecond})
	if err != nil || len(msgs) != 0 {
		t.Fatalf("dequeue waiting 1.5s with a 1s timeout = %v, %v; want the wait added to the timeout", msgs, err)
	}
	cancelled, cancel := context.WithCancel(context.Background())
	cancel()
	if _, err := c.Queue(cancelled, "q"); !errors.Is(err, context.Canceled) || errors.Is(err, nats.ErrTimeout) {
		t.Fatalf("cancelled context: %v, want context.Canceled", err)
	}
}

// TestErrorReplyDecoding checks replies from a responder that is not the broker: the body decides,
// with or without the micro headers.
func TestErrorReplyDecoding(t *testing.T) {
	t.Parallel()
	srv := natstest.Start(t, nil)
	space, _ := subjects.NewSpace("test.fake")
	fake := srv.Connect(t)
	replies := map[string]*nats.Msg{
		"body-only":    {Data: []byte(`{"error":{"code":"lease_expired","message":"gone"}}`)},
		"headers-only": {Data: []byte("not json"), Header: nats.Header{"Nats-Service-Error": {"boom"}, "Nats-Service-Error-Code": {"503"}}},
		"both":         {Data: []byte(`{"error":{"code":"queue_blocked","message":"paused"}}`), Header: nats.Header{"Nats-Service-Error": {"paused"}, "Nats-Service-Error-Code": {"409"}}},
	}
	if _, err := fake.Subscribe(space.Wildcard(subjects.OpInfo), func(m *nats.Msg) {
		_, queue, _ := space.Parse(m.Subject)
		r := replies[queue]
		_ = m.RespondMsg(&nats.Msg{Data: r.Data, Header: r.Header})
	}); err != nil {
		t.Fatal(err)
	}
	if err := fake.Flush(); err != nil {
		t.Fatal(err)
	}
	c, err := workers.NewClient(srv.Connect(t), &workers.Config{Prefix: "test.fake"})
	if err != nil {
		t.Fatal(err)
	}
	tests := []struct {
		queue  string
		code   subjects.Code
		status int
		msg    string
	}{
		{"body-only", subjects.CodeLeaseExpired, 409, "gone"},
		{"headers-only", subjects.CodeInternal, 503, "boom"},
		{"both", subjects.CodeQueueBlocked, 409, "paused"},
	}
	for _, tc := range tests {
		_, err := c.Queue(ctx(t), tc.queue)
		var apiErr *workers.APIError
		if !errors.As(err, &apiErr) || apiErr.Code != tc.code || apiErr.Status != tc.status || apiErr.Message != tc.msg {
			t.Errorf("%s: err = %#v, want code %s status %d message %q", tc.queue, err, tc.code, tc.status, tc.msg)
		}
	}
}

// TestConcurrentClient shares one Client between goroutines that enqueue, dequeue and complete;
// run with -race.
func TestConcurrentClient(t *testing.T) {
	t.Parallel()
	e := setup(t)
	c := ctx(t)
	const goroutines, each = 8, 25
	var wg sync.WaitGroup
	errs := make(chan error, goroutines)
	for g := range goroutines {
		wg.Go(func() {
			for i := range each {
				if _, err := e.c.Enqueue(c, "shared", []byte{byte(g), byte(i)}, &workers.EnqueueOpts{ID: fmt.Sprintf("g%d-%d", g, i)}); err != nil {
					errs <- err
					return
				}
			}
		})
	}
	wg.Wait()
	var mu sync.Mutex
	completed := map[string]int{}
	for range goroutines {
		wg.Go(func() {
			for {
				msgs, err := e.c.Dequeue(c, "shared", &workers.DequeueOpts{Batch: 3})
				if err != nil {
					errs <- err
					return
				}
				if len(msgs) == 0 {
					return
				}
				for _, m := range msgs {
					if _, err := e.c.Complete(c, "shared", m.ID, m.LeaseID); err != nil {
						errs <- err
						return
					}
					mu.Lock()
					completed[m.ID]++
					mu.Unlock()
				}
			}
		})
	}
	wg.Wait()
	close(errs)
	for err := range errs {
		t.Fatal(err)
	}
	if len(completed) != goroutines*each {
		t.Fatalf("completed %d distinct messages, want %d", len(completed), goroutines*each)
	}
	for id, n := range completed {
		if n != 1 {
			t.Errorf("%s completed %d times", id, n)
		}
	}
	counts, err := e.c.Depth(c, "shared", nil)
	if err != nil || counts != (subjects.Counts{Completed: goroutines * each}) {
		t.Fatalf("depth = %+v, %v", counts, err)
	}
}

// TestQueuesPagesThroughLongLists: on a server whose max_payload (16 KiB) holds a few dozen queues per
// reply, Queues asks as many times as it takes and returns every queue once, in order.
func TestQueuesPagesThroughLongLists(t *testing.T) {
	t.Parallel()
	e := start(t, nil, &natstest.Options{MaxPayload: 16 << 10})
	c := ctx(t)
	var want []string
	for i := range 150 {
		name := fmt.Sprintf("q%03d", i)
		e.createQueue(name, nil)
		want = append(want, name)
	}
	list, err := e.c.Queues(c)
	if err != nil {
		t.Fatal(err)
	}
	var got []string
	for _, q := range list {
		got = append(got, q.Name)
	}
	if !slices.Equal(got, want) {
		t.Fatalf("Queues returned %d: %v, want the %d in order", len(got), got, len(want))
	}
}

// TestListQueuesByPage: ListQueues gives one page, after a name, of at most its limit, and says
// whether more follow; its errors are the client's sentinels.
func TestListQueuesByPage(t *testing.T) {
	t.Parallel()
	e := setup(t)
	c := ctx(t)
	for _, name := range []string{"a", "b", "c"} {
		e.createQueue(name, nil)
	}
	for _, tc := range []struct {
		opts *workers.ListOpts
		want []string
		more bool
	}{
		{nil, []string{"a", "b", "c"}, false},
		{&workers.ListOpts{Limit: 2}, []string{"a", "b"}, true},
		{&workers.ListOpts{After: "b", Limit: 2}, []string{"c"}, false},
		{&workers.ListOpts{After: "c"}, nil, false},
	} {
		list, more, err := e.c.ListQueues(c, tc.opts)
		var got []string
		for _, q := range list {
			got = append(got, q.Name)
		}
		if err != nil || !slices.Equal(got, tc.want) || more != tc.more {
			t.Errorf("ListQueues(%+v): %v, more %v, %v; want %v, more %v", tc.opts, got, more, err, tc.want, tc.more)
		}
	}
	if _, _, err := e.c.ListQueues(c, &workers.ListOpts{Limit: subjects.MaxListLimit + 1}); !errors.Is(err, workers.ErrOutOfRange) {
		t.Errorf("a limit past %d: %v, want ErrOutOfRange", subjects.MaxListLimit, err)
	}
	if _, _, err := e.c.ListQueues(c, &workers.ListOpts{After: "bad.name"}); !errors.Is(err, workers.ErrInvalidQueueName) {
		t.Errorf("after an invalid name: %v, want ErrInvalidQueueName", err)
	}
}

// TestInvalidUTF8IsRefusedNotRewritten: json.Marshal sends each byte of invalid UTF-8 as U+FFFD, so
// "job-\xff" and "job-\xfe" would both reach the broker as "job-�", and the second enqueue would
// be answered as a duplicate, its payload dropped. The client refuses such text as the broker
// refuses it in a body, and sends nothing.
func TestInvalidUTF8IsRefusedNotRewritten(t *testing.T) {
	t.Parallel()
	e := setup(t)
	c := ctx(t)
	e.createQueue("q", nil)
	enqueues := e.count(subjects.OpEnqueueBatch, "q")
	for name, call := range map[string]func() error{
		"batch ids": func() error {
			_, err := e.c.EnqueueBatch(c, "q", []workers.BatchMessage{
				{Payload: []byte("first"), EnqueueOpts: workers.EnqueueOpts{ID: "job-\xff"}},
				{Payload: []byte("second"), EnqueueOpts: workers.EnqueueOpts{ID: "job-\xfe"}},
			})
			return err
		},
		"batch metadata value": func() error {
			_, err := e.c.EnqueueBatch(c, "q", []workers.BatchMessage{{EnqueueOpts: workers.EnqueueOpts{Metadata: map[string]string{"k": "\xff"}}}})
			return err
		},
		"metadata header": func() error {
			_, err := e.c.Enqueue(c, "q", []byte("z"), &workers.EnqueueOpts{ID: "md", Metadata: map[string]string{"k\xfe": "v"}})
			return err
		},
		"id sent as JSON": func() error { // a trailing space keeps it out of a header
			_, err := e.c.Enqueue(c, "q", []byte("z"), &workers.EnqueueOpts{ID: "a\xff "})
			return err
		},
		"filter": func() error {
			_, err := e.c.Dequeue(c, "q", &workers.DequeueOpts{Filter: map[string]string{"k": "\xc0"}})
			return err
		},
		"lease id": func() error {
			_, err := e.c.Complete(c, "q", "m", "L\xff")
			return err
		},
	} {
		// As the broker's refusal would read: the *APIError itself.
		if err := call(); !errors.Is(err, workers.ErrBadRequest) || !strings.HasPrefix(err.Error(), "natstone: bad_request: ") ||
			!strings.Contains(err.Error(), "not valid UTF-8") {
			t.Errorf("%s: %v, want a bad request for invalid UTF-8", name, err)
		}
	}
	if n := enqueues.n(t); n != 0 {
		t.Errorf("%d enqueue_batch requests sent, want none", n)
	}
	if counts, err := e.c.Depth(c, "q", nil); err != nil || counts != (subjects.Counts{}) {
		t.Fatalf("depth = %+v, %v; want nothing enqueued", counts, err)
	}
	// A U+FFFD given is a character like any other, and an escaped backslash before "ufffd" is text.
	for _, id := range []string{"job-\ufffd", `job-\ufffd`} {
		if _, err := e.c.EnqueueBatch(c, "q", []workers.BatchMessage{{EnqueueOpts: workers.EnqueueOpts{ID: id}}}); err != nil {
			t.Errorf("id %q: %v", id, err)
		}
		if m := e.get("q", id); m.ID != id {
			t.Errorf("id %q stored as %q", id, m.ID)
		}
	}
}

// TestFailureText: a handler's error becomes a release's error that the broker takes: valid UTF-8,
// at most subjects.MaxErrorLen bytes, cut at a character's boundary.
func TestFailureText(t *testing.T) {
	long := strings.Repeat("a", subjects.MaxErrorLen-1) + "é and more"
	for _, tc := range []struct {
		err  error
		want string
	}{
		{nil, ""},
		{errors.New("upstream said 429\n\tat fetch()"), "upstream said 429\n\tat fetch()"},
		{errors.New("bad byte \xff here"), "bad byte \uFFFD here"},
		{errors.New(long), strings.Repeat("a", subjects.MaxErrorLen-1)}, // é would pass the limit
		{errors.New(strings.Repeat("é", subjects.MaxErrorLen)), strings.Repeat("é", subjects.MaxErrorLen/2)},
	} {
		got := workers.FailureText(tc.err)
		if got != tc.want {
			t.Errorf("FailureText(%.40q…): %.40q… (%d bytes), want %.40q… (%d bytes)", fmt.Sprint(tc.err), got, len(got), tc.want, len(tc.want))
		}
		if subjects.ValidateError(got) != nil || !utf8.ValidString(got) {
			t.Errorf("FailureText(%.40q…) = %.40q…: the broker would refuse it", fmt.Sprint(tc.err), got)
		}
	}
}

// TestRetry: Retry re-drives an errored message with its attempts anew, fenced by RetryOpts.Version.
func TestRetry(t *testing.T) {
	t.Parallel()
	e := setup(t)
	c := ctx(t)
	e.createQueue("q", &workers.QueueOpts{MaxAttempts: 1})
	e.enqueue("q", "x", &workers.EnqueueOpts{ID: "m"})
	msgs, err := e.c.Dequeue(c, "q", nil)
	if err != nil || len(msgs) != 1 {
		t.Fatalf("dequeue: %v, %v", msgs, err)
	}
	errored, err := e.c.Release(c, "q", "m", msgs[0].LeaseID, &workers.ReleaseOpts{Error: "boom"})
	if err != nil || errored.State != subjects.StateErrored {
		t.Fatalf("release on the last attempt: %+v, %v", errored, err)
	}
	if _, err := e.c.Retry(c, "q", "m", &workers.RetryOpts{Version: errored.Version + 1}); !errors.Is(err, workers.ErrRevisionMismatch) {
		t.Fatalf("retry at another version: %v, want ErrRevisionMismatch", err)
	}
	m, err := e.c.Retry(c, "q", "m", &workers.RetryOpts{Version: errored.Version, Delay: time.Minute})
	if err != nil || m.State != subjects.StateInvisible || m.Attempts != 0 || m.VisibleAt.Sub(m.UpdatedAt) != time.Minute {
		t.Fatalf("retry with a delay: %+v, %v; want invisible for a minute, no attempt spent", m, err)
	}
	if again, err := e.c.Retry(c, "q", "m", nil); err != nil || again.Version != m.Version {
		t.Fatalf("retry of a message that is not finished: %+v, %v; want it unchanged", again, err)
	}
	if _, err := e.c.Retry(c, "q", "nope", nil); !errors.Is(err, workers.ErrMessageNotFound) {
		t.Fatalf("retry of an unknown id: %v, want ErrMessageNotFound", err)
	}
}

// TestReschedule: a Go client moves a pending message ahead by its deadline, makes an invisible one
// pending at once, and gets typed errors for a request without a change and for a running message.
func TestReschedule(t *testing.T) {
	t.Parallel()
	e := setup(t)
	c := ctx(t)
	e.createQueue("q", nil)
	e.enqueue("q", "a", &workers.EnqueueOpts{ID: "a", Priority: ptr[int64](10)})
	e.enqueue("q", "b", &workers.EnqueueOpts{ID: "b", Priority: ptr[int64](20)})
	e.enqueue("q", "c", &workers.EnqueueOpts{ID: "c", Priority: ptr[int64](30), Invisible: time.Hour})
	if _, err := e.c.Reschedule(c, "q", "b", workers.RescheduleOpts{}); !errors.Is(err, workers.ErrBadRequest) {
		t.Fatalf("reschedule without a change: %v, want ErrBadRequest", err)
	}
	if _, err := e.c.Reschedule(c, "q", "b", workers.RescheduleOpts{Priority: ptr[int64](1), Deadline: time.Now()}); !errors.Is(err, workers.ErrBadRequest) {
		t.Fatalf("reschedule with a priority and a deadline: %v, want ErrBadRequest", err)
	}
	if _, err := e.c.Reschedule(c, "q", "b", workers.RescheduleOpts{Delay: ptr(-500 * time.Microsecond)}); !errors.Is(err, workers.ErrOutOfRange) {
		t.Fatalf("reschedule with a negative delay: %v, want ErrOutOfRange", err)
	}
	b, err := e.c.Reschedule(c, "q", "b", workers.RescheduleOpts{Deadline: time.UnixMilli(5)})
	if err != nil || b.Priority != 5 {
		t.Fatalf("reschedule to deadline 5 ms: %+v, %v", b, err)
	}
	now := time.Duration(0)
	if m, err := e.c.Reschedule(c, "q", "c", workers.RescheduleOpts{Delay: &now, Version: 1}); err != nil || m.State != subjects.StatePending {
		t.Fatalf("reschedule of an invisible message with a zero delay: %+v, %v; want pending", m, err)
	}
	msgs, err := e.c.Dequeue(c, "q", &workers.DequeueOpts{Batch: 3})
	if err != nil || len(msgs) != 3 || msgs[0].ID != "b" || msgs[1].ID != "a" || msgs[2].ID != "c" {
		t.Fatalf("dequeue after the reschedules: %+v, %v; want b, a, c", msgs, err)
	}
	if _, err := e.c.Reschedule(c, "q", "a", workers.RescheduleOpts{Priority: ptr[int64](1)}); !errors.Is(err, workers.ErrInvalidState) {
		t.Fatalf("reschedule of a running message: %v, want ErrInvalidState", err)
	}

	// VisibleAt: invisible until then; not with Delay; not past the broker's bound.
	e.enqueue("q", "d", &workers.EnqueueOpts{ID: "d"})
	at := time.Now().Add(time.Hour).Truncate(time.Millisecond)
	if m, err := e.c.Reschedule(c, "q", "d", workers.RescheduleOpts{VisibleAt: at.In(time.FixedZone("", 19800))}); err != nil || m.State != subjects.StateInvisible || !m.VisibleAt.Equal(at) {
		t.Fatalf("reschedule visible in an hour: %+v, %v; want invisible until %v", m, err, at)
	}
	if _, err := e.c.Reschedule(c, "q", "d", workers.RescheduleOpts{VisibleAt: at, Delay: &now}); !errors.Is(err, workers.ErrBadRequest) {
		t.Fatalf("reschedule with a delay and a VisibleAt: %v, want ErrBadRequest", err)
	}
	for _, far := range []time.Time{time.Now().Add(subjects.MaxInvisible + time.Hour), time.Date(10000, 1, 1, 0, 0, 0, 0, time.UTC)} {
		if _, err := e.c.Reschedule(c, "q", "d", workers.RescheduleOpts{VisibleAt: far}); !errors.Is(err, workers.ErrOutOfRange) {
			t.Fatalf("reschedule visible at %v: %v, want ErrOutOfRange", far, err)
		}
	}
}

// TestCancelAt: an operator's cancel at a version cancels only a message still at that version.
func TestCancelAt(t *testing.T) {
	t.Parallel()
	e := setup(t)
	c := ctx(t)
	e.createQueue("q", nil)
	e.enqueue("q", "x", &workers.EnqueueOpts{ID: "m"})
	listed, err := e.c.Get(c, "q", "m")
	if err != nil {
		t.Fatal(err)
	}
	if _, err := e.c.CancelAt(c, "q", "m", 0); !errors.Is(err, workers.ErrBadRequest) {
		t.Fatalf("CancelAt version 0: %v, want ErrBadRequest", err)
	}
	if _, err := e.c.CancelAt(c, "q", "m", listed.Version+1); !errors.Is(err, workers.ErrRevisionMismatch) {
		t.Fatalf("CancelAt another version: %v, want ErrRevisionMismatch", err)
	}
	m, err := e.c.CancelAt(c, "q", "m", listed.Version)
	if err != nil || m.State != subjects.StateCanceled {
		t.Fatalf("CancelAt the listed version: %+v, %v; want canceled", m, err)
	}
}

// TestClientAbandon: Abandon gives back what the dequeue of its request id leased, as ids.
func TestClientAbandon(t *testing.T) {
	t.Parallel()
	e := setup(t)
	e.enqueue("q", "p", &workers.EnqueueOpts{ID: "m"})
	if _, err := e.c.Dequeue(ctx(t), "q", &workers.DequeueOpts{RequestID: "r"}); err != nil {
		t.Fatal(err)
	}
	released, err := e.c.Abandon(ctx(t), "q", "r")
	if err != nil || !slices.Equal(released, []string{"m"}) {
		t.Fatalf("Abandon: %v, %v; want [m]", released, err)
	}
	if m := e.get("q", "m"); m.State != subjects.StatePending || m.Attempts != 0 {
		t.Fatalf("m after the abandon: %s at %d attempts", m.State, m.Attempts)
	}
	if _, err := e.c.Abandon(ctx(t), "q", ""); !errors.Is(err, workers.ErrBadRequest) {
		t.Fatalf("Abandon without a request id: %v, want ErrBadRequest", err)
	}
}

// TestClientRequestOverMaxPayload: a request larger than the NATS server takes is not sent, and is
// ErrPayloadTooLarge as a payload over the queue's limit would be.
func TestClientRequestOverMaxPayload(t *testing.T) {
	t.Parallel()
	e := setup(t)
	_, err := e.c.Enqueue(ctx(t), "q", make([]byte, 2<<20), &workers.EnqueueOpts{ID: "big"})
	if !errors.Is(err, workers.ErrPayloadTooLarge) || !strings.Contains(err.Error(), "max_payload") {
		t.Fatalf("a 2 MiB enqueue: %v, want ErrPayloadTooLarge naming the server's max_payload", err)
	}
	if _, err := e.c.Queue(ctx(t), "q"); !errors.Is(err, workers.ErrQueueNotFound) {
		t.Fatalf("the queue after the refused enqueue: %v, want none made", err)
	}
}

// TestClientDequeueAbandonsALongPollItsContextEnds: a long poll without a request id that its
// context ends before the reply is abandoned: a message enqueued after is not leased to it (to stay
// running, unprocessed) but to the next dequeue.
func TestClientDequeueAbandonsALongPollItsContextEnds(t *testing.T) {
	t.Parallel()
	e := setup(t)
	e.createQueue("q", nil)
	abandons := e.count(subjects.OpAbandon, "q")
	short, cancel := context.WithTimeout(ctx(t), 200*time.Millisecond)
	defer cancel()
	if _, err := e.c.Dequeue(short, "q", &workers.DequeueOpts{Wait: time.Minute}); !errors.Is(err, context.DeadlineExceeded) {
		t.Fatalf("the long poll: %v, want its context's end", err)
	}
	if n := abandons.n(t); n != 1 {
		t.Fatalf("%d abandons, want the poll's", n)
	}
	e.enqueue("q", "after", &workers.EnqueueOpts{ID: "m"})
	ms, err := e.c.Dequeue(ctx(t), "q", nil)
	if err != nil || len(ms) != 1 || ms[0].ID != "m" || ms[0].Attempts != 1 {
		t.Fatalf("the next dequeue: %+v, %v; want m at its first attempt", ms, err)
	}
}

// TestClientDequeueAbandonsALongPollOfUnknownOutcome: a long poll without a request id whose outcome
// is unknown — no reply within the client's timeout, or unavailable — may have leased a message, and
// the caller cannot send it again without its id: it is abandoned with the id Dequeue made up.
func TestClientDequeueAbandonsALongPollOfUnknownOutcome(t *testing.T) {
	t.Parallel()
	for _, tc := range []struct {
		name  string
		reply []byte // nil: none
		err   error
	}{
		{"no reply", nil, nats.ErrTimeout},
		{"unavailable", []byte(`{"error":{"code":"unavailable","message":"the write's outcome is unknown"}}`), workers.ErrUnavailable},
	} {
		t.Run(tc.name, func(t *testing.T) {
			t.Parallel()
			srv := natstest.Start(t, nil)
			fake, space, reqs := fakeDequeues(t, srv, func(int32) []byte { return tc.reply })
			abandons, err := fake.SubscribeSync(space.Subject(subjects.OpAbandon, "q"))
			if err != nil {
				t.Fatal(err)
			}
			c := clientOnFake(t, srv, fake, 100*time.Millisecond)
			if _, err := c.Dequeue(ctx(t), "q", &workers.DequeueOpts{Wait: 10 * time.Millisecond}); !errors.Is(err, tc.err) {
				t.Fatalf("the long poll: %v, want %v", err, tc.err)
			}
			poll := recv(t, reqs)
			m, err := abandons.NextMsg(waitTimeout)
			if err != nil {
				t.Fatalf("nothing abandoned: %v", err)
			}
			if got := decode[subjects.AbandonRequest](t, m.Data); poll.RequestID == "" || got.RequestID != poll.RequestID {
				t.Fatalf("abandoned %q, want the poll's made-up id %q", got.RequestID, poll.RequestID)
			}
		})
	}
}

// TestWorkerStartsOnlyAsMade: a Worker not made with NewWorker, or one stopped, does not start,
// and says why.
func TestWorkerStartsOnlyAsMade(t *testing.T) {
	t.Parallel()
	var zero workers.Worker
	if err := zero.Start(ctx(t)); err == nil || !strings.Contains(err.Error(), "NewWorker") {
		t.Fatalf("a zero Worker's Start: %v, want it refused", err)
	}
	e := setup(t)
	w := e.startWorker(&workers.WorkerConfig{Queue: "q", PollWait: time.Minute}, workers.HandlerFunc(func(context.Context, *workers.Job) error { return nil }))
	stop(t, w)
	if err := w.Start(ctx(t)); err == nil || !strings.Contains(err.Error(), "stopped") {
		t.Fatalf("Start after Stop: %v, want it refused as stopped", err)
	}
}

// TestEnqueueDurationsAtTheirEdges: a negative Lease is refused, as every other lease of the client
// is, rather than dropped for the queue's (in the raw form and as JSON); a positive Invisible under a
// millisecond asks for one, rather than for none, which would override the queue's invisibility.
func TestEnqueueDurationsAtTheirEdges(t *testing.T) {
	t.Parallel()
	e := setup(t)
	c := ctx(t)
	e.createQueue("q", &workers.QueueOpts{Invisible: time.Hour})
	for _, id := range []string{"raw", " json "} { // an id a header would change goes as JSON
		if _, err := e.c.Enqueue(c, "q", []byte("p"), &workers.EnqueueOpts{ID: id, Lease: -5 * time.Second}); !errors.Is(err, workers.ErrOutOfRange) {
			t.Errorf("%q with a negative Lease: %v, want ErrOutOfRange", id, err)
		}
	}
	r := e.enqueue("q", "p", &workers.EnqueueOpts{ID: "soon", Invisible: 500 * time.Microsecond})
	if m := e.get("q", "soon"); m.VisibleAt.Sub(m.EnqueuedAt) != time.Millisecond {
		t.Fatalf("Invisible 500µs: %+v visible %v after its enqueue, want 1ms", r, m.VisibleAt.Sub(m.EnqueuedAt))
	}
	if d, err := e.c.Depth(c, "q", nil); err != nil || d.Pending+d.Invisible != 1 {
		t.Fatalf("depth %+v, %v; want only soon, nothing of the refused enqueues", d, err)
	}
}

// TestLongPollCutAtReconnect: a long poll parked at a broker that vanished with its NATS server (a
// natstone killed with its embedded server) gets no reply: the connection comes back to a server
// that never heard of it. It used to wait out its wait and the client's timeout (30 s for a
// worker's poll); cut at the reconnect, it fails at once as a dequeue of unknown outcome, to be
// sent again with its request id. Here the broker that never answers is a subscriber of the
// dequeue subject.
func TestLongPollCutAtReconnect(t *testing.T) {
	t.Parallel()
	srv := natstest.Start(t, nil)
	silent := srv.Connect(t)
	space, err := subjects.NewSpace("")
	if err != nil {
		t.Fatal(err)
	}
	parked := make(chan struct{}, 1)
	if _, err := silent.Subscribe(space.Subject(subjects.OpDequeue, "q"), func(*nats.Msg) { parked <- struct{}{} }); err != nil {
		t.Fatal(err)
	}
	if err := silent.Flush(); err != nil {
		t.Fatal(err)
	}
	nc := srv.Connect(t, nats.MaxReconnects(-1), nats.ReconnectWait(20*time.Millisecond))
	c, err := workers.NewClient(nc, nil)
	if err != nil {
		t.Fatal(err)
	}
	type result struct {
		err  error
		took time.Duration
	}
	done := make(chan result, 1)
	go func() {
		start := time.Now()
		_, err := c.Dequeue(context.Background(), "q", &workers.DequeueOpts{Wait: time.Minute, RequestID: "r1"})
		done <- result{err, time.Since(start)}
	}()
	recv(t, parked) // the poll is parked once the silent subscriber has it
	srv.Restart(t)
	select {
	case r := <-done:
		if !errors.Is(r.err, nats.ErrTimeout) || !errors.Is(r.err, workers.ErrPollCut) || !strings.Contains(r.err.Error(), "lost and made again") {
			t.Fatalf("the poll cut at the reconnect: %v, want a dequeue of unknown outcome (nats.ErrTimeout) that says why", r.err)
		}
	case <-time.After(waitTimeout):
		t.Fatalf("the poll still waits %v after its server restarted", waitTimeout)
	}
}

// TestLongPollCutWhenABrokerBeginsToServe: a long poll parked at a broker that died while its NATS
// server stays up (natstone serve --nats-url killed, or frozen past its claim) gets no reply, and no
// reconnect tells the client so. It used to wait out its wait and the client's timeout; cut when the
// next broker announces that it serves, it fails at once as a dequeue of unknown outcome, and sent
// again with its request id it leases from the broker serving now. Here the broker that dies is a
// subscriber of the dequeue subject that never answers.
func TestLongPollCutWhenABrokerBeginsToServe(t *testing.T) {
	t.Parallel()
	srv := natstest.Start(t, nil)
	gone := srv.Connect(t)
	space, err := subjects.NewSpace("")
	if err != nil {
		t.Fatal(err)
	}
	parked := make(chan struct{}, 1)
	if _, err := gone.Subscribe(space.Subject(subjects.OpDequeue, "q"), func(*nats.Msg) { parked <- struct{}{} }); err != nil {
		t.Fatal(err)
	}
	c := clientOnFake(t, srv, gone, 0)
	done := make(chan error, 1)
	go func() {
		_, err := c.Dequeue(context.Background(), "q", &workers.DequeueOpts{Wait: time.Minute, RequestID: "r1"})
		done <- err
	}()
	recv(t, parked)
	gone.Close() // the broker dies; its NATS server stays up
	startBroker(t, srv, nil)
	if err := recv(t, done); !errors.Is(err, nats.ErrTimeout) || !errors.Is(err, workers.ErrPollCut) {
		t.Fatalf("the poll cut by the announcement: %v, want a dequeue of unknown outcome (nats.ErrTimeout) that says why", err)
	}
	if _, err := c.Enqueue(ctx(t), "q", []byte("m"), &workers.EnqueueOpts{ID: "m1"}); err != nil {
		t.Fatal(err)
	}
	got, err := c.Dequeue(ctx(t), "q", &workers.DequeueOpts{Wait: time.Minute, RequestID: "r1"})
	if err != nil || len(got) != 1 || got[0].ID != "m1" {
		t.Fatalf("the poll sent again: %v, %+v; want m1 from the broker serving now", err, got)
	}
}

// TestLongPollsShareOneAnnouncementSubscription: the subscription to the brokers' announcements is
// the connection's, made once, however many Clients long-poll on it (a Client made per request must
// not leave one behind each).
func TestLongPollsShareOneAnnouncementSubscription(t *testing.T) {
	t.Parallel()
	e := setup(t)
	e.createQueue("q", nil)
	nc := e.srv.Connect(t)
	for i := range 5 {
		c, err := workers.NewClient(nc, nil)
		if err != nil {
			t.Fatal(err)
		}
		e.enqueue("q", "m", nil)
		if got, err := c.Dequeue(ctx(t), "q", &workers.DequeueOpts{Wait: time.Minute, RequestID: fmt.Sprint("r", i)}); err != nil || len(got) != 1 {
			t.Fatalf("poll %d: %v, %+v", i, err, got)
		}
	}
	if n := nc.NumSubscriptions(); n != 2 { // the replies' inbox, and the announcements
		t.Fatalf("%d subscriptions after 5 Clients' long polls, want 2", n)
	}
}

// TestLongPollCutByAnAnnouncementLosesNothing: an announcement that a broker serves can cut a poll
// parked at a broker that is not gone (a forged one, say). Sent again with its request id while the
// first is still parked, the poll and its first try become one, and it gets what they lease, once;
// a poll whose id the client made up is not cut (it would be abandoned, not sent again), nor is one
// of a Client that ignores the announcements, and both lease as they would have.
func TestLongPollCutByAnAnnouncementLosesNothing(t *testing.T) {
	t.Parallel()
	e := setup(t)
	e.createQueue("q", nil)
	polled := e.count(subjects.OpDequeue, "q")
	type result struct {
		msgs []workers.Message
		err  error
	}
	withID, madeUp, ignoring := make(chan result, 1), make(chan result, 1), make(chan result, 1)
	go func() {
		msgs, err := e.c.Dequeue(context.Background(), "q", &workers.DequeueOpts{Wait: time.Minute, RequestID: "r1"})
		withID <- result{msgs, err}
	}()
	go func() {
		msgs, err := e.c.Dequeue(context.Background(), "q", &workers.DequeueOpts{Wait: time.Minute, Filter: map[string]string{"k": "v"}})
		madeUp <- result{msgs, err}
	}()
	deaf := e.client(&workers.Config{IgnoreAnnouncements: true})
	go func() {
		msgs, err := deaf.Dequeue(context.Background(), "q", &workers.DequeueOpts{Wait: time.Minute, RequestID: "r2", Filter: map[string]string{"k": "w"}})
		ignoring <- result{msgs, err}
	}()
	polled.wait(t, 3)
	announce, err := json.Marshal(subjects.Serving{ID: "another", Started: time.Now()})
	if err != nil {
		t.Fatal(err)
	}
	nc := e.srv.Connect(t)
	if err := nc.Publish(e.space.Serving(), announce); err != nil {
		t.Fatal(err)
	}
	if r := recv(t, withID); !errors.Is(r.err, nats.ErrTimeout) || !errors.Is(r.err, workers.ErrPollCut) {
		t.Fatalf("the poll with a request id: %v, %+v; want it cut by the announcement", r.err, r.msgs)
	}
	again := make(chan result, 1)
	go func() {
		msgs, err := e.c.Dequeue(context.Background(), "q", &workers.DequeueOpts{Wait: time.Minute, RequestID: "r1"})
		again <- result{msgs, err}
	}()
	polled.wait(t, 4)
	e.enqueue("q", "plain", &workers.EnqueueOpts{ID: "m1"})
	if r := recv(t, again); r.err != nil || len(r.msgs) != 1 || r.msgs[0].ID != "m1" {
		t.Fatalf("the poll sent again: %v, %+v; want m1, which its first try leased", r.err, r.msgs)
	}
	e.enqueue("q", "filtered", &workers.EnqueueOpts{ID: "m2", Metadata: map[string]string{"k": "v"}})
	if r := recv(t, madeUp); r.err != nil || len(r.msgs) != 1 || r.msgs[0].ID != "m2" {
		t.Fatalf("the poll with a made-up id: %v, %+v; want m2, enqueued after the announcement", r.err, r.msgs)
	}
	e.enqueue("q", "deaf", &workers.EnqueueOpts{ID: "m3", Metadata: map[string]string{"k": "w"}})
	if r := recv(t, ignoring); r.err != nil || len(r.msgs) != 1 || r.msgs[0].ID != "m3" {
		t.Fatalf("the poll of a client that ignores the announcements: %v, %+v; want m3, enqueued after the announcement", r.err, r.msgs)
	}
	if m := e.get("q", "m1"); m.State != subjects.StateRunning || m.Attempts != 1 {
		t.Fatalf("m1 %s after %d attempts, want running once: leased to the poll, not twice", m.State, m.Attempts)
	}
}

// TestLongPollWithoutRequestIDWaitsOutAReconnect: a long poll whose request id the client made up
// is not cut at a reconnect (it would be abandoned, not sent again): with the broker still there,
// the message enqueued after the reconnect reaches it.
func TestLongPollWithoutRequestIDWaitsOutAReconnect(t *testing.T) {
	t.Parallel()
	e := setup(t)
	e.createQueue("q", nil)
	nc := e.srv.Connect(t, nats.MaxReconnects(-1), nats.ReconnectWait(20*time.Millisecond))
	c, err := workers.NewClient(nc, nil)
	if err != nil {
		t.Fatal(err)
	}
	polled := e.count(subjects.OpDequeue, "q")
	done := make(chan error, 1)
	var got []workers.Message
	go func() {
		var err error
		got, err = c.Dequeue(context.Background(), "q", &workers.DequeueOpts{Wait: waitTimeout})
		done <- err
	}()
	polled.wait(t, 1)
	cid, err := nc.GetClientID()
	if err != nil {
		t.Fatal(err)
	}
	if err := e.srv.NATS().DisconnectClientByID(cid); err != nil { // as a network blip would
		t.Fatal(err)
	}
	waitFor(t, "the client to reconnect", func() bool { return nc.Stats().Reconnects > 0 && nc.IsConnected() })
	e.enqueue("q", "after", nil)
	if err := recv(t, done); err != nil || len(got) != 1 || string(got[0].Payload) != "after" {
		t.Fatalf("the poll across the reconnect: %v, %+v; want the message enqueued after it", err, got)
	}
}
