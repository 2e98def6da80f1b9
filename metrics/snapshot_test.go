package metrics_test

import (
	"slices"
	"sync/atomic"
	"testing"
	"time"

	dto "github.com/prometheus/client_model/go"

	"github.com/natstone/natstone/broker"
	"github.com/natstone/natstone/metrics"
	"github.com/natstone/natstone/subjects"
)

func TestWatch(t *testing.T) {
	t.Parallel()
	m := metrics.New()
	var calls atomic.Int32
	m.Watch(func() broker.Snapshot {
		calls.Add(1)
		return broker.Snapshot{
			Queues: []broker.QueueSnapshot{
				{
					Name:              "encode",
					Config:            subjects.QueueConfig{Type: subjects.Exclusive, DequeueBlocked: true},
					Counts:            subjects.Counts{Invisible: 1, Pending: 2, Running: 3, Completed: 4, Canceled: 5, Errored: 6},
					OldestPendingMS:   1500,
					ExclusivityValues: 3,
				},
				{Name: "mail", Config: subjects.QueueConfig{EnqueueBlocked: true}},
			},
			Schedules: []subjects.ScheduleInfo{
				{Queue: "encode", Name: "nightly", NextAt: time.UnixMilli(1_700_000_060_500), LastAt: ptr(time.UnixMilli(1_700_000_000_000)), Skipped: 4, OverlapSkipped: 6},
				{Queue: "mail", Name: "digest", NextAt: time.UnixMilli(1_700_000_000_000), LastError: "queue mail: enqueue is blocked", Paused: true},
				{Queue: "mail", Name: "old", Cron: "*-5 * * * *", Invalid: `cron "*-5 * * * *": field "*-5" has a range from "*"`},
			},
			Events: broker.EventsSnapshot{Enabled: true, Published: 42, Dropped: 3, Buffered: 7},
		}
	})

	f := scrape(t, m.Handler())
	if got := calls.Load(); got != 1 {
		t.Errorf("snapshot called %d times in a scrape, want 1", got)
	}
	wantMessages := map[string]map[subjects.State]float64{
		"encode": {
			subjects.StateInvisible: 1, subjects.StatePending: 2, subjects.StateRunning: 3,
			subjects.StateCompleted: 4, subjects.StateCanceled: 5, subjects.StateErrored: 6,
		},
		"mail": {}, // every state at 0
	}
	var sets []string
	for queue, states := range wantMessages {
		for _, st := range subjects.States {
			got := f.gauge(t, "natstone_queue_messages", "queue="+queue, "state="+string(st))
			if got != states[st] {
				t.Errorf("natstone_queue_messages{queue=%s,state=%s} = %v, want %v", queue, st, got, states[st])
			}
			sets = append(sets, labelSet([]string{"queue=" + queue, "state=" + string(st)}))
		}
	}
	slices.Sort(sets)
	if got := f.labelSets(t, "natstone_queue_messages", dto.MetricType_GAUGE); !slices.Equal(got, sets) {
		t.Errorf("natstone_queue_messages label sets:\n got %v\nwant %v", got, sets)
	}

	for _, c := range []struct {
		name   string
		labels []string
		want   float64
	}{
		{"natstone_queue_oldest_pending_seconds", []string{"queue=encode"}, 1.5},
		{"natstone_queue_oldest_pending_seconds", []string{"queue=mail"}, 0},
		{"natstone_queue_blocked", []string{"queue=encode", "direction=enqueue"}, 0},
		{"natstone_queue_blocked", []string{"queue=encode", "direction=dequeue"}, 1},
		{"natstone_queue_blocked", []string{"queue=mail", "direction=enqueue"}, 1},
		{"natstone_queue_blocked", []string{"queue=mail", "direction=dequeue"}, 0},
		{"natstone_schedule_next_fire_timestamp_seconds", []string{"queue=encode", "schedule=nightly"}, 1_700_000_060.5},
		{"natstone_schedule_last_fire_timestamp_seconds", []string{"queue=encode", "schedule=nightly"}, 1_700_000_000},
		{"natstone_schedule_failing", []string{"queue=encode", "schedule=nightly"}, 0},
		{"natstone_schedule_last_fire_timestamp_seconds", []string{"queue=mail", "schedule=digest"}, 0},
		{"natstone_schedule_failing", []string{"queue=mail", "schedule=digest"}, 1},
		{"natstone_schedule_paused", []string{"queue=mail", "schedule=digest"}, 1},
		{"natstone_schedule_next_fire_timestamp_seconds", []string{"queue=mail", "schedule=old"}, 0},
		{"natstone_schedule_failing", []string{"queue=mail", "schedule=old"}, 1},
		{"natstone_schedule_paused", []string{"queue=encode", "schedule=nightly"}, 0},
		{"natstone_events_buffered", nil, 7},
		{"natstone_events_enabled", nil, 1},
	} {
		if got := f.gauge(t, c.name, c.labels...); got != c.want {
			t.Errorf("%s%v = %v, want %v", c.name, c.labels, got, c.want)
		}
	}
	// Only the exclusive queue has values.
	if got := f.labelSets(t, "natstone_queue_exclusivity_values", dto.MetricType_GAUGE); !slices.Equal(got, []string{labelSet([]string{"queue=encode"})}) {
		t.Errorf("natstone_queue_exclusivity_values label sets: %v, want encode's alone", got)
	}
	if got := f.gauge(t, "natstone_queue_exclusivity_values", "queue=encode"); got != 3 {
		t.Errorf("natstone_queue_exclusivity_values{queue=encode} = %v, want 3", got)
	}
	if got := f.counter(t, "natstone_schedule_skipped_total", "queue=encode", "schedule=nightly"); got != 4 {
		t.Errorf("natstone_schedule_skipped_total{encode,nightly} = %v, want 4", got)
	}
	if got := f.counter(t, "natstone_schedule_overlap_skipped_total", "queue=encode", "schedule=nightly"); got != 6 {
		t.Errorf("natstone_schedule_overlap_skipped_total{encode,nightly} = %v, want 6", got)
	}
	if got := f.counter(t, "natstone_events_published_total"); got != 42 {
		t.Errorf("natstone_events_published_total = %v, want 42", got)
	}
	if got := f.counter(t, "natstone_events_dropped_total"); got != 3 {
		t.Errorf("natstone_events_dropped_total = %v, want 3", got)
	}
}

