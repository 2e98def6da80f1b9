package main

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"log/slog"
	"os"
	"path/filepath"
	"testing"

	"github.com/nats-io/nats-server/v2/server"
	"github.com/nats-io/nats.go"

	"github.com/natstone/natstone/broker"
	"github.com/natstone/natstone/subjects"
	"github.com/natstone/natstone/test/natstest"
	"github.com/natstone/natstone/workers"
)

func TestCLIExitCodes(t *testing.T) {
	t.Parallel()
	url := startNatstone(t)
	plain := natstest.Start(t, nil).URL() // a NATS server without natstone: no responders
	nothing := fmt.Sprintf("nats://127.0.0.1:%d", freePort(t))
	cli(t, url, "queue", "create", "q").ok(t)

	for _, tc := range []struct {
		name string
		args []string
		code int
		want string // in stderr
	}{
		{"ok", []string{"queue", "info", "q", "--server", url}, exitOK, ""},
		{"refused", []string{"queue", "create", "q", "--max-attempts", "100000", "--server", url}, exitError, "natstone: invalid_config: "},
		{"usage", []string{"dequeue", "q", "--batch", "many", "--server", url}, exitUsage, "invalid value \"many\" for flag --batch"},
		{"empty id", []string{"enqueue", "q", "x", "--id", "", "--server", url}, exitUsage, "--id is empty"},
		{"empty fire id", []string{"schedule", "fire", "q", "tick", "--id=", "--server", url}, exitUsage, "--id is empty"},
		{"empty request id", []string{"dequeue", "q", "--request-id=", "--server", url}, exitUsage, "--request-id is empty"},
		{"queue not found", []string{"depth", "nope", "--server", url}, exitNotFound, "natstone: queue_not_found: "},
		{"message not found", []string{"cancel", "q", "nope", "--server", url}, exitNotFound, "natstone: message_not_found: "},
		{"nothing to dequeue", []string{"dequeue", "q", "--server", url}, exitEmpty, "natstone: nothing to dequeue from q"},
		{"no broker", []string{"queue", "ls", "--server", plain}, exitNoBroker, "natstone: no natstone broker answers at " + plain + " (prefix natstone.v1)"},
		{"no broker on the prefix", []string{"enqueue", "q", "x", "--prefix", "other", "--server", url}, exitNoBroker, "(prefix other)"},
		{"no server", []string{"get", "q", "id", "--server", nothing}, exitNoBroker, "natstone: cannot connect to " + nothing},
		{"unknown context", []string{"queue", "ls", "--context", "missing"}, exitUsage, `loading nats context "missing"`},
		{"missing creds file", []string{"queue", "ls", "--creds", "/nonexistent/user.creds", "--server", url}, exitUsage, "--creds: "},
	} {
		r := runCLI(t, cliOpts{}, tc.args...)
		if r.code != tc.code {
			t.Errorf("%s: exit code %d, want %d\nstderr: %s", tc.name, r.code, tc.code, r.stderr)
			continue
		}
		if tc.want != "" {
			r.fails(t, tc.code, tc.want)
		}
	}
}

// writeContext saves a nats CLI context under configHome as the nats CLI does:
// nats/context/<name>.json, and nats/context.txt naming the selected one if selected.
func writeContext(t *testing.T, configHome, name string, selected bool, settings map[string]any) {
	t.Helper()
	dir := filepath.Join(configHome, "nats", "context")
	if err := os.MkdirAll(dir, 0o700); err != nil {
		t.Fatal(err)
	}
	data, err := json.Marshal(settings)
	if err != nil {
		t.Fatal(err)
	}
	if err := os.WriteFile(filepath.Join(dir, name+".json"), data, 0o600); err != nil {
		t.Fatal(err)
	}
	if selected {
		if err := os.WriteFile(filepath.Join(configHome, "nats", "context.txt"), []byte(name+"\n"), 0o600); err != nil {
			t.Fatal(err)
		}
	}
}

func TestCLINatsContext(t *testing.T) {
	t.Parallel()
	url := startNatstone(t)
	other := startNatstone(t)
	cli(t, url, "queue", "create", "from-selected").ok(t)
	cli(t, other, "queue", "create", "from-other").ok(t)
	home := t.TempDir()
	writeContext(t, home, "main", true, map[string]any{"description": "test", "url": url})
	writeContext(t, home, "other", false, map[string]any{"url": other})
	writeContext(t, home, "dead", false, map[string]any{"url": fmt.Sprintf("nats://127.0.0.1:%d", freePort(t))})

	queues := func(r cliRun) string {
		t.Helper()
		var list subjects.ListReply
		r.ok(t)
		r.decode(t, &list)
		if len(list.Queues) != 1 {
			t.Fatalf("queues: %+v", list)
		}
		return list.Queues[0].Name
	}
	for _, tc := range []struct {
		name string
		env  []string
		args []string
		want string // the queue of the server reached
	}{
		{"selected context", nil, nil, "from-selected"},
		{"--context", nil, []string{"--context", "other"}, "from-other"},
		{"NATS_CONTEXT", []string{"NATS_CONTEXT=other"}, nil, "from-other"},
		{"--context over NATS_CONTEXT", []string{"NATS_CONTEXT=dead"}, []string{"--context", "other"}, "from-other"},
		{"--server over the context", nil, []string{"--context", "dead", "--server", other}, "from-other"},
		{"NATS_URL over the context", []string{"NATS_URL=" + other}, nil, "from-other"},
		{"--server over NATS_URL", []string{"NATS_URL=" + other}, []string{"--server", url}, "from-selected"},
	} {
		r := runCLI(t, cliOpts{configHome: home, env: tc.env}, append([]string{"queue", "ls", "--json"}, tc.args...)...)
		if got := queues(r); got != tc.want {
			t.Errorf("%s: reached the server with %s, want %s", tc.name, got, tc.want)
		}
	}
	runCLI(t, cliOpts{configHome: home}, "queue", "ls", "--context", "dead").fails(t, exitNoBroker, "cannot connect")

	// A selection naming a context that does not exist fails rather than dialing the default URL.
	stale := t.TempDir()
	writeContext(t, stale, "gone", true, map[string]any{"url": url})
	if err := os.Remove(filepath.Join(stale, "nats", "context", "gone.json")); err != nil {
		t.Fatal(err)
	}
	runCLI(t, cliOpts{configHome: stale}, "queue", "ls").fails(t, exitUsage, "loading the selected nats context")
}

