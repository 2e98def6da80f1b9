package e2e

import (
	"context"
	"errors"
	"io"
	"log/slog"
	"os"
	"path/filepath"
	"strings"
	"testing"
	"time"

	"github.com/nats-io/nats-server/v2/server"
	"github.com/nats-io/nats.go"
	"github.com/nats-io/nats.go/jetstream"

	"github.com/natstone/natstone/broker"
	"github.com/natstone/natstone/workers"
)

// documentedConfig returns the nats-server configuration block of docs/security.md.
func documentedConfig(t *testing.T) string {
	t.Helper()
	doc, err := os.ReadFile("../../docs/security.md")
	if err != nil {
		t.Fatal(err)
	}
	_, rest, ok := strings.Cut(string(doc), "```conf\n")
	conf, _, closed := strings.Cut(rest, "```")
	if !ok || !closed {
		t.Fatal("docs/security.md has no ```conf block")
	}
	return conf
}

// login is a connection as user, whose asynchronous errors (the server's permissions violations)
// arrive on errs.
type login struct {
	nc   *nats.Conn
	errs chan error
}

func logIn(t *testing.T, url, user, password string) *login {
	t.Helper()
	l := &login{errs: make(chan error, 16)}
	nc, err := nats.Connect(url, nats.UserInfo(user, password), nats.ErrorHandler(func(_ *nats.Conn, _ *nats.Subscription, err error) {
		select {
		case l.errs <- err:
		default:
		}
	}))
	if err != nil {
		t.Fatalf("log in as %s: %v", user, err)
	}
	t.Cleanup(nc.Close)
	l.nc = nc
	return l
}

// refused publishes to subject and waits for the server to refuse it.
func (l *login) refused(t *testing.T, subject string) {
	t.Helper()
	if err := l.nc.Publish(subject, []byte(`{}`)); err != nil {
		t.Fatalf("publish to %s: %v", subject, err)
	}
	if err := l.nc.Flush(); err != nil {
		t.Fatal(err)
	}
	select {
	case err := <-l.errs:
		if !errors.Is(err, nats.ErrPermissionViolation) || !strings.Contains(err.Error(), subject) {
			t.Fatalf("publish to %s: %v, want a permissions violation for it", subject, err)
		}
	case <-time.After(5 * time.Second):
		t.Fatalf("publish to %s: the server did not refuse it", subject)
	}
}

// TestDocumentedPermissions runs docs/security.md's configuration as it is written: the broker
// serves with its login, each client does what its role needs, and the server refuses the rest.
func TestDocumentedPermissions(t *testing.T) {
	passwords := map[string]string{"natstone": "b-secret", "producer": "p-secret", "worker": "w-secret", "watcher": "r-secret"}
	for user, password := range passwords {
		t.Setenv(strings.ToUpper(user)+"_PASSWORD", password)
	}
	path := filepath.Join(t.TempDir(), "nats.conf")
	if err := os.WriteFile(path, []byte(documentedConfig(t)), 0o600); err != nil {
		t.Fatal(err)
	}
	opts, err := server.ProcessConfigFile(path)
	if err != nil {
		t.Fatalf("docs/security.md's configuration: %v", err)
	}
	opts.Host, opts.Port, opts.StoreDir, opts.NoLog, opts.NoSigs = "127.0.0.1", -1, t.TempDir(), true, true
	ns, err := server.NewServer(opts)
	if err != nil {
		t.Fatal(err)
	}
	ns.Start()
	t.Cleanup(func() {
		ns.Shutdown()
		ns.WaitForShutdown()
	})
	if !ns.ReadyForConnections(10 * time.Second) {
		t.Fatal("nats-server not ready")
	}
	url := ns.ClientURL()

	ctx, cancel := context.WithTimeout(context.Background(), time.Minute)
	defer cancel()
	owner := logIn(t, url, "natstone", passwords["natstone"])
	b, err := broker.New(&broker.Config{Conn: owner.nc, StoreConn: logIn(t, url, "natstone", passwords["natstone"]).nc,
		Logger: slog.New(slog.NewTextHandler(io.Discard, nil))})
	if err != nil {
		t.Fatal(err)
	}
	if err := b.Start(ctx); err != nil {
		t.Fatalf("the broker with its documented login: %v", err)
	}
	t.Cleanup(func() {
		if err := b.Stop(context.Background()); err != nil {
			t.Error(err)
		}
	})
	client := func(l *login) *workers.Client {
		c, err := workers.NewClient(l.nc, &workers.Config{Timeout: 5 * time.Second})
		if err != nil {
			t.Fatal(err)
		}
		return c
	}

	watcher := logIn(t, url, "watcher", passwords["watcher"])
	events, err := watcher.nc.SubscribeSync("natstone.events.jobs.>")
	if err != nil {
		t.Fatal(err)
	}
	if err := watcher.nc.Flush(); err != nil {
		t.Fatal(err)
	}

	producer := logIn(t, url, "producer", passwords["producer"])
	if _, err := client(producer).Enqueue(ctx, "jobs", []byte("hello"), &workers.EnqueueOpts{ID: "job-1"}); err != nil {
		t.Fatalf("the producer's enqueue: %v", err)
	}
	producer.refused(t, "natstone.v1.dequeue.jobs")

	worker := logIn(t, url, "worker", passwords["worker"])
	ms, err := client(worker).Dequeue(ctx, "jobs", nil)
	if err != nil || len(ms) != 1 || ms[0].ID != "job-1" {
		t.Fatalf("the worker's dequeue: %+v, %v; want job-1", ms, err)
	}
	if _, err := client(worker).Complete(ctx, "jobs", "job-1", ms[0].LeaseID); err != nil {
		t.Fatalf("the worker's complete: %v", err)
	}
	forged := "natstone.events.jobs.completed.Zm9yZ2Vk"
	for _, subject := range []string{forged, "$KV.natstone-messages.jobs.am9iLTE", "$JS.API.STREAM.DELETE.natstone-events"} {
		worker.refused(t, subject)
	}
	worker.refused(t, "natstone.v1.enqueue.jobs")

	for {
		m, err := events.NextMsg(10 * time.Second)
		if err != nil {
			t.Fatalf("the watcher's events: %v before job-1's completed event", err)
		}
		if strings.Contains(m.Subject, ".completed.") {
			break
		}
	}
	h, err := client(watcher).History(ctx, "jobs", "job-1", 0)
	if err != nil || len(h.Events) == 0 || h.Events[len(h.Events)-1].Kind != "completed" {
		t.Fatalf("the watcher's history: %+v, %v; want job-1's events, completed last", h, err)
	}

	js, err := jetstream.New(owner.nc)
	if err != nil {
		t.Fatal(err)
	}
	stream, err := js.Stream(ctx, "natstone-events")
	if err != nil {
		t.Fatal(err)
	}
	if m, err := stream.GetLastMsgForSubject(ctx, forged); !errors.Is(err, jetstream.ErrMsgNotFound) {
		t.Fatalf("the forged event: %v, %v; want none stored", m, err)
	}
}
