package e2e

import (
	"bufio"
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"os"
	"os/exec"
	"regexp"
	"strings"
	"testing"
	"time"

	"github.com/nats-io/nats.go"
	"go.uber.org/goleak"

	"github.com/natstone/natstone/embedded"
	"github.com/natstone/natstone/test/brokertest"
	"github.com/natstone/natstone/test/natbin"
	"github.com/natstone/natstone/test/natstest"
)

// natstoneBin is the natstone binary, built by TestMain for the CLI examples.
var natstoneBin string

func TestMain(m *testing.M) {
	path, remove, err := natbin.Build("../../cmd/natstone", false)
	if err != nil {
		fmt.Fprintln(os.Stderr, err)
		os.Exit(1)
	}
	natstoneBin = path
	code := m.Run()
	remove()
	if code == 0 {
		if err := goleak.Find(); err != nil {
			fmt.Fprintln(os.Stderr, err)
			code = 1
		}
	}
	os.Exit(code)
}

// natsReq is one `nats req` line of the docs.
type natsReq struct {
	line    string
	subject string
	body    string
	headers map[string]string
	timeout time.Duration // --timeout, else the nats CLI's default, 5 s
	comment string        // what the docs say the reply is, after '#'
}

// reqLine matches `nats req [--timeout D] SUBJECT [--header K:V]... 'BODY'  # comment`.
var reqLine = regexp.MustCompile(`^nats req (?:--timeout (\S+) )?(\S+)((?: --header \S+?:'[^']*')*) '([^']*)'\s*(?:#\s*(.*))?$`)
var headerArg = regexp.MustCompile(`--header (\S+?):'([^']*)'`)

// docRequests returns the `nats req` lines of the ```sh blocks of a Markdown file.
func docRequests(t *testing.T, path string) []natsReq {
	t.Helper()
	f, err := os.Open(path)
	if err != nil {
		t.Fatal(err)
	}
	defer f.Close()
	var out []natsReq
	inSh := false
	sc := bufio.NewScanner(f)
	for sc.Scan() {
		line := strings.TrimSpace(sc.Text())
		switch {
		case strings.HasPrefix(line, "```sh"):
			inSh = true
		case strings.HasPrefix(line, "```"):
			inSh = false
		case inSh && strings.HasPrefix(line, "nats req "):
			m := reqLine.FindStringSubmatch(line)
			if m == nil {
				t.Fatalf("%s: cannot parse %q", path, line)
			}
			r := natsReq{line: line, subject: m[2], body: m[4], comment: m[5], headers: map[string]string{}, timeout: 5 * time.Second}
			if m[1] != "" {
				if r.timeout, err = time.ParseDuration(m[1]); err != nil {
					t.Fatalf("%s: %q: %v", path, line, err)
				}
			}
			for _, h := range headerArg.FindAllStringSubmatch(m[3], -1) {
				r.headers[h[1]] = h[2]
			}
			out = append(out, r)
		}
	}
	if len(out) == 0 {
		t.Fatalf("%s: no nats req examples found", path)
	}
	return out
}

// startBroker runs a broker on an in-process server and returns a client connection to it.
func startBroker(t *testing.T) *nats.Conn {
	t.Helper()
	srv := natstest.Start(t, nil)
	brokertest.Start(t, srv)
	return srv.Connect(t)
}

// runDoc sends every request of a document in order, as a user would type them, and checks that
// none fails and that each reply says what the line's comment promises.
func runDoc(t *testing.T, path string) {
	nc := startBroker(t)
	var lastLease string
	for _, r := range docRequests(t, path) {
		body := strings.ReplaceAll(r.body, "<lease_id from the dequeue>", lastLease)
		msg := nats.NewMsg(r.subject)
		msg.Data = []byte(body)
		for k, v := range r.headers {
			msg.Header.Set(k, v)
		}
		reply, err := nc.RequestMsg(msg, r.timeout)
		if err != nil {
			t.Fatalf("%s: %v", r.line, err)
		}
		if e := reply.Header.Get("Nats-Service-Error"); e != "" {
			t.Fatalf("%s: error reply %s", r.line, reply.Data)
		}
		var dq struct {
			Messages []struct {
				ID      string `json:"id"`
				LeaseID string `json:"lease_id"`
			} `json:"messages"`
		}
		if strings.Contains(r.subject, ".dequeue.") {
			if err := json.Unmarshal(reply.Data, &dq); err != nil {
				t.Fatalf("%s: %v", r.line, err)
			}
			if len(dq.Messages) > 0 {
				lastLease = dq.Messages[0].LeaseID
			}
		}
		// Comments of the form "job-2: …" promise that message; "nothing: …" an empty dequeue.
		switch word, _, _ := strings.Cut(r.comment, ":"); {
		case r.comment == "":
		case word == "nothing":
			if len(dq.Messages) != 0 {
				t.Fatalf("%s: got %s, the docs promise nothing", r.line, reply.Data)
			}
		case strings.Contains(r.subject, ".dequeue.") && !strings.Contains(word, " "):
			if len(dq.Messages) == 0 || dq.Messages[0].ID != word {
				t.Fatalf("%s: got %s, the docs promise %s", r.line, reply.Data, word)
			}
		}
	}
}

