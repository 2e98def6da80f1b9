package faults

import (
	"encoding/json"
	"fmt"
	"os"
	"sync"
	"time"
)

// Outcome is what a client learned of an operation.
type Outcome int

// The outcomes.
const (
	// OK: the broker acknowledged the operation; its effect is durable.
	OK Outcome = iota
	// Failed: the broker refused it with a typed error (or nobody received it): it had no effect.
	Failed
	// Unknown: a timeout, a lost connection or an `unavailable` reply: it may or may not have
	// taken effect.
	Unknown
)

func (o Outcome) String() string {
	switch o {
	case OK:
		return "ok"
	case Failed:
		return "failed"
	default:
		return "unknown"
	}
}

// Kind is an operation's kind.
type Kind string

// The kinds recorded.
const (
	Enqueue  Kind = "enqueue"
	Dequeue  Kind = "dequeue"
	Complete Kind = "complete"
	Extend   Kind = "extend"
	Release  Kind = "release"
	Cancel   Kind = "cancel"
	Retry    Kind = "retry" // an operator's retry of a canceled or errored message (MessageID)
	// Reschedule is an operator's reschedule of a waiting message (MessageID): a new Priority, and
	// with Delay > 0 invisible for that long.
	Reschedule Kind = "reschedule"
	// Abandon is a worker's abandon of its dequeue RequestID: the leases it took end, given back.
	Abandon Kind = "abandon"
)

// Lease is one message leased by a dequeue, as its reply described it. Times come from the broker.
type Lease struct {
	MessageID string
	LeaseID   string
	Priority  int64
	Value     string            // exclusivity value ("" in a simple queue)
	Metadata  map[string]string // the message's metadata
	Attempts  int
	GrantedAt time.Time // the reply's updated_at: when the broker decided the lease
	ExpiresAt time.Time
}

// Op is one operation and its outcome.
type Op struct {
	Kind    Kind
	Queue   string
	Client  string    // which producer/worker
	Start   time.Time // when the client sent it
	End     time.Time // when the client learned the outcome
	Outcome Outcome
	Code    string // the error code of a Failed op

	// Enqueue
	MessageID   string
	Priority    int64
	Metadata    map[string]string
	InvisibleMS int64

	// Dequeue, Abandon
	RequestID string
	Released  []string // OK abandons: the messages given back
	Batch     int
	Filter    map[string]string
	Leases    []Lease // OK dequeues only

	// Reschedule (MessageID and Priority above)
	Delay time.Duration
	State string // the state its reply gave, when acknowledged

	// Complete, Extend, Release, Cancel (MessageID above)
	LeaseID         string
	Refund          bool      // a release that gives the lease's attempt back
	ExpiresAt       time.Time // OK extends: the new expiry
	RequestedExpiry time.Time // extends: the expiry asked for (an upper bound if unknown)
}

// History is the operations of one run, appended concurrently.
type History struct {
	mu  sync.Mutex
	ops []Op
}

// Add records an operation.
func (h *History) Add(op Op) {
	h.mu.Lock()
	h.ops = append(h.ops, op)
	h.mu.Unlock()
}

// Ops returns a copy of the operations recorded so far.
func (h *History) Ops() []Op {
	h.mu.Lock()
	defer h.mu.Unlock()
	return append([]Op(nil), h.ops...)
}

// QueueSpec is what the checker needs to know of a queue.
type QueueSpec struct {
	Exclusive   bool
	Key         string // the exclusivity key of an exclusive queue
	PerValue    int    // an exclusive queue's max_running_per_value (0: 1)
	MaxAttempts int
	Lease       time.Duration // the longest lease any dequeue asked for
	// Collected: the queue keeps nothing that ended (retention 0), so a completed or canceled
	// message is gone at the end. Such a queue's attempts must outlast the run: the history cannot
	// tell a message collected once errored from a lost one.
	Collected bool
}

// Final is a message's state read after the run, once no lease was left.
type Final struct {
	Found    bool
	State    string
	Attempts int
}

// WriteRun writes run as JSON to path, so that a failed run's history can be checked again and read
// op by op after the test is gone.
func WriteRun(path string, run Run) error {
	data, err := json.MarshalIndent(run, "", " ")
	if err != nil {
		return err
	}
	return os.WriteFile(path, data, 0o644)
}

// ReadRun reads a run WriteRun wrote.
func ReadRun(path string) (Run, error) {
	data, err := os.ReadFile(path)
	if err != nil {
		return Run{}, err
	}
	var run Run
	if err := json.Unmarshal(data, &run); err != nil {
		return Run{}, fmt.Errorf("%s: %w", path, err)
	}
	return run, nil
}
