package subjects

import (
	"strings"
	"time"
)

// QueueType is simple or exclusive.
type QueueType string

// The queue types.
const (
	Simple    QueueType = "simple"    // a plain EDF priority queue
	Exclusive QueueType = "exclusive" // at most one running message per exclusivity value
)

// State is a message's state, as in Timestone's state diagram.
type State string

// The message states. Completed, canceled and errored are terminal.
const (
	StateInvisible State = "invisible"
	StatePending   State = "pending"
	StateRunning   State = "running"
	StateCompleted State = "completed"
	StateCanceled  State = "canceled"
	StateErrored   State = "errored"
)

// States lists every state in diagram order.
var States = []State{StateInvisible, StatePending, StateRunning, StateCompleted, StateCanceled, StateErrored}

// Terminal reports whether s is completed, canceled or errored.
func (s State) Terminal() bool {
	return s == StateCompleted || s == StateCanceled || s == StateErrored
}

// QueueConfig is a queue's configuration. Durations are in milliseconds; a zero field in a create
// request takes the default.
type QueueConfig struct {
	Type             QueueType `json:"type"`
	ExclusivityKey   string    `json:"exclusivity_key,omitempty"`
	LeaseMS          int64     `json:"lease_ms"`           // default lease of a dequeue
	InvisibleMS      int64     `json:"invisible_ms"`       // default invisibility of an enqueue
	MaxAttempts      int       `json:"max_attempts"`       // dequeues a message may have
	RetentionMS      int64     `json:"retention_ms"`       // how long terminal messages are kept
	MaxPayloadBytes  int       `json:"max_payload_bytes"`  // largest payload accepted
	MaxMetadataPairs int       `json:"max_metadata_pairs"` // most metadata pairs accepted
	MaxRunning       int       `json:"max_running"`        // most messages running at once; 0: no limit
	// MaxRunningPerValue is, in an exclusive queue, the most messages of one exclusivity value
	// running at once (1, the default: one at a time); 0 in a simple queue.
	MaxRunningPerValue int  `json:"max_running_per_value,omitempty"`
	EnqueueBlocked     bool `json:"enqueue_blocked"`
	DequeueBlocked     bool `json:"dequeue_blocked"`
}

// CreateQueueRequest is the body of create. Every field is optional; an empty body creates a simple
// queue with the defaults.
type CreateQueueRequest struct {
	Type             QueueType `json:"type,omitempty"`
	ExclusivityKey   string    `json:"exclusivity_key,omitempty"`
	LeaseMS          int64     `json:"lease_ms,omitempty"`
	InvisibleMS      int64     `json:"invisible_ms,omitempty"`
	MaxAttempts      int       `json:"max_attempts,omitempty"`
	RetentionMS      *int64    `json:"retention_ms,omitempty"` // 0 is valid: collect at once
	MaxPayloadBytes  int       `json:"max_payload_bytes,omitempty"`
	MaxMetadataPairs int       `json:"max_metadata_pairs,omitempty"`
	MaxRunning       int       `json:"max_running,omitempty"`
	// MaxRunningPerValue: an exclusive queue's; 0 is 1.
	MaxRunningPerValue int  `json:"max_running_per_value,omitempty"`
	EnqueueBlocked     bool `json:"enqueue_blocked,omitempty"`
	DequeueBlocked     bool `json:"dequeue_blocked,omitempty"`
}

// UpdateQueueRequest is the body of update: only the fields given change. If Revision is set the
// update applies only if the config's revision still equals it (else revision_mismatch).
// The type and exclusivity key cannot change.
type UpdateQueueRequest struct {
	Revision         uint64 `json:"revision,omitempty"`
	LeaseMS          *int64 `json:"lease_ms,omitempty"`
	InvisibleMS      *int64 `json:"invisible_ms,omitempty"`
	MaxAttempts      *int   `json:"max_attempts,omitempty"`
	RetentionMS      *int64 `json:"retention_ms,omitempty"`
	MaxPayloadBytes  *int   `json:"max_payload_bytes,omitempty"`
	MaxMetadataPairs *int   `json:"max_metadata_pairs,omitempty"`
	MaxRunning       *int   `json:"max_running,omitempty"`
	// MaxRunningPerValue: an exclusive queue's, 1 or more.
	MaxRunningPerValue *int  `json:"max_running_per_value,omitempty"`
	EnqueueBlocked     *bool `json:"enqueue_blocked,omitempty"`
	DequeueBlocked     *bool `json:"dequeue_blocked,omitempty"`
}

