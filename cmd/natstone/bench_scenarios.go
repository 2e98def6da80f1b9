package main

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"os"
	"runtime"
	"runtime/pprof"
	"strconv"
	"sync/atomic"
	"time"

	"github.com/nats-io/nats.go"
	"github.com/nats-io/nats.go/jetstream"

	"github.com/natstone/natstone/broker"
	"github.com/natstone/natstone/kv"
	"github.com/natstone/natstone/subjects"
)

// The scenarios drive natstone through its request/reply API, with the JSON bodies a client sends.
// Every queue is created with --retention (default 0: completed messages are collected at once) and
// deleted when the last scenario using it ends.

// benchS3PayloadBytes is S3's payload size (PERFORMANCE.md: 2 KiB), and benchS3Batch its enqueue_batch size.
const (
	benchS3PayloadBytes = 2048
	benchS3Batch        = 100
)

// benchS5PayloadBytes is the size of S5's small payloads.
const benchS5PayloadBytes = 16

// benchS7Values is how many exclusivity values S7's messages spread over.
const benchS7Values = 10_000

// pendingMessage returns message i of a plain fill: random priority, --payload bytes, no id (the
// broker generates one) and no metadata.
func (b *bench) pendingMessage(i int) subjects.EnqueueRequest {
	return subjects.EnqueueRequest{Priority: benchPriority(i), Payload: b.payload}
}

// cycles runs workers that each dequeue batch messages and complete them one by one, until the
// queue is drained, --duration has passed or --pending messages are done. Latency: the dequeue.
// With --retention 0 the phase lasts until the messages it completed are also collected.
func (b *bench) cycles(ctx context.Context, env *benchEnv, name, queue string, batch int) (benchResult, error) {
	r, err := b.cycleLoop(ctx, env, name, queue, batch)
	if err != nil || b.cfg.retention != 0 {
		return r, err
	}
	meter := benchStartCPU()
	took, left, err := b.awaitCollected(ctx, env, queue)
	if total := r.elapsed + took; total > 0 { // the CPU figure covers the same time as the rate
		r.cpu = (r.cpu*r.elapsed.Seconds() + meter.ratio()*took.Seconds()) / total.Seconds()
	}
	r.elapsed += took
	r.uncollected, r.collectWait = left, took
	return r, err
}

// awaitCollected waits until queue holds no terminal message — with --retention 0, until the broker
// has collected everything completed — and returns how long that took and how many terminal
// messages there were when it started. The broker collects in batches (at least 100 ms apart
// once it has caught up), so a phase that stopped at its last complete would leave some of its work
// undone and out of its time.
func (b *bench) awaitCollected(ctx context.Context, env *benchEnv, queue string) (took time.Duration, left int, err error) {
	start := time.Now()
	ctx, cancel := context.WithTimeout(ctx, 5*time.Minute)
	defer cancel()
	tick := time.NewTicker(5 * time.Millisecond)
	defer tick.Stop()
	for first := true; ; first = false {
		var rep subjects.DepthReply
		if err := env.call(ctx, env.conn(0), subjects.OpDepth, queue, subjects.DepthRequest{}, &rep); err != nil {
			return time.Since(start), left, err
		}
		n := rep.Counts.Completed + rep.Counts.Canceled + rep.Counts.Errored
		if first {
			left = n
		}
		if n == 0 {
			return time.Since(start), left, nil
		}
		select {
		case <-tick.C:
		case <-ctx.Done():
			return time.Since(start), left, fmt.Errorf("completed messages of %s not collected: %w", queue, ctx.Err())
		}
	}
}

// cycleLoop is cycles' closed loop.
func (b *bench) cycleLoop(ctx context.Context, env *benchEnv, name, queue string, batch int) (benchResult, error) {
	req := subjects.DequeueRequest{Batch: batch}
	return benchClosedLoop(ctx, b.p, name, b.cfg.workers, b.cfg.duration, int64(b.cfg.pending), func(ctx context.Context, w int) (int, time.Duration, error) {
		nc := env.conn(w)
		t0 := time.Now()
		var rep subjects.DequeueReply
		if err := env.call(ctx, nc, subjects.OpDequeue, queue, req, &rep); err != nil {
			return 0, 0, err
		}
		lat := time.Since(t0)
		if len(rep.Messages) == 0 {
			return 0, 0, errBenchDrained
		}
		for _, m := range rep.Messages {
			if err := env.call(ctx, nc, subjects.OpComplete, queue, subjects.LeaseRequest{ID: m.ID, LeaseID: m.LeaseID}, nil); err != nil {
				return 0, 0, err
			}
		}
		return len(rep.Messages), lat, nil
	})
}

