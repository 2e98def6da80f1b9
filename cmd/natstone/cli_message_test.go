package main

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"os"
	"os/exec"
	"path/filepath"
	"slices"
	"strconv"
	"strings"
	"testing"
	"time"

	"github.com/nats-io/nats-server/v2/server"
	"github.com/nats-io/nats.go"

	"github.com/natstone/natstone/subjects"
	"github.com/natstone/natstone/test/natstest"
	"github.com/natstone/natstone/workers"
)

// getMessage runs "get --json" and returns the message.
func getMessage(t *testing.T, url, queue, id string) subjects.Message {
	t.Helper()
	var m subjects.Message
	r := cli(t, url, "get", queue, id, "--json")
	r.ok(t)
	r.decode(t, &m)
	return m
}

// payloadText returns a message's text payload, failing if it has none.
func payloadText(t *testing.T, m subjects.Message) string {
	t.Helper()
	if m.Payload == nil {
		t.Fatalf("message %s has no text payload: %+v", m.ID, m)
	}
	return *m.Payload
}

func TestCLIEnqueue(t *testing.T) {
	t.Parallel()
	url := startNatstone(t)
	dir := t.TempDir()

	// From the argument, with every attribute.
	var reply subjects.EnqueueReply
	r := cli(t, url, "enqueue", "q", "from the argument", "--json", "--id", "arg", "--priority", "-7",
		"--meta", "kind=encode", "--meta", "project=foo", "--lease", "2m", "--max-attempts", "2")
	r.ok(t)
	r.decode(t, &reply)
	if reply.ID != "arg" || reply.State != subjects.StatePending || reply.Priority != -7 || reply.Duplicate {
		t.Fatalf("enqueue: %+v", reply)
	}
	m := getMessage(t, url, "q", "arg")
	if payloadText(t, m) != "from the argument" || m.Metadata["kind"] != "encode" || m.Metadata["project"] != "foo" || m.AttemptsLeft != 2 {
		t.Fatalf("get arg: %+v", m)
	}
	cli(t, url, "enqueue", "q", "x", "--max-attempts", "0").fails(t, exitUsage, "--max-attempts must be 1 to 1000")

	// The same id again is a duplicate, and the table says so.
	rows := tableRows(cli(t, url, "enqueue", "q", "other", "--id", "arg").ok(t))
	if len(rows) != 2 || !slices.Equal(rows[0], []string{"ID", "STATE", "PRIORITY", "VISIBLE_AT", "DUPLICATE"}) ||
		rows[1][0] != "arg" || rows[1][2] != "-7" || rows[1][4] != "yes" {
		t.Fatalf("enqueue of a duplicate: %q", rows)
	}

	// From a file, bytes as they are.
	binary := []byte{0, 1, 2, 0xff, '\n'}
	file := filepath.Join(dir, "payload.bin")
	if err := os.WriteFile(file, binary, 0o600); err != nil {
		t.Fatal(err)
	}
	cli(t, url, "enqueue", "q", "--file", file, "--id", "file").ok(t)
	if m := getMessage(t, url, "q", "file"); string(m.PayloadBase64) != string(binary) || m.Payload != nil {
		t.Fatalf("get file: %+v, want payload_base64 of %q", m, binary)
	}

	// From stdin: without PAYLOAD, with "-", with --file -.
	for i, args := range [][]string{{"enqueue", "q"}, {"enqueue", "q", "-"}, {"enqueue", "q", "--file", "-"}} {
		id := "stdin" + strconv.Itoa(i)
		in := "line one\nline two " + id
		runCLI(t, cliOpts{stdin: in}, append(args, "--id", id, "--server", url)...).ok(t)
		if got := payloadText(t, getMessage(t, url, "q", id)); got != in {
			t.Fatalf("%v: payload %q, want %q", args, got, in)
		}
	}

	// An empty payload from an empty stdin.
	runCLI(t, cliOpts{}, "enqueue", "q", "--id", "empty", "--server", url).ok(t)
	if m := getMessage(t, url, "q", "empty"); m.Payload != nil && *m.Payload != "" {
		t.Fatalf("get empty: %+v", m)
	}

	// --deadline as a time and as a duration from now; --invisible.
	at := time.Date(2030, 1, 2, 3, 4, 5, 0, time.UTC)
	r = cli(t, url, "enqueue", "q", "d1", "--json", "--deadline", at.Format(time.RFC3339))
	r.ok(t)
	r.decode(t, &reply)
	if reply.Priority != at.UnixMilli() {
		t.Fatalf("--deadline %v: priority %d, want %d", at, reply.Priority, at.UnixMilli())
	}
	before := time.Now()
	r = cli(t, url, "enqueue", "q", "d2", "--json", "--deadline", "1h", "--invisible", "1h")
	r.ok(t)
	r.decode(t, &reply)
	if p := time.UnixMilli(reply.Priority); p.Before(before.Add(time.Hour)) || p.After(time.Now().Add(time.Hour)) {
		t.Fatalf("--deadline 1h: priority %v, want an hour from now", p)
	}
	if reply.State != subjects.StateInvisible || reply.VisibleAt.Before(before.Add(time.Hour-time.Second)) {
		t.Fatalf("--invisible 1h: %+v", reply)
	}
	// --invisible 0 is pending at once, whatever the queue's invisibility; left out, the queue's.
	cli(t, url, "queue", "create", "slow", "--invisible", "1m").ok(t)
	for flags, want := range map[string]subjects.State{"--invisible=0s": subjects.StatePending, "": subjects.StateInvisible} {
		args := []string{"enqueue", "slow", "x", "--json"}
		if flags != "" {
			args = append(args, flags)
		}
		r = cli(t, url, args...)
		r.ok(t)
		r.decode(t, &reply)
		if reply.State != want {
			t.Fatalf("enqueue %q to a queue invisible 1m: %+v, want %s", flags, reply, want)
		}
	}
	// --visible-at: invisible until then; a time that has come is pending at once.
	visibleAt := time.Now().Add(time.Hour).Truncate(10 * time.Millisecond)
	r = cli(t, url, "enqueue", "q", "v1", "--json", "--visible-at", visibleAt.In(time.FixedZone("", 3600)).Format(time.RFC3339Nano))
	r.ok(t)
	r.decode(t, &reply)
	if want := visibleAt; reply.State != subjects.StateInvisible || !reply.VisibleAt.Equal(want) {
		t.Fatalf("--visible-at: %+v, want invisible until %v", reply, want)
	}
	r = cli(t, url, "enqueue", "q", "v2", "--json", "--visible-at", "2020-01-02T03:04:05Z")
	r.ok(t)
	r.decode(t, &reply)
	if reply.State != subjects.StatePending {
		t.Fatalf("--visible-at in the past: %+v, want pending", reply)
	}

	for _, tc := range []struct {
		args []string
		want string
	}{
		{[]string{"enqueue", "q", "p", "--file", file}, "give PAYLOAD or --file, not both"},
		{[]string{"enqueue", "q", "--priority", "1", "--deadline", "1h"}, "give --priority or --deadline"},
		{[]string{"enqueue", "q", "--deadline", "tomorrow"}, "neither an RFC 3339 time"},
		{[]string{"enqueue", "q", "--meta", "novalue"}, "want key=value"},
		{[]string{"enqueue", "q", "--meta", "k=1", "--meta", "k=2"}, `key "k" given twice`},
		{[]string{"enqueue", "q", "--invisible", "-1s"}, "must be 0 to 8784h"},
		{[]string{"enqueue", "q", "--invisible", "500us"}, "not a whole number of milliseconds"},
		{[]string{"enqueue", "q", "--visible-at", "tomorrow"}, "--visible-at must be an RFC 3339 time"},
		{[]string{"enqueue", "q", "--visible-at", "2030-01-02T03:04:05Z", "--invisible", "1h"}, "give --invisible or --visible-at"},
		{[]string{"enqueue", "q", "--import", "f", "--visible-at", "2030-01-02T03:04:05Z"}, "drop --visible-at"},
		{[]string{"enqueue", "q", "--lease", "50ms"}, "must be 100ms to 24h"},
		{[]string{"dequeue", "q", "--batch", "0"}, "--batch must be 1 to 256, not 0"},
		{[]string{"dequeue", "q", "--batch", "257"}, "--batch must be 1 to 256, not 257"},
		{[]string{"dequeue", "q", "--wait", "6m"}, "must be 0 to 5m"},
		{[]string{"dequeue", "q", "--lease", "500us"}, "not a whole number of milliseconds"},
		{[]string{"dequeue", "q", "--request-id", strings.Repeat("r", 257)}, "--request-id must be at most 256 bytes"},
		{[]string{"extend", "q", "m", "L", "--lease", "25h"}, "must be 100ms to 24h"},
		{[]string{"release", "q", "m", "L", "--delay", "1.5ms"}, "not a whole number of milliseconds"},
		{[]string{"release", "q", "m", "L", "--delay", "soon"}, "not a duration"},
		{[]string{"queue", "create", "q", "--lease", "500us"}, "not a whole number of milliseconds"},
		{[]string{"queue", "create", "q", "--retention", "999us"}, "not a whole number of milliseconds"}, // would be 0: collect at once
		{[]string{"queue", "update", "q", "--invisible", "-1s"}, "must be 0 to 8784h"},
		{[]string{"enqueue", "q", "--import", "f", "--id", "x"}, "drop --id"},
		{[]string{"enqueue", "q", "p", "--import", "f"}, "--import takes no PAYLOAD"},
		{[]string{"enqueue"}, "missing arguments"},
		{[]string{"enqueue", "q", "x", "--in-flight", "2"}, "--in-flight needs --import"},
		{[]string{"enqueue", "q", "--import", "f", "--in-flight", "0"}, "--in-flight must be 1 to 64"},
	} {
		runCLI(t, cliOpts{}, append(tc.args, "--server", url)...).fails(t, exitUsage, tc.want)
	}
	cli(t, url, "enqueue", "q", "--file", filepath.Join(dir, "missing")).fails(t, exitError, "reading the payload")
	cli(t, url, "enqueue", "q", "x", "--meta", "=v").fails(t, exitUsage, "want key=value")
	cli(t, url, "enqueue", "bad.name", "x").fails(t, exitError, "natstone: invalid_queue_name: ")
}

