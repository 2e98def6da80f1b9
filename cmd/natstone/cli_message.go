package main

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"os"
	"strings"
	"time"

	"github.com/nats-io/nats.go"
	"github.com/nats-io/nuid"
	"golang.org/x/term"

	"github.com/natstone/natstone/subjects"
	"github.com/natstone/natstone/workers"
)

// errNothingToDequeue is a dequeue that got no message. It exits with exitEmpty, so that
// "while natstone dequeue q; do …; done" ends when the queue has nothing more.
var errNothingToDequeue = errors.New("natstone: nothing to dequeue")

func runEnqueue(ctx context.Context, args []string, stdout, stderr io.Writer) int {
	c := newClientCommand("natstone enqueue", "QUEUE [PAYLOAD] [flags]\n       natstone enqueue QUEUE --import FILE.jsonl [flags]", `
Adds a message to QUEUE (creating the queue with the defaults unless the broker runs with
--no-auto-create) and prints its id, state, priority, when it is visible, and whether it was a
duplicate. The payload is PAYLOAD, else the content of --file, else stdin (also when PAYLOAD or
--file is "-").

With --import, reads JSON lines instead (- for stdin), one message per line in the protocol's
enqueue form: {"id", "priority", "payload" | "payload_base64", "metadata", "invisible_ms" |
"visible_at", "lease_ms", "max_attempts"}, all optional ("invisible_ms": 0 is pending at once,
"lease_ms": 0 the queue's lease, as in the protocol). They are sent in batches of up to 1000,
--in-flight at a time. The first line with an id is the one written, later ones are its
duplicates. Messages without a priority get the time the broker enqueues them (plus any
invisibility), so with several batches in flight their order may differ from the file's
(--in-flight 1 keeps it). A line that is not such an object, or that the broker refuses, is
reported with its number and skipped; the others are imported. Prints how many were enqueued, how
many were duplicates (an id that exists), and the failed lines; exits 1 if any line failed. With
stderr on a terminal it shows the progress.
`, stdout, stderr)
	file := c.fs.String("file", "", "read the payload from `file` (- for stdin)")
	id := c.fs.String("id", "", "message `id` for idempotency: an id that exists is a duplicate and writes nothing (default: the broker makes one)")
	priority := integer[int64](c, "priority", 0, "`priority`, lower is dequeued first (default: the time it can run in Unix ms, now or the end of its invisibility: FIFO by readiness)")
	deadline := c.fs.String("deadline", "", "the priority as a deadline: an RFC 3339 `time`, or a duration from now; the priority is its Unix ms")
	var meta pairsFlag
	c.fs.Var(&meta, "meta", "metadata `key=value` pair, repeatable (an exclusive queue needs its key)")
	invisible := c.duration("invisible", 0, time.Millisecond, subjects.MaxInvisible, "keep the message invisible this long before it is pending (default the queue's; 0: pending at once)")
	visibleAt := c.fs.String("visible-at", "", "keep the message invisible until this RFC 3339 `time`, by the broker's clock (one that has come: pending at once)")
	lease := c.duration("lease", 0, subjects.MinLease, subjects.MaxLease, "the message's lease when a dequeue does not ask for one (default the queue's)")
	maxAttempts := integer(c, "max-attempts", 0, "how many times this message may be leased, 1 to 1000 (default the queue's)")
	importFile := c.fs.String("import", "", "import JSON lines from `file` (- for stdin) instead of enqueueing one message")
	inFlight := integer(c, "in-flight", importInFlight, "with --import: send `n` batches at once; 1 enqueues the messages without a priority in the file's order")
	pos, err := c.parse(args, 1, 2)
	if err != nil {
		return parseExit(err)
	}
	given := c.set()
	if given["import"] {
		for _, name := range []string{"file", "id", "priority", "deadline", "meta", "invisible", "visible-at", "lease", "max-attempts"} {
			if given[name] {
				return parseExit(c.usageError("--import takes the attributes from each line: drop --%s", name))
			}
		}
		if len(pos) > 1 {
			return parseExit(c.usageError("--import takes no PAYLOAD argument"))
		}
		if *inFlight < 1 || *inFlight > maxInFlight {
			return parseExit(c.usageError("--in-flight must be 1 to %d, not %d", maxInFlight, *inFlight))
		}
		return runImport(ctx, c, pos[0], *importFile, *inFlight)
	}
	if given["in-flight"] {
		return parseExit(c.usageError("--in-flight needs --import"))
	}

	if given["id"] && *id == "" {
		// Most likely a variable that was not set: the enqueue would lose its idempotency.
		return parseExit(c.usageError("--id is empty: leave it out for the broker to make one"))
	}
	if given["max-attempts"] && (*maxAttempts < 1 || *maxAttempts > subjects.MaxAttemptsLimit) {
		return parseExit(c.usageError("--max-attempts must be 1 to %d, not %d", subjects.MaxAttemptsLimit, *maxAttempts))
	}
	opts := &workers.EnqueueOpts{ID: *id, Metadata: meta, Invisible: *invisible, Lease: *lease, MaxAttempts: *maxAttempts}
	if given["invisible"] && *invisible == 0 {
		opts.Invisible = -1 // as the protocol's invisible_ms 0: pending at once, whatever the queue's
	}
	if given["visible-at"] {
		if given["invisible"] {
			return parseExit(c.usageError("give --invisible or --visible-at, not both"))
		}
		if opts.VisibleAt, err = parseVisibleAt(*visibleAt); err != nil {
			return parseExit(c.usageError("%v", err))
		}
	}
	switch {
	case given["priority"] && given["deadline"]:
		return parseExit(c.usageError("give --priority or --deadline, not both"))
	case given["priority"]:
		opts.Priority = priority
	case given["deadline"]:
		if opts.Deadline, err = parseDeadline(*deadline, time.Now()); err != nil {
			return parseExit(c.usageError("%v", err))
		}
	}
	if len(pos) == 2 && given["file"] {
		return parseExit(c.usageError("give PAYLOAD or --file, not both"))
	}
	var payload []byte
	switch {
	case len(pos) == 2 && pos[1] != "-":
		payload = []byte(pos[1])
	case *file != "" && *file != "-":
		if payload, err = os.ReadFile(*file); err != nil {
			return c.fail(fmt.Errorf("reading the payload: %w", err), nil)
		}
	default:
		if isTerminal(os.Stdin) {
			fmt.Fprintln(stderr, "natstone enqueue: reading the payload from stdin (end it with Ctrl-D)")
		}
		if payload, err = io.ReadAll(os.Stdin); err != nil {
			return c.fail(fmt.Errorf("reading the payload from stdin: %w", err), nil)
		}
	}
	return c.run(ctx, func(ctx context.Context, conn *cliConn) error {
		r, err := conn.client.Enqueue(ctx, pos[0], payload, opts)
		if err != nil {
			return err
		}
		return c.output(r, func(w io.Writer) { printEnqueued(w, []subjects.EnqueueReply{r}) })
	})
}

