package main

import (
	"slices"
	"strings"
	"testing"
	"time"

	"github.com/natstone/natstone/subjects"
)

// TestCLISchedule: schedule set, ls and rm; a schedule every second fires on the real clock, which
// a dequeue waiting for it sees.
func TestCLISchedule(t *testing.T) {
	t.Parallel()
	url := startNatstone(t)
	cli(t, url, "queue", "create", "q").ok(t)
	cli(t, url, "schedule", "set", "q", "tick").fails(t, exitUsage, "")
	cli(t, url, "schedule", "set", "q", "tick", "every second").fails(t, exitError, "natstone: invalid_schedule: ")
	cli(t, url, "schedule", "set", "q", "tick", "@every 1s", "p", "--file", "x").fails(t, exitUsage, "give PAYLOAD or --file, not both")
	cli(t, url, "schedule", "set", "q", "tick", "@every 1s", "--max-attempts", "0").fails(t, exitUsage, "--max-attempts must be 1 to 1000")
	cli(t, url, "schedule", "set", "q", "tick", "@every 1s", "--overlap", "never").fails(t, exitUsage, "--overlap must be allow or skip")
	cli(t, url, "schedule", "ls", "nope").fails(t, exitNotFound, "natstone: queue_not_found: ")

	rows := tableRows(cli(t, url, "schedule", "set", "q", "tick", "@every 1s", "hello", "--meta", "kind=tick", "--deadline-in", "1m").ok(t))
	if len(rows) != 2 || rows[1][0] != "tick" || rows[0][1] != "CRON" {
		t.Fatalf("schedule set: %q", rows)
	}
	info := jsonOf[subjects.ScheduleInfo](t, cli(t, url, "schedule", "set", "q", "tick", "@every 1s", "hello", "--meta", "kind=tick", "--deadline-in", "1m", "--json"))
	if info.Cron != "@every 1s" || info.DeadlineMS != 60_000 || info.Metadata["kind"] != "tick" || info.PayloadBytes != 5 {
		t.Fatalf("schedule set --json: %+v", info)
	}

	m := dequeueOne(t, url, "q", "--wait", "5s")
	if !strings.HasPrefix(m.ID, "tick@") || m.Payload == nil || *m.Payload != "hello" || m.Metadata["kind"] != "tick" {
		t.Fatalf("the fired message: %+v, want tick@…, payload hello, kind=tick", m)
	}
	// A second fire comes only once the first has stored its time: then ls shows at least that.
	dequeueOne(t, url, "q", "--wait", "5s")
	ls := jsonOf[subjects.SchedulesReply](t, cli(t, url, "schedule", "ls", "q", "--json"))
	if len(ls.Schedules) != 1 || ls.Schedules[0].LastAt == nil || ls.Schedules[0].LastID < m.ID {
		t.Fatalf("schedule ls --json: %+v, want tick, fired at %s or after", ls, m.ID)
	}
	if out := cli(t, url, "schedule", "ls", "q").ok(t); !strings.Contains(out, "tick@") {
		t.Fatalf("schedule ls: no fired id:\n%s", out)
	}
	cli(t, url, "schedule", "set", "other", "weekly", "@weekly").ok(t)
	every := jsonOf[subjects.SchedulesReply](t, cli(t, url, "schedule", "ls", "--json"))
	var names []string
	for _, s := range every.Schedules {
		names = append(names, s.Queue+"/"+s.Name)
	}
	if every.Queue != "" || !slices.Equal(names, []string{"other/weekly", "q/tick"}) {
		t.Fatalf("schedule ls without a queue: %q, %v; want every queue's, by queue", every.Queue, names)
	}
	if rows := tableRows(cli(t, url, "schedule", "ls").ok(t)); len(rows) != 3 || rows[0][0] != "QUEUE" || rows[1][0] != "other" {
		t.Fatalf("schedule ls without a queue: %q", rows)
	}
	// A schedule in a zone shows its next fire in that zone's wall time as well (Tokyo: no
	// clock changes, always 9 hours ahead of UTC).
	zoned := jsonOf[subjects.ScheduleInfo](t, cli(t, url, "schedule", "set", "tokyo", "nine", "CRON_TZ=Asia/Tokyo 0 9 * * *", "--json"))
	want := zoned.NextAt.UTC().Add(9*time.Hour).Format("2006-01-02") + " 09:00 JST)"
	if out := cli(t, url, "schedule", "ls", "tokyo").ok(t); !strings.Contains(out, zoned.NextAt.UTC().Format("T00:00:00.000Z (in ")) || !strings.Contains(out, "; "+want) {
		t.Fatalf("schedule ls of a schedule in Tokyo: no next fire at 00:00 UTC, %q:\n%s", want, out)
	}
	if out := cli(t, url, "schedule", "ls", "other").ok(t); strings.Contains(out, "; ") {
		t.Fatalf("schedule ls of a schedule in UTC: a zone's time:\n%s", out)
	}
	fromStdin := jsonOf[subjects.ScheduleInfo](t, runCLI(t, cliOpts{stdin: "from stdin"}, "schedule", "set", "q", "daily", "@daily", "--file", "-", "--json", "--server", url))
	if fromStdin.PayloadBytes != len("from stdin") {
		t.Fatalf("schedule set --file -: %+v, want the payload read from stdin", fromStdin)
	}
	// A PAYLOAD of "-" reads stdin too, as enqueue's does.
	dash := jsonOf[subjects.ScheduleInfo](t, runCLI(t, cliOpts{stdin: "also from stdin"}, "schedule", "set", "q", "daily", "@daily", "-", "--json", "--server", url))
	if dash.PayloadBytes != len("also from stdin") {
		t.Fatalf("schedule set with the PAYLOAD -: %+v, want the payload read from stdin", dash)
	}

	// With --overlap skip, fires while the first fire's message runs enqueue nothing: a dequeue
	// that waits over two fire times gets nothing, and ls counts them.
	cli(t, url, "schedule", "set", "solo", "tick", "@every 1s", "--overlap", "skip").ok(t)
	first := dequeueOne(t, url, "solo", "--wait", "5s", "--lease", "1m")
	cli(t, url, "dequeue", "solo", "--wait", "2500ms").fails(t, exitEmpty, "")
	solo := jsonOf[subjects.SchedulesReply](t, cli(t, url, "schedule", "ls", "solo", "--json")).Schedules[0]
	if solo.OverlapSkipped < 1 {
		t.Fatalf("schedule ls solo: %+v, want fires left out while %s runs", solo, first.ID)
	}
	if solo.Overlap != subjects.OverlapSkip || solo.LastID != first.ID {
		t.Fatalf("schedule ls solo: %+v, want overlap skip, last id %s", solo, first.ID)
	}
	if d := jsonOf[subjects.DepthReply](t, cli(t, url, "depth", "solo", "--json")); d.Counts.Running != 1 || d.Counts.Pending+d.Counts.Invisible != 0 {
		t.Fatalf("depth solo: %+v, want the first fire's message alone, running", d)
	}
	if out := cli(t, url, "schedule", "ls", "solo").ok(t); !strings.Contains(out, " OVERLAP ") || !strings.Contains(out, " skip (") {
		t.Fatalf("schedule ls solo: want an OVERLAP column with skip (n):\n%s", out)
	}

	// Paused, tick fires no more: a dequeue waiting over two of its times gets nothing, and ls
	// says so. Fired by hand, it enqueues at once, by the id given; resumed, it fires again.
	paused := jsonOf[subjects.ScheduleInfo](t, cli(t, url, "schedule", "pause", "q", "tick", "--note", "db migration", "--json"))
	if !paused.Paused || paused.Note != "db migration" || paused.PausedAt == nil {
		t.Fatalf("schedule pause --json: %+v", paused)
	}
	cli(t, url, "dequeue", "q", "--batch", "256") // takes the fires enqueued before the pause, if any
	cli(t, url, "dequeue", "q", "--wait", "2500ms").fails(t, exitEmpty, "")
	if out := cli(t, url, "schedule", "ls", "q").ok(t); !strings.Contains(out, "paused since ") || !strings.Contains(out, ": db migration") {
		t.Fatalf("schedule ls of a paused schedule: want paused since …: db migration:\n%s", out)
	}
	if out := cli(t, url, "schedule", "fire", "q", "tick", "--id", "by-hand").ok(t); !strings.Contains(out, "by-hand") {
		t.Fatalf("schedule fire: want the id it enqueued:\n%s", out)
	}
	if m := dequeueOne(t, url, "q"); m.ID != "by-hand" || m.Payload == nil || *m.Payload != "hello" {
		t.Fatalf("the message fired by hand: %+v", m)
	}
	resumed := jsonOf[subjects.ScheduleInfo](t, cli(t, url, "schedule", "resume", "q", "tick", "--json"))
	if resumed.Paused || resumed.Note != "" {
		t.Fatalf("schedule resume --json: %+v", resumed)
	}
	if m := dequeueOne(t, url, "q", "--wait", "5s"); !strings.HasPrefix(m.ID, "tick@") {
		t.Fatalf("after the resume: %+v, want a fire of tick", m)
	}
	cli(t, url, "schedule", "pause", "q", "nope").fails(t, exitNotFound, "natstone: schedule_not_found: ")
	cli(t, url, "schedule", "fire", "q", "nope").fails(t, exitNotFound, "natstone: schedule_not_found: ")
	cli(t, url, "schedule", "resume", "q").fails(t, exitUsage, "")

	if out := cli(t, url, "schedule", "rm", "q", "tick").ok(t); !strings.Contains(out, "removed schedule tick of q") {
		t.Fatalf("schedule rm: %s", out)
	}
	if out := cli(t, url, "schedule", "rm", "q", "tick").ok(t); !strings.Contains(out, "nothing to remove") {
		t.Fatalf("schedule rm again: %s", out)
	}
}

// TestPrintSchedulesInvalid: a schedule this broker cannot read (Invalid) shows why it never fires
// in NEXT, whatever else it says (paused, a zero next time).
func TestPrintSchedulesInvalid(t *testing.T) {
	t.Parallel()
	why := `natstone: invalid_schedule: cron "*-5 * * * *": field "*-5" has a range from "*"`
	var out strings.Builder
	printSchedules(&out, []subjects.ScheduleInfo{{Name: "s1", Cron: "*-5 * * * *", Overlap: subjects.OverlapAllow, Paused: true, Invalid: why}}, time.Now(), false)
	if !strings.Contains(out.String(), "never: "+why) || strings.Contains(out.String(), "paused") {
		t.Fatalf("schedule ls of an invalid schedule: want never: and why, not paused:\n%s", out.String())
	}
}
