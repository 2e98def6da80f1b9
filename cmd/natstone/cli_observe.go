package main

import (
	"context"
	"fmt"
	"io"
	"math"
	"slices"
	"strconv"
	"strings"
	"time"

	"github.com/natstone/natstone/subjects"
	"github.com/natstone/natstone/workers"
)

func runStats(ctx context.Context, args []string, stdout, stderr io.Writer) int {
	c := newClientCommand("natstone stats", "QUEUE [flags]", `
Shows QUEUE as it is now: its messages in each state, how long the oldest pending message has
waited, transitions per second over the last minute, totals since the broker started, and the
leases that expire within --expiring-within. With --filter the counts and the oldest pending age
are of the messages whose metadata has every pair; rates, totals and leases are the queue's.
--json prints the protocol's stats reply.
`, stdout, stderr)
	var filter pairsFlag
	c.fs.Var(&filter, "filter", "count only messages with metadata `key=value`, repeatable (all must match)")
	within := new(time.Duration)
	durationVar(c.fs, within, "expiring-within", subjects.DefaultExpiringWithin, "list the leases that expire within this long (at most 24h)")
	limit := integer(c, "expiring-limit", subjects.DefaultExpiringLimit, "list at most `n` expiring leases, the soonest first (1 to 1000)")
	pos, err := c.parse(args, 1, 1)
	if err != nil {
		return parseExit(err)
	}
	if *within < time.Millisecond || *within > subjects.MaxExpiringWithin {
		return parseExit(c.usageError("--expiring-within must be 1ms to %s, not %s", fmtDuration(subjects.MaxExpiringWithin), *within))
	}
	if *limit < 1 || *limit > subjects.MaxExpiringLimit {
		return parseExit(c.usageError("--expiring-limit must be 1 to %d, not %d", subjects.MaxExpiringLimit, *limit))
	}
	opts := &workers.StatsOpts{Filter: filter, ExpiringWithin: *within, ExpiringLimit: *limit}
	return c.run(ctx, func(ctx context.Context, conn *cliConn) error {
		r, err := conn.client.Stats(ctx, pos[0], opts)
		if err != nil {
			return err
		}
		if r.Expiring == nil {
			r.Expiring = []subjects.ExpiringLease{} // "expiring": [] rather than null
		}
		return c.output(r, func(w io.Writer) { printStats(w, &r, filter, *within, *limit) })
	})
}

func runMessages(ctx context.Context, args []string, stdout, stderr io.Writer) int {
	c := newClientCommand("natstone messages", "QUEUE [flags]", `
Lists the messages of QUEUE in one state, without their payloads and without changing them, in
that state's order: pending ones earliest deadline first, invisible ones by when they become
pending, running ones by lease expiry, finished ones by when they ended. When more matched than
--limit, a last line gives the --after that lists the next page. --json prints the protocol's
browse reply (its next is that --after).
`, stdout, stderr)
	state := c.fs.String("state", string(subjects.StatePending), "the `state` to list: invisible, pending, running, completed, canceled or errored")
	var filter pairsFlag
	c.fs.Var(&filter, "filter", "list only messages with metadata `key=value`, repeatable (all must match)")
	limit := integer(c, "limit", subjects.DefaultBrowseLimit, "list at most `n` messages (1 to 1000)")
	after := c.fs.String("after", "", "list the page after the one whose last line (or --json's next) gave this `cursor`")
	pos, err := c.parse(args, 1, 1)
	if err != nil {
		return parseExit(err)
	}
	st := subjects.State(*state)
	if !slices.Contains(subjects.States, st) {
		return parseExit(c.usageError("--state must be one of %s, not %q", joinStates(", "), *state))
	}
	if *limit < 1 || *limit > subjects.MaxBrowseLimit {
		return parseExit(c.usageError("--limit must be 1 to %d, not %d", subjects.MaxBrowseLimit, *limit))
	}
	opts := &workers.BrowseOpts{Filter: filter, Limit: *limit, After: *after}
	return c.run(ctx, func(ctx context.Context, conn *cliConn) error {
		msgs, next, err := conn.client.Browse(ctx, pos[0], st, opts)
		if err != nil {
			return err
		}
		r := subjects.BrowseReply{Queue: pos[0], State: st, Messages: wireMessages(msgs).Messages, More: next != "", Next: next}
		return c.output(r, func(w io.Writer) { printBrowse(w, st, msgs, next, time.Now()) })
	})
}