func runDequeue(ctx context.Context, args []string, stdout, stderr io.Writer) int {
	c := newClientCommand("natstone dequeue", "QUEUE [flags]", `
Leases up to --batch pending messages of QUEUE, most urgent (lowest priority) first, and prints
them with their lease ids: give one to complete, extend, release or cancel. With --wait it waits
that long for a first message if none is pending. Exits 4 when it got no message, and 1, 3 or 5
on an error: a shell loop should tell them apart (docs/cli.md has one that does). --json prints
the protocol's reply, {"messages": [...]}.
`, stdout, stderr)
	batch := integer(c, "batch", 1, "lease up to `n` messages (1 to 256)")
	lease := c.duration("lease", 0, subjects.MinLease, subjects.MaxLease, "lease duration (default each message's, else the queue's)")
	wait := c.duration("wait", 0, time.Millisecond, subjects.MaxWait, "wait up to this long for a first message (at most 5m)")
	var filter pairsFlag
	c.fs.Var(&filter, "filter", "lease only messages with metadata `key=value`, repeatable (all must match)")
	requestID := c.fs.String("request-id", "", "makes the dequeue retry-safe: a retry with the same `id` within 5 minutes returns the same leases (with --wait, one is made up if not given: an interrupted wait is abandoned at the broker with it)")
	worker := c.fs.String("worker", "", "who dequeues: the `name` the leased events carry (natstone history shows it)")
	pos, err := c.parse(args, 1, 1)
	if err != nil {
		return parseExit(err)
	}
	if *batch < 1 || *batch > subjects.MaxDequeueBatch {
		return parseExit(c.usageError("--batch must be 1 to %d, not %d", subjects.MaxDequeueBatch, *batch))
	}
	if err := subjects.ValidateRequestID(*requestID); err != nil {
		return parseExit(c.usageError("--request-id must be at most %d bytes of printable UTF-8", subjects.MaxRequestIDLen))
	}
	if err := subjects.ValidateWorker(*worker); err != nil {
		return parseExit(c.usageError("--worker must be at most %d bytes of printable UTF-8", subjects.MaxWorkerLen))
	}
	if c.set()["request-id"] && *requestID == "" {
		return parseExit(c.usageError("--request-id is empty: leave it out, or give one to retry with"))
	}
	if *requestID == "" && *wait > 0 {
		// A long poll interrupted here goes on at the broker, which may lease a message to it that
		// nobody then holds: with an id, the poll can be abandoned (or, failing that, the user can
		// take that lease back).
		*requestID = nuid.Next()
	}
	opts := &workers.DequeueOpts{Batch: *batch, Lease: *lease, Wait: *wait, Filter: filter, RequestID: *requestID, Worker: *worker}
	return c.run(ctx, func(ctx context.Context, conn *cliConn) error {
		msgs, err := dequeueAcrossCuts(ctx, conn.client, pos[0], opts)
		if err != nil {
			if ctx.Err() != nil && *wait > 0 {
				abandonPoll(ctx, stderr, conn.client, pos[0], *requestID, *wait)
				return errTold{err} // what the abandon said is the whole story
			}
			if *wait > 0 && errors.Is(err, nats.ErrTimeout) { // a cut too (workers.ErrPollCut)
				fmt.Fprintf(stderr, "natstone dequeue: what the wait leased is unknown: natstone dequeue %s --request-id %s --wait %v returns it while its lease holds (within 5 minutes)\n", pos[0], *requestID, *wait)
			}
			return err
		}
		if err := c.output(wireMessages(msgs), func(w io.Writer) {
			if len(msgs) > 0 {
				printMessages(w, msgs, time.Now(), true)
			}
		}); err != nil {
			return err
		}
		if len(msgs) == 0 {
			return fmt.Errorf("%w from %s", errNothingToDequeue, pos[0])
		}
		return nil
	})
}

