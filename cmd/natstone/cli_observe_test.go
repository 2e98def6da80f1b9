package main

import (
	"context"
	"errors"
	"reflect"
	"slices"
	"strconv"
	"strings"
	"testing"
	"time"

	"github.com/natstone/natstone/subjects"
	"github.com/natstone/natstone/workers"
)

// observeClient returns a Go client of the natstone at url, for what the tests wait on.
func observeClient(t *testing.T, url string) *workers.Client {
	t.Helper()
	c, err := workers.NewClient(dial(t, url), nil)
	if err != nil {
		t.Fatal(err)
	}
	return c
}

// waitUntil calls cond until it reports true, failing the test at the deadline. Every call asks the
// broker, so the loop waits on its replies rather than sleeping.
func waitUntil(t *testing.T, what string, cond func(ctx context.Context) (bool, error)) {
	t.Helper()
	ctx, cancel := context.WithTimeout(context.Background(), deadline)
	defer cancel()
	for {
		done, err := cond(ctx)
		switch {
		case err != nil:
			t.Fatalf("waiting until %s: %v", what, err)
		case done:
			return
		case ctx.Err() != nil:
			t.Fatalf("not %s within %v", what, deadline)
		}
	}
}

// dequeueOne runs "dequeue --json" with args and returns the one message it leased.
func dequeueOne(t *testing.T, url string, args ...string) subjects.Message {
	t.Helper()
	var deq subjects.DequeueReply
	r := cli(t, url, append([]string{"dequeue", "--json"}, args...)...)
	r.ok(t)
	r.decode(t, &deq)
	if len(deq.Messages) != 1 {
		t.Fatalf("dequeue %v: %+v, want one message", args, deq)
	}
	return deq.Messages[0]
}

// jsonOf checks that r exited 0 and decodes its stdout, one JSON document, into a new T.
func jsonOf[T any](t *testing.T, r cliRun) T {
	t.Helper()
	r.ok(t)
	var v T
	r.decode(t, &v)
	return v
}

// sections splits output at its blank lines.
func sections(out string) []string { return strings.Split(strings.TrimSuffix(out, "\n"), "\n\n") }

