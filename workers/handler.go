package workers

import (
	"context"
	"errors"
	"fmt"
	"sync"
	"sync/atomic"
	"time"

	"github.com/natstone/natstone/subjects"
)

// Handler processes one leased message. What it returns decides the message's fate:
//   - nil: the message is completed;
//   - an error matching ErrDiscard (see Discard): the message is canceled, never retried;
//   - a Snooze error: the message waits the snooze's delay, its attempt given back;
//   - any other error, or a panic: the message is released, pending again after the worker's
//     BackoffFunc for its attempt (errored once its attempts are spent).
//
// ctx is cancelled when the lease is lost (context.Cause is ErrLeaseLost: the message is no longer
// this handler's, and its result is ignored) or when Worker.Stop stops waiting for the handler (cause
// ErrWorkerStopped: the message is released as the handler returns, or a second after, its attempt
// given back, whatever the handler returns then, nil included, since a handler cut short often
// returns nil). A loss is found by an
// extension: at once when the message is canceled by someone else and the worker hears of it (see
// WorkerConfig.Events), otherwise at the next extension, or when the lease ends by the worker's
// clock. A handler must return soon after ctx is done.
// Handle is called from several goroutines at once when the worker's Concurrency is above 1.
type Handler interface {
	Handle(ctx context.Context, job *Job) error
}

// HandlerFunc adapts a function to Handler.
type HandlerFunc func(ctx context.Context, job *Job) error

// Handle calls f.
func (f HandlerFunc) Handle(ctx context.Context, job *Job) error { return f(ctx, job) }

// Middleware wraps a Handler, e.g. for logging, metrics or tracing. WorkerConfig.Middleware applies
// them outer first: the first one sees every job first and its result last.
type Middleware func(Handler) Handler

// PanicError is the error of a handler that panicked: the worker recovers the panic and fails the
// attempt with it, as if the handler had returned it. Middleware sees it as the handler's result
// (errors.As finds it), so a middleware that counts failures counts panics too; a panic of a
// middleware itself is recovered the same way.
type PanicError struct {
	Value any    // what the handler panicked with
	Stack []byte // the goroutine's stack where it panicked
}

func (e *PanicError) Error() string { return fmt.Sprintf("natstone: handler panicked: %v", e.Value) }

// ErrDiscard makes the worker cancel the message instead of releasing it for a retry, when a handler
// returns it or an error wrapping it. Use it for jobs that can never succeed.
var ErrDiscard = errors.New("natstone: discard message")

// Discard returns an error that matches both ErrDiscard and reason (which may be nil): a handler
// returns it to cancel its message for good, e.g. return workers.Discard(err) for a malformed payload.
// The message's canceled event carries the text of the error the handler returned (FailureText;
// Client.History shows it).
func Discard(reason error) error {
	if reason == nil {
		return ErrDiscard
	}
	return fmt.Errorf("%w: %w", ErrDiscard, reason)
}

// SnoozeError is the error Snooze returns.
type SnoozeError struct {
	Delay time.Duration // how long the message stays invisible
}

func (e *SnoozeError) Error() string { return fmt.Sprintf("natstone: snoozed for %v", e.Delay) }

// Snooze returns an error that, returned by a handler, puts its message back to wait d (invisible
// for d: at least a second, so that a message is not run again and again in a tight loop, and at
// most subjects.MaxInvisible) with its attempt given back: the message was not ready to run (a
// rate limit, a resource not there yet), it did not fail, so it neither backs off nor spends an
// attempt, and its history does not count a failure (its released event says it was snoozed).
// Job.Attempts does not grow with snoozes: a message snoozed forever runs forever, so bound it in
// the handler by the message's age (Job.EnqueuedAt).
func Snooze(d time.Duration) error {
	return &SnoozeError{Delay: min(max(d, minSnooze), subjects.MaxInvisible)}
}

// minSnooze is the shortest snooze.
const minSnooze = time.Second

// ErrLeaseLost is the context.Cause of a handler's context when its lease is gone: an extension
// failed because the message was canceled, completed or leased again by someone else, its lease ran
// out, or the broker could not be reached before the lease's end.
var ErrLeaseLost = errors.New("natstone: lease lost")

// ErrHandlerTimeout is the context.Cause of a handler's context when it ran longer than
// WorkerConfig.Timeout.
var ErrHandlerTimeout = errors.New("natstone: handler timed out")

// ErrHandlersLeftRunning is in Worker.Stop's error when handlers that ignore their contexts were
// still running 3 seconds after Stop's ctx ended, and were left to return on their own (their
// messages released).
var ErrHandlersLeftRunning = errors.New("natstone: handlers left running")

// ErrUnsettled is in Worker.Stop's error when completes, releases or cancels sent while it stopped
// failed, or went unanswered (each is logged): those messages stay running until their leases end,
// and then run again, or error if out of attempts.
var ErrUnsettled = errors.New("natstone: messages not settled")

// ErrWorkerStopped is the context.Cause of a handler's context when Worker.Stop's context ended
// before the handler returned.
var ErrWorkerStopped = errors.New("natstone: worker stopped")

// Job is what a Handler gets: the leased message (with its payload, Attempts counting this one) and
// the means to settle it itself.
type Job struct {
	Message

	client *Client

	// lease serialises the lease operations on the job — the worker's extensions and the handler's
	// Cancel — so an extension never reads the handler's own cancel as a lost lease. It is a
	// semaphore rather than a mutex: a Cancel waiting for an extension in flight (up to the lease's
	// end, with a broker that does not answer) still keeps to its ctx.
	lease     chan struct{}
	leaseOnce sync.Once
	settled   atomic.Bool // the handler canceled the message: the worker neither extends nor settles it
}

// Cancel cancels the message for good, fenced by the job's lease, and tells the worker to leave it
// alone afterwards (whatever the handler then returns). Calling it again returns nil. Errors: as
// Client.Cancel, and ctx's error should ctx end while the worker's extension of the lease is in
// flight (the cancel then was not sent).
func (j *Job) Cancel(ctx context.Context) error {
	if err := j.lock(ctx); err != nil {
		return fmt.Errorf("natstone: cancel %s: %w", j.Queue, err)
	}
	defer j.unlock()
	if j.settled.Load() {
		return nil
	}
	if _, err := j.client.Cancel(ctx, j.Queue, j.ID, j.LeaseID); err != nil {
		return err
	}
	j.settled.Store(true)
	return nil
}

// lock takes the job's lease semaphore, or returns ctx's error.
func (j *Job) lock(ctx context.Context) error {
	j.leaseOnce.Do(func() { j.lease = make(chan struct{}, 1) })
	select {
	case j.lease <- struct{}{}:
		return nil
	case <-ctx.Done():
		return ctx.Err()
	}
}

// unlock gives the lease semaphore back.
func (j *Job) unlock() { <-j.lease }

// isSettled reports whether the handler canceled the message (a Cancel in flight has not, yet).
func (j *Job) isSettled() bool { return j.settled.Load() }
