package workers

import (
	"cmp"
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"log/slog"
	"os"
	"runtime/debug"
	"sync"
	"sync/atomic"
	"time"

	"github.com/nats-io/nats.go"
	"github.com/nats-io/nuid"

	"github.com/natstone/natstone/subjects"
)

// Defaults of WorkerConfig.
const (
	DefaultConcurrency = 1
	DefaultPollWait    = 20 * time.Second
	// DefaultEvents is the subject prefix of the events of a broker served with the default
	// --store-prefix, natstone.
	DefaultEvents = "natstone.events"
)

// stopSettleTimeout bounds the last try of a complete, release or cancel once Stop's ctx is done
// (one in flight then, or one sent after): Stop then returns soon, and a lease not settled ends on
// its own.
const stopSettleTimeout = time.Second

// stopGrace bounds how long Stop waits, once its ctx is done, for the handlers to return and the
// last requests to end, each a while of at most stopSettleTimeout: a settle's last try, then the
// abandon of the dequeue that settle carried when its outcome is unknown; or the wait for a handler
// to return before its message is released, then that release; and one such while to spare.
const stopGrace = 3 * stopSettleTimeout

// WorkerConfig configures a Worker. Only Queue is required.
type WorkerConfig struct {
	// Queue is the queue to work on. Required.
	Queue string
	// Concurrency is how many handlers run at once; each handler slot long-polls for its own
	// message. Default DefaultConcurrency.
	Concurrency int
	// Filter, if set, makes the worker take only messages whose metadata has every pair.
	Filter map[string]string
	// Lease is the lease the worker asks for (subjects.MinLease to subjects.MaxLease), and how far
	// each extension pushes it. Default: the message's own lease, else the queue's.
	Lease time.Duration
	// PollWait is how long one dequeue long-polls before it returns empty and the next one starts
	// (1 ms to subjects.MaxWait). Default DefaultPollWait. A long poll parked at a broker that dies
	// is answered by nobody. It is sent again at once when its connection reconnects (a natstone
	// killed with its embedded NATS server, and started again), or when a broker announces that it
	// serves (a restart, or a standby taking over; the worker's NATS user must be allowed to
	// subscribe to the announcements, subjects.Space.Serving, and its Client must not ignore them,
	// Config.IgnoreAnnouncements). Failing both, its slot polls again after PollWait plus the
	// client's timeout (20 s + 10 s by default). A slot waiting to poll again after a failed poll,
	// or a missing or blocked queue, polls at once too when a broker announces that it serves.
	PollWait time.Duration
	// BackoffFunc returns how long a message stays invisible after its attempt-th attempt (1 for the
	// first) failed. Default DefaultBackoff.
	BackoffFunc func(attempt int) time.Duration
	// ExtendEveryFunc returns how often a running handler's lease is extended, given the lease
	// duration; a result outside (0, lease) is replaced by the default, lease/3.
	ExtendEveryFunc func(lease time.Duration) time.Duration
	// Timeout bounds a handler's run: its context then ends, with the cause ErrHandlerTimeout, and
	// what it returns is a failed attempt, released with backoff like any other, with an error
	// saying it timed out — unless it returns nil (completed), a Discard error (canceled) or a
	// Snooze (snoozed). The lease is extended until the handler returns, whether it heeds its
	// context or not: a message (and in an exclusive queue its value) stays held while its handler
	// runs. Default 0: no bound.
	Timeout time.Duration
	// Name identifies the worker in the leased events of its messages (history shows it); at most
	// subjects.MaxWorkerLen bytes. Default "<hostname>:<pid>".
	Name string
	// Middleware wraps the handler, outer first.
	Middleware []Middleware
	// Events is the subject prefix of the broker's transition events: "<--store-prefix>.events".
	// The worker subscribes to the cancels of its queue's messages there, and when one of the
	// messages it runs is canceled by someone else (an operator, say) it extends that lease at
	// once rather than at its next extension: the extension fails, and the handler's context is
	// cancelled (cause ErrLeaseLost) within moments of the cancel. An event only prompts that
	// check, so a forged or stray one costs an extension and nothing more. Without the events (a
	// broker served with --no-events, or a NATS user not allowed to subscribe there: see
	// docs/security.md) a cancel is noticed at the next extension. Default DefaultEvents.
	Events string
	// IgnoreCancels makes the worker not subscribe to the cancels (Events): for a NATS user not
	// allowed to, say, whose server would otherwise report a permissions violation at each Start. A
	// canceled message's handler then runs until its next extension.
	IgnoreCancels bool
	// Logger receives the worker's logs. Default slog.Default().
	Logger *slog.Logger
}