func TestWatchReplaceAndStop(t *testing.T) {
	t.Parallel()
	m := metrics.New()
	m.Watch(func() broker.Snapshot { return broker.Snapshot{Queues: []broker.QueueSnapshot{{Name: "a"}}} })
	m.Watch(func() broker.Snapshot {
		return broker.Snapshot{Queues: []broker.QueueSnapshot{{Name: "b", Counts: subjects.Counts{Pending: 9}}}}
	})
	f := scrape(t, m.Handler())
	if got := f.gauge(t, "natstone_queue_messages", "queue=b", "state=pending"); got != 9 {
		t.Errorf("natstone_queue_messages{queue=b,state=pending} = %v, want 9", got)
	}
	if got := len(f.labelSets(t, "natstone_queue_messages", dto.MetricType_GAUGE)); got != len(subjects.States) {
		t.Errorf("natstone_queue_messages has %d series, want %d (queue b only)", got, len(subjects.States))
	}
	if got := f.gauge(t, "natstone_events_enabled"); got != 0 {
		t.Errorf("natstone_events_enabled = %v, want 0", got)
	}
	if got := f.gauge(t, "natstone_broker_serving"); got != 0 {
		t.Errorf("natstone_broker_serving = %v, want 0", got)
	}

	m.Watch(nil)
	f = scrape(t, m.Handler())
	if _, ok := f["natstone_queue_messages"]; ok {
		t.Error("natstone_queue_messages still exposed after Watch(nil)")
	}
}

func ptr[T any](v T) *T { return &v }
