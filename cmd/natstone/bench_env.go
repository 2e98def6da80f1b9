package main

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"log/slog"
	"strings"
	"sync"
	"sync/atomic"
	"time"

	"github.com/nats-io/nats.go"
	"github.com/nats-io/nats.go/jetstream"
	"github.com/nats-io/nats.go/micro"

	"github.com/natstone/natstone/broker"
	"github.com/natstone/natstone/embedded"
	"github.com/natstone/natstone/subjects"
)

// benchCallTimeout bounds one request of the bench's clients.
const benchCallTimeout = 30 * time.Second

// benchEnv is one embedded natstone (nats-server with JetStream and the broker, in this process)
// with a pool of in-process client connections. Baselines and scenarios use the same pool, so the
// clients sit in the same place for both.
type benchEnv struct {
	dir        string
	syncAlways bool
	conns      int
	retention  time.Duration // of every queue created
	noEvents   bool          // the broker runs without the events stream
	noSnapshot bool          // the broker neither reads nor writes a snapshot of the records
	space      subjects.Space
	log        *slog.Logger

	ns       *embedded.Natstone
	pool     []*nats.Conn
	recovery *benchRecoveryLog // the broker's last "recovered" log line
}

// startEnv starts an embedded natstone storing in dir, accepting in-process connections only.
func startEnv(ctx context.Context, dir string, syncAlways bool, conns int, retention time.Duration, log *slog.Logger) (*benchEnv, error) {
	space, err := subjects.NewSpace("")
	if err != nil {
		return nil, err
	}
	e := &benchEnv{dir: dir, syncAlways: syncAlways, conns: conns, retention: retention, space: space, log: log}
	if _, err := e.start(ctx); err != nil {
		return nil, err
	}
	return e, nil
}

// start starts the server and the broker on e.dir and connects the client pool. It returns how long
// embedded.Start took (server start, JetStream recovery, broker recovery).
func (e *benchEnv) start(ctx context.Context) (time.Duration, error) {
	e.recovery = &benchRecoveryLog{}
	t0 := time.Now()
	ns, err := embedded.Start(ctx, &embedded.Config{
		DataDir:    e.dir,
		NoListen:   true,
		SyncAlways: e.syncAlways,
		Broker:     &broker.Config{Logger: slog.New(e.recovery), DisableEvents: e.noEvents, DisableSnapshot: e.noSnapshot},
		Logger:     e.log,
	})
	if err != nil {
		return 0, err
	}
	took := time.Since(t0)
	e.ns = ns
	e.pool = nil
	for i := range e.conns {
		nc, err := ns.Connect(nats.Name(fmt.Sprintf("natstone-bench-%d", i)))
		if err != nil {
			return took, errors.Join(err, e.stop(ctx))
		}
		e.pool = append(e.pool, nc)
	}
	return took, nil
}

// stop closes the clients and stops the broker and the server; the store stays in e.dir.
func (e *benchEnv) stop(ctx context.Context) error {
	for _, nc := range e.pool {
		nc.Close()
	}
	e.pool = nil
	if e.ns == nil {
		return nil
	}
	err := e.ns.Stop(ctx)
	e.ns = nil
	return err
}

// restart stops everything and starts it again on the same store, in sync mode syncAlways.
func (e *benchEnv) restart(ctx context.Context, syncAlways bool) (time.Duration, error) {
	if err := e.stop(ctx); err != nil {
		return 0, err
	}
	e.syncAlways = syncAlways
	return e.start(ctx)
}

// pipelined opens a connection of its own named name, with a JetStream context that allows as many
// asynchronous publishes in flight as the baselines pipeline. The caller closes the connection.
func (e *benchEnv) pipelined(name string) (*nats.Conn, jetstream.JetStream, error) {
	nc, err := e.ns.Connect(nats.Name(name))
	if err != nil {
		return nil, nil, err
	}
	js, err := jetstream.New(nc, jetstream.WithPublishAsyncMaxPending(4*benchPipelineWindow))
	if err != nil {
		nc.Close()
		return nil, nil, err
	}
	return nc, js, nil
}

// conn returns the pool's connection for worker w.
func (e *benchEnv) conn(w int) *nats.Conn { return e.pool[w%len(e.pool)] }

