//go:build !race

// The tests on a cluster are built without the race detector: in nats-server 2.15.2 the clustered
// stream code has a data race of its own, which the detector reports in the servers' goroutines
// (jetstream_batching.go:493 against jetstream_cluster.go:6083; seen once in 20 runs). make test
// runs them in a second pass, without -race.

package broker_test

import (
	"context"
	"errors"
	"fmt"
	"log/slog"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/nats-io/nats.go/jetstream"

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
//
// Whether a replica is behind when a load runs is up to timing, so the test cannot count on it:
// it logs how many loads were read again, 1 in 3 of 10 runs (2026-11-23); without the check, 2 of
// 10 runs failed, a leased message back pending. The check itself is pinned by kv's
// TestLoadDetectsAReplicaBehindItsLeader and by TestRecoverReadsAgainAfterAStaleLoad.
func TestRestartInAClusterLoadsCurrentRecords(t *testing.T) {
	t.Parallel()
	srvs := natstest.StartCluster(t, &natstest.ClusterOptions{SyncAlways: []int{2}})
	e, logs := clusterEnv(t, srvs[0])
	e.create("q", subjects.CreateQueueRequest{LeaseMS: 600_000})
	// Writes that put the messages bucket's replicas behind, the server that fsyncs every write
	// most of all, on a key that is not a message's (its token is not one natstone writes, so loads
	// skip it). They stop before each restart: in a load no one writes, and a replica that applies
	// writes while a load reads it is taken for one catching up.
	js, err := jetstream.New(e.nc, jetstream.WithPublishAsyncMaxPending(2048))
	if err != nil {
		t.Fatal(err)
	}
	noise := func() (stop func()) {
		done := make(chan struct{})
		var wg sync.WaitGroup
		wg.Go(func() {
			for {
				select {
				case <-done:
					return
				default:
				}
				// As many in flight as the context allows; past them, wait for the acknowledgements.
				_, err := js.PublishAsync("$KV.natstone-messages.noise.a", []byte("noise"))
				switch {
				case errors.Is(err, jetstream.ErrTooManyStalledMsgs):
					select {
					case <-js.PublishAsyncComplete():
					case <-done:
						return
					}
				case err != nil:
					t.Error(err)
					return
				}
			}
		})
		return func() {
			close(done)
			wg.Wait()
			select {
			case <-js.PublishAsyncComplete():
			case <-time.After(10 * time.Second):
				t.Fatal("the noise's writes were not acknowledged within 10 s")
			}
		}
	}

	const rounds, batch = 4, 200
	var leased []subjects.Message
	for round := range rounds {
		var req subjects.EnqueueBatchRequest
		for i := range batch {
			req.Messages = append(req.Messages, subjects.EnqueueRequest{ID: fmt.Sprintf("r%d-%03d", round, i)})
		}
		stop := noise()
		must[subjects.EnqueueBatchReply](e, subjects.OpEnqueueBatch, "q", req)
		leased = append(leased, e.dequeueOne("q"))
		stop()

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

// clusterEnv starts a broker with every bucket and stream replicated three times, connected to
// srv, a server of a cluster; its warnings and errors go to logs.
func clusterEnv(t *testing.T, srv *natstest.Server) (*env, *natstest.LogBuffer) {
	t.Helper()
	logs := &natstest.LogBuffer{}
	e := &env{t: t, clk: clock.NewFake(t0), nc: srv.Connect(t)}
	e.cfg = broker.Config{Conn: srv.Connect(t), Clock: e.clk, Replicas: 3,
		Logger: slog.New(slog.NewTextHandler(logs, &slog.HandlerOptions{Level: slog.LevelWarn}))}
	var err error
	if e.space, err = subjects.NewSpace(""); err != nil {
		t.Fatal(err)
	}
	e.startBroker()
	return e, logs
}

// TestFewerReplicasInAClusterAreLogged: a broker started without replicas keeps the store's (here
// 3), so that a restart or a standby started without them scales nothing down; one started with
// fewer (1) scales the store down, as the new holder's settings apply, and says so in its log.
func TestFewerReplicasInAClusterAreLogged(t *testing.T) {
	t.Parallel()
	e, logs := clusterEnv(t, natstest.StartCluster(t, nil)[0])
	e.enqueue("q", subjects.EnqueueRequest{ID: "m"})
	replicas := func() map[string]int {
		got := map[string]int{}
		for name := range e.jetStream().StreamNames(context.Background()).Name() {
			st, err := e.jetStream().Stream(context.Background(), name)
			if err != nil {
				t.Fatal(err)
			}
			got[name] = st.CachedInfo().Config.Replicas
		}
		return got
	}
	e.stopBroker(e.b)
	e.cfg.Replicas = 0 // not given: the store's
	e.startBroker()
	if strings.Contains(logs.String(), "scaled down") {
		t.Fatalf("a start without replicas warned:\n%s", logs)
	}
	for name, n := range replicas() {
		if n != 3 {
			t.Fatalf("stream %s has %d replicas after a start without replicas, want the store's 3 (%v)", name, n, replicas())
		}
	}
	e.stopBroker(e.b)
	e.cfg.Replicas = 1
	e.startBroker()
	if !strings.Contains(logs.String(), "the store is scaled down to this broker's replicas") {
		t.Fatalf("no warning of the store scaled down from 3 replicas to 1:\n%s", logs)
	}
	if got := e.get("q", "m"); got.ID != "m" {
		t.Fatalf("the message after the scale down: %+v", got)
	}
	if got := replicas()["KV_natstone-messages"]; got != 1 {
		t.Fatalf("the messages bucket has %d replicas after a start with 1", got)
	}
}

// TestSnapshotReadInACluster: on a cluster, a clean restart reads the snapshot the stop wrote,
// whichever server the broker is connected to and wherever its consumer of the snapshot's chunks
// lands (a pull whose interest has not reached the client's server yet gets no responders).
func TestSnapshotReadInACluster(t *testing.T) {
	t.Parallel()
	srvs := natstest.StartCluster(t, nil)
	e, logs := clusterEnv(t, srvs[0])
	for i := range 50 {
		e.enqueue("q", subjects.EnqueueRequest{ID: fmt.Sprint(i)})
	}
	e.cfg.Logger = slog.New(slog.NewTextHandler(logs, nil)) // Info: how each start recovered
	for round := range 6 {
		e.nc, e.cfg.Conn = srvs[round%3].Connect(t), srvs[round%3].Connect(t)
		logs.Reset()
		e.restartBroker()
		if log := logs.String(); !strings.Contains(log, "from=snapshot") || strings.Contains(log, "level=WARN") {
			t.Fatalf("restart %d on server %d did not read the snapshot:\n%s", round, round%3, log)
		}
		if c := e.depth("q", nil); c.Pending != 50 {
			t.Fatalf("restart %d: %+v, want 50 pending", round, c)
		}
	}
}

// TestHistoryInACluster reads a message's history over and over on a cluster: each read makes a
// consumer of the events stream, which may live on another server than the broker's connection,
// and a pull whose interest has not reached that server yet finds no responders. Such a pull is
// made again, so that no read answers message_not_found for a message whose events are stored.
func TestHistoryInACluster(t *testing.T) {
	t.Parallel()
	srvs := natstest.StartCluster(t, nil)
	e, _ := clusterEnv(t, srvs[0])
	e.enqueue("q", subjects.EnqueueRequest{ID: "m"})
	history := func() (subjects.HistoryReply, *subjects.Error) {
		return call[subjects.HistoryReply](e, subjects.OpHistory, "q", subjects.HistoryRequest{ID: "m"})
	}
	// The event is published after the enqueue's reply: wait until a read finds it.
	tick := time.NewTicker(10 * time.Millisecond)
	defer tick.Stop()
	for deadline := time.Now().Add(20 * time.Second); ; <-tick.C {
		if _, err := history(); err == nil {
			break
		} else if time.Now().After(deadline) {
			t.Fatalf("no history of the enqueued message: %v", err)
		}
	}
	for i := range 600 {
		r, err := history()
		if err != nil || len(r.Events) != 1 {
			t.Fatalf("read %d: %+v, %v; want the enqueued event", i, r, err)
		}
	}
}

// TestStandbyTakesTheStoresReplicasAtTakeOver: a standby started without replicas before the store
// existed takes over a store made since with three, and keeps them: it looks at the store's
// replicas when it opens the store, not when it began to stand by.
func TestStandbyTakesTheStoresReplicasAtTakeOver(t *testing.T) {
	t.Parallel()
	srvs := natstest.StartCluster(t, nil)
	logs := &natstest.LogBuffer{}
	newBroker := func(replicas int) *broker.Broker {
		b, err := broker.New(&broker.Config{Conn: srvs[0].Connect(t), Replicas: replicas,
			Logger: slog.New(slog.NewTextHandler(logs, nil))})
		if err != nil {
			t.Fatal(err)
		}
		return b
	}
	ctx, cancel := context.WithTimeout(context.Background(), time.Minute)
	defer cancel()
	a := newBroker(3)
	if err := a.Claim(ctx); err != nil { // the claim only: the messages bucket is not made yet
		t.Fatal(err)
	}
	b := newBroker(0)
	started := make(chan error, 1)
	go func() { started <- b.Start(ctx) }()
	tick := time.NewTicker(10 * time.Millisecond)
	defer tick.Stop()
	for !strings.Contains(logs.String(), "standing by") {
		select {
		case <-tick.C:
		case err := <-started:
			t.Fatalf("the standby started (%v) while another broker held the claim", err)
		case <-ctx.Done():
			t.Fatalf("the second broker did not stand by:\n%s", logs)
		}
	}
	if err := a.Start(ctx); err != nil { // makes the store, with three replicas
		t.Fatal(err)
	}
	if err := a.Stop(ctx); err != nil { // releases the claim: the standby takes over
		t.Fatal(err)
	}
	if err := <-started; err != nil {
		t.Fatal(err)
	}
	defer func() {
		if err := b.Stop(ctx); err != nil {
			t.Error(err)
		}
	}()
	if strings.Contains(logs.String(), "scaled down") {
		t.Fatalf("the standby scaled the store down:\n%s", logs)
	}
	js, err := jetstream.New(srvs[1].Connect(t))
	if err != nil {
		t.Fatal(err)
	}
	st, err := js.Stream(ctx, "KV_natstone-messages")
	if err != nil {
		t.Fatal(err)
	}
	if n := st.CachedInfo().Config.Replicas; n != 3 {
		t.Fatalf("the messages bucket has %d replicas after the takeover, want the 3 it was made with", n)
	}
}