// cycleScenario fills a queue of its own with --pending messages (gen builds them), runs cycles on it
// and deletes it.
func (b *bench) cycleScenario(ctx context.Context, env *benchEnv, name string, batch int, cfg subjects.CreateQueueRequest,
	gen func(i int) subjects.EnqueueRequest) (benchResult, error) {
	queue := benchQueueName(name)
	if err := env.createQueue(ctx, queue, cfg); err != nil {
		return benchResult{}, err
	}
	if err := env.fill(ctx, b.p, name+" fill", queue, b.cfg.pending, gen); err != nil {
		return benchResult{}, err
	}
	var r benchResult
	err := b.profiled(name, func() (err error) {
		r, err = b.cycles(ctx, env, name, queue, batch)
		return err
	})
	if err != nil {
		return r, err
	}
	return r, env.deleteQueue(ctx, queue)
}

// benchMainQueue is the simple queue S1, S2 and S4 share, so that it is filled once: before each of
// them it is topped up to --pending pending messages with what the one before consumed.
type benchMainQueue struct {
	name     string
	enqueued int // messages enqueued so far: the next message's index
	consumed int // messages completed since the last top-up
}

// sharedQueue returns the shared queue's name, creating and filling it, or topping it up, first.
func (b *bench) sharedQueue(ctx context.Context, env *benchEnv, scenario string) (string, error) {
	m := b.main
	if m == nil {
		m = &benchMainQueue{name: benchQueueName("main")}
		if err := env.createQueue(ctx, m.name, subjects.CreateQueueRequest{}); err != nil {
			return "", err
		}
		if err := env.fill(ctx, b.p, scenario+" fill", m.name, b.cfg.pending, b.pendingMessage); err != nil {
			return "", err
		}
		m.enqueued = b.cfg.pending
		b.main = m
		return m.name, nil
	}
	if m.consumed > 0 {
		from := m.enqueued
		if err := env.fill(ctx, b.p, scenario+" top-up", m.name, m.consumed, func(i int) subjects.EnqueueRequest {
			return b.pendingMessage(from + i)
		}); err != nil {
			return "", err
		}
		m.enqueued += m.consumed
		m.consumed = 0
	}
	return m.name, nil
}

// dropSharedQueue deletes the shared queue, if there is one.
func (b *bench) dropSharedQueue(ctx context.Context, env *benchEnv) error {
	if b.main == nil {
		return nil
	}
	name := b.main.name
	b.main = nil
	return env.deleteQueue(ctx, name)
}

// sharedCycles runs cycles on the shared queue.
func (b *bench) sharedCycles(ctx context.Context, env *benchEnv, name string, batch int) (benchResult, error) {
	queue, err := b.sharedQueue(ctx, env, name)
	if err != nil {
		return benchResult{}, err
	}
	var r benchResult
	err = b.profiled(name, func() (err error) {
		r, err = b.cycles(ctx, env, name, queue, batch)
		return err
	})
	b.main.consumed += int(r.ops)
	return r, err
}

// profiled runs phase, under the profilers that the command line asks for if it is their
// --profile-phase.
func (b *bench) profiled(phase string, run func() error) error {
	if phase != b.cfg.profilePhase {
		return run()
	}
	stop, err := benchStartProfiles(b.cfg.cpuProfile, b.cfg.blockProfile, b.cfg.memProfile)
	if err != nil {
		return err
	}
	return errors.Join(run(), stop())
}

// benchBlockProfileRate is the block profile's sampling: about one event per this many nanoseconds
// spent blocked.
const benchBlockProfileRate = 10_000

// benchStartProfiles writes a CPU profile to cpuFile, a block profile (where goroutines wait:
// channels, mutexes, selects) to blockFile and the allocations to memFile, each if named, until stop
// is called. Go counts allocations from the process's start, so memFile+".base" gets those made
// before, for pprof's -base.
func benchStartProfiles(cpuFile, blockFile, memFile string) (stop func() error, err error) {
	if memFile != "" {
		if err := benchWriteProfile("allocs", memFile+".base"); err != nil {
			return nil, err
		}
	}
	var cpu *os.File
	if cpuFile != "" {
		if cpu, err = os.Create(cpuFile); err != nil {
			return nil, err
		}
		if err := pprof.StartCPUProfile(cpu); err != nil {
			cpu.Close()
			return nil, err
		}
	}
	if blockFile != "" {
		runtime.SetBlockProfileRate(benchBlockProfileRate)
	}
	return func() error {
		var errs []error
		if cpu != nil {
			pprof.StopCPUProfile()
			errs = append(errs, cpu.Close())
		}
		if blockFile != "" {
			runtime.SetBlockProfileRate(0)
			errs = append(errs, benchWriteProfile("block", blockFile))
		}
		if memFile != "" {
			errs = append(errs, benchWriteProfile("allocs", memFile))
		}
		return errors.Join(errs...)
	}, nil
}

