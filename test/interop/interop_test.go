package interop

import (
	"bufio"
	"bytes"
	"context"
	"encoding/base64"
	"encoding/json"
	"errors"
	"fmt"
	"maps"
	"os"
	"os/exec"
	"path/filepath"
	"regexp"
	"slices"
	"strconv"
	"strings"
	"testing"
	"time"

	"github.com/nats-io/nats.go"
	"go.uber.org/goleak"

	"github.com/natstone/natstone/test/brokertest"
	"github.com/natstone/natstone/test/natstest"
)

func TestMain(m *testing.M) { goleak.VerifyTestMain(m) }

const (
	jsDir         = "js"
	protocolDoc   = "../../docs/protocol.md"
	npmCITimeout  = 5 * time.Minute
	clientTimeout = 90 * time.Second
	reqTimeout    = 5 * time.Second
)

// summary is the JSON line client.mjs prints on stdout.
type summary struct {
	OK         bool     `json:"ok"`
	Queue      string   `json:"queue"`
	Steps      []string `json:"steps"`
	FailedStep string   `json:"failed_step"`
	Error      string   `json:"error"`
	Errors     []struct {
		Code   string `json:"code"`
		Status int    `json:"status"`
		Op     string `json:"op"`
	} `json:"errors"`
}

// TestJSClient runs the Node.js client of js/client.mjs, written from docs/protocol.md alone, against
// a broker, and then checks from Go that what it did is what the protocol says it did.
func TestJSClient(t *testing.T) {
	requireNode(t)
	ensureNodeModules(t)

	srv := natstest.Start(t, nil)
	startBroker(t, srv)
	nc := srv.Connect(t)

	queue := fmt.Sprintf("interop-js-%d", time.Now().UnixNano())
	sum := runClient(t, srv.URL(), queue)
	for _, s := range sum.Steps {
		t.Logf("js: %s", s)
	}

	t.Run("effects", func(t *testing.T) {
		// m-a was dequeued first (lowest priority) and completed with its lease.
		a := get(t, nc, queue, "m-a")
		if a.State != "completed" || a.EndedAt == "" || a.Priority != 100 {
			t.Errorf("m-a: state %q, ended_at %q, priority %d; want completed, set, 100", a.State, a.EndedAt, a.Priority)
		}
		if a.Payload == nil || *a.Payload != "hello from node ✓" || a.PayloadBase64 != nil {
			t.Errorf("m-a: payload %v, payload_base64 %v; want the UTF-8 text as payload", deref(a.Payload), deref(a.PayloadBase64))
		}

		// m-raw came in through enqueue_raw with headers, and is still leased by the JS client (the
		// lease_mismatch attempt with m-a's lease changed nothing).
		raw := get(t, nc, queue, "m-raw")
		if raw.State != "running" || raw.Priority != 250 || raw.Metadata["project"] != "gamma" || raw.Attempts != 1 {
			t.Errorf("m-raw: state %q, priority %d, metadata %v, attempts %d; want running, 250, project=gamma, 1",
				raw.State, raw.Priority, raw.Metadata, raw.Attempts)
		}
		if raw.Payload != nil {
			t.Errorf("m-raw: payload %q present; bytes that are not UTF-8 must come as payload_base64", *raw.Payload)
		}
		if raw.PayloadBase64 == nil {
			t.Fatal("m-raw: no payload_base64")
		}
		b, err := base64.StdEncoding.DecodeString(*raw.PayloadBase64)
		if err != nil || !bytes.Equal(b, []byte{0, 1, 2, 255}) {
			t.Errorf("m-raw: payload_base64 %q decodes to %v (%v); want [0 1 2 255]", *raw.PayloadBase64, b, err)
		}

		// m-c was sent as payload_base64; its bytes are UTF-8, so the reply carries payload.
		c := get(t, nc, queue, "m-c")
		if c.State != "pending" || c.Payload == nil || *c.Payload != "from base64" || c.PayloadBase64 != nil {
			t.Errorf("m-c: state %q, payload %v, payload_base64 %v; want pending, \"from base64\", none",
				c.State, deref(c.Payload), deref(c.PayloadBase64))
		}
		if bm := get(t, nc, queue, "m-b"); bm.State != "pending" || bm.Attempts != 0 {
			t.Errorf("m-b: state %q, attempts %d; want pending, 0 (skipped while project alpha was leased)", bm.State, bm.Attempts)
		} else if bm.Payload == nil || *bm.Payload != "" || bm.PayloadBase64 != nil {
			// No payload is the empty payload, which is valid UTF-8: the reply carries "payload":"".
			t.Errorf("m-b: payload %v, payload_base64 %v; want \"\" and none", deref(bm.Payload), deref(bm.PayloadBase64))
		}

		// With m-a completed, project alpha is free again: m-b (200) comes before m-c (300).
		var dq struct {
			Messages []wireMessage `json:"messages"`
		}
		request(t, nc, "natstone.v1.dequeue."+queue, []byte(`{"batch":2}`), &dq)
		var ids []string
		for _, m := range dq.Messages {
			ids = append(ids, m.ID)
		}
		if !slices.Equal(ids, []string{"m-b", "m-c"}) {
			t.Errorf("dequeue after the JS client: %v, want [m-b m-c]", ids)
		}

		var depth struct {
			Queue  string         `json:"queue"`
			Counts map[string]int `json:"counts"`
		}
		request(t, nc, "natstone.v1.depth."+queue, nil, &depth)
		want := map[string]int{"invisible": 0, "pending": 0, "running": 3, "completed": 1, "canceled": 0, "errored": 0}
		if depth.Queue != queue || !maps.Equal(depth.Counts, want) {
			t.Errorf("depth: %+v, want queue %s counts %v", depth, queue, want)
		}

		// The client's second queue was deleted.
		msg, err := nc.Request("natstone.v1.info."+queue+"-aux", nil, reqTimeout)
		if err != nil {
			t.Fatal(err)
		}
		if code := msg.Header.Get("Nats-Service-Error-Code"); code != "404" {
			t.Errorf("info %s-aux: Nats-Service-Error-Code %q, body %s; want 404 (deleted)", queue, code, msg.Data)
		}
	})

	// Every error code the JS client met has the status docs/protocol.md gives it, and the client met
	// every code of the table a client can cause.
	t.Run("error table", func(t *testing.T) {
		table := errorTable(t)
		seen := map[string]bool{}
		for _, e := range sum.Errors {
			seen[e.Code] = true
			status, ok := table[e.Code]
			switch {
			case !ok:
				t.Errorf("%s: the JS client got code %q, which is not in the error table of %s", e.Op, e.Code, protocolDoc)
			case status != e.Status:
				t.Errorf("%s: code %s came with Nats-Service-Error-Code %d, the error table says %d", e.Op, e.Code, e.Status, status)
			}
		}
		for code := range table {
			if code == "unavailable" || code == "internal" {
				continue // a well-behaved client cannot cause them
			}
			if !seen[code] {
				t.Errorf("code %s of the error table was not exercised by js/client.mjs", code)
			}
		}
	})
}

