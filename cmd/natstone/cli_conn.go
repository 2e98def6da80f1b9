package main

import (
	"cmp"
	"context"
	"errors"
	"flag"
	"fmt"
	"os"
	"strings"
	"time"

	"github.com/nats-io/jsm.go/natscontext"
	"github.com/nats-io/nats.go"

	"github.com/natstone/natstone/subjects"
	"github.com/natstone/natstone/workers"
)

// The exit codes of the client commands, on top of exitOK, exitError and exitUsage. Scripts rely on
// them: they are listed in every client command's help (exitCodesHelp) and in docs/cli.md.
const (
	exitNotFound = 3 // queue_not_found, message_not_found or schedule_not_found
	exitEmpty    = 4 // dequeue: no message was available
	exitNoBroker = 5 // no NATS server, connection rejected, no broker answering, or no reply in time
)

// exitCodesHelp ends the help of every client command.
const exitCodesHelp = `
Exit codes:
  0  success
  1  failure: the broker refused the request ("natstone: <code>: <message>" on stderr), an
     import had failed lines, the command was interrupted (SIGINT, SIGTERM), or another error
     (e.g. a file that cannot be read)
  2  bad command line: unknown flag, wrong arguments, unknown or unusable nats context
  3  not found: the broker replied queue_not_found, message_not_found or schedule_not_found
  4  nothing to dequeue: dequeue got no message (within --wait)
  5  cannot reach natstone: no NATS server, connection refused or rejected, no broker answering
     on --prefix (no responders), or no reply within --timeout
`

// cliConnName is the NATS connection name of the client commands, as monitoring endpoints show it.
const cliConnName = "natstone-cli"

// connFlags are the connection flags every client command shares.
type connFlags struct {
	server   string
	context  string
	creds    string
	user     string
	password string
	timeout  time.Duration
	prefix   string
}

// register adds the connection flags to fs.
func (f *connFlags) register(fs *flag.FlagSet) {
	fs.StringVar(&f.server, "server", "", "NATS server `url`s, comma-separated (env NATS_URL; default the context's, else "+nats.DefaultURL+")")
	fs.StringVar(&f.context, "context", "", "nats CLI context `name` (env NATS_CONTEXT; default the context selected with \"nats context select\", if any)")
	fs.StringVar(&f.creds, "creds", "", "user credentials `file` (replaces the context's authentication)")
	fs.StringVar(&f.user, "user", "", "user `name` (replaces the context's authentication)")
	fs.StringVar(&f.password, "password", "", "`password` of --user (or of the context's user)")
	durationVar(fs, &f.timeout, "timeout", workers.DefaultTimeout, "how long to wait for the connection and for each reply (a dequeue's --wait is added)")
	fs.StringVar(&f.prefix, "prefix", subjects.DefaultPrefix, "subject `prefix` of the broker (its serve --prefix)")
}

// connFlagNames lists the flags of register, for the help's "Connection flags" section.
var connFlagNames = []string{"server", "context", "creds", "user", "password", "timeout", "prefix"}

// configError is a connection setting that cannot work, whatever the network does: an unknown
// context, a credentials file that does not exist. It exits with exitUsage.
type configError struct{ err error }

func (e *configError) Error() string { return e.err.Error() }
func (e *configError) Unwrap() error { return e.err }

// connectError is a failure to connect to NATS. It exits with exitNoBroker.
type connectError struct {
	url string // redacted
	err error
}

func (e *connectError) Error() string {
	return fmt.Sprintf("natstone: cannot connect to %s: %v", e.url, e.err)
}
func (e *connectError) Unwrap() error { return e.err }

// validate checks the flags that do not need the context.
func (f *connFlags) validate() error {
	if f.timeout <= 0 {
		return fmt.Errorf("--timeout must be positive, not %v", f.timeout)
	}
	if _, err := subjects.NewSpace(f.prefix); err != nil {
		return fmt.Errorf("--prefix: %w", err)
	}
	if f.creds != "" && (f.user != "" || f.password != "") {
		return errors.New("give --creds or --user/--password, not both")
	}
	return nil
}

// connSettings is where a client connects and how, once the context and the flags are merged.
type connSettings struct {
	url  string
	opts []nats.Option
}

