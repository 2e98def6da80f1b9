package main

import (
	"bytes"
	"context"
	"errors"
	"flag"
	"fmt"
	"io"
	"maps"
	"regexp"
	"slices"
	"strconv"
	"strings"
	"time"
)

// clientCommand is what every client command shares: its flag set (its own flags, the connection
// flags and --json), its help, and where it writes. A command declares its flags on fs, calls
// parse, then run.
type clientCommand struct {
	name   string // "natstone dequeue"
	args   string // what follows the name in the usage line: "QUEUE [flags]"
	about  string // the help's description, ending in a newline
	fs     *flag.FlagSet
	conn   connFlags
	json   bool
	stdout io.Writer
	stderr io.Writer
}

// newClientCommand returns a command with the shared flags declared.
func newClientCommand(name, args, about string, stdout, stderr io.Writer) *clientCommand {
	c := &clientCommand{name: name, args: args, about: about, stdout: stdout, stderr: stderr}
	c.fs = flag.NewFlagSet(name, flag.ContinueOnError)
	c.fs.SetOutput(stderr)
	c.fs.Usage = c.usage
	c.conn.register(c.fs)
	c.fs.BoolVar(&c.json, "json", false, "print the result as one JSON document (the protocol's reply) instead of a table")
	return c
}

// usage prints the command's help: usage line, description, its flags, the connection flags and
// the exit codes.
func (c *clientCommand) usage() {
	w := c.fs.Output()
	fmt.Fprintf(w, "Usage: %s %s\n%s", c.name, c.args, c.about)
	isConn := func(name string) bool { return slices.Contains(connFlagNames, name) }
	fmt.Fprint(w, "\nFlags:\n")
	printFlags(w, c.fs, func(name string) bool { return !isConn(name) })
	fmt.Fprint(w, "\nConnection flags (a flag overrides the nats context):\n")
	printFlags(w, c.fs, isConn)
	fmt.Fprint(w, exitCodesHelp)
}

// printFlags prints the flags of fs that include accepts, in the flag package's layout but with
// the "--" spelling the help text uses.
func printFlags(w io.Writer, fs *flag.FlagSet, include func(name string) bool) {
	fs.VisitAll(func(f *flag.Flag) {
		if !include(f.Name) {
			return
		}
		arg, text := flag.UnquoteUsage(f)
		if arg == "value" {
			switch f.Value.(type) {
			case *msDuration, goDuration:
				arg = "duration"
			case *decimal[int], *decimal[int64]:
				arg = "int"
			case *decimal[uint64]:
				arg = "uint"
			}
		}
		line := "  --" + f.Name
		if arg != "" {
			line += " " + arg
		}
		line += "\n    \t" + strings.ReplaceAll(text, "\n", "\n    \t")
		def := f.DefValue
		if d, err := time.ParseDuration(def); err == nil {
			def = fmtDuration(d) // 24h rather than 24h0m0s
		}
		switch def {
		case "", "false", "0", "0s":
		default:
			line += " (default " + def + ")"
		}
		fmt.Fprintln(w, line)
	})
}

// parse parses args, whose flags may come before, between or after the positional arguments ("--"
// ends the flags), and checks that there are minArgs to maxArgs positional arguments. An error has
// been reported on stderr; parseExit gives its exit code.
func (c *clientCommand) parse(args []string, minArgs, maxArgs int) ([]string, error) {
	pos, err := parseInterleaved(c.fs, args, c.stdout)
	if err != nil {
		return nil, err // the flag package has reported it
	}
	switch {
	case len(pos) < minArgs:
		return nil, c.usageError("missing arguments: want %s", c.args)
	case len(pos) > maxArgs:
		return nil, c.usageError("unexpected argument %q", pos[maxArgs])
	}
	if err := c.conn.validate(); err != nil {
		return nil, c.usageError("%v", err)
	}
	return pos, nil
}

// usageError reports a bad command line, and where the help is, and returns it as an error.
func (c *clientCommand) usageError(format string, a ...any) error {
	err := fmt.Errorf(format, a...)
	reportUsage(c.stderr, c.name, err.Error())
	return err
}

// parseExit is the exit code of an error of parse: exitOK for -h, exitUsage otherwise.
func parseExit(err error) int {
	if errors.Is(err, flag.ErrHelp) {
		return exitOK
	}
	return exitUsage
}

