package main

import (
	"bytes"
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"net"
	"path/filepath"
	"runtime"
	"strings"
	"testing"
	"time"

	"github.com/nats-io/nats.go"
	"github.com/nats-io/nats.go/jetstream"

	"github.com/natstone/natstone/broker"
	"github.com/natstone/natstone/kv"
	"github.com/natstone/natstone/subjects"
	"github.com/natstone/natstone/test/natstest"
)

// dial returns a client connection to url, closed at t.Cleanup.
func dial(t *testing.T, url string) *nats.Conn {
	t.Helper()
	nc, err := nats.Connect(url, nats.Name("natstone-test"))
	if err != nil {
		t.Fatalf("connecting to %s: %v", url, err)
	}
	t.Cleanup(nc.Close)
	return nc
}

// request sends body to subject and decodes a successful reply into reply.
func request(t *testing.T, nc *nats.Conn, subject, body string, reply any) {
	t.Helper()
	msg, err := nc.Request(subject, []byte(body), deadline)
	if err != nil {
		t.Fatalf("request %s: %v", subject, err)
	}
	var e subjects.ErrorReply
	if err := json.Unmarshal(msg.Data, &e); err == nil && e.Error != nil {
		t.Fatalf("request %s: error reply %s", subject, msg.Data)
	}
	if err := json.Unmarshal(msg.Data, reply); err != nil {
		t.Fatalf("request %s: decoding reply %s: %v", subject, msg.Data, err)
	}
}

// roundTrip creates queue jobs, enqueues "hi" and dequeues it over url.
func roundTrip(t *testing.T, url string) {
	t.Helper()
	nc := dial(t, url)

	var info subjects.QueueInfo
	request(t, nc, "natstone.v1.create.jobs", `{}`, &info)
	if info.Name != "jobs" {
		t.Fatalf("create: name = %q, want jobs", info.Name)
	}
	var enq subjects.EnqueueReply
	request(t, nc, "natstone.v1.enqueue.jobs", `{"payload":"hi"}`, &enq)
	if enq.State != subjects.StatePending {
		t.Fatalf("enqueue: state = %q, want pending", enq.State)
	}
	var deq subjects.DequeueReply
	request(t, nc, "natstone.v1.dequeue.jobs", `{}`, &deq)
	if len(deq.Messages) != 1 || deq.Messages[0].Payload == nil || *deq.Messages[0].Payload != "hi" {
		t.Fatalf("dequeue: %+v, want one message with payload hi", deq)
	}
}

func TestServeEmbeddedSurvivesRestart(t *testing.T) {
	t.Parallel()
	data := t.TempDir()

	port := freePort(t)
	p := startServe(t, "--data", data, "--listen", fmt.Sprintf("127.0.0.1:%d", port))
	roundTrip(t, fmt.Sprintf("nats://127.0.0.1:%d", port))
	p.stop(t)

	port = freePort(t)
	p = startServe(t, "--data", data, "--listen", fmt.Sprintf("127.0.0.1:%d", port))
	p.log.waitLine(t, "from=snapshot") // what the clean stop wrote
	var info subjects.QueueInfo
	request(t, dial(t, fmt.Sprintf("nats://127.0.0.1:%d", port)), "natstone.v1.info.jobs", `{}`, &info)
	if info.Name != "jobs" || info.Counts.Running != 1 {
		t.Fatalf("info after restart: %+v, want queue jobs with its message running", info)
	}
	p.stop(t)
}

