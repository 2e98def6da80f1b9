package workers_test

import (
	"context"
	"encoding/json"
	"io"
	"log/slog"
	"testing"
	"time"

	"github.com/nats-io/nats.go"

	"github.com/natstone/natstone/broker"
	"github.com/natstone/natstone/broker/clock"
	"github.com/natstone/natstone/subjects"
	"github.com/natstone/natstone/test/natstest"
	"github.com/natstone/natstone/workers"
)

// waitTimeout bounds every wait of a test: long enough for a loaded CI machine, short enough to
// fail a hung test in reasonable time.
const waitTimeout = 20 * time.Second

// t0 is the fake clock's start.
var t0 = time.UnixMilli(1_700_000_000_000).UTC()

// env is one test's natstone: an in-process JetStream server, a broker and a client.
type env struct {
	t     testing.TB
	srv   *natstest.Server
	clk   *clock.Fake // nil unless the broker runs on a fake clock
	c     *workers.Client
	space subjects.Space
}

// setup starts a server and a broker on the real clock, and a client.
func setup(t *testing.T) *env {
	t.Helper()
	return start(t, nil, nil)
}

// setupB is setup for a benchmark.
func setupB(b *testing.B) *env {
	b.Helper()
	return start(b, nil, nil)
}

// setupFake starts a server and a broker on a fake clock, and a client.
func setupFake(t *testing.T) *env {
	t.Helper()
	return start(t, clock.NewFake(t0), nil)
}

// start starts a server with opts (nil: the defaults), a broker on clk (nil: the wall clock) and a
// client.
func start(t testing.TB, clk *clock.Fake, opts *natstest.Options) *env {
	t.Helper()
	e := &env{t: t, srv: natstest.Start(t, opts), clk: clk}
	startBroker(t, e.srv, clk)
	e.c = e.client(nil)
	e.space, _ = subjects.NewSpace("")
	return e
}

// startBroker starts a broker on srv, on clk (nil: the wall clock), stopped at the test's end.
func startBroker(t testing.TB, srv *natstest.Server, clk *clock.Fake) {
	t.Helper()
	cfg := &broker.Config{
		Conn:          srv.Connect(t),
		MemoryStorage: true,
		Logger:        discard(),
	}
	if clk != nil {
		cfg.Clock = clk
	}
	b, err := broker.New(cfg)
	if err != nil {
		t.Fatal(err)
	}
	ctx, cancel := context.WithTimeout(context.Background(), waitTimeout)
	defer cancel()
	if err := b.Start(ctx); err != nil {
		t.Fatalf("start broker: %v", err)
	}
	t.Cleanup(func() {
		ctx, cancel := context.WithTimeout(context.Background(), waitTimeout)
		defer cancel()
		if err := b.Stop(ctx); err != nil {
			t.Errorf("stop broker: %v", err)
		}
	})
}

// client returns a client on a connection of its own.
func (e *env) client(cfg *workers.Config) *workers.Client {
	e.t.Helper()
	c, err := workers.NewClient(e.srv.Connect(e.t), cfg)
	if err != nil {
		e.t.Fatal(err)
	}
	return c
}

// ctx returns a context bounded by waitTimeout.
func ctx(t testing.TB) context.Context {
	c, cancel := context.WithTimeout(t.Context(), waitTimeout)
	t.Cleanup(cancel)
	return c
}

// createQueue creates a queue with opts or fails the test.
func (e *env) createQueue(name string, opts *workers.QueueOpts) subjects.QueueInfo {
	e.t.Helper()
	info, err := e.c.CreateQueue(ctx(e.t), name, opts)
	if err != nil {
		e.t.Fatalf("create %s: %v", name, err)
	}
	return info
}

// enqueue enqueues payload with opts or fails the test.
func (e *env) enqueue(queue, payload string, opts *workers.EnqueueOpts) subjects.EnqueueReply {
	e.t.Helper()
	r, err := e.c.Enqueue(ctx(e.t), queue, []byte(payload), opts)
	if err != nil {
		e.t.Fatalf("enqueue to %s: %v", queue, err)
	}
	return r
}

// get returns a message or fails the test.
func (e *env) get(queue, id string) workers.Message {
	e.t.Helper()
	m, err := e.c.Get(ctx(e.t), queue, id)
	if err != nil {
		e.t.Fatalf("get %s/%s: %v", queue, id, err)
	}
	return m
}

// waitState waits until the message is in state and returns it.
// failures returns the message's released and errored events from its history, each as
// "<kind>: <the release's error>".
func (e *env) failures(queue, id string) []string {
	e.t.Helper()
	hist, err := e.c.History(ctx(e.t), queue, id, 0)
	if err != nil {
		e.t.Fatal(err)
	}
	var out []string
	for _, ev := range hist.Events {
		if ev.Kind == subjects.EventReleased || ev.Kind == subjects.EventErrored {
			out = append(out, string(ev.Kind)+": "+ev.Error)
		}
	}
	return out
}

func (e *env) waitState(queue, id string, state subjects.State) workers.Message {
	e.t.Helper()
	var m workers.Message
	waitFor(e.t, "message "+id+" "+string(state), func() bool {
		m = e.get(queue, id)
		return m.State == state
	})
	return m
}

