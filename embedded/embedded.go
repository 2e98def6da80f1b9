package embedded

import (
	"cmp"
	"context"
	"errors"
	"fmt"
	"io"
	"log/slog"
	"net"
	"slices"
	"strconv"
	"sync"

	"github.com/nats-io/nats-server/v2/server"
	"github.com/nats-io/nats.go"

	"github.com/natstone/natstone/broker"
)

// DefaultListen is where the server accepts NATS clients unless configured otherwise.
const DefaultListen = "127.0.0.1:4222"

// Config configures an embedded natstone.
type Config struct {
	// DataDir is the JetStream store directory. Required. A running natstone holds it locked (the
	// file natstone.lock in it): a second Start on it fails rather than share the store.
	DataDir string
	// Listen is host:port for NATS clients ("host:0": any free port). Default DefaultListen.
	// With NoListen the server accepts in-process connections only.
	Listen   string
	NoListen bool
	// SyncAlways fsyncs every JetStream write before it is acknowledged.
	SyncAlways bool
	// Broker configures the broker; its Conn, StoreConn and TakeOverClaim are set by Start. Nil:
	// the defaults.
	Broker *broker.Config
	// Logger receives natstone's and the server's logs (the server's notices at debug level).
	// Default: discard.
	Logger *slog.Logger
	// Starting, if set, is called once the server runs and the broker is made, before the broker
	// starts: its recovery reads every pending message, which can take minutes. What is to answer
	// meanwhile (a liveness check, a readiness check that says "not yet") starts there, and may
	// use the Natstone's Broker and Connect. An error from it fails the Start. A failed Start
	// closes the connections Connect made; anything else Starting started is the caller's to stop.
	Starting func(*Natstone) error
}

// Natstone is a running embedded natstone.
type Natstone struct {
	server *server.Server
	broker *broker.Broker
	conns  []*nats.Conn
	closed []chan struct{}
	log    *slog.Logger
	unlock func() // releases the data directory

	stopOnce sync.Once
	stopErr  error

	mu      sync.Mutex   // guards clients and stopping
	clients []*nats.Conn // Connect's connections, closed by Stop
	// stopping is set as Stop begins: Connect then fails (ErrStopped) rather than connect to a
	// server about to go.
	stopping bool
}

// ErrStopped is the error of a Connect to a Natstone whose Stop began.
var ErrStopped = errors.New("natstone: embedded natstone stopped")

// Start starts the nats-server, connects the broker to it in-process (one connection for requests,
// one for storage, so the server reads them in parallel) and starts the broker. On error
// everything started is stopped again.
func Start(ctx context.Context, cfg *Config) (*Natstone, error) {
	if cfg == nil || cfg.DataDir == "" {
		return nil, errors.New("natstone: embedded Config.DataDir is required")
	}
	log := cfg.Logger
	if log == nil {
		log = slog.New(slog.NewTextHandler(io.Discard, nil))
	}
	host, port, err := splitListen(cmp.Or(cfg.Listen, DefaultListen))
	if err != nil {
		return nil, err
	}
	unlock, err := lockDir(cfg.DataDir)
	if err != nil {
		return nil, err
	}
	ns, err := startServer(&server.Options{
		ServerName: "natstone",
		Host:       host,
		Port:       port,
		DontListen: cfg.NoListen,
		JetStream:  true,
		StoreDir:   cfg.DataDir,
		SyncAlways: cfg.SyncAlways,
		NoSigs:     true,
	}, log.With("component", "nats-server"))
	if err != nil {
		unlock()
		return nil, err
	}
	n := &Natstone{server: ns, log: log, unlock: unlock}
	for _, name := range []string{"natstone-broker", "natstone-broker-store"} {
		closed := make(chan struct{})
		nc, err := nats.Connect("", nats.InProcessServer(ns), nats.Name(name),
			nats.ClosedHandler(func(*nats.Conn) { close(closed) }))
		if err != nil {
			n.shutdown()
			return nil, fmt.Errorf("natstone: connect to the embedded server: %w", err)
		}
		n.conns = append(n.conns, nc)
		n.closed = append(n.closed, closed)
	}
	bcfg := broker.Config{}
	if cfg.Broker != nil {
		bcfg = *cfg.Broker
	}
	bcfg.Conn, bcfg.StoreConn = n.conns[0], n.conns[1]
	// The server just started on this process's store, which it holds locked: a claim found there
	// is a dead process's.
	bcfg.TakeOverClaim = true
	if bcfg.Logger == nil {
		bcfg.Logger = log
	}
	if n.broker, err = broker.New(&bcfg); err != nil {
		n.shutdown()
		return nil, err
	}
	if cfg.Starting != nil {
		if err := cfg.Starting(n); err != nil {
			n.shutdown()
			return nil, fmt.Errorf("natstone: embedded Config.Starting: %w", err)
		}
	}
	if err := n.broker.Start(ctx); err != nil {
		n.shutdown()
		return nil, err
	}
	return n, nil
}