// TestServeNoSnapshot: with --no-snapshot a clean stop writes no snapshot and a start reads none;
// without it, a clean stop writes one, which the next start reads if nothing was written since.
func TestServeNoSnapshot(t *testing.T) {
	t.Parallel()
	data := t.TempDir()
	serve := func(extra ...string) (*proc, string) {
		port := freePort(t)
		p := startServe(t, append([]string{"--data", data, "--listen", fmt.Sprintf("127.0.0.1:%d", port)}, extra...)...)
		return p, fmt.Sprintf("nats://127.0.0.1:%d", port)
	}
	p, url := serve("--no-snapshot")
	roundTrip(t, url)
	p.stop(t)
	for _, start := range []struct {
		flags []string
		from  string
	}{
		{nil, "from=records"},                       // the stop before wrote none
		{[]string{"--no-snapshot"}, "from=records"}, // there is one, from the stop before; it is not read
		{nil, "from=snapshot"},                      // that one still: nothing was written since
	} {
		p, url = serve(start.flags...)
		p.log.waitLine(t, start.from)
		var info subjects.QueueInfo
		request(t, dial(t, url), "natstone.v1.info.jobs", `{}`, &info)
		if info.Counts.Running != 1 {
			t.Fatalf("info after a start with %v: %+v, want the message running", start.flags, info)
		}
		p.stop(t)
	}
}

// TestServeStandby: a second serve on the same NATS server stands by until the first stops, then
// serves what the first stored.
func TestServeStandby(t *testing.T) {
	t.Parallel()
	s := natstest.Start(t, nil)
	p1 := startServe(t, "--nats-url", s.URL())
	roundTrip(t, s.URL())
	p2 := startProc(t, "serve", "--nats-url", s.URL())
	p2.log.waitLine(t, "standing by")
	p1.stop(t)
	p2.log.readyLine(t)
	p2.log.waitLine(t, "from=snapshot") // the one the first wrote as it stopped
	if l := p2.log.find("stopped renewing its claim"); l != "" {
		t.Fatalf("the standby waited out the claim's ttl; the stop should have released it:\n%s", l)
	}
	var info subjects.QueueInfo
	request(t, dial(t, s.URL()), "natstone.v1.info.jobs", `{}`, &info)
	if info.Counts.Running != 1 {
		t.Fatalf("info from the standby: %+v, want the message running", info)
	}
	p2.stop(t)
}

// TestServeStandbyAfterAKill: a standby takes over from a killed serve once the claim has stayed
// unchanged for --claim-ttl.
func TestServeStandbyAfterAKill(t *testing.T) {
	t.Parallel()
	s := natstest.Start(t, nil)
	p1 := startServe(t, "--nats-url", s.URL(), "--claim-ttl", "1s")
	p2 := startProc(t, "serve", "--nats-url", s.URL(), "--claim-ttl", "1s")
	p2.log.waitLine(t, "standing by")
	if err := p1.cmd.Process.Kill(); err != nil {
		t.Fatal(err)
	}
	p2.log.waitLine(t, "stopped renewing its claim: taking over")
	p2.log.readyLine(t)
	roundTrip(t, s.URL())
	p2.stop(t)
}

// TestServeExitsWhenItsClaimIsTaken: serve exits with an error once another broker has taken its
// store's claim, so that a supervisor starts it again, as a standby.
func TestServeExitsWhenItsClaimIsTaken(t *testing.T) {
	t.Parallel()
	s := natstest.Start(t, nil)
	_, cancel, code := inProcess(t, "--nats-url", s.URL(), "--claim-ttl", "1s")
	defer cancel()
	js, err := jetstream.New(dial(t, s.URL()))
	if err != nil {
		t.Fatal(err)
	}
	ctx, stop := context.WithTimeout(context.Background(), deadline)
	defer stop()
	claims, err := kv.OpenClaims(ctx, &kv.Config{JS: js})
	if err != nil {
		t.Fatal(err)
	}
	// Taken at the revision read, which the serving broker's renewal (every ttl/5) may move in
	// between: then read again.
	for {
		_, rev, err := claims.Get(ctx)
		if err != nil {
			t.Fatal(err)
		}
		_, err = claims.Put(ctx, &kv.Claim{Broker: "another", TTLMillis: 1000}, rev)
		if err == nil {
			break
		}
		if !errors.Is(err, kv.ErrConflict) {
			t.Fatal(err)
		}
	}
	if c := exitCode(t, code); c != exitError {
		t.Fatalf("exit code after the claim was taken = %d, want %d", c, exitError)
	}
}