// parseInterleaved parses the flags of args wherever they are and returns the other arguments in
// order. The flag package alone stops at the first non-flag argument, which would make
// "enqueue q --id x" ignore --id.
func parseInterleaved(fs *flag.FlagSet, args []string, stdout io.Writer) ([]string, error) {
	var pos []string
	for {
		if err := parseFlags(fs, args, stdout); err != nil {
			return nil, err
		}
		rest := fs.Args()
		if len(rest) == 0 {
			return pos, nil
		}
		if consumed := len(args) - len(rest); consumed > 0 && args[consumed-1] == "--" {
			return append(pos, rest...), nil // everything after "--" is an argument
		}
		pos = append(pos, rest[0])
		args = rest[1:]
	}
}

// parseFlags is fs.Parse, with -h and --help printing the help on stdout (for a pager), and an
// error printed on fs's output (stderr) as one line naming flags as the help and the docs do
// ("invalid value … for flag --lease", "flag needs an argument: --error"), with a pointer to the
// help rather than all of it.
func parseFlags(fs *flag.FlagSet, args []string, stdout io.Writer) error {
	out := fs.Output()
	var buf bytes.Buffer
	fs.SetOutput(&buf)
	err := fs.Parse(args)
	fs.SetOutput(out)
	switch {
	case err == nil:
	case errors.Is(err, flag.ErrHelp):
		_, _ = io.Copy(stdout, &buf)
	default:
		line, _, _ := strings.Cut(buf.String(), "\n")
		line = dashFlag.ReplaceAllString(line, "$1--$2")
		if strings.HasPrefix(line, "flag provided but not defined: ") {
			line += ` (an argument that begins with "-" goes after "--")`
		}
		reportUsage(out, fs.Name(), line)
	}
	return err
}

// reportUsage reports a bad command line of command, and where its help is.
func reportUsage(stderr io.Writer, command, problem string) {
	fmt.Fprintf(stderr, "%s: %s\nRun '%s --help' for its arguments and flags.\n", command, problem, command)
}

// dashFlag matches a flag name the flag package writes with one dash.
var dashFlag = regexp.MustCompile(`(^|\s)-([A-Za-z][A-Za-z0-9-]*)`)

// set returns the names of the flags given on the command line.
func (c *clientCommand) set() map[string]bool {
	given := map[string]bool{}
	c.fs.Visit(func(f *flag.Flag) { given[f.Name] = true })
	return given
}

// run connects, calls do and reports its error: the exit code scripts see.
func (c *clientCommand) run(ctx context.Context, do func(ctx context.Context, conn *cliConn) error) int {
	conn, err := c.conn.dial()
	if err != nil {
		return c.fail(err, nil)
	}
	defer conn.close()
	if err := do(ctx, conn); err != nil {
		return c.fail(err, conn)
	}
	return exitOK
}

// fail reports err on stderr, unless the command told its story already (errTold), and returns its
// exit code.
func (c *clientCommand) fail(err error, conn *cliConn) int {
	if !errors.As(err, new(errTold)) {
		fmt.Fprintln(c.stderr, describeError(err, conn))
	}
	return exitCodeOf(err)
}

// errTold is an error that its command has said all there is to say of on stderr.
type errTold struct{ error }

func (e errTold) Unwrap() error { return e.error }

// output prints v as JSON with --json, else calls human to print it for people.
func (c *clientCommand) output(v any, human func(w io.Writer)) error {
	if c.json {
		return writeJSON(c.stdout, v)
	}
	human(c.stdout)
	return nil
}

// pairsFlag is a repeatable key=value flag (--meta, --filter).
type pairsFlag map[string]string

func (p *pairsFlag) String() string {
	if p == nil || len(*p) == 0 {
		return ""
	}
	var parts []string
	for _, k := range slices.Sorted(maps.Keys(*p)) {
		parts = append(parts, k+"="+(*p)[k])
	}
	return strings.Join(parts, ",")
}

func (p *pairsFlag) Set(s string) error {
	k, v, ok := strings.Cut(s, "=")
	if !ok || k == "" {
		return fmt.Errorf("want key=value, not %q", s)
	}
	if *p == nil {
		*p = pairsFlag{}
	}
	if _, dup := (*p)[k]; dup {
		return fmt.Errorf("key %q given twice", k)
	}
	(*p)[k] = v
	return nil
}

