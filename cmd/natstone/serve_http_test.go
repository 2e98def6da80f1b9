package main

import (
	"context"
	"encoding/json"
	"fmt"
	"io"
	"log/slog"
	"net"
	"net/http"
	"slices"
	"strings"
	"testing"
	"time"

	"github.com/natstone/natstone/subjects"
	"github.com/natstone/natstone/test/natstest"
)

// httpGet fetches url and returns its status and body.
func httpGet(t *testing.T, url string) (int, string) {
	t.Helper()
	resp, err := http.Get(url) //nolint:noctx // a test against a loopback server
	if err != nil {
		t.Fatalf("GET %s: %v", url, err)
	}
	defer resp.Body.Close()
	body, err := io.ReadAll(resp.Body)
	if err != nil {
		t.Fatalf("GET %s: %v", url, err)
	}
	return resp.StatusCode, string(body)
}

// TestServeHTTP runs serve with --http and checks that the listener serves the dashboard, the JSON
// API, /metrics fed by the broker and /healthz, and that --no-events turns history off.
func TestServeHTTP(t *testing.T) {
	t.Parallel()
	ready, cancel, code := inProcess(t, "--data", t.TempDir(), "--listen", "127.0.0.1:0", "--http", "127.0.0.1:0", "--log-format", "json")
	var line struct {
		Listen string `json:"listen"`
		HTTP   string `json:"http"`
	}
	if err := json.Unmarshal([]byte(ready), &line); err != nil || line.HTTP == "" || strings.HasSuffix(line.HTTP, ":0") {
		t.Fatalf("ready line %s (%v): want the HTTP listener's address", ready, err)
	}
	roundTrip(t, "nats://"+line.Listen)
	base := "http://" + line.HTTP

	if status, body := httpGet(t, base+"/"); status != http.StatusOK || !strings.Contains(body, "<html") {
		t.Errorf("GET /: %d, want the dashboard page", status)
	}
	status, body := httpGet(t, base+"/api/queues")
	if status != http.StatusOK || !strings.Contains(body, `"jobs"`) {
		t.Errorf("GET /api/queues: %d %s, want queue jobs", status, body)
	}
	status, body = httpGet(t, base+"/metrics")
	for _, want := range []string{
		`natstone_requests_total{code="ok",op="dequeue"} 1`,
		`natstone_queue_messages{queue="jobs",state="running"} 1`,
		`natstone_transitions_total{kind="leased",queue="jobs"} 1`,
	} {
		if status != http.StatusOK || !strings.Contains(body, want) {
			t.Errorf("GET /metrics: %d, no line %q", status, want)
		}
	}
	if status, body := httpGet(t, base+"/healthz"); status != http.StatusOK || !strings.Contains(body, `"status":"ok"`) {
		t.Errorf("GET /healthz: %d %s, want ok", status, body)
	}
	if status, body := httpGet(t, base+"/readyz"); status != http.StatusOK || !strings.Contains(body, `"serving"`) {
		t.Errorf("GET /readyz: %d %s, want 200 serving", status, body)
	}
	var h subjects.HistoryReply
	request(t, dial(t, "nats://"+line.Listen), "natstone.v1.history.jobs", `{"id":"`+firstID(t, base)+`"}`, &h)
	if len(h.Events) != 2 {
		t.Errorf("history: %d events, want enqueued and leased", len(h.Events))
	}
	cancel()
	if c := exitCode(t, code); c != exitOK {
		t.Fatalf("exit code after cancel = %d, want 0", c)
	}
}

// firstID returns the id of the running message of queue jobs, read through the JSON API.
func firstID(t *testing.T, base string) string {
	t.Helper()
	status, body := httpGet(t, base+"/api/queues/jobs/messages?state=running")
	var r struct {
		Messages []struct {
			ID string `json:"id"`
		} `json:"messages"`
	}
	if err := json.Unmarshal([]byte(body), &r); status != http.StatusOK || err != nil || len(r.Messages) != 1 {
		t.Fatalf("GET running messages: %d %s (%v), want one", status, body, err)
	}
	return r.Messages[0].ID
}

