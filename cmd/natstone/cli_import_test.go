package main

import (
	"encoding/json"
	"fmt"
	"os"
	"os/exec"
	"path/filepath"
	"reflect"
	"strings"
	"testing"
	"time"

	"github.com/nats-io/nats.go"

	"github.com/natstone/natstone/subjects"
	"github.com/natstone/natstone/workers"
)

// importFile writes 2500 lines: line 700 is not JSON, line 1800 has an unknown field, line 2100
// repeats the id of line 5, and line 2500 carries a binary payload. It returns the file's path.
func importFile(t *testing.T) string {
	t.Helper()
	var b strings.Builder
	for n := 1; n <= 2500; n++ {
		switch n {
		case 700:
			b.WriteString(`{"id": "m700", "payload": oops}` + "\n")
		case 1800:
			b.WriteString(`{"id": "m1800", "payload": "x", "lease": 5000}` + "\n")
		case 2100:
			b.WriteString(`{"id": "m5", "payload": "again"}` + "\n")
		case 2500:
			b.WriteString(`{"id": "m2500", "payload_base64": "AAH/", "priority": -1, "invisible_ms": 3600000}`) // no final newline
		default:
			line, err := json.Marshal(subjects.EnqueueRequest{
				ID: fmt.Sprintf("m%d", n), Payload: fmt.Sprintf("payload %d", n),
				Metadata: map[string]string{"parity": []string{"even", "odd"}[n%2]},
			})
			if err != nil {
				t.Fatal(err)
			}
			b.Write(line)
			b.WriteString("\n")
		}
		if n == 1000 {
			b.WriteString("\n") // blank lines are skipped, but counted as lines of the file
		}
	}
	path := filepath.Join(t.TempDir(), "messages.jsonl")
	if err := os.WriteFile(path, []byte(b.String()), 0o600); err != nil {
		t.Fatal(err)
	}
	return path
}

func TestCLIImport(t *testing.T) {
	t.Parallel()
	url := startNatstone(t)
	path := importFile(t)
	// After the blank line at 1001, line numbers of the messages are one more than their n.
	const badJSON, unknownField, dup = 700, 1801, 2101

	r := cli(t, url, "enqueue", "bulk", "--import", path)
	r.fails(t, exitError, "natstone: import: 2 of 2500 lines failed")
	for _, want := range []string{
		fmt.Sprintf("natstone: line %d: bad_line: invalid character 'o'", badJSON),
		fmt.Sprintf("natstone: line %d: bad_line: unknown field \"lease\"", unknownField),
	} {
		if !strings.Contains(r.stderr, want) {
			t.Errorf("stderr lacks %q:\n%s", want, r.stderr)
		}
	}
	for label, want := range map[string]string{
		"queue": "bulk", "lines": "2500 (not counting blank ones)", "enqueued": "2497",
		"duplicates": fmt.Sprintf("1 (lines %d)", dup),
		"failed":     fmt.Sprintf("2 (lines %d, %d)", badJSON, unknownField),
	} {
		if got := field(t, r.stdout, label); got != want {
			t.Errorf("summary %s: %q, want %q", label, got, want)
		}
	}

	var depth subjects.DepthReply
	r = cli(t, url, "depth", "bulk", "--json")
	r.ok(t)
	r.decode(t, &depth)
	if depth.Counts != (subjects.Counts{Pending: 2496, Invisible: 1}) {
		t.Fatalf("depth after the import: %+v, want 2496 pending and 1 invisible", depth.Counts)
	}
	cli(t, url, "depth", "bulk", "--filter", "parity=odd").ok(t)
	if m := getMessage(t, url, "bulk", "m5"); payloadText(t, m) != "payload 5" {
		t.Fatalf("m5 was overwritten by its duplicate: %+v", m)
	}
	if m := getMessage(t, url, "bulk", "m2500"); string(m.PayloadBase64) != "\x00\x01\xff" || m.Priority != -1 {
		t.Fatalf("m2500: %+v", m)
	}
	if m := getMessage(t, url, "bulk", "m2499"); payloadText(t, m) != "payload 2499" || m.Metadata["parity"] != "odd" {
		t.Fatalf("m2499: %+v", m)
	}

	// Again from stdin, with --json: every line is now a duplicate, and the order of the batches
	// shows in the order of the duplicate line numbers.
	data, err := os.ReadFile(path)
	if err != nil {
		t.Fatal(err)
	}
	r = runCLI(t, cliOpts{stdin: string(data)}, "enqueue", "bulk", "--import", "-", "--json", "--server", url)
	r.fails(t, exitError, "2 of 2500 lines failed")
	var sum importSummary
	r.decode(t, &sum)
	wantFailed := []importFailure{
		{Line: badJSON, Code: codeBadLine, Error: "invalid character 'o' looking for beginning of value"},
		{Line: unknownField, Code: codeBadLine, Error: `unknown field "lease"`},
	}
	if sum.Queue != "bulk" || sum.Lines != 2500 || sum.Enqueued != 0 || sum.Duplicates != 2498 ||
		!reflect.DeepEqual(sum.Failed, wantFailed) || sum.Stopped != "" {
		t.Fatalf("second import: %+v", sum)
	}
	for i := 1; i < len(sum.DuplicateLines); i++ {
		if sum.DuplicateLines[i] <= sum.DuplicateLines[i-1] {
			t.Fatalf("duplicate lines out of order at %d: %v", i, sum.DuplicateLines[i-1:i+1])
		}
	}
}

