package web_test

import (
	"bytes"
	"context"
	"encoding/json"
	"io"
	"log/slog"
	"net/http"
	"net/http/httptest"
	"strings"
	"sync/atomic"
	"testing"
	"time"

	"github.com/nats-io/nats.go"

	"github.com/natstone/natstone/broker"
	"github.com/natstone/natstone/metrics"
	"github.com/natstone/natstone/subjects"
	"github.com/natstone/natstone/test/brokertest"
	"github.com/natstone/natstone/test/natstest"
	"github.com/natstone/natstone/web"
	"github.com/natstone/natstone/workers"
)

// waitTimeout bounds every wait of a test: long enough for a loaded CI machine, short enough to
// fail a hung test in reasonable time.
const waitTimeout = 20 * time.Second

// env is one test's natstone behind the web server: an in-process JetStream server, a broker, a
// client and the handler on a loopback HTTP server.
type env struct {
	t       *testing.T
	srv     *natstest.Server
	c       *workers.Client
	http    *httptest.Server
	serving atomic.Bool // what the server's /readyz answers
}

// setup starts a server, a broker (in-memory storage; mod adjusts its config), a client and the web
// server.
func setup(t *testing.T, mod ...func(*broker.Config)) *env {
	t.Helper()
	srv := natstest.Start(t, nil)
	brokertest.Start(t, srv, append([]func(*broker.Config){func(c *broker.Config) { c.MemoryStorage = true }}, mod...)...)
	return serve(t, srv, nil)
}

// serve starts the web server on a client of srv.
func serve(t *testing.T, srv *natstest.Server, cfg *workers.Config) *env {
	t.Helper()
	c, err := workers.NewClient(srv.Connect(t), cfg)
	if err != nil {
		t.Fatal(err)
	}
	e := &env{t: t, srv: srv, c: c}
	e.serving.Store(true)
	s, err := web.New(web.Config{Client: c, Logger: discard(), Ready: metrics.Ready(e.serving.Load)})
	if err != nil {
		t.Fatal(err)
	}
	e.http = httptest.NewServer(s.Handler())
	t.Cleanup(e.http.Close)
	return e
}

func discard() *slog.Logger { return slog.New(slog.NewTextHandler(io.Discard, nil)) }

// ctx returns a context bounded by waitTimeout.
func ctx(t *testing.T) context.Context {
	c, cancel := context.WithTimeout(t.Context(), waitTimeout)
	t.Cleanup(cancel)
	return c
}

// do sends a request to the web server and returns the status, headers and body of its reply.
func (e *env) do(method, path, contentType, body string) (int, http.Header, []byte) {
	e.t.Helper()
	req, err := http.NewRequestWithContext(ctx(e.t), method, e.http.URL+path, strings.NewReader(body))
	if err != nil {
		e.t.Fatal(err)
	}
	if contentType != "" {
		req.Header.Set("Content-Type", contentType)
	}
	res, err := e.http.Client().Do(req)
	if err != nil {
		e.t.Fatalf("%s %s: %v", method, path, err)
	}
	defer res.Body.Close()
	data, err := io.ReadAll(res.Body)
	if err != nil {
		e.t.Fatalf("%s %s: read body: %v", method, path, err)
	}
	return res.StatusCode, res.Header, data
}

// get fetches path, requires a 200 JSON reply and decodes it into out.
func (e *env) get(path string, out any) {
	e.t.Helper()
	status, h, body := e.do(http.MethodGet, path, "", "")
	if status != http.StatusOK {
		e.t.Fatalf("GET %s: status %d, want 200: %s", path, status, body)
	}
	decode(e.t, h, body, out)
}

// post posts a JSON body to path, requires a 200 JSON reply and decodes it into out.
func (e *env) post(path, body string, out any) {
	e.t.Helper()
	status, h, data := e.do(http.MethodPost, path, "application/json", body)
	if status != http.StatusOK {
		e.t.Fatalf("POST %s %s: status %d, want 200: %s", path, body, status, data)
	}
	decode(e.t, h, data, out)
}

// wantError checks that a reply is an error with status and code.
func wantError(t *testing.T, what string, status int, h http.Header, body []byte, wantStatus int, wantCode subjects.Code) {
	t.Helper()
	var r struct {
		Error *subjects.Error `json:"error"`
	}
	if status != wantStatus {
		t.Errorf("%s: status %d, want %d: %s", what, status, wantStatus, body)
		return
	}
	decode(t, h, body, &r)
	if r.Error == nil || r.Error.Code != wantCode || r.Error.Message == "" {
		t.Errorf("%s: body %s, want an error with code %s and a message", what, body, wantCode)
	}
}

