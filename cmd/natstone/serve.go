package main

import (
	"cmp"
	"context"
	"errors"
	"flag"
	"fmt"
	"io"
	"log/slog"
	"net"
	"net/url"
	"os"
	"path/filepath"
	"strconv"
	"strings"
	"time"

	"github.com/nats-io/nats.go"

	"github.com/natstone/natstone/broker"
	"github.com/natstone/natstone/embedded"
	"github.com/natstone/natstone/kv"
	"github.com/natstone/natstone/metrics"
	"github.com/natstone/natstone/subjects"
)

// Defaults of the serve flags that have no home in a library package.
const (
	DefaultDataDir = "natstone-data"
	DefaultListen  = "127.0.0.1:4222"
)

// The time budgets of serve.
const (
	// DefaultStartTimeout is --start-timeout's default: how long a start may take, from the
	// embedded server's own recovery of its store (or, with --nats-url, from holding the claim) to
	// the broker answering requests. A restart after a crash reads every record, at about 5 s per
	// million pending messages on the machines of docs/performance.md: the default leaves room for
	// tens of millions.
	DefaultStartTimeout = 10 * time.Minute
	// ShutdownTimeout bounds the whole graceful shutdown: stopping the broker, then draining the
	// connection. The embedded server's shutdown is not bounded: it only closes local resources.
	ShutdownTimeout = 30 * time.Second
	// minStoreMaxBytes is the least --store-max-bytes: the claims bucket, renewed every few
	// seconds, needs room for its writes whatever the queues hold.
	minStoreMaxBytes = 1 << 20
	// minWriteTimeout is the least --write-timeout: below it, writes acknowledged a little late
	// under load would be issued again, adding to the load.
	minWriteTimeout = 100 * time.Millisecond
)

// connName is the NATS connection name of the broker, as monitoring endpoints show it.
const connName = "natstone-broker"

// serveConfig is the parsed command line of serve.
type serveConfig struct {
	natsURL string // empty: run the embedded server

	// Used by the embedded server only.
	dataDir    string // absolute
	host       string
	port       int // 0: any free port
	syncAlways bool

	prefix            string
	storePrefix       string
	replicas          int
	disableAutoCreate bool
	noEvents          bool
	noSnapshot        bool
	eventsMaxAge      time.Duration
	eventsMaxBytes    int64
	storeMaxBytes     int64  // -1: no bound
	httpAddr          string // empty: no HTTP listener
	httpHosts         hostsFlag
	claimTTL          time.Duration
	writeTimeout      time.Duration
	natsCreds         string        // a user credentials file for --nats-url's server; empty: none
	natsCA            string        // the CA certificates (PEM) that --nats-url's server's certificate must chain to
	natsCert, natsKey string        // a client certificate and its key, for a server that asks for one
	startTimeout      time.Duration // 0: no bound
	logLevel          slog.Level
	logFormat         string
}

// serveExitCodesHelp ends serve's help.
const serveExitCodesHelp = `
Exit codes:
  0  stopped cleanly (SIGINT or SIGTERM)
  1  failure: the start or the stop failed (--start-timeout passed, the data directory is in use,
     the NATS server cannot be reached…), or the broker lost its claim on the store to another
  2  bad command line: unknown flag, a bad value
`

// runServe is the serve command: it runs the broker until ctx is cancelled, then shuts down
// gracefully. It returns exitUsage for a bad command line, exitError if starting or stopping fails.
func runServe(ctx context.Context, args []string, stdout, stderr io.Writer) int {
	cfg, err := parseServeFlags(args, stdout, stderr)
	if errors.Is(err, flag.ErrHelp) {
		return exitOK
	}
	if err != nil {
		return exitUsage
	}
	log := newLogger(stderr, cfg.logLevel, cfg.logFormat)
	if err := serve(ctx, cfg, log); err != nil {
		log.Error("natstone failed", "err", err)
		return exitError
	}
	return exitOK
}

