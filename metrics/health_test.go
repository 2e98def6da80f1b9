package metrics_test

import (
	"encoding/json"
	"net/http"
	"net/http/httptest"
	"strings"
	"sync/atomic"
	"testing"
	"time"

	"github.com/nats-io/nats.go"

	"github.com/natstone/natstone/broker"
	"github.com/natstone/natstone/metrics"
	"github.com/natstone/natstone/test/natstest"
)

// healthz serves one GET of h and decodes the report.
func healthz(t *testing.T, h http.Handler) (int, metrics.HealthReport) {
	t.Helper()
	return decodeHealth(t, get(h))
}

// get serves one GET of h.
func get(h http.Handler) *httptest.ResponseRecorder {
	rec := httptest.NewRecorder()
	h.ServeHTTP(rec, httptest.NewRequest(http.MethodGet, "/healthz", http.NoBody))
	return rec
}

// decodeHealth decodes the response of a health handler.
func decodeHealth(t *testing.T, rec *httptest.ResponseRecorder) (int, metrics.HealthReport) {
	t.Helper()
	if ct := rec.Header().Get("Content-Type"); ct != "application/json" {
		t.Errorf("Content-Type %q, want application/json", ct)
	}
	var rep metrics.HealthReport
	if err := json.Unmarshal(rec.Body.Bytes(), &rep); err != nil {
		t.Fatalf("decode %q: %v", rec.Body, err)
	}
	return rec.Code, rep
}

// checkNames returns the names of the checks of rep, and of those that failed.
func checkNames(rep metrics.HealthReport) (all, failed []string) {
	for _, c := range rep.Checks {
		all = append(all, c.Name)
		if !c.OK {
			failed = append(failed, c.Name)
		}
	}
	return all, failed
}

// storeChecks are the names of the checks of a store with prefix natstone and events.
var storeChecks = []string{
	"bucket:natstone-queues", "bucket:natstone-messages", "bucket:natstone-locks", "bucket:natstone-schedules",
	"bucket:natstone-claims", "stream:natstone-bodies", "stream:natstone-events",
}

func TestHealthOK(t *testing.T) {
	t.Parallel()
	srv := natstest.Start(t, nil)
	startBroker(t, srv, &broker.Config{})
	code, rep := healthz(t, metrics.Health(metrics.HealthConfig{Conn: srv.Connect(t), Events: true}))
	all, failed := checkNames(rep)
	if code != http.StatusOK || rep.Status != metrics.StatusOK || len(failed) != 0 {
		t.Fatalf("status %d %q, failed checks %v; want 200 ok: %+v", code, rep.Status, failed, rep)
	}
	if want := append([]string{"nats", "jetstream"}, storeChecks...); strings.Join(all, " ") != strings.Join(want, " ") {
		t.Errorf("checks %v, want %v", all, want)
	}
}

func TestHealthOtherPrefixWithoutEvents(t *testing.T) {
	t.Parallel()
	srv := natstest.Start(t, nil)
	startBroker(t, srv, &broker.Config{StorePrefix: "other", DisableEvents: true})
	code, rep := healthz(t, metrics.Health(metrics.HealthConfig{Conn: srv.Connect(t), StorePrefix: "other"}))
	all, failed := checkNames(rep)
	if code != http.StatusOK || len(failed) != 0 {
		t.Fatalf("status %d, failed checks %v; want 200: %+v", code, failed, rep)
	}
	want := "nats jetstream bucket:other-queues bucket:other-messages bucket:other-locks bucket:other-schedules bucket:other-claims stream:other-bodies"
	if got := strings.Join(all, " "); got != want {
		t.Errorf("checks %q, want %q", got, want)
	}
}

// TestHealthNoStore: a fresh server where no broker ever ran has none of natstone's buckets.
func TestHealthNoStore(t *testing.T) {
	t.Parallel()
	srv := natstest.Start(t, nil)
	code, rep := healthz(t, metrics.Health(metrics.HealthConfig{Conn: srv.Connect(t), Events: true}))
	_, failed := checkNames(rep)
	if code != http.StatusServiceUnavailable || rep.Status != metrics.StatusUnavailable {
		t.Fatalf("status %d %q, want 503 unavailable: %+v", code, rep.Status, rep)
	}
	if strings.Join(failed, " ") != strings.Join(storeChecks, " ") {
		t.Errorf("failed checks %v, want %v", failed, storeChecks)
	}
	for _, c := range rep.Checks[2:] {
		if c.Detail != "not found" {
			t.Errorf("check %s: detail %q, want \"not found\"", c.Name, c.Detail)
		}
	}
}

// TestHealthJetStreamDisabled: the server answers, but not for JetStream.
func TestHealthJetStreamDisabled(t *testing.T) {
	t.Parallel()
	code, rep := healthz(t, metrics.Health(metrics.HealthConfig{Conn: connectWithoutJetStream(t)}))
	_, failed := checkNames(rep)
	if code != http.StatusServiceUnavailable || len(failed) != 1+6 /* jetstream, 5 buckets and the bodies stream */ || rep.Checks[0].Name != "nats" || !rep.Checks[0].OK {
		t.Fatalf("status %d, failed checks %v; want 503 with every check but nats failed: %+v", code, failed, rep)
	}
	if got := rep.Checks[2].Detail; !strings.HasPrefix(got, "skipped:") {
		t.Errorf("bucket check detail %q, want skipped", got)
	}
}

