package main

import (
	"context"
	"errors"
	"fmt"
	"strconv"
	"sync"
	"sync/atomic"
	"time"

	"github.com/nats-io/nats.go"
	"github.com/nats-io/nats.go/jetstream"

	"github.com/natstone/natstone/kv"
	"github.com/natstone/natstone/subjects"
)

// The baselines measure what plain JetStream and NATS do on the same server, with the same clients,
// in the same run as the scenarios they are compared with (docs/performance.md).

// Names of the baseline buckets and streams; each is deleted when its baseline ends.
const (
	benchCASBucket   = "bench-cas"
	benchPUTBucket   = "bench-put"
	benchLOADBucket  = "bench-load"
	benchWQStream    = "bench-wq"
	benchWQSubject   = "bench.wq"
	benchEchoSubject = "bench.echo"
)

// benchPipelineWindow bounds the async writes one benchPipeline has in flight (B-CAS, B-PUT and
// the fills of B-WQ and B-LOAD).
const benchPipelineWindow = 512

// benchWaitFunc waits for an async write's acknowledgement and returns its stream sequence.
type benchWaitFunc func() (uint64, error)

// benchFutureWait adapts a JetStream publish future.
func benchFutureWait(f jetstream.PubAckFuture) benchWaitFunc {
	return func() (uint64, error) {
		select {
		case ack := <-f.Ok():
			return ack.Sequence, nil
		case err := <-f.Err():
			return 0, err
		}
	}
}

// benchPipeline issues writes 0…n-1 (issue(i)), at most window in flight, stopping early after d, and
// calls done(i, seq) for each acknowledgement, in order, on one goroutine. Latency is from issue to
// acknowledgement. done for write i runs before write i+window+1 is issued, so a writer that reuses
// a key every k ≥ window+2 writes always sees that key's last revision.
func benchPipeline(ctx context.Context, p *benchProgress, name string, n int64, window int, d time.Duration,
	issue func(i int64) (benchWaitFunc, error), done func(i int64, seq uint64)) (benchResult, error) {
	type benchInflight struct {
		i    int64
		wait benchWaitFunc
		at   time.Time
	}
	ch := make(chan benchInflight, window)
	var ops atomic.Int64
	var lastEnd time.Time
	var werr error
	samples := make([]time.Duration, 0, min(n, 1<<20))
	failed := make(chan struct{})
	p.begin(name, &ops)
	meter := benchStartCPU()
	start := time.Now()
	deadline := start.Add(d)
	var wg sync.WaitGroup
	wg.Go(func() {
		for x := range ch {
			if werr != nil {
				continue // drain
			}
			seq, err := x.wait()
			if err != nil {
				werr = fmt.Errorf("%s: write %d: %w", name, x.i, err)
				close(failed)
				continue
			}
			lastEnd = time.Now()
			if len(samples) < cap(samples) {
				samples = append(samples, lastEnd.Sub(x.at))
			}
			if done != nil {
				done(x.i, seq)
			}
			ops.Add(1)
		}
	})
	var ierr error
issue:
	for i := int64(0); i < n; i++ {
		if i%256 == 0 && (ctx.Err() != nil || time.Now().After(deadline)) {
			break
		}
		at := time.Now()
		wait, err := issue(i)
		if err != nil {
			ierr = fmt.Errorf("%s: write %d: %w", name, i, err)
			break
		}
		select {
		case ch <- benchInflight{i: i, wait: wait, at: at}:
		case <-failed:
			break issue
		}
	}
	close(ch)
	wg.Wait()
	r := benchResult{ops: ops.Load(), cpu: meter.ratio()}
	if !lastEnd.IsZero() {
		r.elapsed = lastEnd.Sub(start)
	}
	p.end(r)
	if err := errors.Join(ierr, werr, ctx.Err()); err != nil {
		return r, err
	}
	r.lat = benchLatencyOf(samples)
	return r, nil
}

// benchWindowFor returns the pipeline window for a writer that cycles over n keys: small enough that a
// key's previous write is acknowledged before it is written again (see benchPipeline).
func benchWindowFor(n int) int { return max(1, min(benchPipelineWindow, (n-2)/2)) }

// benchKey returns the KV key of item i: the shape of a message key (queue, then a 22-character
// token like a generated message id's).
func benchKey(i int) string { return kv.MessageKey("bench", fmt.Sprintf("%022d", i)) }

// benchOpenBucket creates a KV bucket configured like natstone's messages bucket (history 1, file storage).
func benchOpenBucket(ctx context.Context, js jetstream.JetStream, name string) (jetstream.KeyValue, error) {
	return js.CreateOrUpdateKeyValue(ctx, jetstream.KeyValueConfig{Bucket: name, History: 1, Storage: jetstream.FileStorage})
}