func TestCLIImportRefusedLines(t *testing.T) {
	t.Parallel()
	url := startNatstone(t)
	cli(t, url, "queue", "create", "small", "--max-payload", "10").ok(t)
	lines := []string{
		`{"id": "a", "payload": "short"}`,
		`{"id": "b", "payload": "far too long for the queue"}`,
		`{"id": "c", "payload": "short", "metadata": {"": "empty key"}}`,
		`null`,
		`{"id": "d"} {"id": "e"}`,
		`{"id": "f", "payload": "x", "payload_base64": "eA=="}`,
		`{"id": "", "payload": "an empty id"}`,
		`{"id": "h", "invisible_ms": -5}`,
		`{"id": "i", "payload": "ok"}`,
	}
	r := runCLI(t, cliOpts{stdin: strings.Join(lines, "\n") + "\n"}, "enqueue", "small", "--import", "-", "--json", "--server", url)
	r.fails(t, exitError, "7 of 9 lines failed")
	var sum importSummary
	r.decode(t, &sum)
	codes := map[int]string{}
	for _, f := range sum.Failed {
		codes[f.Line] = f.Code
	}
	want := map[int]string{2: "payload_too_large", 3: "invalid_metadata", 4: codeBadLine, 5: codeBadLine, 6: codeBadLine, 7: codeBadLine, 8: codeBadLine}
	if !reflect.DeepEqual(codes, want) || sum.Enqueued != 2 {
		t.Fatalf("import: %+v\nfailed codes %v, want %v", sum, codes, want)
	}
	if m := getMessage(t, url, "small", "i"); payloadText(t, m) != "ok" {
		t.Fatalf("i: %+v", m)
	}
	// Every list is there, empty or not, as docs/cli.md shows it: jq '.duplicate_lines[]' works.
	var doc map[string]json.RawMessage
	r.decode(t, &doc)
	if got := string(doc["duplicate_lines"]); got != "[]" {
		t.Fatalf("--json without duplicates: duplicate_lines %q, want []", got)
	}

	// A blocked queue stops the import: its lines are unconfirmed, the exit code is the error's.
	cli(t, url, "queue", "update", "small", "--block-enqueue").ok(t)
	r = runCLI(t, cliOpts{stdin: `{"id":"z"}` + "\n"}, "enqueue", "small", "--import", "-", "--server", url)
	r.fails(t, exitError, "natstone: queue_blocked: ")
	if got := field(t, r.stdout, "unconfirmed"); got != "1 (from line 1)" { // the whole input was read: one line
		t.Fatalf("unconfirmed: %q\n%s", got, r.stdout)
	}
	cli(t, url, "enqueue", "small", "--import", filepath.Join(t.TempDir(), "missing.jsonl")).fails(t, exitError, "import: open")
}