// benchWriteProfile writes the named runtime profile to file.
func benchWriteProfile(name, file string) error {
	f, err := os.Create(file)
	if err != nil {
		return err
	}
	return errors.Join(pprof.Lookup(name).WriteTo(f, 0), f.Close())
}

// benchQueueName turns a row name into a queue name.
func benchQueueName(row string) string {
	out := []byte("bench-")
	for _, c := range []byte(row) {
		switch {
		case c >= 'a' && c <= 'z', c >= 'A' && c <= 'Z', c >= '0' && c <= '9', c == '-', c == '_':
			out = append(out, c)
		default:
			out = append(out, '_')
		}
	}
	return string(out)
}

func (b *bench) cycleNotes(batch int) string {
	return fmt.Sprintf("%d pending at start, %d workers, dequeue batch %d then complete each; latency: dequeue", b.cfg.pending, b.cfg.workers, batch)
}

// s1 is S1: dequeue batch 1 + complete, against B-WQ(1).
func (b *bench) s1(ctx context.Context, env *benchEnv) error {
	r, err := b.sharedCycles(ctx, env, "S1", 1)
	if err != nil {
		return err
	}
	row := benchRateRow("S1", "cycles/s", r, b.cycleNotes(1))
	row.Kind = benchKindScenario
	b.compare(row, "B-WQ(1)", 1, benchAtLeast(1.0))
	b.add(row)
	return nil
}

// s2 is S2: dequeue batch 10 + complete, against B-CAS/2.
func (b *bench) s2(ctx context.Context, env *benchEnv) error {
	r, err := b.sharedCycles(ctx, env, "S2", 10)
	if err != nil {
		return err
	}
	row := benchRateRow("S2", "cycles/s", r, b.cycleNotes(10))
	row.Kind = benchKindScenario
	b.compare(row, "B-CAS", 0.5, benchAtLeast(0.5))
	b.add(row)
	return nil
}

// s3 is S3: enqueue 2 KiB messages with the single API (one message per request, --workers
// concurrent clients) and with enqueue_batch of 100, against B-PUT of the same size.
func (b *bench) s3(ctx context.Context, env *benchEnv) error {
	payload := benchPayload(benchS3PayloadBytes)
	base := fmt.Sprintf("B-PUT(%dB)", benchS3PayloadBytes)
	for _, batch := range []int{1, benchS3Batch} {
		name := "S3-single"
		op, body := subjects.OpEnqueue, any(subjects.EnqueueRequest{Payload: payload})
		if batch > 1 {
			name = "S3-batch"
			msgs := make([]subjects.EnqueueRequest, batch)
			for i := range msgs {
				msgs[i].Payload = payload
			}
			op, body = subjects.OpEnqueueBatch, subjects.EnqueueBatchRequest{Messages: msgs}
		}
		// Every request carries the same body: encoded once, so that the clients, which share the
		// process's CPU with natstone, do not encode 200 KiB of JSON per batch over and over.
		data, err := json.Marshal(body)
		if err != nil {
			return err
		}
		queue := benchQueueName(name)
		if err := env.createQueue(ctx, queue, subjects.CreateQueueRequest{}); err != nil {
			return err
		}
		r, err := benchClosedLoop(ctx, b.p, name, b.cfg.workers, b.cfg.duration, int64(b.cfg.pending), func(ctx context.Context, w int) (int, time.Duration, error) {
			t0 := time.Now()
			if err := env.call(ctx, env.conn(w), op, queue, json.RawMessage(data), nil); err != nil {
				return 0, 0, err
			}
			return batch, time.Since(t0), nil
		})
		if err != nil {
			return err
		}
		if err := env.deleteQueue(ctx, queue); err != nil {
			return err
		}
		row := benchRateRow(name, "msgs/s", r, fmt.Sprintf("%d-byte payloads, %d messages per request, %d concurrent clients; latency: request", benchS3PayloadBytes, batch, b.cfg.workers))
		row.Kind = benchKindScenario
		b.compare(row, base, 1, benchAtLeast(0.5))
		b.add(row)
	}
	return nil
}