// Worker runs a Handler on the messages of one queue: Concurrency slots, each long-polling for one
// message, running the handler while extending the message's lease, then completing, releasing or
// canceling the message by what the handler returned (see Handler). Create it with NewWorker, run it
// with Start and Stop. A Worker runs once: it cannot be started again after Stop.
//
// Delivery is at least once. A message whose lease is lost — the worker could not extend it in time,
// or someone else canceled it — is no longer the handler's: its context is cancelled with
// ErrLeaseLost and its result ignored; the broker gives the message to another worker once the lease
// has ended (if it has attempts left). A cancel is noticed within moments when the worker hears its
// event (WorkerConfig.Events), else at the next extension.
type Worker struct {
	client    *Client
	cfg       WorkerConfig // defaults applied
	handler   Handler      // with the middleware
	log       *slog.Logger
	running   atomic.Int32 // slots with messages: their handlers running, their settles, or given back
	handlers  atomic.Int32 // handlers running (Stop's error names those it leaves)
	unsettled atomic.Int32 // completes, releases and cancels that failed, or whose outcome stayed unknown

	// The log's streaks, across the slots, so that an outage or a missing queue is said a few times
	// per worker rather than per slot: the polls that failed in a row, and the polls in a row that
	// found no queue, or the queue's dequeues blocked.
	pollsFailed streak
	missing     streak
	blocked     streak
	// cutSaid and unknownSaid are when a slot's poll cut as parked at a broker that may be gone, and
	// one whose outcome was unknown otherwise (its reply did not come in time), were last said at
	// INFO or WARN (Unix ns): the slots' polls parked at a broker that died end within moments of
	// each other, or each at its own time out, and the retry of each mends it, so a streak of them
	// would end at every slot's; they are said once per quiet.
	cutSaid, unknownSaid atomic.Int64

	// pollRetryFunc returns how long a slot waits to poll again after a run of failures polls in a
	// row that failed, the last with err: pollRetry, unless a test sets another.
	pollRetryFunc func(failures int, err error) time.Duration

	// mu guards the fields below.
	mu           sync.Mutex
	started      bool
	stoppedFirst bool                    // Stop came before any Start: it never runs
	stopPoll     context.CancelCauseFunc // ends the slots' polls: no new messages
	stopJobs     context.CancelCauseFunc // cancels the running handlers' contexts
	done         chan struct{}           // closed once every goroutine of the worker has returned

	// leasesMu guards leases: the running handlers' leases by lease id, each with the channel that
	// a cancel event of its message signals.
	leasesMu sync.Mutex
	leases   map[string]chan struct{}
}

// NewWorker returns a Worker that runs h on cfg.Queue through c. It validates cfg, naming the
// offending field; nothing is sent until Start.
func NewWorker(c *Client, cfg *WorkerConfig, h Handler) (*Worker, error) {
	if c == nil {
		return nil, errors.New("natstone: NewWorker: nil *Client")
	}
	if f, ok := h.(HandlerFunc); h == nil || ok && f == nil {
		return nil, errors.New("natstone: NewWorker: nil Handler")
	}
	if cfg == nil {
		return nil, errors.New("natstone: NewWorker: nil *WorkerConfig (Queue is required)")
	}
	w := cfg.withDefaults()
	if err := w.validate(); err != nil {
		return nil, err
	}
	h = recovering{h} // inside the middleware, which sees a panic as the *PanicError it returns
	for i := len(w.Middleware) - 1; i >= 0; i-- {
		h = w.Middleware[i](h)
	}
	return &Worker{client: c, cfg: w, handler: h, log: w.Logger, pollRetryFunc: pollRetry}, nil
}

func (cfg *WorkerConfig) withDefaults() WorkerConfig {
	w := *cfg
	if w.Concurrency == 0 {
		w.Concurrency = DefaultConcurrency
	}
	if w.PollWait == 0 {
		w.PollWait = DefaultPollWait
	}
	if w.BackoffFunc == nil {
		w.BackoffFunc = DefaultBackoff
	}
	if w.ExtendEveryFunc == nil {
		w.ExtendEveryFunc = func(lease time.Duration) time.Duration { return lease / 3 }
	}
	if w.Logger == nil {
		w.Logger = slog.Default()
	}
	if w.Events == "" {
		w.Events = DefaultEvents
	}
	if w.Name == "" {
		host, _ := os.Hostname()
		w.Name = fmt.Sprintf("%s:%d", cmp.Or(host, "worker"), os.Getpid())
		w.Name = w.Name[:min(len(w.Name), subjects.MaxWorkerLen)]
	}
	return w
}

func (cfg *WorkerConfig) validate() error {
	if err := subjects.ValidateQueueName(cfg.Queue); err != nil {
		return fieldError("WorkerConfig.Queue", err)
	}
	if cfg.Concurrency < 0 {
		return fmt.Errorf("natstone: WorkerConfig.Concurrency %d is negative", cfg.Concurrency)
	}
	if cfg.Timeout < 0 {
		return fmt.Errorf("natstone: WorkerConfig.Timeout %v is negative", cfg.Timeout)
	}
	if err := subjects.ValidateWorker(cfg.Name); err != nil {
		return fieldError("WorkerConfig.Name", err)
	}
	if err := subjects.ValidateMetadata(cfg.Filter, subjects.MaxMetadataPairs); err != nil {
		return fieldError("WorkerConfig.Filter", err)
	}
	if cfg.Lease != 0 && (cfg.Lease < subjects.MinLease || cfg.Lease > subjects.MaxLease) {
		return fieldError("WorkerConfig.Lease", subjects.Errorf(subjects.CodeOutOfRange, "%v is outside %v to %v", cfg.Lease, subjects.MinLease, subjects.MaxLease))
	}
	// Under a millisecond the wait would round to none, and the worker would poll without pause.
	if cfg.PollWait < time.Millisecond || cfg.PollWait > subjects.MaxWait {
		return fieldError("WorkerConfig.PollWait", subjects.Errorf(subjects.CodeOutOfRange, "%v is outside 1ms to %v", cfg.PollWait, subjects.MaxWait))
	}
	for i, m := range cfg.Middleware {
		if m == nil {
			return fmt.Errorf("natstone: WorkerConfig.Middleware[%d] is nil", i)
		}
	}
	if _, err := subjects.NewSpace(cfg.Events); err != nil {
		return prefixError("WorkerConfig.Events", cfg.Events)
	}
	return nil
}

