package workers_test

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"log/slog"
	"runtime"
	"slices"
	"strings"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/nats-io/nats-server/v2/server"
	"github.com/nats-io/nats.go"

	"github.com/natstone/natstone/kv"
	"github.com/natstone/natstone/subjects"
	"github.com/natstone/natstone/test/natstest"
	"github.com/natstone/natstone/workers"
)

func TestNewWorkerValidates(t *testing.T) {
	t.Parallel()
	srv := natstest.Start(t, nil)
	c, err := workers.NewClient(srv.Connect(t), nil)
	if err != nil {
		t.Fatal(err)
	}
	h := workers.HandlerFunc(func(context.Context, *workers.Job) error { return nil })
	tests := []struct {
		name     string
		cfg      *workers.WorkerConfig
		field    string
		sentinel error // for a value the broker would refuse too: its code's
	}{
		{"nil config", nil, "WorkerConfig", nil},
		{"no queue", &workers.WorkerConfig{}, "WorkerConfig.Queue", workers.ErrInvalidQueueName},
		{"bad queue", &workers.WorkerConfig{Queue: "a.b"}, "WorkerConfig.Queue", workers.ErrInvalidQueueName},
		{"negative concurrency", &workers.WorkerConfig{Queue: "q", Concurrency: -1}, "WorkerConfig.Concurrency", nil},
		{"negative timeout", &workers.WorkerConfig{Queue: "q", Timeout: -time.Second}, "WorkerConfig.Timeout", nil},
		{"bad filter", &workers.WorkerConfig{Queue: "q", Filter: map[string]string{"": "x"}}, "WorkerConfig.Filter", workers.ErrInvalidMetadata},
		{"short lease", &workers.WorkerConfig{Queue: "q", Lease: 99 * time.Millisecond}, "WorkerConfig.Lease", workers.ErrOutOfRange},
		{"long lease", &workers.WorkerConfig{Queue: "q", Lease: 25 * time.Hour}, "WorkerConfig.Lease", workers.ErrOutOfRange},
		{"sub-ms poll wait", &workers.WorkerConfig{Queue: "q", PollWait: time.Microsecond}, "WorkerConfig.PollWait", workers.ErrOutOfRange},
		{"long poll wait", &workers.WorkerConfig{Queue: "q", PollWait: subjects.MaxWait + time.Millisecond}, "WorkerConfig.PollWait", workers.ErrOutOfRange},
		{"nil middleware", &workers.WorkerConfig{Queue: "q", Middleware: []workers.Middleware{nil}}, "WorkerConfig.Middleware[0]", nil},
		{"long name", &workers.WorkerConfig{Queue: "q", Name: strings.Repeat("n", subjects.MaxWorkerLen+1)}, "WorkerConfig.Name", workers.ErrBadRequest},
		{"wildcard events", &workers.WorkerConfig{Queue: "q", Events: "natstone.>"}, "WorkerConfig.Events", nil},
		{"empty events token", &workers.WorkerConfig{Queue: "q", Events: "natstone..events"}, "WorkerConfig.Events", nil},
	}
	for _, tc := range tests {
		_, err := workers.NewWorker(c, tc.cfg, h)
		if err == nil || !strings.Contains(err.Error(), tc.field) || strings.Count(err.Error(), "natstone:") != 1 {
			t.Errorf("%s: err = %v, want one naming %s (natstone: once)", tc.name, err, tc.field)
		}
		if tc.sentinel != nil && !errors.Is(err, tc.sentinel) {
			t.Errorf("%s: err = %v, want it to match %v", tc.name, err, tc.sentinel)
		}
	}
	if _, err := workers.NewWorker(nil, &workers.WorkerConfig{Queue: "q"}, h); err == nil {
		t.Error("nil client accepted")
	}
	if _, err := workers.NewWorker(c, &workers.WorkerConfig{Queue: "q"}, nil); err == nil {
		t.Error("nil handler accepted")
	}
	if _, err := workers.NewWorker(c, &workers.WorkerConfig{Queue: "q"}, workers.HandlerFunc(nil)); err == nil {
		t.Error("nil HandlerFunc accepted")
	}

	// Stopped before it started (a shutdown that came first), a worker does not start.
	w, err := workers.NewWorker(c, &workers.WorkerConfig{Queue: "q", Logger: discard()}, h)
	if err != nil {
		t.Fatal(err)
	}
	if err := w.Stop(ctx(t)); err != nil {
		t.Fatalf("Stop before Start: %v", err)
	}
	if err := w.Start(ctx(t)); err == nil || !strings.Contains(err.Error(), "runs once") {
		t.Fatalf("Start after Stop: %v, want refused", err)
	}

	if w, err = workers.NewWorker(c, &workers.WorkerConfig{Queue: "q", Logger: discard()}, h); err != nil {
		t.Fatal(err)
	}
	if err := w.Start(ctx(t)); err != nil {
		t.Fatal(err)
	}
	if err := w.Start(ctx(t)); err == nil {
		t.Error("second Start succeeded")
	}
	stop(t, w)
	stop(t, w) // idempotent
}

// TestDefaultEvents holds DefaultEvents to the events' subjects of a broker with the default
// --store-prefix.
func TestDefaultEvents(t *testing.T) {
	if want := kv.DefaultPrefix + ".events"; workers.DefaultEvents != want {
		t.Fatalf("DefaultEvents = %q, the broker publishes under %q", workers.DefaultEvents, want)
	}
}

func TestWorkerCompletes(t *testing.T) {
	t.Parallel()
	e := setup(t)
	e.createQueue("q", nil)
	e.enqueue("q", "hello", &workers.EnqueueOpts{ID: "m1", Metadata: map[string]string{"k": "v"}})
	got := make(chan workers.Message, 1)
	e.startWorker(&workers.WorkerConfig{Queue: "q"}, workers.HandlerFunc(func(_ context.Context, job *workers.Job) error {
		got <- job.Message
		return nil
	}))
	m := recv(t, got)
	if m.ID != "m1" || string(m.Payload) != "hello" || m.Attempts != 1 || m.Metadata["k"] != "v" || m.State != subjects.StateRunning {
		t.Fatalf("handler got %+v", m)
	}
	done := e.waitState("q", "m1", subjects.StateCompleted)
	if done.Attempts != 1 {
		t.Fatalf("completed with %d attempts, want 1", done.Attempts)
	}
}

// TestWorkerExtendsLease runs a handler for longer than its lease: the worker keeps the lease, the
// message is never given to anyone else, and it is completed on the first attempt. Extensions come
// every tenth of the lease, so only a stall of most of a lease (real time) could lose it.
func TestWorkerExtendsLease(t *testing.T) {
	t.Parallel()
	e := setup(t)
	const lease = time.Second
	e.createQueue("q", &workers.QueueOpts{Lease: lease})
	e.enqueue("q", "slow", &workers.EnqueueOpts{ID: "m1"})
	extends := e.count(subjects.OpExtend, "q")
	started := make(chan string, 1)
	gate := make(chan struct{})
	var ctxErr atomic.Value
	e.startWorker(&workers.WorkerConfig{Queue: "q", ExtendEveryFunc: func(l time.Duration) time.Duration { return l / 10 }}, workers.HandlerFunc(func(ctx context.Context, job *workers.Job) error {
		started <- job.LeaseID
		awaitGate(ctx, gate)
		if err := ctx.Err(); err != nil {
			ctxErr.Store(err)
		}
		return nil
	}))
	leaseID := recv(t, started)
	// Thirty extensions at lease/10 span three leases: without them, the lease would have run out
	// twice, even with the broker's expiry a second late.
	reqs := extends.wait(t, 30)
	for _, r := range reqs {
		x := decode[subjects.ExtendRequest](t, r.Data)
		if x.ID != "m1" || x.LeaseID != leaseID || x.LeaseMS != lease.Milliseconds() {
			t.Fatalf("extend request %+v, want m1 under %s for %dms", x, leaseID, lease.Milliseconds())
		}
	}
	if m := e.get("q", "m1"); m.State != subjects.StateRunning || m.LeaseID != leaseID || m.Attempts != 1 {
		t.Fatalf("while the handler runs: %+v", m)
	}
	close(gate)
	m := e.waitState("q", "m1", subjects.StateCompleted)
	if m.Attempts != 1 {
		t.Fatalf("completed after %d attempts, want 1: the lease was lost", m.Attempts)
	}
	if err := ctxErr.Load(); err != nil {
		t.Fatalf("handler context ended: %v", err)
	}
}

// TestWorkerLeaseLost: someone else cancels the message while its handler runs, on a worker that
// hears no cancel events (its Events names a prefix nothing publishes on): the next extension
// finds the lease gone, the handler's context is cancelled with ErrLeaseLost, and the worker does
// not complete the message.
func TestWorkerLeaseLost(t *testing.T) {
	t.Parallel()
	if n := cancelRunning(t, 300*time.Millisecond, "elsewhere.events"); n < 1 {
		t.Fatalf("%d extensions, want the one that found the lease gone", n)
	}
}

// TestWorkerHearsOfACancel cancels a running message as an operator would, without its lease, on a
// queue whose lease is an hour: the worker's next extension is twenty minutes off, so only the
// canceled event can end the handler within the test's wait. The event prompts one extension, whose
// refusal ends the handler (cause ErrLeaseLost) and leaves the message alone.
func TestWorkerHearsOfACancel(t *testing.T) {
	t.Parallel()
	if n := cancelRunning(t, time.Hour, ""); n != 1 {
		t.Fatalf("%d extensions, want the one the cancel's event prompted", n)
	}
}

// cancelRunning runs a handler that waits for its context on a queue of lease, on a worker with
// events, cancels its message without the lease, and checks that the handler's context ends with
// ErrLeaseLost and that the worker then settles nothing. It returns the extensions the worker sent.
func cancelRunning(t *testing.T, lease time.Duration, events string) int {
	e := setup(t)
	e.createQueue("q", &workers.QueueOpts{Lease: lease})
	e.enqueue("q", "doomed", &workers.EnqueueOpts{ID: "m1"})
	extends := e.count(subjects.OpExtend, "q")
	settles := []*counter{e.count(subjects.OpComplete, "q"), e.count(subjects.OpRelease, "q")}
	started := make(chan struct{}, 1)
	cause := make(chan error, 1)
	w := e.startWorker(&workers.WorkerConfig{Queue: "q", Events: events}, workers.HandlerFunc(func(ctx context.Context, _ *workers.Job) error {
		started <- struct{}{}
		<-ctx.Done()
		cause <- context.Cause(ctx)
		return nil // a result for a lost lease is ignored
	}))
	recv(t, started)
	if _, err := e.c.Cancel(ctx(t), "q", "m1", ""); err != nil {
		t.Fatal(err)
	}
	if err := recv(t, cause); !errors.Is(err, workers.ErrLeaseLost) {
		t.Fatalf("context.Cause = %v, want ErrLeaseLost", err)
	}
	stop(t, w)
	for _, c := range settles {
		if n := c.n(t); n != 0 {
			t.Fatalf("%d completes or releases after the cancel, want none", n)
		}
	}
	if m := e.get("q", "m1"); m.State != subjects.StateCanceled {
		t.Fatalf("state = %s, want canceled", m.State)
	}
	return extends.n(t)
}

// TestWorkerStrayCancelEvent publishes a canceled event that names a running handler's lease while
// nobody canceled its message (anyone allowed to publish on the events' subjects could): it costs
// one extension, which succeeds, and the handler runs on and completes the message.
func TestWorkerStrayCancelEvent(t *testing.T) {
	t.Parallel()
	e := setup(t)
	e.createQueue("q", &workers.QueueOpts{Lease: time.Hour})
	e.enqueue("q", "fine", &workers.EnqueueOpts{ID: "m1"})
	extends := e.count(subjects.OpExtend, "q")
	leased := make(chan *workers.Job, 1)
	proceed := make(chan struct{})
	ended := make(chan error, 1)
	w := e.startWorker(&workers.WorkerConfig{Queue: "q"}, workers.HandlerFunc(func(ctx context.Context, job *workers.Job) error {
		leased <- job
		<-proceed
		ended <- context.Cause(ctx)
		return nil
	}))
	job := recv(t, leased)
	ev, err := json.Marshal(subjects.Event{Queue: "q", ID: "m1", Kind: subjects.EventCanceled, State: subjects.StateCanceled,
		PrevState: subjects.StateRunning, LeaseID: job.LeaseID, Version: job.Version + 1})
	if err != nil {
		t.Fatal(err)
	}
	nc := e.srv.Connect(t)
	if err := nc.Publish(workers.DefaultEvents+".q.canceled.bTE", ev); err != nil {
		t.Fatal(err)
	}
	waitFor(t, "the extension the stray event prompts", func() bool { return extends.n(t) == 1 })
	close(proceed)
	if err := recv(t, ended); err != nil {
		t.Fatalf("the handler's context ended (%v) though its lease held", err)
	}
	stop(t, w)
	if m := e.get("q", "m1"); m.State != subjects.StateCompleted {
		t.Fatalf("state = %s, want completed", m.State)
	}
}

// TestWorkerStartedBeforeItsQueue starts a worker on a queue nobody created yet: it says so once,
// at WARN, keeps polling (every second at most, TestPollRetry), and runs the queue's first message
// once a producer's enqueue has created the queue.
func TestWorkerStartedBeforeItsQueue(t *testing.T) {
	t.Parallel()
	e := setup(t)
	polls := e.count(subjects.OpDequeue, "q")
	var logs natstest.LogBuffer
	ran := make(chan string, 1)
	w := e.startWorker(&workers.WorkerConfig{Queue: "q", Logger: slogTo(&logs)}, workers.HandlerFunc(func(_ context.Context, job *workers.Job) error {
		ran <- job.ID
		return nil
	}))
	waitFor(t, "three polls of the missing queue", func() bool { return polls.n(t) >= 3 })
	e.enqueue("q", "first", &workers.EnqueueOpts{ID: "m1"}) // creates the queue
	if id := recv(t, ran); id != "m1" {
		t.Fatalf("ran %s, want m1", id)
	}
	stop(t, w)
	if n := strings.Count(logs.String(), "level=WARN msg=\"queue not found"); n != 1 {
		t.Fatalf("%d WARNs of the missing queue, want 1:\n%s", n, logs.String())
	}
}

