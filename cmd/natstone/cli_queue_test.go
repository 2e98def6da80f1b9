package main

import (
	"slices"
	"strconv"
	"strings"
	"testing"

	"github.com/natstone/natstone/subjects"
)

func TestCLIQueueLifecycle(t *testing.T) {
	t.Parallel()
	url := startNatstone(t)

	out := cli(t, url, "queue", "create", "encode", "--key", "project", "--lease", "1m",
		"--max-attempts", "3", "--retention", "0s", "--max-payload", "1024", "--max-metadata", "4", "--max-running", "5").ok(t)
	for label, want := range map[string]string{
		"Name": "encode", "Type": "exclusive", "Exclusivity key": "project", "Running per value": "1 at most", "Default lease": "1m",
		"Max attempts": "3", "Retention": "0s", "Max payload": "1024 bytes", "Max metadata": "4 pairs",
		"Max running": "5", "Enqueue blocked": "no",
	} {
		if got := field(t, out, label); got != want {
			t.Errorf("create: %s = %q, want %q", label, got, want)
		}
	}

	// The same config again returns the queue; another one is queue_exists.
	var info subjects.QueueInfo
	r := cli(t, url, "queue", "create", "encode", "--json", "--type", "exclusive", "--key", "project",
		"--lease", "1m", "--max-attempts", "3", "--retention", "0s", "--max-payload", "1024", "--max-metadata", "4", "--max-running", "5")
	r.ok(t)
	r.decode(t, &info)
	want := subjects.QueueConfig{Type: subjects.Exclusive, ExclusivityKey: "project", LeaseMS: 60000,
		MaxAttempts: 3, RetentionMS: 0, MaxPayloadBytes: 1024, MaxMetadataPairs: 4, MaxRunning: 5, MaxRunningPerValue: 1}
	if info.Name != "encode" || info.Config != want || strconv.FormatUint(info.Revision, 10) != field(t, out, "Revision") {
		t.Fatalf("create again: %+v, want config %+v at the revision of the first create", info, want)
	}
	cli(t, url, "queue", "create", "encode", "--lease", "2m").fails(t, exitError, "natstone: queue_exists: ")
	pairs := cli(t, url, "queue", "create", "pairs", "--key", "project", "--max-running-per-value", "2").ok(t)
	if got := field(t, pairs, "Running per value"); got != "2 at most" {
		t.Errorf("create --max-running-per-value 2: Running per value = %q", got)
	}
	if got := field(t, cli(t, url, "queue", "update", "pairs", "--max-running-per-value", "3").ok(t), "Running per value"); got != "3 at most" {
		t.Errorf("update --max-running-per-value 3: Running per value = %q", got)
	}
	cli(t, url, "queue", "create", "solo", "--max-running-per-value", "2").fails(t, exitError, "natstone: invalid_config: ")
	cli(t, url, "queue", "rm", "pairs").ok(t)
	cli(t, url, "queue", "create", "simple").ok(t)

	// ls: a table sorted by name, and the list reply.
	rows := tableRows(cli(t, url, "queue", "ls").ok(t))
	wantRows := [][]string{
		{"NAME", "TYPE", "PENDING", "RUNNING", "INVISIBLE", "COMPLETED", "CANCELED", "ERRORED"},
		{"encode", "exclusive", "0", "0", "0", "0", "0", "0"},
		{"simple", "simple", "0", "0", "0", "0", "0", "0"},
	}
	if !slices.EqualFunc(rows, wantRows, slices.Equal) {
		t.Fatalf("ls rows = %q, want %q", rows, wantRows)
	}
	cli(t, url, "enqueue", "simple", "x").ok(t)
	var list subjects.ListReply
	r = cli(t, url, "queue", "ls", "--json")
	r.ok(t)
	r.decode(t, &list)
	if len(list.Queues) != 2 || list.Queues[0].Name != "encode" || list.Queues[1].Name != "simple" ||
		list.Queues[1].Counts.Pending != 1 || list.Queues[1].Config.Type != subjects.Simple {
		t.Fatalf("ls --json = %+v", list)
	}

	// info, update, update with a stale revision.
	out = cli(t, url, "queue", "info", "simple").ok(t)
	if got := field(t, out, "Messages"); !strings.HasPrefix(got, "pending 1,") {
		t.Fatalf("info: Messages = %q", got)
	}
	r = cli(t, url, "queue", "info", "simple", "--json")
	r.ok(t)
	r.decode(t, &info)
	rev := info.Revision
	r = cli(t, url, "queue", "update", "simple", "--json", "--revision", strconv.FormatUint(rev, 10), "--lease", "2m",
		"--invisible", "5s", "--block-enqueue", "--block-dequeue", "--max-running", "010")
	r.ok(t)
	r.decode(t, &info)
	if c := info.Config; c.LeaseMS != 120000 || c.InvisibleMS != 5000 || !c.EnqueueBlocked || !c.DequeueBlocked || c.MaxRunning != 10 || info.Revision <= rev {
		t.Fatalf("update: %+v, want max_running 10 (integers are decimal: 010 is ten)", info)
	}
	cli(t, url, "queue", "update", "simple", "--max-running", "0x10").fails(t, exitUsage, `invalid value "0x10" for flag --max-running: not a whole number in decimal`)
	cli(t, url, "enqueue", "simple", "z", "--priority", "9223372036854775808").fails(t, exitUsage, "for flag --priority: out of range")
	cli(t, url, "queue", "update", "simple", "--revision", strconv.FormatUint(rev, 10), "--unblock-enqueue").fails(t, exitError, "natstone: revision_mismatch: ")
	cli(t, url, "enqueue", "simple", "y").fails(t, exitError, "natstone: queue_blocked: ")
	out = cli(t, url, "queue", "update", "simple", "--unblock-enqueue").ok(t)
	if field(t, out, "Enqueue blocked") != "no" || field(t, out, "Dequeue blocked") != "yes" || field(t, out, "Revision") == strconv.FormatUint(info.Revision, 10) {
		t.Fatalf("update --unblock-enqueue:\n%s", out)
	}
	cli(t, url, "queue", "update", "simple").fails(t, exitUsage, "nothing to update")
	// An update's lease is a setting, not a request for the default: 0 is out of range there.
	cli(t, url, "queue", "update", "simple", "--lease", "0").fails(t, exitUsage, `invalid value "0" for flag --lease: must be 100ms to 24h`)
	cli(t, url, "queue", "update", "simple", "--lease", "50ms").fails(t, exitUsage, "must be 100ms to 24h\n")
	// --revision alone checks the revision and changes nothing.
	var before, same subjects.QueueInfo
	r = cli(t, url, "queue", "info", "simple", "--json")
	r.ok(t)
	r.decode(t, &before)
	cli(t, url, "queue", "update", "simple", "--revision", strconv.FormatUint(rev, 10)).fails(t, exitError, "natstone: revision_mismatch: ")
	r = cli(t, url, "queue", "update", "simple", "--json", "--revision", strconv.FormatUint(before.Revision, 10))
	r.ok(t)
	r.decode(t, &same)
	if same.Revision != before.Revision || same.Config != before.Config {
		t.Fatalf("update --revision alone changed the queue: %+v, was %+v", same, before)
	}
	cli(t, url, "queue", "update", "simple", "--block-enqueue", "--unblock-enqueue").fails(t, exitUsage, "not both")

	// rm says what it deleted; then the queue is not found.
	if out := cli(t, url, "queue", "rm", "simple").ok(t); out != "deleted queue simple with 1 message\n" {
		t.Fatalf("rm: %q", out)
	}
	var del subjects.DeleteReply
	r = cli(t, url, "queue", "rm", "encode", "--json")
	r.ok(t)
	r.decode(t, &del)
	if del != (subjects.DeleteReply{Name: "encode"}) {
		t.Fatalf("rm --json: %+v", del)
	}
	cli(t, url, "queue", "info", "simple").fails(t, exitNotFound, "natstone: queue_not_found: ")
	cli(t, url, "queue", "rm", "simple").fails(t, exitNotFound, "natstone: queue_not_found: ")
	r = cli(t, url, "queue", "ls", "--json")
	r.ok(t)
	if strings.TrimSpace(r.stdout) != "{\n  \"queues\": []\n}" {
		t.Fatalf("ls --json of no queues: %q", r.stdout)
	}
}

