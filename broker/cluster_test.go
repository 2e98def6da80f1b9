package broker_test

import (
	"bytes"
	"fmt"
	"log/slog"
	"strings"
	"sync"
	"testing"

	"github.com/natstone/natstone/broker"
	"github.com/natstone/natstone/broker/clock"
	"github.com/natstone/natstone/subjects"
	"github.com/natstone/natstone/test/natstest"
)

// TestRestartInAClusterLoadsCurrentRecords: on a cluster of three servers with every bucket and
// stream replicated three times, a broker restarted right after a burst of writes reads the state
// those writes left, whichever replica serves its loads. One server fsyncs before every ack, so it
// applies what its leaders replicate late; a load it serves sees an older state, which the broker
// detects with the leader and reads again (kv.ErrStale). Each round leases a message just before
// the restart: read from a replica behind, it would come back pending, to be leased again.
func TestRestartInAClusterLoadsCurrentRecords(t *testing.T) {
	t.Parallel()
	srvs := natstest.StartCluster(t, &natstest.ClusterOptions{SyncAlways: []int{2}})
	logs := &lockedBuffer{}
	e := &env{t: t, clk: clock.NewFake(t0), nc: srvs[0].Connect(t)}
	e.cfg = broker.Config{Conn: srvs[0].Connect(t), Clock: e.clk, Replicas: 3,
		Logger: slog.New(slog.NewTextHandler(logs, &slog.HandlerOptions{Level: slog.LevelWarn}))}
	var err error
	if e.space, err = subjects.NewSpace(""); err != nil {
		t.Fatal(err)
	}
	e.startBroker()
	e.create("q", subjects.CreateQueueRequest{LeaseMS: 600_000})
	// Writes that keep the messages bucket's replicas busy throughout, on a key that is not a
	// message's (its token is not one natstone writes), so that loads skip it.
	js := e.jetStream()
	stop := make(chan struct{})
	var noise sync.WaitGroup
	noise.Go(func() {
		for {
			for range 64 {
				if _, err := js.PublishAsync("$KV.natstone-messages.noise.a", []byte("noise")); err != nil {
					t.Error(err)
					return
				}
			}
			select {
			case <-js.PublishAsyncComplete():
			case <-stop:
				return
			}
		}
	})
	defer func() {
		close(stop)
		noise.Wait()
	}()

	const rounds, batch = 6, 200
	var leased []subjects.Message
	for round := range rounds {
		var req subjects.EnqueueBatchRequest
		for i := range batch {
			req.Messages = append(req.Messages, subjects.EnqueueRequest{ID: fmt.Sprintf("r%d-%03d", round, i)})
		}
		must[subjects.EnqueueBatchReply](e, subjects.OpEnqueueBatch, "q", req)
		leased = append(leased, e.dequeueOne("q"))

		e.restartBroker()

		for _, m := range leased {
			if got := e.get("q", m.ID); got.State != subjects.StateRunning || got.LeaseID != m.LeaseID {
				t.Fatalf("round %d: %s after the restart is %s under lease %q, want running under %q", round, m.ID, got.State, got.LeaseID, m.LeaseID)
			}
		}
		want := subjects.Counts{Pending: (round + 1) * (batch - 1), Running: round + 1}
		if c := e.depth("q", nil); c != want {
			t.Fatalf("round %d: depth after the restart %+v, want %+v", round, c, want)
		}
	}
	t.Logf("loads that a replica behind its leader served, read again: %d", strings.Count(logs.String(), "reading again"))
}

// lockedBuffer is a bytes.Buffer that a logger may write to from several goroutines.
type lockedBuffer struct {
	mu  sync.Mutex
	buf bytes.Buffer
}

func (b *lockedBuffer) Write(p []byte) (int, error) {
	b.mu.Lock()
	defer b.mu.Unlock()
	return b.buf.Write(p)
}

func (b *lockedBuffer) String() string {
	b.mu.Lock()
	defer b.mu.Unlock()
	return b.buf.String()
}