// parseServeFlags parses and validates the serve command line. A usage error has already been
// reported on stderr, with the flags, when it returns.
func parseServeFlags(args []string, stdout, stderr io.Writer) (*serveConfig, error) {
	fs := flag.NewFlagSet("natstone serve", flag.ContinueOnError)
	fs.SetOutput(stderr)
	fs.Usage = func() {
		fmt.Fprint(fs.Output(), `Usage: natstone serve [flags]

Runs the natstone broker. Unless --nats-url is given it starts an embedded NATS server with
JetStream, storing in --data and accepting NATS clients on --listen. SIGINT or SIGTERM shuts it
down gracefully; a second signal exits at once.

Flags:
`)
		printFlags(fs.Output(), fs, func(string) bool { return true })
		fmt.Fprint(fs.Output(), serveExitCodesHelp)
	}
	var (
		cfg       serveConfig
		listen    string
		syncMode  string
		logLevel  string
		dataDir   string
		natsFlags = []string{"data", "listen", "sync"}
	)
	fs.StringVar(&dataDir, "data", DefaultDataDir, "JetStream store `dir`ectory of the embedded server")
	fs.StringVar(&listen, "listen", DefaultListen, "`host:port` where the embedded server accepts NATS clients (port 0: any free port)")
	fs.StringVar(&cfg.natsURL, "nats-url", "", "`url` of an existing NATS server with JetStream to use instead of the embedded one")
	fs.StringVar(&cfg.natsCreds, "nats-creds", "", "user credentials `file` (a user JWT and its NKey seed, as `nsc` writes them) to log in to --nats-url's server with")
	fs.StringVar(&cfg.natsCA, "nats-ca", "", "`file` of the CA certificates (PEM) that --nats-url's server's TLS certificate must chain to, instead of the system's")
	fs.StringVar(&cfg.natsCert, "nats-cert", "", "client certificate `file` (PEM) for a --nats-url server that asks for one (with --nats-key)")
	fs.StringVar(&cfg.natsKey, "nats-key", "", "the client certificate's private key `file` (PEM)")
	fs.StringVar(&syncMode, "sync", "default", "embedded server's JetStream sync `mode`: always (fsync before every ack) or default")
	fs.StringVar(&cfg.prefix, "prefix", subjects.DefaultPrefix, "`prefix` of the request subjects")
	fs.StringVar(&cfg.storePrefix, "store-prefix", kv.DefaultPrefix, "`prefix` of the KV buckets, the bodies and events streams, and the events' subjects (another store needs another --prefix too)")
	fs.IntVar(&cfg.replicas, "replicas", 0, "replicas of every bucket and stream (above 1 needs a clustered --nats-url); default: as many as the store has (its messages bucket's), 1 for a new store. A store with other replicas is scaled to these")
	fs.BoolVar(&cfg.disableAutoCreate, "no-auto-create", false, "fail an enqueue to an unknown queue instead of creating it")
	fs.BoolVar(&cfg.noEvents, "no-events", false, "publish no transition events (history then answers unavailable)")
	fs.Int64Var(&cfg.storeMaxBytes, "store-max-bytes", -1, "`bytes` each bucket, the payloads stream and the snapshots store may hold (-1: no bound; else at least 1 MiB), for an account that requires every stream to declare a size (Synadia Cloud's); the account reserves 7 × this × --replicas, plus --events-max-bytes. At the bound storage refuses natstone's writes and the queues stop until it is raised: size it for the peak")
	fs.BoolVar(&cfg.noSnapshot, "no-snapshot", false, "write no snapshot of the message records at a clean stop, and read none at start: every start reads every record")
	durationVar(fs, &cfg.eventsMaxAge, "events-max-age", broker.DefaultEventsMaxAge, "how long the events stream keeps an event")
	fs.Int64Var(&cfg.eventsMaxBytes, "events-max-bytes", broker.DefaultEventsMaxBytes, "`bytes` the events stream may take before its oldest events go, younger than --events-max-age or not (-1: no bound)")
	durationVar(fs, &cfg.claimTTL, "claim-ttl", broker.DefaultClaimTTL, "how long a standby broker waits, seeing the store's claim unchanged, before it takes the store over (at least 1s)")
	durationVar(fs, &cfg.writeTimeout, "write-timeout", broker.DefaultWriteTimeout, "how long the broker waits for storage to answer — a write's acknowledgement, a payload read — before it issues the write again or fails the read (at least 100ms): a message whose write's acknowledgement is lost, in a server restart say, is held as it was until storage answers")
	durationVar(fs, &cfg.startTimeout, "start-timeout", DefaultStartTimeout, "how long a start may take until requests are answered, the recovery of every pending message included (0: no bound)")
	fs.StringVar(&cfg.httpAddr, "http", "", "`host:port` of an HTTP listener for the dashboard, /metrics, /healthz and /readyz (off unless given)")
	fs.Var(&cfg.httpHosts, "http-host", "a host `name` the HTTP listener answers to, besides localhost and its IP addresses (a DNS name or a proxy's; repeatable): others are refused, against DNS rebinding")
	fs.StringVar(&logLevel, "log-level", "info", "log `level`: debug, info, warn or error")
	fs.StringVar(&cfg.logFormat, "log-format", "text", "log `format`: text or json")
	if err := parseFlags(fs, args, stdout); err != nil {
		return nil, err // parseFlags has reported it
	}

	usageErr := func(format string, a ...any) (*serveConfig, error) {
		err := fmt.Errorf(format, a...)
		reportUsage(stderr, fs.Name(), err.Error())
		return nil, err
	}
	if fs.NArg() > 0 {
		return usageErr("unexpected argument %q", fs.Arg(0))
	}
	for _, file := range []struct{ flag, path string }{
		{"nats-creds", cfg.natsCreds}, {"nats-ca", cfg.natsCA}, {"nats-cert", cfg.natsCert}, {"nats-key", cfg.natsKey},
	} {
		if file.path == "" {
			continue
		}
		if cfg.natsURL == "" {
			return usageErr("--%s needs --nats-url: it is for an existing server (the embedded one takes no login and no TLS)", file.flag)
		}
		// nats.go reads the file only when it connects, and would report a missing one as a
		// failure to connect.
		if err := readable(file.path); err != nil {
			return usageErr("--%s: %v", file.flag, err)
		}
	}
	if (cfg.natsCert == "") != (cfg.natsKey == "") {
		return usageErr("--nats-cert and --nats-key go together")
	}
	if u, err := url.Parse(cfg.natsURL); err == nil && u.User != nil && cfg.natsCreds != "" {
		return usageErr("--nats-creds and a user in --nats-url are two logins: give one")
	}
	given := map[string]bool{} // the flags on the command line
	fs.Visit(func(f *flag.Flag) { given[f.Name] = true })
	if cfg.natsURL != "" {
		var drop []string
		for _, name := range natsFlags {
			if given[name] {
				drop = append(drop, "--"+name)
			}
		}
		if len(drop) > 0 {
			return usageErr("with --nats-url there is no embedded server to configure: drop %s", strings.Join(drop, ", "))
		}
	}
	switch syncMode {
	case "always":
		cfg.syncAlways = true
	case "default":
	default:
		return usageErr("--sync must be always or default, not %q", syncMode)
	}
	host, portStr, err := net.SplitHostPort(listen)
	if err != nil {
		return usageErr("--listen %q: %v", listen, err)
	}
	port, err := strconv.Atoi(portStr)
	if err != nil || port < 0 || port > 65535 {
		return usageErr("--listen %q: port must be a number from 0 to 65535", listen)
	}
	cfg.host, cfg.port = host, port
	if cfg.dataDir, err = filepath.Abs(dataDir); err != nil {
		return usageErr("--data %q: %v", dataDir, err)
	}
	if _, err := subjects.NewSpace(cfg.prefix); err != nil {
		return usageErr("--prefix: %v", err)
	}
	if cfg.eventsMaxAge <= 0 {
		return usageErr("--events-max-age must be positive, not %v", cfg.eventsMaxAge)
	}
	if cfg.eventsMaxBytes <= 0 && cfg.eventsMaxBytes != -1 {
		return usageErr("--events-max-bytes must be positive or -1 (no bound), not %d", cfg.eventsMaxBytes)
	}
	if cfg.storeMaxBytes < minStoreMaxBytes && cfg.storeMaxBytes != -1 {
		return usageErr("--store-max-bytes must be at least %d (1 MiB) or -1 (no bound), not %d", minStoreMaxBytes, cfg.storeMaxBytes)
	}
	if cfg.claimTTL < time.Second {
		return usageErr("--claim-ttl must be at least 1s, not %v", cfg.claimTTL)
	}
	if cfg.writeTimeout < minWriteTimeout {
		return usageErr("--write-timeout must be at least %v, not %v", minWriteTimeout, cfg.writeTimeout)
	}
	if cfg.startTimeout < 0 {
		return usageErr("--start-timeout cannot be negative, not %v", cfg.startTimeout)
	}
	if cfg.httpAddr != "" {
		if _, _, err := net.SplitHostPort(cfg.httpAddr); err != nil {
			return usageErr("--http %q: %v", cfg.httpAddr, err)
		}
	} else if len(cfg.httpHosts) > 0 {
		return usageErr("--http-host needs --http")
	}
	if cfg.replicas < 0 || given["replicas"] && cfg.replicas < 1 {
		return usageErr("--replicas must be at least 1, not %d", cfg.replicas)
	}
	if cfg.replicas > 1 && cfg.natsURL == "" {
		return usageErr("--replicas %d needs a clustered NATS server: the embedded one is a single node", cfg.replicas)
	}
	switch logLevel {
	case "debug":
		cfg.logLevel = slog.LevelDebug
	case "info":
		cfg.logLevel = slog.LevelInfo
	case "warn":
		cfg.logLevel = slog.LevelWarn
	case "error":
		cfg.logLevel = slog.LevelError
	default:
		return usageErr("--log-level must be debug, info, warn or error, not %q", logLevel)
	}
	if cfg.logFormat != "text" && cfg.logFormat != "json" {
		return usageErr("--log-format must be text or json, not %q", cfg.logFormat)
	}
	return &cfg, nil
}