// dequeueAcrossCuts is Dequeue, sent again with its request id, for what is left of its wait, when
// a reconnect cuts it (workers.ErrPollCut): the broker it waited at may be gone with its NATS
// server, and sent again it gets whatever the first leased. Until the wait's end, a try after a cut
// that finds no broker (the NATS server back, its broker not serving yet) is made again every
// noBrokerRetry, and one cut again is sent again: it fails at the maxPollCuts-th cut.
func dequeueAcrossCuts(ctx context.Context, client *workers.Client, queue string, opts *workers.DequeueOpts) ([]workers.Message, error) {
	until := time.Now().Add(opts.Wait)
	msgs, err := client.Dequeue(ctx, queue, opts)
	for cuts := 1; errors.Is(err, workers.ErrPollCut) && cuts < maxPollCuts; cuts++ {
		cut := err
		for {
			opts.Wait = max(time.Until(until), time.Millisecond)
			msgs, err = client.Dequeue(ctx, queue, opts)
			if !errors.Is(err, nats.ErrNoResponders) {
				break
			}
			err = fmt.Errorf("%w, after %w", err, cut) // what the cut try leased is still unknown
			if time.Until(until) < noBrokerRetry {
				return nil, err
			}
			select {
			case <-time.After(noBrokerRetry):
			case <-ctx.Done():
				return nil, err
			}
		}
	}
	return msgs, err
}

// Bounds of dequeueAcrossCuts.
const (
	maxPollCuts   = 10
	noBrokerRetry = 250 * time.Millisecond
)

