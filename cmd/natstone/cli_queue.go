package main

import (
	"context"
	"fmt"
	"io"
	"strings"
	"time"

	"github.com/natstone/natstone/subjects"
	"github.com/natstone/natstone/workers"
)

// queueCommands are the subcommands of "natstone queue".
var queueCommands = []command{
	{name: "create", summary: "create a queue (again with the same config: returns it)", run: runQueueCreate},
	{name: "ls", summary: "list the queues with their message counts", run: runQueueList},
	{name: "info", summary: "show a queue's config, revision and message counts", run: runQueueInfo},
	{name: "update", summary: "change a queue's config, block or unblock it", run: runQueueUpdate},
	{name: "rm", summary: "delete a queue with all its messages", run: runQueueDelete},
}

// runQueue is "natstone queue": it dispatches to a subcommand.
func runQueue(ctx context.Context, args []string, stdout, stderr io.Writer) int {
	return runGroup(ctx, "queue", queueCommands, args, stdout, stderr)
}

// runGroup is "natstone <group>", a command of commands (queue, schedule): it dispatches args to
// the one args[0] names.
func runGroup(ctx context.Context, group string, cmds []command, args []string, stdout, stderr io.Writer) int {
	names := make([]string, len(cmds))
	for i, c := range cmds {
		names[i] = c.name
	}
	if len(args) == 0 {
		reportUsage(stderr, "natstone "+group, "missing command: one of "+strings.Join(names, ", "))
		return exitUsage
	}
	switch args[0] {
	case "-h", "-help", "--help", "help":
		groupUsage(stdout, group, cmds)
		return exitOK
	}
	if strings.HasPrefix(args[0], "-") { // "natstone queue --server URL ls"
		name, rest, problem := connFlagsFirst(args)
		if problem != "" {
			reportUsage(stderr, "natstone "+group, problem)
			return exitUsage
		}
		args = append([]string{name}, rest...)
	}
	for _, c := range cmds {
		if c.name == args[0] {
			return c.run(ctx, args[1:], stdout, stderr)
		}
	}
	reportUsage(stderr, "natstone "+group, fmt.Sprintf("unknown command %q: one of %s", args[0], strings.Join(names, ", ")))
	return exitUsage
}

func groupUsage(w io.Writer, group string, cmds []command) {
	fmt.Fprintf(w, "Usage: natstone %s <command> [flags]\n\nCommands:\n", group)
	for _, c := range cmds {
		fmt.Fprintf(w, "  %-7s %s\n", c.name, c.summary)
	}
	fmt.Fprintf(w, "\nRun \"natstone %s <command> -h\" for the flags of a command.\n", group)
	fmt.Fprint(w, exitCodesHelp)
}

