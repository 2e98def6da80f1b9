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
	"github.com/natstone/natstone/subjects"
	"github.com/natstone/natstone/test/natstest"
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

// logIn connects as user; a client (not the broker) gets its own inbox, _INBOX_<user>, as
// docs/security.md says.
func logIn(t *testing.T, url, user, password string) *login {
	t.Helper()
	l := &login{errs: make(chan error, 16)}
	opts := []nats.Option{nats.UserInfo(user, password), nats.ErrorHandler(func(_ *nats.Conn, _ *nats.Subscription, err error) {
		select {
		case l.errs <- err:
		default:
		}
	})}
	if user != "natstone" {
		opts = append(opts, nats.CustomInboxPrefix("_INBOX_"+user))
	}
	nc, err := nats.Connect(url, opts...)
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
	l.violation(t, "Publish to \""+subject+"\"")
}

// refusedSub subscribes to subject and waits for the server to refuse it.
func (l *login) refusedSub(t *testing.T, subject string) {
	t.Helper()
	sub, err := l.nc.SubscribeSync(subject)
	if err != nil {
		t.Fatalf("subscribe to %s: %v", subject, err)
	}
	defer func() { _ = sub.Unsubscribe() }()
	l.violation(t, "Subscription to \""+subject+"\"")
}

