package broker

import (
	"context"
	"maps"
	"slices"
	"strings"
	"time"

	"github.com/natstone/natstone/subjects"
)

// Observer is told what the broker does, for metrics. Its methods are called from many goroutines,
// some with a queue's lock held: they must be quick and must not call back into the broker.
type Observer interface {
	// Request is one request answered after d; code is "" on success, else the error reply's code.
	Request(op subjects.Op, code subjects.Code, d time.Duration)
	// Write is one message record write, from its publish to its acknowledgement (err nil) or
	// failure.
	Write(d time.Duration, err error)
	// Transition is one stored transition of a message of queue; reason is set for errored events.
	Transition(queue string, kind subjects.EventKind, reason string)
}

// QueueObserver is an Observer that is also told when a queue is deleted, so that what it keeps by
// queue (a metric's series) can go with the queue. The broker calls QueueDeleted once the queue is
// gone from storage, before a queue of the same name can be made again; the deleted queue is
// closed by then, its transitions reported.
type QueueObserver interface {
	Observer
	QueueDeleted(queue string)
}

// WaitObserver is an Observer that is also told, at every lease, how long the message had waited
// pending: from when it became pending (its visible_at) to the lease. Like Transition, Waited is
// called with the queue's lock held.
type WaitObserver interface {
	Observer
	Waited(queue string, d time.Duration)
}

// PayloadObserver is an Observer that is also told of every enqueue (or batch) that failed because
// storage did not take its payloads — not one whose request ended first — so that a payloads stream
// that refuses writes (full, say), which fails enqueues (unavailable) before any record is written,
// shows as a storage failure too.
type PayloadObserver interface {
	Observer
	PayloadWriteFailed(err error)
}

// Snapshot is the broker's state at one moment, for metrics and dashboards.
type Snapshot struct {
	// Serving is true while the broker answers requests: started, not stopped, its claim on the
	// store held. A standby, or a broker still recovering, reports nothing else.
	Serving   bool
	Queues    []QueueSnapshot
	Schedules []subjects.ScheduleInfo // every queue's, by queue and name
	Events    EventsSnapshot
}

// QueueSnapshot is one queue's state.
type QueueSnapshot struct {
	Name            string
	Config          subjects.QueueConfig
	Counts          subjects.Counts
	OldestPendingMS int64           // how long the longest-waiting pending message has waited
	Totals          subjects.Totals // transitions since the broker started
	// ExclusivityValues is, in an exclusive queue, how many exclusivity values its messages carry
	// (in any state, until collected): the values it keeps memory for, and lock slots once taken (a
	// value none of whose messages has run yet has none).
	ExclusivityValues int
}

// EventsSnapshot is the events publisher's state.
type EventsSnapshot struct {
	Enabled   bool
	Published uint64 // events stored in the events stream
	Dropped   uint64 // events given up on (buffer full, or the stream refused them)
	Buffered  int    // events waiting to be published
}

// Serving reports whether the broker answers requests: started, not stopped, its claim on the
// store held. A standby, a broker still recovering, and one whose claim could not be renewed for
// half its ttl (its storage out of reach) do not.
func (b *Broker) Serving() bool {
	b.mu.Lock()
	up := b.started && !b.closed
	b.mu.Unlock()
	return up && b.claim.held()
}

// Snapshot returns every queue's counts, config, oldest pending age and totals, every schedule,
// and the events publisher's state. It takes each queue's lock briefly, one at a time.
func (b *Broker) Snapshot() Snapshot {
	b.mu.Lock()
	if !b.started || b.closed {
		b.mu.Unlock()
		// A standby (or a stopped broker) serves nothing; whether its events are on is its config.
		return Snapshot{Events: EventsSnapshot{Enabled: !b.cfg.DisableEvents}}
	}
	qs := slices.Collect(maps.Values(b.queues))
	b.mu.Unlock()
	s := Snapshot{Serving: b.claim.held()}
	for _, q := range qs {
		q.mu.Lock()
		if q.closed == nil {
			s.Queues = append(s.Queues, QueueSnapshot{
				Name:              q.name,
				Config:            q.cfg,
				Counts:            q.countsLocked(),
				OldestPendingMS:   q.oldestPendingMS(q.now()),
				Totals:            q.totals,
				ExclusivityValues: len(q.values),
			})
		}
		q.mu.Unlock()
	}
	slices.SortFunc(s.Queues, func(a, b QueueSnapshot) int { return strings.Compare(a.Name, b.Name) })
	s.Schedules = b.sched.infos()
	s.Events = b.events.snapshot()
	return s
}

// nopObserver is the Observer of a broker configured without one.
type nopObserver struct{}

func (nopObserver) Request(subjects.Op, subjects.Code, time.Duration) {}
func (nopObserver) Write(time.Duration, error)                        {}
func (nopObserver) Transition(string, subjects.EventKind, string)     {}

// FlushEvents waits until the events of every transition so far are in the events stream (or were
// dropped). It returns at once when events are disabled, or before Start has opened the storage.
func (b *Broker) FlushEvents(ctx context.Context) error {
	b.mu.Lock()
	events := b.events
	b.mu.Unlock()
	return events.sync(ctx)
}