// decode checks that a reply is JSON and decodes it strictly into out.
func decode(t *testing.T, h http.Header, body []byte, out any) {
	t.Helper()
	if ct := h.Get("Content-Type"); ct != "application/json" {
		t.Fatalf("Content-Type %q, want application/json: %s", ct, body)
	}
	dec := json.NewDecoder(bytes.NewReader(body))
	dec.DisallowUnknownFields()
	if err := dec.Decode(out); err != nil {
		t.Fatalf("decode %s: %v", body, err)
	}
}

// createQueue creates a queue with opts or fails the test.
func (e *env) createQueue(name string, opts *workers.QueueOpts) subjects.QueueInfo {
	e.t.Helper()
	info, err := e.c.CreateQueue(ctx(e.t), name, opts)
	if err != nil {
		e.t.Fatalf("create %s: %v", name, err)
	}
	return info
}

// enqueue enqueues one message or fails the test.
func (e *env) enqueue(queue, id string, priority int64, payload string, md map[string]string) {
	e.t.Helper()
	if _, err := e.c.Enqueue(ctx(e.t), queue, []byte(payload), &workers.EnqueueOpts{ID: id, Priority: &priority, Metadata: md}); err != nil {
		e.t.Fatalf("enqueue %s/%s: %v", queue, id, err)
	}
}

// dequeue leases up to n messages as worker, failing the test if none is leased.
func (e *env) dequeue(queue string, n int, worker string) []workers.Message {
	e.t.Helper()
	msgs, err := e.c.Dequeue(ctx(e.t), queue, &workers.DequeueOpts{Batch: n, Worker: worker})
	if err != nil || len(msgs) == 0 {
		e.t.Fatalf("dequeue %s: %d messages, %v", queue, len(msgs), err)
	}
	return msgs
}

// stats returns a queue's stats or fails the test.
func (e *env) stats(queue string, filter map[string]string) subjects.StatsReply {
	e.t.Helper()
	st, err := e.c.Stats(ctx(e.t), queue, &workers.StatsOpts{Filter: filter})
	if err != nil {
		e.t.Fatalf("stats %s: %v", queue, err)
	}
	return st
}

// browse returns the ids of a queue's messages in state, in order, or fails the test.
func (e *env) browse(queue string, state subjects.State, filter map[string]string) []string {
	e.t.Helper()
	msgs, _, err := e.c.Browse(ctx(e.t), queue, state, &workers.BrowseOpts{Filter: filter, Limit: subjects.MaxBrowseLimit})
	if err != nil {
		e.t.Fatalf("browse %s %s: %v", queue, state, err)
	}
	ids := make([]string, len(msgs))
	for i, m := range msgs {
		ids[i] = m.ID
	}
	return ids
}

// history returns a message's history or fails the test.
func (e *env) history(queue, id string) subjects.HistoryReply {
	e.t.Helper()
	h, err := e.c.History(ctx(e.t), queue, id, 0)
	if err != nil {
		e.t.Fatalf("history %s/%s: %v", queue, id, err)
	}
	return h
}

// requests counts the requests of some operations on one queue that reach NATS, to prove that bad
// input is refused before anything is sent to the broker.
type requests struct {
	t    *testing.T
	nc   *nats.Conn
	subs []*nats.Subscription
}

// watch starts counting the requests of ops on queue.
func (e *env) watch(queue string, ops ...subjects.Op) *requests {
	e.t.Helper()
	space, err := subjects.NewSpace("")
	if err != nil {
		e.t.Fatal(err)
	}
	r := &requests{t: e.t, nc: e.srv.Connect(e.t)}
	for _, op := range ops {
		sub, err := r.nc.SubscribeSync(space.Subject(op, queue))
		if err != nil {
			e.t.Fatal(err)
		}
		r.subs = append(r.subs, sub)
	}
	if err := r.nc.Flush(); err != nil {
		e.t.Fatal(err)
	}
	return r
}

// count returns how many requests were seen so far. Every request whose reply has come back was
// routed to the watcher before the round trip of the flush, so it is counted.
func (r *requests) count() int {
	r.t.Helper()
	if err := r.nc.Flush(); err != nil {
		r.t.Fatal(err)
	}
	n := 0
	for _, s := range r.subs {
		k, _, err := s.Pending()
		if err != nil {
			r.t.Fatal(err)
		}
		n += k
	}
	return n
}

// waitFor polls cond until it holds, failing the test after waitTimeout.
func waitFor(t *testing.T, what string, cond func() bool) {
	t.Helper()
	deadline := time.Now().Add(waitTimeout)
	tick := time.NewTicker(5 * time.Millisecond)
	defer tick.Stop()
	for !cond() {
		if time.Now().After(deadline) {
			t.Fatalf("timed out waiting for %s", what)
		}
		<-tick.C
	}
}

// ptr returns a pointer to v.
func ptr[T any](v T) *T { return &v }
