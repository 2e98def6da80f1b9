package metrics_test

import (
	"errors"
	"fmt"
	"slices"
	"strings"
	"sync"
	"testing"
	"time"

	dto "github.com/prometheus/client_model/go"

	"github.com/natstone/natstone/metrics"
	"github.com/natstone/natstone/subjects"
)

func TestRequests(t *testing.T) {
	t.Parallel()
	m := metrics.New()
	m.Request(subjects.OpEnqueue, "", 2*time.Millisecond)
	m.Request(subjects.OpEnqueue, "", 2*time.Millisecond)
	m.Request(subjects.OpEnqueue, subjects.CodeQueueBlocked, time.Millisecond)
	m.Request(subjects.OpDequeue, "", 30*time.Second) // a long poll that ran out
	m.Request(subjects.OpComplete, subjects.CodeLeaseExpired, 500*time.Microsecond)
	m.Request(subjects.Op("future"), "", time.Millisecond) // an op newer than the package

	f := scrape(t, m.Handler())
	for _, c := range []struct {
		op, code string
		want     float64
	}{
		{"enqueue", "ok", 2},
		{"enqueue", "queue_blocked", 1},
		{"dequeue", "ok", 1},
		{"complete", "lease_expired", 1},
		{"complete", "ok", 0},
		{"future", "ok", 1},
		{"history", "ok", 0},
	} {
		if got := f.counter(t, "natstone_requests_total", "op="+c.op, "code="+c.code); got != c.want {
			t.Errorf("natstone_requests_total{op=%s,code=%s} = %v, want %v", c.op, c.code, got, c.want)
		}
	}
	// Every known op's success counter exists from the start; error codes appear when counted.
	want := []string{"code=lease_expired,op=complete", "code=ok,op=future", "code=queue_blocked,op=enqueue"}
	for _, op := range subjects.Ops {
		want = append(want, labelSet([]string{"op=" + string(op), "code=ok"}))
	}
	slices.Sort(want)
	if got := f.labelSets(t, "natstone_requests_total", dto.MetricType_COUNTER); !slices.Equal(got, want) {
		t.Errorf("natstone_requests_total label sets:\n got %v\nwant %v", got, want)
	}

	enq := f.histogram(t, "natstone_request_duration_seconds", "op=enqueue")
	if enq.GetSampleCount() != 3 || !near(enq.GetSampleSum(), 0.005) {
		t.Errorf("enqueue durations: count %d sum %v, want 3 and 0.005", enq.GetSampleCount(), enq.GetSampleSum())
	}
	if got := bucket(t, enq, 0.001); got != 1 {
		t.Errorf("enqueue durations ≤ 1ms: %d, want 1", got)
	}
	if got := bucket(t, enq, 0.0025); got != 3 {
		t.Errorf("enqueue durations ≤ 2.5ms: %d, want 3", got)
	}
	deq := f.histogram(t, "natstone_request_duration_seconds", "op=dequeue")
	if deq.GetSampleCount() != 1 || bucket(t, deq, 10) != 0 || !near(deq.GetSampleSum(), 30) {
		t.Errorf("dequeue durations: count %d, ≤ 10s %d, sum %v; want 1, 0, 30",
			deq.GetSampleCount(), bucket(t, deq, 10), deq.GetSampleSum())
	}
	if got := f.histogram(t, "natstone_request_duration_seconds", "op=create").GetSampleCount(); got != 0 {
		t.Errorf("create durations: count %d, want 0", got)
	}
	if bs := deq.GetBucket(); len(bs) != 17 || bs[0].GetUpperBound() != 0.0001 || bs[15].GetUpperBound() != 10 {
		t.Errorf("duration buckets %v, want 16 from 100µs to 10s, then +Inf", bs)
	}
}