// Start starts the worker's slots and returns at once; it sends nothing itself. Cancelling ctx
// stops the worker's dequeues, like the start of Stop: handlers already running go on, with contexts
// that carry ctx's values but not its cancellation. Call Stop to wait for them and to bound how long
// they may still run. It returns an error for a Worker not made with NewWorker, one started before,
// or one stopped, even before it was started (a Worker runs once; the error says so).
func (w *Worker) Start(ctx context.Context) error {
	w.mu.Lock()
	defer w.mu.Unlock()
	switch {
	case w.client == nil:
		return errors.New("natstone: worker not made with NewWorker")
	case w.started && isClosed(w.done), w.stoppedFirst:
		return errors.New("natstone: worker stopped: a Worker runs once; make another with NewWorker")
	case w.started:
		return errors.New("natstone: worker already started")
	}
	w.started = true
	pollCtx, stopPoll := context.WithCancelCause(ctx)
	jobCtx, stopJobs := context.WithCancelCause(context.WithoutCancel(ctx))
	w.stopPoll, w.stopJobs, w.done = stopPoll, stopJobs, make(chan struct{})
	w.leases = make(map[string]chan struct{})
	var cancels *nats.Subscription
	if !w.cfg.IgnoreCancels {
		var err error
		cancels, err = w.client.nc.Subscribe(w.cfg.Events+"."+w.cfg.Queue+"."+string(subjects.EventCanceled)+".*", w.canceled)
		if err != nil {
			// Not fatal: a cancel is then noticed at the message's next extension. (A NATS user
			// not allowed the subject is refused later, by the server: that reaches the
			// connection's error handler, not this.)
			w.log.Warn("not listening for cancels: a canceled message's handler runs until its next extension", "queue", w.cfg.Queue, "error", err)
		}
	}

	var slots sync.WaitGroup
	for range w.cfg.Concurrency {
		slots.Go(func() { w.slot(pollCtx, jobCtx) })
	}
	done := w.done
	go func() {
		slots.Wait()
		if cancels != nil {
			_ = cancels.Unsubscribe()
		}
		stopPoll(nil)
		stopJobs(nil)
		close(done)
	}()
	return nil
}

// canceled takes a canceled event of the worker's queue: if it ended the lease of a message that a
// handler here runs, that handler's process is told, to check the lease at once.
func (w *Worker) canceled(msg *nats.Msg) {
	var ev struct {
		PrevState subjects.State `json:"prev_state"`
		LeaseID   string         `json:"lease_id"`
	}
	if json.Unmarshal(msg.Data, &ev) != nil || ev.PrevState != subjects.StateRunning || ev.LeaseID == "" {
		return
	}
	w.leasesMu.Lock()
	ch := w.leases[ev.LeaseID]
	w.leasesMu.Unlock()
	if ch != nil {
		select {
		case ch <- struct{}{}:
		default: // told already
		}
	}
}

// watch registers the lease of a message whose handler is about to run; the channel it returns is
// signalled when a cancel event names that lease. unwatch ends it.
func (w *Worker) watch(leaseID string) <-chan struct{} {
	ch := make(chan struct{}, 1)
	w.leasesMu.Lock()
	w.leases[leaseID] = ch
	w.leasesMu.Unlock()
	return ch
}

func (w *Worker) unwatch(leaseID string) {
	w.leasesMu.Lock()
	delete(w.leases, leaseID)
	w.leasesMu.Unlock()
}

// Stop drains the worker: no new message is dequeued (long polls in flight are abandoned, below), and the
// running handlers may finish and settle their messages until ctx is done. Then their contexts are
// cancelled (cause ErrWorkerStopped), and each message is released as its handler returns, with its
// attempt given back (ReleaseOpts.Refund: the handler was stopped, it did not fail, so a deploy never
// errors a message on its last attempt), whatever the handler returns then, nil included (a handler
// cut short often returns nil; Discard and Snooze are not done either), with one try of at most a
// second (a lease not released ends on its own, and that attempt is spent). A handler that has not
// returned a second after its context ended (or half of what is left of its lease, if that is
// less) has its message released all the same, unless its own Cancel of it is under way: it may
// then run alongside the message's next run, even in an exclusive queue. A complete, release or
// cancel still in flight when ctx is done has at most a second more, whatever the client's timeout
// (and should its answer not come, the slot's next message it may have leased is abandoned, below).
//
// Stop returns when every goroutine of the worker has returned: nil if the handlers finished and
// settled their messages in time (or none was running), else ctx's error; joined with ErrUnsettled
// if a complete, release or cancel sent as it stopped failed or went unanswered (its message stays
// running until its lease ends). A handler that ignores its context is not waited for past 3 seconds
// after ctx is done: Stop then returns ctx's error joined with ErrHandlersLeftRunning, and leaves
// that handler's goroutine to return on its own (its message was released); a second Stop waits for
// it. ctx's error alone says the handlers were interrupted and have all returned. Stopping a worker
// that was never started, or stopping it again, returns nil; a worker stopped before it was started
// never starts (Start then fails).
//
// The long polls in flight are abandoned at the broker (Client.Abandon, a try of at most a second
// each): they end there, leasing nothing, and what one leased just before is pending again, its
// attempt given back. Should an abandon fail (the broker unreachable, or a NATS user not allowed the
// abandon subject), that is logged, and a message the poll leases before its wait is over stays
// running, unprocessed, until its lease ends (spending that attempt). A message that a slot's
// complete leased for it (see CompleteNext) as Stop began is released at once, unprocessed, with its
// attempt given back (ReleaseOpts.Refund); when the answer of such a complete does not come (no reply
// in time, unavailable, or cut by Stop), the dequeue it carried is abandoned the same way.
func (w *Worker) Stop(ctx context.Context) error {
	w.mu.Lock()
	started, stopPoll, stopJobs, done := w.started, w.stopPoll, w.stopJobs, w.done
	// In the same hold as the read of started: a Start between the two would run after this Stop.
	w.stoppedFirst = !started // a Start that comes later must not run it
	w.mu.Unlock()
	if !started {
		return nil
	}
	failed := w.unsettled.Load()
	stopPoll(ErrWorkerStopped)
	err := w.drain(ctx, stopJobs, done)
	if n := w.unsettled.Load() - failed; n > 0 {
		err = errors.Join(err, fmt.Errorf("%w: %d of the completes, releases or cancels sent as the worker stopped failed or went unconfirmed (logged); their leases end on their own", ErrUnsettled, n))
	}
	return err
}