// jetStream returns a JetStream context on the pool's connection for worker w.
func (e *benchEnv) jetStream(w int, opts ...jetstream.JetStreamOpt) (jetstream.JetStream, error) {
	return jetstream.New(e.conn(w), opts...)
}

// call sends req (JSON) to op on queue over nc and decodes the reply into reply (nil: discard). An
// error reply comes back as its *subjects.Error.
func (e *benchEnv) call(ctx context.Context, nc *nats.Conn, op subjects.Op, queue string, req, reply any) error {
	var data []byte
	switch r := req.(type) {
	case nil:
	case json.RawMessage: // encoded once by the caller, as a producer sending the same body would
		data = r
	default:
		var err error
		if data, err = json.Marshal(req); err != nil {
			return err
		}
	}
	ctx, cancel := context.WithTimeout(ctx, benchCallTimeout)
	defer cancel()
	msg, err := nc.RequestWithContext(ctx, e.space.Subject(op, queue), data)
	if err != nil {
		return fmt.Errorf("%s %s: %w", op, queue, err)
	}
	if msg.Header.Get(micro.ErrorCodeHeader) != "" {
		var er subjects.ErrorReply
		if err := json.Unmarshal(msg.Data, &er); err != nil || er.Error == nil {
			return fmt.Errorf("%s %s: error reply %q", op, queue, msg.Data)
		}
		return er.Error
	}
	if reply == nil {
		return nil
	}
	if err := json.Unmarshal(msg.Data, reply); err != nil {
		return fmt.Errorf("%s %s: decoding the reply: %w", op, queue, err)
	}
	return nil
}

// benchLeaseMS is the lease of every bench queue: long enough that no lease expires during a
// measured phase, so every dequeued message is completed by its worker.
const benchLeaseMS = 10 * 60 * 1000

// createQueue creates queue with the bench's retention (by default 0: completed messages are
// garbage-collected at once, so they do not pile up) and benchLeaseMS; cfg adds the type and
// exclusivity key.
func (e *benchEnv) createQueue(ctx context.Context, queue string, cfg subjects.CreateQueueRequest) error {
	ret := e.retention.Milliseconds()
	cfg.RetentionMS = &ret
	cfg.LeaseMS = benchLeaseMS
	return e.call(ctx, e.conn(0), subjects.OpCreate, queue, cfg, nil)
}

// deleteQueue deletes queue with everything in it.
func (e *benchEnv) deleteQueue(ctx context.Context, queue string) error {
	return e.call(ctx, e.conn(0), subjects.OpDelete, queue, nil, nil)
}

// benchFillBatch is the size of the enqueue_batch requests that fill a queue, and fillInFlight how many of
// them are in flight at once.
const (
	benchFillBatch    = 1000
	benchFillInFlight = 4
)

// fill enqueues n messages built by gen into queue with enqueue_batch, fillInFlight batches in flight.
func (e *benchEnv) fill(ctx context.Context, p *benchProgress, name, queue string, n int, gen func(i int) subjects.EnqueueRequest) error {
	limit := benchFillTimeout(n)
	ctx, cancel := context.WithTimeoutCause(ctx, limit, fmt.Errorf("not done in %s", limit))
	defer cancel()
	var next atomic.Int64
	var done atomic.Int64
	p.begin(name, &done)
	meter := benchStartCPU()
	start := time.Now()
	var wg sync.WaitGroup
	errs := make([]error, benchFillInFlight)
	for w := range benchFillInFlight {
		wg.Go(func() {
			for {
				from := int(next.Add(benchFillBatch)) - benchFillBatch
				if from >= n || ctx.Err() != nil {
					return
				}
				to := min(from+benchFillBatch, n)
				req := subjects.EnqueueBatchRequest{Messages: make([]subjects.EnqueueRequest, 0, to-from)}
				for i := from; i < to; i++ {
					req.Messages = append(req.Messages, gen(i))
				}
				if err := e.call(ctx, e.conn(w), subjects.OpEnqueueBatch, queue, req, nil); err != nil {
					errs[w] = fmt.Errorf("%s: %w", name, err)
					return
				}
				done.Add(int64(to - from))
			}
		})
	}
	wg.Wait()
	p.end(benchResult{ops: done.Load(), elapsed: time.Since(start), cpu: meter.ratio()})
	if ctx.Err() != nil && done.Load() < int64(n) {
		// Out of time (the cause says so), or the run was stopped; what failed after says nothing more.
		return fmt.Errorf("%s: %d of %d messages enqueued: %w", name, done.Load(), n, context.Cause(ctx))
	}
	return errors.Join(errs...)
}