// newLogger returns the logger of every component of serve, writing to w.
func newLogger(w io.Writer, level slog.Level, format string) *slog.Logger {
	opts := &slog.HandlerOptions{Level: level}
	if format == "json" {
		return slog.New(slog.NewJSONHandler(w, opts))
	}
	return slog.New(slog.NewTextHandler(w, opts))
}

// serve runs natstone until ctx is cancelled, then stops the broker, closes its connections and
// (embedded) shuts the server down, in that order, so no request is cut off by a vanishing server.
func serve(ctx context.Context, cfg *serveConfig, log *slog.Logger) error {
	bcfg := &broker.Config{
		Prefix:            cfg.prefix,
		StorePrefix:       cfg.storePrefix,
		Replicas:          cfg.replicas,
		DisableAutoCreate: cfg.disableAutoCreate,
		DisableEvents:     cfg.noEvents,
		DisableSnapshot:   cfg.noSnapshot,
		EventsMaxAge:      cfg.eventsMaxAge,
		EventsMaxBytes:    cfg.eventsMaxBytes,
		StoreMaxBytes:     cfg.storeMaxBytes,
		ClaimTTL:          cfg.claimTTL,
		WriteTimeout:      cfg.writeTimeout,
		Logger:            log,
	}
	var m *metrics.Metrics
	if cfg.httpAddr != "" {
		m = metrics.New()
		bcfg.Observer = m
	}
	if cfg.natsURL == "" {
		return serveEmbedded(ctx, cfg, bcfg, m, log)
	}

	// Two connections: requests and replies on one, storage traffic on the other. The server reads
	// each connection in one goroutine, so one connection would serialise both.
	closed, storeClosed := make(chan struct{}), make(chan struct{})
	nc, err := connect(cfg, log, connName, closed)
	if err != nil {
		return err
	}
	storeNC, err := connect(cfg, log, connName+"-store", storeClosed)
	if err != nil {
		nc.Close()
		return err
	}
	defer storeNC.Close()
	bcfg.Conn, bcfg.StoreConn = nc, storeNC
	b, err := broker.New(bcfg)
	if err != nil {
		nc.Close()
		return err
	}
	// The HTTP listener first: a standby answers /healthz, and /metrics says it does not serve
	// (natstone_broker_serving); the dashboard talks to whichever broker serves.
	httpAttrs, stopHTTP, err := startHTTP(cfg, b, m, func() (*nats.Conn, error) {
		return nats.Connect(cfg.natsURL, append(cfg.natsLogin(), nats.Name(connName+"-http"), nats.MaxReconnects(-1))...)
	}, storeNC, log)
	if err != nil {
		stopCtx, cancel := context.WithTimeout(context.Background(), ShutdownTimeout)
		defer cancel()
		return errors.Join(err, drain(stopCtx, nc, closed), drain(stopCtx, storeNC, storeClosed))
	}
	// Wait for the store's claim, for as long as another broker serves it: --start-timeout bounds
	// the start that follows.
	err = b.Claim(ctx)
	if err == nil {
		err = startBroker(ctx, b, cfg.startTimeout)
	}
	if err != nil {
		stopCtx, cancel := context.WithTimeout(context.Background(), ShutdownTimeout)
		defer cancel()
		err = errors.Join(err, stopHTTP(stopCtx), b.Stop(stopCtx))
		nc.Close()
		return interrupted(ctx, log, err)
	}
	log.Info("natstone ready", append([]any{"prefix", cfg.prefix, "store_prefix", cfg.storePrefix, "nats_url", redactURL(cfg.natsURL)}, httpAttrs...)...)

	lost := waitStop(ctx, b, log)
	stopCtx, cancel := context.WithTimeout(context.Background(), ShutdownTimeout)
	defer cancel()
	err = stopHTTP(stopCtx)
	err = errors.Join(err, b.Stop(stopCtx))
	err = errors.Join(err, drain(stopCtx, nc, closed), drain(stopCtx, storeNC, storeClosed))
	if err != nil {
		return errors.Join(lost, fmt.Errorf("shutting down: %w", err))
	}
	log.Info("stopped")
	return lost
}

