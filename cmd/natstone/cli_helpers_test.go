package main

import (
	"bytes"
	"context"
	"encoding/json"
	"errors"
	"os"
	"os/exec"
	"strings"
	"testing"

	"github.com/natstone/natstone/embedded"
)

// startNatstone starts natstone in this process (nats-server and broker) on a free port and returns
// its client URL. A t.Cleanup stops it.
func startNatstone(t *testing.T) string {
	t.Helper()
	ctx, cancel := context.WithTimeout(context.Background(), deadline)
	defer cancel()
	n, err := embedded.Start(ctx, &embedded.Config{DataDir: t.TempDir(), Listen: "127.0.0.1:0"})
	if err != nil {
		t.Fatalf("starting natstone: %v", err)
	}
	t.Cleanup(func() {
		ctx, cancel := context.WithTimeout(context.Background(), deadline)
		defer cancel()
		if err := n.Stop(ctx); err != nil {
			t.Errorf("stopping natstone: %v", err)
		}
	})
	return n.ClientURL()
}

// cliRun is one run of the natstone binary.
type cliRun struct {
	code           int
	stdout, stderr string
}

// cliOpts are the optional inputs of runCLI.
type cliOpts struct {
	stdin string
	env   []string // added to the environment, KEY=value
	// configHome is XDG_CONFIG_HOME, where nats contexts live. Default an empty directory, so that
	// the contexts of whoever runs the tests play no part.
	configHome string
}

// runCLI runs the natstone binary with args and returns its exit code and output. The environment
// has no NATS_URL or NATS_CONTEXT unless opts adds them.
func runCLI(t *testing.T, opts cliOpts, args ...string) cliRun {
	t.Helper()
	ctx, cancel := context.WithTimeout(context.Background(), deadline)
	defer cancel()
	cmd := exec.CommandContext(ctx, bin, args...)
	cmd.Dir = t.TempDir()
	for _, kv := range os.Environ() {
		switch k, _, _ := strings.Cut(kv, "="); k {
		case "NATS_URL", "NATS_CONTEXT", "XDG_CONFIG_HOME":
		default:
			cmd.Env = append(cmd.Env, kv)
		}
	}
	if opts.configHome == "" {
		opts.configHome = t.TempDir()
	}
	cmd.Env = append(cmd.Env, "XDG_CONFIG_HOME="+opts.configHome)
	cmd.Env = append(cmd.Env, opts.env...)
	cmd.Stdin = strings.NewReader(opts.stdin)
	var stdout, stderr bytes.Buffer
	cmd.Stdout, cmd.Stderr = &stdout, &stderr
	err := cmd.Run()
	var exitErr *exec.ExitError
	if err != nil && !errors.As(err, &exitErr) {
		t.Fatalf("running natstone %s: %v", strings.Join(args, " "), err)
	}
	return cliRun{code: cmd.ProcessState.ExitCode(), stdout: stdout.String(), stderr: stderr.String()}
}

// cli runs the binary against the server at url, with no stdin.
func cli(t *testing.T, url string, args ...string) cliRun {
	t.Helper()
	return runCLI(t, cliOpts{}, append(args, "--server", url)...)
}

// ok checks that r exited 0 and returns its stdout.
func (r cliRun) ok(t *testing.T) string {
	t.Helper()
	if r.code != exitOK {
		t.Fatalf("exit code %d, want 0\nstdout:\n%s\nstderr:\n%s", r.code, r.stdout, r.stderr)
	}
	return r.stdout
}

// fails checks that r exited with code and that its stderr contains want.
func (r cliRun) fails(t *testing.T, code int, want string) {
	t.Helper()
	if r.code != code || !strings.Contains(r.stderr, want) {
		t.Fatalf("exit code %d, stderr:\n%s\nwant exit code %d and stderr containing %q\nstdout:\n%s", r.code, r.stderr, code, want, r.stdout)
	}
}

// decode decodes r's stdout, which must be one JSON document, into v.
func (r cliRun) decode(t *testing.T, v any) {
	t.Helper()
	dec := json.NewDecoder(strings.NewReader(r.stdout))
	dec.DisallowUnknownFields()
	if err := dec.Decode(v); err != nil {
		t.Fatalf("decoding stdout: %v\n%s", err, r.stdout)
	}
	if dec.More() {
		t.Fatalf("stdout holds more than one JSON document:\n%s", r.stdout)
	}
}

// tableRows splits a table into rows of fields, header first.
func tableRows(out string) [][]string {
	var rows [][]string
	for line := range strings.Lines(out) {
		if f := strings.Fields(line); len(f) > 0 {
			rows = append(rows, f)
		}
	}
	return rows
}

// field returns the value of "Label:" in a vertical listing.
func field(t *testing.T, out, label string) string {
	t.Helper()
	for line := range strings.Lines(out) {
		if rest, ok := strings.CutPrefix(line, label+":"); ok {
			return strings.TrimSpace(rest)
		}
	}
	t.Fatalf("no %q in:\n%s", label, out)
	return ""
}