// parseDeadline reads --deadline: an RFC 3339 time, or a duration from now.
func parseDeadline(s string, now time.Time) (time.Time, error) {
	if t, err := time.Parse(time.RFC3339Nano, s); err == nil {
		return t, nil
	}
	d, err := time.ParseDuration(s)
	if err != nil {
		return time.Time{}, fmt.Errorf("--deadline %q is neither an RFC 3339 time (2026-01-02T15:04:05Z) nor a duration from now (90m)", s)
	}
	return now.Add(d), nil
}

// msDuration is a duration flag that the protocol carries in whole milliseconds. A value that is not
// a whole number of them, or lies outside min to max, is refused where it is given (exit 2), rather
// than rounded (500us would become 0, the default) or left to the broker. Zero is accepted, for
// most flags the default, unless noZero is set.
type msDuration struct {
	d        time.Duration
	min, max time.Duration
	noZero   bool // 0 is not a default here: it must be within min to max too
}

func (f *msDuration) String() string {
	if f == nil {
		return "0s"
	}
	return f.d.String()
}

func (f *msDuration) Set(s string) error {
	d, err := time.ParseDuration(s)
	switch {
	case err != nil:
		return errNotDuration
	case d%time.Millisecond != 0:
		return errors.New("not a whole number of milliseconds")
	case f.noZero && (d < f.min || d > f.max):
		return fmt.Errorf("must be %s to %s", fmtDuration(f.min), fmtDuration(f.max))
	case d != 0 && (d < f.min || d > f.max) && f.min <= time.Millisecond:
		return fmt.Errorf("must be 0 to %s", fmtDuration(f.max))
	case d != 0 && (d < f.min || d > f.max):
		return fmt.Errorf("must be %s to %s, or 0", fmtDuration(f.min), fmtDuration(f.max))
	}
	f.d = d
	return nil
}

// duration declares a duration flag with default def, of at most max and at least min unless 0.
func (c *clientCommand) duration(name string, def, min, max time.Duration, usage string) *time.Duration {
	f := &msDuration{d: def, min: min, max: max}
	c.fs.Var(f, name, usage)
	return &f.d
}

// errNotDuration is a duration flag's error for a value that is not one.
var errNotDuration = errors.New("not a duration (e.g. 90s, 5m, 1h30m)")

// durationVar is fs.DurationVar whose error for a value that is not a duration says what one looks
// like, as the other duration flags do, rather than the flag package's "parse error".
func durationVar(fs *flag.FlagSet, p *time.Duration, name string, def time.Duration, usage string) {
	*p = def
	fs.Var(goDuration{p}, name, usage)
}

// goDuration is the flag.Value of durationVar.
type goDuration struct{ d *time.Duration }

func (f goDuration) String() string {
	if f.d == nil {
		return "0s"
	}
	return f.d.String()
}

func (f goDuration) Set(s string) error {
	d, err := time.ParseDuration(s)
	if err != nil {
		return errNotDuration
	}
	*f.d = d
	return nil
}

// settingDuration declares a duration flag that sets a value rather than asks for a default: when
// given, it must lie within min to max, 0 as well.
func (c *clientCommand) settingDuration(name string, min, max time.Duration, usage string) *time.Duration {
	f := &msDuration{min: min, max: max, noZero: true}
	c.fs.Var(f, name, usage)
	return &f.d
}

// decimal is an integer flag read in base 10 alone. The flag package's integer flags take Go's
// base prefixes, so that --priority 010 would be 8 and --max-running 0x10 16: numbers of the
// protocol are decimal.
type decimal[T int | int64 | uint64] struct{ v T }

func (d *decimal[T]) String() string { return fmt.Sprint(d.v) }

func (d *decimal[T]) Set(s string) error {
	var v T
	var err error
	switch p := any(&v).(type) {
	case *uint64:
		*p, err = strconv.ParseUint(s, 10, 64)
	default:
		var n int64
		if n, err = strconv.ParseInt(s, 10, 64); err == nil && int64(T(n)) != n {
			err = strconv.ErrRange
		}
		v = T(n)
	}
	switch {
	case errors.Is(err, strconv.ErrRange):
		return errors.New("out of range")
	case err != nil:
		return errors.New("not a whole number in decimal")
	}
	d.v = v
	return nil
}

// integer defines a decimal integer flag of c.
func integer[T int | int64 | uint64](c *clientCommand, name string, def T, usage string) *T {
	d := &decimal[T]{v: def}
	c.fs.Var(d, name, usage)
	return &d.v
}