func TestCLIMessageRoundTrip(t *testing.T) {
	t.Parallel()
	url := startNatstone(t)
	cli(t, url, "queue", "create", "jobs", "--max-attempts", "2").ok(t)
	for i, kind := range []string{"a", "b", "a"} {
		cli(t, url, "enqueue", "jobs", "payload "+strconv.Itoa(i), "--id", "m"+strconv.Itoa(i),
			"--priority", strconv.Itoa(i), "--meta", "kind="+kind).ok(t)
	}

	// depth, with and without a filter.
	var depth subjects.DepthReply
	r := cli(t, url, "depth", "jobs", "--json", "--filter", "kind=a")
	r.ok(t)
	r.decode(t, &depth)
	if depth != (subjects.DepthReply{Queue: "jobs", Counts: subjects.Counts{Pending: 2}}) {
		t.Fatalf("depth --filter kind=a: %+v", depth)
	}
	rows := tableRows(cli(t, url, "depth", "jobs").ok(t))
	if want := [][]string{
		{"QUEUE", "PENDING", "RUNNING", "INVISIBLE", "COMPLETED", "CANCELED", "ERRORED"},
		{"jobs", "3", "0", "0", "0", "0", "0"},
	}; !slices.EqualFunc(rows, want, slices.Equal) {
		t.Fatalf("depth: %q, want %q", rows, want)
	}

	// dequeue: the most urgent first, with its lease.
	var deq subjects.DequeueReply
	r = cli(t, url, "dequeue", "jobs", "--json", "--lease", "10s")
	r.ok(t)
	r.decode(t, &deq)
	if len(deq.Messages) != 1 || deq.Messages[0].ID != "m0" || payloadText(t, deq.Messages[0]) != "payload 0" ||
		deq.Messages[0].LeaseID == "" || deq.Messages[0].State != subjects.StateRunning || deq.Messages[0].Attempts != 1 {
		t.Fatalf("dequeue: %+v", deq)
	}
	m0 := deq.Messages[0]

	// extend moves the expiry; a wrong lease is lease_mismatch (exit 1).
	var m subjects.Message
	r = cli(t, url, "extend", "jobs", "m0", m0.LeaseID, "--lease", "1h", "--json")
	r.ok(t)
	r.decode(t, &m)
	if m.LeaseExpiresAt == nil || !m.LeaseExpiresAt.After(m0.LeaseExpiresAt.Add(30*time.Minute)) || m.Payload != nil {
		t.Fatalf("extend: %+v (dequeued: %+v)", m, m0)
	}
	cli(t, url, "complete", "jobs", "m0", "not-the-lease").fails(t, exitError, "natstone: lease_mismatch: ")
	rows = tableRows(cli(t, url, "complete", "jobs", "m0", m0.LeaseID).ok(t))
	if len(rows) != 2 || !slices.Equal(rows[0], []string{"ID", "STATE", "PRIORITY", "ATTEMPTS", "LEASE", "EXPIRES", "METADATA"}) ||
		rows[1][0] != "m0" || rows[1][1] != "completed" {
		t.Fatalf("complete: %q", rows)
	}
	cli(t, url, "complete", "jobs", "m0", m0.LeaseID).ok(t) // idempotent

	// dequeue with a filter and a table; release with a delay makes it invisible.
	out := cli(t, url, "dequeue", "jobs", "--filter", "kind=a").ok(t)
	rows = tableRows(out)
	if len(rows) != 2 || !slices.Equal(rows[0], []string{"ID", "STATE", "PRIORITY", "ATTEMPTS", "LEASE", "EXPIRES", "METADATA", "PAYLOAD"}) ||
		rows[1][0] != "m2" || rows[1][3] != "1/2" || rows[1][6] != "kind=a" || !strings.HasSuffix(out, "payload 2\n") {
		t.Fatalf("dequeue --filter kind=a:\n%s", out)
	}
	lease2 := rows[1][4]
	r = cli(t, url, "release", "jobs", "m2", lease2, "--delay", "1h", "--json")
	r.ok(t)
	r.decode(t, &m)
	if m.State != subjects.StateInvisible || m.VisibleAt.Before(time.Now().Add(50*time.Minute)) {
		t.Fatalf("release --delay 1h: %+v", m)
	}

	// cancel: the holder's, fenced by its lease, and an operator's without one.
	r = cli(t, url, "dequeue", "jobs", "--json", "--batch", "5", "--request-id", "r1")
	r.ok(t)
	r.decode(t, &deq)
	if len(deq.Messages) != 1 || deq.Messages[0].ID != "m1" {
		t.Fatalf("dequeue --batch 5: %+v", deq)
	}
	var again subjects.DequeueReply // the same request id: the same lease
	r = cli(t, url, "dequeue", "jobs", "--json", "--request-id", "r1")
	r.ok(t)
	r.decode(t, &again)
	if len(again.Messages) != 1 || again.Messages[0].LeaseID != deq.Messages[0].LeaseID {
		t.Fatalf("dequeue retried with --request-id: %+v, first %+v", again, deq)
	}
	cli(t, url, "cancel", "jobs", "m1", "stale").fails(t, exitError, "natstone: lease_mismatch: ")
	r = cli(t, url, "cancel", "jobs", "m1", deq.Messages[0].LeaseID, "--json")
	r.ok(t)
	r.decode(t, &m)
	if m.State != subjects.StateCanceled {
		t.Fatalf("cancel with lease: %+v", m)
	}
	r = cli(t, url, "cancel", "jobs", "m2", "--error", "a duplicate of m1", "--json")
	r.ok(t)
	r.decode(t, &m)
	if m.State != subjects.StateCanceled || m.EndedAt == nil {
		t.Fatalf("cancel without lease: %+v", m)
	}
	// Its history says why (the events are stored a moment after the transition).
	for deadline := time.Now().Add(10 * time.Second); ; <-time.After(20 * time.Millisecond) {
		var h subjects.HistoryReply
		r := cli(t, url, "history", "jobs", "m2", "--json")
		r.ok(t)
		r.decode(t, &h)
		if last := h.Events[len(h.Events)-1]; last.Kind == subjects.EventCanceled && last.Error == "a duplicate of m1" {
			break
		}
		if time.Now().After(deadline) {
			t.Fatalf("m2's history: %+v, want its canceled event with the cancel's --error", h.Events)
		}
	}

	// get: every message, in its final state.
	for id, want := range map[string]subjects.State{"m0": subjects.StateCompleted, "m1": subjects.StateCanceled, "m2": subjects.StateCanceled} {
		if m := getMessage(t, url, "jobs", id); m.State != want {
			t.Errorf("get %s: state %s, want %s", id, m.State, want)
		}
	}
	out = cli(t, url, "get", "jobs", "m0").ok(t)
	if field(t, out, "State") != "completed" || field(t, out, "Attempts") != "1 of 2" || !strings.HasSuffix(out, "\npayload 0\n") {
		t.Fatalf("get m0:\n%s", out)
	}

	// Nothing left: exit 4, also after a wait, with an empty document for --json.
	r = cli(t, url, "dequeue", "jobs", "--json")
	r.fails(t, exitEmpty, "natstone: nothing to dequeue from jobs")
	r.decode(t, &deq)
	if deq.Messages == nil || len(deq.Messages) != 0 {
		t.Fatalf("empty dequeue --json: %q", r.stdout)
	}
	r = cli(t, url, "dequeue", "jobs", "--wait", "100ms")
	r.fails(t, exitEmpty, "nothing to dequeue")
	if r.stdout != "" {
		t.Fatalf("empty dequeue printed %q", r.stdout)
	}
	cli(t, url, "get", "jobs", "nope").fails(t, exitNotFound, "natstone: message_not_found: ")
	cli(t, url, "complete", "jobs", "m0").fails(t, exitUsage, "missing arguments")
	cli(t, url, "extend", "jobs", "m0", "l", "x").fails(t, exitUsage, `unexpected argument "x"`)
}