func TestParseImportLine(t *testing.T) {
	t.Parallel()
	prio := int64(9)
	for _, tc := range []struct {
		line    string
		want    workers.BatchMessage
		wantErr string
	}{
		{line: `{}`},
		{line: `{"ID":"x","payload":"p"}`, want: workers.BatchMessage{Payload: []byte("p"), EnqueueOpts: workers.EnqueueOpts{ID: "x"}}},
		{line: `{"payload_base64":"AAE=","priority":9,"invisible_ms":1500,"lease_ms":60000,"metadata":{"k":"v"}}`,
			want: workers.BatchMessage{Payload: []byte{0, 1}, EnqueueOpts: workers.EnqueueOpts{Priority: &prio,
				Invisible: 1500 * time.Millisecond, Lease: time.Minute, Metadata: map[string]string{"k": "v"}}}},
		{line: `{"invisible_ms":0}`, want: workers.BatchMessage{EnqueueOpts: workers.EnqueueOpts{Invisible: -1}}}, // pending at once
		{line: `{"lease_ms":0}`}, // the queue's
		{line: `{"visible_at":"2030-01-02T03:04:05Z"}`, want: workers.BatchMessage{EnqueueOpts: workers.EnqueueOpts{VisibleAt: time.Date(2030, 1, 2, 3, 4, 5, 0, time.UTC)}}},
		{line: `{"visible_at":"0001-01-01T00:00:00Z"}`, want: workers.BatchMessage{EnqueueOpts: workers.EnqueueOpts{VisibleAt: time.Time{}.Add(time.Nanosecond)}}}, // long past, not the Client's "none"
		{line: `{"visible_at":"2030-01-02T03:04:05Z","invisible_ms":5}`, wantErr: "give invisible_ms or visible_at, not both"},
		{line: `{"visible_at":"soon"}`, wantErr: `visible_at: want an RFC 3339 time (2026-11-28T09:00:00Z), got "soon"`},
		{line: `{"visible_at":1764320400000}`, wantErr: `visible_at: want an RFC 3339 time in a string ("2026-11-28T09:00:00Z"), got 1764320400000`},
		{line: `{"max_attempts":3}`, want: workers.BatchMessage{EnqueueOpts: workers.EnqueueOpts{MaxAttempts: 3}}},
		{line: `{"max_attempts":0}`, wantErr: "max_attempts must be 1 to 1000, not 0"},
		{line: `{"max_attempts":5000}`, wantErr: "max_attempts must be 1 to 1000, not 5000"},
		{line: `{"id":""}`, wantErr: "id is empty"},
		{line: `[]`, wantErr: "not a JSON object"},
		{line: `{"priority":"1"}`, wantErr: "priority: want an integer (64-bit), got string"},
		{line: `{} x`, wantErr: "data after the object"},
		{line: `{"payload_base64":"!"}`, wantErr: "illegal base64"},
		{line: `{"lease_ms":9223372036855}`, wantErr: "out of range"},
		{line: "{\"id\":\"a\xff\"}", wantErr: "not valid UTF-8"}, // encoding/json would store id "a\uFFFD"
		{line: "{\"payload\":\"caf\xe9\"}", wantErr: "not valid UTF-8"},
	} {
		got, err := parseImportLine([]byte(tc.line))
		switch {
		case tc.wantErr != "":
			if err == nil || !strings.Contains(err.Error(), tc.wantErr) {
				t.Errorf("%s: error %v, want %q", tc.line, err, tc.wantErr)
			}
		case err != nil:
			t.Errorf("%s: %v", tc.line, err)
		case !reflect.DeepEqual(got, tc.want):
			t.Errorf("%s: %+v, want %+v", tc.line, got, tc.want)
		}
	}
}

func TestRenderProgress(t *testing.T) {
	t.Parallel()
	for _, tc := range []struct {
		done, total int64
		elapsed     time.Duration
		want        string
	}{
		{0, 2500, 0, "importing: [>                             ] 0/2500 lines   0%  0 lines/s"},
		{1250, 2500, time.Second, "importing: [===============>              ] 1250/2500 lines  50%  1250 lines/s"},
		{2500, 2500, 2 * time.Second, "importing: [==============================] 2500/2500 lines 100%  1250 lines/s"},
		{3000, 2500, time.Second, "importing: [==============================] 2500/2500 lines 100%  3000 lines/s"},
		{700, 0, 2 * time.Second, "importing: 700 lines  350 lines/s"},
	} {
		if got := renderProgress(tc.done, tc.total, tc.elapsed); got != tc.want {
			t.Errorf("renderProgress(%d, %d, %v)\n got %q\nwant %q", tc.done, tc.total, tc.elapsed, got, tc.want)
		}
	}
}

func TestCountLines(t *testing.T) {
	t.Parallel()
	dir := t.TempDir()
	for content, want := range map[string]int{"": 0, "a": 1, "a\n": 1, "a\nb": 2, "a\n\nb\n": 3} {
		path := filepath.Join(dir, "f")
		if err := os.WriteFile(path, []byte(content), 0o600); err != nil {
			t.Fatal(err)
		}
		if got, err := countLines(path); err != nil || got != want {
			t.Errorf("countLines(%q) = %d, %v; want %d", content, got, err, want)
		}
	}
}

// TestCLIImportFromAProducerThatPauses: lines written to --import - by a producer that keeps its
// end open are enqueued as they come, not held until a batch of a thousand fills or the input ends.
func TestCLIImportFromAProducerThatPauses(t *testing.T) {
	t.Parallel()
	url := startNatstone(t)
	nc, err := nats.Connect(url)
	if err != nil {
		t.Fatal(err)
	}
	defer nc.Close()
	enqueued, err := nc.SubscribeSync("natstone.events.slow.enqueued.>")
	if err != nil {
		t.Fatal(err)
	}
	if err := nc.Flush(); err != nil {
		t.Fatal(err)
	}
	cmd := exec.Command(bin, "enqueue", "slow", "--import", "-", "--server", url)
	in, err := cmd.StdinPipe()
	if err != nil {
		t.Fatal(err)
	}
	var stderr strings.Builder
	cmd.Stderr = &stderr
	if err := cmd.Start(); err != nil {
		t.Fatal(err)
	}
	for i := range 10 {
		if _, err := fmt.Fprintf(in, `{"id": "m%d", "payload": "x"}`+"\n", i); err != nil {
			t.Fatal(err)
		}
	}
	for i := range 10 { // the producer's end still open
		if _, err := enqueued.NextMsg(deadline); err != nil {
			t.Fatalf("%d of 10 lines enqueued while the producer paused: %v\n%s", i, err, stderr.String())
		}
	}
	if err := in.Close(); err != nil {
		t.Fatal(err)
	}
	if err := cmd.Wait(); err != nil {
		t.Fatalf("import: %v\n%s", err, stderr.String())
	}
}