// TestWorkerReleasesWithBackoff fails every attempt: each failure releases the message invisible
// for the backoff, the next attempt comes when it is pending again, and after max_attempts it is
// errored. The broker runs on a fake clock, so the invisibility ends exactly when the test says.
func TestWorkerReleasesWithBackoff(t *testing.T) {
	t.Parallel()
	e := setupFake(t)
	e.createQueue("q", &workers.QueueOpts{MaxAttempts: 3})
	e.enqueue("q", "flaky", &workers.EnqueueOpts{ID: "m1"})
	const delay = 700 * time.Millisecond
	var mu sync.Mutex
	var backoffs, attempts []int
	e.startWorker(&workers.WorkerConfig{
		Queue: "q",
		BackoffFunc: func(attempt int) time.Duration {
			mu.Lock()
			defer mu.Unlock()
			backoffs = append(backoffs, attempt)
			return delay
		},
	}, workers.HandlerFunc(func(_ context.Context, job *workers.Job) error {
		mu.Lock()
		defer mu.Unlock()
		attempts = append(attempts, job.Attempts)
		return fmt.Errorf("attempt %d failed", job.Attempts)
	}))
	for attempt := 1; attempt <= 2; attempt++ {
		var m workers.Message
		waitFor(t, fmt.Sprintf("attempt %d released", attempt), func() bool {
			m = e.get("q", "m1")
			return m.State == subjects.StateInvisible && m.Attempts == attempt
		})
		if d := m.VisibleAt.Sub(m.UpdatedAt); d != delay {
			t.Fatalf("attempt %d: invisible for %v, want the backoff %v", attempt, d, delay)
		}
		e.clk.Advance(delay - time.Millisecond)
		if m := e.get("q", "m1"); m.State != subjects.StateInvisible {
			t.Fatalf("attempt %d: %s before the backoff ended", attempt, m.State)
		}
		e.clk.Advance(time.Millisecond)
	}
	m := e.waitState("q", "m1", subjects.StateErrored)
	if m.Attempts != 3 || m.AttemptsLeft != 0 {
		t.Fatalf("errored with %+v", m)
	}
	mu.Lock()
	defer mu.Unlock()
	if !slices.Equal(attempts, []int{1, 2, 3}) || !slices.Equal(backoffs, []int{1, 2, 3}) {
		t.Fatalf("handler saw attempts %v, backoff asked for %v; want 1, 2, 3", attempts, backoffs)
	}
	// Each failure's error is in the message's history: the released events', the errored one's.
	if got, want := e.failures("q", "m1"), []string{"released: attempt 1 failed", "released: attempt 2 failed", "errored: attempt 3 failed"}; !slices.Equal(got, want) {
		t.Fatalf("history's failures %q, want %q", got, want)
	}
}

// TestWorkerSnoozes: a handler that returns Snooze puts its message back invisible for the snooze,
// with its attempt given back and no backoff asked for; it runs again once the snooze is over, as
// attempt 1 again, on a queue of one attempt, and its history counts no failure.
func TestWorkerSnoozes(t *testing.T) {
	t.Parallel()
	e := setupFake(t)
	e.createQueue("q", &workers.QueueOpts{MaxAttempts: 1})
	e.enqueue("q", "not yet", &workers.EnqueueOpts{ID: "m1"})
	const snooze = 90 * time.Second
	attempts := make(chan int, 2)
	var runs atomic.Int32
	e.startWorker(&workers.WorkerConfig{
		Queue:       "q",
		BackoffFunc: func(int) time.Duration { t.Error("a snooze asked for a backoff"); return 0 },
	}, workers.HandlerFunc(func(_ context.Context, job *workers.Job) error {
		attempts <- job.Attempts
		if runs.Add(1) == 1 {
			return fmt.Errorf("rate limited: %w", workers.Snooze(snooze)) // its words kept
		}
		return nil
	}))
	if a := recv(t, attempts); a != 1 {
		t.Fatalf("first run: attempt %d, want 1", a)
	}
	var m workers.Message
	waitFor(t, "the message snoozed", func() bool { m = e.get("q", "m1"); return m.State == subjects.StateInvisible })
	if d := m.VisibleAt.Sub(m.UpdatedAt); d != snooze || m.Attempts != 0 || m.AttemptsLeft != 1 {
		t.Fatalf("snoozed: invisible for %v, attempts %d (%d left); want %v, 0 (1 left)", d, m.Attempts, m.AttemptsLeft, snooze)
	}
	e.clk.Advance(snooze)
	if a := recv(t, attempts); a != 1 {
		t.Fatalf("the run after the snooze: attempt %d, want 1 (the snooze gave its attempt back)", a)
	}
	e.waitState("q", "m1", subjects.StateCompleted)
	hist, err := e.c.History(ctx(t), "q", "m1", 0)
	if err != nil {
		t.Fatal(err)
	}
	if hist.Failures != 0 {
		t.Fatalf("history counts %d failures, want none: %+v", hist.Failures, hist.Events)
	}
	if got := e.failures("q", "m1"); !slices.Equal(got, []string{"released: rate limited: natstone: snoozed for 1m30s"}) {
		t.Fatalf("history's releases %q, want the snooze's", got)
	}
}

// TestWorkerSnoozeOfZero: a snooze shorter than a second waits a second, so that a handler that
// snoozes at once does not run its message again and again (the snooze's release also leases the
// slot's next message, which would be this one).
func TestWorkerSnoozeOfZero(t *testing.T) {
	t.Parallel()
	e := setupFake(t)
	e.createQueue("q", nil)
	e.enqueue("q", "not yet", &workers.EnqueueOpts{ID: "m1"})
	var runs atomic.Int32
	e.startWorker(&workers.WorkerConfig{Queue: "q"}, workers.HandlerFunc(func(context.Context, *workers.Job) error {
		if runs.Add(1) == 1 {
			return workers.Snooze(0)
		}
		return nil
	}))
	var m workers.Message
	waitFor(t, "the message snoozed", func() bool { m = e.get("q", "m1"); return m.State == subjects.StateInvisible })
	if d := m.VisibleAt.Sub(m.UpdatedAt); d != time.Second {
		t.Fatalf("Snooze(0): invisible for %v, want a second", d)
	}
	// The error says what the message gets, not what was asked.
	for asked, want := range map[time.Duration]time.Duration{0: time.Second, -1: time.Second, 1000 * 24 * time.Hour: subjects.MaxInvisible} {
		if se, ok := errors.AsType[*workers.SnoozeError](workers.Snooze(asked)); !ok || se.Delay != want {
			t.Errorf("Snooze(%v): %v, want a delay of %v", asked, se, want)
		}
	}
	e.clk.Advance(time.Second)
	e.waitState("q", "m1", subjects.StateCompleted)
	if got := e.failures("q", "m1"); !slices.Equal(got, []string{"released: natstone: snoozed for 1s"}) {
		t.Fatalf("history's releases %q", got)
	}
}

// TestJobCancelKeepsToItsContext: a handler's Cancel waits for the worker's extension of the lease
// in flight (so that extension does not take the cancel for a lost lease), but no longer than its
// own ctx allows, though that extension may wait until the lease's end (an hour here) for a broker
// that does not answer.
func TestJobCancelKeepsToItsContext(t *testing.T) {
	t.Parallel()
	srv := natstest.Start(t, nil)
	fake, space, _ := fakeLeasingOnce(t, srv)
	extending := make(chan struct{}, 16)
	if _, err := fake.Subscribe(space.Subject(subjects.OpExtend, "q"), func(*nats.Msg) { extending <- struct{}{} }); err != nil {
		t.Fatal(err) // never answered
	}
	cancels, err := fake.SubscribeSync(space.Subject(subjects.OpCancel, "q"))
	if err != nil {
		t.Fatal(err)
	}
	canceled := make(chan error, 1)
	c := clientOnFake(t, srv, fake, time.Hour)
	w := startOwn(t, c, &workers.WorkerConfig{Queue: "q", PollWait: time.Millisecond,
		ExtendEveryFunc: func(time.Duration) time.Duration { return time.Millisecond }},
		workers.HandlerFunc(func(ctx context.Context, job *workers.Job) error {
			<-extending // an extension in flight
			cctx, cancel := context.WithTimeout(ctx, 100*time.Millisecond)
			defer cancel()
			canceled <- job.Cancel(cctx)
			<-ctx.Done()
			return nil
		}))
	if err := recv(t, canceled); !errors.Is(err, context.DeadlineExceeded) {
		t.Fatalf("Cancel: %v, want its ctx's error", err)
	}
	if m, err := cancels.NextMsg(10 * time.Millisecond); err == nil {
		t.Fatalf("a cancel was sent, %s, while the extension was in flight", m.Data)
	}
	if err := stopWithin(t, w, 10*time.Millisecond); !errors.Is(err, context.DeadlineExceeded) || errors.Is(err, workers.ErrHandlersLeftRunning) {
		t.Fatalf("Stop: %v, want its ctx's error alone: the handler returned as its context ended", err)
	}
}

// TestWorkerIgnoreCancels: a worker subscribes to its queue's cancels unless IgnoreCancels says not
// to (the server's own count of the subject's subscriptions tells).
func TestWorkerIgnoreCancels(t *testing.T) {
	t.Parallel()
	e := setup(t)
	e.createQueue("q", nil)
	subs := func() int {
		t.Helper()
		if _, err := e.c.Queue(ctx(t), "q"); err != nil { // a round trip: the worker's SUB, sent before, is in
			t.Fatal(err)
		}
		sz, err := e.srv.NATS().Subsz(&server.SubszOptions{Subscriptions: true, Test: "natstone.events.q.canceled.bTE"})
		if err != nil {
			t.Fatal(err)
		}
		return len(sz.Subs)
	}
	base := subs() // the events stream's own
	idle := workers.HandlerFunc(func(context.Context, *workers.Job) error { return nil })
	w := e.startWorker(&workers.WorkerConfig{Queue: "q", IgnoreCancels: true}, idle)
	if n := subs() - base; n != 0 {
		t.Fatalf("%d subscriptions to the cancels with IgnoreCancels, want none", n)
	}
	stop(t, w)
	w = e.startWorker(&workers.WorkerConfig{Queue: "q"}, idle)
	if n := subs() - base; n != 1 {
		t.Fatalf("%d subscriptions to the cancels, want the worker's", n)
	}
	stop(t, w)
	if n := subs() - base; n != 0 {
		t.Fatalf("%d subscriptions to the cancels after the worker stopped, want none", n)
	}
}

// TestWorkerHandlerTimeout: a handler that runs past WorkerConfig.Timeout has its context ended with
// ErrHandlerTimeout, and its attempt fails: released, then errored on the last, each time with an
// error saying so in the history.
func TestWorkerHandlerTimeout(t *testing.T) {
	t.Parallel()
	e := setup(t)
	e.createQueue("q", &workers.QueueOpts{MaxAttempts: 4})
	e.enqueue("q", "slow", &workers.EnqueueOpts{ID: "m"})
	causes, backoffs := make(chan error, 4), make(chan int, 4)
	backoff := func(attempt int) time.Duration {
		backoffs <- attempt // a timed-out attempt is a failure: it backs off like any other
		return 0
	}
	e.startWorker(&workers.WorkerConfig{Queue: "q", Timeout: 50 * time.Millisecond, BackoffFunc: backoff},
		workers.HandlerFunc(func(ctx context.Context, job *workers.Job) error {
			<-ctx.Done()
			causes <- context.Cause(ctx)
			switch job.Attempts {
			case 2:
				return context.Cause(ctx) // ErrHandlerTimeout itself: said once in the history
			case 3:
				return fmt.Errorf("fetch page 3: %w", context.Cause(ctx)) // its own words kept
			case 4:
				return errors.Join(context.Cause(ctx), errors.New("fetch page 4")) // not bare: kept too
			}
			return ctx.Err()
		}))
	for attempt := 1; attempt <= 4; attempt++ {
		if err := recv(t, causes); !errors.Is(err, workers.ErrHandlerTimeout) {
			t.Fatalf("handler's context ended with %v, want ErrHandlerTimeout", err)
		}
		if got := recv(t, backoffs); got != attempt {
			t.Fatalf("backoff asked for attempt %d, want %d", got, attempt)
		}
	}
	e.waitState("q", "m", subjects.StateErrored)
	got := e.failures("q", "m")
	want := []string{"released: natstone: handler timed out after 50ms: context deadline exceeded", "released: natstone: handler timed out after 50ms",
		"released: natstone: handler timed out after 50ms: fetch page 3: natstone: handler timed out",
		"errored: natstone: handler timed out after 50ms: natstone: handler timed out\nfetch page 4"}
	if !slices.Equal(got, want) {
		t.Fatalf("history's failures %q, want %q", got, want)
	}
}

func TestWorkerDiscard(t *testing.T) {
	t.Parallel()
	e := setup(t)
	e.createQueue("q", nil)
	e.enqueue("q", "bad", &workers.EnqueueOpts{ID: "discard"})
	e.enqueue("q", "bad", &workers.EnqueueOpts{ID: "wrapped"})
	e.enqueue("q", "bad", &workers.EnqueueOpts{ID: "self"})
	releases := e.count(subjects.OpRelease, "q")
	w := e.startWorker(&workers.WorkerConfig{Queue: "q"}, workers.HandlerFunc(func(ctx context.Context, job *workers.Job) error {
		switch job.ID {
		case "discard":
			return workers.Discard(nil)
		case "wrapped":
			return fmt.Errorf("giving up: %w", workers.Discard(errors.New("malformed")))
		default:
			// The handler cancels the message itself; what it returns then does not matter.
			if err := job.Cancel(ctx); err != nil {
				return err
			}
			if err := job.Cancel(ctx); err != nil {
				return fmt.Errorf("second Cancel: %w", err)
			}
			return errors.New("ignored")
		}
	}))
	for _, id := range []string{"discard", "wrapped", "self"} {
		if m := e.waitState("q", id, subjects.StateCanceled); m.Attempts != 1 {
			t.Fatalf("%s canceled after %d attempts", id, m.Attempts)
		}
	}
	stop(t, w)
	if n := releases.n(t); n != 0 {
		t.Fatalf("%d releases, want none", n)
	}
	// The canceled event says why (the events are stored a moment after the transition).
	const why = "giving up: natstone: discard message: malformed"
	waitFor(t, "wrapped's canceled event with the handler's error", func() bool {
		hist, err := e.c.History(ctx(t), "q", "wrapped", 0)
		if err != nil {
			t.Fatal(err)
		}
		last := hist.Events[len(hist.Events)-1]
		return last.Kind == subjects.EventCanceled && last.Error == why
	})
	err := workers.Discard(errors.New("why"))
	if !errors.Is(err, workers.ErrDiscard) || err.Error() != "natstone: discard message: why" {
		t.Fatalf("Discard(why) = %v", err)
	}
}