// abandonPoll abandons the long poll of queue with request id id that the user interrupted, so that
// the broker's wait, which goes on, leases nothing (and gives back what it leased already); if the
// abandon fails, it tells how to take back a lease that wait may make.
func abandonPoll(ctx context.Context, stderr io.Writer, client *workers.Client, queue, id string, wait time.Duration) {
	ctx, cancel := context.WithTimeout(context.WithoutCancel(ctx), 2*time.Second)
	defer cancel()
	released, err := client.Abandon(ctx, queue, id)
	switch {
	case err != nil:
		fmt.Fprintf(stderr, "natstone dequeue: interrupted, and the abandon of the broker's wait was not confirmed (%v): should it not have landed, the wait goes on, and a message it leases before the wait ends reaches nobody, which the broker gives back once it hears so (else when its lease runs out); natstone dequeue %s --request-id %s --wait %v returns that lease while it holds (within 5 minutes; it answers once the wait is over)\n", err, queue, id, wait)
	case len(released) > 0:
		fmt.Fprintf(stderr, "natstone dequeue: interrupted: the broker's wait was abandoned, and the messages it had leased are pending again: %s\n", strings.Join(released, ", "))
	default:
		fmt.Fprintf(stderr, "natstone dequeue: interrupted: the broker's wait was abandoned; it leased nothing\n")
	}
}

// runLeaseOp is complete, extend, release and cancel: an operation on one message that replies
// with the message.
func runLeaseOp(ctx context.Context, c *clientCommand, args []string, minArgs int,
	op func(ctx context.Context, client *workers.Client, queue, id, leaseID string) (workers.Message, error)) int {
	pos, err := c.parse(args, minArgs, 3)
	if err != nil {
		return parseExit(err)
	}
	leaseID := ""
	if len(pos) == 3 {
		leaseID = pos[2]
	}
	return c.run(ctx, func(ctx context.Context, conn *cliConn) error {
		m, err := op(ctx, conn.client, pos[0], pos[1], leaseID)
		if err != nil {
			return err
		}
		return c.output(wireMessage(&m), func(w io.Writer) { printMessages(w, []workers.Message{m}, time.Now(), false) })
	})
}

func runComplete(ctx context.Context, args []string, stdout, stderr io.Writer) int {
	c := newClientCommand("natstone complete", "QUEUE ID LEASE [flags]", `
Completes message ID, leased as LEASE (the lease id a dequeue printed). Completing it again with
the same lease succeeds. A stale lease fails with lease_mismatch or lease_expired.
`, stdout, stderr)
	return runLeaseOp(ctx, c, args, 3, func(ctx context.Context, cl *workers.Client, q, id, lease string) (workers.Message, error) {
		return cl.Complete(ctx, q, id, lease)
	})
}

func runExtend(ctx context.Context, args []string, stdout, stderr io.Writer) int {
	c := newClientCommand("natstone extend", "QUEUE ID LEASE [flags]", `
Extends lease LEASE of message ID: it then ends --lease from now.
`, stdout, stderr)
	lease := c.duration("lease", 0, subjects.MinLease, subjects.MaxLease, "the lease ends this long from now (default the message's own lease, else the queue's)")
	return runLeaseOp(ctx, c, args, 3, func(ctx context.Context, cl *workers.Client, q, id, leaseID string) (workers.Message, error) {
		return cl.Extend(ctx, q, id, leaseID, *lease)
	})
}

func runRelease(ctx context.Context, args []string, stdout, stderr io.Writer) int {
	c := newClientCommand("natstone release", "QUEUE ID LEASE [flags]", `
Gives message ID, leased as LEASE, back to the queue: pending at once, or invisible for --delay.
The attempt stays spent (unless --refund); a message with no attempt left is errored. --error says
why the attempt failed: history shows it.
`, stdout, stderr)
	delay := c.duration("delay", 0, time.Millisecond, subjects.MaxInvisible, "keep the message invisible this long before it is pending again")
	failure := c.fs.String("error", "", "why the attempt failed, kept in the message's history (at most 1024 bytes)")
	refund := c.fs.Bool("refund", false, "give the attempt back: the message was never run")
	return runLeaseOp(ctx, c, args, 3, func(ctx context.Context, cl *workers.Client, q, id, leaseID string) (workers.Message, error) {
		return cl.Release(ctx, q, id, leaseID, &workers.ReleaseOpts{Delay: *delay, Error: *failure, Refund: *refund})
	})
}

