package metrics

import (
	"net/http"
	"time"

	"github.com/prometheus/client_golang/prometheus"
	"github.com/prometheus/client_golang/prometheus/collectors"
	"github.com/prometheus/client_golang/prometheus/promhttp"

	"github.com/natstone/natstone/broker"
	"github.com/natstone/natstone/subjects"
)

// codeOK is the code label of a request that succeeded.
const codeOK = "ok"

// durationBuckets (seconds) span 100µs to 10s: an in-memory reply is a fraction of a millisecond, a
// stored write one to a few, a slow disk or a replicated cluster tens to hundreds. Long polls of
// dequeue fall in the last buckets or above them.
var durationBuckets = []float64{
	0.0001, 0.00025, 0.0005, 0.001, 0.0025, 0.005, 0.01, 0.025, 0.05, 0.1, 0.25, 0.5, 1, 2.5, 5, 10,
}

// Metrics holds natstone's Prometheus metrics in a registry of its own. It is a broker.Observer,
// safe for concurrent use: its observer methods take only a read lock on a cache of resolved label
// children, and allocate only the first time they see an op, error code or queue. Create it with
// New.
type Metrics struct {
	reg     *prometheus.Registry
	handler http.Handler

	// natstone_requests_total{op,code} and natstone_request_duration_seconds{op}.
	requests  *prometheus.CounterVec
	durations *prometheus.HistogramVec
	ops       children[subjects.Op, *opChildren]

	// natstone_kv_write_duration_seconds and natstone_kv_write_errors_total.
	writeDurations prometheus.Histogram
	writeErrors    prometheus.Counter
	payloadErrors  prometheus.Counter

	// natstone_transitions_total{queue,kind}, natstone_lease_expiries_total{queue} and
	// natstone_queue_wait_seconds{queue}.
	transitions   *prometheus.CounterVec
	leaseExpiries *prometheus.CounterVec
	waits         *prometheus.HistogramVec
	queues        children[string, *queueChildren]

	snapshot *snapshotCollector
}

// opChildren are one op's resolved children: the success counter and the duration histogram, and
// the error counters by code as they are first seen.
type opChildren struct {
	ok       prometheus.Counter
	duration prometheus.Observer
	errors   children[subjects.Code, prometheus.Counter]
}

// queueChildren are one queue's resolved children, for every event kind.
type queueChildren struct {
	kinds    map[subjects.EventKind]prometheus.Counter // every subjects.EventKinds; read-only
	expiries prometheus.Counter
	wait     prometheus.Observer
}

// Interface checks: Metrics is what broker.Config.Observer takes, is told of deleted queues, of
// how long leased messages waited, and of payloads storage did not take.
var (
	_ broker.QueueObserver   = (*Metrics)(nil)
	_ broker.WaitObserver    = (*Metrics)(nil)
	_ broker.PayloadObserver = (*Metrics)(nil)
)

// waitBuckets (seconds) span 1 ms to about 70 minutes (4,194 s), by fours: a busy queue's messages wait
// milliseconds, a backlog's minutes or hours.
var waitBuckets = prometheus.ExponentialBuckets(0.001, 4, 12)

// New returns Metrics registered in a new registry along with the Go and process collectors. The
// gauges read from the broker's state appear once Watch is called.
func New() *Metrics {
	m := &Metrics{
		reg: prometheus.NewRegistry(),
		requests: prometheus.NewCounterVec(prometheus.CounterOpts{
			Name: "natstone_requests_total",
			Help: "Requests taken, by operation and code (ok, or the error reply's code; bad_request too for one refused unanswered for its reply subject).",
		}, []string{"op", "code"}),
		durations: prometheus.NewHistogramVec(prometheus.HistogramOpts{
			Name: "natstone_request_duration_seconds",
			Help: "Time from a request's arrival to its reply, by operation. " +
				"Dequeue includes long-poll waits (up to its wait_ms).",
			Buckets: durationBuckets,
		}, []string{"op"}),
		writeDurations: prometheus.NewHistogram(prometheus.HistogramOpts{
			Name:    "natstone_kv_write_duration_seconds",
			Help:    "Message record writes to JetStream KV, from publish to acknowledgement or failure.",
			Buckets: durationBuckets,
		}),
		writeErrors: prometheus.NewCounter(prometheus.CounterOpts{
			Name: "natstone_kv_write_errors_total",
			Help: "Message record writes to JetStream KV that failed.",
		}),
		payloadErrors: prometheus.NewCounter(prometheus.CounterOpts{
			Name: "natstone_payload_write_errors_total",
			Help: "Enqueues whose payloads storage did not take (the payloads stream full, say), answered unavailable.",
		}),
		transitions: prometheus.NewCounterVec(prometheus.CounterOpts{
			Name: "natstone_transitions_total",
			Help: "Stored transitions of messages, by queue and event kind.",
		}, []string{"queue", "kind"}),
		leaseExpiries: prometheus.NewCounterVec(prometheus.CounterOpts{
			Name: "natstone_lease_expiries_total",
			Help: "Leases that ran out, by queue: kind expired, or kind errored with reason lease_expired.",
		}, []string{"queue"}),
		waits: prometheus.NewHistogramVec(prometheus.HistogramOpts{
			Name:    "natstone_queue_wait_seconds",
			Help:    "How long each message leased had waited pending, from when it became pending (its visible_at) to its lease, by queue.",
			Buckets: waitBuckets,
		}, []string{"queue"}),
		snapshot: &snapshotCollector{},
	}
	m.ops.create = m.newOpChildren
	m.queues.create = m.newQueueChildren
	for _, op := range subjects.Ops {
		m.ops.get(op)
	}
	// Cannot fail: a fresh registry, and collectors whose names are fixed and distinct.
	m.reg.MustRegister(
		collectors.NewGoCollector(),
		collectors.NewProcessCollector(collectors.ProcessCollectorOpts{}),
		m.requests, m.durations, m.writeDurations, m.writeErrors, m.payloadErrors, m.transitions, m.leaseExpiries, m.waits,
		m.snapshot,
	)
	m.handler = promhttp.HandlerFor(m.reg, promhttp.HandlerOpts{Registry: m.reg})
	return m
}