// TestCLIDequeueInterrupted: a dequeue --wait stopped by Ctrl-C leaves its long poll at the broker,
// which would lease it a message nobody then holds: the CLI abandons the poll, and says so, so a
// message enqueued after is pending for the next dequeue.
func TestCLIDequeueInterrupted(t *testing.T) {
	t.Parallel()
	url := startNatstone(t)
	cli(t, url, "queue", "create", "q").ok(t)
	cmd, _, stderr := startPolling(t, url, "q")
	if err := cmd.Process.Signal(os.Interrupt); err != nil {
		t.Fatal(err)
	}
	var exit *exec.ExitError
	if err := cmd.Wait(); !errors.As(err, &exit) || exit.ExitCode() != exitError {
		t.Fatalf("interrupted dequeue: %v; want exit %d\n%s", err, exitError, stderr.String())
	}
	if !strings.Contains(stderr.String(), "interrupted: the broker's wait was abandoned; it leased nothing") ||
		strings.Contains(stderr.String(), "a write may still have been carried out") || strings.Contains(stderr.String(), "context canceled") {
		t.Fatalf("stderr does not say the wait was abandoned, in words and alone:\n%s", stderr.String())
	}

	// The abandoned poll leases nothing: the message is the next dequeue's.
	cli(t, url, "enqueue", "q", "x", "--id", "m").ok(t)
	var got subjects.DequeueReply
	r := cli(t, url, "dequeue", "q", "--json")
	r.ok(t)
	r.decode(t, &got)
	if len(got.Messages) != 1 || got.Messages[0].ID != "m" || got.Messages[0].Attempts != 1 {
		t.Fatalf("the dequeue after the interrupted one: %+v, want m at its first attempt", got)
	}
}

