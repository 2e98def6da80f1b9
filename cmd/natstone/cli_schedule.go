package main

import (
	"context"
	"errors"
	"fmt"
	"io"
	"os"
	"time"

	"github.com/natstone/natstone/subjects"
	"github.com/natstone/natstone/workers"
)

// scheduleCommands are the subcommands of "natstone schedule".
var scheduleCommands = []command{
	{name: "set", summary: "create or replace a recurring enqueue (cron)", run: runScheduleSet},
	{name: "ls", summary: "list a queue's schedules with their next and last fires", run: runScheduleList},
	{name: "rm", summary: "remove a schedule", run: runScheduleRemove},
	{name: "pause", summary: "stop a schedule's fires until it is resumed", run: runSchedulePause},
	{name: "resume", summary: "let a paused schedule fire again, from its next time", run: runScheduleResume},
	{name: "fire", summary: "fire a schedule now, out of its times", run: runScheduleFire},
}

// runSchedule is "natstone schedule": it dispatches to a subcommand.
func runSchedule(ctx context.Context, args []string, stdout, stderr io.Writer) int {
	return runGroup(ctx, "schedule", scheduleCommands, args, stdout, stderr)
}

func runScheduleSet(ctx context.Context, args []string, stdout, stderr io.Writer) int {
	c := newClientCommand("natstone schedule set", "QUEUE NAME CRON [PAYLOAD] [flags]", `
Creates the schedule NAME of QUEUE, or replaces it, and prints it. At every time of CRON the broker
enqueues a message with the payload, metadata, lease and max attempts given here, the id
NAME@<fire time, RFC 3339 UTC> (so a fire sent again after a failover is a duplicate), and the
priority fire time + --deadline-in, in Unix ms. CRON is five fields (minute hour day-of-month month
day-of-week: "*/15 9-17 * * 1-5"), or @hourly, @daily, @weekly, @monthly, @yearly, or
"@every 90s"; in UTC unless it starts with CRON_TZ=<IANA zone>. The same schedule set again writes
nothing. The payload is PAYLOAD, else the content of --file, else empty; stdin when PAYLOAD or
--file is "-". With --overlap skip, a fire enqueues nothing while the message of the last fire is
still pending, invisible or running (ls counts such times in OVERLAP), so a job slower than its
schedule, or workers down for a while, never piles up fires.
`, stdout, stderr)
	file := c.fs.String("file", "", "read the payload from `file` (- for stdin)")
	var meta pairsFlag
	c.fs.Var(&meta, "meta", "metadata `key=value` pair, repeatable (an exclusive queue needs its key)")
	deadline := c.duration("deadline-in", 0, time.Millisecond, subjects.MaxScheduleDeadline, "each message's priority is its fire time plus this")
	lease := c.duration("lease", 0, subjects.MinLease, subjects.MaxLease, "each message's lease when a dequeue does not ask for one (default the queue's)")
	maxAttempts := integer(c, "max-attempts", 0, "how many times each message may be leased, 1 to 1000 (default the queue's)")
	overlap := c.fs.String("overlap", string(subjects.OverlapAllow), "while the last fire's message is not finished, a fire enqueues (allow) or not (skip)")
	pos, err := c.parse(args, 3, 4)
	if err != nil {
		return parseExit(err)
	}
	given := c.set()
	if given["max-attempts"] && (*maxAttempts < 1 || *maxAttempts > subjects.MaxAttemptsLimit) {
		return parseExit(c.usageError("--max-attempts must be 1 to %d, not %d", subjects.MaxAttemptsLimit, *maxAttempts))
	}
	if o := subjects.Overlap(*overlap); o != subjects.OverlapAllow && o != subjects.OverlapSkip {
		return parseExit(c.usageError("--overlap must be %s or %s, not %q", subjects.OverlapAllow, subjects.OverlapSkip, *overlap))
	}
	opts := workers.ScheduleOpts{Cron: pos[2], Metadata: meta, Deadline: *deadline, Lease: *lease, MaxAttempts: *maxAttempts, Overlap: subjects.Overlap(*overlap)}
	switch {
	case len(pos) == 4 && given["file"]:
		return parseExit(c.usageError("give PAYLOAD or --file, not both"))
	case len(pos) == 4 && pos[3] != "-":
		opts.Payload = []byte(pos[3])
	case len(pos) == 4 || *file == "-":
		if opts.Payload, err = io.ReadAll(os.Stdin); err != nil {
			return c.fail(fmt.Errorf("reading the payload from stdin: %w", err), nil)
		}
	case given["file"]:
		if opts.Payload, err = os.ReadFile(*file); err != nil {
			return c.fail(fmt.Errorf("reading the payload: %w", err), nil)
		}
	}
	return c.run(ctx, func(ctx context.Context, conn *cliConn) error {
		info, err := conn.client.Schedule(ctx, pos[0], pos[1], opts)
		if err != nil {
			return err
		}
		return c.outputSchedule(info)
	})
}

