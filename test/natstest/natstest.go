package natstest

import (
	"cmp"
	"fmt"
	"net"
	"net/url"
	"os"
	"slices"
	"sync"
	"testing"
	"time"

	"github.com/nats-io/nats-server/v2/server"
	"github.com/nats-io/nats.go"
)

// readyTimeout bounds how long Start and Restart wait for the server to accept
// connections.
var readyTimeout = 10 * time.Second // a variable for tests

// Options tune the test server.
type Options struct {
	// SyncAlways makes JetStream fsync before every ack (server option
	// SyncAlways).
	SyncAlways bool
	// StoreDir is the JetStream store directory. If empty, Start uses
	// t.TempDir(). Set it to start a server on an existing store.
	StoreDir string
	// MaxPayload is the largest message the server takes (server option
	// max_payload). Zero: the server's default, 1 MiB.
	MaxPayload int32
}

// Server is a running in-process nats-server with JetStream.
type Server struct {
	ns       *server.Server
	opts     *server.Options // as given to start, for Restart
	running  *server.Options // as the server runs, for Reload
	url      string
	port     int
	shutdown sync.Once
}

// Start starts a server listening on 127.0.0.1 on a random free port, with
// JetStream enabled and file storage in opts.StoreDir (or t.TempDir() if that
// is empty). The server logs nothing unless NATSTEST_LOG=1 is set. Start
// waits until the server is ready for connections, failing the test if it is
// not, and registers a t.Cleanup that shuts it down. opts may be nil.
func Start(t testing.TB, opts *Options) *Server {
	t.Helper()
	var o Options
	if opts != nil {
		o = *opts
	}
	if o.StoreDir == "" {
		o.StoreDir = t.TempDir()
	}
	return start(t, &server.Options{StoreDir: o.StoreDir, SyncAlways: o.SyncAlways, MaxPayload: o.MaxPayload}, server.RANDOM_PORT)
}

// StartOptions is Start for what Options does not cover (logins, permissions, TLS, an operator): a
// server of opts, on 127.0.0.1 on a random free port, with JetStream in opts.StoreDir (or
// t.TempDir() if that is empty).
func StartOptions(t testing.TB, opts *server.Options) *Server {
	t.Helper()
	o := opts.Clone()
	if o.StoreDir == "" {
		o.StoreDir = t.TempDir()
	}
	return start(t, o, server.RANDOM_PORT)
}

// start runs a server on 127.0.0.1 with JetStream and opts on client port (RANDOM_PORT for any
// free port), registers its shutdown with t.Cleanup and waits until it accepts connections. The
// server logs nothing unless NATSTEST_LOG=1 is set.
func start(t testing.TB, opts *server.Options, port int) *Server {
	t.Helper()
	s, err := tryStart(t, opts, port)
	if err != nil {
		t.Fatal(err)
	}
	return s
}

// tryStart is start, returning why the server did not start instead of failing the test.
func tryStart(t testing.TB, opts *server.Options, port int) (*Server, error) {
	o := opts.Clone()
	o.Host, o.Port, o.JetStream, o.NoSigs = "127.0.0.1", port, true, true
	logging := os.Getenv("NATSTEST_LOG") == "1"
	o.NoLog = !logging
	ns, err := server.NewServer(o)
	if err != nil {
		return nil, fmt.Errorf("natstest: creating nats-server %s: %w", o.ServerName, err)
	}
	if logging {
		ns.ConfigureLogger()
	}
	s := &Server{ns: ns, opts: opts, running: o}
	// Registered before Start so that a failure below still stops the server.
	t.Cleanup(s.Shutdown)

	ns.Start()
	if !ns.ReadyForConnections(readyTimeout) {
		return s, fmt.Errorf("natstest: nats-server %s not ready for connections after %v", o.ServerName, readyTimeout)
	}
	if !ns.JetStreamEnabled() {
		return s, fmt.Errorf("natstest: nats-server %s started without JetStream", o.ServerName)
	}
	addr, ok := ns.Addr().(*net.TCPAddr)
	if !ok {
		return s, fmt.Errorf("natstest: unexpected listener address %v", ns.Addr())
	}
	s.port = addr.Port
	s.url = ns.ClientURL()
	return s, nil
}

// URL returns the client URL of the server, e.g. "nats://127.0.0.1:4222".
func (s *Server) URL() string { return s.url }

// StoreDir returns the JetStream store directory.
func (s *Server) StoreDir() string { return s.opts.StoreDir }

// NATS returns the underlying nats-server.
func (s *Server) NATS() *server.Server { return s.ns }

// Connect returns a client connection to the server, made with nats.Connect
// and the given options, and closed at t.Cleanup. It fails the test if the
// connection cannot be made.
func (s *Server) Connect(t testing.TB, opts ...nats.Option) *nats.Conn {
	t.Helper()
	nc, err := nats.Connect(s.URL(), opts...)
	if err != nil {
		t.Fatalf("natstest: connecting to %s: %v", s.URL(), err)
	}
	t.Cleanup(nc.Close)
	return nc
}