// startPolling starts "natstone dequeue QUEUE --wait 1m" with args against url, and returns it,
// with its stdout and stderr, once its long poll has reached the broker.
func startPolling(t *testing.T, url, queue string, args ...string) (*exec.Cmd, *strings.Builder, *strings.Builder) {
	t.Helper()
	nc, err := nats.Connect(url)
	if err != nil {
		t.Fatal(err)
	}
	// Closed once it saw the poll: its subscription, back after a reconnect, would take the
	// dequeue sent again.
	defer nc.Close()
	polls, err := nc.SubscribeSync("natstone.v1.dequeue." + queue)
	if err != nil {
		t.Fatal(err)
	}
	if err := nc.Flush(); err != nil {
		t.Fatal(err)
	}
	cmd := exec.Command(bin, append([]string{"dequeue", queue, "--wait", "1m", "--server", url}, args...)...)
	stdout, stderr := &strings.Builder{}, &strings.Builder{}
	cmd.Stdout, cmd.Stderr = stdout, stderr
	if err := cmd.Start(); err != nil {
		t.Fatal(err)
	}
	if _, err := polls.NextMsg(deadline); err != nil {
		_ = cmd.Process.Kill()
		_ = cmd.Wait()
		t.Fatalf("no dequeue seen: %v", err)
	}
	return cmd, stdout, stderr
}