// TestHealthJetStreamSilent: requests to the JetStream API are answered by nobody (a subscriber
// that never replies); the check gives up at its timeout instead of waiting for NATS's.
func TestHealthJetStreamSilent(t *testing.T) {
	t.Parallel()
	ctx := testContext(t)
	nc := connectWithoutJetStream(t)
	sub, err := nc.SubscribeSync("$JS.API.>")
	if err != nil {
		t.Fatalf("subscribe: %v", err)
	}
	if err := nc.Flush(); err != nil {
		t.Fatalf("flush: %v", err)
	}

	const timeout = 200 * time.Millisecond
	h := metrics.Health(metrics.HealthConfig{Conn: nc, Timeout: timeout})
	done := make(chan *httptest.ResponseRecorder, 1)
	go func() { done <- get(h) }()
	// The check asked JetStream...
	if _, err := sub.NextMsgWithContext(ctx); err != nil {
		t.Fatalf("no JetStream API request: %v", err)
	}
	// ...and answers within its timeout, with a margin for a loaded machine, not NATS's 5s.
	var rec *httptest.ResponseRecorder
	select {
	case rec = <-done:
	case <-time.After(timeout + 2*time.Second):
		t.Fatalf("health check still running %v after its request", timeout+2*time.Second)
	}
	code, rep := decodeHealth(t, rec)
	if code != http.StatusServiceUnavailable || rep.Checks[1].OK {
		t.Fatalf("status %d, jetstream check %+v; want 503 and jetstream failed", code, rep.Checks[1])
	}
	if got := rep.Checks[1].Detail; !strings.Contains(got, "deadline") {
		t.Errorf("jetstream check detail %q, want a deadline error", got)
	}
}

// TestHealthDisconnected: the server is gone, the connection is reconnecting.
func TestHealthDisconnected(t *testing.T) {
	t.Parallel()
	ctx := testContext(t)
	srv := natstest.Start(t, nil)
	startBroker(t, srv, &broker.Config{DisableEvents: true})
	disconnected := make(chan struct{})
	nc := srv.Connect(t, nats.DisconnectErrHandler(func(*nats.Conn, error) { close(disconnected) }))
	h := metrics.Health(metrics.HealthConfig{Conn: nc})
	if code, rep := healthz(t, h); code != http.StatusOK {
		t.Fatalf("before shutdown: status %d, want 200: %+v", code, rep)
	}

	srv.Shutdown()
	select {
	case <-disconnected:
	case <-ctx.Done():
		t.Fatal("connection not disconnected")
	}
	code, rep := healthz(t, h)
	_, failed := checkNames(rep)
	if code != http.StatusServiceUnavailable || len(failed) != 2+6 /* nats, jetstream, 5 buckets and the bodies stream */ || rep.Checks[0].OK {
		t.Fatalf("status %d, failed checks %v; want 503 with every check failed: %+v", code, failed, rep)
	}
	if got := rep.Checks[0].Detail; !strings.Contains(got, "RECONNECTING") {
		t.Errorf("nats check detail %q, want RECONNECTING", got)
	}
}

func TestHealthNoConn(t *testing.T) {
	t.Parallel()
	code, rep := healthz(t, metrics.Health(metrics.HealthConfig{}))
	if code != http.StatusServiceUnavailable || rep.Checks[0].OK || rep.Checks[0].Detail != "no connection configured" {
		t.Fatalf("status %d, nats check %+v; want 503, no connection configured", code, rep.Checks[0])
	}
}

func TestHealthMethods(t *testing.T) {
	t.Parallel()
	h := metrics.Health(metrics.HealthConfig{})
	rec := httptest.NewRecorder()
	h.ServeHTTP(rec, httptest.NewRequest(http.MethodPost, "/healthz", http.NoBody))
	if rec.Code != http.StatusMethodNotAllowed || rec.Header().Get("Allow") != "GET, HEAD" {
		t.Errorf("POST: status %d, Allow %q; want 405 and GET, HEAD", rec.Code, rec.Header().Get("Allow"))
	}
}

// TestReady: /readyz answers what serving says, at each request, and takes GET and HEAD only.
func TestReady(t *testing.T) {
	t.Parallel()
	var serving atomic.Bool
	h := metrics.Ready(serving.Load)
	get := func() (int, string) {
		rec := httptest.NewRecorder()
		h.ServeHTTP(rec, httptest.NewRequest(http.MethodGet, "/readyz", http.NoBody))
		return rec.Code, rec.Body.String()
	}
	if code, body := get(); code != http.StatusServiceUnavailable || body != "{\"status\":\"not_serving\"}\n" {
		t.Errorf("not serving: %d %q, want 503 not_serving", code, body)
	}
	serving.Store(true)
	if code, body := get(); code != http.StatusOK || body != "{\"status\":\"serving\"}\n" {
		t.Errorf("serving: %d %q, want 200 serving", code, body)
	}
	rec := httptest.NewRecorder()
	h.ServeHTTP(rec, httptest.NewRequest(http.MethodPost, "/readyz", http.NoBody))
	if rec.Code != http.StatusMethodNotAllowed || rec.Header().Get("Allow") != "GET, HEAD" {
		t.Errorf("POST: status %d, Allow %q; want 405 and GET, HEAD", rec.Code, rec.Header().Get("Allow"))
	}
}