func runCancel(ctx context.Context, args []string, stdout, stderr io.Writer) int {
	c := newClientCommand("natstone cancel", "QUEUE ID [LEASE] [flags]\n       natstone cancel QUEUE --state STATE [flags]", `
Cancels message ID unless it is finished. With LEASE it is the lease holder's cancel, which fails
like complete when the lease is stale; without it, it is an operator's, unconditional unless
--version is given: then only while the message is at that version (revision_mismatch if it
changed since). --error says why: the message's history shows it. Canceling a canceled message
succeeds.

With --state instead of ID, cancels the queue's messages in that state (pending, invisible or
running; those with every --filter pair), at most --limit of them, in the order messages lists
them, each at the version it had when listed: one that changed meanwhile (leased, say), or was
collected, is skipped and named. Canceling running messages ends their leases: their holders
learn it at their next extend or complete. A last line says when more were left, for the command
to be run again. --json prints {"canceled": [ids], "skipped": [{"id", "code", "error"}], "more": bool}.
`, stdout, stderr)
	version := integer[uint64](c, "version", 0, "cancel only while the message is at this `version` (see get)")
	state := c.fs.String("state", "", "cancel the queue's messages in this `state` (pending, invisible or running) instead of message ID")
	var filter pairsFlag
	c.fs.Var(&filter, "filter", "with --state: only messages with metadata `key=value`, repeatable (all must match)")
	limit := integer(c, "limit", subjects.MaxBrowseLimit, "with --state: cancel at most `n` messages (1 to 1000)")
	why := c.fs.String("error", "", "why: the canceled event carries this `text` (history shows it; at most 1024 bytes)")
	pos, err := c.parse(args, 1, 3)
	if err != nil {
		return parseExit(err)
	}
	given := c.set()
	listed := subjects.State(*state)
	switch {
	case given["state"] && len(pos) != 1:
		return parseExit(c.usageError("--state takes no ID"))
	case given["state"] && given["version"]:
		return parseExit(c.usageError("--state takes no --version: each message is canceled at the version it was listed with"))
	case given["state"] && listed != subjects.StatePending && listed != subjects.StateInvisible && listed != subjects.StateRunning:
		return parseExit(c.usageError("--state must be pending, invisible or running, not %q", *state))
	case !given["state"] && len(pos) < 2:
		return parseExit(c.usageError("give the message's ID, or --state"))
	case !given["state"] && (given["filter"] || given["limit"]):
		return parseExit(c.usageError("--filter and --limit go with --state"))
	case *limit < 1 || *limit > subjects.MaxBrowseLimit:
		return parseExit(c.usageError("--limit must be 1 to %d, not %d", subjects.MaxBrowseLimit, *limit))
	case len(pos) == 3 && given["version"]:
		return parseExit(c.usageError("give LEASE or --version, not both: the lease fences a holder's cancel"))
	case given["version"] && *version == 0:
		return parseExit(c.usageError("--version must be a message's version, 1 or more"))
	}
	if given["state"] {
		return c.run(ctx, func(ctx context.Context, conn *cliConn) error {
			sum := &bulkSummary{verb: "canceled", listed: listed}
			return c.bulk(ctx, conn, pos[0], filter, *limit, sum, func(m *workers.Message) (workers.Message, error) {
				return conn.client.CancelWith(ctx, pos[0], m.ID, "", &workers.CancelOpts{Version: m.Version, Error: *why})
			})
		})
	}
	return c.run(ctx, func(ctx context.Context, conn *cliConn) error {
		lease := ""
		if len(pos) == 3 {
			lease = pos[2]
		}
		m, err := conn.client.CancelWith(ctx, pos[0], pos[1], lease, &workers.CancelOpts{Version: *version, Error: *why})
		if err != nil {
			return err
		}
		return c.output(wireMessage(&m), func(w io.Writer) { printMessages(w, []workers.Message{m}, time.Now(), false) })
	})
}