func runQueueCreate(ctx context.Context, args []string, stdout, stderr io.Writer) int {
	c := newClientCommand("natstone queue create", "NAME [flags]", `
Creates the queue NAME and prints it. Creating a queue that exists with the same config returns it;
with a different config it fails with queue_exists. A flag not given takes the broker's default;
a 0 does too, except for --retention, where 0 collects finished messages at once.
`, stdout, stderr)
	typ := c.fs.String("type", string(subjects.Simple), "queue `type`: simple or exclusive")
	key := c.fs.String("key", "", "exclusivity `key`: the metadata key whose value may run once at a time, or --max-running-per-value times (implies --type exclusive)")
	lease := c.duration("lease", subjects.DefaultLease, subjects.MinLease, subjects.MaxLease, "lease of a dequeue that does not ask for one")
	invisible := c.duration("invisible", 0, time.Millisecond, subjects.MaxInvisible, "invisibility of an enqueue that does not ask for one")
	maxAttempts := integer(c, "max-attempts", subjects.DefaultMaxAttempts, "how many times a message may be dequeued")
	retention := c.duration("retention", subjects.DefaultRetention, 0, subjects.MaxRetention, "how long completed, canceled and errored messages are kept")
	maxPayload := integer(c, "max-payload", subjects.DefaultMaxPayloadBytes, "largest payload accepted, in `bytes`")
	maxMetadata := integer(c, "max-metadata", subjects.DefaultMaxMetadataPairs, "most metadata `pairs` per message")
	maxRunning := integer(c, "max-running", 0, "most messages running at once, whatever the workers (0: no limit)")
	perValue := integer(c, "max-running-per-value", 1, "an exclusive queue's most messages of one exclusivity value running at once")
	pos, err := c.parse(args, 1, 1)
	if err != nil {
		return parseExit(err)
	}
	given := c.set()
	opts := &workers.QueueOpts{Type: subjects.QueueType(*typ), ExclusivityKey: *key}
	switch {
	case opts.Type != subjects.Simple && opts.Type != subjects.Exclusive:
		return parseExit(c.usageError("--type must be simple or exclusive, not %q", *typ))
	case given["key"] && !given["type"]:
		opts.Type = subjects.Exclusive
	}
	if given["lease"] {
		opts.Lease = *lease
	}
	if given["invisible"] {
		opts.Invisible = *invisible
	}
	if given["max-attempts"] {
		opts.MaxAttempts = *maxAttempts
	}
	if given["retention"] {
		opts.Retention = retention
	}
	if given["max-payload"] {
		opts.MaxPayloadBytes = *maxPayload
	}
	if given["max-metadata"] {
		opts.MaxMetadataPairs = *maxMetadata
	}
	opts.MaxRunning = *maxRunning
	if given["max-running-per-value"] {
		opts.MaxRunningPerValue = *perValue
	}
	return c.run(ctx, func(ctx context.Context, conn *cliConn) error {
		info, err := conn.client.CreateQueue(ctx, pos[0], opts)
		if err != nil {
			return err
		}
		return c.output(info, func(w io.Writer) { printQueue(w, &info) })
	})
}

func runQueueList(ctx context.Context, args []string, stdout, stderr io.Writer) int {
	c := newClientCommand("natstone queue ls", "[flags]", `
Lists every queue, sorted by name, with its message counts. --json prints the protocol's list
reply: {"queues": [...]}.
`, stdout, stderr)
	if _, err := c.parse(args, 0, 0); err != nil {
		return parseExit(err)
	}
	return c.run(ctx, func(ctx context.Context, conn *cliConn) error {
		queues, err := conn.client.Queues(ctx)
		if err != nil {
			return err
		}
		if queues == nil {
			queues = []subjects.QueueInfo{}
		}
		return c.output(subjects.ListReply{Queues: queues}, func(w io.Writer) { printQueues(w, queues) })
	})
}

func runQueueInfo(ctx context.Context, args []string, stdout, stderr io.Writer) int {
	c := newClientCommand("natstone queue info", "NAME [flags]", `
Shows a queue's config, its revision (for "queue update --revision") and its message counts.
`, stdout, stderr)
	pos, err := c.parse(args, 1, 1)
	if err != nil {
		return parseExit(err)
	}
	return c.run(ctx, func(ctx context.Context, conn *cliConn) error {
		info, err := conn.client.Queue(ctx, pos[0])
		if err != nil {
			return err
		}
		return c.output(info, func(w io.Writer) { printQueue(w, &info) })
	})
}