// Counts is the number of messages in each state.
type Counts struct {
	Invisible int `json:"invisible"`
	Pending   int `json:"pending"`
	Running   int `json:"running"`
	Completed int `json:"completed"`
	Canceled  int `json:"canceled"`
	Errored   int `json:"errored"`
}

// QueueInfo is the reply of create, info and update, and an element of the list reply.
type QueueInfo struct {
	Name      string      `json:"name"`
	Config    QueueConfig `json:"config"`
	Revision  uint64      `json:"revision"` // the config's revision, for update's CAS
	CreatedAt time.Time   `json:"created_at"`
	Counts    Counts      `json:"counts"`
}

// ListRequest is the body of list, all optional: the queues whose names sort after After, at most
// Limit of them (1 to MaxListLimit; default as many as one reply carries).
type ListRequest struct {
	After string `json:"after,omitempty"`
	Limit int    `json:"limit,omitempty"`
}

// ListReply is the reply of list. More says that queues after the last were left out (by the
// request's limit, or to keep the reply within the server's max_payload): list again with after
// set to the last one's name.
type ListReply struct {
	Queues []QueueInfo `json:"queues"`
	More   bool        `json:"more,omitempty"`
}

// DeleteReply is the reply of delete.
type DeleteReply struct {
	Name     string `json:"name"`
	Messages int    `json:"messages"` // how many messages were deleted with it
}

// EnqueueRequest is one message to enqueue. Payload is UTF-8 text; PayloadBase64 carries binary
// payloads; give at most one. Priority defaults to the time the message can run in Unix ms: the
// enqueue time, or the end of its invisibility (FIFO by readiness).
type EnqueueRequest struct {
	ID            string `json:"id,omitempty"`
	Priority      *int64 `json:"priority,omitempty"`
	Payload       string `json:"payload,omitempty"`
	PayloadBase64 []byte `json:"payload_base64,omitempty"`
	Metadata      Pairs  `json:"metadata,omitempty"`
	InvisibleMS   *int64 `json:"invisible_ms,omitempty"` // overrides the queue's invisibility
	LeaseMS       *int64 `json:"lease_ms,omitempty"`     // overrides the queue's lease for this message
	MaxAttempts   *int64 `json:"max_attempts,omitempty"` // overrides the queue's max_attempts for this message
	// VisibleAt (RFC 3339) overrides the queue's invisibility with a time: the message is invisible
	// until then, or pending at once if that time has come (by the broker's clock, to the
	// millisecond). It may not be given with InvisibleMS.
	VisibleAt *time.Time `json:"visible_at,omitempty"`
}

// EnqueueBatchRequest is the body of enqueue_batch.
type EnqueueBatchRequest struct {
	Messages []EnqueueRequest `json:"messages"`
}

// EnqueueReply describes an enqueued message. Duplicate is true when a message with that id already
// existed: the reply then describes the existing message and nothing was written.
type EnqueueReply struct {
	ID        string    `json:"id"`
	State     State     `json:"state"`
	Priority  int64     `json:"priority"`
	Version   uint64    `json:"version"`
	Duplicate bool      `json:"duplicate,omitempty"`
	VisibleAt time.Time `json:"visible_at"`
}

// EnqueueBatchReply is the reply of enqueue_batch, one element per request message in order.
type EnqueueBatchReply struct {
	Messages []EnqueueReply `json:"messages"`
}

// DequeueRequest is the body of dequeue; an empty body leases one message with the queue's lease and
// does not wait.
type DequeueRequest struct {
	Batch     int    `json:"batch,omitempty"`      // 1 to MaxDequeueBatch, default 1
	LeaseMS   int64  `json:"lease_ms,omitempty"`   // default the queue's lease_ms
	WaitMS    int64  `json:"wait_ms,omitempty"`    // long-poll up to this long for a first message
	Filter    Pairs  `json:"filter,omitempty"`     // every pair must be in the metadata
	RequestID string `json:"request_id,omitempty"` // a retry with the same id returns the same leases
	Worker    string `json:"worker,omitempty"`     // who asks, for the leased events (≤ 128 printable bytes)
}