// violation waits for the server's permissions violation about what.
func (l *login) violation(t *testing.T, what string) {
	t.Helper()
	if err := l.nc.Flush(); err != nil {
		t.Fatal(err)
	}
	select {
	case err := <-l.errs:
		if !errors.Is(err, nats.ErrPermissionViolation) || !strings.Contains(err.Error(), what) {
			t.Fatalf("%s: %v, want a permissions violation for it", what, err)
		}
	case <-time.After(5 * time.Second):
		t.Fatalf("%s: the server did not refuse it", what)
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
	url := natstest.StartOptions(t, opts).URL()

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
	if _, err := client(producer).Enqueue(ctx, "jobs", []byte("hello"), &workers.EnqueueOpts{ID: "job-1", Priority: ptr(int64(1))}); err != nil {
		t.Fatalf("the producer's enqueue: %v", err)
	}
	var batch []workers.BatchMessage
	for i, id := range []string{"job-2", "job-3", "job-4"} {
		batch = append(batch, workers.BatchMessage{Payload: []byte(id), EnqueueOpts: workers.EnqueueOpts{ID: id, Priority: ptr(int64(2 + i))}})
	}
	if _, err := client(producer).EnqueueBatch(ctx, "jobs", batch); err != nil {
		t.Fatalf("the producer's batch: %v", err)
	}
	producer.refused(t, "natstone.v1.dequeue.jobs")

	worker := logIn(t, url, "worker", passwords["worker"])
	w := client(worker)
	leased := func() workers.Message {
		t.Helper()
		ms, err := w.Dequeue(ctx, "jobs", nil)
		if err != nil || len(ms) != 1 {
			t.Fatalf("the worker's dequeue: %+v, %v; want a message", ms, err)
		}
		return ms[0]
	}
	m := leased()
	if _, err := w.Extend(ctx, "jobs", m.ID, m.LeaseID, time.Minute); err != nil {
		t.Fatalf("the worker's extend: %v", err)
	}
	if _, err := w.Release(ctx, "jobs", m.ID, m.LeaseID, nil); err != nil {
		t.Fatalf("the worker's release: %v", err)
	}
	if m = leased(); m.ID != "job-1" {
		t.Fatalf("leased %s after job-1's release, want job-1", m.ID)
	}
	settled, err := w.CompleteNext(ctx, "jobs", m.ID, m.LeaseID, &workers.DequeueOpts{})
	if err != nil || settled.NextErr != nil || len(settled.Next) != 1 || settled.Next[0].ID != "job-2" {
		t.Fatalf("the worker's complete with next: %+v, %v; want job-2 next", settled, err)
	}
	if _, err := w.Cancel(ctx, "jobs", "job-2", settled.Next[0].LeaseID); err != nil {
		t.Fatalf("the worker's cancel: %v", err)
	}
	// What the loop asks, seen by a login of the broker's.
	spy := logIn(t, url, "natstone", passwords["natstone"])
	asks, err := spy.nc.SubscribeSync("natstone.v1.*.jobs") // in the order the loop sent them
	if err != nil {
		t.Fatal(err)
	}
	// ask returns the loop's next request of op whose body contains part.
	ask := func(op subjects.Op, part string) error {
		for {
			m, err := asks.NextMsg(time.Until(deadlineOf(ctx)))
			if err != nil {
				return err
			}
			if m.Subject == "natstone.v1."+string(op)+".jobs" && strings.Contains(string(m.Data), part) {
				return nil
			}
		}
	}
	if err := spy.nc.Flush(); err != nil {
		t.Fatal(err)
	}
	done := make(chan string, 2)
	var loopLog natstest.LogBuffer
	loop, err := workers.NewWorker(w, &workers.WorkerConfig{Queue: "jobs", Logger: slog.New(slog.NewTextHandler(&loopLog, nil))}, workers.HandlerFunc(func(_ context.Context, j *workers.Job) error {
		done <- j.ID
		return nil
	}))
	if err != nil {
		t.Fatal(err)
	}
	if err := loop.Start(ctx); err != nil {
		t.Fatal(err)
	}
	for _, want := range []string{"job-3", "job-4"} {
		select {
		case got := <-done:
			if got != want {
				t.Fatalf("the worker loop ran %s, want %s", got, want)
			}
		case <-ctx.Done():
			t.Fatalf("the worker loop did not run %s", want)
		}
	}
	// The loop's long poll, once job-4's settle found nothing next.
	if err := ask(subjects.OpComplete, `"job-4"`); err != nil {
		t.Fatalf("the worker loop did not complete job-4: %v", err)
	}
	if err := ask(subjects.OpDequeue, `"wait_ms"`); err != nil {
		t.Fatalf("the worker loop did not poll after job-4: %v", err)
	}
	if err := loop.Stop(ctx); err != nil {
		t.Fatal(err)
	}
	// Its stop abandoned the long poll it left (the abandon op is in the worker's permissions).
	if err := ask(subjects.OpAbandon, `"request_id"`); err != nil || strings.Contains(loopLog.String(), "abandon of the dequeue left at the stop was not confirmed") {
		t.Fatalf("the worker loop's stop did not abandon its poll (%v):\n%s", err, loopLog.String())
	}
	forged := "natstone.events.jobs.completed.Zm9yZ2Vk"
	for _, subject := range []string{forged, "$KV.natstone-messages.jobs.am9iLTE", "natstone.body.forged", "$JS.API.STREAM.DELETE.natstone-events",
		"$JS.EVENT.ADVISORY.STREAM.LEADER_ELECTED.KV_natstone-messages", "natstone.v1.enqueue.jobs"} {
		worker.refused(t, subject)
	}

	for {
		m, err := events.NextMsg(10 * time.Second)
		if err != nil {
			t.Fatalf("the watcher's events: %v before job-1's completed event", err)
		}
		if strings.Contains(m.Subject, ".completed.") {
			break
		}
	}
	r := client(watcher)
	h, err := r.History(ctx, "jobs", "job-1", 0)
	if err != nil || len(h.Events) == 0 || h.Events[len(h.Events)-1].Kind != "completed" {
		t.Fatalf("the watcher's history: %+v, %v; want job-1's events, completed last", h, err)
	}
	if got, err := r.Get(ctx, "jobs", "job-1"); err != nil || string(got.Payload) != "hello" {
		t.Fatalf("the watcher's get: %+v, %v", got, err)
	}
	if counts, err := r.Depth(ctx, "jobs", nil); err != nil || counts.Completed != 3 || counts.Canceled != 1 {
		t.Fatalf("the watcher's depth: %+v, %v; want 3 completed and 1 canceled", counts, err)
	}
	if _, err := r.Stats(ctx, "jobs", nil); err != nil {
		t.Fatalf("the watcher's stats: %v", err)
	}
	if ms, _, err := r.Browse(ctx, "jobs", "completed", nil); err != nil || len(ms) != 3 {
		t.Fatalf("the watcher's listing: %d completed, %v; want 3", len(ms), err)
	}
	// Replies are read in one's own inbox only: not every client's, not the broker's storage
	// traffic, not the worker's.
	watcher.refusedSub(t, "_INBOX.>")
	watcher.refusedSub(t, "_INBOX_worker.>")
	producer.refusedSub(t, "_INBOX.>")
	worker.refusedSub(t, "_INBOX.>")
	// A watcher reads: it neither leases nor ends messages, nor changes queues.
	for _, subject := range []string{"natstone.v1.dequeue.jobs", "natstone.v1.cancel.jobs", "natstone.v1.delete.jobs", "natstone.v1.enqueue.jobs"} {
		watcher.refused(t, subject)
	}

	// Nor through the broker's rights: NATS does not check a request's reply subject, so a request
	// naming one of the broker's own subjects as its reply is neither run nor answered.
	forgedByReply := "natstone.events.jobs.completed.cmVwbHk"
	for _, reply := range []string{"natstone.v1.enqueue_raw.jobs", forgedByReply, "$KV.natstone-messages.jobs.am9iLTE"} {
		if err := watcher.nc.PublishRequest("natstone.v1.get.jobs", reply, []byte(`{"id":"job-1"}`)); err != nil {
			t.Fatal(err)
		}
	}
	// Taken after those by the same endpoint of the one broker.
	if got, err := r.Get(ctx, "jobs", "job-1"); err != nil || got.State != "completed" {
		t.Fatalf("job-1 after gets answered to the broker's subjects: %+v, %v", got, err)
	}
	if counts, err := r.Depth(ctx, "jobs", nil); err != nil || counts.Pending != 0 || counts.Completed != 3 {
		t.Fatalf("the depth after gets answered to the broker's subjects: %+v, %v; want nothing enqueued", counts, err)
	}

	js, err := jetstream.New(owner.nc)
	if err != nil {
		t.Fatal(err)
	}
	stream, err := js.Stream(ctx, "natstone-events")
	if err != nil {
		t.Fatal(err)
	}
	for _, subject := range []string{forged, forgedByReply} {
		if m, err := stream.GetLastMsgForSubject(ctx, subject); !errors.Is(err, jetstream.ErrMsgNotFound) {
			t.Fatalf("the forged event %s: %v, %v; want none stored", subject, m, err)
		}
	}
}

func ptr[T any](v T) *T { return &v }

// deadlineOf is ctx's deadline, which it must have.
func deadlineOf(ctx context.Context) time.Time {
	d, _ := ctx.Deadline()
	return d
}