// benchCAS is B-CAS's bucket: n keys with their last revisions.
type benchCAS struct {
	js    jetstream.JetStream
	nc    *nats.Conn
	revs  []uint64
	value []byte
}

// newCAS connects a writer of its own (the broker also writes on a connection of its own) and
// creates n keys.
func (b *bench) newCAS(ctx context.Context, env *benchEnv, name string, n int) (*benchCAS, error) {
	s := &benchCAS{revs: make([]uint64, n), value: []byte(benchPayload(b.cfg.payload))}
	if err := s.connect(env); err != nil {
		return nil, err
	}
	if _, err := benchOpenBucket(ctx, s.js, benchCASBucket); err != nil {
		s.nc.Close()
		return nil, err
	}
	_, err := benchPipeline(ctx, b.p, name+" create", int64(n), benchPipelineWindow, time.Hour,
		func(i int64) (benchWaitFunc, error) { return s.write(int(i), 0) },
		func(i int64, seq uint64) { s.revs[i] = seq })
	if err != nil {
		s.nc.Close()
		return nil, err
	}
	return s, nil
}

func (s *benchCAS) connect(env *benchEnv) error {
	nc, js, err := env.pipelined("natstone-bench-cas")
	if err != nil {
		return err
	}
	s.nc, s.js = nc, js
	return nil
}

// write issues a compare-and-swap write of key i expecting revision expect (0: a new key), as
// kv.Store.WriteMessage does.
func (s *benchCAS) write(i int, expect uint64) (benchWaitFunc, error) {
	msg := &nats.Msg{Subject: "$KV." + benchCASBucket + "." + benchKey(i), Data: s.value, Header: nats.Header{}}
	msg.Header.Set(jetstream.ExpectedLastSubjSeqHeader, strconv.FormatUint(expect, 10))
	f, err := s.js.PublishMsgAsync(msg)
	if err != nil {
		return nil, err
	}
	return benchFutureWait(f), nil
}

// updates runs B-CAS's measured phase: every key in turn is updated with its last revision.
func (s *benchCAS) updates(ctx context.Context, b *bench, name string) (benchResult, error) {
	n := len(s.revs)
	return benchPipeline(ctx, b.p, name, int64(n)*benchMaxPasses, benchWindowFor(n), b.cfg.duration,
		func(i int64) (benchWaitFunc, error) { return s.write(int(i)%n, s.revs[int(i)%n]) },
		func(i int64, seq uint64) { s.revs[int(i)%n] = seq })
}

// close deletes the bucket and closes the writer's connection.
func (s *benchCAS) close(ctx context.Context) error {
	defer s.nc.Close()
	return s.js.DeleteKeyValue(ctx, benchCASBucket)
}

// benchMaxPasses bounds the count of the throughput baselines that cycle over their keys.
const benchMaxPasses = 50

// baselineCAS is B-CAS: pipelined compare-and-swap updates of distinct keys.
func (b *bench) baselineCAS(ctx context.Context, env *benchEnv, name string) (*benchRow, error) {
	s, err := b.newCAS(ctx, env, name, b.cfg.pending)
	if err != nil {
		return nil, err
	}
	r, err := s.updates(ctx, b, name)
	err = errors.Join(err, s.close(ctx))
	if err != nil {
		return nil, err
	}
	return benchRateRow(name, "writes/s", r, fmt.Sprintf("%d keys, %d-byte values, %d writes in flight", b.cfg.pending, b.cfg.payload, benchWindowFor(b.cfg.pending))), nil
}

