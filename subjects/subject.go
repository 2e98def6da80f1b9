package subjects

import (
	"fmt"
	"strings"
)

// DefaultPrefix is the subject prefix the broker answers on unless configured otherwise.
const DefaultPrefix = "natstone.v1"

// MaxQueueNameLen is the longest queue name, in bytes.
const MaxQueueNameLen = 128

// Op names one operation of the protocol; it is the subject token after the prefix.
type Op string

// The operations. Every one but OpList takes a queue name as the last subject token.
const (
	OpCreate       Op = "create"        // create a queue (idempotent for an identical config)
	OpInfo         Op = "info"          // a queue's config and counts
	OpUpdate       Op = "update"        // change a queue's config (CAS on its revision)
	OpDelete       Op = "delete"        // delete a queue and all its messages
	OpList         Op = "list"          // every queue with its counts (no queue token)
	OpEnqueue      Op = "enqueue"       // one message, JSON
	OpEnqueueBatch Op = "enqueue_batch" // many messages, JSON, all or nothing validated
	OpEnqueueRaw   Op = "enqueue_raw"   // one message: body is the payload, attributes in headers
	OpDequeue      Op = "dequeue"       // lease the earliest-deadline pending messages
	OpAbandon      Op = "abandon"       // end a dequeue whose reply its requester gave up on
	OpComplete     Op = "complete"      // running → completed (lease holder)
	OpExtend       Op = "extend"        // push a lease's expiry (lease holder)
	OpRelease      Op = "release"       // running → pending or invisible (lease holder)
	OpCancel       Op = "cancel"        // any non-terminal state → canceled
	OpRetry        Op = "retry"         // errored or canceled → pending or invisible, its attempts anew
	OpReschedule   Op = "reschedule"    // a waiting message's new priority, or when it becomes pending
	OpGet          Op = "get"           // one message by id
	OpDepth        Op = "depth"         // counts by state, optionally filtered
	OpStats        Op = "stats"         // the current view: counts, oldest pending, rates, expiring leases
	OpBrowse       Op = "browse"        // messages of one state in their order, without payloads
	OpHistory      Op = "history"       // one message's transitions from the events stream
	OpSchedule     Op = "schedule"      // create or replace a recurring enqueue (cron)
	OpUnschedule   Op = "unschedule"    // remove a recurring enqueue
	OpSchedules    Op = "schedules"     // a queue's recurring enqueues, with their next and last fires
	// A schedule's state and fires by hand.
	OpSchedulePause  Op = "schedule_pause"  // a schedule fires no more until resumed
	OpScheduleResume Op = "schedule_resume" // a paused schedule fires again, from its next time after now
	OpScheduleFire   Op = "schedule_fire"   // a schedule's fire now, out of its times
)

// Ops lists every operation, in the order the docs present them.
var Ops = []Op{
	OpCreate, OpInfo, OpUpdate, OpDelete, OpList,
	OpEnqueue, OpEnqueueBatch, OpEnqueueRaw, OpDequeue, OpAbandon,
	OpComplete, OpExtend, OpRelease, OpCancel, OpRetry, OpReschedule, OpGet, OpDepth,
	OpStats, OpBrowse, OpHistory, OpSchedule, OpUnschedule, OpSchedules,
	OpSchedulePause, OpScheduleResume, OpScheduleFire,
}

func (op Op) valid() bool {
	for _, o := range Ops {
		if o == op {
			return true
		}
	}
	return false
}

// Space builds and parses the subjects under one prefix. The zero value is not usable; call NewSpace.
type Space struct {
	prefix string
}

// NewSpace returns the subject space under prefix ("" means DefaultPrefix). The prefix is one or more
// dot-separated tokens without wildcards or white space.
func NewSpace(prefix string) (Space, error) {
	if prefix == "" {
		prefix = DefaultPrefix
	}
	for _, tok := range strings.Split(prefix, ".") {
		if !validToken(tok) {
			return Space{}, fmt.Errorf("natstone: invalid subject prefix %q", prefix)
		}
	}
	return Space{prefix: prefix}, nil
}

// Prefix returns the space's prefix.
func (s Space) Prefix() string { return s.prefix }

// Subject returns the subject of op on queue. For OpList the queue is ignored.
func (s Space) Subject(op Op, queue string) string {
	if op == OpList {
		return s.prefix + "." + string(OpList)
	}
	return s.prefix + "." + string(op) + "." + queue
}

// Wildcard returns the subscription subject for op on every queue.
func (s Space) Wildcard(op Op) string { return s.Subject(op, "*") }

// Serving returns the subject a broker announces itself on once it serves the store
// (<prefix>.serving, body a Serving): a long poll sent before the announcement was parked at a
// broker that is gone, whose reply will never come.
func (s Space) Serving() string { return s.prefix + ".serving" }

// Parse splits a subject of this space into its operation and queue name.
// It returns an *Error with CodeBadRequest for a subject outside the space, an unknown operation or a
// missing queue token, and CodeInvalidQueueName for a bad queue name.
func (s Space) Parse(subject string) (Op, string, error) {
	rest, ok := strings.CutPrefix(subject, s.prefix+".")
	if !ok {
		return "", "", Errorf(CodeBadRequest, "subject %q is not under %q", subject, s.prefix)
	}
	opTok, queue, hasQueue := strings.Cut(rest, ".")
	op := Op(opTok)
	if !op.valid() {
		return "", "", Errorf(CodeBadRequest, "unknown operation %q", opTok)
	}
	if op == OpList {
		if hasQueue {
			return "", "", Errorf(CodeBadRequest, "operation list takes no queue")
		}
		return op, "", nil
	}
	if !hasQueue {
		return "", "", Errorf(CodeBadRequest, "operation %s needs a queue name", op)
	}
	if err := ValidateQueueName(queue); err != nil {
		return "", "", err
	}
	return op, queue, nil
}

// ValidateQueueName reports whether name is a valid queue name: 1 to 128 characters of A-Z a-z 0-9 _ -.
func ValidateQueueName(name string) error {
	if name == "" || len(name) > MaxQueueNameLen {
		return Errorf(CodeInvalidQueueName, "queue name must be 1 to %d characters, got %d", MaxQueueNameLen, len(name))
	}
	for i := 0; i < len(name); i++ {
		c := name[i]
		if !(c >= 'a' && c <= 'z' || c >= 'A' && c <= 'Z' || c >= '0' && c <= '9' || c == '_' || c == '-') {
			return Errorf(CodeInvalidQueueName, "queue name %q may only contain A-Z a-z 0-9 _ -", name)
		}
	}
	return nil
}

// validToken reports whether tok is a literal NATS subject token.
func validToken(tok string) bool {
	if tok == "" || tok == "*" || tok == ">" {
		return false
	}
	for _, r := range tok {
		if r <= ' ' || r == '.' || r == '*' || r == '>' || r == 0x7f {
			return false
		}
	}
	return true
}

// ValidateScheduleName checks a schedule's name: 1 to MaxScheduleNameLen characters of
// A-Z a-z 0-9 _ -, as a queue's.
func ValidateScheduleName(name string) error {
	if name == "" || len(name) > MaxScheduleNameLen {
		return Errorf(CodeInvalidSchedule, "schedule name must be 1 to %d characters, got %d", MaxScheduleNameLen, len(name))
	}
	if ValidateQueueName(name) != nil {
		return Errorf(CodeInvalidSchedule, "schedule name %q may only contain A-Z a-z 0-9 _ -", name)
	}
	return nil
}