func runGet(ctx context.Context, args []string, stdout, stderr io.Writer) int {
	c := newClientCommand("natstone get", "QUEUE ID [flags]", `
Shows message ID of QUEUE with its payload, in any state until it is garbage-collected.
`, stdout, stderr)
	pos, err := c.parse(args, 2, 2)
	if err != nil {
		return parseExit(err)
	}
	return c.run(ctx, func(ctx context.Context, conn *cliConn) error {
		m, err := conn.client.Get(ctx, pos[0], pos[1])
		if err != nil {
			return err
		}
		return c.output(wireMessage(&m), func(w io.Writer) { printMessage(w, &m, time.Now()) })
	})
}

func runDepth(ctx context.Context, args []string, stdout, stderr io.Writer) int {
	c := newClientCommand("natstone depth", "QUEUE [flags]", `
Counts the messages of QUEUE in each state; with --filter only those whose metadata has every
pair. --json prints the protocol's reply, {"queue": ..., "counts": {...}}.
`, stdout, stderr)
	var filter pairsFlag
	c.fs.Var(&filter, "filter", "count only messages with metadata `key=value`, repeatable (all must match)")
	pos, err := c.parse(args, 1, 1)
	if err != nil {
		return parseExit(err)
	}
	return c.run(ctx, func(ctx context.Context, conn *cliConn) error {
		counts, err := conn.client.Depth(ctx, pos[0], filter)
		if err != nil {
			return err
		}
		return c.output(subjects.DepthReply{Queue: pos[0], Counts: counts}, func(w io.Writer) { printDepth(w, pos[0], counts) })
	})
}

// isTerminal reports whether f is a terminal: not a pipe, a file, or /dev/null (a character device
// too, which a job run by cron or CI is given as its stdin).
func isTerminal(f *os.File) bool {
	rc, err := f.SyscallConn() // not f.Fd(), which would set the file blocking
	if err != nil {
		return false
	}
	tty := false
	_ = rc.Control(func(fd uintptr) { tty = term.IsTerminal(int(fd)) })
	return tty
}

// quoteLines is for messages that list line numbers: "3, 17, 2001".
func quoteLines(lines []int, limit int) string {
	var parts []string
	for i, l := range lines {
		if i == limit {
			parts = append(parts, fmt.Sprintf("… (%d more)", len(lines)-limit))
			break
		}
		parts = append(parts, fmt.Sprint(l))
	}
	return strings.Join(parts, ", ")
}

func runRetry(ctx context.Context, args []string, stdout, stderr io.Writer) int {
	c := newClientCommand("natstone retry", "QUEUE ID [flags]\n       natstone retry QUEUE --errored [flags]", `
Retries message ID, errored or canceled: it is pending again (or invisible for --delay) with its
attempts anew, and keeps its id, payload, metadata and history. With --version, a finished message
is retried only at that version (revision_mismatch if it finished again since). A message that is
not finished is left as it is (the command succeeds); a completed one is not retried
(invalid_state).

With --errored instead of ID, retries the queue's errored messages (those with every --filter
pair), at most --limit of them, those that errored first first, each at the version it had when
listed: one that changed meanwhile, or was collected, is skipped and named. A last line says when
more were left, for the command to be run again. --json prints {"retried": [ids], "skipped": [{"id",
"code", "error"}], "more": bool}.
`, stdout, stderr)
	version := integer[uint64](c, "version", 0, "retry only while the message is at this `version` (see get)")
	delay := c.duration("delay", 0, time.Millisecond, subjects.MaxInvisible, "keep the message invisible this long before it is pending again")
	errored := c.fs.Bool("errored", false, "retry the queue's errored messages instead of message ID")
	var filter pairsFlag
	c.fs.Var(&filter, "filter", "with --errored: only messages with metadata `key=value`, repeatable (all must match)")
	limit := integer(c, "limit", subjects.MaxBrowseLimit, "with --errored: retry at most `n` messages (1 to 1000)")
	pos, err := c.parse(args, 1, 2)
	if err != nil {
		return parseExit(err)
	}
	given := c.set()
	switch {
	case *errored && len(pos) != 1:
		return parseExit(c.usageError("--errored takes no ID"))
	case *errored && given["version"]:
		return parseExit(c.usageError("--errored takes no --version: each message is retried at the version it was listed with"))
	case !*errored && len(pos) != 2:
		return parseExit(c.usageError("give the message's ID, or --errored"))
	case !*errored && (given["filter"] || given["limit"]):
		return parseExit(c.usageError("--filter and --limit go with --errored"))
	case *limit < 1 || *limit > subjects.MaxBrowseLimit:
		return parseExit(c.usageError("--limit must be 1 to %d, not %d", subjects.MaxBrowseLimit, *limit))
	}
	if !*errored {
		return c.run(ctx, func(ctx context.Context, conn *cliConn) error {
			m, err := conn.client.Retry(ctx, pos[0], pos[1], &workers.RetryOpts{Version: *version, Delay: *delay})
			if err != nil {
				return err
			}
			return c.output(wireMessage(&m), func(w io.Writer) { printMessages(w, []workers.Message{m}, time.Now(), false) })
		})
	}
	return c.run(ctx, func(ctx context.Context, conn *cliConn) error {
		sum := &bulkSummary{verb: "retried", listed: subjects.StateErrored}
		return c.bulk(ctx, conn, pos[0], filter, *limit, sum, func(m *workers.Message) (workers.Message, error) {
			return conn.client.Retry(ctx, pos[0], m.ID, &workers.RetryOpts{Version: m.Version, Delay: *delay})
		})
	})
}

