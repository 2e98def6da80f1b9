package broker

import (
	"cmp"
	"context"
	"fmt"
	"io"
	"log/slog"
	"math"
	"math/rand/v2"
	"slices"
	"testing"
	"time"

	"github.com/natstone/natstone/broker/clock"
	"github.com/natstone/natstone/broker/index"
	"github.com/natstone/natstone/kv"
	"github.com/natstone/natstone/subjects"
	"github.com/natstone/natstone/test/natstest"
)

// sortKeys must order like a stable comparison sort, for any spread of priorities and sequences.
func TestSortKeysMatchesStableSort(t *testing.T) {
	t.Parallel()
	r := rand.New(rand.NewPCG(1, 2))
	gens := map[string]func(i int) (int64, uint64){
		"a day of deadlines": func(i int) (int64, uint64) {
			return 1_767_225_600_000 + r.Int64N(86_400_000), uint64(i + 1)
		},
		"one priority, FIFO": func(i int) (int64, uint64) { return 0, uint64(r.IntN(1 << 20)) },
		"full range": func(int) (int64, uint64) {
			return int64(r.Uint64()), r.Uint64()
		},
		"extremes and duplicates": func(int) (int64, uint64) {
			ps := []int64{math.MinInt64, -1, 0, 1, math.MaxInt64}
			ss := []uint64{0, 1, math.MaxUint64}
			return ps[r.IntN(len(ps))], ss[r.IntN(len(ss))]
		},
	}
	for name, gen := range gens {
		for _, n := range []int{0, 1, 100, 1<<radixBits - 1, 1 << radixBits, 50_000} {
			keys := make([]pendingKey, n)
			for i := range keys {
				p, s := gen(i)
				keys[i] = pendingKey{priority: p, seq: s, e: &entry{}}
			}
			want := slices.Clone(keys)
			slices.SortStableFunc(want, func(a, b pendingKey) int {
				if c := cmp.Compare(a.priority, b.priority); c != 0 {
					return c
				}
				return cmp.Compare(a.seq, b.seq)
			})
			sortKeys(keys)
			for i := range keys {
				if keys[i] != want[i] {
					t.Fatalf("%s, %d keys: position %d is %+v, want %+v", name, n, i, keys[i], want[i])
				}
			}
		}
	}
}

// TestDropOrphansAsksTheLeaders: dropOrphans deletes a payload that no record references, at the
// stream's first sequence, at the last one it may look at and between deleted ones, but keeps one
// whose record the load did not see (a replica behind its leader served the load), one that a
// loaded record references and one stored after the records were read.
func TestDropOrphansAsksTheLeaders(t *testing.T) {
	t.Parallel()
	b, _ := internalBroker(t)
	ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
	defer cancel()
	q := queueQ(t, b)
	body := func(id string) uint64 {
		t.Helper()
		seq, err := b.store.WriteBody("q", id, []byte(id)).Wait(ctx)
		if err != nil {
			t.Fatal(err)
		}
		return seq
	}
	first := body("first") // no record
	unseen := body("unseen")
	r := kv.Record{ID: "unseen", State: subjects.StatePending, BodySeq: unseen, Version: 1, MaxAttempts: 3}
	if _, err := b.store.WriteMessage("q", &r, 0).Wait(ctx); err != nil {
		t.Fatal(err)
	}
	gap := body("gap")
	if err := b.store.DeleteBody(ctx, gap); err != nil {
		t.Fatal(err)
	}
	between := body("between") // no record
	loaded := body("loaded")
	last := body("last") // no record
	after := body("after")
	bodies, err := b.store.ReadBodies(ctx, true)
	if err != nil {
		t.Fatal(err)
	}

	rq := &recovering{q: q, entries: []*entry{{Item: index.Item{Seq: loaded}}}}
	b.dropOrphans(ctx, bodies, last, map[string]*recovering{"q": rq}, nil)

	for seq, want := range map[uint64]bool{first: true, unseen: false, between: true, loaded: false, last: true, after: false} {
		if gone, err := b.store.BodyGone(ctx, seq); err != nil || gone != want {
			t.Errorf("payload %d gone: %v, %v; want %v", seq, gone, err, want)
		}
	}
}

// TestRecoverReadsAgainAfterAStaleLoad: when a load was served by a replica behind its leader
// (kv.ErrStale, here standing for the last load of each of the first two attempts), the broker reads
// everything again and starts with what the last attempt read, nothing of the others: not a queue
// deleted in between, nor a message twice.
func TestRecoverReadsAgainAfterAStaleLoad(t *testing.T) {
	t.Parallel()
	srv := natstest.Start(t, nil)
	ctx, cancel := context.WithTimeout(context.Background(), 20*time.Second)
	defer cancel()
	newBroker := func() *Broker {
		b, err := New(&Config{Conn: srv.Connect(t), Clock: clock.NewFake(time.UnixMilli(1_700_000_000_000)),
			Logger: slog.New(slog.NewTextHandler(io.Discard, nil))})
		if err != nil {
			t.Fatal(err)
		}
		return b
	}
	b := newBroker()
	if err := b.Start(ctx); err != nil {
		t.Fatal(err)
	}
	q, _, err := b.createQueue(ctx, "q", subjects.CreateQueueRequest{LeaseMS: 600_000})
	if err != nil {
		t.Fatal(err)
	}
	if _, _, err := b.createQueue(ctx, "gone", subjects.CreateQueueRequest{}); err != nil {
		t.Fatal(err)
	}
	if _, err := q.enqueue(ctx, []subjects.EnqueueRequest{{ID: "a"}, {ID: "b"}, {ID: "c"}}); err != nil {
		t.Fatal(err)
	}
	if _, err := q.dequeue(ctx, subjects.DequeueRequest{}); err != nil {
		t.Fatal(err)
	}
	if err := b.Stop(ctx); err != nil {
		t.Fatal(err)
	}

	b = newBroker()
	stale := 2
	b.loaded = func() error {
		if stale == 0 {
			return nil
		}
		if stale--; stale == 1 { // what the next attempt reads has changed since this one
			if err := b.store.DeleteQueue(ctx, "gone"); err != nil {
				t.Error(err)
			}
		}
		return fmt.Errorf("%w: standing in for a replica behind its leader", kv.ErrStale)
	}
	if err := b.Start(ctx); err != nil {
		t.Fatal(err)
	}
	defer func() {
		if err := b.Stop(ctx); err != nil {
			t.Error(err)
		}
	}()
	if stale != 0 || len(b.queues) != 1 {
		t.Fatalf("after the start: %d stale loads left, %d queues", stale, len(b.queues))
	}
	if c, err := b.queues["q"].depth(nil); err != nil || c != (subjects.Counts{Pending: 2, Running: 1}) {
		t.Fatalf("depth after the start: %+v, %v", c, err)
	}
}
