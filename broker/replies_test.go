package broker_test

import (
	"encoding/base64"
	"encoding/json"
	"io"
	"log/slog"
	"os"
	"path/filepath"
	"strings"
	"testing"
	"time"

	"github.com/nats-io/nats-server/v2/server"
	"github.com/nats-io/nats.go"
	"github.com/nats-io/nats.go/micro"

	"github.com/natstone/natstone/broker"
	"github.com/natstone/natstone/broker/clock"
	"github.com/natstone/natstone/kv"
	"github.com/natstone/natstone/subjects"
	"github.com/natstone/natstone/test/natstest"
)

// endpointStats returns the discovery statistics of op's endpoint.
func (e *env) endpointStats(op subjects.Op) *micro.EndpointStats {
	e.t.Helper()
	msg, err := e.nc.Request("$SRV.STATS.natstone", nil, 5*time.Second)
	if err != nil {
		e.t.Fatal(err)
	}
	var stats micro.Stats
	if err := json.Unmarshal(msg.Data, &stats); err != nil {
		e.t.Fatal(err)
	}
	for _, ep := range stats.Endpoints {
		if ep.Name == string(op) {
			return ep
		}
	}
	e.t.Fatalf("no endpoint %s", op)
	return nil
}

// TestRepliesGoOnlyToInboxes: NATS checks a requester's right to publish its request, never its
// reply subject, and the broker may publish to its own storage. A request whose reply subject is a
// system subject, one of the broker's requests, or its store's payloads or events, would have the
// broker write its answer there (a watcher, allowed only to read, could enqueue, overwrite a record
// or the claim, or forge an event). Such a request is neither run nor answered; it is counted as an
// error of its endpoint.
func TestRepliesGoOnlyToInboxes(t *testing.T) {
	t.Parallel()
	e := setup(t)
	e.create("q", subjects.CreateQueueRequest{})
	e.enqueue("q", subjects.EnqueueRequest{ID: "m", Payload: "secret"})

	refused := []string{
		"$KV.natstone-messages." + kv.MessageKey("q", "x"),
		"$KV.natstone-claims.broker",
		e.space.Subject(subjects.OpEnqueueRaw, "victim"),
		"natstone.events.q.completed." + base64.RawURLEncoding.EncodeToString([]byte("m")),
		"natstone.body.q",
	}
	var heard []*nats.Subscription
	for _, reply := range refused {
		sub, err := e.nc.SubscribeSync(reply)
		if err != nil {
			t.Fatal(err)
		}
		heard = append(heard, sub)
	}
	get := e.space.Subject(subjects.OpGet, "q")
	for _, reply := range append(refused, "_INBOX.a.*") {
		if err := e.nc.PublishRequest(get, reply, []byte(`{"id":"m"}`)); err != nil {
			t.Fatal(err)
		}
	}
	if err := e.nc.PublishRequest("$SRV.PING", "$KV.natstone-claims.broker", nil); err != nil {
		t.Fatal(err)
	}
	// Requests to one endpoint are taken in the order sent, and a refusal is decided as each is
	// taken: once this one is answered, every one before it was refused or run.
	if got := e.get("q", "m"); got.State != subjects.StatePending {
		t.Fatalf("m is %s", got.State)
	}
	if st := e.endpointStats(subjects.OpGet); st.NumRequests != 7 || st.NumErrors != 6 || !strings.Contains(st.LastError, "reply subject") {
		t.Fatalf("get's statistics: %+v; want 6 of 7 requests refused for their reply subject", st)
	}
	if err := e.nc.Flush(); err != nil {
		t.Fatal(err)
	}
	for i, sub := range heard {
		if n, _, _ := sub.Pending(); n != 0 {
			t.Errorf("the broker published %d messages to %s", n, refused[i])
		}
	}
	if l := must[subjects.ListReply](e, subjects.OpList, "", nil); len(l.Queues) != 1 {
		t.Errorf("queues %+v, want only q", l.Queues)
	}
}