// s4 is S4: dequeue latency at half of S1's measured rate, open loop, on the shared queue topped up
// to --pending, against bare request/reply at the same rate (B-REQ@S4, measured just before).
func (b *bench) s4(ctx context.Context, env *benchEnv) error {
	s1 := b.row("S1")
	if s1 == nil || s1.Figure <= 0 {
		return errors.New("S4: needs S1's rate")
	}
	rate := s1.Figure / 2
	base, err := b.baselineREQ(ctx, env, "B-REQ@S4", rate)
	if err != nil {
		return err
	}
	b.add(base)
	queue, err := b.sharedQueue(ctx, env, "S4")
	if err != nil {
		return err
	}
	count := min(int64(b.cfg.pending), int64(rate*b.cfg.duration.Seconds()))
	r, err := b.openCycles(ctx, env, "S4", queue, rate, count)
	b.main.consumed += int(r.ops)
	if err != nil {
		return err
	}
	row := &benchRow{Name: "S4", Kind: benchKindScenario, Figure: benchMS(r.lat.P99), Unit: "ms (p99)", Ops: r.ops, Seconds: r.elapsed.Seconds(), CPU: r.cpu,
		Notes: fmt.Sprintf("open loop at %.0f dequeues/s (half of S1), %d pending at start, each message completed; latency: dequeue, from its scheduled time", rate, b.cfg.pending)}
	row.setLatency(r.lat)
	b.compareValue(row, "B-REQ@S4", benchMS(base.lat().P99), benchAtMost(3))
	b.add(row)
	return nil
}

// openCycles runs an open loop at rate: each scheduled request dequeues one message of queue and
// then completes it, until count are done or --duration has passed. Latency: the dequeue, from its
// scheduled time, so that a stall shows.
func (b *bench) openCycles(ctx context.Context, env *benchEnv, name, queue string, rate float64, count int64) (benchResult, error) {
	var next atomic.Int64
	req := subjects.DequeueRequest{Batch: 1}
	return benchOpenLoop(ctx, b.p, name, rate, b.cfg.duration, count, func(ctx context.Context) (time.Time, error) {
		nc := env.conn(int(next.Add(1)))
		var rep subjects.DequeueReply
		if err := env.call(ctx, nc, subjects.OpDequeue, queue, req, &rep); err != nil {
			return time.Time{}, err
		}
		end := time.Now()
		if len(rep.Messages) == 0 {
			return end, errors.New("the queue ran dry")
		}
		for _, m := range rep.Messages {
			if err := env.call(ctx, nc, subjects.OpComplete, queue, subjects.LeaseRequest{ID: m.ID, LeaseID: m.LeaseID}, nil); err != nil {
				return end, err
			}
		}
		return end, nil
	})
}

// benchS5Prefix and benchS5StorePrefix are the subjects and the storage of S5's own broker.
const (
	benchS5Prefix      = "natstone.bench-s5"
	benchS5StorePrefix = "natstone-bench-s5"
)

// s5 is S5: heap bytes per pending message, on a server of its own (dir). Server and broker share
// this process, so the broker's share is measured by taking it away: S5 starts a broker of its own
// (broker.New on the embedded server, own subjects and buckets), fills it with N pending messages,
// reads the live heap, stops the broker, closes its connections and drops it, and reads the live
// heap again at once. The drop is what the broker held; what stays, over the heap before the fill,
// is what the server holds for the same messages (measured seconds apart, so the server's caches
// and per-block state are the same in both readings).
func (b *bench) s5(ctx context.Context, dir string) (err error) {
	env, err := startEnv(ctx, dir, b.cfg.syncAlways, b.cfg.conns, b.cfg.retention, b.log)
	if err != nil {
		return err
	}
	defer func() {
		stopCtx, cancel := context.WithTimeout(context.WithoutCancel(ctx), benchStopTimeout)
		defer cancel()
		err = errors.Join(err, env.stop(stopCtx), os.RemoveAll(dir))
	}()
	space, err := subjects.NewSpace(benchS5Prefix)
	if err != nil {
		return err
	}
	clients := *env // the same connections, talking to S5's broker
	clients.space = space
	n := b.cfg.s5Pending
	queue := benchQueueName("S5")
	payload := benchPayload(benchS5PayloadBytes)

	h0 := benchLiveHeap()
	stop, err := b.startS5Broker(ctx, env)
	if err != nil {
		return err
	}
	defer func() {
		if stop != nil {
			err = errors.Join(err, stop())
		}
	}()
	if err := clients.createQueue(ctx, queue, subjects.CreateQueueRequest{}); err != nil {
		return err
	}
	err = clients.fill(ctx, b.p, "S5 fill", queue, n, func(i int) subjects.EnqueueRequest {
		return subjects.EnqueueRequest{Priority: benchPriority(i), Payload: payload}
	})
	if err != nil {
		return err
	}
	h1 := benchLiveHeap()
	err = stop()
	stop = nil
	if err != nil {
		return err
	}
	h2 := benchLiveHeap()

	total := float64(h1-h0) / float64(n)
	brokerPer := float64(h1-h2) / float64(n)
	server := float64(h2-h0) / float64(n)
	b.add(&benchRow{
		Name: "S5", Kind: benchKindScenario, Figure: brokerPer, Unit: "B/msg (broker)", Ops: int64(n),
		Target: benchAtMost(150).String(), Met: benchAtMost(150).met(brokerPer),
		Notes: fmt.Sprintf("%d pending, %d-byte payloads, server of its own: live heap %.0f B/msg in all, of which the broker %.0f "+
			"(freed when it is stopped and dropped) and the server %.0f (what stays)", n, benchS5PayloadBytes, total, brokerPer, server),
		Extra: map[string]float64{"total_bytes_per_msg": total, "server_bytes_per_msg": server, "broker_bytes_per_msg": brokerPer},
	})
	return nil
}

