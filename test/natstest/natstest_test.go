package natstest_test

import (
	"context"
	"path/filepath"
	"strings"
	"testing"
	"time"

	"github.com/nats-io/nats.go"
	"github.com/nats-io/nats.go/jetstream"

	"github.com/natstone/natstone/test/natstest"
)

// deadline bounds every wait in these tests.
const deadline = 30 * time.Second

func testContext(t *testing.T) context.Context {
	ctx, cancel := context.WithTimeout(context.Background(), deadline)
	t.Cleanup(cancel)
	return ctx
}

// putKV creates bucket "natstest" on nc and puts key=value in it.
func putKV(ctx context.Context, t *testing.T, nc *nats.Conn, key, value string) jetstream.KeyValue {
	t.Helper()
	js, err := jetstream.New(nc)
	if err != nil {
		t.Fatalf("jetstream.New: %v", err)
	}
	kv, err := js.CreateKeyValue(ctx, jetstream.KeyValueConfig{Bucket: "natstest"})
	if err != nil {
		t.Fatalf("CreateKeyValue: %v", err)
	}
	if _, err := kv.Put(ctx, key, []byte(value)); err != nil {
		t.Fatalf("Put(%q): %v", key, err)
	}
	return kv
}

// getKV reads key from bucket "natstest" on nc.
func getKV(ctx context.Context, t *testing.T, nc *nats.Conn, key string) string {
	t.Helper()
	js, err := jetstream.New(nc)
	if err != nil {
		t.Fatalf("jetstream.New: %v", err)
	}
	kv, err := js.KeyValue(ctx, "natstest")
	if err != nil {
		t.Fatalf("KeyValue(natstest): %v", err)
	}
	e, err := kv.Get(ctx, key)
	if err != nil {
		t.Fatalf("Get(%q): %v", key, err)
	}
	return string(e.Value())
}

func TestStartConnectKV(t *testing.T) {
	ctx := testContext(t)
	s := natstest.Start(t, nil)

	if !strings.HasPrefix(s.URL(), "nats://127.0.0.1:") {
		t.Fatalf("URL() = %q, want nats://127.0.0.1:<port>", s.URL())
	}
	if s.StoreDir() == "" {
		t.Fatal("StoreDir() is empty")
	}
	if s.NATS() == nil || !s.NATS().JetStreamEnabled() {
		t.Fatal("NATS() is nil or has JetStream disabled")
	}
	if got := s.NATS().JetStreamConfig(); got == nil || got.SyncAlways {
		t.Fatalf("JetStreamConfig() = %+v, want SyncAlways=false", got)
	}
	if got, want := s.NATS().StoreDir(), filepath.Join(s.StoreDir(), "jetstream"); got != want {
		t.Fatalf("server StoreDir() = %q, want %q", got, want)
	}

	nc := s.Connect(t)
	kv := putKV(ctx, t, nc, "greeting", "hello")
	e, err := kv.Get(ctx, "greeting")
	if err != nil {
		t.Fatalf("Get: %v", err)
	}
	if got := string(e.Value()); got != "hello" {
		t.Fatalf("Get = %q, want %q", got, "hello")
	}
}

func TestSyncAlways(t *testing.T) {
	ctx := testContext(t)
	s := natstest.Start(t, &natstest.Options{SyncAlways: true})
	if got := s.NATS().JetStreamConfig(); got == nil || !got.SyncAlways {
		t.Fatalf("JetStreamConfig() = %+v, want SyncAlways=true", got)
	}
	nc := s.Connect(t)
	putKV(ctx, t, nc, "k", "synced")
	if got := getKV(ctx, t, nc, "k"); got != "synced" {
		t.Fatalf("Get = %q, want %q", got, "synced")
	}
}

func TestRestartKeepsDataAndReconnects(t *testing.T) {
	ctx := testContext(t)
	s := natstest.Start(t, nil)

	reconnected := make(chan struct{}, 1)
	nc := s.Connect(t,
		nats.MaxReconnects(-1),
		nats.ReconnectWait(20*time.Millisecond),
		nats.ReconnectHandler(func(*nats.Conn) {
			select {
			case reconnected <- struct{}{}:
			default:
			}
		}),
	)
	kv := putKV(ctx, t, nc, "k", "before-restart")

	s2 := s.Restart(t)
	if s2.URL() != s.URL() {
		t.Fatalf("restarted URL = %q, want same as before %q", s2.URL(), s.URL())
	}
	if s2.StoreDir() != s.StoreDir() {
		t.Fatalf("restarted StoreDir = %q, want %q", s2.StoreDir(), s.StoreDir())
	}
	if s.NATS().Running() {
		t.Fatal("old server still running after Restart")
	}

	select {
	case <-reconnected:
	case <-ctx.Done():
		t.Fatalf("old connection did not reconnect within %v", deadline)
	}
	if !nc.IsConnected() {
		t.Fatalf("old connection status = %v after reconnect handler, want CONNECTED", nc.Status())
	}

	// The old connection (and the KV handle made on it) sees the data...
	e, err := kv.Get(ctx, "k")
	if err != nil {
		t.Fatalf("Get on old connection after restart: %v", err)
	}
	if got := string(e.Value()); got != "before-restart" {
		t.Fatalf("Get on old connection = %q, want %q", got, "before-restart")
	}
	if _, err := kv.Put(ctx, "k2", []byte("after-restart")); err != nil {
		t.Fatalf("Put on old connection after restart: %v", err)
	}

	// ...and so does a new one.
	nc2 := s2.Connect(t)
	if got := getKV(ctx, t, nc2, "k"); got != "before-restart" {
		t.Fatalf("Get on new connection = %q, want %q", got, "before-restart")
	}
	if got := getKV(ctx, t, nc2, "k2"); got != "after-restart" {
		t.Fatalf("Get k2 on new connection = %q, want %q", got, "after-restart")
	}
}

func TestStoreDirReuse(t *testing.T) {
	ctx := testContext(t)
	dir := t.TempDir()

	s := natstest.Start(t, &natstest.Options{StoreDir: dir})
	if s.StoreDir() != dir {
		t.Fatalf("StoreDir() = %q, want %q", s.StoreDir(), dir)
	}
	putKV(ctx, t, s.Connect(t), "k", "persisted")
	s.Shutdown()
	s.Shutdown() // idempotent

	s2 := natstest.Start(t, &natstest.Options{StoreDir: dir})
	if got := getKV(ctx, t, s2.Connect(t), "k"); got != "persisted" {
		t.Fatalf("Get after restart on same StoreDir = %q, want %q", got, "persisted")
	}
}

func TestRestartAfterShutdown(t *testing.T) {
	ctx := testContext(t)
	s := natstest.Start(t, nil)
	putKV(ctx, t, s.Connect(t), "k", "v")
	s.Shutdown()
	s2 := s.Restart(t) // Restart of a stopped server just starts it again
	if s2.URL() != s.URL() {
		t.Fatalf("restarted URL = %q, want %q", s2.URL(), s.URL())
	}
	if got := getKV(ctx, t, s2.Connect(t), "k"); got != "v" {
		t.Fatalf("Get = %q, want %q", got, "v")
	}
}
