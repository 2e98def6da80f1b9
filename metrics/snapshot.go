package metrics

import (
	"sync/atomic"
	"time"

	"github.com/prometheus/client_golang/prometheus"

	"github.com/natstone/natstone/broker"
	"github.com/natstone/natstone/subjects"
)

// The metrics read from a broker.Snapshot at each scrape.
var (
	queueMessagesDesc = prometheus.NewDesc("natstone_queue_messages",
		"Messages of a queue in each state.", []string{"queue", "state"}, nil)
	queueOldestPendingDesc = prometheus.NewDesc("natstone_queue_oldest_pending_seconds",
		"How long the longest-waiting pending message of a queue has waited (0 if none is pending).",
		[]string{"queue"}, nil)
	queueValuesDesc = prometheus.NewDesc("natstone_queue_exclusivity_values",
		"Exclusivity values the messages of an exclusive queue carry, in any state until collected: the values whose lock slots it keeps once taken.",
		[]string{"queue"}, nil)
	queueBlockedDesc = prometheus.NewDesc("natstone_queue_blocked",
		"1 if a queue refuses enqueues (direction enqueue) or dequeues (direction dequeue), else 0.",
		[]string{"queue", "direction"}, nil)
	eventsPublishedDesc = prometheus.NewDesc("natstone_events_published_total",
		"Events stored in the events stream since the broker started.", nil, nil)
	eventsDroppedDesc = prometheus.NewDesc("natstone_events_dropped_total",
		"Events given up on since the broker started (buffer full, or the stream refused them).", nil, nil)
	eventsBufferedDesc = prometheus.NewDesc("natstone_events_buffered",
		"Events waiting to be published.", nil, nil)
	eventsEnabledDesc = prometheus.NewDesc("natstone_events_enabled",
		"1 if the broker publishes events, else 0.", nil, nil)
	scheduleNextDesc = prometheus.NewDesc("natstone_schedule_next_fire_timestamp_seconds",
		"When a schedule fires next, in Unix seconds (0 if it never will).", []string{"queue", "schedule"}, nil)
	scheduleLastDesc = prometheus.NewDesc("natstone_schedule_last_fire_timestamp_seconds",
		"When a schedule last fired, in Unix seconds (0 if it never has).", []string{"queue", "schedule"}, nil)
	scheduleFailingDesc = prometheus.NewDesc("natstone_schedule_failing",
		"1 if a schedule's last fire enqueued nothing (the queue refused it: its last_error), or it cannot fire (invalid), else 0.", []string{"queue", "schedule"}, nil)
	scheduleSkippedDesc = prometheus.NewDesc("natstone_schedule_skipped_total",
		"Fire times of a schedule that passed with no message enqueued for them (no broker served, or storage did not take the fire).",
		[]string{"queue", "schedule"}, nil)
	schedulePausedDesc = prometheus.NewDesc("natstone_schedule_paused",
		"1 while a schedule is paused (it fires at none of its times), else 0.", []string{"queue", "schedule"}, nil)
	scheduleOverlapDesc = prometheus.NewDesc("natstone_schedule_overlap_skipped_total",
		"Fire times of a schedule with overlap skip that enqueued nothing because its last fire's message was not finished.",
		[]string{"queue", "schedule"}, nil)
	servingDesc = prometheus.NewDesc("natstone_broker_serving",
		"1 while the broker answers requests (it holds the store's claim), 0 while it stands by, recovers or has stopped.", nil, nil)
)

// snapshotCollector turns the snapshot of the watched broker into metrics, calling it once per
// scrape. With nothing watched it collects nothing.
type snapshotCollector struct {
	snapshot atomic.Pointer[func() broker.Snapshot]
}

// Watch makes every scrape call snapshot once — usually a broker's Snapshot method — and expose
// the natstone_queue_* and natstone_events_* metrics from it. A later call replaces the function;
// nil stops exposing them. snapshot is called from the scraping goroutine.
func (m *Metrics) Watch(snapshot func() broker.Snapshot) {
	if snapshot == nil {
		m.snapshot.snapshot.Store(nil)
		return
	}
	m.snapshot.snapshot.Store(&snapshot)
}

// Describe implements prometheus.Collector.
func (c *snapshotCollector) Describe(ch chan<- *prometheus.Desc) {
	for _, d := range []*prometheus.Desc{
		queueMessagesDesc, queueOldestPendingDesc, queueBlockedDesc, queueValuesDesc,
		eventsPublishedDesc, eventsDroppedDesc, eventsBufferedDesc, eventsEnabledDesc, servingDesc,
		scheduleNextDesc, scheduleLastDesc, scheduleFailingDesc, scheduleSkippedDesc, scheduleOverlapDesc, schedulePausedDesc,
	} {
		ch <- d
	}
}

