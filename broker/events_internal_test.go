package broker

import (
	"context"
	"errors"
	"fmt"
	"strings"
	"syscall"
	"testing"
	"time"

	"github.com/nats-io/nats.go/jetstream"

	"github.com/natstone/natstone/kv"
	"github.com/natstone/natstone/subjects"
)

// testPublisher starts a publisher of its own, lingering linger, on an events stream named
// <prefix>-events next to a test broker's. ctx ends with the test (or after 30 s).
func testPublisher(t testing.TB, prefix string, linger time.Duration) (context.Context, jetstream.JetStream, *publisher) {
	t.Helper()
	b, _ := internalBroker(t)
	js, err := jetstream.New(b.cfg.Conn, jetstream.WithPublishAsyncTimeout(b.cfg.WriteTimeout)) // as the broker makes it
	if err != nil {
		t.Fatal(err)
	}
	ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
	t.Cleanup(cancel)
	store, err := kv.OpenEvents(ctx, &kv.EventsConfig{JS: js, Prefix: prefix, MaxAge: time.Hour})
	if err != nil {
		t.Fatal(err)
	}
	return ctx, js, newPublisher(b, store, linger)
}

// storedEvents returns how many messages the stream holds.
func storedEvents(ctx context.Context, t *testing.T, js jetstream.JetStream, stream string) uint64 {
	t.Helper()
	st, err := js.Stream(ctx, stream)
	if err != nil {
		t.Fatal(err)
	}
	info, err := st.Info(ctx)
	if err != nil {
		t.Fatal(err)
	}
	return info.State.Msgs
}

// TestPublisherCloseDrains emits many events and closes the publisher at once: close must publish
// every buffered event before it returns (Broker.Stop relies on it), not just stop the goroutine.
func TestPublisherCloseDrains(t *testing.T) {
	ctx, js, p := testPublisher(t, "drain", eventLinger)
	const n = 3 * maxEventBatch // several batches: most are still buffered when close is called
	for i := range n {
		p.emit(pendingEvent{queue: "q", kind: subjects.EventEnqueued, rec: kv.Record{ID: fmt.Sprint(i), Version: 1}})
	}
	if err := p.close(ctx); err != nil {
		t.Fatal(err)
	}
	if stored := storedEvents(ctx, t, js, "drain-events"); stored != n || p.published.Load() != n || p.dropped.Load() != 0 {
		t.Fatalf("after close: %d events stored, %d published, %d dropped; want %d, %d, 0",
			stored, p.published.Load(), p.dropped.Load(), n, n)
	}
	p.emit(pendingEvent{queue: "q", kind: subjects.EventEnqueued, rec: kv.Record{ID: "late"}})
	if p.dropped.Load() != 1 {
		t.Errorf("an event emitted after close: %d dropped, want 1", p.dropped.Load())
	}
}

// TestPublisherPublishesUnderTheClaimOnly: a broker that lost its claim (here, ended) publishes
// none of the events it had buffered, since the broker that took the store over may have stored
// later events of the same messages (a frozen broker that went on stored a completed message's
// enqueued event after its completion, and history read the message as just enqueued). One whose
// claim is not renewed in time holds its events until a renewal lands.
func TestPublisherPublishesUnderTheClaimOnly(t *testing.T) {
	ctx, js, p := testPublisher(t, "claim", time.Hour) // what is emitted waits for a sync or close
	c := p.b.claim
	waiting := make(chan struct{}, 1)
	p.waitingForClaim = func() { waiting <- struct{}{} }
	c.mu.Lock()
	c.until.Store(1) // not renewed in time: it does not hold, and has not ended
	c.mu.Unlock()
	p.emit(pendingEvent{queue: "q", kind: subjects.EventEnqueued, rec: kv.Record{ID: "held", Version: 1}})
	synced := make(chan error, 1)
	go func() { synced <- p.sync(ctx) }()
	select {
	case <-waiting:
	case <-ctx.Done():
		t.Fatal("the batch did not wait for the claim")
	}
	c.mu.Lock()
	c.renewed(c.rev, c.clock.Now()) // a renewal lands
	c.mu.Unlock()
	if err := <-synced; err != nil {
		t.Fatal(err)
	}
	if p.published.Load() != 1 || p.dropped.Load() != 0 {
		t.Fatalf("an event emitted while the claim was not renewed: %d published, %d dropped; want it published once renewed", p.published.Load(), p.dropped.Load())
	}

	p.emit(pendingEvent{queue: "q", kind: subjects.EventEnqueued, rec: kv.Record{ID: "lost", Version: 1}})
	c.abandon() // ended, as by a renewal that found another broker's claim
	if err := p.close(ctx); err != nil {
		t.Fatal(err)
	}
	if stored := storedEvents(ctx, t, js, "claim-events"); stored != 1 || p.published.Load() != 1 || p.dropped.Load() != 1 {
		t.Fatalf("after the claim ended: %d events stored, %d published, %d dropped; want 1, 1, 1", stored, p.published.Load(), p.dropped.Load())
	}
}