func TestCLIStats(t *testing.T) {
	t.Parallel()
	url := startNatstone(t)
	start := time.Now()
	cli(t, url, "queue", "create", "jobs", "--max-attempts", "2").ok(t)
	for i, kind := range []string{"a", "b", "a", "b", "a"} {
		args := []string{"enqueue", "jobs", "p", "--id", "m" + strconv.Itoa(i), "--priority", strconv.Itoa(i), "--meta", "kind=" + kind}
		if i == 3 {
			args = append(args, "--invisible", "1h")
		}
		cli(t, url, args...).ok(t)
	}
	// m0 completed, m1 running with a 10m lease, m2 pending, m3 invisible, m4 canceled.
	m0 := dequeueOne(t, url, "jobs")
	cli(t, url, "complete", "jobs", "m0", m0.LeaseID).ok(t)
	m1 := dequeueOne(t, url, "jobs", "--lease", "10m")
	cli(t, url, "cancel", "jobs", "m4").ok(t)
	if m0.ID != "m0" || m1.ID != "m1" {
		t.Fatalf("dequeued %s and %s, want m0 and m1", m0.ID, m1.ID)
	}
	wantTotals := subjects.Totals{Enqueued: 5, Dequeued: 2, Completed: 1, Canceled: 1}

	st := jsonOf[subjects.StatsReply](t, cli(t, url, "stats", "jobs", "--json", "--expiring-within", "1h"))
	if st.Queue != "jobs" || st.Config.MaxAttempts != 2 || st.At.IsZero() ||
		st.Counts != (subjects.Counts{Pending: 1, Running: 1, Invisible: 1, Completed: 1, Canceled: 1}) {
		t.Fatalf("stats --json: %+v", st)
	}
	if st.Totals != wantTotals {
		t.Errorf("stats totals = %+v, want %+v", st.Totals, wantTotals)
	}
	// Without a filter the broker counts pending ages from the second they began: up to 1s more.
	if st.OldestPendingMS < 0 || st.OldestPendingMS > time.Since(start).Milliseconds()+1000 {
		t.Errorf("stats oldest_pending_ms = %d, the queue is %v old", st.OldestPendingMS, time.Since(start))
	}
	if rt := st.Rates; rt.Enqueued <= 0 || rt.Dequeued <= 0 || rt.Completed <= 0 || rt.Errored != 0 {
		t.Errorf("stats rates = %+v", rt)
	}
	if len(st.Expiring) != 1 {
		t.Fatalf("stats expiring = %+v, want m1", st.Expiring)
	}
	if l := st.Expiring[0]; l.ID != "m1" || l.LeaseID != m1.LeaseID || !l.LeaseExpiresAt.Equal(*m1.LeaseExpiresAt) ||
		l.Attempts != 1 || l.MaxAttempts != 2 || l.ExpiresInMS <= 9*60000 || l.ExpiresInMS > 10*60000 {
		t.Errorf("stats expiring[0] = %+v, want the lease of %+v", l, m1)
	}

	// The table: the same numbers, then the expiring leases.
	out := cli(t, url, "stats", "jobs", "--expiring-within", "1h").ok(t)
	for label, want := range map[string]string{
		"Queue":           "jobs",
		"Messages":        "pending 1, running 1, invisible 1, completed 1, canceled 1, errored 0",
		"Totals":          "enqueued 5, dequeued 2, completed 1, canceled 1, errored 0, released 0, expired 0, retried 0, rescheduled 0, collected 0 (since the broker started)",
		"Expiring leases": "1 within 1h",
	} {
		if got := field(t, out, label); got != want {
			t.Errorf("stats: %s = %q, want %q", label, got, want)
		}
	}
	if got := field(t, out, "Oldest pending"); got == "-" {
		t.Errorf("stats: Oldest pending = %q with a pending message", got)
	}
	if got := field(t, out, "Rates"); !strings.HasPrefix(got, "enqueued ") || !strings.HasSuffix(got, ", errored 0/s (last minute)") {
		t.Errorf("stats: Rates = %q", got)
	}
	parts := sections(out)
	if len(parts) != 2 {
		t.Fatalf("stats: want a listing and a table:\n%s", out)
	}
	rows := tableRows(parts[1])
	if len(rows) != 2 || !slices.Equal(rows[0], []string{"ID", "LEASE", "EXPIRES", "ATTEMPTS"}) ||
		rows[1][0] != "m1" || rows[1][1] != m1.LeaseID || rows[1][3] != "1/2" {
		t.Fatalf("stats expiring table: %q", rows)
	}
	if left, err := time.ParseDuration(rows[1][2]); err != nil || left <= 9*time.Minute || left > 10*time.Minute {
		t.Errorf("stats expiring table: EXPIRES %q, want about 10m", rows[1][2])
	}

	// With a filter, counts are of the matching messages; totals stay the queue's.
	st = jsonOf[subjects.StatsReply](t, cli(t, url, "stats", "jobs", "--json", "--filter", "kind=a"))
	if st.Counts != (subjects.Counts{Pending: 1, Completed: 1, Canceled: 1}) || st.Totals != wantTotals {
		t.Fatalf("stats --filter kind=a: %+v", st)
	}
	out = cli(t, url, "stats", "jobs", "--filter", "kind=b").ok(t)
	if got := field(t, out, "Filter"); got != "kind=b (messages and oldest pending only)" {
		t.Errorf("stats --filter kind=b: Filter = %q", got)
	}
	if got := field(t, out, "Messages"); got != "pending 0, running 1, invisible 1, completed 0, canceled 0, errored 0" {
		t.Errorf("stats --filter kind=b: Messages = %q", got)
	}
	if got := field(t, out, "Oldest pending"); got != "-" {
		t.Errorf("stats --filter kind=b: Oldest pending = %q without a pending message", got)
	}

	// The default window (30s) holds no lease of 10m: an empty list, and no table.
	r := cli(t, url, "stats", "jobs", "--json")
	if st = jsonOf[subjects.StatsReply](t, r); len(st.Expiring) != 0 || !strings.Contains(r.stdout, `"expiring": []`) {
		t.Fatalf("stats without leases expiring soon: %s", r.stdout)
	}
	out = cli(t, url, "stats", "jobs").ok(t)
	if got := field(t, out, "Expiring leases"); got != "none within 30s" || len(sections(out)) != 1 {
		t.Fatalf("stats without leases expiring soon:\n%s", out)
	}
	out = cli(t, url, "stats", "jobs", "--expiring-within", "1h", "--expiring-limit", "1").ok(t)
	if got := field(t, out, "Expiring leases"); !strings.HasPrefix(got, "1 within 1h, the soonest") {
		t.Errorf("stats --expiring-limit 1: Expiring leases = %q", got)
	}

	r = cli(t, url, "stats", "nope")
	r.fails(t, exitNotFound, "natstone: queue_not_found: ")
	if r.stdout != "" {
		t.Errorf("stats of an unknown queue printed %q", r.stdout)
	}
}