// TestCLIDequeueSentAgainAfterAReconnect: a dequeue --wait whose natstone is killed with its
// embedded NATS server while the poll waits is sent again, with its request id, once the CLI's
// connection is back, and again while no broker answers yet (here a bare NATS server stands for
// a natstone whose broker still recovers): it gets the message enqueued once natstone is back,
// rather than failing as a dequeue of unknown outcome.
func TestCLIDequeueSentAgainAfterAReconnect(t *testing.T) {
	t.Parallel()
	data := t.TempDir()
	port := freePort(t)
	listen := fmt.Sprintf("127.0.0.1:%d", port)
	url := "nats://" + listen
	p := startServe(t, "--data", data, "--listen", listen)
	cli(t, url, "queue", "create", "q").ok(t)
	cmd, stdout, stderr := startPolling(t, url, "q", "--json")
	if err := p.cmd.Process.Kill(); err != nil {
		t.Fatal(err)
	}
	p.wait(t)
	bare, err := server.NewServer(&server.Options{Host: "127.0.0.1", Port: port, NoLog: true, NoSigs: true})
	if err != nil {
		t.Fatal(err)
	}
	bare.Start()
	tick, end := time.NewTicker(10*time.Millisecond), time.After(deadline)
	for varz, _ := bare.Varz(nil); varz.InMsgs < 2; varz, _ = bare.Varz(nil) { // two tries: no broker
		select {
		case <-tick.C:
		case <-end:
			t.Fatalf("the dequeue was not sent again to the server with no broker within %v (clients %d, in %d): %s", deadline, bare.NumClients(), varz.InMsgs, stderr.String())
		}
	}
	tick.Stop()
	bare.Shutdown()
	startServe(t, "--data", data, "--listen", listen)
	cli(t, url, "enqueue", "q", "after", "--id", "m").ok(t)
	done := make(chan error, 1)
	go func() { done <- cmd.Wait() }()
	select {
	case err := <-done:
		if err != nil {
			t.Fatalf("dequeue across the restart: %v\n%s", err, stderr.String())
		}
	case <-time.After(deadline):
		_ = cmd.Process.Kill()
		t.Fatalf("dequeue still waits %v after the restart", deadline)
	}
	var got subjects.DequeueReply
	if err := json.Unmarshal([]byte(stdout.String()), &got); err != nil || len(got.Messages) != 1 || got.Messages[0].ID != "m" {
		t.Fatalf("dequeue across the restart printed %q (%v), want m", stdout.String(), err)
	}
}

// TestCLIRetry: retry re-drives one errored or canceled message, fenced by --version, or with
// --errored every errored message matching a filter, each at the version it was listed with.
func TestCLIRetry(t *testing.T) {
	t.Parallel()
	url := startNatstone(t)
	cli(t, url, "queue", "create", "q", "--max-attempts", "1").ok(t)
	for _, m := range []struct{ id, kind string }{{"a", "x"}, {"b", "x"}, {"c", "y"}} {
		cli(t, url, "enqueue", "q", "p-"+m.id, "--id", m.id, "--meta", "kind="+m.kind, "--priority", "1").ok(t)
		d := dequeueOne(t, url, "q")
		cli(t, url, "release", "q", d.ID, d.LeaseID, "--error", "boom").ok(t)
	}
	// Released with --refund, its one attempt given back: pending, not errored.
	cli(t, url, "enqueue", "q", "p-d", "--id", "d", "--meta", "kind=z", "--priority", "2").ok(t)
	d := dequeueOne(t, url, "q")
	if r := jsonOf[subjects.Message](t, cli(t, url, "release", "q", d.ID, d.LeaseID, "--refund", "--json")); r.State != subjects.StatePending || r.Attempts != 0 {
		t.Fatalf("release --refund: %+v, want pending with no attempt spent", r)
	}
	errored := jsonOf[subjects.Message](t, cli(t, url, "get", "q", "a", "--json"))
	if errored.State != subjects.StateErrored {
		t.Fatalf("a after its only attempt was released: %s", errored.State)
	}

	cli(t, url, "retry", "q").fails(t, exitUsage, "give the message's ID, or --errored")
	cli(t, url, "retry", "q", "a", "--errored").fails(t, exitUsage, "--errored takes no ID")
	cli(t, url, "retry", "q", "--errored", "--version", "3").fails(t, exitUsage, "--errored takes no --version")
	cli(t, url, "retry", "q", "a", "--limit", "5").fails(t, exitUsage, "go with --errored")
	cli(t, url, "retry", "q", "nope").fails(t, exitNotFound, "natstone: message_not_found: ")
	cli(t, url, "retry", "q", "a", "--version", strconv.FormatUint(errored.Version+1, 10)).fails(t, exitError, "natstone: revision_mismatch: ")

	rows := tableRows(cli(t, url, "retry", "q", "a", "--version", strconv.FormatUint(errored.Version, 10)).ok(t))
	if len(rows) != 2 || rows[1][0] != "a" || rows[1][1] != "pending" {
		t.Fatalf("retry a: %q", rows)
	}
	var sum struct {
		Retried []string          `json:"retried"`
		Skipped []json.RawMessage `json:"skipped"`
		More    bool              `json:"more"`
	}
	r := cli(t, url, "retry", "q", "--errored", "--filter", "kind=x", "--json")
	r.ok(t)
	r.decode(t, &sum)
	if !slices.Equal(sum.Retried, []string{"b"}) || len(sum.Skipped) != 0 || sum.More {
		t.Fatalf("retry --errored --filter kind=x: %+v, want b retried (a is pending already)", sum)
	}
	if out := cli(t, url, "retry", "q", "--errored").ok(t); out != "retried 1 errored messages\n" {
		t.Fatalf("retry --errored: %q", out)
	}
	if d := jsonOf[subjects.DepthReply](t, cli(t, url, "depth", "q", "--json")); d.Counts != (subjects.Counts{Pending: 4}) {
		t.Fatalf("after the retries: %+v, want 4 pending", d)
	}
}

