package subjects

import "time"

// EventKind names one transition of a message.
type EventKind string

// The transitions. Every write of a message record is one event; garbage collection is the last.
const (
	EventEnqueued    EventKind = "enqueued"    // created, invisible or pending
	EventPending     EventKind = "pending"     // its invisibility ended
	EventLeased      EventKind = "leased"      // a dequeue leased it
	EventExtended    EventKind = "extended"    // its lease was extended
	EventReleased    EventKind = "released"    // its holder gave it back: pending or invisible again
	EventCompleted   EventKind = "completed"   // its holder completed it
	EventCanceled    EventKind = "canceled"    // canceled, by its holder or by an operator
	EventExpired     EventKind = "expired"     // its lease ran out with attempts left: pending again
	EventErrored     EventKind = "errored"     // out of attempts (Reason says how)
	EventRetried     EventKind = "retried"     // errored or canceled, retried: pending or invisible again
	EventRescheduled EventKind = "rescheduled" // waiting, given a new priority or visibility
	EventCollected   EventKind = "collected"   // garbage-collected after its retention
)

// EventKinds lists every kind in the order of a message's life.
var EventKinds = []EventKind{
	EventEnqueued, EventPending, EventLeased, EventExtended, EventReleased,
	EventCompleted, EventCanceled, EventExpired, EventErrored, EventRetried, EventRescheduled, EventCollected,
}

// The reasons of an errored event, and of a released one whose attempt was given back.
const (
	ReasonLeaseExpired = "lease_expired" // errored: its last lease ran out
	ReasonReleased     = "released"      // errored: its holder released it after its last attempt
	ReasonRefunded     = "refunded"      // released: its holder never ran it, and gave the attempt back
)

// Event is one transition of a message, as published on the events stream (subject
// <events prefix>.<queue>.<kind>.<id token>, where the token is the id in unpadded base64url) and as
// history returns it. Version is the message's version after the transition (a collected event
// carries the last version plus one), so a message's events sort by it.
type Event struct {
	Queue          string            `json:"queue"`
	ID             string            `json:"id"`
	Kind           EventKind         `json:"kind"`
	State          State             `json:"state"`                // the state it entered ("" for collected)
	PrevState      State             `json:"prev_state,omitempty"` // the state it left ("" for enqueued)
	Reason         string            `json:"reason,omitempty"`     // errored: lease_expired or released; released: refunded
	Error          string            `json:"error,omitempty"`      // released, errored by a release, or canceled: the release's or the cancel's error
	Version        uint64            `json:"version"`
	Attempts       int               `json:"attempts"`
	MaxAttempts    int               `json:"max_attempts"`
	Priority       int64             `json:"priority"`
	Metadata       map[string]string `json:"metadata,omitempty"`     // enqueued only
	PayloadSize    int               `json:"payload_size,omitempty"` // enqueued only
	LeaseID        string            `json:"lease_id,omitempty"`
	LeaseExpiresAt *time.Time        `json:"lease_expires_at,omitempty"` // leased and extended
	RequestID      string            `json:"request_id,omitempty"`       // leased: the dequeue's request id
	Worker         string            `json:"worker,omitempty"`           // leased: the dequeue's worker
	VisibleAt      *time.Time        `json:"visible_at,omitempty"`       // entering invisible: when it ends
	At             time.Time         `json:"at"`                         // when it happened
}

// HistoryRequest is the body of history.
type HistoryRequest struct {
	ID    string `json:"id"`
	Limit int    `json:"limit,omitempty"` // 1 to MaxHistoryLimit, default DefaultHistoryLimit
}

// HistoryEvent is an event with the time the message then spent in the state it entered: until the
// next event, or until now for the last event of a message still in that state (Current).
type HistoryEvent struct {
	Event
	StateMS int64 `json:"state_ms"`
	Current bool  `json:"current,omitempty"`
}

// HistoryReply is the reply of history: the message's events in version order, totals of the time
// spent in each state, and how many attempts failed (lease ran out or released). Collected is true
// once the message was garbage-collected; the events outlive it for the events stream's max age.
type HistoryReply struct {
	Queue     string          `json:"queue"`
	ID        string          `json:"id"`
	Events    []HistoryEvent  `json:"events"`
	StateMS   map[State]int64 `json:"state_ms"`
	Failures  int             `json:"failures"`
	Collected bool            `json:"collected,omitempty"`
	Truncated bool            `json:"truncated,omitempty"` // more than Limit events exist
}

// StatsRequest is the body of stats; an empty body gives the whole queue's view.
type StatsRequest struct {
	Filter           Pairs `json:"filter,omitempty"`             // count and age only matching messages
	ExpiringWithinMS int64 `json:"expiring_within_ms,omitempty"` // default 30 s
	ExpiringLimit    int   `json:"expiring_limit,omitempty"`     // default 20
}

// Rates are transitions per second over the last minute (or since the queue was created, or loaded
// by this broker, if sooner, but over a second at least).
type Rates struct {
	Enqueued  float64 `json:"enqueued"`
	Dequeued  float64 `json:"dequeued"`
	Completed float64 `json:"completed"`
	Errored   float64 `json:"errored"`
}

// Totals count transitions since the broker started.
type Totals struct {
	Enqueued    uint64 `json:"enqueued"`
	Dequeued    uint64 `json:"dequeued"`
	Completed   uint64 `json:"completed"`
	Canceled    uint64 `json:"canceled"`
	Errored     uint64 `json:"errored"`
	Released    uint64 `json:"released"`
	Expired     uint64 `json:"expired"` // leases that ran out (errored ones included)
	Retried     uint64 `json:"retried"`
	Rescheduled uint64 `json:"rescheduled"`
	Collected   uint64 `json:"collected"`
}

// ExpiringLease is a running message whose lease ends soon.
type ExpiringLease struct {
	ID             string    `json:"id"`
	LeaseID        string    `json:"lease_id"`
	LeaseExpiresAt time.Time `json:"lease_expires_at"`
	ExpiresInMS    int64     `json:"expires_in_ms"`
	Attempts       int       `json:"attempts"`
	MaxAttempts    int       `json:"max_attempts"`
}

// StatsReply is the reply of stats: the queue's current view. OldestPendingMS is how long the
// longest-waiting pending message has been pending (0 if none). With a filter, Counts and
// OldestPendingMS cover only matching messages; rates, totals and expiring leases are the queue's.
type StatsReply struct {
	Queue           string          `json:"queue"`
	At              time.Time       `json:"at"`
	Config          QueueConfig     `json:"config"`
	Counts          Counts          `json:"counts"`
	OldestPendingMS int64           `json:"oldest_pending_ms"`
	Rates           Rates           `json:"rates"`
	Totals          Totals          `json:"totals"`
	Expiring        []ExpiringLease `json:"expiring"`
}

// BrowseRequest is the body of browse: up to Limit messages of one state, in that state's order —
// pending in EDF order, invisible by when they become pending, running by lease expiry, terminal by
// when they ended — optionally only those matching Filter.
type BrowseRequest struct {
	State  State  `json:"state"`
	Filter Pairs  `json:"filter,omitempty"`
	Limit  int    `json:"limit,omitempty"` // 1 to MaxBrowseLimit, default DefaultBrowseLimit
	After  string `json:"after,omitempty"` // a reply's next: the page after it
}

// BrowseReply is the reply of browse: messages without payloads. More is true when more matched.
type BrowseReply struct {
	Queue    string    `json:"queue"`
	State    State     `json:"state"`
	Messages []Message `json:"messages"`
	More     bool      `json:"more,omitempty"`
	Next     string    `json:"next,omitempty"` // with more: the after of the next page
}
