package broker

import (
	"context"
	"errors"
	"log/slog"
	"testing"
	"time"

	"github.com/nats-io/nats-server/v2/server"
	"github.com/nats-io/nats.go"

	"github.com/natstone/natstone/broker/clock"
	"github.com/natstone/natstone/kv"
	"github.com/natstone/natstone/subjects"
	"github.com/natstone/natstone/test/natstest"
)

// TestNoSnapshotWhileMemoryMayDifferFromStorage: a stop writes no snapshot while a write's outcome
// is unknown, a message is busy or a queue's delete stopped part way, since the broker's memory may
// then not be what storage holds; once none is so, it writes one with every stored message.
func TestNoSnapshotWhileMemoryMayDifferFromStorage(t *testing.T) {
	b, _ := internalBroker(t)
	ctx := context.Background()
	q := queueQ(t, b)
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
		// The delete may have removed payloads of records that a start from the snapshot, which
		// lists payloads only when few were deleted, would keep.
		"a delete stopped part way": func(on bool) { q.deleting = on },
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

// TestStopWithStreamsSilentGivesUpTheSnapshot: a stop whose questions of the streams' state go
// unanswered (as while the streams elect leaders; here the server drops them, the broker's user
// refused them once it runs) gives up the snapshot after the write timeout, and releases the
// claim, a standby's to take at once, instead of spending the whole stop waiting.
func TestStopWithStreamsSilentGivesUpTheSnapshot(t *testing.T) {
	t.Parallel()
	broker := &server.User{Username: "broker", Password: "pw"}
	srv := natstest.StartOptions(t, &server.Options{Users: []*server.User{broker}})
	logs := &recordedLogs{}
	b, err := New(&Config{Conn: srv.Connect(t, nats.UserInfo("broker", "pw")), Clock: clock.NewFake(time.UnixMilli(1_700_000_000_000)),
		Logger: slog.New(logs), WriteTimeout: time.Second})
	if err != nil {
		t.Fatal(err)
	}
	ctx := context.Background()
	if err := b.Start(ctx); err != nil {
		t.Fatal(err)
	}
	q := queueQ(t, b)
	if _, err := q.enqueue(ctx, []subjects.EnqueueRequest{{ID: "m"}}); err != nil {
		t.Fatal(err)
	}
	srv.Reload(t, func(o *server.Options) {
		o.Users = []*server.User{{Username: broker.Username, Password: broker.Password,
			Permissions: &server.Permissions{Publish: &server.SubjectPermission{Allow: []string{">"}, Deny: []string{"$JS.API.STREAM.INFO.>"}}}}}
	})
	stop, cancel := context.WithTimeout(ctx, 30*time.Second)
	defer cancel()
	if err := b.Stop(stop); err != nil {
		t.Fatalf("stop: %v", err)
	}
	if got := logs.find(slog.LevelWarn, "no snapshot written: the next start reads every record"); len(got) != 1 {
		t.Errorf("the stop's log of its snapshot: %v, want it given up", got)
	}
	if got := logs.find(slog.LevelWarn, "the store's claim was not released: a standby takes over once its ttl is up"); len(got) != 0 {
		t.Errorf("the stop did not release the claim: %v", got)
	}
	if _, _, err := b.claim.claims.Get(ctx); !errors.Is(err, kv.ErrNotFound) {
		t.Errorf("the store's claim after the stop: %v, want it released", err)
	}
}