func TestWrites(t *testing.T) {
	t.Parallel()
	m := metrics.New()
	f := scrape(t, m.Handler())
	if got := f.histogram(t, "natstone_kv_write_duration_seconds").GetSampleCount(); got != 0 {
		t.Errorf("write count before any write: %d, want 0", got)
	}
	if got := f.counter(t, "natstone_kv_write_errors_total"); got != 0 {
		t.Errorf("write errors before any write: %v, want 0", got)
	}
	if got := f.counter(t, "natstone_payload_write_errors_total"); got != 0 {
		t.Errorf("payload write errors before any write: %v, want 0", got)
	}

	m.Write(3*time.Millisecond, nil)
	m.Write(4*time.Millisecond, nil)
	m.Write(time.Second, errors.New("timeout"))
	m.PayloadWriteFailed(errors.New("maximum bytes exceeded"))
	m.PayloadWriteFailed(errors.New("maximum bytes exceeded"))

	f = scrape(t, m.Handler())
	h := f.histogram(t, "natstone_kv_write_duration_seconds")
	if h.GetSampleCount() != 3 || !near(h.GetSampleSum(), 1.007) || bucket(t, h, 0.005) != 2 {
		t.Errorf("writes: count %d sum %v ≤ 5ms %d; want 3, 1.007, 2", h.GetSampleCount(), h.GetSampleSum(), bucket(t, h, 0.005))
	}
	if got := f.counter(t, "natstone_kv_write_errors_total"); got != 1 {
		t.Errorf("write errors: %v, want 1", got)
	}
	if got := f.counter(t, "natstone_payload_write_errors_total"); got != 2 {
		t.Errorf("payload write errors: %v, want 2", got)
	}
}

func TestTransitions(t *testing.T) {
	t.Parallel()
	m := metrics.New()
	m.Transition("mail", subjects.EventEnqueued, "")
	m.Transition("mail", subjects.EventLeased, "")
	m.Transition("mail", subjects.EventExpired, "")
	m.Transition("mail", subjects.EventLeased, "")
	m.Transition("mail", subjects.EventErrored, subjects.ReasonLeaseExpired)
	m.Transition("mail", subjects.EventErrored, subjects.ReasonReleased)
	m.Transition("encode", subjects.EventCompleted, "")

	f := scrape(t, m.Handler())
	want := map[string]map[subjects.EventKind]float64{
		"mail":   {subjects.EventEnqueued: 1, subjects.EventLeased: 2, subjects.EventExpired: 1, subjects.EventErrored: 2},
		"encode": {subjects.EventCompleted: 1},
	}
	var sets []string
	for queue, kinds := range want {
		for _, kind := range subjects.EventKinds {
			got := f.counter(t, "natstone_transitions_total", "queue="+queue, "kind="+string(kind))
			if got != kinds[kind] {
				t.Errorf("natstone_transitions_total{queue=%s,kind=%s} = %v, want %v", queue, kind, got, kinds[kind])
			}
			sets = append(sets, labelSet([]string{"queue=" + queue, "kind=" + string(kind)}))
		}
	}
	slices.Sort(sets)
	if got := f.labelSets(t, "natstone_transitions_total", dto.MetricType_COUNTER); !slices.Equal(got, sets) {
		t.Errorf("natstone_transitions_total label sets:\n got %v\nwant %v", got, sets)
	}

	// The expiry and the errored one whose last lease ran out; not the errored one released.
	if got := f.counter(t, "natstone_lease_expiries_total", "queue=mail"); got != 2 {
		t.Errorf("natstone_lease_expiries_total{queue=mail} = %v, want 2", got)
	}
	if got := f.counter(t, "natstone_lease_expiries_total", "queue=encode"); got != 0 {
		t.Errorf("natstone_lease_expiries_total{queue=encode} = %v, want 0", got)
	}
}

