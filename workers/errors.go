package workers

import (
	"errors"
	"fmt"

	"github.com/natstone/natstone/subjects"
)

// The sentinels of the protocol's error codes, one per code (docs/protocol.md lists when each is
// returned). An error reply from the broker is an [*APIError] whose Is matches the sentinel of its
// code, so
//
//	if errors.Is(err, workers.ErrLeaseExpired) { … }
//
// works on anything a Client method returns. The sentinels themselves are never returned bare.
var (
	ErrBadRequest            = errors.New("natstone: bad request")
	ErrInvalidQueueName      = errors.New("natstone: invalid queue name")
	ErrInvalidID             = errors.New("natstone: invalid message id")
	ErrInvalidMetadata       = errors.New("natstone: invalid metadata")
	ErrInvalidConfig         = errors.New("natstone: invalid queue config")
	ErrMissingExclusivityKey = errors.New("natstone: missing exclusivity key")
	ErrPayloadTooLarge       = errors.New("natstone: payload too large")
	ErrOutOfRange            = errors.New("natstone: out of range")
	ErrInvalidSchedule       = errors.New("natstone: invalid schedule")
	ErrQueueNotFound         = errors.New("natstone: queue not found")
	ErrQueueExists           = errors.New("natstone: queue exists")
	ErrQueueBlocked          = errors.New("natstone: queue blocked")
	ErrMessageNotFound       = errors.New("natstone: message not found")
	ErrScheduleNotFound      = errors.New("natstone: schedule not found")
	ErrInvalidState          = errors.New("natstone: invalid state")
	ErrLeaseMismatch         = errors.New("natstone: lease mismatch")
	ErrLeaseExpired          = errors.New("natstone: lease expired")
	ErrRevisionMismatch      = errors.New("natstone: revision mismatch")
	ErrUnavailable           = errors.New("natstone: unavailable")
	ErrInternal              = errors.New("natstone: internal error")
)

// sentinels maps each code to its sentinel.
var sentinels = map[subjects.Code]error{
	subjects.CodeBadRequest:            ErrBadRequest,
	subjects.CodeInvalidQueueName:      ErrInvalidQueueName,
	subjects.CodeInvalidID:             ErrInvalidID,
	subjects.CodeInvalidMetadata:       ErrInvalidMetadata,
	subjects.CodeInvalidConfig:         ErrInvalidConfig,
	subjects.CodeMissingExclusivityKey: ErrMissingExclusivityKey,
	subjects.CodePayloadTooLarge:       ErrPayloadTooLarge,
	subjects.CodeOutOfRange:            ErrOutOfRange,
	subjects.CodeInvalidSchedule:       ErrInvalidSchedule,
	subjects.CodeQueueNotFound:         ErrQueueNotFound,
	subjects.CodeQueueExists:           ErrQueueExists,
	subjects.CodeQueueBlocked:          ErrQueueBlocked,
	subjects.CodeMessageNotFound:       ErrMessageNotFound,
	subjects.CodeScheduleNotFound:      ErrScheduleNotFound,
	subjects.CodeInvalidState:          ErrInvalidState,
	subjects.CodeLeaseMismatch:         ErrLeaseMismatch,
	subjects.CodeLeaseExpired:          ErrLeaseExpired,
	subjects.CodeRevisionMismatch:      ErrRevisionMismatch,
	subjects.CodeUnavailable:           ErrUnavailable,
	subjects.CodeInternal:              ErrInternal,
}

// APIError is an error reply of the broker: its stable Code, the broker's human-readable Message,
// and the Status sent in the Nats-Service-Error-Code header. Switch on Code (or use errors.Is with
// the sentinels), never on Message.
//
// Errors the Client detects before sending a request — a queue name that cannot be a subject token —
// are APIErrors too, with the code the broker would have replied with.
type APIError struct {
	Code    subjects.Code
	Message string
	Status  int
}

// Error implements error.
func (e *APIError) Error() string { return "natstone: " + string(e.Code) + ": " + e.Message }

// Is reports whether target is the sentinel of e's code (ErrLeaseExpired for lease_expired, …), or
// an *APIError or *subjects.Error with the same code. A code this client does not know matches no
// sentinel.
func (e *APIError) Is(target error) bool {
	if e == nil {
		return false
	}
	if s, ok := sentinels[e.Code]; ok && s == target {
		return true
	}
	switch t := target.(type) {
	case *APIError:
		return t != nil && t.Code == e.Code
	case *subjects.Error:
		return t != nil && t.Code == e.Code
	}
	return false
}

// fieldError is the error of a config field that a check of package subjects refused (err, a
// *subjects.Error): an *APIError with that check's code, as the broker would have replied to the same
// value, so that errors.Is matches its sentinel, its message naming the field.
func fieldError(field string, err error) error {
	e, ok := errors.AsType[*subjects.Error](err)
	if !ok {
		return fmt.Errorf("natstone: %s: %w", field, err)
	}
	return &APIError{Code: e.Code, Message: field + ": " + e.Message, Status: e.Code.Status()}
}

// prefixError is the error of a config field (Config.Prefix, WorkerConfig.Events) that is not a
// subject prefix.
func prefixError(field, prefix string) error {
	return fmt.Errorf("natstone: %s %q is not a subject prefix (dot-separated tokens, no wildcards or white space)", field, prefix)
}

// apiError converts a protocol error to an *APIError.
func apiError(e *subjects.Error) *APIError {
	return &APIError{Code: e.Code, Message: e.Message, Status: e.Code.Status()}
}

// isLeaseLost reports whether err says the lease a worker holds is no longer valid: the message was
// leased again, its lease ran out, it changed state under the holder, or it is gone, with its queue
// or alone.
func isLeaseLost(err error) bool {
	return errors.Is(err, ErrLeaseMismatch) || errors.Is(err, ErrLeaseExpired) ||
		errors.Is(err, ErrInvalidState) || errors.Is(err, ErrMessageNotFound) || errors.Is(err, ErrQueueNotFound)
}