// TestCLIReschedule: reschedule moves a pending message ahead and a visible one out of sight for a
// while, refuses usage mistakes before sending anything, and reports the broker's typed errors.
func TestCLIReschedule(t *testing.T) {
	t.Parallel()
	url := startNatstone(t)
	cli(t, url, "queue", "create", "q").ok(t)
	cli(t, url, "enqueue", "q", "p-a", "--id", "a", "--priority", "10").ok(t)
	cli(t, url, "enqueue", "q", "p-b", "--id", "b", "--priority", "20").ok(t)

	cli(t, url, "reschedule", "q", "b").fails(t, exitUsage, "give --priority, --deadline, --delay or --visible-at")
	cli(t, url, "reschedule", "q", "b", "--delay", "1s", "--visible-at", "2026-01-02T15:04:05Z").fails(t, exitUsage, "give --delay or --visible-at, not both")
	cli(t, url, "reschedule", "q", "b", "--visible-at", "tomorrow").fails(t, exitUsage, "--visible-at must be an RFC 3339 time")
	cli(t, url, "reschedule", "q", "b", "--priority", "1", "--deadline", "1h").fails(t, exitUsage, "not both")
	cli(t, url, "reschedule", "q", "b", "--deadline", "soon").fails(t, exitUsage, "neither an RFC 3339 time")
	cli(t, url, "reschedule", "q", "b", "--delay", "-1s").fails(t, exitUsage, "--delay: must be 0 to 8784h")
	cli(t, url, "reschedule", "q", "nope", "--priority", "1").fails(t, exitNotFound, "natstone: message_not_found: ")
	cli(t, url, "reschedule", "q", "b", "--priority", "1", "--version", "9").fails(t, exitError, "natstone: revision_mismatch: ")

	rows := tableRows(cli(t, url, "reschedule", "q", "b", "--priority", "5", "--version", "1").ok(t))
	if len(rows) != 2 || rows[1][0] != "b" || rows[1][1] != "pending" || rows[1][2] != "5" || rows[1][4] != "2" {
		t.Fatalf("reschedule b: %q, want b pending at priority 5, version 2", rows)
	}
	// --visible-at: the table says when it runs.
	at := time.Now().Add(2 * time.Hour).Truncate(time.Second)
	rows = tableRows(cli(t, url, "reschedule", "q", "b", "--visible-at", at.Format(time.RFC3339)).ok(t))
	if want := at.UTC().Format("2006-01-02T15:04:05.000Z"); len(rows) != 2 || rows[1][1] != "invisible" || rows[1][3] != want {
		t.Fatalf("reschedule b --visible-at %v: %q, want invisible until %s", at, rows, want)
	}
	if m := jsonOf[subjects.Message](t, cli(t, url, "reschedule", "q", "b", "--visible-at", "0001-01-01T00:00:00Z", "--json")); m.State != subjects.StatePending {
		t.Fatalf("reschedule b --visible-at the year 1: %+v, want pending at once", m)
	}
	hidden := jsonOf[subjects.Message](t, cli(t, url, "reschedule", "q", "a", "--delay", "1h", "--json"))
	if hidden.State != subjects.StateInvisible || hidden.VisibleAt.Sub(hidden.UpdatedAt) != time.Hour || hidden.Priority != 10 {
		t.Fatalf("reschedule a --delay 1h: %+v, want invisible for an hour at priority 10", hidden)
	}
	if out := cli(t, url, "history", "q", "b").ok(t); !strings.Contains(out, " rescheduled(priority 5) ") {
		t.Fatalf("history of b: no rescheduled(priority 5) event:\n%s", out)
	}
	// A reschedule that moved only when a runs: the history says when.
	if out, want := cli(t, url, "history", "q", "a").ok(t), " rescheduled(priority 10, visible at "+fmtTime(hidden.VisibleAt)+") "; !strings.Contains(out, want) {
		t.Fatalf("history of a: no%s event:\n%s", want, out)
	}
	d := dequeueOne(t, url, "q")
	if d.ID != "b" {
		t.Fatalf("dequeued %s, want b", d.ID)
	}
	cli(t, url, "reschedule", "q", "b", "--delay", "0s").fails(t, exitError, "natstone: invalid_state: ")
	if m := jsonOf[subjects.Message](t, cli(t, url, "reschedule", "q", "a", "--delay", "0s", "--deadline", "2026-01-02T15:04:05Z", "--json")); m.State != subjects.StatePending || m.Priority != 1767366245000 {
		t.Fatalf("reschedule a --delay 0s --deadline: %+v, want pending at priority 1767366245000", m)
	}
}