// DequeueReply is the reply of dequeue: the leased messages in EDF order (possibly none).
type DequeueReply struct {
	Messages []Message `json:"messages"`
}

// AbandonRequest is the body of abandon: the request id of a dequeue whose reply its requester gave
// up on (a long poll abandoned at a worker's stop, say).
type AbandonRequest struct {
	RequestID string `json:"request_id"`
}

// AbandonReply is the reply of abandon: the messages that the dequeue leased and abandon gave back
// (pending again, their attempts refunded), by this abandon of the id or an earlier one.
type AbandonReply struct {
	RequestID string   `json:"request_id"`
	Released  []string `json:"released"`
}

// Serving is the body of the announcement a broker publishes on Space.Serving when it begins to
// serve the store: at its start, or when it takes over from a broker that stopped or died.
type Serving struct {
	ID      string    `json:"id"`      // the broker's service id, as in $SRV.INFO.natstone.<id>
	Started time.Time `json:"started"` // when it began to serve
}

// LeaseRequest is the body of complete and cancel (where LeaseID may be empty to cancel
// unconditionally, and Version fences the cancel by the message's version), and the base of
// extend and release.
type LeaseRequest struct {
	ID      string          `json:"id"`
	LeaseID string          `json:"lease_id,omitempty"`
	Version uint64          `json:"version,omitempty"` // cancel only: cancel the message only at this version
	Error   string          `json:"error,omitempty"`   // cancel only: why, for its canceled event (at most MaxErrorLen bytes)
	Next    *DequeueRequest `json:"next,omitempty"`    // a dequeue to run once the message is settled (see SettleReply)
}

// ExtendRequest is the body of extend: the lease then ends LeaseMS from now (default the message's
// own lease_ms from its enqueue, else the queue's lease_ms).
type ExtendRequest struct {
	ID      string `json:"id"`
	LeaseID string `json:"lease_id"`
	LeaseMS int64  `json:"lease_ms,omitempty"`
}

// ReleaseRequest is the body of release: the message is pending again at once, or invisible for
// DelayMS. Error, if given, says why the attempt failed (a handler's error): the released or errored
// event keeps it, and history shows it.
type ReleaseRequest struct {
	ID      string          `json:"id"`
	LeaseID string          `json:"lease_id"`
	DelayMS int64           `json:"delay_ms,omitempty"`
	Error   string          `json:"error,omitempty"`  // at most MaxErrorLen bytes
	Refund  bool            `json:"refund,omitempty"` // the holder never ran it: the attempt is given back
	Next    *DequeueRequest `json:"next,omitempty"`   // as LeaseRequest's
}

// RetryRequest is the body of retry: an errored or canceled message is pending again, or invisible
// for DelayMS, with its attempts anew. With Version, a finished message only at that version (the
// errored or canceled message the caller looked at). A message that is not finished (the retry
// happened already, say) is left as it is; a completed one is not retried.
type RetryRequest struct {
	ID      string `json:"id"`
	Version uint64 `json:"version,omitempty"`
	DelayMS int64  `json:"delay_ms,omitempty"`
}

// RescheduleRequest is the body of reschedule: a message waiting to run (pending or invisible) gets
// Priority, or becomes pending DelayMS from now (0: at once) or at VisibleAt, or both; at least
// one is required, and not both DelayMS and VisibleAt. With Version, only at that version. A
// message already as asked (its priority, and pending when DelayMS is 0 or VisibleAt has come,
// invisible until VisibleAt otherwise) is left as it is, whatever the version.
type RescheduleRequest struct {
	ID       string `json:"id"`
	Version  uint64 `json:"version,omitempty"`
	Priority *int64 `json:"priority,omitempty"`
	DelayMS  *int64 `json:"delay_ms,omitempty"`
	// VisibleAt (RFC 3339) is when the message becomes pending, instead of DelayMS: as an
	// enqueue's visible_at.
	VisibleAt *time.Time `json:"visible_at,omitempty"`
}