// TestServeNoEvents: with --no-events there is no events stream and history is unavailable.
func TestServeNoEvents(t *testing.T) {
	t.Parallel()
	ready, cancel, code := inProcess(t, "--data", t.TempDir(), "--listen", "127.0.0.1:0", "--no-events", "--log-format", "json")
	var line struct {
		Listen string `json:"listen"`
	}
	if err := json.Unmarshal([]byte(ready), &line); err != nil {
		t.Fatal(err)
	}
	roundTrip(t, "nats://"+line.Listen)
	msg, err := dial(t, "nats://"+line.Listen).Request("natstone.v1.history.jobs", []byte(`{"id":"x"}`), deadline)
	if err != nil {
		t.Fatal(err)
	}
	var e subjects.ErrorReply
	if err := json.Unmarshal(msg.Data, &e); err != nil || e.Error == nil || e.Error.Code != subjects.CodeUnavailable {
		t.Errorf("history with --no-events: %s, want unavailable", msg.Data)
	}
	cancel()
	if c := exitCode(t, code); c != exitOK {
		t.Fatalf("exit code after cancel = %d, want 0", c)
	}
}

// TestServeStandbyHTTP: a standby's HTTP listener answers while it stands by: /healthz is ok,
// /metrics says it does not serve, and the dashboard's API answers through the broker that does.
// Once it has taken over, /metrics says it serves.
func TestServeStandbyHTTP(t *testing.T) {
	t.Parallel()
	s := natstest.Start(t, nil)
	p1 := startServe(t, "--nats-url", s.URL())
	roundTrip(t, s.URL())
	port := freePort(t)
	base := fmt.Sprintf("http://127.0.0.1:%d", port)
	p2 := startProc(t, "serve", "--nats-url", s.URL(), "--http", fmt.Sprintf("127.0.0.1:%d", port))
	p2.log.waitLine(t, "standing by")
	if status, body := httpGet(t, base+"/healthz"); status != http.StatusOK {
		t.Errorf("GET /healthz of the standby: %d %s, want ok", status, body)
	}
	if status, body := httpGet(t, base+"/readyz"); status != http.StatusServiceUnavailable || !strings.Contains(body, "not_serving") {
		t.Errorf("GET /readyz of the standby: %d %s, want 503 not_serving", status, body)
	}
	if status, body := httpGet(t, base+"/metrics"); status != http.StatusOK || !strings.Contains(body, "natstone_broker_serving 0") {
		t.Errorf("GET /metrics of the standby: %d, want natstone_broker_serving 0", status)
	}
	if status, body := httpGet(t, base+"/api/queues"); status != http.StatusOK || !strings.Contains(body, `"jobs"`) {
		t.Errorf("GET /api/queues of the standby: %d %s, want queue jobs", status, body)
	}
	p1.stop(t)
	p2.log.readyLine(t)
	if status, body := httpGet(t, base+"/metrics"); status != http.StatusOK || !strings.Contains(body, "natstone_broker_serving 1") {
		t.Errorf("GET /metrics after the take-over: %d, want natstone_broker_serving 1", status)
	}
	if status, body := httpGet(t, base+"/readyz"); status != http.StatusOK || !strings.Contains(body, `"serving"`) {
		t.Errorf("GET /readyz after the take-over: %d %s, want 200 serving", status, body)
	}
	p2.stop(t)
}

// TestLoopbackHosts: a dashboard on a loopback address answers to the loopback names only; one the
// operator exposed on another address answers to any.
func TestLoopbackHosts(t *testing.T) {
	for addr, want := range map[string][]string{
		"127.0.0.1:8080": {"localhost", "127.0.0.1", "::1", "127.0.0.1"},
		"[::1]:0":        {"localhost", "127.0.0.1", "::1", "::1"},
		"localhost:80":   {"localhost", "127.0.0.1", "::1", "localhost"},
		"0.0.0.0:8080":   nil,
		":8080":          nil,
		"10.1.2.3:8080":  nil,
		"dash.corp:8080": nil,
	} {
		if got := loopbackHosts(addr); !slices.Equal(got, want) {
			t.Errorf("loopbackHosts(%q) = %q, want %q", addr, got, want)
		}
	}
}

// TestDashboardHosts: a dashboard answers to the loopback names on a loopback address, else to
// localhost, its --http name and any IP address (web.Config.AnyIP); and to the names given with
// --http-host.
func TestDashboardHosts(t *testing.T) {
	for _, tc := range []struct {
		addr  string
		names []string
		want  []string
		anyIP bool
	}{
		{"127.0.0.1:8080", nil, []string{"localhost", "127.0.0.1", "::1", "127.0.0.1"}, false},
		{"127.0.0.1:8080", []string{"dash"}, []string{"localhost", "127.0.0.1", "::1", "127.0.0.1", "dash"}, false},
		{"0.0.0.0:8080", nil, []string{"localhost"}, true},
		{":8080", []string{"dash.corp", "natstone"}, []string{"localhost", "dash.corp", "natstone"}, true},
		{"10.1.2.3:8080", []string{"dash.corp"}, []string{"localhost", "dash.corp"}, true},
		{"dash.corp:8080", nil, []string{"localhost", "dash.corp"}, true},
	} {
		if got, anyIP := dashboardHosts(tc.addr, tc.names); !slices.Equal(got, tc.want) || anyIP != tc.anyIP {
			t.Errorf("dashboardHosts(%q, %q) = %q, %v; want %q, %v", tc.addr, tc.names, got, anyIP, tc.want, tc.anyIP)
		}
	}
}