// TestServeInProcess runs serve in this process with --sync always (checking its goroutines end)
// and --listen port 0.
func TestServeInProcess(t *testing.T) {
	t.Parallel()
	data := t.TempDir()
	ready, cancel, code := inProcess(t, "--data", data, "--listen", "127.0.0.1:0", "--sync", "always", "--log-format", "json")

	var line struct {
		Listen string `json:"listen"`
		Data   string `json:"data"`
		Sync   string `json:"sync"`
	}
	if err := json.Unmarshal([]byte(ready), &line); err != nil {
		t.Fatalf("ready line %s: %v", ready, err)
	}
	if line.Sync != "always" || line.Data != data || !strings.HasPrefix(line.Listen, "127.0.0.1:") || strings.HasSuffix(line.Listen, ":0") {
		t.Fatalf("ready line %s: want sync always, data %s and the port picked", ready, data)
	}
	roundTrip(t, "nats://"+line.Listen)

	cancel()
	if c := exitCode(t, code); c != exitOK {
		t.Fatalf("exit code after cancel = %d, want 0", c)
	}
}

func TestServePortInUse(t *testing.T) {
	t.Parallel()
	l, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	defer l.Close()

	// The NATS port, and the --http port (taken before the broker starts: it answers during the
	// recovery): each fails the start cleanly, the data directory free again.
	data := t.TempDir()
	for _, args := range [][]string{
		{"--listen", l.Addr().String()},
		{"--listen", "127.0.0.1:0", "--http", l.Addr().String()},
	} {
		var stderr bytes.Buffer
		c := runServe(context.Background(), append([]string{"--data", data}, args...), nil, &stderr)
		if c != exitError || !strings.Contains(stderr.String(), "natstone failed") {
			t.Fatalf("serve %q on a port in use: exit code %d, want 1, with \"natstone failed\" in:\n%s", args, c, &stderr)
		}
	}
}

// TestWriteTimeoutFlag: --write-timeout defaults to the broker's default and takes a duration.
func TestWriteTimeoutFlag(t *testing.T) {
	t.Parallel()
	for _, tt := range []struct {
		args []string
		want time.Duration
	}{
		{nil, broker.DefaultWriteTimeout},
		{[]string{"--write-timeout", "2s"}, 2 * time.Second},
		{[]string{"--write-timeout", "100ms"}, 100 * time.Millisecond},
	} {
		var stderr bytes.Buffer
		cfg, err := parseServeFlags(tt.args, io.Discard, &stderr)
		if err != nil {
			t.Fatalf("parseServeFlags(%q): %v\n%s", tt.args, err, &stderr)
		}
		if cfg.writeTimeout != tt.want {
			t.Fatalf("parseServeFlags(%q): write timeout %v, want %v", tt.args, cfg.writeTimeout, tt.want)
		}
	}
}