// TestJSClientSendsAPollAgainAtAnAnnouncement: a JS client that follows docs/protocol.md sends its
// long poll again, with its request_id, when a broker announces that it serves after the broker
// the poll was parked at died (here a subscriber of the dequeue subject that answers nothing, then
// closes): the poll sent again gets the message enqueued after the start, and the announcement's
// body is as documented, with the serving broker's service id.
func TestJSClientSendsAPollAgainAtAnAnnouncement(t *testing.T) {
	requireNode(t)
	ensureNodeModules(t)

	srv := natstest.Start(t, nil)
	queue := fmt.Sprintf("interop-serving-%d", time.Now().UnixNano())
	gone := srv.Connect(t)
	parked := make(chan struct{}, 1)
	if _, err := gone.Subscribe("natstone.v1.dequeue."+queue, func(*nats.Msg) { parked <- struct{}{} }); err != nil {
		t.Fatal(err)
	}
	if err := gone.Flush(); err != nil {
		t.Fatal(err)
	}

	ctx, cancel := context.WithTimeout(context.Background(), clientTimeout)
	defer cancel()
	cmd := exec.CommandContext(ctx, "node", "serving.mjs", queue)
	cmd.Dir = jsDir
	cmd.Env = append(os.Environ(), "NATS_URL="+srv.URL())
	cmd.WaitDelay = 5 * time.Second
	var stdout, stderr bytes.Buffer
	cmd.Stdout, cmd.Stderr = &stdout, &stderr
	if err := cmd.Start(); err != nil {
		t.Fatal(err)
	}
	done := make(chan error, 1)
	go func() { done <- cmd.Wait() }()
	select {
	case <-parked:
	case err := <-done:
		t.Fatalf("node serving.mjs exited (%v) before its poll was parked\nstdout:\n%s\nstderr:\n%s", err, &stdout, &stderr)
	}
	gone.Close() // the broker the poll waits at dies
	startBroker(t, srv)
	nc := srv.Connect(t)
	var info struct {
		Name string `json:"name"`
	}
	request(t, nc, "natstone.v1.create."+queue, nil, &info)
	var enq struct {
		ID string `json:"id"`
	}
	request(t, nc, "natstone.v1.enqueue."+queue, []byte(`{"id":"m1"}`), &enq)

	err := <-done
	var out struct {
		OK           bool   `json:"ok"`
		Error        string `json:"error"`
		Announcement struct {
			ID      string `json:"id"`
			Started string `json:"started"`
		} `json:"announcement"`
	}
	if jerr := json.Unmarshal([]byte(lastLine(stdout.String())), &out); jerr != nil || err != nil || !out.OK {
		t.Fatalf("node serving.mjs (%v, %v): %s\nstderr:\n%s", err, jerr, &stdout, &stderr)
	}
	var ping struct {
		ID string `json:"id"`
	}
	request(t, nc, "$SRV.PING.natstone", nil, &ping)
	if out.Announcement.ID != ping.ID {
		t.Fatalf("announced by %q, want the serving broker %q", out.Announcement.ID, ping.ID)
	}
}

