package broker

import (
	"cmp"
	"context"
	"errors"
	"fmt"
	"log/slog"
	"sync"
	"time"

	"github.com/nats-io/nats.go"
	"github.com/nats-io/nats.go/jetstream"

	"github.com/natstone/natstone/broker/clock"
	"github.com/natstone/natstone/kv"
	"github.com/natstone/natstone/subjects"
)

// Version is the broker's version, reported to NATS service discovery.
const Version = "0.1.0"

// DefaultWriteTimeout bounds how long a storage write may stay unacknowledged before its outcome is
// treated as unknown.
const DefaultWriteTimeout = 10 * time.Second

// Config configures a Broker.
type Config struct {
	// Conn is the NATS connection the broker serves requests on and stores through. Required.
	// The broker does not close it.
	Conn *nats.Conn
	// StoreConn, if set, carries the storage traffic (KV writes, payload reads) instead of Conn. A
	// connection is served by one goroutine on the server, so splitting request traffic from storage
	// traffic lets both proceed in parallel. The broker does not close it.
	StoreConn *nats.Conn
	// Prefix of the request subjects. Default subjects.DefaultPrefix ("natstone.v1").
	Prefix string
	// StorePrefix names the KV buckets and the bodies stream. Default kv.DefaultPrefix ("natstone").
	StorePrefix string
	// Replicas of every bucket and stream (3 on a production cluster). Default 1.
	Replicas int
	// MemoryStorage keeps data in memory only: for tests and benchmarks, never production.
	MemoryStorage bool
	// DisableAutoCreate makes an enqueue to an unknown queue fail with queue_not_found instead of
	// creating a simple queue with the defaults.
	DisableAutoCreate bool
	// Clock tells time for leases, invisibility and garbage collection. Default the real clock.
	Clock clock.Clock
	// Logger receives the broker's logs. Default slog.Default().
	Logger *slog.Logger
	// WriteTimeout bounds a storage write's acknowledgement. Default DefaultWriteTimeout.
	WriteTimeout time.Duration
	// DisableEvents turns the events stream off: no transition is published and history answers
	// unavailable.
	DisableEvents bool
	// EventsMaxAge is how long the events stream (<StorePrefix>-events) keeps an event. Default
	// DefaultEventsMaxAge.
	EventsMaxAge time.Duration
	// EventsMaxBytes bounds the events stream's size: past it the oldest events are dropped, even
	// if younger than EventsMaxAge. It bounds the disk the stream takes and, because every message id
	// is a subject of its own, the server's memory and restart time too. Default
	// DefaultEventsMaxBytes; -1 for no bound.
	EventsMaxBytes int64
	// Observer, if set, is told of every request, record write and transition (for metrics).
	Observer Observer
}

// DefaultEventsMaxAge is how long events are kept unless Config.EventsMaxAge says otherwise.
const DefaultEventsMaxAge = 72 * time.Hour

// DefaultEventsMaxBytes is the events stream's size bound unless Config.EventsMaxBytes says
// otherwise: 1 GiB, a few million events.
const DefaultEventsMaxBytes = 1 << 30

// Broker serves natstone's request/reply API over NATS, keeping per-queue EDF indexes in memory
// and every message in JetStream. Create it with New, then Start it.
type Broker struct {
	cfg      Config
	space    subjects.Space
	clock    clock.Clock
	log      *slog.Logger
	store    *kv.Store
	svc      *service
	events   *publisher
	observer Observer

	ctx    context.Context // cancelled by Stop: ends long polls
	cancel context.CancelFunc
	wg     sync.WaitGroup // request goroutines and timer callbacks in progress
	runner *runner        // the goroutines requests run on

	// mu guards the fields below.
	mu     sync.Mutex
	queues map[string]*queue
	closed bool

	// Set by tests only: called by each attempt of recover once it has loaded everything, before
	// it arms anything; an error is that of the last load (kv.ErrStale: read again).
	loaded func() error
}

// New validates cfg and returns a broker that is not started yet.
func New(cfg *Config) (*Broker, error) {
	if cfg == nil || cfg.Conn == nil {
		return nil, errors.New("natstone: broker Config.Conn is required")
	}
	c := *cfg
	c.WriteTimeout = cmp.Or(c.WriteTimeout, DefaultWriteTimeout)
	if c.WriteTimeout < 0 {
		return nil, fmt.Errorf("natstone: broker Config.WriteTimeout %v is negative", c.WriteTimeout)
	}
	if c.Replicas < 0 {
		return nil, fmt.Errorf("natstone: broker Config.Replicas %d is negative", c.Replicas)
	}
	space, err := subjects.NewSpace(c.Prefix)
	if err != nil {
		return nil, fmt.Errorf("natstone: broker Config.Prefix: %w", err)
	}
	c.EventsMaxAge = cmp.Or(c.EventsMaxAge, DefaultEventsMaxAge)
	if c.EventsMaxAge < 0 {
		return nil, fmt.Errorf("natstone: broker Config.EventsMaxAge %v is negative", c.EventsMaxAge)
	}
	c.EventsMaxBytes = cmp.Or(c.EventsMaxBytes, DefaultEventsMaxBytes)
	if c.EventsMaxBytes < -1 {
		return nil, fmt.Errorf("natstone: broker Config.EventsMaxBytes %d is negative (-1 means no bound)", c.EventsMaxBytes)
	}
	if c.Observer == nil {
		c.Observer = nopObserver{}
	}
	if c.Clock == nil {
		c.Clock = clock.Real()
	}
	if c.Logger == nil {
		c.Logger = slog.Default()
	}
	return &Broker{
		cfg:      c,
		space:    space,
		runner:   newRunner(),
		clock:    c.Clock,
		log:      c.Logger,
		observer: c.Observer,
		queues:   make(map[string]*queue),
	}, nil
}