// TestPublisherSyncDoesNotLinger lengthens the publisher's linger to an hour: a sync (what history
// and FlushEvents do) must still return at once, because it asks the publisher to stop lingering
// until every event emitted before it is published: a few events (the publisher lingers on them),
// then more than a batch (a full batch and a partial one).
func TestPublisherSyncDoesNotLinger(t *testing.T) {
	ctx, _, p := testPublisher(t, "linger", time.Hour)
	var want uint64
	for round, n := range []int{10, maxEventBatch + 10, 10} {
		for i := range n {
			p.emit(pendingEvent{queue: "q", kind: subjects.EventEnqueued, rec: kv.Record{ID: fmt.Sprint(round, "-", i), Version: 1}})
		}
		want += uint64(n)
		sctx, scancel := context.WithTimeout(ctx, 10*time.Second)
		err := p.sync(sctx)
		scancel()
		if err != nil {
			t.Fatalf("round %d: sync: %v (it waited for the linger)", round, err)
		}
		if got := p.published.Load(); got != want {
			t.Fatalf("round %d: %d published after sync, want %d", round, got, want)
		}
	}
	if err := p.close(ctx); err != nil {
		t.Fatal(err)
	}
}

// TestPublisherDropsAreNotCountedAsHandled: sync waits until handled reaches what emitted was when
// it was called, and handled counts the buffer's events in their order. An event dropped (buffer
// full, or the publisher closing) must count in neither: it once counted as handled at once, so
// drops after a sync's call let it return while the events buffered before it were unpublished.
func TestPublisherDropsAreNotCountedAsHandled(t *testing.T) {
	ctx, _, p := testPublisher(t, "drops", time.Hour)
	for i := range 3 {
		p.emit(pendingEvent{queue: "q", kind: subjects.EventEnqueued, rec: kv.Record{ID: fmt.Sprint(i), Version: 1}})
	}
	p.mu.Lock()
	p.closing = true // what close sets: from now on every emit drops its event
	p.mu.Unlock()
	for i := range 5 {
		p.emit(pendingEvent{queue: "q", kind: subjects.EventEnqueued, rec: kv.Record{ID: fmt.Sprint("late-", i), Version: 1}})
	}
	p.mu.Lock()
	emitted, handled := p.emitted, p.handled
	p.mu.Unlock()
	if emitted != 3 || handled > 3 || p.dropped.Load() != 5 {
		t.Fatalf("emitted %d, handled %d, dropped %d; want 3, at most 3, 5", emitted, handled, p.dropped.Load())
	}
	p.mu.Lock()
	p.closing = false
	p.mu.Unlock()
	if err := p.sync(ctx); err != nil {
		t.Fatal(err)
	}
	if got := p.published.Load(); got != 3 {
		t.Fatalf("%d published after sync, want the 3 buffered before the drops", got)
	}
	if err := p.close(ctx); err != nil {
		t.Fatal(err)
	}
}

// BenchmarkPublisher measures what publishing an event costs the process, the embedded server's
// storing it included: cpu-ns/op is the process CPU time per event (the publisher and the server
// work on other goroutines than the benchmark's, so ns/op alone says little). The events are
// leased events of distinct messages, published in batches as a busy broker's are.
func BenchmarkPublisher(b *testing.B) {
	ctx, _, p := testPublisher(b, "bench", eventLinger)
	e := pendingEvent{queue: "bench-q", kind: subjects.EventLeased, prev: subjects.StatePending, worker: "w-17",
		at: 1_790_000_000_123, rec: kv.Record{State: subjects.StateRunning, Priority: 1_790_000_000_000, Version: 3,
			Attempts: 1, MaxAttempts: 3, LeaseID: "01JDLEASE0000000000000001", LeaseExpires: 1_790_000_030_123, RequestID: "req-1"}}
	ids := make([]string, b.N)
	for i := range ids {
		ids[i] = fmt.Sprintf("01JD%020d", i)
	}
	cpu0 := processCPU(b)
	b.ResetTimer()
	for i := range b.N {
		e.rec.ID = ids[i]
		p.emit(e)
		if i%maxEventBatch == maxEventBatch-1 {
			if err := p.sync(ctx); err != nil { // as a bounded buffer would: never drop
				b.Fatal(err)
			}
		}
	}
	if err := p.sync(ctx); err != nil {
		b.Fatal(err)
	}
	b.StopTimer()
	b.ReportMetric(float64(processCPU(b)-cpu0)/float64(b.N), "cpu-ns/op")
	if d := p.dropped.Load(); d != 0 {
		b.Fatalf("%d events dropped", d)
	}
	if err := p.close(ctx); err != nil {
		b.Fatal(err)
	}
}

