package main

import (
	"cmp"
	"context"
	"errors"
	"fmt"
	"log/slog"
	"net"
	"net/http"
	"strings"
	"time"

	"github.com/nats-io/nats.go"

	"github.com/natstone/natstone/broker"
	"github.com/natstone/natstone/metrics"
	"github.com/natstone/natstone/web"
	"github.com/natstone/natstone/workers"
)

// httpTimeouts bound the HTTP listener's clients, so that none holds a connection (and its
// goroutine) open without end: readHeader for a request's headers, read for all of it (the bodies
// are of 1 KiB at most), idle between the requests of a connection kept alive, write for a reply,
// from the end of its request's headers (generous: /metrics of many queues is some megabytes, and
// a reply's writes only block on a client that does not read it).
type httpTimeouts struct{ readHeader, read, idle, write time.Duration }

// defaultHTTPTimeouts are the listener's.
var defaultHTTPTimeouts = httpTimeouts{readHeader: 10 * time.Second, read: 15 * time.Second, idle: time.Minute, write: 2 * time.Minute}

// newHTTPServer returns the server of the HTTP listener: h under base's context, errors to log.
func newHTTPServer(h http.Handler, base context.Context, log *slog.Logger, to httpTimeouts) *http.Server {
	return &http.Server{
		Handler:           h,
		ReadHeaderTimeout: to.readHeader,
		ReadTimeout:       to.read,
		IdleTimeout:       to.idle,
		WriteTimeout:      to.write,
		ErrorLog:          slog.NewLogLogger(log.Handler(), slog.LevelWarn),
		BaseContext:       func(net.Listener) context.Context { return base },
	}
}

// httpShutdownTimeout bounds how long a stop waits for the HTTP requests in flight, which it
// cancels: the broker's stop, which comes next, must keep its time for the snapshot and the claim.
const httpShutdownTimeout = 2 * time.Second

// startHTTP starts the HTTP listener of --http, if given: the dashboard and its JSON API, /metrics
// (m, which the broker was configured to report to) and /healthz. The dashboard talks to the broker
// over NATS like any client, on a connection of its own that dial opens; /healthz checks JetStream
// through storeNC, the broker's storage connection (nil: the dashboard's). The returned stop shuts
// the listener down and closes that connection. attrs are the listener's address for the ready log
// line (none without --http).
func startHTTP(cfg *serveConfig, b *broker.Broker, m *metrics.Metrics, dial func() (*nats.Conn, error), storeNC *nats.Conn, log *slog.Logger) (attrs []any, stop func(context.Context) error, err error) {
	if cfg.httpAddr == "" {
		return nil, func(context.Context) error { return nil }, nil
	}
	nc, err := dial()
	if err != nil {
		return nil, nil, fmt.Errorf("--http: connecting to NATS: %w", err)
	}
	client, err := workers.NewClient(nc, &workers.Config{Prefix: cfg.prefix})
	if err != nil {
		nc.Close()
		return nil, nil, err
	}
	m.Watch(b.Snapshot)
	hosts, anyIP := dashboardHosts(cfg.httpAddr, cfg.httpHosts)
	srv, err := web.New(web.Config{
		Client:  client,
		Metrics: m.Handler(),
		Health: metrics.Health(metrics.HealthConfig{
			Conn:        cmp.Or(storeNC, nc),
			StorePrefix: cfg.storePrefix,
			Events:      !cfg.noEvents,
		}),
		Ready:  metrics.Ready(b.Serving),
		Logger: log,
		Hosts:  hosts,
		AnyIP:  anyIP,
	})
	if err != nil {
		nc.Close()
		return nil, nil, err
	}
	ln, err := net.Listen("tcp", cfg.httpAddr)
	if err != nil {
		nc.Close()
		return nil, nil, fmt.Errorf("--http: %w", err)
	}
	// Requests run under base, which a stop cancels: a dashboard request waiting on the broker must
	// not hold the stop up.
	base, cancelBase := context.WithCancel(context.Background())
	hs := newHTTPServer(srv.Handler(), base, log, defaultHTTPTimeouts)
	served := make(chan error, 1)
	go func() { served <- hs.Serve(ln) }()
	addr := ln.Addr().String()
	log.Info("http listening", "addr", addr, "dashboard", "http://"+addr+"/")
	if loopbackHosts(cfg.httpAddr) == nil {
		log.Warn(exposedHTTPWarning, "addr", addr)
	}
	return []any{"http", addr}, func(ctx context.Context) error {
		cancelBase()
		ctx, cancel := context.WithTimeout(ctx, httpShutdownTimeout)
		defer cancel()
		err := hs.Shutdown(ctx)
		if serr := <-served; !errors.Is(serr, http.ErrServerClosed) {
			err = errors.Join(err, serr)
		}
		nc.Close()
		return err
	}, nil
}

// exposedHTTPWarning is logged when --http is not a loopback address: the listener acts with the
// broker's own NATS login, whatever permissions the NATS users of docs/security.md have.
const exposedHTTPWarning = "the HTTP listener is not on a loopback address, and it has no authentication: whoever reaches it can block queues and retry, reschedule, cancel and fire messages and schedules with the broker's NATS login; put it behind an authenticating proxy or a firewall (docs/security.md, \"The HTTP listener\")"

// dashboardHosts returns the host names a dashboard listening on addr answers to, and whether it
// answers to any IP address too (web.Config.AnyIP): the loopback names on a loopback address; else
// localhost and the name --http gives, if a name, and any IP address. The names given with
// --http-host come on top. A name an attacker made resolve to the listener's address (DNS
// rebinding) is not among them.
func dashboardHosts(addr string, names []string) (hosts []string, anyIP bool) {
	hosts = loopbackHosts(addr)
	if hosts == nil {
		hosts, anyIP = []string{"localhost"}, true
		if host, _, err := net.SplitHostPort(addr); err == nil && host != "" && net.ParseIP(host) == nil {
			hosts = append(hosts, host) // --http dash.corp:8080: its own name
		}
	}
	return append(hosts, names...), anyIP
}

// loopbackHosts returns the host names a dashboard listening on addr answers to: with a loopback
// address, the loopback names (see web.Config.Hosts); otherwise any (nil), as the operator chose to
// expose it.
func loopbackHosts(addr string) []string {
	host, _, err := net.SplitHostPort(addr)
	if err != nil {
		return nil
	}
	if ip := net.ParseIP(host); (ip == nil || !ip.IsLoopback()) && !strings.EqualFold(host, "localhost") {
		return nil
	}
	return []string{"localhost", "127.0.0.1", "::1", host}
}