// Start opens the storage, rebuilds every queue's indexes from it, reconciles exclusivity locks,
// and only then starts answering requests.
func (b *Broker) Start(ctx context.Context) error {
	// Many writes are in flight at once (every request's, and batches of them): allow far more
	// unacknowledged publishes than nats.go's default of 4000 before it stalls.
	js, err := jetstream.New(cmp.Or(b.cfg.StoreConn, b.cfg.Conn),
		jetstream.WithPublishAsyncTimeout(b.cfg.WriteTimeout), jetstream.WithPublishAsyncMaxPending(1<<16))
	if err != nil {
		return fmt.Errorf("natstone: jetstream: %w", err)
	}
	b.store, err = kv.Open(ctx, &kv.Config{
		JS:            js,
		Prefix:        b.cfg.StorePrefix,
		Replicas:      b.cfg.Replicas,
		MemoryStorage: b.cfg.MemoryStorage,
	})
	if err != nil {
		return err
	}
	var events *kv.Events
	if !b.cfg.DisableEvents {
		// A JetStream context of its own: its publishes in flight must never stall the records'.
		ejs, err := jetstream.New(cmp.Or(b.cfg.StoreConn, b.cfg.Conn),
			jetstream.WithPublishAsyncTimeout(b.cfg.WriteTimeout), jetstream.WithPublishAsyncMaxPending(2*maxEventBatch))
		if err != nil {
			return fmt.Errorf("natstone: jetstream: %w", err)
		}
		events, err = kv.OpenEvents(ctx, &kv.EventsConfig{
			JS:            ejs,
			Prefix:        b.cfg.StorePrefix,
			Replicas:      b.cfg.Replicas,
			MemoryStorage: b.cfg.MemoryStorage,
			MaxAge:        b.cfg.EventsMaxAge,
			MaxBytes:      b.cfg.EventsMaxBytes,
		})
		if err != nil {
			return err
		}
	}
	b.events = newPublisher(b, events, eventLinger)
	b.ctx, b.cancel = context.WithCancel(context.Background())
	start := time.Now()
	n, err := b.recover(ctx)
	if err != nil {
		b.cancel()
		b.mu.Lock()
		b.closed = true
		qs := b.queues
		b.mu.Unlock()
		for _, q := range qs { // some may have armed their timers already
			q.mu.Lock()
			q.close(subjects.Errorf(subjects.CodeUnavailable, "the broker did not start"))
			q.mu.Unlock()
		}
		return err
	}
	b.log.Info("recovered", "queues", len(b.queues), "messages", n, "took", time.Since(start).Round(time.Millisecond))
	err = b.serve()
	if err == nil {
		// A round trip makes sure the server has the endpoints' subscriptions: once Start returns,
		// requests from any connection reach the broker.
		err = flush(ctx, b.cfg.Conn)
	}
	if err != nil {
		b.cancel()
		b.mu.Lock()
		b.closed = true
		b.mu.Unlock()
		if b.svc != nil {
			_ = b.svc.stop()
		}
		b.runner.stop() // requests served meanwhile end on their own; nothing idles on
		return fmt.Errorf("natstone: serve: %w", err)
	}
	return nil
}

// flush waits for a round trip to the server; nats.go needs a deadline for that, so a context
// without one gets DefaultWriteTimeout.
func flush(ctx context.Context, nc *nats.Conn) error {
	if _, ok := ctx.Deadline(); !ok {
		var cancel context.CancelFunc
		ctx, cancel = context.WithTimeout(ctx, DefaultWriteTimeout)
		defer cancel()
	}
	return nc.FlushWithContext(ctx)
}

// Stop stops answering requests, ends long polls, stops the timers and waits for work in progress
// (or ctx) to end. Every reply already sent stays true: nothing is acknowledged before it is stored.
func (b *Broker) Stop(ctx context.Context) error {
	b.mu.Lock()
	if b.closed {
		b.mu.Unlock()
		return nil
	}
	b.closed = true
	qs := make([]*queue, 0, len(b.queues))
	for _, q := range b.queues {
		qs = append(qs, q)
	}
	b.mu.Unlock()
	var err error
	if b.svc != nil {
		err = b.svc.stop()
	}
	if b.cancel != nil {
		b.cancel()
	}
	for _, q := range qs {
		q.mu.Lock()
		q.close(subjects.Errorf(subjects.CodeUnavailable, "the broker is stopping"))
		q.mu.Unlock()
	}
	done := make(chan struct{})
	go func() {
		b.wg.Wait()
		b.runner.stop() // no request runs any more: the runner's goroutines exit
		b.runner.wait()
		close(done)
	}()
	select {
	case <-done:
	case <-ctx.Done():
		return errors.Join(err, fmt.Errorf("natstone: stop: %w", ctx.Err()), b.events.close(ctx))
	}
	// Every transition has happened: publish the events still buffered.
	if cerr := b.events.close(ctx); cerr != nil {
		err = errors.Join(err, fmt.Errorf("natstone: stop: events not all published: %w", cerr))
	}
	return err
}

// track registers a unit of work (a request or a timer callback) unless the broker is stopping.
// The caller must call b.wg.Done when it ends.
func (b *Broker) track() bool {
	b.mu.Lock()
	defer b.mu.Unlock()
	if b.closed {
		return false
	}
	b.wg.Add(1)
	return true
}

// unavailable wraps a storage or wait failure as a retryable typed error.
func unavailable(what string, err error) error {
	var e *subjects.Error
	if errors.As(err, &e) {
		return e
	}
	return subjects.Errorf(subjects.CodeUnavailable, "%s: %v", what, err)
}