// TestNoLeasesForNobody: a dequeue published without a reply subject would lease messages that
// reach nobody, each running nowhere for a whole lease with an attempt spent: it is refused. A
// settle published without one settles, and its next leases nothing.
func TestNoLeasesForNobody(t *testing.T) {
	t.Parallel()
	e := setup(t)
	e.create("q", subjects.CreateQueueRequest{})
	e.enqueue("q", subjects.EnqueueRequest{ID: "a", Priority: ptr[int64](1)})
	e.enqueue("q", subjects.EnqueueRequest{ID: "b", Priority: ptr[int64](2)})

	dequeue := e.space.Subject(subjects.OpDequeue, "q")
	if err := e.nc.Publish(dequeue, []byte(`{"batch":5}`)); err != nil {
		t.Fatal(err)
	}
	// Taken after the publish by the same endpoint (see TestRepliesGoOnlyToInboxes).
	if ms := e.dequeue("q", subjects.DequeueRequest{Filter: map[string]string{"k": "none"}}); len(ms) != 0 {
		t.Fatalf("dequeued %v", ids(ms))
	}
	if st := e.endpointStats(subjects.OpDequeue); st.NumErrors != 1 {
		t.Fatalf("dequeue's statistics: %+v; want the publish refused", st)
	}
	if c := e.depth("q", nil); c.Pending != 2 || c.Running != 0 {
		t.Fatalf("depth after a dequeue without a reply subject: %+v", c)
	}

	completed := e.events("natstone.events.q.completed.>")
	a := e.dequeueOne("q")
	body := mustJSON(t, subjects.LeaseRequest{ID: a.ID, LeaseID: a.LeaseID, Next: &subjects.DequeueRequest{}})
	if err := e.nc.Publish(e.space.Subject(subjects.OpComplete, "q"), body); err != nil {
		t.Fatal(err)
	}
	select {
	case <-completed:
	case <-time.After(10 * time.Second):
		t.Fatal("a's complete, published without a reply subject, was not run")
	}
	if b := e.dequeueOne("q"); b.ID != "b" || b.Attempts != 1 {
		t.Fatalf("dequeued %s at attempt %d, want b at its first", b.ID, b.Attempts)
	}
}

// TestRepliesAcrossAccountsAreNotTracked: a requester in another account, through a service import,
// names a reply subject the server made ("_R_."), which the server takes on the requester's behalf
// whether anybody listens or not. A leasing reply published to it with a reply subject of the
// broker's (to hear that it reached nobody) would make the server keep a response import for it,
// for as long as the broker runs; it is published without one.
func TestRepliesAcrossAccountsAreNotTracked(t *testing.T) {
	t.Parallel()
	dir := t.TempDir()
	conf := filepath.Join(dir, "accounts.conf")
	if err := os.WriteFile(conf, []byte(`accounts {
  SVC { jetstream: enabled, users: [{user: svc, password: svc}], exports: [{service: "natstone.v1.>"}] }
  APP { users: [{user: app, password: app}], imports: [{service: {account: SVC, subject: "natstone.v1.>"}}] }
}`), 0o600); err != nil {
		t.Fatal(err)
	}
	opts, err := server.ProcessConfigFile(conf)
	if err != nil {
		t.Fatal(err)
	}
	srv := natstest.StartOptions(t, opts)
	e := &env{t: t, srv: srv, clk: clock.NewFake(t0), nc: srv.Connect(t, nats.UserInfo("app", "app"))}
	e.cfg = broker.Config{Conn: srv.Connect(t, nats.UserInfo("svc", "svc")), Clock: e.clk, Logger: slog.New(slog.NewTextHandler(io.Discard, nil))}
	if e.space, err = subjects.NewSpace(""); err != nil {
		t.Fatal(err)
	}
	e.startBroker()
	e.create("q", subjects.CreateQueueRequest{})
	for range 20 {
		e.enqueue("q", subjects.EnqueueRequest{})
		if ms := e.dequeue("q", subjects.DequeueRequest{}); len(ms) != 1 {
			t.Fatalf("dequeued %d messages, want 1", len(ms))
		}
	}
	for _, name := range []string{"SVC", "APP"} {
		acc, err := srv.NATS().LookupAccount(name)
		if err != nil {
			t.Fatal(err)
		}
		if n, r := acc.NumPendingAllResponses(), acc.NumPendingReverseResponses(); n != 0 || r != 0 {
			t.Errorf("account %s keeps %d response imports and %d reverse ones after 20 leasing replies, want none", name, n, r)
		}
	}
}

// TestRefusedRepliesAreLoggedSparingly: a client that sends requests with refused reply subjects in
// a loop must not fill the log: one WARN, then none for 10 s, each counting the refusals since.
func TestRefusedRepliesAreLoggedSparingly(t *testing.T) {
	t.Parallel()
	logs := &natstest.LogBuffer{}
	e := setup(t, func(c *broker.Config) {
		c.Logger = slog.New(slog.NewTextHandler(logs, &slog.HandlerOptions{Level: slog.LevelWarn}))
	})
	get := e.space.Subject(subjects.OpGet, "q")
	for range 5 {
		if err := e.nc.PublishRequest(get, "$KV.natstone-claims.broker", []byte(`{"id":"m"}`)); err != nil {
			t.Fatal(err)
		}
	}
	fails(e, subjects.CodeQueueNotFound, subjects.OpGet, "q", subjects.GetRequest{ID: "m"}) // taken after them
	if n := strings.Count(logs.String(), "request refused and not answered"); n != 1 {
		t.Fatalf("%d log lines for 5 refused requests, want 1:\n%s", n, logs)
	}
	if !strings.Contains(logs.String(), "refused=1") {
		t.Fatalf("the first refusal's line does not count it:\n%s", logs)
	}
}