func TestCLIQueueUsage(t *testing.T) {
	t.Parallel()
	for _, tc := range []struct {
		args []string
		code int
		want string // in stderr, or in stdout for help
	}{
		{[]string{"queue"}, exitUsage, "missing command"},
		{[]string{"queue", "frob"}, exitUsage, `unknown command "frob": one of create, ls, info, update, rm`},
		{[]string{"frob"}, exitUsage, `unknown command "frob"`},
		{[]string{"queue", "-h"}, exitOK, "Usage: natstone queue <command>"},
		{[]string{"help", "queue"}, exitOK, "Exit codes:"},
		{[]string{"help", "queue", "create"}, exitOK, "--max-attempts"},
		{[]string{"help", "dequeue"}, exitOK, "4  nothing to dequeue"},
		{[]string{"queue", "create", "-h"}, exitOK, "--max-attempts"},
		{[]string{"queue", "create"}, exitUsage, "missing arguments"},
		{[]string{"queue", "create", "a", "b"}, exitUsage, `unexpected argument "b"`},
		{[]string{"queue", "create", "a", "--type", "fifo"}, exitUsage, "--type must be simple or exclusive"},
		{[]string{"queue", "ls", "--frob"}, exitUsage, "flag provided but not defined: --frob"},
		{[]string{"queue", "ls", "--timeout", "0s"}, exitUsage, "--timeout must be positive"},
		{[]string{"queue", "ls", "--timeout", "1"}, exitUsage, `invalid value "1" for flag --timeout: not a duration (e.g. 90s, 5m, 1h30m)`},
		{[]string{"help", "queue", "ls"}, exitOK, "--timeout duration\n"},
		{[]string{"enqueue", "q", "-x"}, exitUsage, `flag provided but not defined: --x (an argument that begins with "-" goes after "--")`},
		{[]string{"queue", "ls", "--prefix", "a..b"}, exitUsage, "--prefix"},
		{[]string{"queue", "ls", "--creds", "x", "--user", "u"}, exitUsage, "not both"},
		{[]string{"--json", "queue", "ls"}, exitUsage, "flag --json before the command: only the connection flags (--server, --context, --creds, --user, --password, --timeout, --prefix) go before it"},
		{[]string{"--server"}, exitUsage, "flag needs an argument: --server"},
		{[]string{"--server", "nats://127.0.0.1:1"}, exitUsage, "missing command after the connection flags"},
		{[]string{"--timeout", "0s", "queue", "ls"}, exitUsage, "--timeout must be positive"},
		{[]string{"--", "queue", "ls"}, exitUsage, `"--" before the command`},
		{[]string{"queue", "--json", "ls"}, exitUsage, "natstone queue: flag --json before the command"},
	} {
		r := runCLI(t, cliOpts{}, tc.args...)
		out := r.stderr
		if tc.code == exitOK {
			out = r.stdout // help, -h and "help" alike, for a pager
		} else if n := strings.Count(r.stderr, "\n"); n > 2 {
			t.Errorf("natstone %s: %d lines on stderr, want the error and where the help is:\n%s", strings.Join(tc.args, " "), n, r.stderr)
		}
		if r.code != tc.code || !strings.Contains(out, tc.want) {
			t.Errorf("natstone %s: exit %d, stdout %q, stderr %q; want exit %d with %q",
				strings.Join(tc.args, " "), r.code, r.stdout, r.stderr, tc.code, tc.want)
		}
	}
}