func TestUsageErrors(t *testing.T) {
	t.Parallel()
	tests := []struct {
		name string
		args []string
		want string // in stderr
	}{
		{"no command", nil, "Usage: natstone <command>"},
		{"unknown command", []string{"frobnicate"}, `unknown command "frobnicate"`},
		{"unknown help topic", []string{"help", "frobnicate"}, `unknown help topic "frobnicate"`},
		{"unknown flag", []string{"serve", "--bogus"}, "flag provided but not defined: --bogus"},
		{"bad sync", []string{"serve", "--sync", "sometimes"}, `--sync must be always or default, not "sometimes"`},
		{"nats-url with data", []string{"serve", "--nats-url", "nats://127.0.0.1:1", "--data", "d"}, "no embedded server to configure: drop --data"},
		{"nats-url with listen and sync", []string{"serve", "--nats-url", "nats://127.0.0.1:1", "--listen", ":1", "--sync", "always"}, "drop --listen, --sync"},
		{"argument", []string{"serve", "extra"}, `unexpected argument "extra"`},
		{"bad listen", []string{"serve", "--listen", "4222"}, `--listen "4222"`},
		{"bad port", []string{"serve", "--listen", "127.0.0.1:http"}, "port must be a number"},
		{"bad prefix", []string{"serve", "--prefix", "a.*"}, "--prefix"},
		{"zero replicas", []string{"serve", "--replicas", "0"}, "--replicas must be at least 1"},
		{"replicas embedded", []string{"serve", "--replicas", "3"}, "needs a clustered NATS server"},
		{"bad log level", []string{"serve", "--log-level", "loud"}, "--log-level must be"},
		{"bad log format", []string{"serve", "--log-format", "xml"}, "--log-format must be"},
		{"zero events max age", []string{"serve", "--events-max-age", "0s"}, "--events-max-age must be positive"},
		{"zero events max bytes", []string{"serve", "--events-max-bytes", "0"}, "--events-max-bytes must be positive or -1"},
		{"negative events max bytes", []string{"serve", "--events-max-bytes", "-2"}, "--events-max-bytes must be positive or -1"},
		{"zero store max bytes", []string{"serve", "--store-max-bytes", "0"}, "--store-max-bytes must be at least 1048576 (1 MiB) or -1"},
		{"small store max bytes", []string{"serve", "--store-max-bytes", "65536"}, "--store-max-bytes must be at least 1048576"},
		{"short claim ttl", []string{"serve", "--claim-ttl", "500ms"}, "--claim-ttl must be at least 1s"},
		{"creds without nats-url", []string{"serve", "--nats-creds", "user.creds"}, "--nats-creds needs --nats-url"},
		{"ca without nats-url", []string{"serve", "--nats-ca", "ca.pem"}, "--nats-ca needs --nats-url"},
		{"cert without key", []string{"serve", "--nats-url", "nats://127.0.0.1:1", "--nats-cert", "serve_test.go"}, "--nats-cert and --nats-key go together"},
		{"missing cert", []string{"serve", "--nats-url", "nats://127.0.0.1:1", "--nats-cert", "/nonexistent/c.pem", "--nats-key", "/nonexistent/k.pem"}, "--nats-cert: open /nonexistent/c.pem"},
		{"missing ca", []string{"serve", "--nats-url", "nats://127.0.0.1:1", "--nats-ca", "/nonexistent/ca.pem"}, "--nats-ca: open /nonexistent/ca.pem"},
		{"cert without nats-url", []string{"serve", "--nats-cert", "c.pem"}, "--nats-cert needs --nats-url"},
		{"creds a directory", []string{"serve", "--nats-url", "nats://127.0.0.1:1", "--nats-creds", "/"}, "--nats-creds: / is a directory"},
		{"creds and a user", []string{"serve", "--nats-url", "nats://u:p@127.0.0.1:1", "--nats-creds", "serve_test.go"}, "two logins"},
		{"missing creds", []string{"serve", "--nats-url", "nats://127.0.0.1:1", "--nats-creds", "/nonexistent/user.creds"}, "--nats-creds: open /nonexistent/user.creds"},
		{"short write timeout", []string{"serve", "--write-timeout", "50ms"}, "--write-timeout must be at least 100ms, not 50ms"},
		{"negative start timeout", []string{"serve", "--start-timeout", "-1s"}, "--start-timeout cannot be negative"},
		{"http host without http", []string{"serve", "--http-host", "dash.corp"}, "--http-host needs --http"},
		{"http host with a port", []string{"serve", "--http", "127.0.0.1:0", "--http-host", "dash.corp:8080"}, "is not a host name"},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			t.Parallel()
			var stdout, stderr bytes.Buffer
			if c := run(context.Background(), tt.args, &stdout, &stderr); c != exitUsage {
				t.Fatalf("run(%q) = %d, want %d; stderr:\n%s", tt.args, c, exitUsage, &stderr)
			}
			if !strings.Contains(stderr.String(), tt.want) {
				t.Fatalf("run(%q) stderr does not contain %q:\n%s", tt.args, tt.want, &stderr)
			}
			if stdout.Len() != 0 {
				t.Fatalf("run(%q) wrote to stdout:\n%s", tt.args, &stdout)
			}
		})
	}
}