// TestConcurrentObservers counts from many goroutines at once, for the race detector and to check
// that no increment is lost while label children are first made.
func TestConcurrentObservers(t *testing.T) {
	t.Parallel()
	const goroutines, calls = 16, 200
	m := metrics.New()
	var wg sync.WaitGroup
	for range goroutines {
		wg.Go(func() {
			for i := range calls {
				queue := fmt.Sprintf("q%d", i%4)
				m.Request(subjects.OpDequeue, subjects.CodeLeaseMismatch, time.Millisecond)
				m.Request(subjects.OpEnqueue, "", time.Millisecond)
				m.Transition(queue, subjects.EventExpired, "")
				m.Write(time.Millisecond, nil)
			}
		})
	}
	wg.Wait()

	f := scrape(t, m.Handler())
	const total = goroutines * calls
	if got := f.counter(t, "natstone_requests_total", "op=dequeue", "code=lease_mismatch"); got != total {
		t.Errorf("dequeue lease_mismatch = %v, want %d", got, total)
	}
	if got := f.counter(t, "natstone_requests_total", "op=enqueue", "code=ok"); got != total {
		t.Errorf("enqueue ok = %v, want %d", got, total)
	}
	for q := range 4 {
		queue := fmt.Sprintf("queue=q%d", q)
		if got := f.counter(t, "natstone_transitions_total", queue, "kind=expired"); got != total/4 {
			t.Errorf("transitions{%s,kind=expired} = %v, want %d", queue, got, total/4)
		}
		if got := f.counter(t, "natstone_lease_expiries_total", queue); got != total/4 {
			t.Errorf("lease_expiries{%s} = %v, want %d", queue, got, total/4)
		}
	}
	if got := f.histogram(t, "natstone_kv_write_duration_seconds").GetSampleCount(); got != total {
		t.Errorf("writes = %d, want %d", got, total)
	}
}

func TestRuntimeCollectors(t *testing.T) {
	t.Parallel()
	m := metrics.New()
	f := scrape(t, m.Handler())
	if got := f.gauge(t, "go_goroutines"); got < 1 {
		t.Errorf("go_goroutines = %v, want ≥ 1", got)
	}
	if got := f.gauge(t, "process_open_fds"); got < 1 {
		t.Errorf("process_open_fds = %v, want ≥ 1", got)
	}
	// Without Watch, nothing is read from a broker.
	for _, name := range []string{"natstone_queue_messages", "natstone_events_enabled"} {
		if _, ok := f[name]; ok {
			t.Errorf("%s exposed before Watch", name)
		}
	}
}

func BenchmarkRequest(b *testing.B) {
	m := metrics.New()
	b.ReportAllocs()
	for b.Loop() {
		m.Request(subjects.OpDequeue, "", time.Millisecond)
	}
}

func BenchmarkRequestError(b *testing.B) {
	m := metrics.New()
	b.ReportAllocs()
	for b.Loop() {
		m.Request(subjects.OpComplete, subjects.CodeLeaseExpired, time.Millisecond)
	}
}

func BenchmarkTransition(b *testing.B) {
	m := metrics.New()
	b.ReportAllocs()
	for b.Loop() {
		m.Transition("encode", subjects.EventErrored, subjects.ReasonLeaseExpired)
	}
}

func BenchmarkWrite(b *testing.B) {
	m := metrics.New()
	b.ReportAllocs()
	for b.Loop() {
		m.Write(time.Millisecond, nil)
	}
}

// TestQueueDeleted: a deleted queue's transition and expiry series go with it, and come back from
// zero if the queue is made again; other queues' stay.
func TestQueueDeleted(t *testing.T) {
	t.Parallel()
	m := metrics.New()
	m.Transition("gone", subjects.EventEnqueued, "")
	m.Transition("gone", subjects.EventExpired, "")
	m.Transition("stays", subjects.EventEnqueued, "")
	m.QueueDeleted("gone")

	f := scrape(t, m.Handler())
	for _, name := range []string{"natstone_transitions_total", "natstone_lease_expiries_total"} {
		for _, set := range f.labelSets(t, name, dto.MetricType_COUNTER) {
			if strings.Contains(set, "queue=gone") {
				t.Errorf("%s{%s} outlived its queue", name, set)
			}
		}
	}
	if got := f.counter(t, "natstone_transitions_total", "queue=stays", "kind=enqueued"); got != 1 {
		t.Errorf("natstone_transitions_total{queue=stays,kind=enqueued} = %v, want 1", got)
	}

	m.Transition("gone", subjects.EventEnqueued, "") // made again
	f = scrape(t, m.Handler())
	if got := f.counter(t, "natstone_transitions_total", "queue=gone", "kind=enqueued"); got != 1 {
		t.Errorf("natstone_transitions_total{queue=gone,kind=enqueued} = %v after the queue came back, want 1", got)
	}
	if got := f.counter(t, "natstone_lease_expiries_total", "queue=gone"); got != 0 {
		t.Errorf("natstone_lease_expiries_total{queue=gone} = %v after the queue came back, want 0", got)
	}
}