// requireNode fails the test (it is never skipped) when node or npm is missing.
func requireNode(t *testing.T) {
	t.Helper()
	for _, tool := range []string{"node", "npm"} {
		if _, err := exec.LookPath(tool); err != nil {
			t.Fatalf("node and npm are required on PATH for the JS interop test (CI has them): %v", err)
		}
	}
	out, err := exec.Command("node", "--version").Output()
	if err != nil {
		t.Fatalf("node --version: %v", err)
	}
	t.Logf("node %s", strings.TrimSpace(string(out)))
}

// ensureNodeModules runs `npm ci` in js when node_modules is missing or does not hold the version of
// @nats-io/transport-node that package-lock.json pins.
func ensureNodeModules(t *testing.T) {
	t.Helper()
	const pkg = "node_modules/@nats-io/transport-node"
	var lock struct {
		Packages map[string]struct {
			Version string `json:"version"`
		} `json:"packages"`
	}
	readJSON(t, filepath.Join(jsDir, "package-lock.json"), &lock)
	want := lock.Packages[pkg].Version
	if want == "" {
		t.Fatalf("%s/package-lock.json does not pin %s", jsDir, pkg)
	}
	var installed struct {
		Version string `json:"version"`
	}
	if data, err := os.ReadFile(filepath.Join(jsDir, pkg, "package.json")); err == nil && json.Unmarshal(data, &installed) == nil && installed.Version == want {
		return
	}

	t.Logf("installing %s@%s with npm ci in %s", pkg, want, jsDir)
	ctx, cancel := context.WithTimeout(context.Background(), npmCITimeout)
	defer cancel()
	cmd := exec.CommandContext(ctx, "npm", "ci", "--no-audit", "--no-fund")
	cmd.Dir = jsDir
	cmd.WaitDelay = 10 * time.Second
	out, err := cmd.CombinedOutput()
	if ctx.Err() != nil {
		t.Fatalf("npm ci in test/interop/js did not finish within %v: is the npm registry reachable? output:\n%s", npmCITimeout, out)
	}
	if err != nil {
		t.Fatalf("npm ci in test/interop/js failed (%v): the JS interop test needs the npm registry once to install %s@%s. output:\n%s", err, pkg, want, out)
	}
	if _, err := os.Stat(filepath.Join(jsDir, pkg, "package.json")); err != nil {
		t.Fatalf("npm ci succeeded but %s is missing: %v", pkg, err)
	}
}

// startBroker runs a broker on srv until the test ends.
func startBroker(t *testing.T, srv *natstest.Server) {
	t.Helper()
	brokertest.Start(t, srv)
}