// startS5Broker starts S5's broker on env's server, with connections of its own; stop stops it and
// closes them, after which nothing refers to it.
func (b *bench) startS5Broker(ctx context.Context, env *benchEnv) (stop func() error, err error) {
	var conns []*nats.Conn
	closeAll := func() {
		for _, nc := range conns {
			nc.Close()
		}
	}
	for _, name := range []string{"natstone-bench-s5", "natstone-bench-s5-store"} {
		nc, err := env.ns.Connect(nats.Name(name))
		if err != nil {
			closeAll()
			return nil, err
		}
		conns = append(conns, nc)
	}
	// Its stop writes no snapshot of the records: S5 reads the heap right after the stop, and the
	// server would hold what it just stored of a snapshot of millions of records.
	br, err := broker.New(&broker.Config{Conn: conns[0], StoreConn: conns[1], Prefix: benchS5Prefix, StorePrefix: benchS5StorePrefix,
		Logger: b.log, DisableSnapshot: true})
	if err != nil {
		closeAll()
		return nil, err
	}
	if err := br.Start(ctx); err != nil {
		closeAll()
		return nil, err
	}
	return func() error {
		stopCtx, cancel := context.WithTimeout(context.WithoutCancel(ctx), benchStopTimeout)
		defer cancel()
		err := br.Stop(stopCtx)
		closeAll()
		return err
	}, nil
}

// benchLiveHeap returns the live heap after a full collection.
func benchLiveHeap() int64 {
	runtime.GC()
	runtime.GC()
	var benchMS runtime.MemStats
	runtime.ReadMemStats(&benchMS)
	return int64(benchMS.HeapAlloc)
}

// s6 is S6, on a server of its own storing in dir: a queue of --s6-pending pending messages (each
// enqueue an event, as in the other scenarios), then a restart, and the time from Start (server and
// broker) until the first dequeue is served, against B-LOAD. The broker stops cleanly, so its start
// reads the snapshot it wrote. S6-records then restarts with the snapshot off, so that the broker
// reads every record, as after a crash: a restart too, held to the same target.
func (b *bench) s6(ctx context.Context, dir string) (err error) {
	env, err := startEnv(ctx, dir, b.cfg.syncAlways, b.cfg.conns, b.cfg.retention, b.log)
	if err != nil {
		return err
	}
	defer func() {
		stopCtx, cancel := context.WithTimeout(context.WithoutCancel(ctx), benchStopTimeout)
		defer cancel()
		err = errors.Join(err, env.stop(stopCtx), os.RemoveAll(dir))
	}()
	queue := benchQueueName("S6")
	if err := env.createQueue(ctx, queue, subjects.CreateQueueRequest{}); err != nil {
		return err
	}
	if err := env.fill(ctx, b.p, "S6 fill", queue, b.cfg.s6Pending, b.pendingMessage); err != nil {
		return err
	}
	for _, name := range []string{"S6", "S6-records"} {
		env.noSnapshot = name == "S6-records"
		took, notes, err := b.restartToDequeue(ctx, env, name, queue)
		if err != nil {
			return err
		}
		row := &benchRow{Name: name, Kind: benchKindScenario, Figure: took.Seconds(), Unit: "s", Seconds: took.Seconds(), Notes: notes}
		b.compare(row, "B-LOAD", 1, benchAtMost(1.5))
		b.add(row)
	}
	return nil
}