// drain waits for the slots to end (done) once their polls are stopped: until ctx is done, then,
// stopJobs having cancelled the handlers' contexts, for stopGrace more.
func (w *Worker) drain(ctx context.Context, stopJobs context.CancelCauseFunc, done <-chan struct{}) error {
	select {
	case <-done:
		return nil
	case <-ctx.Done():
	}
	select {
	case <-done:
		return nil
	default:
	}
	idle := w.running.Load() == 0 // no handler or settle to interrupt: the slots are only stopping
	stopJobs(ErrWorkerStopped)
	grace := time.NewTimer(stopGrace)
	defer grace.Stop()
	select {
	case <-done:
	case <-grace.C:
		// The messages were released; what is left is handlers that ignore their contexts. Waiting
		// for them would hold a deploy's shutdown until it is killed.
		if n := w.handlers.Load(); n > 0 {
			return fmt.Errorf("natstone: worker stop: %w; %w: %d still running %v after their contexts ended, left to return on their own",
				ctx.Err(), ErrHandlersLeftRunning, n, stopGrace)
		}
		return fmt.Errorf("natstone: worker stop: %w; its last requests still unanswered %v after it, left to end on their own", ctx.Err(), stopGrace)
	}
	if idle {
		return nil
	}
	return fmt.Errorf("natstone: worker stop: %w", ctx.Err())
}

// slot is one handler slot: poll for a message, run it, repeat until the polls are stopped. A
// message is settled together with the dequeue of the slot's next one (CompleteNext, ReleaseNext):
// the slot long-polls only when that dequeue found nothing.
func (w *Worker) slot(pollCtx, jobCtx context.Context) {
	failures := 0                    // consecutive polls that failed or came back suspiciously early: the backoff's
	missing, blocked := false, false // the slot's last poll found no queue, or its dequeues blocked
	var uncertain requestTry         // the last dequeue whose outcome is unknown: the next poll's
	defer func() {
		if uncertain.id != "" { // its leases, if any, are for no one now
			w.abandon(pollCtx, uncertain.id)
		}
	}()
	for pollCtx.Err() == nil {
		began := time.Now()
		serving := w.client.servingNext() // a broker that begins to serve ends the backoff below
		d, err := w.poll(pollCtx, uncertain)
		got := len(d.msgs) > 0
		// A missing or blocked queue is over when a slot that found it so finds it no longer (one
		// parked before a block, answered empty at the end of its wait, says nothing of it).
		if missing && !errors.Is(err, ErrQueueNotFound) {
			missing = false
			w.missing.end()
		}
		if blocked && !errors.Is(err, ErrQueueBlocked) {
			blocked = false
			if n, _ := w.blocked.end(); n > 0 && err == nil {
				w.log.Info("queue unblocked: dequeueing again", "queue", w.cfg.Queue)
			}
		}
		if err == nil {
			if n, since := w.pollsFailed.end(); n > 0 {
				w.log.Info("dequeue works again", "queue", w.cfg.Queue, "failures", n, "after", time.Since(since).Round(time.Millisecond))
			}
		}
		stopped := got && w.work(pollCtx, jobCtx, &d)
		uncertain = d.uncertain // what the poll, or the last settle's next, left unknown
		if stopped {
			return
		}
		switch {
		case got:
			failures = 0
			continue
		case pollCtx.Err() != nil:
			return
		case errors.Is(err, ErrQueueNotFound):
			failures++
			missing = true
			level := slog.LevelDebug
			n := w.missing.fail()
			if n == 1 {
				level = slog.LevelWarn // said once, not every second while the queue is missing
			}
			w.log.Log(pollCtx, level, "queue not found; polling again every second until it exists", "queue", w.cfg.Queue, "failures", n)
		case errors.Is(err, ErrQueueBlocked):
			// An operator's pause, not a failure: said once, and asked again every second.
			failures++
			blocked = true
			if w.blocked.fail() == 1 {
				w.log.Info("queue's dequeues blocked; polling again every second until they are unblocked", "queue", w.cfg.Queue)
			}
		case errors.Is(err, ErrPollCut):
			// Its retry was cut too (at a reconnect, then by a broker's announcement; or by
			// announcements that keep coming): no failure of a broker's, said as a cut is. The
			// backoff below ends at once when a broker announced that it serves.
			failures++
			w.log.Log(pollCtx, w.cutLevel(), "dequeue cut again; sending it again", "queue", w.cfg.Queue, "error", err)
		case err != nil:
			failures++
			n := w.pollsFailed.fail()
			w.log.Log(pollCtx, failureLevel(n), "dequeue failed", "queue", w.cfg.Queue, "error", err, "failures", n)
		case time.Since(began) < w.cfg.PollWait/2:
			// An empty reply long before the wait was up: the queue was deleted, or the broker does
			// not wait. Back off rather than spin.
			failures++
			w.log.Debug("dequeue returned early", "queue", w.cfg.Queue, "failures", failures)
		default:
			failures = 0
			continue
		}
		t := time.NewTimer(w.pollRetryFunc(failures, err))
		select {
		case <-t.C:
		case <-serving:
			// A broker serves now, since the poll was sent (a restart, a standby taking over):
			// the next poll may well work.
			t.Stop()
		case <-pollCtx.Done():
			t.Stop()
			return
		}
	}
}

// work runs the messages of d, and those their settles lease in turn, until a settle leases none;
// d is then what the last settle gave. It returns true if the worker began to stop meanwhile: the
// messages left are given back. While it runs the worker counts as busy (Stop).
func (w *Worker) work(pollCtx, jobCtx context.Context, d *dequeued) (stopped bool) {
	w.running.Add(1)
	defer w.running.Add(-1)
	for len(d.msgs) > 0 {
		if pollCtx.Err() != nil {
			w.giveBack(jobCtx, d.msgs) // leased by a settle as the worker began to stop
			return true
		}
		m, rest := d.msgs[0], d.msgs[1:]
		*d = w.process(pollCtx, jobCtx, &m, d.retried, d.leasedAfter())
		d.msgs = append(rest, d.msgs...)
	}
	return false
}