// TestCLICancelByState: cancel --state cancels the listed messages that match the filter, each at
// the version it was listed with, and names those it skipped; cancel --version fences one message.
func TestCLICancelByState(t *testing.T) {
	t.Parallel()
	url := startNatstone(t)
	cli(t, url, "queue", "create", "q").ok(t)
	for i, p := range []string{"foo", "foo", "bar", "foo"} {
		cli(t, url, "enqueue", "q", "x", "--id", "m"+strconv.Itoa(i), "--meta", "project="+p, "--priority", strconv.Itoa(i)).ok(t)
	}
	cli(t, url, "cancel", "q").fails(t, exitUsage, "give the message's ID, or --state")
	cli(t, url, "cancel", "q", "m0", "--state", "pending").fails(t, exitUsage, "--state takes no ID")
	cli(t, url, "cancel", "q", "--state", "pending", "--version", "1").fails(t, exitUsage, "--state takes no --version")
	cli(t, url, "cancel", "q", "--state", "errored").fails(t, exitUsage, "--state must be pending, invisible or running")
	cli(t, url, "cancel", "q", "m0", "--filter", "project=foo").fails(t, exitUsage, "go with --state")
	cli(t, url, "cancel", "q", "m0", "L", "--version", "1").fails(t, exitUsage, "not both")
	cli(t, url, "cancel", "q", "m0", "--version", "0").fails(t, exitUsage, "--version must be a message's version")

	// m0 is leased: version 2 now, so a cancel at the version it was enqueued with is refused.
	d := dequeueOne(t, url, "q")
	if d.ID != "m0" {
		t.Fatalf("dequeued %s, want m0", d.ID)
	}
	cli(t, url, "cancel", "q", "m0", "--version", "1").fails(t, exitError, "natstone: revision_mismatch: ")
	var sum struct {
		Canceled []string          `json:"canceled"`
		Skipped  []json.RawMessage `json:"skipped"`
		More     bool              `json:"more"`
	}
	r := cli(t, url, "cancel", "q", "--state", "pending", "--filter", "project=foo", "--limit", "1", "--json")
	r.ok(t)
	r.decode(t, &sum)
	if !slices.Equal(sum.Canceled, []string{"m1"}) || len(sum.Skipped) != 0 || !sum.More {
		t.Fatalf("cancel --state pending --filter project=foo --limit 1: %+v, want m1 canceled and more left", sum)
	}
	if out := cli(t, url, "cancel", "q", "--state", "pending", "--filter", "project=foo").ok(t); out != "canceled 1 pending messages\n" {
		t.Fatalf("cancel --state pending --filter project=foo: %q", out)
	}
	if out := cli(t, url, "cancel", "q", "--state", "running").ok(t); out != "canceled 1 running messages\n" {
		t.Fatalf("cancel --state running: %q", out)
	}
	if d := jsonOf[subjects.DepthReply](t, cli(t, url, "depth", "q", "--json")); d.Counts != (subjects.Counts{Pending: 1, Canceled: 3}) {
		t.Fatalf("after the cancels: %+v, want bar's m2 pending and the rest canceled", d)
	}
	cli(t, url, "complete", "q", "m0", d.LeaseID).fails(t, exitError, "natstone: invalid_state: ")
}