func runScheduleList(ctx context.Context, args []string, stdout, stderr io.Writer) int {
	c := newClientCommand("natstone schedule ls", "[QUEUE] [flags]", `
Lists the schedules of QUEUE (of every queue without QUEUE) by queue and name: when each fires
next, its last fire and the id it enqueued,
or why that fire enqueued nothing (the queue blocked, or its config no longer takes the message),
how many fire times passed while no broker served (SKIPPED: a starting broker fires only the
last), and its overlap policy with the fire times it left out (OVERLAP: "skip (3)").
--json prints the protocol's reply, {"queue", "schedules": [...]} (without QUEUE, {"queue": "",
"schedules": [...]}, each with its queue).
`, stdout, stderr)
	pos, err := c.parse(args, 0, 1)
	if err != nil {
		return parseExit(err)
	}
	return c.run(ctx, func(ctx context.Context, conn *cliConn) error {
		var queues []string
		if len(pos) == 1 {
			queues = pos
		} else {
			infos, err := conn.client.Queues(ctx)
			if err != nil {
				return err
			}
			for _, q := range infos {
				queues = append(queues, q.Name)
			}
		}
		all := []subjects.ScheduleInfo{}
		for _, q := range queues {
			some, err := conn.client.Schedules(ctx, q)
			if errors.Is(err, workers.ErrQueueNotFound) && len(pos) == 0 {
				continue // deleted since the list
			}
			if err != nil {
				return err
			}
			all = append(all, some...)
		}
		reply := subjects.SchedulesReply{Schedules: all}
		if len(pos) == 1 {
			reply.Queue = pos[0]
		}
		return c.output(reply, func(w io.Writer) { printSchedules(w, all, time.Now(), len(pos) == 0) })
	})
}

func runScheduleRemove(ctx context.Context, args []string, stdout, stderr io.Writer) int {
	c := newClientCommand("natstone schedule rm", "QUEUE NAME [flags]", `
Removes the schedule NAME of QUEUE: it fires no more. The messages it enqueued stay. Removing a
schedule that does not exist succeeds, and says so.
`, stdout, stderr)
	pos, err := c.parse(args, 2, 2)
	if err != nil {
		return parseExit(err)
	}
	return c.run(ctx, func(ctx context.Context, conn *cliConn) error {
		removed, err := conn.client.Unschedule(ctx, pos[0], pos[1])
		if err != nil {
			return err
		}
		return c.output(subjects.UnscheduleReply{Queue: pos[0], Name: pos[1], Removed: removed}, func(w io.Writer) {
			if removed {
				fmt.Fprintf(w, "removed schedule %s of %s\n", pos[1], pos[0])
			} else {
				fmt.Fprintf(w, "no schedule %s in %s: nothing to remove\n", pos[1], pos[0])
			}
		})
	})
}

func runSchedulePause(ctx context.Context, args []string, stdout, stderr io.Writer) int {
	c := newClientCommand("natstone schedule pause", "QUEUE NAME [flags]", `
Pauses the schedule NAME of QUEUE and prints it: it fires at none of its times until it is resumed
(schedule resume), and the times that pass meanwhile are not fired later; schedule fire still
fires it by hand. --note says why, to whoever lists the schedules. Pausing a paused schedule
changes only its note, and keeps it without --note.
`, stdout, stderr)
	return c.setPaused(ctx, args, true)
}

func runScheduleResume(ctx context.Context, args []string, stdout, stderr io.Writer) int {
	c := newClientCommand("natstone schedule resume", "QUEUE NAME [flags]", `
Resumes the paused schedule NAME of QUEUE and prints it: it fires next at its first time after
now. The times that passed while it was paused are not fired. --note replaces the pause's note;
without it the note is cleared. Resuming a schedule that is not paused changes only its note, and
keeps it without --note.
`, stdout, stderr)
	return c.setPaused(ctx, args, false)
}