// The errors of the releases a stopping worker makes, as History shows them.
const (
	unprocessed = "natstone worker stopped before it ran the message"
	interrupted = "natstone worker stopped while its handler ran"
)

// giveBack releases msgs at once, unprocessed, giving their attempts back.
func (w *Worker) giveBack(jobCtx context.Context, msgs []Message) {
	for _, m := range msgs {
		log := w.log.With("queue", m.Queue, "message_id", m.ID, "lease_id", m.LeaseID)
		log.Info("message released unprocessed: worker stopped")
		expires := time.Now().Add(m.LeaseExpiresAt.Sub(m.UpdatedAt)) // as process reckons it
		w.finish(jobCtx, "release", expires, log, func(ctx context.Context) error {
			_, err := w.client.Release(ctx, m.Queue, m.ID, m.LeaseID, &ReleaseOpts{Error: unprocessed, Refund: true})
			return err
		})
	}
}

// next returns the dequeue a settle carries: the slot's next message, unless the worker is stopping.
func (w *Worker) next(pollCtx context.Context) *DequeueOpts {
	if pollCtx.Err() != nil {
		return nil
	}
	return &DequeueOpts{Batch: 1, Lease: w.cfg.Lease, Filter: w.cfg.Filter, RequestID: nuid.Next(), Worker: w.cfg.Name}
}

// dequeued is what a slot's dequeue (a poll, or the one a settle carries) gave.
type dequeued struct {
	msgs []Message
	// retried: the messages came back to a dequeue sent again with its request id, so their leases
	// may have run for a while already: since sent, at the earliest.
	retried bool
	sent    time.Time // when the dequeue's request id was first sent
	// settle: a settle's dequeue (CompleteNext, ReleaseNext), which does not wait, so its leases
	// began after sent, and just after it unless retried.
	settle bool
	// uncertain is a dequeue whose outcome is unknown (it timed out, or the broker answered
	// unavailable): it may have leased a message whose reply was lost. The slot's next poll sends
	// its id again, and the broker then returns that lease instead of leasing another message and
	// leaving the first to expire unprocessed.
	uncertain requestTry
}

// leasedAfter returns when d's leases began at the earliest, as their ends must be reckoned while the
// broker cannot be reached (a handler told its lease is lost no later than it is): when d was first
// sent, for a retried dequeue or a settle's; zero for a poll's first try, which may have waited at
// the broker for most of its PollWait before it leased (its leases are reckoned from its reply).
func (d *dequeued) leasedAfter() time.Time {
	if d.retried || d.settle {
		return d.sent
	}
	return time.Time{}
}

// requestTry is a dequeue's request id, and when it was first sent.
type requestTry struct {
	id   string
	sent time.Time
}

// poll long-polls for one message, with the request id of retry (a new one if none). A dequeue
// whose outcome is unknown is sent again at once with the same id (said at DEBUG if the worker's
// polls fail already, and say so; else at INFO for the first of the worker's polls cut as parked
// at a broker that may be gone in quiet, at WARN for the first of the others, DEBUG for the rest);
// if that fails too, it is returned as uncertain.
func (w *Worker) poll(ctx context.Context, retry requestTry) (dequeued, error) {
	d := dequeued{retried: retry.id != "", sent: retry.sent}
	id := retry.id
	if id == "" {
		id, d.sent = nuid.Next(), time.Now()
	}
	opts := &DequeueOpts{
		Batch:     1,
		Lease:     w.cfg.Lease,
		Wait:      w.cfg.PollWait,
		Filter:    w.cfg.Filter,
		RequestID: id,
		Worker:    w.cfg.Name,
	}
	var err error
	d.msgs, err = w.client.Dequeue(ctx, w.cfg.Queue, opts)
	if unknownOutcome(err) && ctx.Err() == nil {
		level := slog.LevelDebug
		switch {
		case errors.Is(err, ErrPollCut):
			level = w.cutLevel()
		case !w.pollsFailed.on() && sayOnce(&w.unknownSaid):
			level = slog.LevelWarn
		}
		w.log.Log(ctx, level, "dequeue's outcome unknown; retrying it", "queue", w.cfg.Queue, "request_id", id, "error", err)
		d.msgs, err = w.client.Dequeue(ctx, w.cfg.Queue, opts)
		d.retried = true
	}
	if err != nil && ctx.Err() != nil {
		// The worker stops, and leaves the poll (the first try, or its retry): it must lease
		// nothing for it, and give back what it leased.
		w.abandon(ctx, id)
		return d, err
	}
	// A try that reached no broker at all after one whose outcome is unknown (a broker stopping,
	// the next not serving yet) leaves that outcome unknown: the id goes with the next poll.
	if unknownOutcome(err) || d.retried && errors.Is(err, nats.ErrNoResponders) {
		d.uncertain = requestTry{id: id, sent: d.sent}
	}
	return d, err
}

// isClosed reports whether ch is closed.
func isClosed(ch <-chan struct{}) bool {
	select {
	case <-ch:
		return true
	default:
		return false
	}
}

// abandon ends the dequeue with request id id that the worker left as it stopped (Client.Abandon),
// with a try of at most stopSettleTimeout: a long poll still waiting at the broker would otherwise
// lease a message that then stays running, unprocessed, until its lease ends.
func (w *Worker) abandon(ctx context.Context, id string) {
	ctx, cancel := context.WithTimeout(context.WithoutCancel(ctx), stopSettleTimeout)
	defer cancel()
	released, err := w.client.Abandon(ctx, w.cfg.Queue, id)
	switch {
	case err != nil:
		w.log.Warn("the abandon of the dequeue left at the stop was not confirmed: should it not have landed, a message the dequeue leases stays running until its lease ends", "queue", w.cfg.Queue, "request_id", id, "error", err)
	case len(released) > 0:
		w.log.Info("the dequeue left at the stop had leased messages: given back", "queue", w.cfg.Queue, "request_id", id, "messages", released)
	}
}