// waitStop waits until ctx ends (a signal) or the broker stops on its own, having lost its claim
// on the store to another broker: then serve exits with that error, for a supervisor to start it
// again, as a standby.
func waitStop(ctx context.Context, b *broker.Broker, log *slog.Logger) error {
	select {
	case <-ctx.Done():
		log.Info("shutting down", "reason", context.Cause(ctx))
		return nil
	case <-b.Done():
		log.Info("shutting down", "reason", b.Err())
		return b.Err()
	}
}

// serveEmbedded runs natstone on its own nats-server.
func serveEmbedded(ctx context.Context, cfg *serveConfig, bcfg *broker.Config, m *metrics.Metrics, log *slog.Logger) error {
	startCtx, cancel := withBound(ctx, cfg.startTimeout)
	defer cancel()
	var httpAttrs []any
	stopHTTP := func(context.Context) error { return nil }
	n, err := embedded.Start(startCtx, &embedded.Config{
		DataDir:    cfg.dataDir,
		Listen:     net.JoinHostPort(cfg.host, strconv.Itoa(cfg.port)),
		SyncAlways: cfg.syncAlways,
		Broker:     bcfg,
		Logger:     log,
		// The HTTP side answers during the recovery, as with --nats-url: /healthz 200, /readyz 503
		// until the broker serves (a liveness probe must not kill a long recovery).
		Starting: func(n *embedded.Natstone) error {
			attrs, stop, err := startHTTP(cfg, n.Broker(), m, func() (*nats.Conn, error) {
				return n.Connect(nats.Name(connName + "-http"))
			}, nil, log)
			if err == nil { // on an error startHTTP has nothing to stop, and returns no stop
				httpAttrs, stopHTTP = attrs, stop
			}
			return err
		},
	})
	if err != nil {
		stopCtx, cancel := context.WithTimeout(context.Background(), ShutdownTimeout)
		defer cancel()
		return errors.Join(interrupted(ctx, log, timedOut(startCtx, cfg.startTimeout, err)), stopHTTP(stopCtx))
	}
	syncMode := "default"
	if cfg.syncAlways {
		syncMode = "always"
	}
	log.Info("natstone ready", append([]any{"prefix", cfg.prefix, "store_prefix", cfg.storePrefix,
		"listen", n.Addr().String(), "data", cfg.dataDir, "sync", syncMode}, httpAttrs...)...)

	lost := waitStop(ctx, n.Broker(), log)
	stopCtx, cancel := context.WithTimeout(context.Background(), ShutdownTimeout)
	defer cancel()
	if err := errors.Join(stopHTTP(stopCtx), n.Stop(stopCtx)); err != nil {
		return errors.Join(lost, fmt.Errorf("shutting down: %w", err))
	}
	log.Info("stopped")
	return lost
}