// restartToDequeue stops env and starts it again, and returns the time from the start until a
// dequeue of queue is served, with a note on where it went; phase names it for the profilers.
func (b *bench) restartToDequeue(ctx context.Context, env *benchEnv, phase, queue string) (time.Duration, string, error) {
	var (
		took, startTook, snapshotTook time.Duration
		snapshotBytes                 int64
		rep                           subjects.DequeueReply
	)
	err := b.profiled(phase, func() error {
		stopping := env.recovery
		if err := env.stop(ctx); err != nil {
			return err
		}
		snapshotTook, snapshotBytes = stopping.Snapshot()
		t0 := time.Now()
		var err error
		if startTook, err = env.start(ctx); err != nil {
			return err
		}
		if err := env.call(ctx, env.conn(0), subjects.OpDequeue, queue, subjects.DequeueRequest{}, &rep); err != nil {
			return err
		}
		took = time.Since(t0)
		return nil
	})
	if err != nil {
		return 0, "", err
	}
	if len(rep.Messages) != 1 {
		return 0, "", fmt.Errorf("%s: the first dequeue after the restart returned %d messages", phase, len(rep.Messages))
	}
	m := rep.Messages[0]
	if err := env.call(ctx, env.conn(0), subjects.OpComplete, queue, subjects.LeaseRequest{ID: m.ID, LeaseID: m.LeaseID}, nil); err != nil {
		return 0, "", err
	}
	notes := fmt.Sprintf("%d pending; embedded.Start (server, JetStream, broker) took %.3fs, of which the broker's recovery %.3fs (its log, from the %s), then the first dequeue; %s",
		b.cfg.s6Pending, startTook.Seconds(), env.recovery.Took().Seconds(), env.recovery.From(), env.eventsRetained(ctx))
	if snapshotBytes > 0 {
		notes += fmt.Sprintf("; the clean stop before (not timed) wrote a snapshot of %.1f MB in %.3fs", float64(snapshotBytes)/1e6, snapshotTook.Seconds())
	}
	return took, notes, nil
}

// eventsRetained describes what the events stream holds, which the server indexes when it starts.
func (e *benchEnv) eventsRetained(ctx context.Context) string {
	js, err := jetstream.New(e.conn(0))
	if err != nil {
		return "events stream: " + err.Error()
	}
	st, err := js.Stream(ctx, kv.DefaultPrefix+"-events")
	if errors.Is(err, jetstream.ErrStreamNotFound) {
		return "no events stream"
	}
	if err != nil {
		return "events stream: " + err.Error()
	}
	info := st.CachedInfo()
	return fmt.Sprintf("the events stream held %d events on %d subjects (%d MB)", info.State.Msgs, info.State.NumSubjects, info.State.Bytes>>20)
}

// s7 is S7: an exclusive queue whose messages spread over s7Values exclusivity values, against S1.
// Just before it the same messages (the same metadata) go through a simple queue, S7-simple: S1 runs
// first, on a smaller process, and S7 near the end, after the other scenarios have grown the server's
// streams and the process's heap, so S7 ÷ S7-simple is what exclusivity itself costs and
// S7-simple ÷ S1 what running later does.
func (b *bench) s7(ctx context.Context, env *benchEnv) error {
	gen := func(i int) subjects.EnqueueRequest {
		m := b.pendingMessage(i)
		m.Metadata = map[string]string{"group": "g" + strconv.Itoa(i%benchS7Values)}
		return m
	}
	values := min(benchS7Values, b.cfg.pending)
	tr, err := b.cycleScenario(ctx, env, "S7-simple", 1, subjects.CreateQueueRequest{}, gen)
	if err != nil {
		return err
	}
	ref := benchRateRow("S7-simple", "cycles/s", tr,
		fmt.Sprintf("S7's messages (metadata of %d values) in a simple queue, just before S7; ", values)+b.cycleNotes(1))
	ref.Kind = benchKindReference
	b.compare(ref, "S1", 1, benchTarget{})
	b.add(ref)

	cfg := subjects.CreateQueueRequest{Type: subjects.Exclusive, ExclusivityKey: "group"}
	r, err := b.cycleScenario(ctx, env, "S7", 1, cfg, gen)
	if err != nil {
		return err
	}
	notes := fmt.Sprintf("exclusive queue, %d values; ", values) + b.cycleNotes(1)
	if ref.Figure > 0 {
		notes += fmt.Sprintf("; ÷ S7-simple: %.2f", r.rate()/ref.Figure)
	}
	row := benchRateRow("S7", "cycles/s", r, notes)
	row.Kind = benchKindScenario
	b.compare(row, "S1", 1, benchAtLeast(0.8))
	b.add(row)
	return nil
}