func TestCLIMessages(t *testing.T) {
	t.Parallel()
	url := startNatstone(t)
	for _, m := range []struct {
		id, priority, kind string
		invisible          bool
	}{
		{"run", "1", "b", false}, {"done", "2", "a", false}, {"inv", "5", "a", true},
		{"p30", "30", "a", false}, {"p10", "10", "b", false}, {"p20", "20", "a", false},
	} {
		args := []string{"enqueue", "list", "payload of " + m.id, "--id", m.id, "--priority", m.priority, "--meta", "kind=" + m.kind}
		if m.invisible {
			args = append(args, "--invisible", "1h")
		}
		cli(t, url, args...).ok(t)
	}
	run := dequeueOne(t, url, "list", "--lease", "10m")
	done := dequeueOne(t, url, "list")
	cli(t, url, "complete", "list", "done", done.LeaseID).ok(t)
	if run.ID != "run" || done.ID != "done" {
		t.Fatalf("dequeued %s and %s, want run and done", run.ID, done.ID)
	}

	// Pending by default, earliest deadline first, with when each became pending.
	rows := tableRows(cli(t, url, "messages", "list").ok(t))
	if len(rows) != 4 || !slices.Equal(rows[0], []string{"ID", "STATE", "PRIORITY", "ATTEMPTS", "VISIBLE_AT", "METADATA"}) {
		t.Fatalf("messages: %q", rows)
	}
	for i, want := range [][]string{{"p10", "pending", "10", "0/5"}, {"p20", "pending", "20", "0/5"}, {"p30", "pending", "30", "0/5"}} {
		row := rows[i+1]
		if !slices.Equal(row[:4], want) || len(row) != 6 || row[5] != "kind="+map[string]string{"p10": "b", "p20": "a", "p30": "a"}[want[0]] {
			t.Errorf("messages row %d = %q, want %q…", i+1, row, want)
		}
		if _, err := time.Parse(time.RFC3339Nano, row[4]); err != nil {
			t.Errorf("messages row %d: VISIBLE_AT %q: %v", i+1, row[4], err)
		}
	}

	// --limit: the first ones and a line saying there are more; --json says it too, without payloads.
	out := cli(t, url, "messages", "list", "--limit", "2").ok(t)
	rows = tableRows(out)
	if len(rows) != 4 || rows[1][0] != "p10" || rows[2][0] != "p20" || !strings.HasPrefix(out[strings.LastIndex(strings.TrimSuffix(out, "\n"), "\n")+1:], "… more pending messages") {
		t.Fatalf("messages --limit 2:\n%s", out)
	}
	br := jsonOf[subjects.BrowseReply](t, cli(t, url, "messages", "list", "--limit", "2", "--json"))
	if br.Queue != "list" || br.State != subjects.StatePending || !br.More || len(br.Messages) != 2 ||
		br.Messages[0].ID != "p10" || br.Messages[1].ID != "p20" || br.Messages[0].Metadata["kind"] != "b" {
		t.Fatalf("messages --limit 2 --json: %+v", br)
	}
	for _, m := range br.Messages {
		if m.Payload != nil || m.PayloadBase64 != nil || m.Queue != "list" || m.Version == 0 {
			t.Errorf("messages --json: %+v, want a message without payload", m)
		}
	}
	// The last line's --after lists the next page: p30, and no more.
	last := out[strings.LastIndex(strings.TrimSuffix(out, "\n"), "\n")+1:]
	_, after, ok := strings.Cut(strings.TrimSpace(last), "--after ")
	if !ok || after != br.Next {
		t.Fatalf("messages --limit 2: last line %q, want the --after of --json's next %q", last, br.Next)
	}
	page := jsonOf[subjects.BrowseReply](t, cli(t, url, "messages", "list", "--limit", "2", "--after", after, "--json"))
	if page.More || page.Next != "" || len(page.Messages) != 1 || page.Messages[0].ID != "p30" {
		t.Fatalf("messages --after %s: %+v, want p30 alone", after, page)
	}
	cli(t, url, "messages", "list", "--after", "x").fails(t, exitError, "natstone: bad_request: ")
	br = jsonOf[subjects.BrowseReply](t, cli(t, url, "messages", "list", "--filter", "kind=a", "--json"))
	if br.More || len(br.Messages) != 2 || br.Messages[0].ID != "p20" || br.Messages[1].ID != "p30" {
		t.Fatalf("messages --filter kind=a --json: %+v", br)
	}

	// Running: the lease and its time left.
	rows = tableRows(cli(t, url, "messages", "list", "--state", "running").ok(t))
	if len(rows) != 2 || !slices.Equal(rows[0], []string{"ID", "STATE", "PRIORITY", "ATTEMPTS", "LEASE", "EXPIRES", "METADATA"}) ||
		!slices.Equal(rows[1][:5], []string{"run", "running", "1", "1/5", run.LeaseID}) || rows[1][6] != "kind=b" {
		t.Fatalf("messages --state running: %q", rows)
	}
	if left, err := time.ParseDuration(rows[1][5]); err != nil || left <= 9*time.Minute || left > 10*time.Minute {
		t.Errorf("messages --state running: EXPIRES %q, want about 10m", rows[1][5])
	}

	// Invisible: when it becomes pending; completed: when it ended.
	rows = tableRows(cli(t, url, "messages", "list", "--state", "invisible").ok(t))
	if len(rows) != 2 || rows[0][4] != "VISIBLE_AT" || rows[1][0] != "inv" || rows[1][1] != "invisible" {
		t.Fatalf("messages --state invisible: %q", rows)
	}
	if at, err := time.Parse(time.RFC3339Nano, rows[1][4]); err != nil || time.Until(at) < 50*time.Minute {
		t.Errorf("messages --state invisible: VISIBLE_AT %q, want in an hour", rows[1][4])
	}
	br = jsonOf[subjects.BrowseReply](t, cli(t, url, "messages", "list", "--state", "completed", "--json"))
	if br.State != subjects.StateCompleted || len(br.Messages) != 1 || br.Messages[0].ID != "done" || br.Messages[0].EndedAt == nil {
		t.Fatalf("messages --state completed --json: %+v", br)
	}
	rows = tableRows(cli(t, url, "messages", "list", "--state", "completed").ok(t))
	if len(rows) != 2 || rows[0][4] != "ENDED_AT" || rows[1][0] != "done" || rows[1][4] != fmtTime(*br.Messages[0].EndedAt) {
		t.Fatalf("messages --state completed: %q, want done ended at %v", rows, br.Messages[0].EndedAt)
	}

	// None: the header alone, and an empty list.
	out = cli(t, url, "messages", "list", "--state", "errored").ok(t)
	if rows := tableRows(out); len(rows) != 1 || rows[0][4] != "ENDED_AT" {
		t.Fatalf("messages --state errored:\n%s", out)
	}
	if out := cli(t, url, "messages", "list", "--state", "errored", "--json").ok(t); !strings.Contains(out, `"messages": []`) {
		t.Fatalf("messages --state errored --json: %s", out)
	}

	r := cli(t, url, "messages", "nope")
	r.fails(t, exitNotFound, "natstone: queue_not_found: ")
	if r.stdout != "" {
		t.Errorf("messages of an unknown queue printed %q", r.stdout)
	}
}