// settings merges the connection settings: a flag (or its environment variable) overrides the
// context, the context overrides the defaults. The context is --context, else NATS_CONTEXT, else the
// nats CLI's selected context; with none of them there is no context.
func (f *connFlags) settings() (*connSettings, error) {
	name := cmp.Or(f.context, os.Getenv("NATS_CONTEXT"))
	nctx, err := natscontext.New(name, true)
	if err != nil {
		if name == "" {
			return nil, &configError{fmt.Errorf("loading the selected nats context: %w", err)}
		}
		return nil, &configError{fmt.Errorf("loading nats context %q: %w", name, err)}
	}
	opts, err := nctx.NATSOptions()
	if err != nil {
		return nil, &configError{fmt.Errorf("nats context %q: %w", nctx.Name, err)}
	}
	opts = append(opts, nats.Name(cliConnName), nats.Timeout(f.timeout))
	// nats.go opens these files only when it connects, and reports a missing one as a failure to
	// connect (exit 5, "cannot reach natstone"): it is the context that is unusable (exit 2).
	// (The context's options read its creds and nkey files even when a flag replaces its login.)
	files := []struct{ what, path string }{{"creds", nctx.Creds()}, {"nkey", nctx.NKey()}, {"cert", nctx.Certificate()}, {"key", nctx.Key()}, {"ca", nctx.CA()}}
	for _, file := range files {
		if file.path == "" {
			continue
		}
		if _, err := os.Stat(file.path); err != nil {
			return nil, &configError{fmt.Errorf("nats context %q: its %s file: %w", nctx.Name, file.what, err)}
		}
	}

	switch {
	case f.creds != "":
		if _, err := os.Stat(f.creds); err != nil {
			return nil, &configError{fmt.Errorf("--creds: %w", err)}
		}
		opts = append(opts, clearAuth, nats.UserCredentials(f.creds))
	case f.user != "":
		opts = append(opts, clearAuth, nats.UserInfo(f.user, f.password))
	case f.password != "":
		if nctx.User() == "" {
			return nil, &configError{errors.New("--password needs --user (or a context with a user)")}
		}
		opts = append(opts, clearAuth, nats.UserInfo(nctx.User(), f.password))
	}
	url := cmp.Or(f.server, os.Getenv("NATS_URL"), nctx.ServerURL())
	return &connSettings{url: url, opts: opts}, nil
}

// clearAuth drops the authentication the context configured, so that an authentication flag
// replaces it instead of being sent beside it.
func clearAuth(o *nats.Options) error {
	o.User, o.Password, o.UserInfo = "", "", nil
	o.Token, o.TokenHandler = "", nil
	o.Nkey, o.SignatureCB, o.UserJWT = "", nil, nil
	return nil
}

// cliConn is a connected client.
type cliConn struct {
	nc     *nats.Conn
	client *workers.Client
	url    string // redacted, for messages
	prefix string
}

// dial connects with the merged settings and returns a Client on the connection.
func (f *connFlags) dial() (*cliConn, error) {
	s, err := f.settings()
	if err != nil {
		return nil, err
	}
	nc, err := nats.Connect(s.url, s.opts...)
	if err != nil {
		return nil, &connectError{url: redactURL(s.url), err: err}
	}
	// The announcements of brokers that begin to serve are for workers: an operator's user may not
	// subscribe to them, and a dequeue --wait cut by a reconnect is sent again all the same.
	client, err := workers.NewClient(nc, &workers.Config{Prefix: f.prefix, Timeout: f.timeout, IgnoreAnnouncements: true})
	if err != nil {
		nc.Close()
		return nil, err
	}
	return &cliConn{nc: nc, client: client, url: redactURL(nc.ConnectedUrl()), prefix: f.prefix}, nil
}

// close closes the connection. Every request has had its reply, so there is nothing to drain.
func (c *cliConn) close() { c.nc.Close() }

// exitCodeOf classifies err for the exit code.
func exitCodeOf(err error) int {
	var apiErr *workers.APIError
	var cfgErr *configError
	var connErr *connectError
	switch {
	case err == nil:
		return exitOK
	case errors.Is(err, errNothingToDequeue):
		return exitEmpty
	case errors.As(err, &apiErr):
		if apiErr.Code == subjects.CodeQueueNotFound || apiErr.Code == subjects.CodeMessageNotFound || apiErr.Code == subjects.CodeScheduleNotFound {
			return exitNotFound
		}
		return exitError
	case errors.As(err, &cfgErr):
		return exitUsage
	case errors.As(err, &connErr), errors.Is(err, nats.ErrNoResponders), errors.Is(err, nats.ErrTimeout),
		errors.Is(err, nats.ErrConnectionClosed), errors.Is(err, nats.ErrNoServers):
		return exitNoBroker
	}
	return exitError
}

// retrySafety says which commands a retry after an unknown outcome may repeat the effect of
// (docs/cli.md, exit code 5).
const retrySafety = "a retry is safe, but for an enqueue or a schedule fire without --id, a dequeue without --request-id, and a reschedule with a --delay over 0"

// describeError returns the line that reports err on stderr. A broker's refusal reads
// "natstone: <code>: <message>"; a missing broker or reply says what that means.
func describeError(err error, conn *cliConn) string {
	var apiErr *workers.APIError
	if errors.As(err, &apiErr) {
		return apiErr.Error()
	}
	where := ""
	if conn != nil {
		where = fmt.Sprintf(" at %s (prefix %s)", conn.url, conn.prefix)
	}
	switch {
	case errors.Is(err, nats.ErrNoResponders):
		return fmt.Sprintf("natstone: no natstone broker answers%s (%v)", where, nats.ErrNoResponders)
	case errors.Is(err, nats.ErrTimeout):
		return fmt.Sprintf("natstone: no reply in time%s; a write may still have been carried out (%s) (%v)", where, retrySafety, nats.ErrTimeout)
	case errors.Is(err, context.Canceled):
		return "natstone: interrupted before the reply came; a write may still have been carried out (" + retrySafety + ")"
	}
	msg := err.Error()
	if !strings.HasPrefix(msg, "natstone: ") {
		msg = "natstone: " + msg
	}
	return msg
}
