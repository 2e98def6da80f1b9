package embedded_test

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"log/slog"
	"os"
	"strings"
	"testing"
	"time"

	"github.com/nats-io/nats.go"
	"go.uber.org/goleak"

	"github.com/natstone/natstone/embedded"
	"github.com/natstone/natstone/subjects"
)

func TestMain(m *testing.M) { goleak.VerifyTestMain(m) }

func TestStartServeStopRestart(t *testing.T) {
	dir := t.TempDir()
	ctx := context.Background()
	for round := range 2 {
		ns, err := embedded.Start(ctx, &embedded.Config{DataDir: dir, Listen: "127.0.0.1:0"})
		if err != nil {
			t.Fatal(err)
		}
		if !strings.HasPrefix(ns.ClientURL(), "nats://127.0.0.1:") {
			t.Fatalf("client URL %q", ns.ClientURL())
		}
		nc, err := nats.Connect(ns.ClientURL())
		if err != nil {
			t.Fatal(err)
		}
		if round == 0 {
			if _, err := nc.Request("natstone.v1.enqueue.jobs", []byte(`{"id":"a","payload":"kept"}`), 5*time.Second); err != nil {
				t.Fatal(err)
			}
		}
		msg, err := nc.Request("natstone.v1.get.jobs", []byte(`{"id":"a"}`), 5*time.Second)
		if err != nil || !strings.Contains(string(msg.Data), `"payload":"kept"`) {
			t.Fatalf("round %d: get: %s %v", round, msg.Data, err)
		}
		nc.Close()
		if err := ns.Stop(ctx); err != nil {
			t.Fatal(err)
		}
	}
}

func TestNoListenAndErrors(t *testing.T) {
	if _, err := embedded.Start(context.Background(), &embedded.Config{}); err == nil {
		t.Fatal("no DataDir: want an error")
	}
	if _, err := embedded.Start(context.Background(), &embedded.Config{DataDir: t.TempDir(), Listen: "nope"}); err == nil {
		t.Fatal("bad Listen: want an error")
	}
	ns, err := embedded.Start(context.Background(), &embedded.Config{DataDir: t.TempDir(), NoListen: true})
	if err != nil {
		t.Fatal(err)
	}
	defer ns.Stop(context.Background())
	if ns.ClientURL() != "" || ns.Addr() != nil {
		t.Fatalf("NoListen listens: %q", ns.ClientURL())
	}
	nc, err := ns.Connect()
	if err != nil {
		t.Fatal(err)
	}
	defer nc.Close()
	if _, err := nc.Request("natstone.v1.list", nil, 5*time.Second); err != nil {
		t.Fatal(err)
	}
}

// Example runs natstone inside a Go program and talks to it over an in-process connection.
func Example() {
	dir, _ := os.MkdirTemp("", "natstone")
	defer os.RemoveAll(dir)
	ns, err := embedded.Start(context.Background(), &embedded.Config{DataDir: dir, NoListen: true})
	if err != nil {
		panic(err)
	}
	defer ns.Stop(context.Background())
	nc, _ := ns.Connect()
	defer nc.Close()

	reply, _ := nc.Request("natstone.v1.enqueue.emails", []byte(`{"id":"hello","priority":1}`), 5*time.Second)
	var r subjects.EnqueueReply
	_ = json.Unmarshal(reply.Data, &r)
	fmt.Println(r.ID, r.State)
	// Output: hello pending
}