// Shutdown stops the server and waits until it has fully shut down. It is
// idempotent and safe to call concurrently.
func (s *Server) Shutdown() {
	s.shutdown.Do(func() {
		s.ns.Shutdown()
		s.ns.WaitForShutdown()
	})
}

// Reload changes the running server's options as change says, as a configuration reload does
// (what a reload cannot change fails the test): new permissions apply to the connections open.
func (s *Server) Reload(t testing.TB, change func(*server.Options)) {
	t.Helper()
	o := s.running.Clone()
	o.Port = s.port
	change(o)
	if err := s.ns.ReloadOptions(o); err != nil {
		t.Fatalf("natstest: reloading nats-server %s: %v", o.ServerName, err)
	}
	s.running = o
}

// Restart shuts the server down (if it is running) and starts a new one with
// the same options, store directory and port, so client connections with
// reconnection enabled reconnect to it. It returns the new server, whose
// shutdown is registered with t.Cleanup; s must not be used afterwards except
// for Shutdown, URL and StoreDir.
func (s *Server) Restart(t testing.TB) *Server {
	t.Helper()
	s.Shutdown()
	return start(t, s.opts, s.port)
}

// ClusterOptions tune a test cluster.
type ClusterOptions struct {
	// Servers is the number of servers; default 3.
	Servers int
	// SyncAlways lists the servers (by index) that fsync before every ack, which makes them slower
	// to apply what their stream leaders replicate.
	SyncAlways []int
	// Users and NoAuthUser are every server's logins (server options users and no_auth_user):
	// none by default.
	Users      []*server.User
	NoAuthUser string
}

// StartCluster starts a cluster of in-process servers with JetStream, each on 127.0.0.1 with random
// client and route ports and its own temporary store, and waits until each accepts connections
// and the cluster has a JetStream meta leader that every server follows and that can place
// streams on every server. Every server shuts down when the test ends. opts
// may be nil.
func StartCluster(t testing.TB, opts *ClusterOptions) []*Server {
	t.Helper()
	var o ClusterOptions
	if opts != nil {
		o = *opts
	}
	// A route port is picked free and then given to its server, which may find it taken by then
	// (by another test's connection): the whole cluster then starts again, on other ports.
	var err error
	for range clusterTries {
		var servers []*Server
		if servers, err = tryCluster(t, cmp.Or(o.Servers, 3), &o); err == nil {
			return servers
		}
		for _, s := range servers {
			s.Shutdown()
		}
	}
	t.Fatalf("natstest: a cluster did not start in %d tries: %v", clusterTries, err)
	return nil
}

// clusterTries bounds how many times StartCluster starts a cluster.
const clusterTries = 3

// routePort returns a port free a moment ago, for a cluster server's routes (a variable for tests).
var routePort = func() (int, error) {
	l, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		return 0, err
	}
	defer l.Close()
	return l.Addr().(*net.TCPAddr).Port, nil
}

// tryCluster starts a cluster of n servers, as StartCluster describes; on an error it returns the
// servers it started, for the caller to shut down.
func tryCluster(t testing.TB, n int, o *ClusterOptions) ([]*Server, error) {
	ports := make([]int, n)
	routes := make([]*url.URL, n)
	for i := range n {
		var err error
		if ports[i], err = routePort(); err != nil {
			return nil, fmt.Errorf("natstest: a route port: %w", err)
		}
		routes[i] = &url.URL{Scheme: "nats-route", Host: fmt.Sprintf("127.0.0.1:%d", ports[i])}
	}
	var servers []*Server
	for i := range n {
		s, err := tryStart(t, &server.Options{
			ServerName: fmt.Sprintf("s%d", i),
			StoreDir:   t.TempDir(),
			SyncAlways: slices.Contains(o.SyncAlways, i),
			Cluster:    server.ClusterOpts{Name: "natstest", Host: "127.0.0.1", Port: ports[i]},
			Routes:     routes,
			Users:      o.Users,
			NoAuthUser: o.NoAuthUser,
		}, server.RANDOM_PORT)
		if s != nil {
			servers = append(servers, s)
		}
		if err != nil {
			return servers, err
		}
	}
	deadline := time.Now().Add(readyTimeout)
	// Ready: the meta leader has every server as a peer that can take streams, and every server
	// follows it.
	ready := func() bool {
		for _, s := range servers {
			if s.ns.JetStreamIsLeader() {
				return len(s.ns.JetStreamClusterPeers()) == n &&
					!slices.ContainsFunc(servers, func(s *Server) bool { return !s.ns.JetStreamIsCurrent() })
			}
		}
		return false
	}
	for !ready() {
		if time.Now().After(deadline) {
			return servers, fmt.Errorf("natstest: no JetStream meta leader after %v", readyTimeout)
		}
		<-time.After(20 * time.Millisecond)
	}
	return servers, nil
}
