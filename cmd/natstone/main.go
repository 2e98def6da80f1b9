// Command natstone runs the natstone broker: an earliest-deadline-first priority queue on NATS
// JetStream. Run "natstone help" for the commands.
package main

import (
	"context"
	"encoding/json"
	"flag"
	"fmt"
	"io"
	"os"
	"os/signal"
	"runtime"
	"runtime/debug"
	"slices"
	"strings"
	"syscall"

	"github.com/natstone/natstone/broker"
)

// Exit codes of every command.
const (
	exitOK    = 0
	exitError = 1 // a failure while running
	exitUsage = 2 // a bad command line
)

// command is one subcommand: run gets the arguments after the command's name.
type command struct {
	name    string
	summary string
	run     func(ctx context.Context, args []string, stdout, stderr io.Writer) int
}

// commands lists the subcommands in the order "natstone help" shows them.
var commands = []command{
	{name: "serve", summary: "run the broker (with an embedded NATS server unless --nats-url is given)", run: runServe},
	{name: "queue", summary: "create, list, inspect, update and delete queues: queue create|ls|info|update|rm", run: runQueue},
	{name: "enqueue", summary: "add a message to a queue, or import JSON lines with --import", run: runEnqueue},
	{name: "dequeue", summary: "lease the most urgent messages of a queue (exit 4 when there is none)", run: runDequeue},
	{name: "complete", summary: "complete a leased message", run: runComplete},
	{name: "extend", summary: "extend the lease of a message", run: runExtend},
	{name: "release", summary: "give a leased message back to its queue, at once or after a delay", run: runRelease},
	{name: "cancel", summary: "cancel a message (fenced by its lease when one is given)", run: runCancel},
	{name: "retry", summary: "retry an errored or canceled message, or all errored ones: pending again, attempts anew", run: runRetry},
	{name: "reschedule", summary: "change a waiting message's priority, or when it becomes pending", run: runReschedule},
	{name: "schedule", summary: "recurring enqueues at the times of a cron expression: schedule set|ls|rm|pause|resume|fire", run: runSchedule},
	{name: "get", summary: "show a message with its payload", run: runGet},
	{name: "depth", summary: "count a queue's messages by state, optionally filtered by metadata", run: runDepth},
	{name: "stats", summary: "show a queue now: counts, oldest pending, rates, totals, expiring leases", run: runStats},
	{name: "messages", summary: "list a queue's messages of one state in their order, without payloads", run: runMessages},
	{name: "history", summary: "show a message's transitions and time in each state, also once collected", run: runHistory},
	{name: "bench", summary: "measure natstone against plain JetStream on this machine (docs/performance.md)", run: runBench},
}

func main() {
	// The first SIGINT or SIGTERM cancels ctx and starts a graceful shutdown; a second one exits at
	// once. signal.NotifyContext cannot report a second signal, so one channel sees both.
	sigs := make(chan os.Signal, 2)
	signal.Notify(sigs, os.Interrupt, syscall.SIGTERM)
	ctx, cancel := context.WithCancelCause(context.Background())
	go func() {
		sig := <-sigs
		cancel(fmt.Errorf("received %v", sig))
		sig = <-sigs
		fmt.Fprintf(os.Stderr, "natstone: second signal (%v) during shutdown, exiting now\n", sig)
		os.Exit(exitError)
	}()
	os.Exit(run(ctx, os.Args[1:], os.Stdout, os.Stderr))
}

// run dispatches args (without the program name) to a subcommand and returns the exit code.
func run(ctx context.Context, args []string, stdout, stderr io.Writer) int {
	if len(args) == 0 {
		usage(stderr)
		return exitUsage
	}
	name, rest := args[0], args[1:]
	switch name {
	case "help", "-h", "-help", "--help":
		return runHelp(ctx, rest, stdout, stderr)
	case "version", "--version":
		return runVersion(rest, stdout, stderr)
	}
	if strings.HasPrefix(name, "-") {
		var problem string
		if name, rest, problem = connFlagsFirst(args); problem != "" {
			fmt.Fprintf(stderr, "natstone: %s\nRun 'natstone help' for the commands.\n", problem)
			return exitUsage
		}
	}
	for _, c := range commands {
		if c.name == name {
			return c.run(ctx, rest, stdout, stderr)
		}
	}
	fmt.Fprintf(stderr, "natstone: unknown command %q\nRun 'natstone help' for the commands.\n", name)
	return exitUsage
}