// quiet is how long after a poll cut, or one of unknown outcome, said at INFO or WARN the worker's
// next ones of the kind are said at DEBUG.
const quiet = 10 * time.Second

// sayOnce reports whether one now of the kind said last at *said (Unix ns) is said: the first in
// quiet. It records it.
func sayOnce(said *atomic.Int64) bool {
	now := time.Now().UnixNano()
	last := said.Load()
	return now-last >= int64(quiet) && said.CompareAndSwap(last, now)
}

// cutLevel is the level a poll cut now is said at: INFO for the first in quiet (once per restart
// or takeover, which the retries mend), DEBUG for the others.
func (w *Worker) cutLevel() slog.Level {
	if sayOnce(&w.cutSaid) {
		return slog.LevelInfo
	}
	return slog.LevelDebug
}

// unknownOutcome reports whether a dequeue that failed with err may have leased messages: no reply
// in time, or a broker that answered unavailable (a write's outcome unknown, or a payload unread).
func unknownOutcome(err error) bool {
	return errors.Is(err, nats.ErrTimeout) || errors.Is(err, ErrUnavailable)
}

// notAnswered reports whether a request that failed with err may have been carried out: unknownOutcome,
// or its context ended first (Stop's cut of a settle's last try, tryCtx), the request perhaps sent.
func notAnswered(err error) bool {
	return unknownOutcome(err) || errors.Is(err, context.Canceled) || errors.Is(err, context.DeadlineExceeded)
}

// process runs the handler on m while extending its lease, then settles m. The slot's goroutine
// supervises its own job: each job has exactly one extension timer, and the extensions of different
// jobs never wait for one another (a shared ticker would serialise them behind the slowest request).
// It returns once the handler has returned, with what the settle's dequeue of the slot's next message
// gave. m's lease began at since at the earliest, or, if since is zero, when its reply came. A
// message that came back to a retried dequeue (retried) may have run for a while before the retry:
// its lease is extended before its handler starts, which does not start if the broker says the
// lease is lost, or if the extension fails and that reckoning says its end has passed.
func (w *Worker) process(pollCtx, jobCtx context.Context, m *Message, retried bool, since time.Time) dequeued {
	leased := since // at the earliest, as its end must be reckoned
	if leased.IsZero() {
		leased = time.Now() // a poll that may have waited at the broker: when it came, at the latest
	}
	lease := w.cfg.Lease
	if lease == 0 {
		// The lease the broker chose: both stamps come from its clock at the dequeue.
		lease = m.LeaseExpiresAt.Sub(m.UpdatedAt)
	}
	lease = max(lease, subjects.MinLease)
	every := w.cfg.ExtendEveryFunc(lease)
	if every <= 0 || every >= lease {
		every = lease / 3
	}
	// expires is when the lease ends as the worker reckons it (from leased); it only matters while the
	// broker cannot be reached: the handler is told the lease is lost then, and settles are tried
	// until then.
	expires := leased.Add(lease)
	log := w.log.With("queue", m.Queue, "message_id", m.ID, "lease_id", m.LeaseID, "attempt", m.Attempts)
	job := &Job{Message: *m, client: w.client}

	first := every
	if retried {
		var lost bool
		if first, lost = w.extend(jobCtx, job, lease, every, &expires, true, log); lost {
			log.Warn("message not run: its lease, from a retried dequeue, could not be confirmed")
			return dequeued{}
		}
	}

	canceled := w.watch(job.LeaseID)
	defer w.unwatch(job.LeaseID)
	hctx, cancel := context.WithCancelCause(jobCtx)
	defer cancel(nil)
	if w.cfg.Timeout > 0 {
		var stop context.CancelFunc
		hctx, stop = context.WithTimeoutCause(hctx, w.cfg.Timeout, ErrHandlerTimeout)
		defer stop()
	}
	result := make(chan outcome, 1)
	w.handlers.Add(1)
	go func() {
		o := outcome{err: errGoexit}
		defer func() {
			w.handlers.Add(-1)
			result <- o
		}() // also when the handler calls runtime.Goexit
		o.err = w.run(hctx, job, log)
		o.stopped = errors.Is(context.Cause(hctx), ErrWorkerStopped)
	}()

	timer := time.NewTimer(first)
	defer timer.Stop()
	for {
		select {
		case o := <-result:
			return w.settle(pollCtx, jobCtx, hctx, job, o, expires, log)
		case <-timer.C:
		case <-canceled:
			// Someone canceled the message, an event says: extend now, and the refusal, if the
			// event was true, ends the handler below.
		case <-jobCtx.Done():
			// Stop gave up waiting, and the handler's context has ended: a handler that keeps to it
			// returns in moments, and its message is released then, not while it still runs (in an
			// exclusive queue, the next message of its value would run alongside). Nothing extends
			// the lease meanwhile, so the wait takes at most half of what is left of it: the
			// release must land before the lease ends, or the attempt is spent.
			wait := time.NewTimer(min(stopSettleTimeout, time.Until(expires)/2))
			select {
			case o := <-result:
				wait.Stop()
				return w.settle(pollCtx, jobCtx, hctx, job, o, expires, log)
			case <-wait.C:
			}
			// A handler that ignores its context: hand the message back now rather than when it
			// returns, which may be never.
			w.releaseUnreturned(jobCtx, job, expires, log)
			o := <-result
			log.Info("handler interrupted: worker stopped", "error", o.err)
			return dequeued{}
		}
		select {
		case o := <-result: // returned meanwhile: settle rather than extend first
			return w.settle(pollCtx, jobCtx, hctx, job, o, expires, log)
		default:
		}
		next, lost := w.extend(jobCtx, job, lease, every, &expires, false, log)
		if lost {
			cancel(ErrLeaseLost)
			o := <-result
			log.Warn("handler result ignored: lease lost", "error", o.err)
			return dequeued{}
		}
		if next > 0 {
			timer.Reset(next)
		}
	}
}