// TestDataDirIsLocked: a second natstone on a data directory in use fails to start, and writes
// nothing there, rather than share the store (two nats-servers on one store corrupt it, and a
// broker started there takes over the claim it finds). The directory is free again after Stop.
func TestDataDirIsLocked(t *testing.T) {
	dir := t.TempDir()
	ctx := context.Background()
	first, err := embedded.Start(ctx, &embedded.Config{DataDir: dir, NoListen: true})
	if err != nil {
		t.Fatal(err)
	}
	second, err := embedded.Start(ctx, &embedded.Config{DataDir: dir, NoListen: true})
	if err == nil {
		_ = second.Stop(ctx)
		_ = first.Stop(ctx)
		t.Fatal("a second natstone started on a data directory in use")
	}
	if !errors.Is(err, embedded.ErrDataDirInUse) || !strings.Contains(err.Error(), "in use by another natstone") {
		t.Errorf("error %q does not say the directory is in use", err)
	}
	if err := first.Stop(ctx); err != nil {
		t.Fatal(err)
	}
	again, err := embedded.Start(ctx, &embedded.Config{DataDir: dir, NoListen: true})
	if err != nil {
		t.Fatalf("start after the first stopped: %v", err)
	}
	if err := again.Stop(ctx); err != nil {
		t.Fatal(err)
	}
}

// TestStopTwiceAtOnce: two Stops at once (a signal handler's and a deferred one) both return once
// the one stop has ended, which writes its snapshot: the next start reads it instead of every
// record. (Whether the second would otherwise return first depends on timing; TestStopRunsOnce
// pins that Stop runs once.)
func TestStopTwiceAtOnce(t *testing.T) {
	dir := t.TempDir()
	ctx := context.Background()
	ns, err := embedded.Start(ctx, &embedded.Config{DataDir: dir, NoListen: true})
	if err != nil {
		t.Fatal(err)
	}
	nc, err := ns.Connect()
	if err != nil {
		t.Fatal(err)
	}
	if _, err := nc.Request("natstone.v1.enqueue.jobs", []byte(`{"id":"a"}`), 5*time.Second); err != nil {
		t.Fatal(err)
	}
	nc.Close()
	errs := make(chan error, 2)
	for range 2 {
		go func() {
			err := ns.Stop(ctx)
			select {
			case <-ns.Broker().Done():
			default:
				err = errors.Join(err, errors.New("returned while the broker was still stopping"))
			}
			errs <- err
		}()
	}
	for range 2 {
		if err := <-errs; err != nil {
			t.Fatalf("Stop: %v", err)
		}
	}
	var logs strings.Builder
	ns, err = embedded.Start(ctx, &embedded.Config{DataDir: dir, NoListen: true, Logger: slog.New(slog.NewTextHandler(&logs, nil))})
	if err != nil {
		t.Fatal(err)
	}
	defer ns.Stop(ctx)
	if !strings.Contains(logs.String(), "from=snapshot") {
		t.Fatalf("the restart did not start from the snapshot the stop writes:\n%s", logs.String())
	}
}

// TestConnectionsClosedOnStop: an in-process connection from Connect reconnects while its server
// runs, and cannot outlive it: once Stop has shut it down, the connection is closed, and a request
// fails at once rather than waiting for a reconnect that cannot come.
func TestConnectionsClosedOnStop(t *testing.T) {
	ctx := context.Background()
	ns, err := embedded.Start(ctx, &embedded.Config{DataDir: t.TempDir(), NoListen: true})
	if err != nil {
		t.Fatal(err)
	}
	closed, reconnected := make(chan struct{}), make(chan struct{}, 1)
	nc, err := ns.Connect(nats.ClosedHandler(func(*nats.Conn) { close(closed) }),
		nats.ReconnectHandler(func(*nats.Conn) { reconnected <- struct{}{} }))
	if err != nil {
		t.Fatal(err)
	}
	defer nc.Close()
	id, err := nc.GetClientID()
	if err != nil {
		t.Fatal(err)
	}
	if err := ns.Server().DisconnectClientByID(id); err != nil {
		t.Fatal(err)
	}
	select {
	case <-reconnected:
	case <-time.After(30 * time.Second):
		t.Fatalf("the connection is %v after the server dropped it, want reconnected", nc.Status())
	}
	if _, err := nc.Request("natstone.v1.enqueue.jobs", []byte(`{"id":"a"}`), 10*time.Second); err != nil {
		t.Fatalf("request after the reconnect: %v", err)
	}
	if err := ns.Stop(ctx); err != nil {
		t.Fatal(err)
	}
	select {
	case <-closed:
	case <-time.After(30 * time.Second):
		t.Fatalf("the connection is still %v after Stop", nc.Status())
	}
	if _, err := nc.Request("natstone.v1.get.jobs", []byte(`{"id":"a"}`), time.Minute); !errors.Is(err, nats.ErrConnectionClosed) {
		t.Fatalf("request after Stop: %v, want ErrConnectionClosed", err)
	}
	if nc, err := ns.Connect(); !errors.Is(err, embedded.ErrStopped) {
		t.Fatalf("Connect after Stop: %v, %v; want ErrStopped", nc, err)
	}
}