func TestWorkerRecoversPanic(t *testing.T) {
	t.Parallel()
	e := setup(t)
	e.createQueue("q", nil)
	e.enqueue("q", "boom", &workers.EnqueueOpts{ID: "m1"})
	var logs natstest.LogBuffer
	seen := make(chan error, 2) // what a middleware sees the handler return, attempt by attempt
	watch := func(next workers.Handler) workers.Handler {
		return workers.HandlerFunc(func(ctx context.Context, job *workers.Job) error {
			err := next.Handle(ctx, job)
			seen <- err
			return err
		})
	}
	e.startWorker(&workers.WorkerConfig{
		Queue:       "q",
		BackoffFunc: func(int) time.Duration { return 0 },
		Logger:      slogTo(&logs),
		Middleware:  []workers.Middleware{watch},
	}, workers.HandlerFunc(func(_ context.Context, job *workers.Job) error {
		if job.Attempts == 1 {
			panic("handler bug")
		}
		return nil
	}))
	m := e.waitState("q", "m1", subjects.StateCompleted)
	if m.Attempts != 2 {
		t.Fatalf("completed after %d attempts, want 2 (the panic released the first)", m.Attempts)
	}
	pe, ok := errors.AsType[*workers.PanicError](recv(t, seen))
	if !ok || pe.Value != "handler bug" || !strings.Contains(string(pe.Stack), "worker_test.go") {
		t.Fatalf("the middleware saw %#v for the panicking attempt, want a *PanicError of \"handler bug\" with its stack", pe)
	}
	if err := recv(t, seen); err != nil {
		t.Fatalf("the middleware saw %v for the completing attempt, want nil", err)
	}
	if got := e.failures("q", "m1"); !slices.Equal(got, []string{"released: natstone: handler panicked: handler bug"}) {
		t.Fatalf("history's failures %q", got)
	}
	out := logs.String()
	for _, want := range []string{"handler panicked", "handler bug", "stack=", "worker_test.go", "message_id=m1", "attempt=1", "queue=q"} {
		if !strings.Contains(out, want) {
			t.Errorf("logs lack %q:\n%s", want, out)
		}
	}
}

// TestWorkerConcurrency blocks every handler: exactly Concurrency run at once, and the next message
// stays pending until a slot is free.
func TestWorkerConcurrency(t *testing.T) {
	t.Parallel()
	e := setup(t)
	const n = 3
	e.createQueue("q", nil)
	for i := range n + 1 {
		e.enqueue("q", "x", &workers.EnqueueOpts{ID: fmt.Sprint("m", i), Priority: ptr(int64(i))})
	}
	started := make(chan string, n+1)
	gate := make(chan struct{})
	var running, most atomic.Int32
	e.startWorker(&workers.WorkerConfig{Queue: "q", Concurrency: n}, workers.HandlerFunc(func(ctx context.Context, job *workers.Job) error {
		r := running.Add(1)
		defer running.Add(-1)
		for {
			m := most.Load()
			if r <= m || most.CompareAndSwap(m, r) {
				break
			}
		}
		started <- job.ID
		awaitGate(ctx, gate)
		return nil
	}))
	var ids []string
	for range n {
		ids = append(ids, recv(t, started))
	}
	slices.Sort(ids)
	if !slices.Equal(ids, []string{"m0", "m1", "m2"}) {
		t.Fatalf("started %v, want the three most urgent", ids)
	}
	counts, err := e.c.Depth(ctx(t), "q", nil)
	if err != nil {
		t.Fatal(err)
	}
	if counts.Running != n || counts.Pending != 1 {
		t.Fatalf("with %d handlers busy: %+v, want %d running and 1 pending", n, counts, n)
	}
	if got := running.Load(); got != n {
		t.Fatalf("%d handlers running, want %d", got, n)
	}
	close(gate)
	if id := recv(t, started); id != "m3" {
		t.Fatalf("fourth message %s, want m3", id)
	}
	e.waitState("q", "m3", subjects.StateCompleted)
	if got := most.Load(); got != n {
		t.Fatalf("at most %d handlers ran at once, want %d", got, n)
	}
}

func TestWorkerFilter(t *testing.T) {
	t.Parallel()
	e := setup(t)
	e.createQueue("q", nil)
	const each = 5
	for i := range each {
		for _, kind := range []string{"a", "b"} {
			e.enqueue("q", kind, &workers.EnqueueOpts{ID: fmt.Sprint(kind, i), Metadata: map[string]string{"kind": kind}})
		}
	}
	e.enqueue("q", "none", &workers.EnqueueOpts{ID: "unmatched"})
	type seen struct{ worker, kind string }
	got := make(chan seen, 2*each)
	for _, kind := range []string{"a", "b"} {
		e.startWorker(&workers.WorkerConfig{Queue: "q", Concurrency: 2, Filter: map[string]string{"kind": kind}},
			workers.HandlerFunc(func(_ context.Context, job *workers.Job) error {
				got <- seen{kind, string(job.Payload)}
				return nil
			}))
	}
	for range 2 * each {
		if s := recv(t, got); s.worker != s.kind {
			t.Fatalf("worker with filter kind=%s got a message of kind %s", s.worker, s.kind)
		}
	}
	waitFor(t, "every filtered message completed", func() bool {
		counts, err := e.c.Depth(ctx(t), "q", nil)
		return err == nil && counts.Completed == 2*each
	})
	if m := e.get("q", "unmatched"); m.State != subjects.StatePending {
		t.Fatalf("a message no filter matches is %s", m.State)
	}
}

func TestWorkerMiddlewareOrder(t *testing.T) {
	t.Parallel()
	e := setup(t)
	e.createQueue("q", nil)
	e.enqueue("q", "x", &workers.EnqueueOpts{ID: "m1"})
	var mu sync.Mutex
	var trace []string
	record := func(s string) {
		mu.Lock()
		defer mu.Unlock()
		trace = append(trace, s)
	}
	mw := func(name string) workers.Middleware {
		return func(next workers.Handler) workers.Handler {
			return workers.HandlerFunc(func(ctx context.Context, job *workers.Job) error {
				record(name + " before")
				err := next.Handle(ctx, job)
				record(name + " after")
				return err
			})
		}
	}
	e.startWorker(&workers.WorkerConfig{Queue: "q", Middleware: []workers.Middleware{mw("outer"), mw("inner")}},
		workers.HandlerFunc(func(context.Context, *workers.Job) error {
			record("handler")
			return nil
		}))
	e.waitState("q", "m1", subjects.StateCompleted)
	mu.Lock()
	defer mu.Unlock()
	if want := []string{"outer before", "inner before", "handler", "inner after", "outer after"}; !slices.Equal(trace, want) {
		t.Fatalf("trace = %v, want %v", trace, want)
	}
}

// TestWorkerGracefulStop stops a worker while its handler runs: Stop waits for the handler, which
// finishes with its context intact, and the message is completed before Stop returns. The polls
// are stopped first, through Start's context (TestWorkerStartContext), so that nothing is dequeued
// afterwards: Stop, in a goroutine of its own, could otherwise come after the handler's return and
// the slot's next long poll, which the broker would keep (see Stop). No poll runs after Stop
// anyway: it returns once every goroutine of the worker has, which goleak checks in TestMain.
func TestWorkerGracefulStop(t *testing.T) {
	t.Parallel()
	e := setup(t)
	e.createQueue("q", nil)
	e.enqueue("q", "x", &workers.EnqueueOpts{ID: "m1"})
	started := make(chan struct{}, 1)
	gate := make(chan struct{})
	var openGate sync.Once
	var finished atomic.Bool
	var ctxErr atomic.Value
	w, err := workers.NewWorker(e.c, &workers.WorkerConfig{Queue: "q", Logger: discard()}, workers.HandlerFunc(func(ctx context.Context, _ *workers.Job) error {
		started <- struct{}{}
		awaitGate(ctx, gate)
		if err := ctx.Err(); err != nil {
			ctxErr.Store(err)
		}
		finished.Store(true)
		return nil
	}))
	if err != nil {
		t.Fatal(err)
	}
	runCtx, stopPolls := context.WithCancel(t.Context())
	defer stopPolls()
	if err := w.Start(runCtx); err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { // should the test fail early: let the handler go and the worker end
		openGate.Do(func() { close(gate) })
		stop(t, w)
	})
	recv(t, started)
	stopPolls()
	stopped := make(chan error, 1)
	go func() {
		c, cancel := context.WithTimeout(context.Background(), waitTimeout)
		defer cancel()
		stopped <- w.Stop(c)
	}()
	openGate.Do(func() { close(gate) })
	if err := recv(t, stopped); err != nil {
		t.Fatalf("Stop: %v", err)
	}
	if !finished.Load() {
		t.Fatal("Stop returned before the handler finished")
	}
	if err := ctxErr.Load(); err != nil {
		t.Fatalf("the handler's context was cancelled: %v", err)
	}
	if m := e.get("q", "m1"); m.State != subjects.StateCompleted {
		t.Fatalf("after Stop the message is %s, want completed", m.State)
	}
	e.enqueue("q", "later", &workers.EnqueueOpts{ID: "m2"})
	if m := e.get("q", "m2"); m.State != subjects.StatePending {
		t.Fatalf("a message enqueued after Stop is %s", m.State)
	}
}

// TestWorkerStopReleasesWhateverTheHandlerReturns stops a worker whose handler outlasts Stop's
// context: the handler's context is cancelled with ErrWorkerStopped, and its message is released
// as the handler returns (no backoff) with its attempt given back, so that a deploy does not error
// a message on its last attempt, whatever the handler returns then: its context's error; nil (it
// stopped short, as far as anyone can tell: it was completed); a Discard or a Snooze (as when it
// returns more than a second later, the message released already).
func TestWorkerStopReleasesWhateverTheHandlerReturns(t *testing.T) {
	t.Parallel()
	for name, result := range map[string]func(context.Context) error{
		"its context's error": context.Context.Err,
		"nil":                 func(context.Context) error { return nil },
		"discard":             func(context.Context) error { return workers.Discard(errors.New("no")) },
		"snooze":              func(context.Context) error { return workers.Snooze(time.Hour) },
	} {
		t.Run(name, func(t *testing.T) {
			t.Parallel()
			stopReturning(t, result)
		})
	}
}

// stopReturning stops, past its ctx, a worker whose handler waits for its context to end, takes a
// moment to unwind, and then returns what result gives: the cause is ErrWorkerStopped, the message
// stays running while the handler unwinds (in an exclusive queue, the next message of its value
// would run alongside), and it is then released without backoff, its one attempt given back.
func stopReturning(t *testing.T, result func(context.Context) error) {
	e := setup(t)
	e.createQueue("q", &workers.QueueOpts{MaxAttempts: 1})
	e.enqueue("q", "x", &workers.EnqueueOpts{ID: "m1"})
	started, unwound := make(chan struct{}, 1), make(chan struct{})
	cause := make(chan error, 1)
	w, err := workers.NewWorker(e.c, &workers.WorkerConfig{Queue: "q", Logger: discard(), BackoffFunc: func(int) time.Duration { return time.Hour }},
		workers.HandlerFunc(func(ctx context.Context, _ *workers.Job) error {
			started <- struct{}{}
			<-ctx.Done()
			cause <- context.Cause(ctx)
			<-unwound // its cleanup
			return result(ctx)
		}))
	if err != nil {
		t.Fatal(err)
	}
	if err := w.Start(ctx(t)); err != nil {
		t.Fatal(err)
	}
	recv(t, started)
	c, cancel := context.WithTimeout(context.Background(), 100*time.Millisecond)
	defer cancel()
	stopped := make(chan error, 1)
	go func() { stopped <- w.Stop(c) }()
	if err := recv(t, cause); !errors.Is(err, workers.ErrWorkerStopped) {
		t.Fatalf("context.Cause = %v, want ErrWorkerStopped", err)
	}
	// A release sent as the context ended lands within moments; the worker waits up to a second.
	for watched := time.Now(); time.Since(watched) < 300*time.Millisecond; {
		if m := e.get("q", "m1"); m.State != subjects.StateRunning {
			t.Fatalf("m1 is %s while its handler unwinds, want running", m.State)
		}
	}
	close(unwound)
	if err := recv(t, stopped); !errors.Is(err, context.DeadlineExceeded) || errors.Is(err, workers.ErrHandlersLeftRunning) || errors.Is(err, workers.ErrUnsettled) {
		t.Fatalf("Stop = %v, want context.DeadlineExceeded alone: no handler left running, every message settled", err)
	}
	if m := e.get("q", "m1"); m.State != subjects.StatePending || m.Attempts != 0 {
		t.Fatalf("after Stop: %s with %d attempts, want pending with its one attempt given back", m.State, m.Attempts)
	}
}