// connFlagsFirst takes the connection flags that come before a command, as the nats CLI's global
// flags may ("natstone --server URL queue ls"), and returns the command's name and its arguments,
// those flags first: the command parses them in their order, so that a flag given again after the
// command wins. Any other flag there is a problem: it is the command's own, and goes after it.
func connFlagsFirst(args []string) (name string, rest []string, problem string) {
	var lead []string
	for len(args) > 0 && strings.HasPrefix(args[0], "-") {
		flagName, _, valued := strings.Cut(strings.TrimLeft(args[0], "-"), "=")
		switch {
		case args[0] == "--":
			return "", nil, `"--" before the command`
		case !slices.Contains(connFlagNames, flagName):
			return "", nil, fmt.Sprintf("flag %s before the command: only the connection flags (--%s) go before it", args[0], strings.Join(connFlagNames, ", --"))
		case valued:
			lead, args = append(lead, args[0]), args[1:]
		case len(args) < 2:
			return "", nil, "flag needs an argument: --" + flagName
		default:
			lead, args = append(lead, args[:2]...), args[2:]
		}
	}
	if len(args) == 0 {
		return "", nil, "missing command after the connection flags"
	}
	return args[0], slices.Concat(lead, args[1:]), ""
}

// runHelp prints the overview, or a command's flags for "natstone help <command> [<subcommand>]".
func runHelp(ctx context.Context, args []string, stdout, stderr io.Writer) int {
	if len(args) == 0 {
		usage(stdout)
		return exitOK
	}
	for _, c := range commands {
		if c.name == args[0] {
			return c.run(ctx, append(slices.Clone(args[1:]), "-h"), stdout, stdout) // queue create -h
		}
	}
	switch args[0] {
	case "help":
		usage(stdout)
		return exitOK
	case "version":
		return runVersion([]string{"-h"}, stdout, stdout)
	}
	fmt.Fprintf(stderr, "natstone: unknown help topic %q\nRun 'natstone help' for the commands.\n", args[0])
	return exitUsage
}

func usage(w io.Writer) {
	fmt.Fprint(w, "Usage: natstone <command> [flags]\n\nCommands:\n")
	for _, c := range commands {
		fmt.Fprintf(w, "  %-10s %s\n", c.name, c.summary)
	}
	fmt.Fprintf(w, "  %-10s %s\n", "help", "show this help, or a command's flags: natstone help <command>")
	fmt.Fprintf(w, "  %-10s %s\n", "version", "print the version")
}

// runVersion prints natstone's version and the Go version it was built with: "natstone version
// [--json]".
func runVersion(args []string, stdout, stderr io.Writer) int {
	fs := flag.NewFlagSet("natstone version", flag.ContinueOnError)
	fs.SetOutput(stderr)
	asJSON := fs.Bool("json", false, `print {"version", "go", "commit"} as one JSON document`)
	fs.Usage = func() {
		fmt.Fprint(fs.Output(), "Usage: natstone version [--json]\n\nPrints natstone's version, the Go version it was built with and, for a binary built from a Git\ncheckout, the commit (with -dirty when the checkout had changes).\n\nFlags:\n")
		printFlags(fs.Output(), fs, func(string) bool { return true })
		fmt.Fprint(fs.Output(), "\nExit codes:\n  0  success\n  2  bad command line\n")
	}
	if err := parseFlags(fs, args, stdout); err != nil {
		return parseExit(err)
	}
	if fs.NArg() > 0 {
		reportUsage(stderr, fs.Name(), fmt.Sprintf("unexpected argument %q", fs.Arg(0)))
		return exitUsage
	}
	if *asJSON {
		b, _ := json.Marshal(struct {
			Version string `json:"version"`
			Go      string `json:"go"`
			Commit  string `json:"commit,omitempty"`
		}{broker.Version, runtime.Version(), buildCommit()})
		fmt.Fprintf(stdout, "%s\n", b)
		return exitOK
	}
	if c := buildCommit(); c != "" {
		fmt.Fprintf(stdout, "natstone %s %s %s\n", broker.Version, runtime.Version(), c)
		return exitOK
	}
	fmt.Fprintf(stdout, "natstone %s %s\n", broker.Version, runtime.Version())
	return exitOK
}

// commit is the Git commit the binary was built from, with "-dirty" when the checkout had changes,
// as make build sets it (-ldflags "-X main.commit=…").
var commit string

// buildCommit returns commit, or else the commit the Go toolchain recorded (go build in a Git
// checkout, unless -buildvcs=false), or "" (go test's binaries, go run, a build from elsewhere).
func buildCommit() string {
	if commit != "" {
		return commit
	}
	info, ok := debug.ReadBuildInfo()
	if !ok {
		return ""
	}
	var rev, dirty string
	for _, s := range info.Settings {
		switch {
		case s.Key == "vcs.revision":
			rev = s.Value
		case s.Key == "vcs.modified" && s.Value == "true":
			dirty = "-dirty"
		}
	}
	if rev == "" {
		return ""
	}
	return rev + dirty
}