// TestUsageErrorExitCode checks that main turns a usage error into exit code 2.
func TestUsageErrorExitCode(t *testing.T) {
	t.Parallel()
	p := startProc(t, "serve", "--sync", "sometimes")
	if c := p.wait(t); c != exitUsage {
		t.Fatalf("exit code = %d, want %d:\n%s", c, exitUsage, p.log)
	}
	if !strings.Contains(p.log.String(), "--sync must be") {
		t.Fatalf("stderr does not explain the error:\n%s", p.log)
	}
}

// TestVersionNamesTheCommit: the commit make build stamps (-X main.commit) is printed, in both
// forms. (Not parallel: it sets the package's commit.)
func TestVersionNamesTheCommit(t *testing.T) {
	was := commit
	t.Cleanup(func() { commit = was })
	commit = "0123456789abcdef0123456789abcdef01234567-dirty"
	for args, want := range map[string]string{
		"version":        "natstone " + broker.Version + " " + runtime.Version() + " " + commit + "\n",
		"version --json": `{"version":"` + broker.Version + `","go":"` + runtime.Version() + `","commit":"` + commit + `"}` + "\n",
	} {
		var stdout, stderr bytes.Buffer
		if c := run(context.Background(), strings.Fields(args), &stdout, &stderr); c != exitOK || stdout.String() != want {
			t.Errorf("natstone %s = %d, %q; want %q", args, c, &stdout, want)
		}
	}
}

func TestHelpAndVersion(t *testing.T) {
	t.Parallel()
	tests := []struct {
		args []string
		want []string // in stdout
	}{
		{[]string{"help"}, []string{"Usage: natstone <command>", "serve", "version"}},
		{[]string{"--help"}, []string{"Usage: natstone <command>"}},
		{[]string{"help", "serve"}, []string{"Usage: natstone serve", "\n  --nats-url url", "\n  --sync mode", "\n  --no-auto-create", "Exit codes:"}},
		{[]string{"help", "bench"}, []string{"Usage: natstone bench", "\n  --scenarios list", "docs/performance.md", "Exit codes:"}},
		{[]string{"help", "help"}, []string{"Usage: natstone <command>"}},
		{[]string{"help", "version"}, []string{"Usage: natstone version"}},
		{[]string{"version"}, []string{"natstone " + broker.Version}},
		{[]string{"version", "--json"}, []string{`{"version":"` + broker.Version + `","go":"go`}},
		{[]string{"version", "-h"}, []string{"Usage: natstone version [--json]", "--json"}},
	}
	for _, c := range commands { // every command's help ends with its exit codes
		tests = append(tests, struct {
			args []string
			want []string
		}{[]string{"help", c.name}, []string{"Usage: natstone " + c.name, "Exit codes:"}})
	}
	for _, tt := range tests {
		var stdout, stderr bytes.Buffer
		if c := run(context.Background(), tt.args, &stdout, &stderr); c != exitOK {
			t.Fatalf("run(%q) = %d, want 0; stderr:\n%s", tt.args, c, &stderr)
		}
		for _, w := range tt.want {
			if !strings.Contains(stdout.String(), w) {
				t.Errorf("run(%q) stdout does not contain %q:\n%s", tt.args, w, &stdout)
			}
		}
	}

	// version's command line is checked as every other's.
	for _, args := range [][]string{{"version", "--bogus"}, {"version", "x"}} {
		var stdout, stderr bytes.Buffer
		if c := run(context.Background(), args, &stdout, &stderr); c != exitUsage || stdout.Len() != 0 || !strings.Contains(stderr.String(), "natstone version: ") {
			t.Fatalf("run(%q) = %d, stdout %q, stderr %q; want exit 2 and the error on stderr", args, c, &stdout, &stderr)
		}
	}

	// -h on the command itself prints its flags on stdout (for a pager), and is no error.
	var stdout, stderr bytes.Buffer
	if c := runServe(context.Background(), []string{"-h"}, &stdout, &stderr); c != exitOK || !strings.Contains(stdout.String(), "\n  --data dir") || stderr.Len() != 0 {
		t.Fatalf("serve -h = %d, want 0 with the flags on stdout; stdout:\n%s\nstderr:\n%s", c, &stdout, &stderr)
	}
	// A bad flag is one line and a pointer to the help, on stderr.
	stdout.Reset()
	if c := runServe(context.Background(), []string{"--sync", "sometimes"}, &stdout, &stderr); c != exitUsage || stdout.Len() != 0 ||
		strings.Count(stderr.String(), "\n") != 2 || !strings.Contains(stderr.String(), "Run 'natstone serve --help'") {
		t.Fatalf("serve --sync sometimes = %d; want %d, the error and the pointer to the help on stderr:\n%s", c, exitUsage, &stderr)
	}
}