func runReschedule(ctx context.Context, args []string, stdout, stderr io.Writer) int {
	c := newClientCommand("natstone reschedule", "QUEUE ID [flags]", `
Changes the plan for message ID while it waits to run (pending or invisible): its priority (with
--priority or --deadline), when it becomes pending (--delay from now, or --visible-at an RFC 3339
time; --delay 0, or a time that has come, makes an invisible message pending at once), or both.
With --version, only while the message is at that version
(revision_mismatch if it changed since). A message already as asked is left as it is (the command
succeeds, writing nothing). A running or finished message is not rescheduled (invalid_state).
`, stdout, stderr)
	version := integer[uint64](c, "version", 0, "reschedule only while the message is at this `version` (see get)")
	priority := integer[int64](c, "priority", 0, "the new `priority`, lower is dequeued first")
	deadline := c.fs.String("deadline", "", "the new priority as a deadline: an RFC 3339 `time`, or a duration from now; the priority is its Unix ms")
	delay := c.duration("delay", 0, time.Millisecond, subjects.MaxInvisible, "make the message pending this long from now (0: at once)")
	visibleAt := c.fs.String("visible-at", "", "make the message pending at this RFC 3339 `time`, by the broker's clock (one that has come: at once)")
	pos, err := c.parse(args, 2, 2)
	if err != nil {
		return parseExit(err)
	}
	given := c.set()
	opts := workers.RescheduleOpts{Version: *version}
	if given["visible-at"] {
		if opts.VisibleAt, err = parseVisibleAt(*visibleAt); err != nil {
			return parseExit(c.usageError("%v", err))
		}
	}
	switch {
	case given["priority"] && given["deadline"]:
		return parseExit(c.usageError("give --priority or --deadline, not both"))
	case given["delay"] && given["visible-at"]:
		return parseExit(c.usageError("give --delay or --visible-at, not both"))
	case !given["priority"] && !given["deadline"] && !given["delay"] && !given["visible-at"]:
		return parseExit(c.usageError("give --priority, --deadline, --delay or --visible-at"))
	case given["priority"]:
		opts.Priority = priority
	case given["deadline"]:
		if opts.Deadline, err = parseDeadline(*deadline, time.Now()); err != nil {
			return parseExit(c.usageError("%v", err))
		}
	}
	if given["delay"] {
		opts.Delay = delay
	}
	return c.run(ctx, func(ctx context.Context, conn *cliConn) error {
		m, err := conn.client.Reschedule(ctx, pos[0], pos[1], opts)
		if err != nil {
			return err
		}
		return c.output(wireMessage(&m), func(w io.Writer) { printRescheduled(w, &m) })
	})
}