// s8 is S8: one client alternates a dequeue filtered on 4 metadata pairs that 0.1% of the pending
// messages carry (each pair alone: 10%, 10%, 10%, 100%) with an unfiltered dequeue of the same
// queue, completing each message; p50 of the filtered ÷ p50 of the unfiltered. Then S8-many, a
// reference: as many dequeues, each filtered on the next of the 999 other such filters (at most
// 1,000 dequeues: each filter asked once), more than the broker keeps a set for (S8's one filter
// gets its own set of matches once its dequeues have walked past enough others; see
// broker/index's collect).
func (b *bench) s8(ctx context.Context, env *benchEnv) error {
	queue := benchQueueName("S8")
	if err := env.createQueue(ctx, queue, subjects.CreateQueueRequest{}); err != nil {
		return err
	}
	digit := func(i, d int) string { return strconv.Itoa((i / d) % 10) }
	err := env.fill(ctx, b.p, "S8 fill", queue, b.cfg.pending, func(i int) subjects.EnqueueRequest {
		m := b.pendingMessage(i)
		m.Metadata = map[string]string{"a": digit(i, 1), "b": digit(i, 10), "c": digit(i, 100), "d": "x"}
		return m
	})
	if err != nil {
		return err
	}
	filterOf := func(k int) map[string]string {
		return map[string]string{"a": digit(k, 1), "b": digit(k, 10), "c": digit(k, 100), "d": "x"}
	}
	filtered := subjects.DequeueRequest{Filter: filterOf(0)}
	matches := int64(b.cfg.pending+999) / 1000
	var fl, ul []time.Duration
	nc := env.conn(0)
	step := func(req subjects.DequeueRequest) (time.Duration, bool, error) {
		t0 := time.Now()
		var rep subjects.DequeueReply
		if err := env.call(ctx, nc, subjects.OpDequeue, queue, req, &rep); err != nil {
			return 0, false, err
		}
		lat := time.Since(t0)
		for _, m := range rep.Messages {
			if err := env.call(ctx, nc, subjects.OpComplete, queue, subjects.LeaseRequest{ID: m.ID, LeaseID: m.LeaseID}, nil); err != nil {
				return 0, false, err
			}
		}
		return lat, len(rep.Messages) > 0, nil
	}
	r, err := benchClosedLoop(ctx, b.p, "S8", 1, b.cfg.duration, matches, func(context.Context, int) (int, time.Duration, error) {
		lat, ok, err := step(filtered)
		if err != nil {
			return 0, 0, err
		}
		if !ok {
			return 0, 0, errBenchDrained
		}
		fl = append(fl, lat)
		ulat, _, err := step(subjects.DequeueRequest{})
		if err != nil {
			return 0, 0, err
		}
		ul = append(ul, ulat)
		return 1, lat, nil
	})
	if err != nil {
		return err
	}
	k := 0
	many, err := benchClosedLoop(ctx, b.p, "S8-many", 1, b.cfg.duration, matches, func(context.Context, int) (int, time.Duration, error) {
		k = k%999 + 1 // filter 0 is S8's, drained
		lat, ok, err := step(subjects.DequeueRequest{Filter: filterOf(k)})
		if err != nil {
			return 0, 0, err
		}
		if !ok {
			return 0, 0, errBenchDrained
		}
		return 1, lat, nil
	})
	if err != nil {
		return err
	}
	if err := env.deleteQueue(ctx, queue); err != nil {
		return err
	}
	ref := &benchRow{Name: "S8-unfiltered", Kind: benchKindReference, Figure: benchMS(benchLatencyOf(ul).P50), Unit: "ms (p50)", Ops: int64(len(ul)), CPU: r.cpu,
		Notes: "the unfiltered dequeues interleaved with S8's"}
	ref.setLatency(benchLatencyOf(ul))
	b.add(ref)
	row := &benchRow{Name: "S8", Kind: benchKindScenario, Figure: benchMS(r.lat.P50), Unit: "ms (p50)", Ops: r.ops, CPU: r.cpu,
		Notes: fmt.Sprintf("%d pending, %d match the filter; one client, sequential", b.cfg.pending, matches)}
	row.setLatency(benchLatencyOf(fl))
	b.add(row)
	b.compareValue(row, "S8-unfiltered", ref.Figure, benchAtMost(2))
	manyRow := &benchRow{Name: "S8-many", Kind: benchKindReference, Figure: benchMS(many.lat.P50), Unit: "ms (p50)", Ops: many.ops, CPU: many.cpu,
		Notes: fmt.Sprintf("as S8, each dequeue filtered on the next of 999 other filters of %d matches each (each asked at most once)", matches)}
	manyRow.setLatency(many.lat)
	b.add(manyRow)
	b.compareValue(manyRow, "S8-unfiltered", ref.Figure, benchTarget{})
	return nil
}

// ms returns d in milliseconds.
func benchMS(d time.Duration) float64 { return float64(d) / float64(time.Millisecond) }

// benchCPUCost says what a cycle cost in process CPU with events and without: the cost of events
// that a throughput ratio hides once the machine's cores are not all busy.
func benchCPUCost(on, off benchResult) string {
	a, b := on.cpuPerOp(), off.cpuPerOp()
	if b <= 0 {
		return "CPU per cycle not measured"
	}
	return fmt.Sprintf("CPU per cycle %.0f µs with events, %.0f µs without (%+.0f%%)",
		float64(a)/1e3, float64(b)/1e3, 100*(float64(a)/float64(b)-1))
}