// TestWorkerStartContext cancels the context given to Start while a handler runs: the worker
// dequeues no more, the handler goes on undisturbed and its message is completed.
func TestWorkerStartContext(t *testing.T) {
	t.Parallel()
	e := setup(t)
	e.createQueue("q", nil)
	e.enqueue("q", "x", &workers.EnqueueOpts{ID: "m1"})
	dequeues := e.count(subjects.OpDequeue, "q")
	started := make(chan struct{}, 1)
	gate := make(chan struct{})
	var ctxErr atomic.Value
	w, err := workers.NewWorker(e.c, &workers.WorkerConfig{Queue: "q", Logger: discard()}, workers.HandlerFunc(func(ctx context.Context, _ *workers.Job) error {
		started <- struct{}{}
		awaitGate(ctx, gate)
		if err := ctx.Err(); err != nil {
			ctxErr.Store(err)
		}
		return nil
	}))
	if err != nil {
		t.Fatal(err)
	}
	runCtx, cancel := context.WithCancel(t.Context())
	defer cancel()
	if err := w.Start(runCtx); err != nil {
		t.Fatal(err)
	}
	recv(t, started)
	n := dequeues.n(t) // the one slot is busy: no dequeue in flight
	cancel()
	close(gate)
	e.waitState("q", "m1", subjects.StateCompleted)
	stop(t, w)
	if err := ctxErr.Load(); err != nil {
		t.Fatalf("the handler's context was cancelled: %v", err)
	}
	if got := dequeues.n(t); got != n {
		t.Fatalf("%d dequeues after Start's context ended, want none", got-n)
	}
}

// TestWorkerLongPolls checks that an idle worker waits PollWait per dequeue: the broker holds each
// empty dequeue for the wait (the worker logs, at debug level, every one that came back before half
// of it), and each request has a fresh request id.
func TestWorkerLongPolls(t *testing.T) {
	t.Parallel()
	e := setup(t)
	e.createQueue("q", nil)
	dequeues := e.count(subjects.OpDequeue, "q")
	const wait = 200 * time.Millisecond
	var logs natstest.LogBuffer
	logger := slog.New(slog.NewTextHandler(&logs, &slog.HandlerOptions{Level: slog.LevelDebug}))
	e.startWorker(&workers.WorkerConfig{Queue: "q", PollWait: wait, Logger: logger}, workers.HandlerFunc(func(context.Context, *workers.Job) error { return nil }))
	reqs := dequeues.wait(t, 4) // the first three have ended, each with its own empty reply
	if out := logs.String(); strings.Contains(out, "dequeue returned early") {
		t.Fatalf("an empty dequeue came back before half of its %v wait:\n%s", wait, out)
	}
	ids := map[string]bool{}
	for _, r := range reqs {
		d := decode[subjects.DequeueRequest](t, r.Data)
		if d.Batch != 1 || d.WaitMS != wait.Milliseconds() || d.RequestID == "" || ids[d.RequestID] {
			t.Fatalf("dequeue request %+v: want batch 1, wait %dms and a fresh request id", d, wait.Milliseconds())
		}
		ids[d.RequestID] = true
	}
}

// TestWorkerBacksOffWithoutBroker runs a worker with no broker: each dequeue fails at once with no
// responders, and the worker backs off exponentially instead of spinning.
func TestWorkerBacksOffWithoutBroker(t *testing.T) {
	t.Parallel()
	srv := natstest.Start(t, nil)
	nc := srv.Connect(t)
	c, err := workers.NewClient(nc, nil)
	if err != nil {
		t.Fatal(err)
	}
	began := time.Now()
	w := startWorker(t, c, &workers.WorkerConfig{Queue: "q"}, workers.HandlerFunc(func(context.Context, *workers.Job) error { return nil }))
	waitFor(t, "4 dequeues", func() bool { return nc.Stats().OutMsgs >= 4 })
	// Retries after 100, 200 and 400 ms, each -25 % at worst.
	if elapsed := time.Since(began); elapsed < 525*time.Millisecond {
		t.Fatalf("4 dequeues in %v without a broker: not backing off", elapsed)
	}
	stop(t, w)
}

// TestWorkerRetriesTimedOutDequeue answers the first dequeue of a worker late: the worker retries it
// once with the same request id (so the broker could return the same leases), then polls afresh.
func TestWorkerRetriesTimedOutDequeue(t *testing.T) {
	t.Parallel()
	srv := natstest.Start(t, nil)
	fake, _, reqs := fakeDequeues(t, srv, func(n int32) []byte {
		if n == 1 {
			return nil // the first one is never answered
		}
		return []byte(`{"messages":[]}`)
	})
	workerOnFake(t, srv, fake, 50*time.Millisecond, func(context.Context, *workers.Job) error { return nil })
	first, retry, next := recv(t, reqs), recv(t, reqs), recv(t, reqs)
	if first.RequestID == "" || retry.RequestID != first.RequestID {
		t.Fatalf("retry request id %q, want the timed-out dequeue's %q", retry.RequestID, first.RequestID)
	}
	if next.RequestID == first.RequestID {
		t.Fatalf("the next poll reuses request id %q", next.RequestID)
	}
}

// fakeLeasingOnce connects a fake broker to srv whose first dequeue of queue q leases message m (see
// leasedReply, leased now) and whose later dequeues find nothing. The test subscribes the other
// operations it needs on the returned connection. fakeLeasingOnceSeen also returns the dequeues'
// requests, up to 64 of them.
func fakeLeasingOnce(t *testing.T, srv *natstest.Server) (*nats.Conn, subjects.Space, subjects.Message) {
	fake, space, msg, _ := fakeLeasingOnceSeen(t, srv)
	return fake, space, msg
}

func fakeLeasingOnceSeen(t *testing.T, srv *natstest.Server) (*nats.Conn, subjects.Space, subjects.Message, <-chan subjects.DequeueRequest) {
	t.Helper()
	msg, reply := leasedReply(t, time.Now())
	fake, space, reqs := fakeDequeues(t, srv, func(n int32) []byte {
		if n == 1 {
			return reply
		}
		return []byte(`{"messages":[]}`)
	})
	return fake, space, msg, reqs
}

// fakeDequeues connects a fake broker to srv that answers the nth dequeue of queue q (from 1) with
// answer(n), or not at all if that is nil, and returns the dequeues' requests, up to 64 of them.
func fakeDequeues(t *testing.T, srv *natstest.Server, answer func(n int32) []byte) (*nats.Conn, subjects.Space, <-chan subjects.DequeueRequest) {
	t.Helper()
	space, _ := subjects.NewSpace("")
	fake := srv.Connect(t)
	reqs := make(chan subjects.DequeueRequest, 64)
	var n atomic.Int32
	if _, err := fake.Subscribe(space.Subject(subjects.OpDequeue, "q"), func(m *nats.Msg) {
		select {
		case reqs <- decode[subjects.DequeueRequest](t, m.Data):
		default: // nobody reads them
		}
		if reply := answer(n.Add(1)); reply != nil {
			_ = m.Respond(reply)
		}
	}); err != nil {
		t.Fatal(err)
	}
	return fake, space, reqs
}

// workerOnFake starts a worker of queue q, polling without waiting, on a client whose requests time
// out after timeout (0: the default), once fake, the fake broker's connection, has its
// subscriptions in place.
func workerOnFake(t *testing.T, srv *natstest.Server, fake *nats.Conn, timeout time.Duration, h workers.HandlerFunc) {
	t.Helper()
	startWorker(t, clientOnFake(t, srv, fake, timeout), &workers.WorkerConfig{Queue: "q", PollWait: time.Millisecond}, h)
}

// clientOnFake returns a client whose requests time out after timeout (0: the default), once fake,
// parkedDequeues subscribes a fake broker on srv to the dequeues of q that answers none, as one
// that died while its NATS server stayed up: the channel gets each one's request id.
func parkedDequeues(t *testing.T, srv *natstest.Server) (*nats.Conn, subjects.Space, <-chan string) {
	t.Helper()
	space, _ := subjects.NewSpace("")
	fake := srv.Connect(t)
	ids := make(chan string, 64)
	if _, err := fake.Subscribe(space.Subject(subjects.OpDequeue, "q"), func(m *nats.Msg) {
		ids <- decode[subjects.DequeueRequest](t, m.Data).RequestID
	}); err != nil {
		t.Fatal(err)
	}
	if err := fake.Flush(); err != nil {
		t.Fatal(err)
	}
	return fake, space, ids
}

// the fake broker's connection, has its subscriptions in place.
func clientOnFake(t *testing.T, srv *natstest.Server, fake *nats.Conn, timeout time.Duration) *workers.Client {
	t.Helper()
	if err := fake.Flush(); err != nil {
		t.Fatal(err)
	}
	c, err := workers.NewClient(srv.Connect(t), &workers.Config{Timeout: timeout})
	if err != nil {
		t.Fatal(err)
	}
	return c
}

// leasedReply is a broker's dequeue reply, for a fake broker: message m of queue q, leased as L at
// leased for an hour.
func leasedReply(t *testing.T, leased time.Time) (subjects.Message, []byte) {
	t.Helper()
	return leasedReplyFor(t, leased, time.Hour)
}

// leasedReplyFor is leasedReply with a lease of d.
func leasedReplyFor(t *testing.T, leased time.Time, d time.Duration) (subjects.Message, []byte) {
	t.Helper()
	leased = leased.UTC()
	expires := leased.Add(d)
	msg := subjects.Message{ID: "m", Queue: "q", State: subjects.StateRunning, Attempts: 1, AttemptsLeft: 4,
		LeaseID: "L", LeaseExpiresAt: &expires, EnqueuedAt: leased, VisibleAt: leased, UpdatedAt: leased}
	reply, err := json.Marshal(subjects.DequeueReply{Messages: []subjects.Message{msg}})
	if err != nil {
		t.Fatal(err)
	}
	return msg, reply
}

// TestWorkerDequeueOfUnknownOutcome: a dequeue the broker answers unavailable may have leased a
// message (a write of unknown outcome, a payload unread). The worker sends it again at once with the
// same request id and, that failing too, its next poll uses the id again, so the broker can return
// the lease instead of leaving the message to expire unprocessed. A message that comes back so has
// been leased for a while: its lease is extended at once, not a third of the lease later.
func TestWorkerDequeueOfUnknownOutcome(t *testing.T) {
	t.Parallel()
	srv := natstest.Start(t, nil)
	_, reply := leasedReply(t, time.Now().Add(-time.Minute))
	fake, space, reqs := fakeDequeues(t, srv, func(n int32) []byte {
		switch n {
		case 1, 2:
			return []byte(`{"error":{"code":"unavailable","message":"storage did not take the leases; retry"}}`)
		case 3:
			return reply
		}
		return []byte(`{"messages":[]}`)
	})
	extended := make(chan subjects.ExtendRequest, 16)
	if _, err := fake.Subscribe(space.Subject(subjects.OpExtend, "q"), func(m *nats.Msg) {
		extended <- decode[subjects.ExtendRequest](t, m.Data)
		_ = m.Respond([]byte(`{"error":{"code":"lease_expired","message":"gone"}}`))
	}); err != nil {
		t.Fatal(err)
	}
	workerOnFake(t, srv, fake, 0, func(ctx context.Context, _ *workers.Job) error {
		<-ctx.Done() // until the lease is lost
		return ctx.Err()
	})
	first, retry, next := recv(t, reqs), recv(t, reqs), recv(t, reqs)
	if first.RequestID == "" || retry.RequestID != first.RequestID || next.RequestID != first.RequestID {
		t.Fatalf("request ids %q, %q, %q: want the unavailable dequeue's sent again, then by the next poll", first.RequestID, retry.RequestID, next.RequestID)
	}
	if x := recv(t, extended); x.ID != "m" || x.LeaseID != "L" {
		t.Fatalf("extend %+v, want m's lease L", x)
	}
	if after := recv(t, reqs); after.RequestID == first.RequestID {
		t.Fatalf("the poll after the message reuses request id %q", after.RequestID)
	}
}

// TestWorkerSettleOfUnknownOutcome: a complete whose answer was lost may have leased the slot's next
// message. When the retry then fails outright (the message collected meanwhile: message_not_found),
// the slot's next poll still uses the complete's request id, so the broker can return that lease.
// When the retry succeeds, its next is what the id leased, and the next poll takes a fresh id.
func TestWorkerSettleOfUnknownOutcome(t *testing.T) {
	t.Parallel()
	for _, tc := range []struct {
		name       string
		retryReply func(msg subjects.Message) []byte
		sameID     bool // the poll after the complete sends the complete's next request id again
	}{
		{"retry fails outright", func(subjects.Message) []byte {
			return []byte(`{"error":{"code":"message_not_found","message":"queue q has no message \"m\""}}`)
		}, true},
		{"retry succeeds", func(msg subjects.Message) []byte {
			msg.State, msg.LeaseID, msg.LeaseExpiresAt = subjects.StateCompleted, "", nil
			data, err := json.Marshal(subjects.SettleReply{Message: msg, Next: &subjects.NextReply{Messages: []subjects.Message{}}})
			if err != nil {
				t.Error(err)
			}
			return data
		}, false},
	} {
		t.Run(tc.name, func(t *testing.T) {
			t.Parallel()
			srv := natstest.Start(t, nil)
			fake, space, msg, reqs := fakeLeasingOnceSeen(t, srv)
			var completes atomic.Int32
			nexts := make(chan string, 16)
			if _, err := fake.Subscribe(space.Subject(subjects.OpComplete, "q"), func(m *nats.Msg) {
				r := decode[subjects.LeaseRequest](t, m.Data)
				if r.Next == nil {
					nexts <- ""
					return
				}
				nexts <- r.Next.RequestID
				if completes.Add(1) > 1 { // the first is not answered
					_ = m.Respond(tc.retryReply(msg))
				}
			}); err != nil {
				t.Fatal(err)
			}
			workerOnFake(t, srv, fake, 50*time.Millisecond, func(context.Context, *workers.Job) error { return nil })
			recv(t, reqs) // the dequeue of m
			first, retry := recv(t, nexts), recv(t, nexts)
			if first == "" || retry != first {
				t.Fatalf("the completes' next request ids %q, %q: want one, sent again", first, retry)
			}
			if poll := recv(t, reqs); (poll.RequestID == first) != tc.sameID || poll.RequestID == "" {
				t.Fatalf("the poll after the complete uses request id %q (the complete's %q): want it again %v", poll.RequestID, first, tc.sameID)
			}
		})
	}
}