// interrupted turns a start failure caused by a signal during a long recovery into a clean stop.
func interrupted(ctx context.Context, log *slog.Logger, err error) error {
	if ctx.Err() != nil {
		log.Info("interrupted while starting", "reason", context.Cause(ctx), "err", err)
		return nil
	}
	return err
}

// startBroker starts b within timeout (0: no bound). broker.Start returns once the server has every
// subscription, so that "natstone ready" means requests are answered.
func startBroker(ctx context.Context, b *broker.Broker, timeout time.Duration) error {
	bound, cancel := withBound(ctx, timeout)
	defer cancel()
	if err := b.Start(bound); err != nil {
		return fmt.Errorf("starting the broker: %w", timedOut(bound, timeout, err))
	}
	return nil
}

// timedOut says, of a start that failed when its bound ctx ran out, that --start-timeout ran out
// (the error alone says only "context deadline exceeded", from wherever the start was).
func timedOut(bound context.Context, timeout time.Duration, err error) error {
	if errors.Is(context.Cause(bound), errStartTimeout) {
		return fmt.Errorf("not started within --start-timeout %v: %w", timeout, err)
	}
	return err
}

// errStartTimeout is the cause of a start's ctx that --start-timeout ended.
var errStartTimeout = errors.New("--start-timeout ran out")

