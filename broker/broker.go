package broker

import (
	"cmp"
	"context"
	"errors"
	"fmt"
	"log/slog"
	"maps"
	"slices"
	"strings"
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
	// Replicas of every bucket and stream (3 on a production cluster). Default: as many as the
	// store has (its messages bucket's), 1 for a new store. A store that has other replicas than
	// the ones given is scaled to them, with a warning when it is scaled down.
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
	// StoreMaxBytes bounds each of the store's buckets, its payloads stream and its snapshots (the
	// events stream has EventsMaxBytes), as an account that requires every stream to declare a size
	// demands. At the bound storage refuses the broker's writes, completes and collections included,
	// so the queues stop (writes held in doubt, asked again every two seconds) until a start with a
	// larger bound. 0 or -1: no bound (the default).
	StoreMaxBytes int64
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
	// ClaimTTL is how long a standby broker must see the store's claim unchanged before it takes
	// the store over from the broker holding it, which renews it every ClaimTTL/5 and answers
	// requests unavailable while it has not renewed it for ClaimTTL/2. Default DefaultClaimTTL; at
	// least a second.
	ClaimTTL time.Duration
	// DisableSnapshot makes a clean stop write no snapshot of the message records, and a start read
	// none: every start then reads every record of the messages bucket, as one after a crash does.
	DisableSnapshot bool
	// TakeOverClaim makes the broker take the store's claim at start from whichever broker holds
	// it, instead of waiting for it as a standby. Only for a broker no other broker can share its
	// storage with while it starts, such as one on a NATS server its own process started just before
	// (natstone serve without --nats-url, embedded.Start): a claim found there is a dead process's.
	// Such a broker also keeps its claim at a clean stop, for its next start to take over: a broker
	// connected to the server that stops with it must not take the store over while it stops.
	TakeOverClaim bool
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
	events   *publisher // set by Start under mu (FlushEvents may read it meanwhile)
	observer Observer
	waits    WaitObserver    // the observer, if it is one; else nil
	payloads PayloadObserver // the observer, if it is one; else nil
	claim    *claimer
	sched    *scheduler
	msgAcks  *ackWatch // ends the waits of message writes whose acknowledgements may be lost
	lockAcks *ackWatch // the same for lock writes
	bodyAcks *ackWatch // and for payload writes

	storePrefix string  // the store's subject prefix (Config.StorePrefix, defaulted), for replyRefusal
	refused     refused // requests refused for their reply subject
	silenced    refused // requests left to another broker, the claim not renewed for its ttl
	unstored    refused // enqueues whose payloads storage did not take
	unheard     *unheard

	ctx    context.Context // cancelled by Stop, or when the claim is lost: ends long polls and a recovery
	cancel context.CancelFunc
	done   chan struct{}  // closed when Stop has ended
	wg     sync.WaitGroup // request goroutines and timer callbacks in progress
	runner *runner        // the goroutines requests run on

	// mu guards the fields below.
	mu       sync.Mutex
	queues   map[string]*queue
	closed   bool
	stopping bool           // a Stop has begun to stop the broker (not one of a broker a failed Start closed)
	idle     chan struct{}  // closed once the work a Stop waited for has ended (nil: none waited for)
	starting bool           // Start was called: a Broker starts once
	started  bool           // Start succeeded
	lost     error          // why the claim was lost, if it was
	calls    int            // Start and Claim calls under way
	called   sync.WaitGroup // the same: Stop waits for them
	// The JetStream contexts that publish asynchronously: each subscribes for its acknowledgements
	// on its connection (the caller's, which outlives the broker), until its CleanupPublisher.
	publishers []jetstream.JetStream

	snapshotBroken bool // a start found the snapshot unreadable: its loads read every record

	// Set by tests only: called by each attempt of recover once it has loaded everything, before
	// it arms anything; an error is that of the last load (kv.ErrStale: read again).
	loaded func() error
	// Set by tests only: called by Start once the recovery has ended, before it subscribes the
	// endpoints.
	recovered func()
	// Set by tests only: called once stopPublishing's cleanup has run.
	publishersCleaned func()
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
	if c.StoreMaxBytes < -1 {
		return nil, fmt.Errorf("natstone: broker Config.StoreMaxBytes %d is negative (-1 means no bound)", c.StoreMaxBytes)
	}
	c.ClaimTTL = cmp.Or(c.ClaimTTL, DefaultClaimTTL)
	if c.ClaimTTL < time.Second {
		return nil, fmt.Errorf("natstone: broker Config.ClaimTTL %v is under a second", c.ClaimTTL)
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
	b := &Broker{
		cfg:      c,
		space:    space,
		runner:   newRunner(),
		clock:    c.Clock,
		log:      c.Logger,
		observer: c.Observer,
		done:     make(chan struct{}),
		queues:   make(map[string]*queue),
		msgAcks:  newAckWatch(),
		lockAcks: newAckWatch(),
		bodyAcks: newAckWatch(),
	}
	b.storePrefix = cmp.Or(c.StorePrefix, kv.DefaultPrefix)
	b.waits, _ = c.Observer.(WaitObserver)
	b.payloads, _ = c.Observer.(PayloadObserver)
	b.ctx, b.cancel = context.WithCancel(context.Background())
	b.claim = newClaimer(b)
	b.sched = newScheduler(b)
	return b, nil
}

// Claim returns once the broker holds the store's claim: at once, unless another broker serves the
// store. Then it waits as a standby, until that broker releases the claim (it stops) or stops
// renewing it for ClaimTTL (it died), or until ctx ends. Start claims the store itself; call Claim
// first to wait for it under a context of its own. It opens the claims bucket only: the rest of
// the storage, whose settings a start may change, is opened by Start once the claim is held. A
// Stop ends the wait, and waits for it: Claim then fails with ErrStopped, and leaves no claim
// behind (so does any Claim after Stop, or after a broker that served lost its claim: it stopped).
// A Claim after the claim it took was lost, before any Start, fails with ErrClaimLost.
func (b *Broker) Claim(ctx context.Context) error {
	if !b.enter() {
		return ErrStopped
	}
	defer b.leave()
	if err := b.lostErr(); err != nil {
		return err
	}
	ctx, cancel := context.WithCancel(ctx)
	defer cancel()
	defer context.AfterFunc(b.ctx, cancel)() // Stop, or the claim lost
	if b.claim.claims == nil {
		// On the request connection: a renewal must not wait behind the writes in flight.
		js, err := jetstream.New(b.cfg.Conn, jetstream.WithPublishAsyncTimeout(b.cfg.WriteTimeout))
		if err != nil {
			return fmt.Errorf("natstone: jetstream: %w", err)
		}
		b.publishing(js)
		replicas, err := b.replicas(ctx, js)
		if err != nil {
			return err
		}
		var claims *kv.Claims
		if err := b.placed(ctx, placementWait, func() (err error) { claims, err = kv.OpenClaims(ctx, b.kvConfig(js, replicas)); return err }); err != nil {
			return err
		}
		b.claim.claims = claims
		b.claim.watchElections(b.cfg.Conn, claims.Stream())
	}
	b.claim.mu.Lock()
	held := b.claim.rev != 0
	b.claim.mu.Unlock()
	if held {
		return nil
	}
	err := b.claim.acquire(ctx, b.cfg.TakeOverClaim)
	switch {
	case err != nil && b.stopped():
		return ErrStopped
	case err != nil:
		return err
	case b.stopped():
		// Taken as the broker stopped: its Stop may have found no claim to release.
		rctx, cancel := context.WithTimeout(context.WithoutCancel(ctx), b.cfg.WriteTimeout)
		defer cancel()
		b.claim.giveBack(rctx)
		return ErrStopped
	}
	return nil
}

// enter counts a Start or Claim call under way, unless Stop was called (or a start failed for good);
// leave ends it.
func (b *Broker) enter() bool {
	b.mu.Lock()
	defer b.mu.Unlock()
	if b.closed {
		return false
	}
	b.enterLocked()
	return true
}

// enterLocked is enter with b.mu held and b not closed.
func (b *Broker) enterLocked() {
	b.calls++
	b.called.Add(1)
}

func (b *Broker) leave() {
	b.mu.Lock()
	b.calls--
	b.mu.Unlock()
	b.called.Done()
}

// stopped reports whether Stop was called (or a start failed for good).
func (b *Broker) stopped() bool {
	b.mu.Lock()
	defer b.mu.Unlock()
	return b.closed
}

// Start claims the store (see Claim), opens the storage, rebuilds every queue's indexes from it,
// reconciles exclusivity locks, and only then starts answering requests. A Stop meanwhile makes it
// fail with ErrStopped. A Broker starts once: a second Start, or a Start after Stop, fails with
// ErrStarted (make another with New); but a Start that failed to take the claim (a standby whose
// ctx ended) may be called again.
func (b *Broker) Start(ctx context.Context) error {
	b.mu.Lock()
	again := b.starting || b.closed
	if !again {
		b.starting = true
		b.enterLocked()
	}
	b.mu.Unlock()
	if again {
		return ErrStarted
	}
	defer b.leave() // a Stop that came meanwhile may go on
	ctx, cancel := context.WithCancel(ctx)
	defer cancel()
	defer context.AfterFunc(b.ctx, cancel)() // Stop, or the claim lost: stop waiting for the claim
	if err := b.Claim(ctx); err != nil {
		b.mu.Lock()
		defer b.mu.Unlock()
		if !b.closed {
			b.starting = false // nothing started: a standby whose ctx ended may try again
		}
		return err
	}
	err := b.open(ctx)
	if err != nil {
		b.mu.Lock()
		if b.closed {
			err = ErrStopped
		}
		b.mu.Unlock()
	} else {
		err = b.start(ctx)
	}
	if err != nil {
		rctx, cancel := context.WithTimeout(context.WithoutCancel(ctx), b.cfg.WriteTimeout)
		defer cancel()
		err = errors.Join(err, b.events.close(rctx))
		b.claim.release(rctx)
		go func() { // nothing writes once the requests the start took have ended (failStart)
			b.wg.Wait()
			b.stopPublishing()
		}()
	}
	return err
}

// kvConfig is the storage's configuration, through js, with replicas.
func (b *Broker) kvConfig(js jetstream.JetStream, replicas int) *kv.Config {
	return &kv.Config{JS: js, Prefix: b.cfg.StorePrefix, Replicas: replicas, MemoryStorage: b.cfg.MemoryStorage, MaxBytes: b.cfg.StoreMaxBytes, Log: b.log}
}

// replicas returns the replicas to open the storage with: Config.Replicas, or if not given the
// store's own as it is now (1 for a new store), so that a broker started without them (a restart,
// a standby) scales nothing. Asked again at each opening: a standby's takeover comes long after its
// start, and the store may have been made, or scaled, meanwhile.
func (b *Broker) replicas(ctx context.Context, js jetstream.JetStream) (int, error) {
	if b.cfg.Replicas > 0 {
		return b.cfg.Replicas, nil
	}
	n, err := kv.StoreReplicas(ctx, js, b.cfg.StorePrefix)
	if err != nil {
		return 0, fmt.Errorf("natstone: the store's replicas: %w", err)
	}
	return max(n, 1), nil // a new store: 1
}

// warnReplicasDiffer warns, for a broker standing by, when its Config.Replicas differs from the
// store's: its takeover would scale the store (open applies this broker's settings), which an
// operator's trial learnt of only then, its standby started with --replicas 1 beside a broker with
// 3. A store it cannot read in time is not warned of, nor one whose messages bucket the
// broker serving has not made yet (two brokers started together on a new store).
func (b *Broker) warnReplicasDiffer(ctx context.Context, within time.Duration) {
	if b.cfg.Replicas == 0 {
		return
	}
	js, err := jetstream.New(cmp.Or(b.cfg.StoreConn, b.cfg.Conn))
	if err != nil {
		return
	}
	ctx, cancel := context.WithTimeout(ctx, within)
	defer cancel()
	if n, err := kv.StoreReplicas(ctx, js, b.cfg.StorePrefix); err == nil && n != 0 && n != b.cfg.Replicas {
		b.log.Warn("this broker's replicas differ from the store's: should it take the store over, it scales the store to them",
			"replicas", b.cfg.Replicas, "store_replicas", n)
	}
}

// placementWait bounds how long opening the storage waits for a cluster to place its streams
// while it has not heard from enough of its servers ("no suitable peers for placement, peer
// offline"): a server down, or one the meta leader has not heard from yet, as after the cluster
// started or elected a new meta leader.
const placementWait = 30 * time.Second

// placed runs open, which opens some of the storage, again while it fails for want of servers the
// cluster has heard from, after pauses doubling from 100 ms to a second, for up to within
// (placementWait) from its first failure, or until ctx ends; it returns open's last error.
func (b *Broker) placed(ctx context.Context, within time.Duration, open func() error) error {
	var until time.Time
	for pause := 100 * time.Millisecond; ; pause = min(2*pause, time.Second) {
		err := open()
		if !peerOffline(err) {
			return err
		}
		if until.IsZero() {
			until = time.Now().Add(within)
			b.log.Warn("the cluster cannot place the store's streams yet: it has not heard from enough of its servers; trying again", "for", within, "error", err)
		}
		if time.Now().After(until) {
			return err
		}
		select {
		case <-ctx.Done():
			return err
		case <-time.After(pause):
		}
	}
}

// peerOffline reports whether err is JetStream's refusal to place a stream because a server it
// could place it on is offline (or not heard from yet).
func peerOffline(err error) bool {
	var apiErr *jetstream.APIError
	return errors.As(err, &apiErr) && apiErr.ErrorCode == jsErrCodeClusterNoPeers && strings.Contains(apiErr.Description, "peer offline")
}

// jsErrCodeClusterNoPeers is JetStream's "no suitable peers for placement" (nats-server's
// JSClusterNoPeersErrF), which nats.go does not name.
const jsErrCodeClusterNoPeers jetstream.ErrorCode = 10005

// open opens the storage: the buckets, the bodies stream and the events stream.
func (b *Broker) open(ctx context.Context) error {
	// Many writes are in flight at once (every request's, and batches of them): allow far more
	// unacknowledged publishes than nats.go's default of 4000 before it stalls.
	js, err := jetstream.New(cmp.Or(b.cfg.StoreConn, b.cfg.Conn),
		jetstream.WithPublishAsyncTimeout(b.cfg.WriteTimeout), jetstream.WithPublishAsyncMaxPending(1<<16))
	if err != nil {
		return fmt.Errorf("natstone: jetstream: %w", err)
	}
	b.publishing(js)
	replicas, err := b.replicas(ctx, js)
	if err != nil {
		return err
	}
	var store *kv.Store
	if err := b.placed(ctx, placementWait, func() (err error) { store, err = kv.Open(ctx, b.kvConfig(js, replicas)); return err }); err != nil {
		return err
	}
	if had := store.ScaledDownFrom(); had > 0 {
		// Opening the store applies this broker's settings (design.md): one started without the
		// --replicas the store was made with scales it down, which an operator should not learn of
		// by accident.
		b.log.Warn("the store is scaled down to this broker's replicas", "replicas", had, "to", replicas)
	}
	var events *kv.Events
	if !b.cfg.DisableEvents {
		// A JetStream context of its own: its publishes in flight must never stall the records'.
		ejs, err := jetstream.New(cmp.Or(b.cfg.StoreConn, b.cfg.Conn),
			jetstream.WithPublishAsyncTimeout(b.cfg.WriteTimeout), jetstream.WithPublishAsyncMaxPending(2*maxEventBatch))
		if err != nil {
			return fmt.Errorf("natstone: jetstream: %w", err)
		}
		b.publishing(ejs)
		ecfg := &kv.EventsConfig{
			JS:            ejs,
			Prefix:        b.cfg.StorePrefix,
			Replicas:      replicas,
			MemoryStorage: b.cfg.MemoryStorage,
			MaxAge:        b.cfg.EventsMaxAge,
			MaxBytes:      b.cfg.EventsMaxBytes,
		}
		if err := b.placed(ctx, placementWait, func() (err error) { events, err = kv.OpenEvents(ctx, ecfg); return err }); err != nil {
			return err
		}
	}
	b.store = store
	b.mu.Lock() // FlushEvents may be called meanwhile
	b.events = newPublisher(b, events, eventLinger)
	b.mu.Unlock()
	b.watchAcks(ctx, store)
	return nil
}

// start recovers and serves, the claim held.
func (b *Broker) start(ctx context.Context) error {
	start := time.Now()
	n, from, err := b.recover(ctx) // ctx ends with b.ctx (Start): a Stop, or the claim lost
	if err == nil {
		err = b.sched.load(ctx)
	}
	if b.recovered != nil {
		b.recovered()
	}
	b.mu.Lock()
	switch {
	case b.lost != nil:
		err = b.lost
	case b.closed:
		err = ErrStopped // a Stop came during the recovery: nothing may subscribe now
	}
	b.mu.Unlock()
	if err != nil {
		return b.failStart(err)
	}
	b.log.Info("recovered", "queues", len(b.queues), "messages", n, "from", from, "took", time.Since(start).Round(time.Millisecond))
	err = b.serve()
	if err == nil {
		// A round trip makes sure the server has the endpoints' subscriptions: once Start returns,
		// requests from any connection to it reach the broker (on a cluster, those to the other
		// servers once the routes carried the subscriptions there, moments later, before the
		// announcement below: a client that hears it finds the broker).
		err = flush(ctx, b.cfg.Conn)
	}
	if err == nil {
		b.mu.Lock()
		switch {
		case b.lost != nil:
			err = b.lost
		case b.closed:
			err = ErrStopped
		default:
			b.started = true
		}
		b.mu.Unlock()
	}
	if err != nil {
		return b.failStart(fmt.Errorf("natstone: serve: %w", err))
	}
	b.sched.start()
	b.announce(ctx)
	return nil
}

// closeQueues closes every queue of qs: their timers stop, their long polls end, and their
// requests from then on get why.
func closeQueues(qs []*queue, why error) {
	for _, q := range qs {
		q.mu.Lock()
		q.close(why)
		q.mu.Unlock()
	}
}

// failStart undoes a start that did not finish, and returns err: nothing answers any more, no
// queue's timer runs, and the requests that the endpoints, once subscribed, took meanwhile have
// ended, for Start to release the claim (a standby takes over at once). Should they not end within
// WriteTimeout, the claim is left to run out instead, as a Stop whose ctx ends leaves it.
func (b *Broker) failStart(err error) error {
	b.cancel()
	b.mu.Lock()
	b.closed = true
	qs := slices.Collect(maps.Values(b.queues))
	b.mu.Unlock()
	if b.svc != nil {
		_ = b.svc.stop()
	}
	closeQueues(qs, subjects.Errorf(subjects.CodeUnavailable, "the broker did not start")) // some may have armed their timers
	ctx, cancel := context.WithTimeout(context.Background(), b.cfg.WriteTimeout)
	defer cancel()
	if !waitFor(ctx, &b.wg) {
		b.log.Warn("requests of a start that failed still run: the claim is left to run out", "err", err)
		b.claim.abandon()
	}
	b.runner.stop() // nothing idles on
	return err
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
// A Start still under way is ended (it fails with ErrStopped) and waited for first. Stop called
// again, or at once from elsewhere, waits (up to its own ctx) for the first to end, and for the
// work in progress that one's ctx left running, if any; it returns nil once they have. (So it is
// not to be called from that work: an Observer's methods, say.)
func (b *Broker) Stop(ctx context.Context) error {
	b.mu.Lock()
	closed, starting, again := b.closed, b.calls > 0, b.stopping
	b.closed = true
	if !closed {
		b.stopping = true
	}
	b.mu.Unlock()
	if closed {
		if starting {
			// A start failing on its own closed the broker: let it finish undoing what it did (its
			// claim's release) before this returns.
			if err := b.waitCalls(ctx); err != nil || !again {
				return err
			}
		}
		if again {
			return b.waitStopped(ctx)
		}
		return nil
	}
	if starting {
		// A Start or Claim is under way: end its claim wait or recovery, and let it fail and undo
		// what it did (ErrStopped) before this stops the rest, or it could subscribe, or take the
		// claim, after Stop returned.
		b.cancel()
		if err := b.waitCalls(ctx); err != nil {
			go func() { // the calls, failing, end: nothing writes once what they took has ended
				b.called.Wait()
				b.wg.Wait()
				b.stopPublishing()
			}()
			close(b.done)
			return err
		}
	}
	b.mu.Lock()
	qs := slices.Collect(maps.Values(b.queues))
	b.mu.Unlock()
	var err error
	if b.svc != nil {
		err = b.svc.stop()
	}
	b.cancel()
	b.sched.stop()
	closeQueues(qs, subjects.Errorf(subjects.CodeUnavailable, "the broker is stopping"))
	done := make(chan struct{})
	b.mu.Lock()
	b.idle = done
	b.mu.Unlock()
	go func() {
		b.wg.Wait()
		b.runner.stop() // no request runs any more: the runner's goroutines exit
		b.runner.wait()
		close(done)
	}()
	select {
	case <-done:
	case <-ctx.Done():
		// Work still in progress may write: the claim is no longer renewed but stays, and a
		// standby waits out its ttl.
		b.claim.abandon()
		err = errors.Join(err, fmt.Errorf("natstone: stop: %w before the work in progress ended; no snapshot written", ctx.Err()))
		if cerr := b.events.close(ctx); cerr != nil {
			err = errors.Join(err, fmt.Errorf("natstone: stop: %w", cerr))
		}
		go func() {
			<-done
			b.stopPublishing()
		}()
		close(b.done)
		return err
	}
	if n := b.silenced.count.Swap(0); n > 0 { // counted since the last log, which said fewer
		b.log.Warn("requests not answered: this broker had not renewed its claim on the store for its ttl, and another may serve it", "unanswered", n)
	}
	// Every transition has happened: publish the events still buffered.
	if cerr := b.events.close(ctx); cerr != nil {
		err = errors.Join(err, fmt.Errorf("natstone: stop: %w", cerr))
	}
	b.writeSnapshot(ctx)
	doubts := 0
	for _, q := range qs {
		q.mu.Lock()
		doubts += q.doubts()
		q.mu.Unlock()
	}
	if doubts > 0 && !b.cfg.TakeOverClaim {
		// Writes whose outcome is still unknown may land yet: a standby that took over now could
		// read its records before them. The claim stays, and a standby waits out its ttl.
		b.log.Warn("stopped with writes of unknown outcome; the claim is left to run out", "writes", doubts)
		b.claim.abandon()
		b.stopPublishing()
		close(b.done)
		return err
	}
	if b.cfg.TakeOverClaim {
		// The store is this process's alone (see TakeOverClaim): the claim stays for the next start
		// to take over, and no broker connected to the server that is about to stop with this one
		// takes the store over meanwhile.
		b.claim.abandon()
	} else {
		b.claim.release(ctx) // nothing writes any more: a standby may take over
	}
	b.stopPublishing()
	close(b.done)
	return err
}

// publishing keeps js, a JetStream context that publishes asynchronously, for stopPublishing.
func (b *Broker) publishing(js jetstream.JetStream) {
	b.mu.Lock()
	defer b.mu.Unlock()
	b.publishers = append(b.publishers, js)
}

// stopPublishing ends the broker's JetStream contexts' subscriptions for their acknowledgements,
// and their goroutines, once nothing of the broker writes any more: its connections are the
// caller's, and outlive it (a supervisor that makes a new Broker after ErrClaimLost, say).
//
// It does so publisherCleanupDelay later. In nats.go 1.55, the first asynchronous publish of a
// context starts a goroutine that watches the connection's status on a channel it reads only once
// it runs, and CleanupPublisher clears that channel: a goroutine that had not run by then waits on
// a nil channel forever. A context's first publish can come moments before the stop (the
// snapshot's upload is the first of a broker that wrote nothing else), and on a loaded machine the
// goroutine had not run yet: goleak caught one in CI.
func (b *Broker) stopPublishing() {
	b.mu.Lock()
	js := b.publishers
	b.publishers = nil
	cleaned := b.publishersCleaned
	b.mu.Unlock()
	if len(js) == 0 {
		return
	}
	time.AfterFunc(publisherCleanupDelay, func() {
		for _, j := range js {
			j.CleanupPublisher()
		}
		if cleaned != nil {
			cleaned()
		}
	})
}

// publisherCleanupDelay is how long after a broker's stop its JetStream contexts are cleaned up:
// far longer than a runnable goroutine waits to run, even under the race detector on two busy
// cores.
const publisherCleanupDelay = 250 * time.Millisecond

// waitStopped waits for an earlier Stop to end (b.done), and then for the work in progress that it
// waited for, should its ctx have ended first; or for ctx.
func (b *Broker) waitStopped(ctx context.Context) error {
	select {
	case <-b.done:
	case <-ctx.Done():
		return fmt.Errorf("natstone: stop: %w before the Stop under way ended", ctx.Err())
	}
	b.mu.Lock()
	idle := b.idle
	b.mu.Unlock()
	if idle == nil {
		return nil
	}
	select {
	case <-idle:
		return nil
	case <-ctx.Done():
		return fmt.Errorf("natstone: stop: %w before the work in progress that an earlier Stop left ended", ctx.Err())
	}
}

// waitCalls waits for the Start and Claim calls under way to return, or for ctx.
func (b *Broker) waitCalls(ctx context.Context) error {
	if !waitFor(ctx, &b.called) {
		return fmt.Errorf("natstone: stop: a Start or Claim under way did not end: %w", ctx.Err())
	}
	return nil
}

// waitFor waits for wg, or for ctx to end; it reports whether wg was done.
func waitFor(ctx context.Context, wg *sync.WaitGroup) bool {
	done := make(chan struct{})
	go func() {
		wg.Wait()
		close(done)
	}()
	select {
	case <-done:
		return true
	case <-ctx.Done():
		return false
	}
}

// Done is closed once a started broker has stopped: after Stop, or on its own when it lost its
// claim on the store (Err then says so), which a broker that serves on must not ignore.
func (b *Broker) Done() <-chan struct{} { return b.done }

// Err returns why the broker stopped on its own (ErrClaimLost), or nil.
func (b *Broker) Err() error { return b.lostErr() }

func (b *Broker) lostErr() error {
	b.mu.Lock()
	defer b.mu.Unlock()
	return b.lost
}

// serveParked offers every open queue's pending messages to its parked long polls again (the
// claim holds again after a time it did not).
func (b *Broker) serveParked() {
	if !b.track() {
		return
	}
	defer b.wg.Done()
	b.mu.Lock()
	qs := slices.Collect(maps.Values(b.queues))
	b.mu.Unlock()
	for _, q := range qs {
		q.mu.Lock()
		if q.closed == nil {
			q.serveWaiters()
		}
		q.mu.Unlock()
	}
}

// lose stops the broker, its claim on the store lost (cause says how): another broker may serve
// the store already. A recovery in progress ends, and Start fails.
func (b *Broker) lose(cause error) {
	err := fmt.Errorf("%w: %w", ErrClaimLost, cause)
	b.log.Error("stopping: the claim on the store is lost", "err", err)
	b.mu.Lock()
	b.lost = err
	started, stopping := b.started, b.stopping
	b.mu.Unlock()
	b.cancel()
	if !started || stopping {
		return // Start sees b.lost; or a Stop under way does the rest
	}
	ctx, cancel := context.WithTimeout(context.Background(), 2*b.cfg.WriteTimeout)
	defer cancel()
	if err := b.Stop(ctx); err != nil {
		b.log.Warn("stopping after the claim was lost", "err", err)
	}
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