// Collect implements prometheus.Collector.
func (c *snapshotCollector) Collect(ch chan<- prometheus.Metric) {
	fn := c.snapshot.Load()
	if fn == nil {
		return
	}
	s := (*fn)()
	ch <- constMetric(servingDesc, prometheus.GaugeValue, flag(s.Serving))
	for i := range s.Queues {
		collectQueue(ch, &s.Queues[i])
	}
	for i := range s.Schedules {
		collectSchedule(ch, &s.Schedules[i])
	}
	collectEvents(ch, s.Events)
}

// collectSchedule sends one schedule's metrics.
func collectSchedule(ch chan<- prometheus.Metric, sc *subjects.ScheduleInfo) {
	last := 0.0
	if sc.LastAt != nil {
		last = unixSeconds(*sc.LastAt)
	}
	next := 0.0 // none: its cron has no time left, or it cannot fire (Invalid)
	if !sc.NextAt.IsZero() {
		next = unixSeconds(sc.NextAt)
	}
	ch <- constMetric(scheduleNextDesc, prometheus.GaugeValue, next, sc.Queue, sc.Name)
	ch <- constMetric(scheduleLastDesc, prometheus.GaugeValue, last, sc.Queue, sc.Name)
	ch <- constMetric(scheduleFailingDesc, prometheus.GaugeValue, flag(sc.LastError != "" || sc.Invalid != ""), sc.Queue, sc.Name)
	ch <- constMetric(scheduleSkippedDesc, prometheus.CounterValue, float64(sc.Skipped), sc.Queue, sc.Name)
	ch <- constMetric(scheduleOverlapDesc, prometheus.CounterValue, float64(sc.OverlapSkipped), sc.Queue, sc.Name)
	ch <- constMetric(schedulePausedDesc, prometheus.GaugeValue, flag(sc.Paused), sc.Queue, sc.Name)
}

// unixSeconds is t in Unix seconds, to the millisecond.
func unixSeconds(t time.Time) float64 { return float64(t.UnixMilli()) / 1000 }

// collectQueue sends one queue's gauges: every state, even when 0, and both directions; an
// exclusive queue's values.
func collectQueue(ch chan<- prometheus.Metric, q *broker.QueueSnapshot) {
	for _, st := range subjects.States {
		ch <- constMetric(queueMessagesDesc, prometheus.GaugeValue, float64(count(q.Counts, st)), q.Name, string(st))
	}
	ch <- constMetric(queueOldestPendingDesc, prometheus.GaugeValue, float64(q.OldestPendingMS)/1000, q.Name)
	ch <- constMetric(queueBlockedDesc, prometheus.GaugeValue, flag(q.Config.EnqueueBlocked), q.Name, "enqueue")
	ch <- constMetric(queueBlockedDesc, prometheus.GaugeValue, flag(q.Config.DequeueBlocked), q.Name, "dequeue")
	if q.Config.Type == subjects.Exclusive {
		ch <- constMetric(queueValuesDesc, prometheus.GaugeValue, float64(q.ExclusivityValues), q.Name)
	}
}

// collectEvents sends the events publisher's metrics.
func collectEvents(ch chan<- prometheus.Metric, e broker.EventsSnapshot) {
	ch <- constMetric(eventsPublishedDesc, prometheus.CounterValue, float64(e.Published))
	ch <- constMetric(eventsDroppedDesc, prometheus.CounterValue, float64(e.Dropped))
	ch <- constMetric(eventsBufferedDesc, prometheus.GaugeValue, float64(e.Buffered))
	ch <- constMetric(eventsEnabledDesc, prometheus.GaugeValue, flag(e.Enabled))
}

// constMetric is prometheus.MustNewConstMetric without the panic: an invalid metric (a label value
// that is not UTF-8) fails the scrape's gathering with its error instead.
func constMetric(desc *prometheus.Desc, typ prometheus.ValueType, v float64, labels ...string) prometheus.Metric {
	m, err := prometheus.NewConstMetric(desc, typ, v, labels...)
	if err != nil {
		return prometheus.NewInvalidMetric(desc, err)
	}
	return m
}

// count returns the number of messages in state st.
func count(c subjects.Counts, st subjects.State) int {
	switch st {
	case subjects.StateInvisible:
		return c.Invisible
	case subjects.StatePending:
		return c.Pending
	case subjects.StateRunning:
		return c.Running
	case subjects.StateCompleted:
		return c.Completed
	case subjects.StateCanceled:
		return c.Canceled
	case subjects.StateErrored:
		return c.Errored
	default:
		return 0
	}
}

// flag is 1 for true and 0 for false.
func flag(b bool) float64 {
	if b {
		return 1
	}
	return 0
}
