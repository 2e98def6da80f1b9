package subjects

import (
	"errors"
	"fmt"
)

// Code is a stable, machine-readable error code. Clients switch on it; its text never changes.
type Code string

// The error codes. Status gives the numeric code sent in the Nats-Service-Error-Code header.
const (
	CodeBadRequest            Code = "bad_request"             // malformed JSON, unknown field, bad header
	CodeInvalidQueueName      Code = "invalid_queue_name"      // name outside [A-Za-z0-9_-]{1,128}
	CodeInvalidID             Code = "invalid_id"              // empty, too long or non-printable message id
	CodeInvalidMetadata       Code = "invalid_metadata"        // too many pairs, key or value too long or not printable
	CodeInvalidConfig         Code = "invalid_config"          // a queue config field out of its bounds
	CodeMissingExclusivityKey Code = "missing_exclusivity_key" // exclusive queue, message without the key
	CodePayloadTooLarge       Code = "payload_too_large"       // payload over the queue's limit
	CodeInvalidSchedule       Code = "invalid_schedule"        // a schedule's name, cron expression or overlap is not valid
	CodeOutOfRange            Code = "out_of_range"            // batch, lease, wait, delay or invisibility out of bounds
	CodeQueueNotFound         Code = "queue_not_found"         // no such queue (and auto-create is off or not applicable)
	CodeQueueExists           Code = "queue_exists"            // create with a config differing from the stored one
	CodeQueueBlocked          Code = "queue_blocked"           // enqueue_blocked or dequeue_blocked is set
	CodeMessageNotFound       Code = "message_not_found"       // no message with that id (never existed or collected)
	CodeScheduleNotFound      Code = "schedule_not_found"      // no schedule of that name in the queue
	CodeInvalidState          Code = "invalid_state"           // the transition does not apply to the message's state
	CodeLeaseMismatch         Code = "lease_mismatch"          // the lease id is not the message's current lease
	CodeLeaseExpired          Code = "lease_expired"           // the lease id was current but its time ran out
	CodeRevisionMismatch      Code = "revision_mismatch"       // queue update with a stale revision
	CodeUnavailable           Code = "unavailable"             // storage unreachable or the broker is starting; retry
	CodeInternal              Code = "internal"                // a bug; the message says more
)

// Status returns the HTTP-like status sent in the Nats-Service-Error-Code header for c.
func (c Code) Status() int {
	switch c {
	case CodeQueueNotFound, CodeMessageNotFound, CodeScheduleNotFound:
		return 404
	case CodeQueueExists, CodeQueueBlocked, CodeInvalidState, CodeLeaseMismatch, CodeLeaseExpired, CodeRevisionMismatch:
		return 409
	case CodePayloadTooLarge:
		return 413
	case CodeUnavailable:
		return 503
	case CodeInternal:
		return 500
	default:
		return 400
	}
}

// Error is a typed protocol error: what the broker replies and what clients decode.
type Error struct {
	Code    Code   `json:"code"`
	Message string `json:"message"`
}

// ErrorReply is the body of every failed request.
type ErrorReply struct {
	Error *Error `json:"error"`
}

// Errorf returns an *Error with code and a formatted message.
func Errorf(code Code, format string, args ...any) *Error {
	return &Error{Code: code, Message: fmt.Sprintf(format, args...)}
}

// Error implements error.
func (e *Error) Error() string { return "natstone: " + string(e.Code) + ": " + e.Message }

// Is reports whether target is an *Error with the same code, so that
// errors.Is(err, &subjects.Error{Code: subjects.CodeLeaseExpired}) matches any lease_expired error.
func (e *Error) Is(target error) bool {
	var t *Error
	return errors.As(target, &t) && t != nil && e != nil && t.Code == e.Code
}

// CodeOf returns the code of the *Error in err's chain, or CodeInternal if there is none.
func CodeOf(err error) Code {
	var e *Error
	if errors.As(err, &e) && e != nil {
		return e.Code
	}
	return CodeInternal
}