func runHistory(ctx context.Context, args []string, stdout, stderr io.Writer) int {
	c := newClientCommand("natstone history", "QUEUE ID [flags]", `
Shows the transitions of message ID in version order: when each happened, the state it entered
and how long the message stayed there, its attempts and who leased it; then the time it spent in
each state and how many attempts failed. It reads the broker's events, so it works after the
message was garbage-collected (it then says "(collected)"), for as long as the events are kept.
Exits 3 (message_not_found) when there is no event of ID. --json prints the protocol's history
reply.
`, stdout, stderr)
	limit := integer(c, "limit", 0, "show at most the first `n` events (1 to 10000; default 1000)")
	pos, err := c.parse(args, 2, 2)
	if err != nil {
		return parseExit(err)
	}
	if c.set()["limit"] && (*limit < 1 || *limit > subjects.MaxHistoryLimit) {
		return parseExit(c.usageError("--limit must be 1 to %d, not %d", subjects.MaxHistoryLimit, *limit))
	}
	return c.run(ctx, func(ctx context.Context, conn *cliConn) error {
		r, err := conn.client.History(ctx, pos[0], pos[1], *limit)
		if err != nil {
			return err
		}
		return c.output(r, func(w io.Writer) { printHistory(w, &r) })
	})
}

// printStats prints a stats reply: a listing of the queue's figures, then the expiring leases as a
// table. filter, within and limit are what was asked, which the reply does not repeat.
func printStats(w io.Writer, r *subjects.StatsReply, filter pairsFlag, within time.Duration, limit int) {
	tw := newTable(w)
	fmt.Fprintf(tw, "Queue:\t%s\n", r.Queue)
	if len(filter) > 0 {
		fmt.Fprintf(tw, "Filter:\t%s (messages and oldest pending only)\n", printable(fmtPairs(filter, " "), 0))
	}
	fmt.Fprintf(tw, "Messages:\t%s\n", fmtCounts(&r.Counts))
	oldest := "-"
	switch {
	case r.Counts.Pending == 0:
	case r.OldestPendingMS < 1000:
		oldest = "<1s"
	default:
		// Seconds: without a filter the broker counts from the second a message became pending.
		oldest = fmtAge(r.OldestPendingMS / 1000 * 1000)
	}
	fmt.Fprintf(tw, "Oldest pending:\t%s\n", oldest)
	rt := &r.Rates
	fmt.Fprintf(tw, "Rates:\tenqueued %s/s, dequeued %s/s, completed %s/s, errored %s/s (last minute)\n",
		fmtRate(rt.Enqueued), fmtRate(rt.Dequeued), fmtRate(rt.Completed), fmtRate(rt.Errored))
	t := &r.Totals
	fmt.Fprintf(tw, "Totals:\tenqueued %d, dequeued %d, completed %d, canceled %d, errored %d, released %d, expired %d, retried %d, rescheduled %d, collected %d (since the broker started)\n",
		t.Enqueued, t.Dequeued, t.Completed, t.Canceled, t.Errored, t.Released, t.Expired, t.Retried, t.Rescheduled, t.Collected)
	switch n := len(r.Expiring); {
	case n == 0:
		fmt.Fprintf(tw, "Expiring leases:\tnone within %s\n", fmtDuration(within))
	case n >= limit:
		fmt.Fprintf(tw, "Expiring leases:\t%d within %s, the soonest (there may be more than --expiring-limit %d)\n", n, fmtDuration(within), limit)
	default:
		fmt.Fprintf(tw, "Expiring leases:\t%d within %s\n", n, fmtDuration(within))
	}
	tw.Flush()
	if len(r.Expiring) == 0 {
		return
	}
	fmt.Fprintln(w)
	tw = newTable(w)
	fmt.Fprintln(tw, "ID\tLEASE\tEXPIRES\tATTEMPTS")
	for _, l := range r.Expiring {
		expires := "expired"
		if l.ExpiresInMS > 0 {
			expires = fmtAge(l.ExpiresInMS)
		}
		fmt.Fprintf(tw, "%s\t%s\t%s\t%d/%d\n", printable(l.ID, 0), l.LeaseID, expires, l.Attempts, l.MaxAttempts)
	}
	tw.Flush()
}

// printBrowse prints the messages of one state as a table whose time column fits the state: the
// lease and its time left for running messages, when they ended for finished ones, when they
// became (or become) pending otherwise.
func printBrowse(w io.Writer, state subjects.State, msgs []workers.Message, next string, now time.Time) {
	tw := newTable(w)
	switch {
	case state == subjects.StateRunning:
		fmt.Fprintln(tw, "ID\tSTATE\tPRIORITY\tATTEMPTS\tLEASE\tEXPIRES\tMETADATA")
	case state.Terminal():
		fmt.Fprintln(tw, "ID\tSTATE\tPRIORITY\tATTEMPTS\tENDED_AT\tMETADATA")
	default:
		fmt.Fprintln(tw, "ID\tSTATE\tPRIORITY\tATTEMPTS\tVISIBLE_AT\tMETADATA")
	}
	for i := range msgs {
		m := &msgs[i]
		var when string
		switch {
		case state == subjects.StateRunning:
			when = orDash(m.LeaseID) + "\t" + fmtExpires(m.LeaseExpiresAt, now)
		case state.Terminal():
			when = fmtTime(m.EndedAt)
		default:
			when = fmtTime(m.VisibleAt)
		}
		fmt.Fprintf(tw, "%s\t%s\t%d\t%s\t%s\t%s\n", printable(m.ID, 0), m.State, m.Priority, fmtAttempts(m), when,
			printable(fmtPairs(m.Metadata, ","), previewRunes))
	}
	tw.Flush()
	if next != "" {
		fmt.Fprintf(w, "… more %s messages: the next page with --after %s\n", state, next)
	}
}