// readable reports why path cannot be read as a file, or nil.
func readable(path string) error {
	f, err := os.Open(path)
	if err != nil {
		return err
	}
	defer f.Close()
	if st, err := f.Stat(); err != nil || st.IsDir() {
		return cmp.Or(err, fmt.Errorf("%s is a directory", path))
	}
	return nil
}

// natsLogin returns the options that log a connection in to --nats-url's server: its credentials
// file (a user and password may be in the URL itself), and the TLS files, if given.
func (cfg *serveConfig) natsLogin() []nats.Option {
	var opts []nats.Option
	if cfg.natsCreds != "" {
		opts = append(opts, nats.UserCredentials(cfg.natsCreds))
	}
	if cfg.natsCA != "" {
		opts = append(opts, nats.RootCAs(cfg.natsCA))
	}
	if cfg.natsCert != "" {
		opts = append(opts, nats.ClientCert(cfg.natsCert, cfg.natsKey))
	}
	return opts
}

// connect opens a connection of the broker named name to cfg.natsURL, reconnecting forever.
// closed is closed when the connection is. Its log lines name it (the broker has two).
func connect(cfg *serveConfig, log *slog.Logger, name string, closed chan struct{}) (*nats.Conn, error) {
	log = log.With("conn", name)
	opts := []nats.Option{
		nats.Name(name),
		nats.ClosedHandler(func(*nats.Conn) { close(closed) }),
		nats.DisconnectErrHandler(func(_ *nats.Conn, err error) {
			if err != nil {
				log.Warn("nats disconnected", "err", err)
			}
		}),
		nats.ReconnectHandler(func(nc *nats.Conn) {
			log.Info("nats reconnected", "url", redactURL(nc.ConnectedUrl()))
		}),
		nats.ErrorHandler(func(_ *nats.Conn, sub *nats.Subscription, err error) {
			if sub != nil {
				log.Error("nats async error", "subject", sub.Subject, "err", err)
				return
			}
			log.Error("nats async error", "err", err)
		}),
	}
	nc, err := nats.Connect(cfg.natsURL, append(append(opts, cfg.natsLogin()...), nats.MaxReconnects(-1))...)
	if err != nil {
		return nil, fmt.Errorf("connecting to %s: %w", redactURL(cfg.natsURL), err)
	}
	return nc, nil
}

// drain drains nc and waits until it is closed, or closes it when ctx ends first.
func drain(ctx context.Context, nc *nats.Conn, closed <-chan struct{}) error {
	if err := nc.Drain(); err != nil {
		nc.Close()
		return fmt.Errorf("draining the connection: %w", err)
	}
	select {
	case <-closed:
		return nil
	case <-ctx.Done():
		nc.Close()
		return fmt.Errorf("draining the connection: %w", ctx.Err())
	}
}

// redactURL hides the credentials of a NATS URL, or of each URL of a comma-separated list.
func redactURL(s string) string {
	urls := strings.Split(s, ",")
	for i, raw := range urls {
		u, err := url.Parse(strings.TrimSpace(raw))
		switch {
		case err != nil:
			urls[i] = "(unparsable url)" // it might still hold a secret
		case u.User != nil:
			// A user name alone may be a token, so the whole user info goes.
			u.User = url.User("redacted")
			urls[i] = u.String()
		default:
			urls[i] = u.String()
		}
	}
	return strings.Join(urls, ",")
}

// withBound bounds a start: context.WithTimeout, whose cause is errStartTimeout, with 0 meaning no
// bound.
func withBound(ctx context.Context, d time.Duration) (context.Context, context.CancelFunc) {
	if d == 0 {
		return context.WithCancel(ctx)
	}
	return context.WithTimeoutCause(ctx, d, errStartTimeout)
}

// hostsFlag is a repeatable flag of host names.
type hostsFlag []string

func (h *hostsFlag) String() string { return strings.Join(*h, ",") }

func (h *hostsFlag) Set(v string) error {
	if v == "" || strings.ContainsAny(v, ":/ ") {
		return fmt.Errorf("%q is not a host name (give it without port or scheme)", v)
	}
	*h = append(*h, v)
	return nil
}