// sendHTTP serves h on a loopback listener with the timeouts to, and returns a connection to it
// that has sent req. The server and the connection are closed at t's cleanup.
func sendHTTP(t *testing.T, h http.Handler, to httpTimeouts, req string) net.Conn {
	t.Helper()
	ln, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	hs := newHTTPServer(h, context.Background(), slog.New(slog.NewTextHandler(io.Discard, nil)), to)
	go func() { _ = hs.Serve(ln) }()
	t.Cleanup(func() { hs.Close() })
	conn, err := net.Dial("tcp", ln.Addr().String())
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { conn.Close() })
	if _, err := io.WriteString(conn, req); err != nil {
		t.Fatal(err)
	}
	return conn
}

// TestHTTPServerDropsClientsThatDoNotRead: a reply to a client that never reads it ends at the
// write timeout: its handler's writes fail, and it returns, rather than wait on the connection for
// as long as the client keeps it open.
func TestHTTPServerDropsClientsThatDoNotRead(t *testing.T) {
	t.Parallel()
	returned := make(chan error, 1)
	h := http.HandlerFunc(func(w http.ResponseWriter, _ *http.Request) {
		chunk := make([]byte, 1<<20)
		for range 1 << 12 { // 4 GiB: more than any socket buffers
			if _, err := w.Write(chunk); err != nil {
				returned <- err
				return
			}
		}
		returned <- nil
	})
	const long = time.Hour
	sendHTTP(t, h, httpTimeouts{readHeader: long, read: long, idle: long, write: 300 * time.Millisecond}, "GET / HTTP/1.1\r\nHost: x\r\n\r\n")
	select {
	case err := <-returned:
		if err == nil {
			t.Fatal("the handler wrote 4 GiB to a client that read none of it")
		}
	case <-time.After(20 * time.Second):
		t.Fatal("the handler still writes to a client that does not read, 20 s on")
	}
}

// TestHTTPServerDropsIdleAndSlowClients: the HTTP listener closes a kept-alive connection left
// idle, one whose headers do not end and one whose request body does not come, so no client holds a
// connection open forever. Each case gets a server where only the timeout it is about is short (the
// others an hour), so each of the three is shown to be set: net/http falls back from an unset idle
// timeout to the read timeout, which would not close the connection within the test's deadline.
func TestHTTPServerDropsIdleAndSlowClients(t *testing.T) {
	t.Parallel()
	h := http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		_, _ = io.Copy(io.Discard, r.Body)
		_, _ = io.WriteString(w, "ok")
	})
	const short, long = 200 * time.Millisecond, time.Hour
	for _, tc := range []struct {
		name string
		to   httpTimeouts
		req  string
	}{
		// One whole request, answered; then the connection idles.
		{"idle", httpTimeouts{readHeader: long, read: long, idle: short, write: long}, "GET / HTTP/1.1\r\nHost: x\r\n\r\n"},
		// Headers begun and never ended.
		{"slow headers", httpTimeouts{readHeader: short, read: long, idle: long, write: long}, "GET / HTTP/1.1\r\nHost: x\r\n"},
		// A body announced and never sent.
		{"slow body", httpTimeouts{readHeader: long, read: short, idle: long, write: long}, "POST / HTTP/1.1\r\nHost: x\r\nContent-Length: 10\r\n\r\n{"},
	} {
		t.Run(tc.name, func(t *testing.T) {
			t.Parallel()
			conn := sendHTTP(t, h, tc.to, tc.req)
			// The server closes the connection (after the reply, if any) long before this deadline.
			if err := conn.SetReadDeadline(time.Now().Add(20 * time.Second)); err != nil {
				t.Fatal(err)
			}
			if _, err := io.ReadAll(conn); err != nil {
				t.Errorf("the connection was not closed by the server: %v", err)
			}
		})
	}
}