// runClient runs `node client.mjs queue` with NATS_URL=url and returns its summary, failing the test
// unless it exits 0 and says "ok":true.
func runClient(t *testing.T, url, queue string) summary {
	t.Helper()
	ctx, cancel := context.WithTimeout(context.Background(), clientTimeout)
	defer cancel()
	cmd := exec.CommandContext(ctx, "node", "client.mjs", queue)
	cmd.Dir = jsDir
	cmd.Env = append(os.Environ(), "NATS_URL="+url)
	cmd.WaitDelay = 5 * time.Second
	var stdout, stderr bytes.Buffer
	cmd.Stdout, cmd.Stderr = &stdout, &stderr
	err := cmd.Run()
	if ctx.Err() != nil {
		t.Fatalf("node client.mjs did not finish within %v\nstdout:\n%s\nstderr:\n%s", clientTimeout, &stdout, &stderr)
	}
	var exitErr *exec.ExitError
	if err != nil && !errors.As(err, &exitErr) {
		t.Fatalf("running node client.mjs: %v", err)
	}

	var sum summary
	line := lastLine(stdout.String())
	if jerr := json.Unmarshal([]byte(line), &sum); jerr != nil {
		t.Fatalf("node client.mjs (%v): last stdout line %q is not a JSON summary: %v\nstderr:\n%s", err, line, jerr, &stderr)
	}
	if err != nil || !sum.OK {
		t.Fatalf("node client.mjs failed (%v) at step %q: %s\nsteps done: %q\nstderr:\n%s", err, sum.FailedStep, sum.Error, sum.Steps, &stderr)
	}
	if sum.Queue != queue || len(sum.Steps) == 0 {
		t.Fatalf("node client.mjs summary: queue %q with %d steps, want queue %q and some steps", sum.Queue, len(sum.Steps), queue)
	}
	return sum
}

// wireMessage is a message as the protocol puts it on the wire.
type wireMessage struct {
	ID            string            `json:"id"`
	State         string            `json:"state"`
	Priority      int64             `json:"priority"`
	Metadata      map[string]string `json:"metadata"`
	Payload       *string           `json:"payload"`
	PayloadBase64 *string           `json:"payload_base64"`
	Attempts      int               `json:"attempts"`
	EndedAt       string            `json:"ended_at"`
}

func get(t *testing.T, nc *nats.Conn, queue, id string) wireMessage {
	t.Helper()
	var m wireMessage
	request(t, nc, "natstone.v1.get."+queue, []byte(`{"id":`+strconv.Quote(id)+`}`), &m)
	if m.ID != id {
		t.Fatalf("get %s: reply for id %q", id, m.ID)
	}
	return m
}

// request sends body to subject and decodes the reply into out, failing on an error reply.
func request(t *testing.T, nc *nats.Conn, subject string, body []byte, out any) {
	t.Helper()
	msg, err := nc.Request(subject, body, reqTimeout)
	if err != nil {
		t.Fatalf("%s: %v", subject, err)
	}
	if code := msg.Header.Get("Nats-Service-Error-Code"); code != "" {
		t.Fatalf("%s %s: error %s: %s", subject, body, code, msg.Data)
	}
	if err := json.Unmarshal(msg.Data, out); err != nil {
		t.Fatalf("%s: decoding %s: %v", subject, msg.Data, err)
	}
}

// errorRow matches a row of the error table: | `code` | status | when |.
var errorRow = regexp.MustCompile("^\\| `([a-z_]+)` \\| ([0-9]{3}) \\|")

// errorTable returns code → status from the error table of docs/protocol.md.
func errorTable(t *testing.T) map[string]int {
	t.Helper()
	f, err := os.Open(protocolDoc)
	if err != nil {
		t.Fatal(err)
	}
	defer f.Close()
	table := map[string]int{}
	sc := bufio.NewScanner(f)
	for sc.Scan() {
		if m := errorRow.FindStringSubmatch(sc.Text()); m != nil {
			status, _ := strconv.Atoi(m[2])
			table[m[1]] = status
		}
	}
	if err := sc.Err(); err != nil {
		t.Fatal(err)
	}
	if len(table) < 10 {
		t.Fatalf("%s: found only %d rows of the error table: %v", protocolDoc, len(table), table)
	}
	return table
}

func readJSON(t *testing.T, path string, out any) {
	t.Helper()
	data, err := os.ReadFile(path)
	if err != nil {
		t.Fatal(err)
	}
	if err := json.Unmarshal(data, out); err != nil {
		t.Fatalf("%s: %v", path, err)
	}
}

func lastLine(s string) string {
	lines := strings.Split(strings.TrimSpace(s), "\n")
	return strings.TrimSpace(lines[len(lines)-1])
}

func deref(p *string) any {
	if p == nil {
		return nil
	}
	return *p
}