// TestWorkerCompleteOutlastsABrokerOutage: a complete that gets no answer is sent again, with
// backoff, for as long as the lease may hold, not three times (about 0.3 s): a broker's restart or a
// standby's takeover takes seconds, and a complete given up on makes the message run again.
func TestWorkerCompleteOutlastsABrokerOutage(t *testing.T) {
	t.Parallel()
	srv := natstest.Start(t, nil)
	fake, space, msg := fakeLeasingOnce(t, srv)
	completes := make(chan subjects.LeaseRequest, 16)
	var tries atomic.Int32
	done := msg
	done.State, done.LeaseID, done.LeaseExpiresAt = subjects.StateCompleted, "", nil
	settled, err := json.Marshal(subjects.SettleReply{Message: done, Next: &subjects.NextReply{Messages: []subjects.Message{}}})
	if err != nil {
		t.Fatal(err)
	}
	if _, err := fake.Subscribe(space.Subject(subjects.OpComplete, "q"), func(m *nats.Msg) {
		completes <- decode[subjects.LeaseRequest](t, m.Data)
		if tries.Add(1) > 4 { // the broker is back at the fifth
			_ = m.Respond(settled)
		}
	}); err != nil {
		t.Fatal(err)
	}
	workerOnFake(t, srv, fake, 50*time.Millisecond, func(context.Context, *workers.Job) error { return nil })
	for i := range 5 {
		if r := recv(t, completes); r.ID != "m" || r.LeaseID != "L" {
			t.Fatalf("complete %d: %+v, want m's lease L", i+1, r)
		}
	}
}

// TestWorkerStopPastItsContext: once Stop's ctx is done, a message whose handler is still running is
// released with one short try, not with retries of a full request timeout each: with a broker that
// does not answer, Stop would otherwise run tens of seconds past its ctx.
func TestWorkerStopPastItsContext(t *testing.T) {
	t.Parallel()
	srv := natstest.Start(t, nil)
	fake, space, _ := fakeLeasingOnce(t, srv)
	releases := make(chan subjects.ReleaseRequest, 16)
	if _, err := fake.Subscribe(space.Subject(subjects.OpRelease, "q"), func(m *nats.Msg) {
		releases <- decode[subjects.ReleaseRequest](t, m.Data) // never answered
	}); err != nil {
		t.Fatal(err)
	}
	if err := fake.Flush(); err != nil {
		t.Fatal(err)
	}
	c, err := workers.NewClient(srv.Connect(t), &workers.Config{Timeout: 50 * time.Millisecond})
	if err != nil {
		t.Fatal(err)
	}
	running := make(chan struct{})
	w, err := workers.NewWorker(c, &workers.WorkerConfig{Queue: "q", PollWait: time.Millisecond, Logger: discard()},
		workers.HandlerFunc(func(ctx context.Context, _ *workers.Job) error {
			close(running)
			<-ctx.Done()
			return ctx.Err()
		}))
	if err != nil {
		t.Fatal(err)
	}
	if err := w.Start(t.Context()); err != nil {
		t.Fatal(err)
	}
	recv(t, running)
	sctx, cancel := context.WithCancel(context.Background())
	cancel() // no time to finish: the handler is cancelled and its message released at once
	if err := w.Stop(sctx); !errors.Is(err, context.Canceled) {
		t.Fatalf("Stop: %v, want its ctx's error", err)
	}
	// A last release on the worker's connection: the fake gets the connection's requests in order,
	// so every release the worker sent comes before it.
	_, _ = c.Release(context.Background(), "q", "sentinel", "S", nil)
	var got []string
	for r := recv(t, releases); r.ID != "sentinel"; r = recv(t, releases) {
		got = append(got, r.ID+"/"+r.LeaseID)
	}
	if !slices.Equal(got, []string{"m/L"}) {
		t.Fatalf("releases before Stop returned: %v, want one of m's lease L", got)
	}
}

// awaitGate blocks a handler until the test opens gate — or until the handler's context ends, so a
// failing test fails instead of hanging in Stop.
func awaitGate(ctx context.Context, gate <-chan struct{}) {
	select {
	case <-gate:
	case <-ctx.Done():
	}
}

func slogTo(b *natstest.LogBuffer) *slog.Logger { return slog.New(slog.NewTextHandler(b, nil)) }

// TestWorkerTakesNextWithItsSettle: a slot gets its next message in the reply of the complete (or
// the release of a failed attempt) of the one before, in earliest-deadline-first order; it
// long-polls only at its start and once the queue is empty.
func TestWorkerTakesNextWithItsSettle(t *testing.T) {
	t.Parallel()
	e := setup(t)
	e.createQueue("q", nil)
	const n = 20
	for i := n; i >= 1; i-- {
		e.enqueue("q", "x", &workers.EnqueueOpts{ID: fmt.Sprintf("m%02d", i), Priority: ptr(int64(i))})
	}
	dequeues := e.count(subjects.OpDequeue, "q")
	completes := e.count(subjects.OpComplete, "q")
	releases := e.count(subjects.OpRelease, "q")
	var mu sync.Mutex
	var seen []string
	e.startWorker(&workers.WorkerConfig{Queue: "q", BackoffFunc: func(int) time.Duration { return 0 }},
		workers.HandlerFunc(func(_ context.Context, job *workers.Job) error {
			mu.Lock()
			defer mu.Unlock()
			seen = append(seen, job.ID)
			if job.ID == "m05" && job.Attempts == 1 {
				return errors.New("first attempt fails")
			}
			return nil
		}))
	completes.wait(t, n)
	dequeues.wait(t, 2) // the first poll, and the long poll once the queue is empty
	for i := 1; i <= n; i++ {
		if m := e.get("q", fmt.Sprintf("m%02d", i)); m.State != subjects.StateCompleted {
			t.Fatalf("%s is %s, want completed", m.ID, m.State)
		}
	}
	if d, c, r := dequeues.n(t), completes.n(t), releases.n(t); d != 2 || c != n || r != 1 {
		t.Fatalf("%d dequeues, %d completes, %d releases; want 2, %d, 1", d, c, r, n)
	}
	for _, m := range completes.msgs[:n-1] {
		if !strings.Contains(string(m.Data), `"next":`) {
			t.Fatalf("a complete without next: %s", m.Data)
		}
	}
	mu.Lock()
	defer mu.Unlock()
	want := []string{"m01", "m02", "m03", "m04", "m05", "m05"}
	for i := 6; i <= n; i++ {
		want = append(want, fmt.Sprintf("m%02d", i))
	}
	if !slices.Equal(seen, want) {
		t.Fatalf("handled %v, want %v", seen, want)
	}
}

// TestWorkerGivesBackNextWhenStopping: a message that a settle leased as the worker began to stop
// is released at once, not handled.
func TestWorkerGivesBackNextWhenStopping(t *testing.T) {
	t.Parallel()
	e := setup(t)
	e.createQueue("q", nil)
	e.enqueue("q", "x", &workers.EnqueueOpts{ID: "m1", Priority: ptr(int64(1))})
	e.enqueue("q", "x", &workers.EnqueueOpts{ID: "m2", Priority: ptr(int64(2))})

	// The worker talks to the broker through a relay that holds the reply of the complete until the
	// test has stopped the worker's polls.
	runCtx, stopPolls := context.WithCancel(t.Context())
	defer stopPolls()
	relay := e.srv.Connect(t)
	sub, err := relay.Subscribe("relay.>", func(m *nats.Msg) {
		out := &nats.Msg{Subject: "natstone.v1." + strings.TrimPrefix(m.Subject, "relay."), Data: m.Data}
		reply, err := relay.RequestMsg(out, waitTimeout)
		if err != nil {
			t.Errorf("relay %s: %v", m.Subject, err)
			return
		}
		if strings.HasPrefix(m.Subject, "relay.complete.") {
			stopPolls() // as Stop starts: cancels the polls at once
		}
		if err := m.RespondMsg(&nats.Msg{Data: reply.Data, Header: reply.Header}); err != nil {
			t.Errorf("relay %s: %v", m.Subject, err)
		}
	})
	if err != nil {
		t.Fatal(err)
	}
	defer func() { _ = sub.Unsubscribe() }()
	c := e.client(&workers.Config{Prefix: "relay"})

	var handled atomic.Int32
	w, err := workers.NewWorker(c, &workers.WorkerConfig{Queue: "q", Logger: discard()}, workers.HandlerFunc(func(context.Context, *workers.Job) error {
		handled.Add(1)
		return nil
	}))
	if err != nil {
		t.Fatal(err)
	}
	if err := w.Start(runCtx); err != nil {
		t.Fatal(err)
	}
	e.waitState("q", "m1", subjects.StateCompleted)
	// m2 is pending before the complete's next leases it too: wait for it to come back (version 3:
	// enqueued, leased, released), with its attempt given back.
	var m2 workers.Message
	waitFor(t, "m2 given back", func() bool {
		m2 = e.get("q", "m2")
		return m2.State == subjects.StatePending && m2.Version == 3
	})
	if m2.Attempts != 0 {
		t.Errorf("m2 given back unprocessed with %d attempts spent, want its attempt given back", m2.Attempts)
	}
	stop(t, w)
	if n := handled.Load(); n != 1 {
		t.Fatalf("%d messages handled; want m1 only: m2, leased by the complete's next as the worker stopped, is given back unhandled", n)
	}
	hist, err := e.c.History(ctx(t), "q", "m2", 0)
	if err != nil {
		t.Fatal(err)
	}
	if last := hist.Events[len(hist.Events)-1]; last.Kind != subjects.EventReleased || last.Reason != subjects.ReasonRefunded ||
		last.Error != "natstone worker stopped before it ran the message" || hist.Failures != 0 {
		t.Fatalf("m2's last event %s(%s) with error %q, %d failures; want released(refunded) as unprocessed, no failure", last.Kind, last.Reason, last.Error, hist.Failures)
	}
}

// TestWorkerStopCutsASettleInFlight: a complete sent before Stop's ctx ran out, and not answered,
// gets stopSettleTimeout from then, not the rest of the client's request timeout. The dequeue it
// carried may have leased the slot's next message (the complete may land yet), so that dequeue is
// abandoned: else such a message would stay running, unprocessed, until its lease ends.
func TestWorkerStopCutsASettleInFlight(t *testing.T) {
	t.Parallel()
	srv := natstest.Start(t, nil)
	fake, space, _ := fakeLeasingOnce(t, srv)
	completes := make(chan subjects.LeaseRequest, 16)
	if _, err := fake.Subscribe(space.Subject(subjects.OpComplete, "q"), func(m *nats.Msg) {
		completes <- decode[subjects.LeaseRequest](t, m.Data)
	}); err != nil {
		t.Fatal(err) // never answered
	}
	abandons, err := fake.SubscribeSync(space.Subject(subjects.OpAbandon, "q"))
	if err != nil {
		t.Fatal(err)
	}
	w := startOwn(t, clientOnFake(t, srv, fake, time.Hour), &workers.WorkerConfig{Queue: "q", PollWait: time.Millisecond},
		workers.HandlerFunc(func(context.Context, *workers.Job) error { return nil }))
	complete := recv(t, completes) // in flight
	if complete.Next == nil || complete.Next.RequestID == "" {
		t.Fatalf("the complete carries no dequeue with a request id: %+v", complete.Next)
	}
	sctx, cancel := context.WithTimeout(context.Background(), 100*time.Millisecond)
	defer cancel()
	stopped := make(chan error, 1)
	go func() { stopped <- w.Stop(sctx) }()
	m, err := abandons.NextMsg(waitTimeout)
	if err != nil {
		t.Fatalf("the stop abandoned nothing: %v", err)
	}
	if got := decode[subjects.AbandonRequest](t, m.Data); got.RequestID != complete.Next.RequestID {
		t.Fatalf("the stop abandoned %q, want the cut complete's dequeue %q", got.RequestID, complete.Next.RequestID)
	}
	_ = m.Respond([]byte(`{"request_id":"` + complete.Next.RequestID + `","released":[]}`))
	if err := recv(t, stopped); !errors.Is(err, context.DeadlineExceeded) || errors.Is(err, workers.ErrHandlersLeftRunning) {
		t.Fatalf("Stop: %v, want its ctx's error alone", err)
	}
}

// TestWorkerStopWaitsForItsLastRequests: a complete whose outcome is unknown (unavailable), sent
// again as Stop's ctx runs out and not answered, is cut a second later, and the dequeue it carried is
// then abandoned, in a second more: Stop waits for both, and says no handler was left running (none
// was).
func TestWorkerStopWaitsForItsLastRequests(t *testing.T) {
	t.Parallel()
	srv := natstest.Start(t, nil)
	fake, space, _ := fakeLeasingOnce(t, srv)
	var tries atomic.Int32
	inFlight := make(chan struct{}, 16)
	if _, err := fake.Subscribe(space.Subject(subjects.OpComplete, "q"), func(m *nats.Msg) {
		if tries.Add(1) == 1 {
			_ = m.Respond([]byte(`{"error":{"code":"unavailable","message":"outcome unknown"}}`))
			return
		}
		inFlight <- struct{}{} // never answered
	}); err != nil {
		t.Fatal(err)
	}
	abandons := make(chan struct{}, 16)
	if _, err := fake.Subscribe(space.Subject(subjects.OpAbandon, "q"), func(*nats.Msg) { abandons <- struct{}{} }); err != nil {
		t.Fatal(err) // never answered
	}
	w := startOwn(t, clientOnFake(t, srv, fake, time.Hour), &workers.WorkerConfig{Queue: "q", PollWait: time.Millisecond},
		workers.HandlerFunc(func(context.Context, *workers.Job) error { return nil }))
	recv(t, inFlight)
	err := stopWithin(t, w, 100*time.Millisecond)
	if !errors.Is(err, context.DeadlineExceeded) || !errors.Is(err, workers.ErrUnsettled) || errors.Is(err, workers.ErrHandlersLeftRunning) || strings.Contains(err.Error(), "left to end") {
		t.Fatalf("Stop: %v, want its ctx's error and the complete unconfirmed: every goroutine returned, no handler left", err)
	}
	select {
	case <-abandons:
	default:
		t.Fatal("Stop returned without abandoning the dequeue the unanswered complete carried")
	}
}