// newOpChildren resolves op's success counter and histogram.
func (m *Metrics) newOpChildren(op subjects.Op) *opChildren {
	o := &opChildren{
		ok:       m.requests.WithLabelValues(string(op), codeOK),
		duration: m.durations.WithLabelValues(string(op)),
	}
	o.errors.create = func(code subjects.Code) prometheus.Counter {
		return m.requests.WithLabelValues(string(op), string(code))
	}
	return o
}

// newQueueChildren resolves queue's transition counters of every kind and its expiry counter, so
// they all exist from the queue's first transition on.
func (m *Metrics) newQueueChildren(queue string) *queueChildren {
	q := &queueChildren{
		kinds:    make(map[subjects.EventKind]prometheus.Counter, len(subjects.EventKinds)),
		expiries: m.leaseExpiries.WithLabelValues(queue),
		wait:     m.waits.WithLabelValues(queue),
	}
	for _, kind := range subjects.EventKinds {
		q.kinds[kind] = m.transitions.WithLabelValues(queue, string(kind))
	}
	return q
}

// Registry returns the registry the metrics are in, for registering more collectors.
func (m *Metrics) Registry() *prometheus.Registry { return m.reg }

// Handler returns the HTTP handler that serves the registry in the Prometheus exposition format.
func (m *Metrics) Handler() http.Handler { return m.handler }

// Request counts one request of op answered after d, with code "" for a success.
func (m *Metrics) Request(op subjects.Op, code subjects.Code, d time.Duration) {
	o := m.ops.get(op)
	o.duration.Observe(d.Seconds())
	if code == "" {
		o.ok.Inc()
		return
	}
	o.errors.get(code).Inc()
}

// Write counts one message record write that took d and failed if err is not nil.
func (m *Metrics) Write(d time.Duration, err error) {
	m.writeDurations.Observe(d.Seconds())
	if err != nil {
		m.writeErrors.Inc()
	}
}

// PayloadWriteFailed counts one enqueue whose payloads storage did not take.
func (m *Metrics) PayloadWriteFailed(error) { m.payloadErrors.Inc() }

// Transition counts one stored transition of a message of queue, and a lease expiry if kind is
// expired or an errored with reason lease_expired.
func (m *Metrics) Transition(queue string, kind subjects.EventKind, reason string) {
	q := m.queues.get(queue)
	if c, ok := q.kinds[kind]; ok {
		c.Inc()
	} else {
		// A kind newer than this package: slower, but counted.
		m.transitions.WithLabelValues(queue, string(kind)).Inc()
	}
	if kind == subjects.EventExpired || kind == subjects.EventErrored && reason == subjects.ReasonLeaseExpired {
		q.expiries.Inc()
	}
}

// Waited observes how long a message of queue leased had waited pending.
func (m *Metrics) Waited(queue string, d time.Duration) {
	m.queues.get(queue).wait.Observe(d.Seconds())
}

// QueueDeleted removes the deleted queue's transition, lease expiry and wait series, so that queues
// created and deleted (or auto-created by enqueues to made-up names) do not grow the metrics
// without bound. A queue created again under the name counts from zero.
func (m *Metrics) QueueDeleted(queue string) {
	m.queues.remove(queue, func() {
		m.transitions.DeletePartialMatch(prometheus.Labels{"queue": queue})
		m.leaseExpiries.DeleteLabelValues(queue)
		m.waits.DeleteLabelValues(queue)
	})
}