func TestCLIHistory(t *testing.T) {
	t.Parallel()
	url := startNatstone(t)
	client := observeClient(t, url)
	// Retention 0: a finished message is collected at once.
	cli(t, url, "queue", "create", "hist", "--retention", "0s", "--max-attempts", "3").ok(t)
	cli(t, url, "enqueue", "hist", "one", "--id", "h1", "--priority", "1", "--meta", "kind=a").ok(t)
	cli(t, url, "enqueue", "hist", "two", "--id", "h2", "--priority", "2").ok(t)

	// h1: leased by w1, released (a failure), leased by w2, completed, collected.
	first := dequeueOne(t, url, "hist", "--worker", "w1")
	cli(t, url, "release", "hist", "h1", first.LeaseID, "--error", "upstream said\n\t429").ok(t)
	second := dequeueOne(t, url, "hist", "--worker", "w2")
	if first.ID != "h1" || second.ID != "h1" {
		t.Fatalf("dequeued %s and %s, want h1 twice", first.ID, second.ID)
	}
	cli(t, url, "complete", "hist", "h1", second.LeaseID).ok(t)
	waitUntil(t, "h1 is collected", func(ctx context.Context) (bool, error) {
		_, err := client.Get(ctx, "hist", "h1")
		if errors.Is(err, workers.ErrMessageNotFound) {
			return true, nil
		}
		return false, err
	})
	var want subjects.HistoryReply // the events are published after the writes: wait for the last
	waitUntil(t, "h1's history ends with collected", func(ctx context.Context) (bool, error) {
		var err error
		want, err = client.History(ctx, "hist", "h1", 0)
		if errors.Is(err, workers.ErrMessageNotFound) {
			return false, nil
		}
		return want.Collected, err
	})

	got := jsonOf[subjects.HistoryReply](t, cli(t, url, "history", "hist", "h1", "--json"))
	if !reflect.DeepEqual(got, want) {
		t.Fatalf("history --json:\n%+v\nwant (from the Go client):\n%+v", got, want)
	}
	var kinds []subjects.EventKind
	for _, e := range got.Events {
		kinds = append(kinds, e.Kind)
	}
	wantKinds := []subjects.EventKind{subjects.EventEnqueued, subjects.EventLeased, subjects.EventReleased,
		subjects.EventLeased, subjects.EventCompleted, subjects.EventCollected}
	if got.Queue != "hist" || got.ID != "h1" || !slices.Equal(kinds, wantKinds) || got.Failures != 1 || !got.Collected || got.Truncated {
		t.Fatalf("history --json: kinds %v, %+v; want kinds %v, one failure, collected", kinds, got, wantKinds)
	}
	if e := got.Events[2]; e.Error != "upstream said\n\t429" {
		t.Errorf("history: released event %+v, want the release's error", e)
	}
	if e := got.Events[1]; e.Worker != "w1" || e.LeaseID != first.LeaseID {
		t.Errorf("history: first leased event %+v, want worker w1 and lease %s", e, first.LeaseID)
	}
	if e := got.Events[3]; e.Worker != "w2" || e.LeaseID != second.LeaseID {
		t.Errorf("history: second leased event %+v, want worker w2 and lease %s", e, second.LeaseID)
	}
	for _, s := range []subjects.State{subjects.StatePending, subjects.StateRunning, subjects.StateCompleted} {
		if _, ok := got.StateMS[s]; !ok {
			t.Errorf("history: state_ms %v has no %s", got.StateMS, s)
		}
	}

	// The table: the timeline, then the totals.
	out := cli(t, url, "history", "hist", "h1").ok(t)
	parts := sections(out)
	if len(parts) != 2 {
		t.Fatalf("history: want a timeline and totals:\n%s", out)
	}
	rows := tableRows(parts[0])
	if len(rows) != 7 || !slices.Equal(rows[0], []string{"VERSION", "TIME", "KIND", "STATE", "IN_STATE", "ATTEMPT", "WORKER", "LEASE", "ERROR"}) {
		t.Fatalf("history timeline: %q", rows)
	}
	for i, want := range [][]string{
		{"1", "enqueued", "pending", "0/3", "-"},
		{"2", "leased", "running", "1/3", "w1"},
		{"3", "released", "pending", "1/3", "-"},
		{"4", "leased", "running", "2/3", "w2"},
		{"5", "completed", "completed", "2/3", "-"},
		{"6", "collected", "-", "2/3", "-"},
	} {
		row := rows[i+1]
		if have := []string{row[0], row[2], row[3], row[5], row[6]}; !slices.Equal(have, want) {
			t.Errorf("history row %d = %q, want VERSION KIND STATE ATTEMPT WORKER %q", i+1, row, want)
		}
		if e := got.Events[i]; row[1] != fmtTime(e.At) || row[4] != map[bool]string{true: "-", false: fmtAge(e.StateMS)}[e.Kind == subjects.EventCollected] {
			t.Errorf("history row %d = %q, want TIME %s and IN_STATE of %dms", i+1, row, fmtTime(e.At), e.StateMS)
		}
	}
	for i, want := range []string{"-", "-", "upstream said 429", "-", "-", "-"} {
		if have := strings.Join(rows[i+1][8:], " "); have != want {
			t.Errorf("history row %d's ERROR %q, want %q (on one line)", i+1, have, want)
		}
	}
	if rows[2][7] != first.LeaseID || rows[4][7] != second.LeaseID {
		t.Errorf("history: leases %s and %s, want %s and %s", rows[2][7], rows[4][7], first.LeaseID, second.LeaseID)
	}
	if got := field(t, parts[1], "Failures"); got != "1" {
		t.Errorf("history: Failures = %q, want 1", got)
	}
	if spent := field(t, parts[1], "Time in state"); !strings.HasPrefix(spent, "pending ") ||
		!strings.Contains(spent, ", running ") || !strings.Contains(spent, ", completed ") {
		t.Errorf("history: Time in state = %q", spent)
	}
	if !strings.HasSuffix(out, "\n(collected)\n") {
		t.Errorf("history of a collected message does not end with (collected):\n%s", out)
	}

	// --limit: the first events, and that there are more.
	got = jsonOf[subjects.HistoryReply](t, cli(t, url, "history", "hist", "h1", "--limit", "2", "--json"))
	if len(got.Events) != 2 || !got.Truncated || got.Events[1].Kind != subjects.EventLeased {
		t.Fatalf("history --limit 2 --json: %+v", got)
	}
	if out := cli(t, url, "history", "hist", "h1", "--limit", "2").ok(t); !strings.Contains(out, "\n… more events") {
		t.Fatalf("history --limit 2:\n%s", out)
	}

	// h2, running: its last state is current, and it is not collected.
	dequeueOne(t, url, "hist", "--worker", "w3")
	waitUntil(t, "h2's history has its lease", func(ctx context.Context) (bool, error) {
		h, err := client.History(ctx, "hist", "h2", 0)
		return len(h.Events) == 2, err
	})
	got = jsonOf[subjects.HistoryReply](t, cli(t, url, "history", "hist", "h2", "--json"))
	if len(got.Events) != 2 || got.Collected || got.Failures != 0 || !got.Events[1].Current || got.Events[0].Current ||
		got.Events[1].Worker != "w3" || got.Events[1].State != subjects.StateRunning {
		t.Fatalf("history of a running message: %+v", got)
	}
	out = cli(t, url, "history", "hist", "h2").ok(t)
	rows = tableRows(sections(out)[0])
	if len(rows) != 3 || !strings.HasSuffix(strings.Join(rows[2], " "), " so far 1/3 w3 "+got.Events[1].LeaseID+" -") ||
		strings.Contains(out, "(collected)") || strings.Contains(out, "(no later event") {
		t.Fatalf("history of a running message:\n%s", out)
	}
	// Its queue deleted: its last state ended, when is not known.
	cli(t, url, "queue", "rm", "hist").ok(t)
	out = cli(t, url, "history", "hist", "h2").ok(t)
	if rows = tableRows(sections(out)[0]); len(rows) != 3 || !strings.HasSuffix(strings.Join(rows[2], " "), "running - 1/3 w3 "+got.Events[1].LeaseID+" -") {
		t.Fatalf("history of a running message whose queue was deleted:\n%s", out)
	}
	if !strings.HasSuffix(out, "\n(no later event: its queue was deleted since, which publishes none, or its last event was lost)\n") {
		t.Errorf("history of a message whose queue was deleted does not say so at its end:\n%s", out)
	}

	r := cli(t, url, "history", "hist", "nope")
	r.fails(t, exitNotFound, "natstone: message_not_found: ")
	if r.stdout != "" {
		t.Errorf("history of an unknown message printed %q", r.stdout)
	}
	cli(t, url, "history", "nope", "h1").fails(t, exitNotFound, "_not_found: ")
}