// TestWorkerStopReleasesBeforeAShortLeaseEnds: the wait for a handler to unwind, during which
// nothing extends the lease, ends in time for the release to land before the lease does: a handler
// slower to unwind than its lease of 300 ms has left does not get its message's last attempt spent
// (errored) by the stop.
func TestWorkerStopReleasesBeforeAShortLeaseEnds(t *testing.T) {
	t.Parallel()
	e := setup(t)
	e.createQueue("q", &workers.QueueOpts{MaxAttempts: 1})
	e.enqueue("q", "x", &workers.EnqueueOpts{ID: "m1"})
	started, unwound := make(chan struct{}), make(chan struct{})
	w := startOwn(t, e.c, &workers.WorkerConfig{Queue: "q", Lease: 300 * time.Millisecond}, workers.HandlerFunc(func(ctx context.Context, _ *workers.Job) error {
		close(started)
		<-ctx.Done()
		<-unwound
		return nil
	}))
	recv(t, started)
	stopped := make(chan error, 1)
	go func() { stopped <- stopWithin(t, w, 10*time.Millisecond) }()
	var m workers.Message
	waitFor(t, "m1 released", func() bool {
		m = e.get("q", "m1")
		return m.State != subjects.StateRunning
	})
	close(unwound)
	if m.State != subjects.StatePending || m.Attempts != 0 {
		t.Fatalf("m1 is %s with %d attempts after the stop, want pending, its attempt given back", m.State, m.Attempts)
	}
	if err := recv(t, stopped); !errors.Is(err, context.DeadlineExceeded) {
		t.Fatalf("Stop: %v, want its ctx's error", err)
	}
}

// TestWorkerStopLeavesAMessageItsHandlerCancels: a handler that ignores its context and cancels its
// message meanwhile has it canceled, not released by the stop: a release sent while the cancel was
// unanswered could land first and undo it (the message would run again, the cancel refused).
func TestWorkerStopLeavesAMessageItsHandlerCancels(t *testing.T) {
	t.Parallel()
	srv := natstest.Start(t, nil)
	fake, space, _ := fakeLeasingOnce(t, srv)
	cancels := make(chan *nats.Msg, 1)
	if _, err := fake.Subscribe(space.Subject(subjects.OpCancel, "q"), func(m *nats.Msg) { cancels <- m }); err != nil {
		t.Fatal(err) // answered by the test
	}
	releases, err := fake.SubscribeSync(space.Subject(subjects.OpRelease, "q"))
	if err != nil {
		t.Fatal(err)
	}
	started, canceled := make(chan struct{}), make(chan error, 1)
	w := startOwn(t, clientOnFake(t, srv, fake, time.Hour), &workers.WorkerConfig{Queue: "q", PollWait: time.Millisecond},
		workers.HandlerFunc(func(ctx context.Context, job *workers.Job) error {
			close(started)
			<-ctx.Done()
			canceled <- job.Cancel(context.Background()) // ignoring ctx
			return nil
		}))
	recv(t, started)
	stopped := make(chan error, 1)
	go func() { stopped <- stopWithin(t, w, 10*time.Millisecond) }()
	cancel := recv(t, cancels)
	if err := recv(t, stopped); !errors.Is(err, workers.ErrHandlersLeftRunning) {
		t.Fatalf("Stop: %v, want the handler, in its cancel, left running", err)
	}
	if m, err := releases.NextMsg(time.Millisecond); err == nil {
		t.Fatalf("the stop released the message while its handler's cancel was in flight: %s", m.Data)
	}
	expires := time.Now().UTC()
	reply, _ := json.Marshal(subjects.Message{ID: "m", Queue: "q", State: subjects.StateCanceled, LeaseID: "L", LeaseExpiresAt: &expires})
	_ = cancel.Respond(reply)
	if err := recv(t, canceled); err != nil {
		t.Fatalf("the handler's Cancel: %v", err)
	}
}

// TestWorkerStopSaysWhatItLeftUnsettled: a release that fails as the worker stops (its connection
// closed first, as when an embedded natstone is stopped before its workers) leaves the message
// running until its lease ends: Stop says so rather than return its ctx's error alone.
func TestWorkerStopSaysWhatItLeftUnsettled(t *testing.T) {
	t.Parallel()
	e := setup(t)
	e.createQueue("q", nil)
	e.enqueue("q", "x", &workers.EnqueueOpts{ID: "m"})
	nc := e.srv.Connect(t)
	c, err := workers.NewClient(nc, nil)
	if err != nil {
		t.Fatal(err)
	}
	started := make(chan struct{})
	w := startOwn(t, c, &workers.WorkerConfig{Queue: "q"}, workers.HandlerFunc(func(ctx context.Context, _ *workers.Job) error {
		close(started)
		<-ctx.Done() // Stop's: its release then fails
		return nil
	}))
	recv(t, started)
	nc.Close()
	if err := stopWithin(t, w, 100*time.Millisecond); !errors.Is(err, context.DeadlineExceeded) || !errors.Is(err, workers.ErrUnsettled) {
		t.Fatalf("Stop: %v, want its ctx's error and ErrUnsettled", err)
	}
	if m := e.get("q", "m"); m.State != subjects.StateRunning {
		t.Fatalf("m is %s, want still running under the lease nobody released", m.State)
	}
}

// TestWorkerLeaseLostWithItsQueue: an extend that finds the queue deleted has lost the lease; the
// handler is not left running until the lease's end (an hour here).
func TestWorkerLeaseLostWithItsQueue(t *testing.T) {
	t.Parallel()
	e := setup(t)
	e.createQueue("q", &workers.QueueOpts{Lease: time.Hour})
	e.enqueue("q", "x", &workers.EnqueueOpts{ID: "m1"})
	started, lost := make(chan struct{}, 1), make(chan error, 1)
	e.startWorker(&workers.WorkerConfig{Queue: "q", ExtendEveryFunc: func(time.Duration) time.Duration { return 20 * time.Millisecond }},
		workers.HandlerFunc(func(ctx context.Context, _ *workers.Job) error {
			started <- struct{}{}
			<-ctx.Done()
			lost <- context.Cause(ctx)
			return nil
		}))
	recv(t, started)
	if _, err := e.c.DeleteQueue(ctx(t), "q"); err != nil {
		t.Fatal(err)
	}
	if err := recv(t, lost); !errors.Is(err, workers.ErrLeaseLost) {
		t.Fatalf("handler's context ended with %v, want ErrLeaseLost", err)
	}
}

// TestWorkerHandlerGoexit: a handler that calls runtime.Goexit (as t.FailNow does) instead of
// returning has failed: its message is released, and the worker goes on and stops.
func TestWorkerHandlerGoexit(t *testing.T) {
	t.Parallel()
	e := setup(t)
	e.createQueue("q", nil)
	e.enqueue("q", "x", &workers.EnqueueOpts{ID: "m1"})
	var calls atomic.Int32
	w := e.startWorker(&workers.WorkerConfig{Queue: "q", BackoffFunc: func(int) time.Duration { return time.Hour }},
		workers.HandlerFunc(func(context.Context, *workers.Job) error {
			calls.Add(1)
			runtime.Goexit()
			return nil
		}))
	m := e.waitState("q", "m1", subjects.StateInvisible) // released with its backoff
	if m.Attempts != 1 || calls.Load() != 1 {
		t.Fatalf("after the handler's Goexit: %+v, %d calls", m, calls.Load())
	}
	stop(t, w)
}

// TestWorkerRetriedLeaseReckonedFromTheFirstTry: a lease that came back to a dequeue sent again
// (the first try's reply was lost) began at the first try, not at the retry's reply: reckoned so, it
// has about ended when the retry's reply comes. Its handler does not start until an extend confirms
// the lease, and with the broker not answering extends it never starts: the worker gives the
// message up and polls again, rather than run it while another worker may have it.
func TestWorkerRetriedLeaseReckonedFromTheFirstTry(t *testing.T) {
	t.Parallel()
	srv := natstest.Start(t, nil)
	const lease, timeout = 3 * time.Second, 3 * time.Second
	var retry []byte
	fake, space, polls := fakeDequeues(t, srv, func(n int32) []byte {
		switch n {
		case 1:
			_, retry = leasedReplyFor(t, time.Now(), lease)
			return nil // its reply is lost
		case 2:
			return retry
		}
		return []byte(`{"messages":[]}`)
	})
	extends := make(chan struct{}, 16)
	if _, err := fake.Subscribe(space.Subject(subjects.OpExtend, "q"), func(*nats.Msg) { extends <- struct{}{} }); err != nil {
		t.Fatal(err) // never answered
	}
	ran := make(chan struct{}, 1)
	workerOnFake(t, srv, fake, timeout, func(ctx context.Context, _ *workers.Job) error {
		ran <- struct{}{}
		<-ctx.Done()
		return ctx.Err()
	})
	first, again := recv(t, polls), recv(t, polls)
	if again.RequestID != first.RequestID {
		t.Fatalf("the retry's request id %q, want the first try's %q", again.RequestID, first.RequestID)
	}
	recv(t, extends) // the worker asks the broker to confirm the lease
	recv(t, polls)   // and, unanswered, gives the message up
	select {
	case <-ran:
		t.Fatal("the handler ran on a lease that could not be confirmed")
	default:
	}
}

// TestWorkerNextLeaseReckonedFromItsSettle: a message a complete leased for the slot (next) began its
// lease once the broker had the complete, which the worker knows to be after it sent it, not when the
// reply came. With a broker that stops answering, its handler is told the lease is lost as soon as
// that reckoning says it ended: here a reply slow by 1.5 s of a 2 s lease leaves it half a second
// (told at the first extension, two thirds of a second in), not the 2 s reckoned from the reply.
func TestWorkerNextLeaseReckonedFromItsSettle(t *testing.T) {
	t.Parallel()
	srv := natstest.Start(t, nil)
	const lease, slow = 2 * time.Second, 1500 * time.Millisecond
	fake, space, first := fakeLeasingOnce(t, srv)
	var completes atomic.Int32
	if _, err := fake.Subscribe(space.Subject(subjects.OpComplete, "q"), func(m *nats.Msg) {
		if completes.Add(1) > 1 {
			return // the next's: never answered
		}
		time.AfterFunc(slow, func() {
			next, _ := leasedReplyFor(t, time.Now(), lease)
			next.ID = "n"
			done := first
			done.State, done.LeaseID, done.LeaseExpiresAt = subjects.StateCompleted, "", nil
			reply, err := json.Marshal(subjects.SettleReply{Message: done, Next: &subjects.NextReply{Messages: []subjects.Message{next}}})
			if err != nil {
				panic(err)
			}
			_ = m.Respond(reply)
		})
	}); err != nil {
		t.Fatal(err)
	}
	if _, err := fake.Subscribe(space.Subject(subjects.OpExtend, "q"), func(*nats.Msg) {}); err != nil {
		t.Fatal(err) // never answered
	}
	type end struct {
		after time.Duration
		cause error
	}
	ended := make(chan end, 1)
	workerOnFake(t, srv, fake, time.Hour, func(ctx context.Context, job *workers.Job) error {
		if job.ID != "n" {
			return nil
		}
		began := time.Now()
		<-ctx.Done()
		ended <- end{time.Since(began), context.Cause(ctx)}
		return nil
	})
	got := recv(t, ended)
	if !errors.Is(got.cause, workers.ErrLeaseLost) || got.after > lease-slow+time.Second*4/5 {
		t.Fatalf("n's handler ended %v in, by %v; want lease lost within %v (2/3 s, at its first extension)", got.after, got.cause, lease-slow+time.Second*4/5)
	}
}

// TestWorkerStopIdle: Stop of a worker running no handler has nothing to interrupt, so it returns
// nil even with its ctx done already.
func TestWorkerStopIdle(t *testing.T) {
	t.Parallel()
	e := setup(t)
	e.createQueue("q", nil)
	polls := e.count(subjects.OpDequeue, "q")
	w := e.startWorker(&workers.WorkerConfig{Queue: "q", Concurrency: 4, PollWait: time.Minute}, workers.HandlerFunc(func(context.Context, *workers.Job) error {
		t.Error("no message to handle")
		return nil
	}))
	waitFor(t, "the slots' long polls", func() bool { return polls.n(t) == 4 })
	sctx, cancel := context.WithCancel(context.Background())
	cancel()
	if err := w.Stop(sctx); err != nil {
		t.Fatalf("Stop of an idle worker: %v, want nil", err)
	}
}

// TestWorkerStopAbandonsItsPolls: the long polls a worker leaves at its stop are abandoned at the
// broker, so a message enqueued after Stop returns is not leased to them (to stay running,
// unprocessed, until its lease ends) but pending for the next worker, its attempts untouched.
func TestWorkerStopAbandonsItsPolls(t *testing.T) {
	t.Parallel()
	e := setup(t)
	e.createQueue("q", &workers.QueueOpts{MaxAttempts: 1})
	polls := e.count(subjects.OpDequeue, "q")
	abandons := e.count(subjects.OpAbandon, "q")
	w := e.startWorker(&workers.WorkerConfig{Queue: "q", Concurrency: 3, PollWait: time.Minute}, workers.HandlerFunc(func(context.Context, *workers.Job) error {
		t.Error("the worker handled a message after its stop")
		return nil
	}))
	waitFor(t, "the slots' long polls", func() bool { return polls.n(t) == 3 })
	stop(t, w)
	if n := abandons.n(t); n != 3 {
		t.Fatalf("the stop abandoned %d polls, want 3", n)
	}
	e.enqueue("q", "after the stop", &workers.EnqueueOpts{ID: "m"})
	ms, err := e.c.Dequeue(ctx(t), "q", nil)
	if err != nil {
		t.Fatal(err)
	}
	if len(ms) != 1 || ms[0].ID != "m" || ms[0].Attempts != 1 {
		t.Fatalf("the next dequeue got %+v, want m at its first attempt: a poll the stop left leased it", ms)
	}
}