// processCPU returns the CPU time the process has used, user and system.
func processCPU(tb testing.TB) time.Duration {
	var ru syscall.Rusage
	if err := syscall.Getrusage(syscall.RUSAGE_SELF, &ru); err != nil {
		tb.Fatal(err)
	}
	return time.Duration(ru.Utime.Nano() + ru.Stime.Nano())
}

// TestPublisherWaitsOutAStreamWithoutLeader: while its events stream takes nothing (gone here, as
// it is to the writes of a cluster whose server leading it was killed, until another is elected:
// no responders either way), the publisher publishes a batch again and again, and when the stream
// is back the batch is stored, not dropped. Before, three tries in a second and a half dropped it.
func TestPublisherWaitsOutAStreamWithoutLeader(t *testing.T) {
	ctx, js, p := testPublisher(t, "leaderless", time.Hour)
	if err := js.DeleteStream(ctx, "leaderless-events"); err != nil {
		t.Fatal(err)
	}
	const n = 3
	for i := range n {
		p.emit(pendingEvent{queue: "q", kind: subjects.EventEnqueued, rec: kv.Record{ID: fmt.Sprint(i), Version: 1}})
	}
	synced := make(chan error, 1)
	go func() { synced <- p.sync(ctx) }()
	tick := time.NewTicker(5 * time.Millisecond)
	defer tick.Stop()
	for p.refused.Load() < eventPublishTries { // as many tries refused as once dropped the batch
		select {
		case <-tick.C:
		case err := <-synced:
			t.Fatalf("sync returned (%v) with the stream gone: %d published, %d dropped", err, p.published.Load(), p.dropped.Load())
		}
	}
	if _, err := kv.OpenEvents(ctx, &kv.EventsConfig{JS: js, Prefix: "leaderless", MaxAge: time.Hour}); err != nil {
		t.Fatal(err)
	}
	if err := <-synced; err != nil {
		t.Fatal(err)
	}
	if pub, drop := p.published.Load(), p.dropped.Load(); pub != n || drop != 0 {
		t.Fatalf("%d published, %d dropped; want %d published once the stream was back, none dropped", pub, drop, n)
	}
	if err := p.close(ctx); err != nil {
		t.Fatal(err)
	}
}

// TestPublisherCloseGivesUpOnAStreamWithoutLeader: a close whose context ends while the publisher
// waits out a stream that takes nothing returns, and the publisher drops the batch and ends rather
// than publish it again until the write timeout.
func TestPublisherCloseGivesUpOnAStreamWithoutLeader(t *testing.T) {
	ctx, js, p := testPublisher(t, "closing", time.Hour)
	if err := js.DeleteStream(ctx, "closing-events"); err != nil {
		t.Fatal(err)
	}
	p.emit(pendingEvent{queue: "q", kind: subjects.EventEnqueued, rec: kv.Record{ID: "m", Version: 1}})
	cctx, cancel := context.WithTimeout(ctx, 300*time.Millisecond)
	defer cancel()
	if err := p.close(cctx); !errors.Is(err, context.DeadlineExceeded) || !strings.Contains(err.Error(), "1 dropped or unconfirmed") {
		t.Fatalf("close: %v, want its context's end, saying the event was dropped", err)
	}
	// Half the write timeout: a publisher that ignored the close would try until all of it passed.
	select {
	case <-p.done:
	case <-time.After(p.b.cfg.WriteTimeout / 2):
		t.Fatal("the publisher did not end after its close gave up")
	}
	if pub, drop := p.published.Load(), p.dropped.Load(); pub != 0 || drop != 1 {
		t.Fatalf("%d published, %d dropped; want the event dropped", pub, drop)
	}
}

// TestPublisherClosingGivesABatchItsTriesOnly: a close drains the buffer, but does not wait out a
// stream that takes nothing as a running broker does: a stop has its snapshot to write and its
// claim to release after the events, within the same time. The first batch gets eventPublishTries,
// and once it is dropped so the others are dropped without a try.
func TestPublisherClosingGivesABatchItsTriesOnly(t *testing.T) {
	ctx, js, p := testPublisher(t, "stopping", time.Hour)
	if err := js.DeleteStream(ctx, "stopping-events"); err != nil {
		t.Fatal(err)
	}
	const n = 3 * maxEventBatch // three batches: the first gets its tries, the others none
	for i := range n {
		p.emit(pendingEvent{queue: "q", kind: subjects.EventEnqueued, rec: kv.Record{ID: fmt.Sprint(i), Version: 1}})
	}
	began := time.Now()
	if err := p.close(ctx); err != nil {
		t.Fatal(err)
	}
	if took := time.Since(began); took >= p.b.cfg.WriteTimeout/2 {
		t.Fatalf("close took %v: it waited out the refusals as a running broker does", took)
	}
	if pub, drop, tries := p.published.Load(), p.dropped.Load(), p.refused.Load(); pub != 0 || drop != n || tries != eventPublishTries {
		t.Fatalf("%d published, %d dropped after %d tries; want all %d dropped after %d tries of the first batch", pub, drop, tries, n, eventPublishTries)
	}
}
