package metrics_test

import (
	"context"
	"strings"
	"testing"
	"time"

	dto "github.com/prometheus/client_model/go"

	"github.com/natstone/natstone/broker"
	"github.com/natstone/natstone/broker/clock"
	"github.com/natstone/natstone/metrics"
	"github.com/natstone/natstone/subjects"
	"github.com/natstone/natstone/test/natstest"
	"github.com/natstone/natstone/workers"
)

// signal is an observer that passes every call on to Metrics and then says so on calls, so that a
// test can wait for the broker's observations instead of sleeping. It never blocks the broker: calls
// is buffered beyond what a test needs, and a call that finds it full is not signalled.
type signal struct {
	*metrics.Metrics
	calls chan string // "request <op>", "write" or "transition <kind>"
}

func (s signal) Request(op subjects.Op, code subjects.Code, d time.Duration) {
	s.Metrics.Request(op, code, d)
	s.send("request " + string(op))
}

func (s signal) Write(d time.Duration, err error) {
	s.Metrics.Write(d, err)
	s.send("write")
}

func (s signal) Transition(queue string, kind subjects.EventKind, reason string) {
	s.Metrics.Transition(queue, kind, reason)
	s.send("transition " + string(kind))
}

func (s signal) send(call string) {
	select {
	case s.calls <- call:
	default:
	}
}

// await receives calls until it has seen every one of want (as many times as listed).
func (s signal) await(ctx context.Context, t *testing.T, want ...string) {
	t.Helper()
	missing := map[string]int{}
	for _, w := range want {
		missing[w]++
	}
	for len(missing) > 0 {
		select {
		case c := <-s.calls:
			if missing[c]--; missing[c] <= 0 {
				delete(missing, c)
			}
		case <-ctx.Done():
			t.Fatalf("observer not called for %v within %v", missing, deadline)
		}
	}
}

// TestBroker runs a message through a real broker and reads what it observed from a scrape.
func TestBroker(t *testing.T) {
	t.Parallel()
	ctx := testContext(t)
	srv := natstest.Start(t, nil)
	m := metrics.New()
	obs := signal{Metrics: m, calls: make(chan string, 1024)}
	b := startBroker(t, srv, &broker.Config{Observer: obs})
	m.Watch(b.Snapshot)
	client, err := workers.NewClient(srv.Connect(t), nil)
	if err != nil {
		t.Fatalf("workers.NewClient: %v", err)
	}

	if _, err := client.CreateQueue(ctx, "jobs", nil); err != nil {
		t.Fatalf("create: %v", err)
	}
	if _, err := client.Enqueue(ctx, "jobs", []byte("hello"), &workers.EnqueueOpts{ID: "job-1"}); err != nil {
		t.Fatalf("enqueue: %v", err)
	}
	msgs, err := client.Dequeue(ctx, "jobs", nil)
	if err != nil || len(msgs) != 1 {
		t.Fatalf("dequeue: %d messages, %v; want 1", len(msgs), err)
	}
	if _, err := client.Complete(ctx, "jobs", msgs[0].ID, msgs[0].LeaseID); err != nil {
		t.Fatalf("complete: %v", err)
	}
	obs.await(ctx, t,
		"request create", "request enqueue_raw", "request dequeue", "request complete",
		"write", "write", "write",
		"transition enqueued", "transition leased", "transition completed")

	f := scrape(t, m.Handler())
	// workers.Client.Enqueue sends the payload as the body: op enqueue_raw.
	for _, op := range []string{"create", "enqueue_raw", "dequeue", "complete"} {
		if got := f.counter(t, "natstone_requests_total", "op="+op, "code=ok"); got != 1 {
			t.Errorf("natstone_requests_total{op=%s,code=ok} = %v, want 1", op, got)
		}
		if got := f.histogram(t, "natstone_request_duration_seconds", "op="+op).GetSampleCount(); got != 1 {
			t.Errorf("natstone_request_duration_seconds{op=%s} count = %d, want 1", op, got)
		}
	}
	if got := len(f.labelSets(t, "natstone_requests_total", dto.MetricType_COUNTER)); got != len(subjects.Ops) {
		t.Errorf("natstone_requests_total has %d series, want %d (no errors)", got, len(subjects.Ops))
	}
	for _, st := range subjects.States {
		want := 0.0
		if st == subjects.StateCompleted {
			want = 1
		}
		if got := f.gauge(t, "natstone_queue_messages", "queue=jobs", "state="+string(st)); got != want {
			t.Errorf("natstone_queue_messages{queue=jobs,state=%s} = %v, want %v", st, got, want)
		}
	}
	for _, kind := range []subjects.EventKind{subjects.EventEnqueued, subjects.EventLeased, subjects.EventCompleted} {
		if got := f.counter(t, "natstone_transitions_total", "queue=jobs", "kind="+string(kind)); got != 1 {
			t.Errorf("natstone_transitions_total{queue=jobs,kind=%s} = %v, want 1", kind, got)
		}
	}
	if got := f.histogram(t, "natstone_kv_write_duration_seconds").GetSampleCount(); got != 3 {
		t.Errorf("natstone_kv_write_duration_seconds count = %d, want 3", got)
	}
	if got := f.counter(t, "natstone_kv_write_errors_total"); got != 0 {
		t.Errorf("natstone_kv_write_errors_total = %v, want 0", got)
	}
	if got := f.gauge(t, "natstone_events_enabled"); got != 1 {
		t.Errorf("natstone_events_enabled = %v, want 1", got)
	}
	if got := f.gauge(t, "natstone_broker_serving"); got != 1 {
		t.Errorf("natstone_broker_serving = %v, want 1", got)
	}
	if got := f.gauge(t, "natstone_queue_blocked", "queue=jobs", "direction=enqueue"); got != 0 {
		t.Errorf("natstone_queue_blocked{queue=jobs,direction=enqueue} = %v, want 0", got)
	}

	// A deleted queue takes its series with it: queues made and deleted (or auto-created by
	// enqueues to made-up names) do not grow the scrape without bound.
	if _, err := client.Enqueue(ctx, "other", []byte("x"), nil); err != nil {
		t.Fatalf("enqueue: %v", err)
	}
	if _, err := client.DeleteQueue(ctx, "jobs"); err != nil {
		t.Fatalf("delete: %v", err)
	}
	f = scrape(t, m.Handler())
	for name, typ := range map[string]dto.MetricType{
		"natstone_transitions_total":    dto.MetricType_COUNTER,
		"natstone_lease_expiries_total": dto.MetricType_COUNTER,
		"natstone_queue_wait_seconds":   dto.MetricType_HISTOGRAM,
	} {
		for _, set := range f.labelSets(t, name, typ) {
			if strings.Contains(set, "queue=jobs") {
				t.Errorf("%s{%s} outlived its queue", name, set)
			}
		}
	}
}