func splitListen(listen string) (string, int, error) {
	host, p, err := net.SplitHostPort(listen)
	if err != nil {
		return "", 0, fmt.Errorf("natstone: embedded Config.Listen %q: %w", listen, err)
	}
	port, err := strconv.Atoi(p)
	if err != nil || port < 0 || port > 65535 {
		return "", 0, fmt.Errorf("natstone: embedded Config.Listen %q: bad port", listen)
	}
	if port == 0 {
		port = server.RANDOM_PORT // nats-server reads 0 as its default port, 4222
	}
	return host, port, nil
}

// Server returns the embedded nats-server.
func (n *Natstone) Server() *server.Server { return n.server }

// Broker returns the broker.
func (n *Natstone) Broker() *broker.Broker { return n.broker }

// ClientURL returns the URL NATS clients connect to ("" with NoListen).
func (n *Natstone) ClientURL() string {
	if n.server.Addr() == nil {
		return ""
	}
	return n.server.ClientURL()
}

// Addr returns the address the server listens on for clients (nil with NoListen).
func (n *Natstone) Addr() net.Addr { return n.server.Addr() }

// Connect opens an in-process client connection to the server; the caller closes it. It
// reconnects as any nats.go connection does while the server runs, and Stop closes it once the
// server is down: its requests then fail at once with nats.ErrConnectionClosed, rather than wait
// out their timeouts for a server that will not come back. Once Stop has begun, Connect fails with
// ErrStopped.
func (n *Natstone) Connect(opts ...nats.Option) (*nats.Conn, error) {
	if n.isStopping() {
		return nil, fmt.Errorf("natstone: connect: %w", ErrStopped)
	}
	nc, err := nats.Connect("", append(opts, nats.InProcessServer(n.server))...)
	if err != nil {
		return nil, fmt.Errorf("natstone: connect to the embedded server: %w", err)
	}
	n.mu.Lock()
	defer n.mu.Unlock()
	if n.stopping { // began meanwhile: it may have closed the clients already
		nc.Close()
		return nil, fmt.Errorf("natstone: connect: %w", ErrStopped)
	}
	n.clients = slices.DeleteFunc(n.clients, (*nats.Conn).IsClosed) // those the caller closed
	n.clients = append(n.clients, nc)
	return nc, nil
}

// Stop stops the broker (within ctx), drains its connections and shuts the server down, in that
// order, so no request in progress is cut off by a vanishing server. It is safe to call more than
// once and from several goroutines (a signal handler's and a deferred one): every call returns when
// the first one's stop has ended, with its result.
//
// Give Stop a context of its own with a deadline, as http.Server.Shutdown wants, not the one whose
// end asked for the stop: a ctx already done stops at once, cutting the work in progress, dropping
// the events still buffered (their count is in the error) and writing no snapshot, so the next
// start reads every record. Nothing acknowledged is lost either way.
func (n *Natstone) Stop(ctx context.Context) error {
	switch {
	case n == nil: // a failed Start's: nothing to stop
		return nil
	case n.server == nil:
		return errors.New("natstone: embedded Stop of a Natstone that Start did not return")
	}
	n.stopOnce.Do(func() { n.stopErr = n.stop(ctx) })
	return n.stopErr
}

// isStopping reports whether Stop began.
func (n *Natstone) isStopping() bool {
	n.mu.Lock()
	defer n.mu.Unlock()
	return n.stopping
}

// stop is Stop's one run.
func (n *Natstone) stop(ctx context.Context) error {
	n.mu.Lock()
	n.stopping = true
	n.mu.Unlock()
	err := n.broker.Stop(ctx)
	cut := 0 // connections closed before their drain ended
	for i, nc := range n.conns {
		if derr := nc.Drain(); derr != nil {
			nc.Close()
			continue
		}
		select {
		case <-n.closed[i]:
		case <-ctx.Done():
			select {
			case <-n.closed[i]: // drained all the same
			default:
				nc.Close()
				cut++
			}
		}
	}
	if cut > 0 {
		err = errors.Join(err, fmt.Errorf("natstone: stop: %d of the broker's connections closed before they drained: %w", cut, ctx.Err()))
	}
	n.server.Shutdown()
	n.server.WaitForShutdown()
	n.mu.Lock()
	for _, nc := range n.clients {
		nc.Close()
	}
	n.clients = nil
	n.mu.Unlock()
	n.unlock()
	return err
}

// shutdown tears down what Start got to, on a failed start.
func (n *Natstone) shutdown() {
	for _, nc := range n.conns {
		nc.Close()
	}
	n.mu.Lock()
	for _, nc := range n.clients { // Connect's, as Stop closes them: made in a Starting, say
		nc.Close()
	}
	n.clients = nil
	n.mu.Unlock()
	n.server.Shutdown()
	n.server.WaitForShutdown()
	n.unlock()
}