// TestDefaultDataDirIsRelative checks that --data defaults to natstone-data in the working
// directory.
func TestDefaultDataDirIsRelative(t *testing.T) {
	t.Chdir(t.TempDir())
	cfg, err := parseServeFlags(nil, nil, nil)
	if err != nil {
		t.Fatal(err)
	}
	wd, err := filepath.Abs(".")
	if err != nil {
		t.Fatal(err)
	}
	if want := filepath.Join(wd, DefaultDataDir); cfg.dataDir != want {
		t.Fatalf("default data dir = %q, want %q", cfg.dataDir, want)
	}
	if cfg.host != "127.0.0.1" || cfg.port != 4222 || cfg.syncAlways || cfg.replicas != 0 { // 0: the store's own
		t.Fatalf("defaults: %+v", cfg)
	}
}

func TestRedactURL(t *testing.T) {
	t.Parallel()
	tests := []struct{ in, want string }{
		{"nats://127.0.0.1:4222", "nats://127.0.0.1:4222"},
		{"nats://alice:secret@h:4222", "nats://redacted@h:4222"},
		{"nats://s3cr3tt0ken@h:4222", "nats://redacted@h:4222"},
		{"nats://a:1,nats://u:p@b:2", "nats://a:1,nats://redacted@b:2"},
		{"nats://u:p@h:bad port", "(unparsable url)"},
	}
	for _, tt := range tests {
		if got := redactURL(tt.in); got != tt.want {
			t.Errorf("redactURL(%q) = %q, want %q", tt.in, got, tt.want)
		}
	}
}

// TestServeStartTimeout: --start-timeout bounds the start, the embedded server's included: a start
// that cannot finish in time fails (exit 1) and says why, rather than serve.
func TestServeStartTimeout(t *testing.T) {
	t.Parallel()
	ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
	defer cancel()
	var stdout, stderr bytes.Buffer
	args := []string{"serve", "--data", t.TempDir(), "--listen", "127.0.0.1:0", "--start-timeout", "1ms"}
	if c := run(ctx, args, &stdout, &stderr); c != exitError {
		t.Fatalf("run(%q) = %d, want %d; stderr:\n%s", args, c, exitError, &stderr)
	}
	if !strings.Contains(stderr.String(), "not started within --start-timeout 1ms") {
		t.Fatalf("stderr does not say that --start-timeout ran out:\n%s", &stderr)
	}
}