// TestQueueWait: each lease observes how long its message waited pending, from when it became
// pending: at its enqueue, or when its invisibility ended.
func TestQueueWait(t *testing.T) {
	t.Parallel()
	ctx := testContext(t)
	srv := natstest.Start(t, nil)
	m := metrics.New()
	obs := signal{Metrics: m, calls: make(chan string, 1024)}
	clk := clock.NewFake(time.Date(2026, 11, 26, 12, 0, 0, 0, time.UTC))
	startBroker(t, srv, &broker.Config{Observer: obs, Clock: clk})
	client, err := workers.NewClient(srv.Connect(t), nil)
	if err != nil {
		t.Fatalf("workers.NewClient: %v", err)
	}
	if _, err := client.Enqueue(ctx, "jobs", []byte("a"), &workers.EnqueueOpts{ID: "now"}); err != nil {
		t.Fatal(err)
	}
	if _, err := client.Enqueue(ctx, "jobs", []byte("b"), &workers.EnqueueOpts{ID: "later", Invisible: 10 * time.Second}); err != nil {
		t.Fatal(err)
	}
	clk.Advance(3 * time.Second)
	msgs, err := client.Dequeue(ctx, "jobs", nil)
	if err != nil || len(msgs) != 1 || msgs[0].ID != "now" {
		t.Fatalf("dequeue: %+v, %v; want now", msgs, err)
	}
	if _, err := client.Complete(ctx, "jobs", msgs[0].ID, msgs[0].LeaseID); err != nil {
		t.Fatal(err)
	}
	clk.Advance(67 * time.Second) // later became pending at 10 s: it waits 60 s
	if msgs, err := client.Dequeue(ctx, "jobs", nil); err != nil || len(msgs) != 1 || msgs[0].ID != "later" {
		t.Fatalf("dequeue: %+v, %v; want later", msgs, err)
	}
	obs.await(ctx, t, "transition leased", "transition leased")
	h := scrape(t, m.Handler()).histogram(t, "natstone_queue_wait_seconds", "queue=jobs")
	if h.GetSampleCount() != 2 || h.GetSampleSum() != 63 {
		t.Fatalf("natstone_queue_wait_seconds{queue=jobs}: %d samples summing to %v s, want 2 summing to 63 (3 + 60)", h.GetSampleCount(), h.GetSampleSum())
	}
	for _, b := range h.GetBucket() {
		if want := map[bool]uint64{true: 0, false: 1}[b.GetUpperBound() < 3]; b.GetUpperBound() < 60 && b.GetCumulativeCount() != want {
			t.Errorf("bucket ≤ %v s: %d, want %d", b.GetUpperBound(), b.GetCumulativeCount(), want)
		}
	}
}