// SettleReply is the reply of a complete, release or cancel whose request carried next: the settled
// message (without payload), and what the dequeue in next did. That dequeue runs only once the
// settle is stored, and cannot long-poll (its wait_ms must be 0). Its failure does not undo the
// settle: the reply then succeeds, with Next.Error set and no messages.
type SettleReply struct {
	Message
	Next *NextReply `json:"next"`
}

// NextReply is what the dequeue of a SettleReply leased, in EDF order (possibly none), or why it
// failed.
type NextReply struct {
	Messages []Message `json:"messages"`
	Error    *Error    `json:"error,omitempty"`
}

// GetRequest is the body of get.
type GetRequest struct {
	ID string `json:"id"`
}

// DepthRequest is the body of depth; an empty body counts every message.
type DepthRequest struct {
	Filter Pairs `json:"filter,omitempty"`
}

// DepthReply is the reply of depth.
type DepthReply struct {
	Queue  string `json:"queue"`
	Counts Counts `json:"counts"`
}

// Message is a message as replies describe it. Dequeue, get and complete/extend/release/cancel
// replies use it; the payload is present in dequeue and get replies only, as Payload when it is valid
// UTF-8 and as PayloadBase64 otherwise.
type Message struct {
	ID             string            `json:"id"`
	Queue          string            `json:"queue"`
	State          State             `json:"state"`
	Priority       int64             `json:"priority"`
	Metadata       map[string]string `json:"metadata,omitempty"`
	Payload        *string           `json:"payload,omitempty"`
	PayloadBase64  []byte            `json:"payload_base64,omitempty"`
	Version        uint64            `json:"version"`       // incremented by every write
	Attempts       int               `json:"attempts"`      // dequeues so far
	AttemptsLeft   int               `json:"attempts_left"` // dequeues still allowed
	LeaseID        string            `json:"lease_id,omitempty"`
	LeaseExpiresAt *time.Time        `json:"lease_expires_at,omitempty"`
	EnqueuedAt     time.Time         `json:"enqueued_at"`
	VisibleAt      time.Time         `json:"visible_at"` // when it became (or becomes) pending
	UpdatedAt      time.Time         `json:"updated_at"`
	EndedAt        *time.Time        `json:"ended_at,omitempty"` // when it reached a terminal state
}

// ScheduleRequest is the body of schedule: the recurring enqueue Name of a queue, created, or
// replaced if it exists. At every time Cron gives, the broker enqueues a message with the payload,
// metadata, lease_ms and max_attempts given here, the id "<name>@<fire time, RFC 3339 UTC>", and the
// priority fire time (Unix ms) + DeadlineMS. Overlap says what a fire does while the message of the
// schedule's last fire is not finished: OverlapAllow (the default, "" alike) enqueues, OverlapSkip
// enqueues nothing. The same request sent again writes nothing.
type ScheduleRequest struct {
	Name          string  `json:"name"`
	Cron          string  `json:"cron"`
	Payload       string  `json:"payload,omitempty"`
	PayloadBase64 []byte  `json:"payload_base64,omitempty"`
	Metadata      Pairs   `json:"metadata,omitempty"`
	DeadlineMS    int64   `json:"deadline_ms,omitempty"`
	LeaseMS       *int64  `json:"lease_ms,omitempty"`
	MaxAttempts   *int64  `json:"max_attempts,omitempty"`
	Overlap       Overlap `json:"overlap,omitempty"`
}

// Overlap is a schedule's overlap policy: what a fire does while the message of its last fire is
// still pending, invisible or running.
type Overlap string

// The overlap policies.
const (
	OverlapAllow Overlap = "allow" // enqueue (the default)
	OverlapSkip  Overlap = "skip"  // enqueue nothing, and count the fire time in overlap_skipped
)

// Template is the enqueue that each fire of r sends, without its id and priority.
func (r *ScheduleRequest) Template() EnqueueRequest {
	return EnqueueRequest{
		Payload:       r.Payload,
		PayloadBase64: r.PayloadBase64,
		Metadata:      r.Metadata,
		LeaseMS:       r.LeaseMS,
		MaxAttempts:   r.MaxAttempts,
	}
}