func runQueueUpdate(ctx context.Context, args []string, stdout, stderr io.Writer) int {
	c := newClientCommand("natstone queue update", "NAME [flags]", `
Changes the settings given and prints the queue; the others keep their values. The type and the
exclusivity key cannot change. With --revision the update applies only if the config is still at
that revision (compare-and-swap), else it fails with revision_mismatch.
`, stdout, stderr)
	lease := c.settingDuration("lease", subjects.MinLease, subjects.MaxLease, "lease of a dequeue that does not ask for one")
	invisible := c.duration("invisible", 0, time.Millisecond, subjects.MaxInvisible, "invisibility of an enqueue that does not ask for one")
	maxAttempts := integer(c, "max-attempts", 0, "how many times a message may be dequeued")
	retention := c.duration("retention", 0, 0, subjects.MaxRetention, "how long completed, canceled and errored messages are kept (0: collect at once)")
	maxPayload := integer(c, "max-payload", 0, "largest payload accepted, in `bytes`")
	maxMetadata := integer(c, "max-metadata", 0, "most metadata `pairs` per message")
	maxRunning := integer(c, "max-running", 0, "most messages running at once (0: no limit)")
	perValue := integer(c, "max-running-per-value", 0, "an exclusive queue's most messages of one exclusivity value running at once")
	blockEnqueue := c.fs.Bool("block-enqueue", false, "refuse enqueues (queue_blocked)")
	unblockEnqueue := c.fs.Bool("unblock-enqueue", false, "accept enqueues again")
	blockDequeue := c.fs.Bool("block-dequeue", false, "refuse dequeues (queue_blocked)")
	unblockDequeue := c.fs.Bool("unblock-dequeue", false, "allow dequeues again")
	revision := integer[uint64](c, "revision", 0, "apply only if the config is at this `revision` (see queue info)")
	pos, err := c.parse(args, 1, 1)
	if err != nil {
		return parseExit(err)
	}
	given := c.set()
	u := &workers.QueueUpdate{Revision: *revision}
	durations := map[string]struct {
		v   *time.Duration
		dst **time.Duration
	}{
		"lease":     {lease, &u.Lease},
		"invisible": {invisible, &u.Invisible},
		"retention": {retention, &u.Retention},
	}
	for name, d := range durations {
		if given[name] {
			*d.dst = d.v
		}
	}
	ints := map[string]struct {
		v   *int
		dst **int
	}{
		"max-attempts":          {maxAttempts, &u.MaxAttempts},
		"max-payload":           {maxPayload, &u.MaxPayloadBytes},
		"max-metadata":          {maxMetadata, &u.MaxMetadataPairs},
		"max-running":           {maxRunning, &u.MaxRunning},
		"max-running-per-value": {perValue, &u.MaxRunningPerValue},
	}
	for name, n := range ints {
		if given[name] {
			*n.dst = n.v
		}
	}
	if u.EnqueueBlocked, err = blockFlag(c, "enqueue", *blockEnqueue, *unblockEnqueue); err != nil {
		return parseExit(err)
	}
	if u.DequeueBlocked, err = blockFlag(c, "dequeue", *blockDequeue, *unblockDequeue); err != nil {
		return parseExit(err)
	}
	if u.Lease == nil && u.Invisible == nil && u.Retention == nil && u.MaxAttempts == nil &&
		u.MaxPayloadBytes == nil && u.MaxMetadataPairs == nil && u.MaxRunning == nil && u.MaxRunningPerValue == nil &&
		u.EnqueueBlocked == nil && u.DequeueBlocked == nil &&
		!given["revision"] {
		return parseExit(c.usageError("nothing to update: give at least one setting (or --revision alone, to check it)"))
	}
	return c.run(ctx, func(ctx context.Context, conn *cliConn) error {
		info, err := conn.client.UpdateQueue(ctx, pos[0], u)
		if err != nil {
			return err
		}
		return c.output(info, func(w io.Writer) { printQueue(w, &info) })
	})
}

// blockFlag merges --block-<what> and --unblock-<what> into the update's flag: nil for neither.
func blockFlag(c *clientCommand, what string, block, unblock bool) (*bool, error) {
	switch {
	case block && unblock:
		return nil, c.usageError("give --block-%s or --unblock-%s, not both", what, what)
	case block, unblock:
		return &block, nil
	}
	return nil, nil
}

func runQueueDelete(ctx context.Context, args []string, stdout, stderr io.Writer) int {
	c := newClientCommand("natstone queue rm", "NAME [flags]", `
Deletes the queue with all its messages, at once and without asking, and prints how many messages
went with it. Dequeues long-polling on it return empty.
`, stdout, stderr)
	pos, err := c.parse(args, 1, 1)
	if err != nil {
		return parseExit(err)
	}
	return c.run(ctx, func(ctx context.Context, conn *cliConn) error {
		r, err := conn.client.DeleteQueue(ctx, pos[0])
		if err != nil {
			return err
		}
		return c.output(r, func(w io.Writer) {
			fmt.Fprintf(w, "deleted queue %s with %d %s\n", r.Name, r.Messages, plural(r.Messages, "message", "messages"))
		})
	})
}