// startAuthNatstone runs natstone on a NATS server that requires user alice, password secret,
// and returns the server's URL (without credentials).
func startAuthNatstone(t *testing.T) string {
	t.Helper()
	srv := natstest.StartOptions(t, &server.Options{Users: []*server.User{{Username: "alice", Password: "secret"}}})
	var conns []*nats.Conn
	for range 2 {
		nc, err := nats.Connect(srv.URL(), nats.UserInfo("alice", "secret"))
		if err != nil {
			t.Fatal(err)
		}
		t.Cleanup(nc.Close)
		conns = append(conns, nc)
	}
	b, err := broker.New(&broker.Config{Conn: conns[0], StoreConn: conns[1], Logger: slog.New(slog.NewTextHandler(io.Discard, nil))})
	if err != nil {
		t.Fatal(err)
	}
	ctx, cancel := context.WithTimeout(context.Background(), deadline)
	defer cancel()
	if err := b.Start(ctx); err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() {
		ctx, cancel := context.WithTimeout(context.Background(), deadline)
		defer cancel()
		if err := b.Stop(ctx); err != nil {
			t.Errorf("stopping the broker: %v", err)
		}
	})
	return srv.URL()
}

func TestCLINatsContextAuth(t *testing.T) {
	t.Parallel()
	url := startAuthNatstone(t)
	home := t.TempDir()
	writeContext(t, home, "alice", true, map[string]any{"url": url, "user": "alice", "password": "secret"})
	writeContext(t, home, "mallory", false, map[string]any{"url": url, "user": "mallory", "password": "guess"})
	opts := cliOpts{configHome: home}

	runCLI(t, opts, "queue", "create", "q").ok(t)
	runCLI(t, opts, "queue", "ls", "--context", "mallory").fails(t, exitNoBroker, "Authorization Violation")
	// The flags replace the context's authentication.
	runCLI(t, opts, "queue", "ls", "--context", "mallory", "--user", "alice", "--password", "secret").ok(t)
	runCLI(t, opts, "queue", "ls", "--password", "wrong").fails(t, exitNoBroker, "Authorization Violation")
	runCLI(t, opts, "queue", "ls", "--user", "alice").fails(t, exitNoBroker, "Authorization Violation")
	runCLI(t, opts, "queue", "ls", "--context", "mallory", "--password", "secret").fails(t, exitNoBroker, "Authorization Violation")
	runCLI(t, cliOpts{}, "queue", "ls", "--server", url).fails(t, exitNoBroker, "Authorization Violation")
	runCLI(t, cliOpts{}, "queue", "ls", "--server", url, "--password", "secret").fails(t, exitUsage, "--password needs --user")
	runCLI(t, cliOpts{}, "queue", "ls", "--server", url, "--user", "alice", "--password", "secret").ok(t)

	// A context naming a file that is not there is unusable (exit 2), not a server out of reach
	// (exit 5, which a script may retry forever), login flags or not: nats.go reads the file anyway.
	missing := filepath.Join(t.TempDir(), "missing")
	writeContext(t, home, "nocreds", false, map[string]any{"url": url, "creds": missing})
	writeContext(t, home, "nocert", false, map[string]any{"url": url, "cert": missing, "key": missing})
	runCLI(t, opts, "queue", "ls", "--context", "nocreds").fails(t, exitUsage, `nats context "nocreds": its creds file`)
	runCLI(t, opts, "queue", "ls", "--context", "nocert").fails(t, exitUsage, `nats context "nocert": its cert file`)
	runCLI(t, opts, "queue", "ls", "--context", "nocreds", "--user", "alice", "--password", "secret").fails(t, exitUsage, "its creds file")
}

func TestExitCodeOf(t *testing.T) {
	t.Parallel()
	for _, tc := range []struct {
		err  error
		want int
	}{
		{nil, exitOK},
		{errors.New("x"), exitError},
		{&workers.APIError{Code: subjects.CodeLeaseExpired}, exitError},
		{fmt.Errorf("w: %w", &workers.APIError{Code: subjects.CodeQueueNotFound}), exitNotFound},
		{&workers.APIError{Code: subjects.CodeMessageNotFound}, exitNotFound},
		{&workers.APIError{Code: subjects.CodeScheduleNotFound}, exitNotFound},
		{&workers.APIError{Code: subjects.CodeUnavailable}, exitError},
		{fmt.Errorf("%w from q", errNothingToDequeue), exitEmpty},
		{fmt.Errorf("natstone: list : %w", nats.ErrNoResponders), exitNoBroker},
		{fmt.Errorf("natstone: get q: %w", nats.ErrTimeout), exitNoBroker},
		{&connectError{url: "u", err: nats.ErrNoServers}, exitNoBroker},
		{&configError{errors.New("no such context")}, exitUsage},
	} {
		if got := exitCodeOf(tc.err); got != tc.want {
			t.Errorf("exitCodeOf(%v) = %d, want %d", tc.err, got, tc.want)
		}
	}
}