// CronZone splits a schedule's cron into its leading CRON_TZ= or TZ= zone, if it has one (zoned),
// and the expression after it. A cron without a zone is in UTC.
func CronZone(cron string) (zone, expr string, zoned bool) {
	for _, prefix := range []string{"CRON_TZ=", "TZ="} {
		if rest, ok := strings.CutPrefix(cron, prefix); ok {
			zone, expr, _ = strings.Cut(rest, " ")
			return zone, strings.TrimSpace(expr), true
		}
	}
	return "", cron, false
}

// ScheduleInfo describes a schedule (without its payload): what it enqueues, when it fires next,
// and what its last fire did. LastError is why the last fire enqueued nothing (the queue blocked,
// or its config changed since so that the message is no longer valid), with the error's code in
// LastErrorCode; Skipped counts the fire
// times that passed with no message enqueued for them (no broker served the store, of which a
// starting broker fires only the last; or storage did not take the fire), and OverlapSkipped the
// fire times of an OverlapSkip schedule that enqueued nothing because the message of LastID was not
// finished. Overlap is OverlapAllow or OverlapSkip, never "". A Paused schedule does not fire
// (NextAt is then the time it would fire next were it resumed now); PausedAt is when it was paused,
// and Note the note of its last pause or resume. Invalid, when set, says why a stored schedule does
// not fire at all: this broker cannot read it (a cron an earlier version took that this one
// refuses); NextAt is then zero, a set with a valid cron replaces it, and unschedule removes it.
type ScheduleInfo struct {
	Queue          string     `json:"queue"`
	Name           string     `json:"name"`
	Cron           string     `json:"cron"`
	Metadata       Pairs      `json:"metadata,omitempty"`
	DeadlineMS     int64      `json:"deadline_ms"`
	LeaseMS        *int64     `json:"lease_ms,omitempty"`
	MaxAttempts    *int64     `json:"max_attempts,omitempty"`
	Overlap        Overlap    `json:"overlap"`
	PayloadBytes   int        `json:"payload_bytes"`
	Revision       uint64     `json:"revision"`
	UpdatedAt      time.Time  `json:"updated_at"`
	NextAt         time.Time  `json:"next_at"`
	LastAt         *time.Time `json:"last_at,omitempty"`
	LastID         string     `json:"last_id,omitempty"`
	LastError      string     `json:"last_error,omitempty"`
	LastErrorCode  Code       `json:"last_error_code,omitempty"`
	Skipped        int64      `json:"skipped"`
	OverlapSkipped int64      `json:"overlap_skipped"`
	Paused         bool       `json:"paused"`
	PausedAt       *time.Time `json:"paused_at,omitempty"`
	Note           string     `json:"note,omitempty"`
	Invalid        string     `json:"invalid,omitempty"`
}

// SchedulePauseRequest is the body of schedule_pause and of schedule_resume: the schedule Name,
// and a Note for the operators who look at it (why it is paused, who resumed it), kept until the
// next pause or resume that changes the state, or that gives one. At most MaxNoteLen bytes of
// printable UTF-8; empty means none.
type SchedulePauseRequest struct {
	Name string `json:"name"`
	Note string `json:"note,omitempty"`
}

// ScheduleFireRequest is the body of schedule_fire: fire the schedule Name now, paused or not.
// ID, if given, is the message's id (else "<name>@<now, RFC 3339 UTC to the millisecond>", which
// no fire of its cron's times has): a fire sent again with the same ID enqueues nothing more.
type ScheduleFireRequest struct {
	Name string `json:"name"`
	ID   string `json:"id,omitempty"`
}

// UnscheduleRequest is the body of unschedule.
type UnscheduleRequest struct {
	Name string `json:"name"`
}

// UnscheduleReply is the reply of unschedule. Removed is false when there was no such schedule
// (already removed: an unschedule sent again succeeds).
type UnscheduleReply struct {
	Queue   string `json:"queue"`
	Name    string `json:"name"`
	Removed bool   `json:"removed"`
}

// SchedulesRequest is the body of schedules, all optional: the schedules whose names sort after
// After.
type SchedulesRequest struct {
	After string `json:"after,omitempty"`
}

// SchedulesReply is the reply of schedules, by name. More says that schedules after the last were
// left out to keep the reply within the server's max_payload: ask again with after set to the last
// one's name.
type SchedulesReply struct {
	Queue     string         `json:"queue"`
	Schedules []ScheduleInfo `json:"schedules"`
	More      bool           `json:"more,omitempty"`
}