func TestREADMEQuickStart(t *testing.T) { t.Parallel(); runDoc(t, "../../README.md") }

func TestProtocolExamples(t *testing.T) { t.Parallel(); runDoc(t, "../../docs/protocol.md") }

// cliLine matches a README line that runs the natstone CLI: `natstone ARGS…  # comment`.
var cliLine = regexp.MustCompile(`^natstone ((?:[^#'\s]+|'[^']*'|\s+)+?)\s*(?:#\s*(.*))?$`)
var cliArg = regexp.MustCompile(`'[^']*'|[^\s']+`)

// TestREADMECLI runs every natstone command of the README's quick start against a real natstone,
// checking the exit codes and the messages its comments promise.
func TestREADMECLI(t *testing.T) {
	t.Parallel()
	ns, err := embedded.Start(context.Background(), &embedded.Config{DataDir: t.TempDir(), Listen: "127.0.0.1:0"})
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() {
		if err := ns.Stop(context.Background()); err != nil {
			t.Error(err)
		}
	})
	f, err := os.ReadFile("../../README.md")
	if err != nil {
		t.Fatal(err)
	}
	var lastLease string
	ran, inSh := 0, false
	for _, line := range strings.Split(string(f), "\n") {
		line = strings.TrimSpace(line)
		switch {
		case strings.HasPrefix(line, "```sh"):
			inSh = true
			continue
		case strings.HasPrefix(line, "```"):
			inSh = false
			continue
		}
		if !inSh || !strings.HasPrefix(line, "natstone ") || strings.HasPrefix(line, "natstone serve") {
			continue
		}
		m := cliLine.FindStringSubmatch(line)
		if m == nil {
			t.Fatalf("cannot parse %q", line)
		}
		var args []string
		for _, a := range cliArg.FindAllString(m[1], -1) {
			a = strings.Trim(a, "'")
			if a == "<lease-id>" {
				a = lastLease
			}
			args = append(args, a)
		}
		args = append(args, "--server", ns.ClientURL())
		isDequeue, isHistory := args[0] == "dequeue", args[0] == "history"
		if isDequeue || isHistory {
			args = append(args, "--json") // to read the lease id the next lines use, or the events
		}
		cmd := exec.Command(natstoneBin, args...)
		cmd.Env = append(os.Environ(), "XDG_CONFIG_HOME="+t.TempDir(), "NATS_URL=", "NATS_CONTEXT=")
		out, err := cmd.Output()
		code := 0
		var exit *exec.ExitError
		if errors.As(err, &exit) {
			code = exit.ExitCode()
		} else if err != nil {
			t.Fatalf("%s: %v", line, err)
		}
		ran++
		want := 0
		if strings.Contains(m[2], "(exit 4)") {
			want = 4
		}
		if code != want {
			t.Fatalf("%s: exit %d, want %d; output:\n%s", line, code, want, out)
		}
		if isDequeue && code == 0 {
			var dq struct {
				Messages []struct {
					ID      string `json:"id"`
					LeaseID string `json:"lease_id"`
				} `json:"messages"`
			}
			if err := json.Unmarshal(out, &dq); err != nil || len(dq.Messages) == 0 {
				t.Fatalf("%s: %s (%v)", line, out, err)
			}
			lastLease = dq.Messages[0].LeaseID
			if word, _, _ := strings.Cut(m[2], ":"); word != "" && dq.Messages[0].ID != word {
				t.Fatalf("%s: got %s, the README promises %s", line, dq.Messages[0].ID, word)
			}
		}
		if isHistory {
			// The comment lists the event kinds, in order, before its colon.
			var h struct {
				Events []struct {
					Kind string `json:"kind"`
				} `json:"events"`
			}
			if err := json.Unmarshal(out, &h); err != nil {
				t.Fatalf("%s: %s (%v)", line, out, err)
			}
			var kinds []string
			for _, e := range h.Events {
				kinds = append(kinds, e.Kind)
			}
			if promised, _, _ := strings.Cut(m[2], ":"); strings.Join(kinds, ", ") != promised {
				t.Fatalf("%s: events %v, the README promises %s", line, kinds, promised)
			}
		}
	}
	if ran < 5 {
		t.Fatalf("ran only %d README commands", ran)
	}
}