// benchFillTimeout bounds a fill of n messages: two minutes, and a millisecond per 2 messages
// (fills run at 20,000 to 40,000 a second here, S5's 10M in some 7 minutes; a tenth of that leaves
// room for slower machines and --sync always).
func benchFillTimeout(n int) time.Duration {
	return 2*time.Minute + time.Duration(n)*500*time.Microsecond
}

// benchPayload returns a payload of size ASCII bytes, carried as a JSON string as a client would.
func benchPayload(size int) string { return strings.Repeat("x", size) }

// benchPriority returns message i's priority: a deadline spread over a day of Unix milliseconds,
// in an order that is random but the same in every run (and safe to compute concurrently).
func benchPriority(i int) *int64 {
	p := int64(1_767_225_600_000) + int64(benchSplitmix64(uint64(i))%(24*3600*1000))
	return &p
}

// benchSplitmix64 is a fast, well-mixed hash of x.
func benchSplitmix64(x uint64) uint64 {
	x += 0x9e3779b97f4a7c15
	x = (x ^ (x >> 30)) * 0xbf58476d1ce4e5b9
	x = (x ^ (x >> 27)) * 0x94d049bb133111eb
	return x ^ (x >> 31)
}

// benchDiscardLogger drops every log line: the bench's output is its table.
func benchDiscardLogger() *slog.Logger { return slog.New(slog.NewTextHandler(io.Discard, nil)) }

// benchRecoveryLog is the broker's logger in the bench: it drops every line but keeps how long the
// broker's recovery took and what it read, from its "recovered" line (info level, attributes took
// and from), so S6 can tell the broker's share of a restart from the server's.
type benchRecoveryLog struct {
	// mu guards the fields below.
	mu   sync.Mutex
	took time.Duration // 0 until the line is seen
	from string        // "snapshot" or "records"
	// The broker's "snapshot written" line, at its stop: how long it took and its size.
	snapshotTook  time.Duration
	snapshotBytes int64
}

func (h *benchRecoveryLog) Enabled(_ context.Context, l slog.Level) bool { return l >= slog.LevelInfo }

func (h *benchRecoveryLog) Handle(_ context.Context, r slog.Record) error {
	if r.Message != "recovered" && r.Message != "snapshot written" {
		return nil
	}
	h.mu.Lock()
	defer h.mu.Unlock()
	snapshot := r.Message == "snapshot written"
	r.Attrs(func(a slog.Attr) bool {
		switch {
		case a.Key == "took" && a.Value.Kind() == slog.KindDuration && snapshot:
			h.snapshotTook = a.Value.Duration()
		case a.Key == "took" && a.Value.Kind() == slog.KindDuration:
			h.took = a.Value.Duration()
		case a.Key == "bytes" && snapshot && a.Value.Kind() == slog.KindUint64:
			h.snapshotBytes = int64(a.Value.Uint64())
		case a.Key == "from":
			h.from = a.Value.String()
		}
		return true
	})
	return nil
}

// Snapshot returns how long writing the last snapshot took, and its size (0 if none was written).
func (h *benchRecoveryLog) Snapshot() (time.Duration, int64) {
	h.mu.Lock()
	defer h.mu.Unlock()
	return h.snapshotTook, h.snapshotBytes
}

func (h *benchRecoveryLog) WithAttrs([]slog.Attr) slog.Handler { return h }
func (h *benchRecoveryLog) WithGroup(string) slog.Handler      { return h }

// From returns what the recovery of the last "recovered" line read: "snapshot" or "records".
func (h *benchRecoveryLog) From() string {
	h.mu.Lock()
	defer h.mu.Unlock()
	return h.from
}

// Took returns the recovery time of the last "recovered" line, or 0.
func (h *benchRecoveryLog) Took() time.Duration {
	h.mu.Lock()
	defer h.mu.Unlock()
	return h.took
}