// errorRunes bounds a release's error in the history table, on one line (--json has all of it).
const errorRunes = 120

// printHistory prints a history reply: a timeline of the events, then the time spent in each
// state, the failed attempts, and whether the message was collected.
func printHistory(w io.Writer, r *subjects.HistoryReply) {
	tw := newTable(w)
	fmt.Fprintln(tw, "VERSION\tTIME\tKIND\tSTATE\tIN_STATE\tATTEMPT\tWORKER\tLEASE\tERROR")
	for i := range r.Events {
		e := &r.Events[i]
		kind := string(e.Kind)
		switch {
		case e.Reason != "":
			kind += "(" + e.Reason + ")"
		case e.Kind == subjects.EventRescheduled && e.State == subjects.StateInvisible && e.VisibleAt != nil:
			kind += "(priority " + strconv.FormatInt(e.Priority, 10) + ", visible at " + fmtTime(*e.VisibleAt) + ")"
		case e.Kind == subjects.EventRescheduled:
			kind += "(priority " + strconv.FormatInt(e.Priority, 10) + ")"
		}
		inState := "-"
		switch {
		case e.Kind == subjects.EventCollected:
		case i == len(r.Events)-1 && !e.Current && !r.Truncated: // its queue deleted: when it ended is not known
		case e.Current:
			inState = fmtAge(e.StateMS) + " so far"
		default:
			inState = fmtAge(e.StateMS)
		}
		fmt.Fprintf(tw, "%d\t%s\t%s\t%s\t%s\t%d/%d\t%s\t%s\t%s\n", e.Version, fmtTime(e.At), kind, orDash(string(e.State)),
			inState, e.Attempts, e.MaxAttempts, printable(orDash(e.Worker), 0), orDash(e.LeaseID),
			printable(orDash(strings.Join(strings.Fields(e.Error), " ")), errorRunes))
	}
	tw.Flush()
	if r.Truncated {
		fmt.Fprintf(w, "… more events: raise --limit (at most %d)\n", subjects.MaxHistoryLimit)
	}
	fmt.Fprintln(w)
	var spent []string
	for _, s := range subjects.States {
		if ms, ok := r.StateMS[s]; ok {
			spent = append(spent, string(s)+" "+fmtAge(ms))
		}
	}
	tw = newTable(w)
	fmt.Fprintf(tw, "Time in state:\t%s\n", orDash(strings.Join(spent, ", ")))
	fmt.Fprintf(tw, "Failures:\t%d\n", r.Failures)
	tw.Flush()
	switch last := len(r.Events) - 1; {
	case r.Collected:
		fmt.Fprintln(w, "(collected)")
	case last >= 0 && !r.Events[last].Current && !r.Truncated:
		fmt.Fprintln(w, "(no later event: its queue was deleted since, which publishes none, or its last event was lost)")
	}
}

// fmtCounts prints the counts by state in the order of a message's life.
func fmtCounts(c *subjects.Counts) string {
	return fmt.Sprintf("pending %d, running %d, invisible %d, completed %d, canceled %d, errored %d",
		c.Pending, c.Running, c.Invisible, c.Completed, c.Canceled, c.Errored)
}

// fmtAge prints a duration in milliseconds as precisely as a person reads it: 312ms, 12.5s, 3m12s,
// 26h5m, and from two days on with days: 486d18h4m.
func fmtAge(ms int64) string { return fmtSpan(time.Duration(ms) * time.Millisecond) }

// fmtSpan is fmtAge of a time.Duration. (Not for what a flag reads back: its days are not Go's.)
func fmtSpan(d time.Duration) string {
	const day = 24 * time.Hour
	switch {
	case d < time.Second:
		return fmtDuration(d)
	case d < time.Minute:
		return fmtDuration(d.Round(time.Second / 10))
	case d < day:
		return fmtDuration(d.Round(time.Second))
	}
	d = d.Round(time.Minute) // before the choice: 47h59m30s is 2d, not 48h
	if d < 2*day {
		return fmtDuration(d)
	}
	days := fmt.Sprintf("%dd", d/day)
	if d%day == 0 {
		return days
	}
	return days + fmtDuration(d%day)
}

// fmtRate prints a rate per second to two decimals without trailing zeros: 2.5, 0.02, 0, and "<0.01"
// for a rate that is not zero but would print as 0.
func fmtRate(r float64) string {
	if r > 0 && r < 0.005 {
		return "<0.01"
	}
	return strconv.FormatFloat(math.Round(r*100)/100, 'f', -1, 64)
}

// joinStates lists the states for a usage message.
func joinStates(sep string) string {
	names := make([]string, len(subjects.States))
	for i, s := range subjects.States {
		names[i] = string(s)
	}
	return strings.Join(names, sep)
}