// baselineWQ is B-WQ(batch): a WorkQueue stream with a durable pull consumer; each worker fetches
// up to batch messages without waiting and acknowledges each with a confirmed ack (DoubleAck).
func (b *bench) baselineWQ(ctx context.Context, env *benchEnv, batch int) (*benchRow, error) {
	name := fmt.Sprintf("B-WQ(%d)", batch)
	js, err := env.jetStream(0, jetstream.WithPublishAsyncMaxPending(4*benchPipelineWindow))
	if err != nil {
		return nil, err
	}
	st, err := js.CreateStream(ctx, jetstream.StreamConfig{
		Name: benchWQStream, Subjects: []string{benchWQSubject}, Retention: jetstream.WorkQueuePolicy, Storage: jetstream.FileStorage,
	})
	if err != nil {
		return nil, err
	}
	defer func() { _ = js.DeleteStream(context.WithoutCancel(ctx), benchWQStream) }()
	n := b.cfg.pending
	payload := []byte(benchPayload(b.cfg.payload))
	_, err = benchPipeline(ctx, b.p, name+" fill", int64(n), benchPipelineWindow, time.Hour, func(int64) (benchWaitFunc, error) {
		f, err := js.PublishAsync(benchWQSubject, payload)
		if err != nil {
			return nil, err
		}
		return benchFutureWait(f), nil
	}, nil)
	if err != nil {
		return nil, err
	}
	if _, err := st.CreateOrUpdateConsumer(ctx, jetstream.ConsumerConfig{
		Durable: "bench", AckPolicy: jetstream.AckExplicitPolicy, AckWait: time.Minute, MaxAckPending: 100_000,
	}); err != nil {
		return nil, err
	}
	cons := make([]jetstream.Consumer, b.cfg.workers)
	for w := range cons {
		wjs, err := env.jetStream(w)
		if err != nil {
			return nil, err
		}
		if cons[w], err = wjs.Consumer(ctx, benchWQStream, "bench"); err != nil {
			return nil, err
		}
	}
	var acked atomic.Int64
	r, err := benchClosedLoop(ctx, b.p, name, b.cfg.workers, b.cfg.duration, int64(n), func(ctx context.Context, w int) (int, time.Duration, error) {
		if acked.Load() >= int64(n) {
			return 0, 0, errBenchDrained
		}
		t0 := time.Now()
		// No wait, like a dequeue without wait_ms: the batch is what is there.
		mb, err := cons[w].FetchNoWait(batch)
		if err != nil {
			return 0, 0, err
		}
		var msgs []jetstream.Msg
		for m := range mb.Messages() {
			msgs = append(msgs, m)
		}
		lat := time.Since(t0)
		if err := mb.Error(); err != nil && !errors.Is(err, nats.ErrTimeout) && !errors.Is(err, jetstream.ErrNoMessages) {
			return 0, 0, err
		}
		for _, m := range msgs {
			if err := m.DoubleAck(ctx); err != nil {
				return 0, 0, err
			}
		}
		acked.Add(int64(len(msgs)))
		if len(msgs) == 0 {
			return 0, 0, nil
		}
		return len(msgs), lat, nil
	})
	if err != nil {
		return nil, err
	}
	return benchRateRow(name, "msgs/s", r, fmt.Sprintf("%d pre-filled, %d workers, fetch %d (no wait) + DoubleAck each; latency: fetch", n, b.cfg.workers, batch)), nil
}

// baselinePUT is B-PUT: async KV puts of size-byte values to distinct keys, the enqueue ceiling.
func (b *bench) baselinePUT(ctx context.Context, env *benchEnv, size int) (*benchRow, error) {
	name := fmt.Sprintf("B-PUT(%dB)", size)
	nc, js, err := env.pipelined("natstone-bench-put")
	if err != nil {
		return nil, err
	}
	defer nc.Close()
	if _, err := benchOpenBucket(ctx, js, benchPUTBucket); err != nil {
		return nil, err
	}
	defer func() { _ = js.DeleteKeyValue(context.WithoutCancel(ctx), benchPUTBucket) }()
	value := []byte(benchPayload(size))
	n := b.cfg.pending
	r, err := benchPipeline(ctx, b.p, name, int64(n), benchPipelineWindow, b.cfg.duration, benchPut(js, benchPUTBucket, value), nil)
	if err != nil {
		return nil, err
	}
	return benchRateRow(name, "puts/s", r, fmt.Sprintf("up to %d distinct keys, %d in flight", n, benchPipelineWindow)), nil
}

// benchPut returns a pipeline operation that puts value, without a revision check, to key i of
// bucket.
func benchPut(js jetstream.JetStream, bucket string, value []byte) func(i int64) (benchWaitFunc, error) {
	return func(i int64) (benchWaitFunc, error) {
		f, err := js.PublishMsgAsync(&nats.Msg{Subject: "$KV." + bucket + "." + benchKey(int(i)), Data: value})
		if err != nil {
			return nil, err
		}
		return benchFutureWait(f), nil
	}
}

// echo answers requests on echoSubj with a payload-sized reply, on a connection of its own (as the
// broker has); stop ends it.
func (b *bench) echo(env *benchEnv) (stop func(), err error) {
	nc, err := env.ns.Connect(nats.Name("natstone-bench-echo"))
	if err != nil {
		return nil, err
	}
	reply := []byte(benchPayload(b.cfg.payload))
	if _, err := nc.Subscribe(benchEchoSubject, func(m *nats.Msg) { _ = m.Respond(reply) }); err != nil {
		nc.Close()
		return nil, err
	}
	if err := nc.Flush(); err != nil {
		nc.Close()
		return nil, err
	}
	return nc.Close, nil
}