// TestWorkerStopAbandonsARetriedPoll: a poll whose first try's outcome was unknown (the broker
// answered unavailable, as one stopping does) is retried with its request id; a stop during that
// retry abandons the id, as it would the first try.
func TestWorkerStopAbandonsARetriedPoll(t *testing.T) {
	t.Parallel()
	srv := natstest.Start(t, nil)
	fake, space, reqs := fakeDequeues(t, srv, func(n int32) []byte {
		if n == 1 {
			return []byte(`{"error":{"code":"unavailable","message":"the broker stopped during the wait"}}`)
		}
		return nil // the retry waits, as a long poll at the next broker does
	})
	abandons, err := fake.SubscribeSync(space.Subject(subjects.OpAbandon, "q"))
	if err != nil {
		t.Fatal(err)
	}
	c := clientOnFake(t, srv, fake, 0)
	w := startWorker(t, c, &workers.WorkerConfig{Queue: "q", PollWait: time.Minute}, workers.HandlerFunc(func(context.Context, *workers.Job) error { return nil }))
	first, retry := recv(t, reqs), recv(t, reqs)
	if first.RequestID == "" || retry.RequestID != first.RequestID {
		t.Fatalf("the retry's request id %q, the first's %q: want the same", retry.RequestID, first.RequestID)
	}
	stopped := make(chan error, 1)
	go func() { stopped <- w.Stop(context.Background()) }()
	m, err := abandons.NextMsg(waitTimeout)
	if err != nil {
		t.Fatalf("the stop abandoned nothing: %v", err)
	}
	if got := decode[subjects.AbandonRequest](t, m.Data); got.RequestID != first.RequestID {
		t.Fatalf("the stop abandoned %q, want the retried poll's %q", got.RequestID, first.RequestID)
	}
	_ = m.Respond([]byte(`{"request_id":"` + first.RequestID + `","released":[]}`))
	if err := recv(t, stopped); err != nil {
		t.Fatal(err)
	}
}

// TestWorkerRetriedLeaseOlderThanALease: a dequeue id the broker kept answering unavailable for
// longer than a lease, and that then leased: reckoned from its first try, the lease has ended
// already, yet the broker holds it (it just said so). The worker extends it at once, whatever that
// reckoning, instead of giving the message up as lost.
func TestWorkerRetriedLeaseOlderThanALease(t *testing.T) {
	t.Parallel()
	srv := natstest.Start(t, nil)
	const unavailable = 10 // requests: five polls (each tried twice), backing off 0.1 s, 0.2 s, … in between
	fake, space, _ := fakeDequeues(t, srv, func(n int32) []byte {
		switch {
		case n <= unavailable:
			return []byte(`{"error":{"code":"unavailable","message":"a write's outcome is unknown"}}`)
		case n == unavailable+1:
			_, reply := leasedReplyFor(t, time.Now(), time.Second)
			return reply
		}
		return []byte(`{"messages":[]}`)
	})
	extended := make(chan struct{}, 16)
	if _, err := fake.Subscribe(space.Subject(subjects.OpExtend, "q"), func(m *nats.Msg) {
		extended <- struct{}{}
		expires := time.Now().Add(time.Second).UTC()
		reply, _ := json.Marshal(subjects.Message{ID: "m", Queue: "q", State: subjects.StateRunning, LeaseID: "L", LeaseExpiresAt: &expires})
		_ = m.Respond(reply)
	}); err != nil {
		t.Fatal(err)
	}
	if _, err := fake.Subscribe(space.Subject(subjects.OpComplete, "q"), func(m *nats.Msg) {
		_ = m.Respond([]byte(`{"id":"m","queue":"q","state":"completed","next":{"messages":[]}}`))
	}); err != nil {
		t.Fatal(err)
	}
	cut, done := make(chan error, 1), make(chan struct{})
	workerOnFake(t, srv, fake, time.Second, func(ctx context.Context, _ *workers.Job) error {
		select {
		case <-ctx.Done():
			cut <- context.Cause(ctx)
		case <-done:
		}
		return nil
	})
	select {
	case <-extended:
	case err := <-cut:
		t.Fatalf("the handler was cut (%v) before any extend was sent", err)
	case <-time.After(waitTimeout):
		t.Fatal("no extend sent")
	}
	close(done)
}

// lineSignal is a log writer that signals each line containing want.
type lineSignal struct {
	want string
	seen chan struct{}
}

func (l *lineSignal) Write(p []byte) (int, error) {
	if strings.Contains(string(p), l.want) {
		select {
		case l.seen <- struct{}{}:
		default:
		}
	}
	return len(p), nil
}

// TestWorkerKeepsAnUncertainDequeueIDWithoutABroker: a dequeue answered unavailable (a broker
// stopping), whose immediate retry finds no broker at all (the gap before the next one serves),
// keeps its request id: the next poll sends it again, so the next broker can return what the first
// leased, instead of that message running unprocessed until its lease ends.
func TestWorkerKeepsAnUncertainDequeueIDWithoutABroker(t *testing.T) {
	t.Parallel()
	srv := natstest.Start(t, nil)
	space, _ := subjects.NewSpace("")
	fake := srv.Connect(t)
	ids := make(chan string, 64)
	stopping := make(chan struct{})
	var first *nats.Subscription
	first, err := fake.Subscribe(space.Subject(subjects.OpDequeue, "q"), func(m *nats.Msg) {
		ids <- decode[subjects.DequeueRequest](t, m.Data).RequestID
		_ = first.Unsubscribe() // this broker is gone once it answered
		_ = fake.Flush()
		_ = m.Respond([]byte(`{"error":{"code":"unavailable","message":"the broker is stopping"}}`))
		close(stopping)
	})
	if err != nil {
		t.Fatal(err)
	}
	c := clientOnFake(t, srv, fake, 0)
	failed := &lineSignal{want: "dequeue failed", seen: make(chan struct{}, 1)}
	startWorker(t, c, &workers.WorkerConfig{Queue: "q", PollWait: time.Millisecond, Logger: slog.New(slog.NewTextHandler(failed, nil))},
		workers.HandlerFunc(func(context.Context, *workers.Job) error { return nil }))
	sent := recv(t, ids)
	recv(t, stopping)
	recv(t, failed.seen) // its retry found no responders
	// The next broker serves.
	if _, err := fake.Subscribe(space.Subject(subjects.OpDequeue, "q"), func(m *nats.Msg) {
		ids <- decode[subjects.DequeueRequest](t, m.Data).RequestID
		_ = m.Respond([]byte(`{"messages":[]}`))
	}); err != nil {
		t.Fatal(err)
	}
	if err := fake.Flush(); err != nil {
		t.Fatal(err)
	}
	if next := recv(t, ids); next != sent {
		t.Fatalf("the poll after the gap sent request id %q, want the uncertain %q", next, sent)
	}
}

// TestWorkerPollParkedAtAGoneBrokerSentAgain: the slots whose long polls are parked at a broker that
// dies while its NATS server stays up poll again as soon as the next broker announces that it
// serves, not after their PollWait and the client's timeout (here 5 min and 10 s); the worker says
// so once, at INFO, not once per slot.
func TestWorkerPollParkedAtAGoneBrokerSentAgain(t *testing.T) {
	t.Parallel()
	srv := natstest.Start(t, nil)
	gone, _, parked := parkedDequeues(t, srv)
	c := clientOnFake(t, srv, gone, 0)
	got := make(chan string, 4)
	logs := &natstest.LogBuffer{}
	startWorker(t, c, &workers.WorkerConfig{Queue: "q", Concurrency: 4, PollWait: subjects.MaxWait, Logger: slogTo(logs)},
		workers.HandlerFunc(func(_ context.Context, job *workers.Job) error {
			got <- job.ID
			return nil
		}))
	for range 4 {
		recv(t, parked)
	}
	gone.Close() // the broker dies; its NATS server stays up
	startBroker(t, srv, nil)
	if _, err := c.Enqueue(ctx(t), "q", []byte("m"), &workers.EnqueueOpts{ID: "m1"}); err != nil {
		t.Fatal(err)
	}
	if id := recv(t, got); id != "m1" {
		t.Fatalf("handled %q, want m1", id)
	}
	waitCompleted(t, c, "q", "m1") // before the broker stops, at the test's end
	if levels := logLevels(logs.String(), "dequeue's outcome unknown; retrying it"); !slices.Equal(levels, []string{"INFO"}) {
		t.Fatalf("the cut polls said at %v, want INFO once (the others at DEBUG):\n%s", levels, logs.String())
	}
}

// TestWorkerSaysUnknownOutcomesOnce: polls whose replies do not come in time, each mended by its
// retry (a broker gone silent, the slots' time outs spread), are said at WARN once in ten seconds,
// not once per slot's time out.
func TestWorkerSaysUnknownOutcomesOnce(t *testing.T) {
	t.Parallel()
	srv := natstest.Start(t, nil)
	space, _ := subjects.NewSpace("")
	fake := srv.Connect(t)
	var mu sync.Mutex
	tries := map[string]int{}
	if _, err := fake.Subscribe(space.Subject(subjects.OpDequeue, "q"), func(m *nats.Msg) {
		id := decode[subjects.DequeueRequest](t, m.Data).RequestID
		mu.Lock()
		tries[id]++
		again := tries[id] > 1
		mu.Unlock()
		if again {
			_ = m.Respond([]byte(`{"messages":[]}`)) // the retry, answered
		} // a first try is never answered
	}); err != nil {
		t.Fatal(err)
	}
	logs := &natstest.LogBuffer{}
	startWorker(t, clientOnFake(t, srv, fake, 50*time.Millisecond), &workers.WorkerConfig{Queue: "q", Concurrency: 4, PollWait: 50 * time.Millisecond, Logger: debugTo(logs)},
		workers.HandlerFunc(func(context.Context, *workers.Job) error { return nil }))
	waitFor(t, "twelve polls retried", func() bool {
		return len(logLevels(logs.String(), "dequeue's outcome unknown; retrying it")) >= 12
	})
	levels := logLevels(logs.String(), "dequeue's outcome unknown; retrying it")
	if warns := countOf(levels, "WARN"); warns != 1 || levels[0] != "WARN" {
		t.Fatalf("%d polls retried said at %v, want WARN for the first only", len(levels), levels)
	}
	if lines := logLevels(logs.String(), "dequeue failed"); len(lines) > 0 {
		t.Fatalf("retries that worked said as failed polls: %v", lines)
	}
}

// TestWorkerPollCutTwiceSaidAsACut: a poll whose retry is cut too (at a reconnect, then by a
// broker's announcement) is sent again with its id and said as a cut, not as a failed poll.
func TestWorkerPollCutTwiceSaidAsACut(t *testing.T) {
	t.Parallel()
	srv := natstest.Start(t, nil)
	fake, space, sent := parkedDequeues(t, srv)
	logs := &natstest.LogBuffer{}
	startWorker(t, clientOnFake(t, srv, fake, 0), &workers.WorkerConfig{Queue: "q", PollWait: subjects.MaxWait, Logger: debugTo(logs)},
		workers.HandlerFunc(func(context.Context, *workers.Job) error { return nil }))
	announce := func() {
		t.Helper()
		if err := fake.Publish(space.Serving(), []byte(`{}`)); err != nil {
			t.Fatal(err)
		}
	}
	id := recv(t, sent)
	announce() // cuts the poll: its retry goes out
	if again := recv(t, sent); again != id {
		t.Fatalf("the cut poll sent again as %q, want its id %q", again, id)
	}
	announce() // cuts the retry
	if again := recv(t, sent); again != id {
		t.Fatalf("the poll cut twice sent again as %q, want its id %q", again, id)
	}
	waitFor(t, "the second cut said", func() bool { return strings.Contains(logs.String(), `msg="dequeue cut again; sending it again"`) })
	if lines := logLevels(logs.String(), "dequeue failed"); len(lines) > 0 {
		t.Fatalf("the poll cut twice said as a failed poll, at %v:\n%s", lines, logs.String())
	}
	if levels := logLevels(logs.String(), "dequeue's outcome unknown; retrying it"); !slices.Equal(levels, []string{"INFO"}) {
		t.Fatalf("the first cut said at %v, want INFO", levels)
	}
}

// TestWorkerPollSentAgainAfterAForcedReconnect: a poll whose wait nats.go drops at a forced
// reconnect of the worker's connection (ForceReconnect, as a rotation of credentials calls) is of
// unknown outcome: sent again at once with its request id, so that what it may have leased is not
// left running for nobody.
func TestWorkerPollSentAgainAfterAForcedReconnect(t *testing.T) {
	t.Parallel()
	srv := natstest.Start(t, nil)
	_, _, sent := parkedDequeues(t, srv)
	nc := srv.Connect(t)
	c, err := workers.NewClient(nc, &workers.Config{IgnoreAnnouncements: true})
	if err != nil {
		t.Fatal(err)
	}
	startWorker(t, c, &workers.WorkerConfig{Queue: "q", PollWait: subjects.MaxWait, Logger: slogTo(&natstest.LogBuffer{})},
		workers.HandlerFunc(func(context.Context, *workers.Job) error { return nil }))
	id := recv(t, sent)
	if err := nc.ForceReconnect(); err != nil {
		t.Fatal(err)
	}
	if again := recv(t, sent); again != id {
		t.Fatalf("the poll dropped at the reconnect sent again as %q, want its id %q", again, id)
	}
}

// waitCompleted waits until message id of queue is completed.
func waitCompleted(t *testing.T, c *workers.Client, queue, id string) {
	t.Helper()
	waitFor(t, id+" completed", func() bool {
		m, err := c.Get(ctx(t), queue, id)
		return err == nil && m.State == subjects.StateCompleted
	})
}