// parseVisibleAt reads a --visible-at: an RFC 3339 time, strictly, as the broker reads visible_at.
func parseVisibleAt(s string) (time.Time, error) {
	var at time.Time
	if err := at.UnmarshalText([]byte(s)); err != nil {
		return time.Time{}, fmt.Errorf("--visible-at must be an RFC 3339 time (2026-11-28T09:00:00Z), not %q", s)
	}
	return givenTime(at), nil
}

// givenTime is a visible_at a user gave, for a Client's VisibleAt: the zero time
// (0001-01-01T00:00:00Z), which a Client takes for none, comes back one nanosecond later, a time
// that has come all the same.
func givenTime(at time.Time) time.Time {
	if at.IsZero() {
		return at.Add(time.Nanosecond)
	}
	return at
}

// bulk lists up to limit messages of sum.listed in queue (those with every filter pair), in their
// order, and calls act on each, which acts at the version listed; then prints sum. A message that
// changed meanwhile (act's error says so, or its reply is not of the version after the one
// listed: another client's write, which the broker answers alike when it left the message as
// that write had it), or was collected, is skipped and named. Any other error ends the run,
// after printing what was done.
func (c *clientCommand) bulk(ctx context.Context, conn *cliConn, queue string, filter pairsFlag, limit int,
	sum *bulkSummary, act func(m *workers.Message) (workers.Message, error)) error {
	msgs, next, err := conn.client.Browse(ctx, queue, sum.listed, &workers.BrowseOpts{Filter: filter, Limit: limit})
	if err != nil {
		return err
	}
	sum.Done, sum.Skipped, sum.More = []string{}, []bulkSkip{}, next != ""
	for i := range msgs {
		m := &msgs[i]
		r, err := act(m)
		var apiErr *workers.APIError
		switch {
		case err == nil && r.Version != m.Version+1:
			sum.Skipped = append(sum.Skipped, bulkSkip{ID: m.ID, Code: subjects.CodeRevisionMismatch,
				Error: fmt.Sprintf("not %s any more: %s at version %d since it was listed at version %d", sum.listed, r.State, r.Version, m.Version)})
		case err == nil:
			sum.Done = append(sum.Done, m.ID)
		case errors.As(err, &apiErr) && (apiErr.Code == subjects.CodeRevisionMismatch ||
			apiErr.Code == subjects.CodeMessageNotFound || apiErr.Code == subjects.CodeInvalidState):
			sum.Skipped = append(sum.Skipped, bulkSkip{ID: m.ID, Code: apiErr.Code, Error: err.Error()})
		default:
			// Storage or the broker failed: say what was done before failing with it.
			_ = c.output(sum, sum.print)
			return err
		}
	}
	return c.output(sum, sum.print)
}

// bulkSummary is what a command run on a listing of messages did (retry --errored, cancel
// --state): in JSON {verb: [ids], "skipped": [{"id", "code", "error"}], "more": bool}.
type bulkSummary struct {
	verb    string         // what was done to each: "retried", "canceled"
	listed  subjects.State // the state listed
	Done    []string
	Skipped []bulkSkip
	More    bool
}

// bulkSkip is a message that was listed but not acted on: Code is revision_mismatch (it changed
// since it was listed), message_not_found (collected) or invalid_state (it ended otherwise).
type bulkSkip struct {
	ID    string        `json:"id"`
	Code  subjects.Code `json:"code"`
	Error string        `json:"error"`
}

func (s *bulkSummary) MarshalJSON() ([]byte, error) {
	done, err := json.Marshal(s.Done)
	if err != nil {
		return nil, err
	}
	skipped, err := json.Marshal(s.Skipped)
	if err != nil {
		return nil, err
	}
	return fmt.Appendf(nil, `{%q:%s,"skipped":%s,"more":%t}`, s.verb, done, skipped, s.More), nil
}

func (s *bulkSummary) print(w io.Writer) {
	fmt.Fprintf(w, "%s %d %s messages\n", s.verb, len(s.Done), s.listed)
	for _, k := range s.Skipped {
		fmt.Fprintf(w, "skipped %s: %s\n", printable(k.ID, 0), k.Error)
	}
	if s.More {
		fmt.Fprintf(w, "… more %s messages: run it again\n", s.listed)
	}
}