// counter counts the requests sent to one subject: a plain subscription gets a copy of each, while
// the broker's queue-group subscription answers them. It is used by the test's goroutine only.
type counter struct {
	nc   *nats.Conn
	sub  *nats.Subscription
	ch   chan *nats.Msg // filled by the connection's reader as each message arrives
	msgs []*nats.Msg
}

func (e *env) count(op subjects.Op, queue string) *counter {
	e.t.Helper()
	c := &counter{nc: e.srv.Connect(e.t), ch: make(chan *nats.Msg, 4096)}
	var err error
	if c.sub, err = c.nc.ChanSubscribe(e.space.Subject(op, queue), c.ch); err != nil {
		e.t.Fatal(err)
	}
	if err := c.nc.Flush(); err != nil {
		e.t.Fatal(err)
	}
	return c
}

// n returns how many requests have been seen. A round trip on the counting connection first makes
// sure every request sent before the call is in the channel: a channel subscription is fed by the
// connection's reader, in order, before the round trip's answer.
func (c *counter) n(t testing.TB) int {
	t.Helper()
	if err := c.nc.Flush(); err != nil {
		t.Fatal(err)
	}
	for {
		select {
		case m := <-c.ch:
			c.msgs = append(c.msgs, m)
		default:
			return len(c.msgs)
		}
	}
}

// wait waits until at least n requests have been seen and returns the first n.
func (c *counter) wait(t testing.TB, n int) []*nats.Msg {
	t.Helper()
	deadline := time.NewTimer(waitTimeout)
	defer deadline.Stop()
	for len(c.msgs) < n {
		select {
		case m := <-c.ch:
			c.msgs = append(c.msgs, m)
		case <-deadline.C:
			t.Fatalf("saw %d requests on %s, want %d", len(c.msgs), c.sub.Subject, n)
		}
	}
	return c.msgs[:n:n]
}

// waitFor polls cond until it holds, failing the test after waitTimeout.
func waitFor(t testing.TB, what string, cond func() bool) {
	t.Helper()
	deadline := time.Now().Add(waitTimeout)
	tick := time.NewTicker(5 * time.Millisecond)
	defer tick.Stop()
	for !cond() {
		if time.Now().After(deadline) {
			t.Fatalf("timed out waiting for %s", what)
		}
		<-tick.C
	}
}

// recv receives from ch, failing the test after waitTimeout.
func recv[T any](t *testing.T, ch <-chan T) T {
	t.Helper()
	select {
	case v := <-ch:
		return v
	case <-time.After(waitTimeout):
		t.Fatalf("timed out waiting on a channel of %T", *new(T))
		panic("unreachable")
	}
}

// startWorker starts a worker and stops it (waiting for it) at the end of the test.
func (e *env) startWorker(cfg *workers.WorkerConfig, h workers.Handler) *workers.Worker {
	e.t.Helper()
	return startWorker(e.t, e.c, cfg, h)
}

// startWorker starts a worker on c and stops it at the end of the test.
func startWorker(t testing.TB, c *workers.Client, cfg *workers.WorkerConfig, h workers.Handler) *workers.Worker {
	t.Helper()
	w := startOwn(t, c, cfg, h)
	t.Cleanup(func() {
		ctx, cancel := context.WithTimeout(context.Background(), waitTimeout)
		defer cancel()
		if err := w.Stop(ctx); err != nil {
			t.Errorf("stop worker: %v", err)
		}
	})
	return w
}

// startOwn starts a worker on c that the test stops itself (stopWithin), with no log unless cfg has
// one.
func startOwn(t testing.TB, c *workers.Client, cfg *workers.WorkerConfig, h workers.Handler) *workers.Worker {
	t.Helper()
	if cfg.Logger == nil {
		cfg.Logger = discard()
	}
	w, err := workers.NewWorker(c, cfg, h)
	if err != nil {
		t.Fatal(err)
	}
	if err := w.Start(t.Context()); err != nil {
		t.Fatal(err)
	}
	return w
}

// stopWithin stops w with a ctx that ends after d, and returns Stop's error (waiting for it no
// longer than waitTimeout).
func stopWithin(t *testing.T, w *workers.Worker, d time.Duration) error {
	t.Helper()
	sctx, cancel := context.WithTimeout(context.Background(), d)
	defer cancel()
	stopped := make(chan error, 1)
	go func() { stopped <- w.Stop(sctx) }()
	return recv(t, stopped)
}

// stop stops w with a generous deadline and fails the test on error.
func stop(t *testing.T, w *workers.Worker) {
	t.Helper()
	c, cancel := context.WithTimeout(context.Background(), waitTimeout)
	defer cancel()
	if err := w.Stop(c); err != nil {
		t.Fatalf("stop worker: %v", err)
	}
}

func discard() *slog.Logger { return slog.New(slog.NewTextHandler(io.Discard, nil)) }

func ptr[T any](v T) *T { return &v }

func decode[T any](t *testing.T, data []byte) T {
	t.Helper()
	var v T
	if err := json.Unmarshal(data, &v); err != nil {
		t.Fatalf("decode %q: %v", data, err)
	}
	return v
}