// outcome is what a handler returned, and whether the worker's stop had ended its context by then.
type outcome struct {
	err     error
	stopped bool
}

// errGoexit is the result of a handler that called runtime.Goexit (t.FailNow in a test, say)
// rather than return.
var errGoexit = errors.New("natstone: handler exited without returning (runtime.Goexit)")

// run calls the handler and its middleware, turning a panic into an error: the handler's, which the
// middleware sees as a *PanicError, or a middleware's own.
func (w *Worker) run(ctx context.Context, job *Job, log *slog.Logger) error {
	err := recovering{w.handler}.Handle(ctx, job)
	if pe, ok := errors.AsType[*PanicError](err); ok {
		log.Error("handler panicked", "panic", pe.Value, "stack", string(pe.Stack))
	}
	return err
}

// recovering turns the panic of the handler it wraps into a *PanicError.
type recovering struct{ h Handler }

func (r recovering) Handle(ctx context.Context, job *Job) (err error) {
	defer func() {
		if v := recover(); v != nil {
			err = &PanicError{Value: v, Stack: debug.Stack()}
		}
	}()
	return r.h.Handle(ctx, job)
}

// extend pushes job's lease to lease from now. It returns when to extend next (0: never, the handler
// settled the message itself) or lost when the lease is gone. retried is for the extension of a
// lease a retried dequeue returned, before its handler starts: its end, reckoned from the dequeue's
// first try, may be past already though the broker holds it still (it said so), so that extension
// has a request timeout whatever; if it fails, the lease counts as lost (and no handler runs) when
// the broker says so, or when that end has passed.
func (w *Worker) extend(jobCtx context.Context, job *Job, lease, every time.Duration, expires *time.Time, retried bool, log *slog.Logger) (next time.Duration, lost bool) {
	if err := job.lock(jobCtx); err != nil {
		return every, false // stopping: process sees jobCtx done
	}
	defer job.unlock()
	if job.isSettled() {
		return 0, false
	}
	// An answer after the lease's end would come too late to matter.
	deadline := *expires
	if d := time.Now().Add(w.client.timeout); retried && d.After(deadline) {
		deadline = d
	}
	ctx, cancel := context.WithDeadline(jobCtx, deadline)
	defer cancel()
	sent := time.Now()
	_, err := w.client.Extend(ctx, job.Queue, job.ID, job.LeaseID, lease)
	switch {
	case err == nil:
		*expires = sent.Add(lease)
		return max(every-time.Since(sent), time.Millisecond), false // counted from when it was sent, as the lease is
	case isLeaseLost(err):
		log.Warn("lease lost", "error", err)
		return 0, true
	case jobCtx.Err() != nil:
		return every, false // stopping: process sees jobCtx done
	}
	left := time.Until(*expires)
	if left <= 0 {
		log.Warn("lease lost: not extended before its end", "error", err)
		return 0, true
	}
	retry := extendRetry(every, left)
	log.Warn("lease extension failed; retrying", "error", err, "retry_in", retry)
	return retry, false
}

// settle completes, cancels or releases job by the handler's result o. A complete, and the release
// of a failed attempt, also dequeue the slot's next message (see next), which settle returns.
func (w *Worker) settle(pollCtx, jobCtx, hctx context.Context, job *Job, o outcome, expires time.Time, log *slog.Logger) dequeued {
	err := o.err
	if job.isSettled() {
		log.Debug("handler canceled the message", "error", err)
		return dequeued{}
	}
	next := w.next(pollCtx) // one request id for every try
	sent := time.Now()
	var got dequeued
	tries := 0
	keep := func(s Settled, err error) {
		tries++
		uncertain := got.uncertain // a try that failed outright says nothing of an earlier one's dequeue
		switch {
		case notAnswered(err) || unknownOutcome(s.NextErr):
			uncertain = requestTry{id: next.RequestID, sent: sent}
		case err == nil && s.NextErr == nil:
			uncertain = requestTry{} // this try's next is what the request id leased
		}
		got = dequeued{msgs: s.Next, retried: tries > 1, sent: sent, settle: true, uncertain: uncertain}
		if s.NextErr != nil {
			log.Debug("dequeue after the settle failed; the slot polls", "error", s.NextErr)
		}
	}
	release := func(opts *ReleaseOpts) {
		w.finish(jobCtx, "release", expires, log, func(ctx context.Context) error {
			if next == nil {
				_, err := w.client.Release(ctx, job.Queue, job.ID, job.LeaseID, opts)
				return err
			}
			s, err := w.client.ReleaseNext(ctx, job.Queue, job.ID, job.LeaseID, opts, next)
			keep(s, err)
			return err
		})
	}
	snooze, snoozed := errors.AsType[*SnoozeError](err)
	switch {
	case o.stopped:
		// Returned once the stop ended its context: interrupted, not failing (no backoff), as far
		// as anyone can tell (a handler that stops short often returns nil), so given back
		// whatever it returned, as it is when it returns a moment later (process releases the
		// message at once then). A result from before the stop is the handler's to decide.
		log.Info("handler interrupted: worker stopped; message released, its attempt given back", "error", err)
		w.releaseInterrupted(jobCtx, job, expires, log)
	case err == nil:
		w.finish(jobCtx, "complete", expires, log, func(ctx context.Context) error {
			if next == nil {
				_, err := w.client.Complete(ctx, job.Queue, job.ID, job.LeaseID)
				return err
			}
			s, err := w.client.CompleteNext(ctx, job.Queue, job.ID, job.LeaseID, next)
			keep(s, err)
			return err
		})
	case errors.Is(err, ErrDiscard):
		log.Info("handler discarded the message", "error", err)
		why := FailureText(err) // its history says why
		w.finish(jobCtx, "cancel", expires, log, func(ctx context.Context) error {
			_, err := w.client.CancelWith(ctx, job.Queue, job.ID, job.LeaseID, &CancelOpts{Error: why})
			return err
		})
	case snoozed:
		delay := min(max(snooze.Delay, minSnooze), subjects.MaxInvisible)
		log.Info("handler snoozed the message", "for", delay)
		why := FailureText(err) // the handler's own words, if it wrapped the snooze
		if delay != snooze.Delay {
			why = (&SnoozeError{Delay: delay}).Error() // what it got, not what it asked
		}
		release(&ReleaseOpts{Delay: delay, Refund: true, Error: why})
	default:
		if errors.Is(context.Cause(hctx), ErrHandlerTimeout) {
			if err == ErrHandlerTimeout { //nolint:errorlint // the handler returned its context's cause, bare (a join or a wrap of it says more)
				err = fmt.Errorf("%w after %v", ErrHandlerTimeout, w.cfg.Timeout)
			} else {
				err = fmt.Errorf("%w after %v: %w", ErrHandlerTimeout, w.cfg.Timeout, err)
			}
		}
		delay := min(max(w.cfg.BackoffFunc(job.Attempts), 0), subjects.MaxInvisible)
		if job.AttemptsLeft == 0 {
			log.Error("handler failed; no attempts left, the message is errored", "error", err)
		} else {
			log.Warn("handler failed; message released", "error", err, "retry_in", delay)
		}
		release(&ReleaseOpts{Delay: delay, Error: FailureText(err)})
	}
	return got
}