// baselineREQ is B-REQ: bare NATS request/reply to an echo responder at a fixed rate.
func (b *bench) baselineREQ(ctx context.Context, env *benchEnv, name string, rate float64) (*benchRow, error) {
	stop, err := b.echo(env)
	if err != nil {
		return nil, err
	}
	defer stop()
	var next atomic.Int64
	body := []byte(`{"batch":1}`)
	r, err := benchOpenLoop(ctx, b.p, name, rate, b.cfg.duration, int64(rate*b.cfg.duration.Seconds()), func(ctx context.Context) (time.Time, error) {
		nc := env.conn(int(next.Add(1)))
		ctx, cancel := context.WithTimeout(ctx, benchCallTimeout)
		defer cancel()
		_, err := nc.RequestWithContext(ctx, benchEchoSubject, body)
		return time.Now(), err
	})
	if err != nil {
		return nil, err
	}
	row := benchRateRow(name, "req/s", r, fmt.Sprintf("open loop at %.0f/s, %d-byte replies; latency from each request's scheduled time", rate, b.cfg.payload))
	return row, nil
}

// benchSampleRecord returns a record shaped like a pending message's as the broker stores it.
func benchSampleRecord(id string, seq uint64, payloadSize int, now int64) *kv.Record {
	return &kv.Record{
		ID: id, State: subjects.StatePending, Priority: *benchPriority(int(seq)), BodySeq: seq,
		PayloadSize: payloadSize, Version: 1, MaxAttempts: subjects.DefaultMaxAttempts,
		EnqueuedAt: now, VisibleAt: now, UpdatedAt: now,
	}
}

// baselineLOAD is B-LOAD: the time to read a bucket of --s6-pending message-sized records with an
// ordered consumer (a KV watcher; recovery reads the messages bucket through a pull consumer). It
// reads the bucket twice and keeps the faster read, the floor: the first, just after the fill,
// can take twice as long while the server still writes the fill out.
func (b *bench) baselineLOAD(ctx context.Context, env *benchEnv) (*benchRow, error) {
	const name = "B-LOAD"
	nc, js, err := env.pipelined("natstone-bench-load")
	if err != nil {
		return nil, err
	}
	defer nc.Close()
	bucket, err := benchOpenBucket(ctx, js, benchLOADBucket)
	if err != nil {
		return nil, err
	}
	defer func() { _ = js.DeleteKeyValue(context.WithoutCancel(ctx), benchLOADBucket) }()
	n := b.cfg.s6Pending
	now := time.Now().UnixMilli()
	value, err := kv.EncodeRecord(benchSampleRecord("0123456789012345678901", 123456, b.cfg.payload, now))
	if err != nil {
		return nil, err
	}
	_, err = benchPipeline(ctx, b.p, name+" fill", int64(n), benchPipelineWindow, time.Hour, benchPut(js, benchLOADBucket, value), nil)
	if err != nil {
		return nil, err
	}
	var reads [2]benchResult
	for i := range reads {
		if reads[i], err = b.readBucket(ctx, bucket, fmt.Sprintf("%s (read %d of 2)", name, i+1), n); err != nil {
			return nil, err
		}
	}
	r := reads[0]
	if reads[1].elapsed < r.elapsed {
		r = reads[1]
	}
	return &benchRow{
		Name: name, Kind: benchKindBaseline, Figure: r.elapsed.Seconds(), Unit: "s", Ops: r.ops, Seconds: r.elapsed.Seconds(), CPU: r.cpu,
		Notes: fmt.Sprintf("%d keys of %d bytes, %.0f keys/s; the faster of two reads (%.3fs, %.3fs)", n, len(value), r.rate(),
			reads[0].elapsed.Seconds(), reads[1].elapsed.Seconds()),
	}, nil
}

// benchLoadTimeout bounds one read of B-LOAD's bucket.
const benchLoadTimeout = 10 * time.Minute

// readBucket reads every key of bucket, which holds n, with a KV watcher, within benchLoadTimeout.
func (b *bench) readBucket(ctx context.Context, bucket jetstream.KeyValue, phase string, n int) (benchResult, error) {
	ctx, cancel := context.WithTimeout(ctx, benchLoadTimeout)
	defer cancel()
	var read atomic.Int64
	b.p.begin(phase, &read)
	meter := benchStartCPU()
	start := time.Now()
	w, err := bucket.WatchAll(ctx, jetstream.IgnoreDeletes())
	if err != nil {
		b.p.end(benchResult{})
		return benchResult{}, err
	}
	defer func() { _ = w.Stop() }()
	for done := false; !done; {
		select {
		case e := <-w.Updates():
			if done = e == nil; !done {
				read.Add(1)
			}
		case <-ctx.Done():
			b.p.end(benchResult{ops: read.Load(), elapsed: time.Since(start)})
			return benchResult{}, fmt.Errorf("%s: read %d of %d keys: %w", phase, read.Load(), n, context.Cause(ctx))
		}
	}
	r := benchResult{ops: read.Load(), elapsed: time.Since(start), cpu: meter.ratio()}
	b.p.end(r)
	if r.ops != int64(n) {
		return benchResult{}, fmt.Errorf("%s: read %d keys, want %d", phase, r.ops, n)
	}
	return r, nil
}