// TestWorkerBackoffEndsWhenABrokerServes: a slot backing off after failed polls (no broker) polls
// again as soon as a broker announces that it serves, not at the end of its backoff (here an hour).
func TestWorkerBackoffEndsWhenABrokerServes(t *testing.T) {
	t.Parallel()
	srv := natstest.Start(t, nil)
	c, err := workers.NewClient(srv.Connect(t), nil)
	if err != nil {
		t.Fatal(err)
	}
	failed := &lineSignal{want: "dequeue failed", seen: make(chan struct{}, 1)}
	got := make(chan string, 1)
	w, err := workers.NewWorker(c, &workers.WorkerConfig{Queue: "q", Logger: slog.New(slog.NewTextHandler(failed, nil))},
		workers.HandlerFunc(func(_ context.Context, job *workers.Job) error {
			got <- job.ID
			return nil
		}))
	if err != nil {
		t.Fatal(err)
	}
	workers.SetPollRetry(w, func(_ int, err error) time.Duration {
		if errors.Is(err, nats.ErrNoResponders) {
			return time.Hour
		}
		return 10 * time.Millisecond // the queue not found, just after the broker started
	})
	if err := w.Start(t.Context()); err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() {
		if err := stopWithin(t, w, waitTimeout); err != nil {
			t.Errorf("stop worker: %v", err)
		}
	})
	recv(t, failed.seen) // no responders: the slot backs off for an hour
	startBroker(t, srv, nil)
	if _, err := c.Enqueue(ctx(t), "q", []byte("m"), &workers.EnqueueOpts{ID: "m1"}); err != nil {
		t.Fatal(err)
	}
	if id := recv(t, got); id != "m1" {
		t.Fatalf("handled %q, want m1", id)
	}
	waitCompleted(t, c, "q", "m1")
}

// TestWorkerStopLeavesAHandlerThatIgnoresItsContext: a handler that ignores its context does not
// hold Stop past its ctx for good: the message is released, Stop returns ctx's error once its grace
// is over, and a second Stop waits for the handler to return.
func TestWorkerStopLeavesAHandlerThatIgnoresItsContext(t *testing.T) {
	t.Parallel()
	e := setup(t)
	e.createQueue("q", nil)
	e.enqueue("q", "x", &workers.EnqueueOpts{ID: "m1"})
	started, unblock := make(chan struct{}), make(chan struct{})
	w := startOwn(t, e.c, &workers.WorkerConfig{Queue: "q"}, workers.HandlerFunc(func(context.Context, *workers.Job) error {
		close(started)
		<-unblock // a blocking call that takes no context
		return nil
	}))
	recv(t, started)
	if err := stopWithin(t, w, 100*time.Millisecond); !errors.Is(err, context.DeadlineExceeded) || !errors.Is(err, workers.ErrHandlersLeftRunning) || !strings.Contains(err.Error(), "left to return on their own") {
		t.Fatalf("Stop: %v, want its ctx's error, saying a handler was left running", err)
	}
	if m := e.get("q", "m1"); m.State != subjects.StatePending || m.Attempts != 0 {
		t.Fatalf("after Stop: %s with %d attempts, want pending with its attempt given back", m.State, m.Attempts)
	}
	close(unblock)
	again, cancel2 := context.WithTimeout(context.Background(), waitTimeout)
	defer cancel2()
	if err := w.Stop(again); err != nil {
		t.Fatalf("second Stop: %v, want nil once the handler returned", err)
	}
}

// TestWorkerSettleRetriesEvery2sAtMost: a complete refused (unavailable: a broker taking over) is
// sent again with backoff capped at 2 s, not at the polls' 10 s: its lease runs meanwhile,
// and an operator's trial saw completes land 4–5 s after the standby served.
func TestWorkerSettleRetriesEvery2sAtMost(t *testing.T) {
	t.Parallel()
	srv := natstest.Start(t, nil)
	fake, space, msg := fakeLeasingOnce(t, srv)
	done := msg
	done.State, done.LeaseID, done.LeaseExpiresAt = subjects.StateCompleted, "", nil
	settled, err := json.Marshal(subjects.SettleReply{Message: done, Next: &subjects.NextReply{Messages: []subjects.Message{}}})
	if err != nil {
		t.Fatal(err)
	}
	at := make(chan time.Time, 16)
	var tries atomic.Int32
	if _, err := fake.Subscribe(space.Subject(subjects.OpComplete, "q"), func(m *nats.Msg) {
		at <- time.Now()
		if tries.Add(1) > 7 { // the broker serves again at the eighth
			_ = m.Respond(settled)
			return
		}
		_ = m.Respond([]byte(`{"error":{"code":"unavailable","message":"the broker has not renewed its claim on the store in time"}}`))
	}); err != nil {
		t.Fatal(err)
	}
	logs := &natstest.LogBuffer{}
	startWorker(t, clientOnFake(t, srv, fake, 0), &workers.WorkerConfig{Queue: "q", PollWait: time.Millisecond, Logger: debugTo(logs)},
		workers.HandlerFunc(func(context.Context, *workers.Job) error { return nil }))
	// Tries 100 ms apart, doubling: the 7th wait would be 6.4 s (±25 %) without the cap.
	last := <-at
	for i := range 7 {
		var next time.Time
		select {
		case next = <-at:
		case <-time.After(10 * time.Second):
			t.Fatalf("complete %d not sent again within 10s", i+2)
		}
		if gap := next.Sub(last); gap > 4*time.Second {
			t.Fatalf("complete %d sent %v after the one before, want 2 s at most (with 2 s to spare)", i+2, gap)
		}
		last = next
	}
	// Seven failures say so at WARN three times (the 1st, 2nd and 4th), and at DEBUG between; the
	// complete that lands at last says so at INFO.
	waitFor(t, "the complete's landing logged", func() bool { return strings.Contains(logs.String(), `msg="complete landed" queue=q`) })
	if got, want := logLevels(logs.String(), "complete failed; retrying"), []string{"WARN", "WARN", "DEBUG", "WARN", "DEBUG", "DEBUG", "DEBUG"}; !slices.Equal(got, want) {
		t.Fatalf("the failed completes logged at %v, want %v", got, want)
	}
	if !strings.Contains(logs.String(), `msg="complete landed" queue=q message_id=m lease_id=L attempt=1 tries=8`) {
		t.Fatalf("no INFO line of the complete landed at its 8th try in:\n%s", logs.String())
	}
}

// TestWorkerSaysLessOfEachFailedPoll: a worker whose polls fail (the broker unavailable) says so
// at WARN for the 1st, 2nd and 4th failure in a row and at DEBUG between, without the line of
// each poll's immediate retry once it is failing; it says at INFO when a poll works again. A poll
// that found no queue before is not one of those failures: it is said apart.
func TestWorkerSaysLessOfEachFailedPoll(t *testing.T) {
	t.Parallel()
	srv := natstest.Start(t, nil)
	fake, _, _ := fakeDequeues(t, srv, func(n int32) []byte {
		switch {
		case n == 1:
			return []byte(`{"error":{"code":"queue_not_found","message":"no queue q"}}`)
		case n <= 8:
			return []byte(`{"error":{"code":"unavailable","message":"the broker is stopping"}}`)
		}
		return []byte(`{"messages":[]}`)
	})
	logs := &natstest.LogBuffer{}
	startWorker(t, clientOnFake(t, srv, fake, 0), &workers.WorkerConfig{Queue: "q", PollWait: time.Millisecond, Logger: debugTo(logs)},
		workers.HandlerFunc(func(context.Context, *workers.Job) error { return nil }))
	waitFor(t, "the poll that works logged", func() bool { return strings.Contains(logs.String(), `msg="dequeue works again"`) })
	out := logs.String()
	// Seven answers unavailable, an unknown outcome each: each poll fails with its immediate retry
	// (the next poll sends the same request id), three in a row, and the retry of the fourth works.
	if got, want := logLevels(out, "dequeue failed"), []string{"WARN", "WARN", "DEBUG"}; !slices.Equal(got, want) {
		t.Fatalf("the failed polls logged at %v, want %v:\n%s", got, want, out)
	}
	if got, want := logLevels(out, "dequeue's outcome unknown; retrying it"), []string{"WARN", "DEBUG", "DEBUG", "DEBUG"}; !slices.Equal(got, want) {
		t.Fatalf("the polls' retries logged at %v, want %v:\n%s", got, want, out)
	}
	if got := logLevels(out, "queue not found; polling again every second until it exists"); !slices.Equal(got, []string{"WARN"}) {
		t.Fatalf("the poll that found no queue logged at %v, want WARN:\n%s", got, out)
	}
	if !strings.Contains(out, `level=INFO msg="dequeue works again" queue=q failures=3 after=`) {
		t.Fatalf("no INFO line of the polls working again after 3 failures in:\n%s", out)
	}
}

// TestWorkerSaysAnOutageAFewTimes: the slots of a worker whose polls fail together (a broker
// restarting) say so as one: WARN for the worker's 1st, 2nd, 4th, 8th… failure in a row, not for
// each slot's, and one INFO line when the polls work again; a missing queue, once (twice when a
// slot's last "not found" comes in after another slot's first poll that found it).
func TestWorkerSaysAnOutageAFewTimes(t *testing.T) {
	t.Parallel()
	for _, c := range []struct {
		name, answer, line string
		most               int    // WARN lines of line at most: 8 slots said 16 (unavailable) and 8 (not found) when each said its own
		over               string // the line said once the answers are empty
		again              bool   // whether "dequeue works again" is said, once (twice if a failure comes in after a success)
	}{
		{"unavailable", `{"error":{"code":"unavailable","message":"the broker is stopping"}}`, "dequeue failed", 7, `msg="dequeue works again"`, true},
		{"queue not found", `{"error":{"code":"queue_not_found","message":"no queue q"}}`, "queue not found; polling again every second until it exists", 2, `msg="dequeue returned early"`, false},
	} {
		t.Run(c.name, func(t *testing.T) {
			t.Parallel()
			srv := natstest.Start(t, nil)
			fake, _, _ := fakeDequeues(t, srv, func(n int32) []byte {
				if n <= 32 {
					return []byte(c.answer)
				}
				return []byte(`{"messages":[]}`) // at once, where the worker waits up to a second: early
			})
			logs := &natstest.LogBuffer{}
			startWorker(t, clientOnFake(t, srv, fake, 0), &workers.WorkerConfig{Queue: "q", Concurrency: 8, PollWait: time.Second, Logger: debugTo(logs)},
				workers.HandlerFunc(func(context.Context, *workers.Job) error { return nil }))
			waitFor(t, "a poll that works", func() bool { return strings.Contains(logs.String(), c.over) })
			out := logs.String()
			if warns := countOf(logLevels(out, c.line), "WARN"); warns < 1 || warns > c.most {
				t.Fatalf("%d WARN lines of %q, want 1 to %d:\n%s", warns, c.line, c.most, out)
			}
			if n := len(logLevels(out, "dequeue works again")); c.again && (n < 1 || n > 2) || !c.again && n != 0 {
				t.Fatalf("%d lines of the polls working again, want %v:\n%s", n, c.again, out)
			}
			if warns := countOf(logLevels(out, "dequeue's outcome unknown; retrying it"), "WARN"); c.again && warns > 5 {
				t.Fatalf("%d WARN lines of the dequeues retried, want 4 (the 1st, 2nd, 4th and 8th), 5 at most:\n%s", warns, out)
			}
		})
	}
}

// TestWorkerSaysABlockOnce: a queue whose dequeues an operator blocks is said blocked once per
// worker, and unblocked once when a slot that found it blocked dequeues again; a slot whose poll was
// parked before the block, answered empty at the end of its wait, says nothing of it.
func TestWorkerSaysABlockOnce(t *testing.T) {
	t.Parallel()
	srv := natstest.Start(t, nil)
	space, _ := subjects.NewSpace("")
	fake := srv.Connect(t)
	logs := &natstest.LogBuffer{}
	blocked := `{"error":{"code":"queue_blocked","message":"dequeues of q are blocked"}}`
	var n atomic.Int32
	if _, err := fake.Subscribe(space.Subject(subjects.OpDequeue, "q"), func(m *nats.Msg) {
		switch i := n.Add(1); {
		case i == 2: // parked before the block, its wait ends once the block was said
			go func() {
				tick := time.NewTicker(10 * time.Millisecond)
				defer tick.Stop()
				for end := time.Now().Add(waitTimeout); !strings.Contains(logs.String(), "queue's dequeues blocked") && time.Now().Before(end); {
					<-tick.C
				}
				_ = m.Respond([]byte(`{"messages":[]}`))
			}()
		case i <= 8:
			_ = m.Respond([]byte(blocked))
		default:
			_ = m.Respond([]byte(`{"messages":[]}`))
		}
	}); err != nil {
		t.Fatal(err)
	}
	startWorker(t, clientOnFake(t, srv, fake, 0), &workers.WorkerConfig{Queue: "q", Concurrency: 2, PollWait: time.Second, Logger: debugTo(logs)},
		workers.HandlerFunc(func(context.Context, *workers.Job) error { return nil }))
	waitFor(t, "the unblock said, and the polls after it", func() bool {
		return strings.Contains(logs.String(), "queue unblocked") && n.Load() > 10
	})
	var said []string
	for line := range strings.Lines(logs.String()) {
		switch {
		case strings.Contains(line, "queue's dequeues blocked"):
			said = append(said, "blocked")
		case strings.Contains(line, "queue unblocked"):
			said = append(said, "unblocked")
		}
	}
	if !slices.Equal(said, []string{"blocked", "unblocked"}) {
		t.Fatalf("said %v, want blocked then unblocked, once each:\n%s", said, logs.String())
	}
}

// countOf returns how many of levels are level.
func countOf(levels []string, level string) int {
	n := 0
	for _, l := range levels {
		if l == level {
			n++
		}
	}
	return n
}

// debugTo returns a logger that writes every level to logs.
func debugTo(logs *natstest.LogBuffer) *slog.Logger {
	return slog.New(slog.NewTextHandler(logs, &slog.HandlerOptions{Level: slog.LevelDebug}))
}

// logLevels returns the levels, in order, of the text log's lines whose message is msg.
func logLevels(text, msg string) []string {
	var levels []string
	for line := range strings.Lines(text) {
		if level, ok := strings.CutPrefix(strings.Fields(line)[1], "level="); ok && strings.Contains(line, ` msg="`+msg+`"`) {
			levels = append(levels, level)
		}
	}
	return levels
}