// TestStopOfNoNatstone: the Stop of a failed Start's nil *Natstone (deferred before the error's
// check) has nothing to stop; that of a Natstone Start did not return says so. Neither panics.
func TestStopOfNoNatstone(t *testing.T) {
	var none *embedded.Natstone
	if err := none.Stop(context.Background()); err != nil {
		t.Fatalf("Stop of nil: %v", err)
	}
	var zero embedded.Natstone
	if err := zero.Stop(context.Background()); err == nil || !strings.Contains(err.Error(), "Start did not return") {
		t.Fatalf("Stop of a zero Natstone: %v, want it refused", err)
	}
}

// TestStopRunsOnce: a Stop after another returns the first one's result, and stops nothing twice.
func TestStopRunsOnce(t *testing.T) {
	ns, err := embedded.Start(context.Background(), &embedded.Config{DataDir: t.TempDir(), NoListen: true})
	if err != nil {
		t.Fatal(err)
	}
	ctx, cancel := context.WithCancel(context.Background())
	cancel() // no time: the first Stop reports its ctx's error
	first := ns.Stop(ctx)
	if !errors.Is(first, context.Canceled) || strings.Count(first.Error(), "drain") > 1 {
		t.Fatalf("Stop with a canceled ctx: %v; want its error, the connections cut said once", first)
	}
	if again := ns.Stop(context.Background()); !errors.Is(again, first) {
		t.Fatalf("second Stop: %v, want the first's %v", again, first)
	}
}

// TestStartingRunsBeforeTheBrokerServes: Config.Starting is called with the server up and the
// broker made but not serving (its recovery, which can take minutes, yet to come), so that a health
// endpoint answers meanwhile; a connection made there works once the broker serves. An error from
// it fails the Start, closes what Starting connected, and frees the directory.
func TestStartingRunsBeforeTheBrokerServes(t *testing.T) {
	dir := t.TempDir()
	ctx := context.Background()
	var early *nats.Conn
	servingEarly := true
	n, err := embedded.Start(ctx, &embedded.Config{DataDir: dir, NoListen: true, Starting: func(n *embedded.Natstone) (err error) {
		servingEarly = n.Broker().Serving()
		early, err = n.Connect()
		return err
	}})
	if err != nil {
		t.Fatal(err)
	}
	if servingEarly {
		t.Error("the broker served already when Starting was called")
	}
	if _, err := early.Request("natstone.v1.list", nil, 5*time.Second); err != nil {
		t.Errorf("a request on Starting's connection once started: %v", err)
	}
	if err := n.Stop(ctx); err != nil {
		t.Fatal(err)
	}
	refused := errors.New("refused")
	var left *nats.Conn
	if _, err := embedded.Start(ctx, &embedded.Config{DataDir: dir, NoListen: true, Starting: func(n *embedded.Natstone) (err error) {
		if left, err = n.Connect(); err != nil {
			return err
		}
		return refused
	}}); !errors.Is(err, refused) || !strings.Contains(err.Error(), "Config.Starting") {
		t.Fatalf("Start with a failing Starting: %v, want its error, naming Config.Starting", err)
	}
	if !left.IsClosed() {
		t.Error("a connection Starting made is left open by the failed Start, retrying a server that is gone")
	}
	again, err := embedded.Start(ctx, &embedded.Config{DataDir: dir, NoListen: true})
	if err != nil {
		t.Fatalf("start after a failed Start: %v", err)
	}
	if err := again.Stop(ctx); err != nil {
		t.Fatal(err)
	}
}