func TestCLIObserveUsage(t *testing.T) {
	t.Parallel()
	// No broker: a command line that got past its checks would exit 5, not 2.
	const server = "nats://127.0.0.1:1"
	for _, tc := range []struct {
		args []string
		want string
	}{
		{[]string{"stats"}, "missing arguments"},
		{[]string{"stats", "q", "x"}, `unexpected argument "x"`},
		{[]string{"stats", "q", "--expiring-within", "-1s"}, "--expiring-within must be 1ms to 24h"},
		{[]string{"stats", "q", "--expiring-within", "25h"}, "--expiring-within must be 1ms to 24h"},
		{[]string{"stats", "q", "--expiring-within", "soon"}, "invalid value"},
		{[]string{"stats", "q", "--expiring-limit", "0"}, "--expiring-limit must be 1 to 1000"},
		{[]string{"stats", "q", "--expiring-limit", "1001"}, "--expiring-limit must be 1 to 1000"},
		{[]string{"stats", "q", "--filter", "novalue"}, "want key=value"},
		{[]string{"stats", "q", "--limit", "1"}, "flag provided but not defined: --limit"},
		{[]string{"messages"}, "missing arguments"},
		{[]string{"messages", "q", "x"}, `unexpected argument "x"`},
		{[]string{"messages", "q", "--state", "done"}, `--state must be one of invisible, pending, running, completed, canceled, errored, not "done"`},
		{[]string{"messages", "q", "--limit", "0"}, "--limit must be 1 to 1000"},
		{[]string{"messages", "q", "--limit", "1001"}, "--limit must be 1 to 1000"},
		{[]string{"messages", "q", "--filter", "=v"}, "want key=value"},
		{[]string{"history", "q"}, "missing arguments"},
		{[]string{"history", "q", "id", "x"}, `unexpected argument "x"`},
		{[]string{"history", "q", "id", "--limit", "0"}, "--limit must be 1 to 10000"},
		{[]string{"history", "q", "id", "--limit", "10001"}, "--limit must be 1 to 10000"},
		{[]string{"history", "q", "id", "--state", "pending"}, "flag provided but not defined: --state"},
		{[]string{"dequeue", "q", "--worker", strings.Repeat("w", subjects.MaxWorkerLen+1)}, "--worker must be at most 128 bytes"},
		{[]string{"dequeue", "q", "--worker", "w\x01"}, "--worker must be at most 128 bytes of printable UTF-8"},
	} {
		r := runCLI(t, cliOpts{}, append(tc.args, "--server", server)...)
		if r.code != exitUsage || !strings.Contains(r.stderr, tc.want) || r.stdout != "" {
			t.Errorf("natstone %s: exit %d, stdout %q, stderr %q; want exit 2 with %q and no output",
				strings.Join(tc.args, " "), r.code, r.stdout, r.stderr, tc.want)
		}
	}

	// Help lists the commands after depth, and each command's flags.
	out := runCLI(t, cliOpts{}, "help").ok(t)
	var names []string
	for _, row := range tableRows(out) {
		names = append(names, row[0])
	}
	if i := slices.Index(names, "depth"); i < 0 || i+4 > len(names) || !slices.Equal(names[i:i+4], []string{"depth", "stats", "messages", "history"}) {
		t.Errorf("help lists %q, want stats, messages and history after depth", names)
	}
	for cmd, flags := range map[string][]string{
		"stats":    {"--filter key=value", "--expiring-within", "--expiring-limit n", "--json"},
		"messages": {"--state state", "--filter key=value", "--limit n", "--json"},
		"history":  {"--limit n", "--json", "3  not found"},
		"dequeue":  {"--worker name"},
	} {
		out := runCLI(t, cliOpts{}, "help", cmd).ok(t)
		for _, f := range flags {
			if !strings.Contains(out, f) {
				t.Errorf("help %s has no %q:\n%s", cmd, f, out)
			}
		}
	}
}

func TestFmtAgeAndRate(t *testing.T) {
	t.Parallel()
	for ms, want := range map[int64]string{
		0: "0s", 312: "312ms", 12_345: "12.3s", 59_960: "1m", 192_400: "3m12s", 26*3_600_000 + 5*60_000 + 29_000: "26h5m",
		486*86_400_000 + 18*3_600_000 + 3*60_000 + 55_000: "486d18h4m", 3 * 86_400_000: "3d", 2*86_400_000 + 30_000: "2d1m", 2*86_400_000 + 3*3_600_000: "2d3h",
		2*86_400_000 - 30_000: "2d",
	} {
		if got := fmtAge(ms); got != want {
			t.Errorf("fmtAge(%d) = %q, want %q", ms, got, want)
		}
	}
	for r, want := range map[float64]string{0: "0", 2.5: "2.5", 1.0 / 60: "0.02", 0.001: "<0.01", 1234.5678: "1234.57"} {
		if got := fmtRate(r); got != want {
			t.Errorf("fmtRate(%v) = %q, want %q", r, got, want)
		}
	}
}
