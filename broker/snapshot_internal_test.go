package broker

import (
	"context"
	"errors"
	"testing"

	"github.com/natstone/natstone/kv"
	"github.com/natstone/natstone/subjects"
)

// TestNoSnapshotWhileMemoryMayDifferFromStorage: a stop writes no snapshot while a write's outcome
// is unknown or a message is busy, since the broker's memory may then not be what storage holds;
// once neither is so, it writes one with every stored message.
func TestNoSnapshotWhileMemoryMayDifferFromStorage(t *testing.T) {
	b, _ := internalBroker(t)
	ctx := context.Background()
	q, _, err := b.createQueue(ctx, "q", subjects.CreateQueueRequest{})
	if err != nil {
		t.Fatal(err)
	}
	if _, err := q.enqueue(ctx, []subjects.EnqueueRequest{{ID: "m"}, {ID: "n"}}); err != nil {
		t.Fatal(err)
	}
	q.mu.Lock()
	e := q.entries.get("m")
	q.mu.Unlock()
	for name, doubt := range map[string]func(on bool){
		"a write of unknown outcome": func(on bool) {
			q.doubtful = nil
			if on {
				q.doubtful = []*change{{e: e}}
			}
		},
		"a busy message": func(on bool) { e.setBusy(on) },
	} {
		q.mu.Lock()
		doubt(true)
		q.mu.Unlock()
		b.writeSnapshot(ctx)
		if _, err := b.store.SnapshotInfo(ctx); !errors.Is(err, kv.ErrNoSnapshot) {
			t.Fatalf("%s: a snapshot was written (%v)", name, err)
		}
		q.mu.Lock()
		doubt(false)
		q.mu.Unlock()
	}
	b.writeSnapshot(ctx)
	info, err := b.store.SnapshotInfo(ctx)
	if err != nil || info.Records != 2 {
		t.Fatalf("snapshot %+v, %v; want one of 2 records", info, err)
	}
}