// TestBulkSkips: a listed message that changed before the bulk command reached it is skipped and
// named with a code a script can switch on, whether the broker refused the act (revision_mismatch)
// or answered that someone else had done it and more (not pending any more).
func TestBulkSkips(t *testing.T) {
	t.Parallel()
	url := startNatstone(t)
	cli(t, url, "queue", "create", "q").ok(t)
	for i, id := range []string{"a", "b", "c"} {
		cli(t, url, "enqueue", "q", "x", "--id", id, "--priority", strconv.Itoa(i)).ok(t)
	}
	var stdout, stderr strings.Builder
	c := newClientCommand("natstone test", "", "", &stdout, &stderr)
	if _, err := c.parse([]string{"--json", "--server", url}, 0, 0); err != nil {
		t.Fatal(err)
	}
	code := c.run(t.Context(), func(ctx context.Context, conn *cliConn) error {
		return c.bulk(ctx, conn, "q", nil, 10, &bulkSummary{verb: "canceled", listed: subjects.StatePending},
			func(m *workers.Message) (workers.Message, error) {
				switch m.ID {
				case "a": // leased since it was listed: the cancel at its listed version is refused
					if _, err := conn.client.Dequeue(ctx, "q", nil); err != nil {
						t.Fatal(err)
					}
				case "b": // leased, then canceled by someone else: the broker answers the cancel alike
					msgs, err := conn.client.Dequeue(ctx, "q", nil)
					if err != nil || len(msgs) != 1 || msgs[0].ID != "b" {
						t.Fatalf("dequeue of b: %v, %v", msgs, err)
					}
					if _, err := conn.client.Cancel(ctx, "q", "b", ""); err != nil {
						t.Fatal(err)
					}
				}
				return conn.client.CancelAt(ctx, "q", m.ID, m.Version)
			})
	})
	if code != exitOK {
		t.Fatalf("exit code %d: %s", code, stderr.String())
	}
	var sum struct {
		Canceled []string `json:"canceled"`
		Skipped  []struct {
			ID    string        `json:"id"`
			Code  subjects.Code `json:"code"`
			Error string        `json:"error"`
		} `json:"skipped"`
		More bool `json:"more"`
	}
	if err := json.Unmarshal([]byte(stdout.String()), &sum); err != nil {
		t.Fatalf("%v: %s", err, stdout.String())
	}
	if !slices.Equal(sum.Canceled, []string{"c"}) || len(sum.Skipped) != 2 || sum.More ||
		sum.Skipped[0].ID != "a" || sum.Skipped[0].Code != subjects.CodeRevisionMismatch ||
		sum.Skipped[1].ID != "b" || sum.Skipped[1].Code != subjects.CodeRevisionMismatch ||
		!strings.Contains(sum.Skipped[1].Error, "not pending any more: canceled") {
		t.Fatalf("summary %s, want c canceled, a and b skipped with revision_mismatch", stdout.String())
	}
}

// TestDequeueAcrossCutsGivesUpAtTheTenthCut: a wait cut by a reconnect is sent again with its
// request id, and fails at its maxPollCuts-th cut (docs/cli.md: "after 10 such cuts").
func TestDequeueAcrossCutsGivesUpAtTheTenthCut(t *testing.T) {
	t.Parallel()
	srv := natstest.Start(t, nil)
	space, _ := subjects.NewSpace("")
	fake := srv.Connect(t)
	sent := make(chan string, maxPollCuts+1)
	if _, err := fake.Subscribe(space.Subject(subjects.OpDequeue, "q"), func(m *nats.Msg) {
		var r subjects.DequeueRequest
		if err := json.Unmarshal(m.Data, &r); err != nil {
			t.Error(err)
		}
		sent <- r.RequestID // parked: never answered
	}); err != nil {
		t.Fatal(err)
	}
	if err := fake.Flush(); err != nil {
		t.Fatal(err)
	}
	nc := srv.Connect(t, nats.ReconnectWait(time.Millisecond))
	client, err := workers.NewClient(nc, &workers.Config{IgnoreAnnouncements: true})
	if err != nil {
		t.Fatal(err)
	}
	done := make(chan error, 1)
	go func() {
		_, err := dequeueAcrossCuts(t.Context(), client, "q", &workers.DequeueOpts{Batch: 1, Wait: time.Minute, RequestID: "r1"})
		done <- err
	}()
	for i := range maxPollCuts {
		select {
		case id := <-sent:
			if id != "r1" {
				t.Fatalf("try %d sent with request id %q, want r1", i+1, id)
			}
		case err := <-done:
			t.Fatalf("the wait ended after %d tries, want %d: %v", i, maxPollCuts, err)
		case <-time.After(10 * time.Second):
			t.Fatalf("try %d not sent", i+1)
		}
		// The server drops the connection, as one killed would (nats.go's ForceReconnect would fail
		// the request instead).
		cid, err := nc.GetClientID()
		if err != nil {
			t.Fatal(err)
		}
		if err := srv.NATS().DisconnectClientByID(cid); err != nil {
			t.Fatal(err)
		}
	}
	select {
	case err := <-done:
		if !errors.Is(err, workers.ErrPollCut) {
			t.Fatalf("the wait cut %d times ended with %v, want ErrPollCut", maxPollCuts, err)
		}
	case id := <-sent:
		t.Fatalf("sent again (%q) after its %dth cut", id, maxPollCuts)
	case <-time.After(10 * time.Second):
		t.Fatalf("the wait cut %d times did not end", maxPollCuts)
	}
}

// TestCLIConnectionFlagsBeforeTheCommand: the connection flags may come before the command (and
// between a group's name and its command), as the nats CLI's global flags do, in both of their
// forms; an argument after "--" stays an argument, and a flag given again after the command wins.
func TestCLIConnectionFlagsBeforeTheCommand(t *testing.T) {
	t.Parallel()
	url := startNatstone(t)
	runCLI(t, cliOpts{}, "--server", url, "--timeout", "5s", "queue", "create", "q").ok(t)
	runCLI(t, cliOpts{}, "--server="+url, "enqueue", "q", "--id", "m", "--", "-starts-with-a-dash").ok(t)
	if m := getMessage(t, url, "q", "m"); payloadText(t, m) != "-starts-with-a-dash" {
		t.Fatalf("payload %q, want the argument after --", payloadText(t, m))
	}
	// Between a group's name and its command too.
	runCLI(t, cliOpts{}, "queue", "--server", url, "info", "q").ok(t)
	// Before the command, after it: the one after it wins, as two of a flag do.
	runCLI(t, cliOpts{}, "--server", "nats://127.0.0.1:1", "get", "q", "m", "--server", url).ok(t)
}