// releaseUnreturned releases the message of a handler that has not returned since the worker's
// stop ended its context, unless the handler canceled the message. It holds the job's lease
// semaphore meanwhile, so that the release does not race a Cancel of the handler's in flight (and
// undo it, should it land first); a Cancel that is still unanswered after stopSettleTimeout leaves
// the message to it.
func (w *Worker) releaseUnreturned(jobCtx context.Context, job *Job, expires time.Time, log *slog.Logger) {
	ctx, cancel := context.WithTimeout(context.WithoutCancel(jobCtx), stopSettleTimeout)
	defer cancel()
	if err := job.lock(ctx); err != nil {
		log.Warn("message not released at the stop: its handler's cancel of it is still unanswered")
		return
	}
	defer job.unlock()
	if !job.isSettled() {
		w.releaseInterrupted(jobCtx, job, expires, log)
	}
}

// releaseInterrupted releases the message of a handler the worker's stop interrupted, with its
// attempt given back: the handler was stopped, it did not fail.
func (w *Worker) releaseInterrupted(jobCtx context.Context, job *Job, expires time.Time, log *slog.Logger) {
	w.finish(jobCtx, "release", expires, log, func(ctx context.Context) error {
		_, err := w.client.Release(ctx, job.Queue, job.ID, job.LeaseID, &ReleaseOpts{Error: interrupted, Refund: true})
		return err
	})
}

// finish runs op (a complete, release or cancel of the job's lease) and retries it while the broker
// cannot be reached and the lease may still be held (a broker's restart, or a standby taking over,
// takes seconds), with backoff (100 ms doubling to settleRetryMax). Each of these is idempotent for the same lease. It runs
// even when the worker is stopping, a finished handler's result being worth recording; but once
// Stop's ctx is done (jobCtx), the try in flight, or else one more, is the last, and has at most
// stopSettleTimeout from then.
func (w *Worker) finish(jobCtx context.Context, what string, expires time.Time, log *slog.Logger, op func(context.Context) error) {
	for try := 1; ; try++ {
		ctx, cancel := tryCtx(jobCtx)
		err := op(ctx)
		cancel()
		stopping := jobCtx.Err() != nil // then that try was the last
		switch {
		case err == nil:
			if try > 1 {
				log.Info(what+" landed", "tries", try)
			}
			return
		case isLeaseLost(err):
			log.Warn(what+" refused: lease lost", "error", err)
			return
		case retryable(err) && time.Now().Before(expires) && !stopping:
			d := min(exponential(try, pollRetryBase, settleRetryMax), max(time.Until(expires), time.Millisecond))
			log.Log(jobCtx, failureLevel(try), what+" failed; retrying", "error", err, "tries", try, "retry_in", d)
			t := time.NewTimer(d)
			select {
			case <-t.C:
			case <-jobCtx.Done(): // Stop's time is up: the last, short try at once
				t.Stop()
			}
		case notAnswered(err):
			// Sent, its answer not had (the connection may hold it until it reconnects): it may
			// land yet, and if it does not, the lease ends on its own.
			log.Warn(what+" not confirmed: it may land yet; if not, the lease ends on its own", "error", err, "lease_ends", expires)
			w.unsettled.Add(1)
			return
		default:
			log.Error(what+" failed", "error", err)
			w.unsettled.Add(1)
			return
		}
	}
}

// tryCtx returns the context of one try of a settle. It outlives jobCtx by stopSettleTimeout: a try
// sent after Stop's ctx is done has that long, and so has one still in flight then (were it cut at
// once, its message would neither be settled nor released; were it left to its request timeout,
// Stop would overrun its ctx by that much).
func tryCtx(jobCtx context.Context) (context.Context, context.CancelFunc) {
	ctx, cancel := context.WithCancel(context.WithoutCancel(jobCtx))
	stop := context.AfterFunc(jobCtx, func() {
		t := time.AfterFunc(stopSettleTimeout, cancel)
		context.AfterFunc(ctx, func() { t.Stop() })
	})
	return ctx, func() { stop(); cancel() }
}

// retryable reports whether a request may succeed if sent again: no reply in time, no broker, or a
// broker that said to retry.
func retryable(err error) bool {
	return errors.Is(err, nats.ErrTimeout) || errors.Is(err, nats.ErrNoResponders) || errors.Is(err, ErrUnavailable)
}
