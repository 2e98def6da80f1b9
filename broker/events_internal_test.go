package broker

import (
	"context"
	"fmt"
	"testing"
	"time"

	"github.com/nats-io/nats.go/jetstream"

	"github.com/natstone/natstone/kv"
	"github.com/natstone/natstone/subjects"
)

// testPublisher starts a publisher of its own, lingering linger, on an events stream named
// <prefix>-events next to a test broker's. ctx ends with the test (or after 30 s).
func testPublisher(t *testing.T, prefix string, linger time.Duration) (context.Context, jetstream.JetStream, *publisher) {
	t.Helper()
	b, _ := internalBroker(t)
	js, err := jetstream.New(b.cfg.Conn)
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
	st, err := js.Stream(ctx, "drain-events")
	if err != nil {
		t.Fatal(err)
	}
	info, err := st.Info(ctx)
	if err != nil {
		t.Fatal(err)
	}
	if info.State.Msgs != n || p.published.Load() != n || p.dropped.Load() != 0 {
		t.Fatalf("after close: %d events stored, %d published, %d dropped; want %d, %d, 0",
			info.State.Msgs, p.published.Load(), p.dropped.Load(), n, n)
	}
	p.emit(pendingEvent{queue: "q", kind: subjects.EventEnqueued, rec: kv.Record{ID: "late"}})
	if p.dropped.Load() != 1 {
		t.Errorf("an event emitted after close: %d dropped, want 1", p.dropped.Load())
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