// benchEVShare is the share of --pending that each closed EV run fills and drains: three run.
const benchEVShare = 4

// ev is EV: what publishing every transition costs the dequeue path, with the events stream on and
// off (the broker restarted in between, on the same server and store), each run on a fresh queue.
//   - Throughput: S1's closed loop on --pending/4 messages with events on, off, and on again; the
//     mean rate of the two runs with events ÷ the run without (EV ÷ EV-off).
//   - Latency: S4's open loop at half of EV-off's rate, with events off and then on; the dequeue p99
//     with events ÷ without (EV@half ÷ EV-off@half). Below saturation this is what a request feels.
func (b *bench) ev(ctx context.Context, env *benchEnv) error {
	n := max(b.cfg.pending/benchEVShare, 1)
	run := func(name string, noEvents bool, rate float64) (benchResult, error) {
		if env.noEvents != noEvents {
			env.noEvents = noEvents
			if _, err := env.restart(ctx, env.syncAlways); err != nil {
				return benchResult{}, err
			}
		}
		queue := benchQueueName(name)
		if err := env.createQueue(ctx, queue, subjects.CreateQueueRequest{}); err != nil {
			return benchResult{}, err
		}
		fill := n
		if rate > 0 {
			fill = max(int(rate*b.cfg.duration.Seconds()), 1)
		}
		if err := env.fill(ctx, b.p, name+" fill", queue, fill, b.pendingMessage); err != nil {
			return benchResult{}, err
		}
		var r benchResult
		var err error
		if rate > 0 {
			r, err = b.openCycles(ctx, env, name, queue, rate, int64(fill))
		} else {
			r, err = b.cycles(ctx, env, name, queue, 1)
		}
		if err != nil {
			return r, err
		}
		return r, env.deleteQueue(ctx, queue)
	}
	on1, err := run("EV-on", false, 0)
	if err != nil {
		return err
	}
	off, err := run("EV-off", true, 0)
	if err != nil {
		return err
	}
	rate := off.rate() / 2
	offHalf, err := run("EV-off@half", true, rate)
	if err != nil {
		return err
	}
	onHalf, err := run("EV@half", false, rate)
	if err != nil {
		return err
	}
	on2, err := run("EV-on2", false, 0)
	if err != nil {
		return err
	}
	notes := fmt.Sprintf("%d pending at start, %d workers, dequeue batch 1 then complete each", n, b.cfg.workers)
	offRow := benchRateRow("EV-off", "cycles/s", off, "events stream off; "+notes)
	offRow.Kind = benchKindReference
	b.add(offRow)
	on := benchResult{ops: on1.ops + on2.ops, elapsed: on1.elapsed + on2.elapsed,
		cpu: (on1.cpu*on1.elapsed.Seconds() + on2.cpu*on2.elapsed.Seconds()) / (on1.elapsed + on2.elapsed).Seconds()}
	row := benchRateRow("EV", "cycles/s", on, fmt.Sprintf("events stream on (two runs, before and after EV-off: %.0f and %.0f cycles/s); %s; %s",
		on1.rate(), on2.rate(), notes, benchCPUCost(on, off)))
	row.Kind = benchKindScenario
	b.compare(row, "EV-off", 1, benchTarget{})
	b.add(row)
	halfNotes := fmt.Sprintf("open loop at %.0f dequeues/s (half of EV-off), each message completed; latency: dequeue, from its scheduled time", rate)
	offHalfRow := &benchRow{Name: "EV-off@half", Kind: benchKindReference, Figure: benchMS(offHalf.lat.P99), Unit: "ms (p99)",
		Ops: offHalf.ops, Seconds: offHalf.elapsed.Seconds(), CPU: offHalf.cpu, Notes: "events stream off; " + halfNotes}
	offHalfRow.setLatency(offHalf.lat)
	b.add(offHalfRow)
	onHalfRow := &benchRow{Name: "EV@half", Kind: benchKindScenario, Figure: benchMS(onHalf.lat.P99), Unit: "ms (p99)",
		Ops: onHalf.ops, Seconds: onHalf.elapsed.Seconds(), CPU: onHalf.cpu, Notes: "events stream on; " + halfNotes}
	onHalfRow.setLatency(onHalf.lat)
	onHalfRow.Notes += "; " + benchCPUCost(onHalf, offHalf)
	b.compareValue(onHalfRow, "EV-off@half", offHalfRow.Figure, benchTarget{})
	b.add(onHalfRow)
	return nil
}