// setPaused runs schedule pause (pause) or schedule resume.
func (c *clientCommand) setPaused(ctx context.Context, args []string, pause bool) int {
	note := c.fs.String("note", "", fmt.Sprintf("why, for whoever lists the schedules (at most %d bytes, one line)", subjects.MaxNoteLen))
	pos, err := c.parse(args, 2, 2)
	if err != nil {
		return parseExit(err)
	}
	return c.run(ctx, func(ctx context.Context, conn *cliConn) error {
		set := conn.client.ResumeSchedule
		if pause {
			set = conn.client.PauseSchedule
		}
		info, err := set(ctx, pos[0], pos[1], *note)
		if err != nil {
			return err
		}
		return c.outputSchedule(info)
	})
}

func runScheduleFire(ctx context.Context, args []string, stdout, stderr io.Writer) int {
	c := newClientCommand("natstone schedule fire", "QUEUE NAME [flags]", `
Fires the schedule NAME of QUEUE now, paused or not, and prints it: it enqueues the schedule's
message with the priority now + its deadline and the id --id, else NAME@<now, to the ms>. A
fire sent again with the same --id enqueues nothing more, so give one to retry safely. A schedule
with --overlap skip refuses to fire while the message of its last fire is not finished.
`, stdout, stderr)
	id := c.fs.String("id", "", "the message's id (default NAME@<now, RFC 3339 UTC to the millisecond>)")
	pos, err := c.parse(args, 2, 2)
	if err != nil {
		return parseExit(err)
	}
	if c.set()["id"] && *id == "" {
		// Most likely a variable that was not set: a retry of the fire would enqueue again.
		return parseExit(c.usageError("--id is empty: leave it out for NAME@<now>"))
	}
	return c.run(ctx, func(ctx context.Context, conn *cliConn) error {
		info, err := conn.client.FireSchedule(ctx, pos[0], pos[1], *id)
		if err != nil {
			return err
		}
		return c.outputSchedule(info)
	})
}

// printSchedules prints schedules as a table, with a QUEUE column when withQueue.
func printSchedules(w io.Writer, all []subjects.ScheduleInfo, now time.Time, withQueue bool) {
	tw := newTable(w)
	if withQueue {
		fmt.Fprint(tw, "QUEUE\t")
	}
	fmt.Fprintln(tw, "NAME\tCRON\tNEXT\tLAST\tLAST ID OR ERROR\tSKIPPED\tOVERLAP\tDEADLINE\tMETADATA")
	for _, s := range all {
		if withQueue {
			fmt.Fprint(tw, s.Queue+"\t")
		}
		last, what := "-", "-"
		if s.LastAt != nil {
			last = fmtTime(*s.LastAt)
			what = s.LastID
			if s.LastError != "" {
				what = "error: " + string(s.LastErrorCode) + ": " + printable(s.LastError, 80)
			}
		}
		overlap := string(s.Overlap)
		if s.OverlapSkipped > 0 {
			overlap = fmt.Sprintf("%s (%d)", s.Overlap, s.OverlapSkipped)
		}
		next := fmt.Sprintf("%s (in %s%s)", fmtTime(s.NextAt), fmtSpan(max(s.NextAt.Sub(now), 0).Round(time.Second)), inZone(s.Cron, s.NextAt))
		if s.Paused {
			next = "paused"
			if s.PausedAt != nil {
				next += " since " + fmtTime(*s.PausedAt)
			}
			if s.Note != "" {
				next += ": " + printable(s.Note, 60)
			}
		}
		if s.Invalid != "" {
			next = "never: " + printable(s.Invalid, 120)
		}
		fmt.Fprintf(tw, "%s\t%s\t%s\t%s\t%s\t%d\t%s\t%s\t%s\n", s.Name, printable(s.Cron, 60), next,
			last, what, s.Skipped, overlap, fmtMS(s.DeadlineMS), printable(fmtPairs(s.Metadata, ","), 80))
	}
	tw.Flush()
}

// inZone returns t as the wall time of cron's zone, after "; ", for a cron with a zone other than
// UTC (CRON_TZ=Europe/Paris: "; 2026-11-28 02:00 CET"), or "".
func inZone(cron string, t time.Time) string {
	zone, _, zoned := subjects.CronZone(cron)
	if !zoned || t.IsZero() {
		return ""
	}
	loc, err := time.LoadLocation(zone)
	if err != nil {
		return ""
	}
	if name, offset := t.In(loc).Zone(); name == "UTC" && offset == 0 { // UTC, Etc/UTC, Zulu…
		return ""
	}
	return "; " + t.In(loc).Format("2006-01-02 15:04 MST")
}

// outputSchedule prints one schedule as schedule ls does, or as JSON with --json.
func (c *clientCommand) outputSchedule(info subjects.ScheduleInfo) error {
	return c.output(info, func(w io.Writer) { printSchedules(w, []subjects.ScheduleInfo{info}, time.Now(), false) })
}
