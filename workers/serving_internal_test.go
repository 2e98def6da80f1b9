package workers

import (
	"net"
	"testing"
	"time"

	"github.com/nats-io/nats.go"

	"github.com/natstone/natstone/test/natstest"
)

// TestServingWatchesForgetClosedConnections: the registry of the connections' announcement watches
// keeps a connection's until one is added after it closed, so that a program making many
// connections does not hold the closed ones.
func TestServingWatchesForgetClosedConnections(t *testing.T) {
	t.Parallel()
	srv := natstest.Start(t, nil)
	first, err := NewClient(srv.Connect(t), nil)
	if err != nil {
		t.Fatal(err)
	}
	if first.servingNext() == nil {
		t.Fatal("no watch for an open connection")
	}
	key := servingKey{first.nc, first.space.Serving()}
	first.nc.Close()
	if !registered(key) {
		t.Fatal("the watch went before another was added")
	}
	next, err := NewClient(srv.Connect(t), nil)
	if err != nil {
		t.Fatal(err)
	}
	if next.servingNext() == nil {
		t.Fatal("no watch for an open connection")
	}
	if registered(key) {
		t.Fatal("the closed connection's watch is still registered after another was added")
	}
	if !registered(servingKey{next.nc, next.space.Serving()}) {
		t.Fatal("the open connection's watch is not registered")
	}
}

func registered(key servingKey) bool {
	watchesMu.Lock()
	defer watchesMu.Unlock()
	return watches[key] != nil
}

// TestServingWatchesWaitForNoOtherConnection: a connection's first watch is added without waiting
// for another connection that is in a reconnect's handshake (nats.go holds a connection's lock for
// all of it): the prune of the closed connections' watches asks their subscriptions, not their
// connections.
func TestServingWatchesWaitForNoOtherConnection(t *testing.T) {
	t.Parallel()
	srv := natstest.Start(t, nil)
	// A server that takes connections and never says INFO: a handshake with it waits out the
	// connection's timeout.
	ln, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { _ = ln.Close() })
	accepted := make(chan net.Conn, 4)
	go func() {
		for {
			c, err := ln.Accept()
			if err != nil {
				return
			}
			accepted <- c
		}
	}()
	stuck, err := nats.Connect(srv.URL()+",nats://"+ln.Addr().String(), nats.DontRandomize(), nats.Timeout(time.Minute),
		nats.MaxReconnects(-1), nats.ReconnectWait(time.Millisecond))
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(stuck.Close)
	t.Cleanup(func() { // first: its handshake then ends, and Close need not wait for it
		for {
			select {
			case c := <-accepted:
				_ = c.Close()
			default:
				return
			}
		}
	})
	c, err := NewClient(stuck, nil)
	if err != nil {
		t.Fatal(err)
	}
	if c.servingNext() == nil {
		t.Fatal("no watch for an open connection")
	}
	if err := stuck.ForceReconnect(); err != nil {
		t.Fatal(err)
	}
	select {
	case c := <-accepted: // its handshake has begun: it holds its connection's lock for a minute
		accepted <- c
	case <-time.After(10 * time.Second):
		t.Fatal("the connection did not reconnect to the silent server")
	}
	next, err := NewClient(srv.Connect(t), nil)
	if err != nil {
		t.Fatal(err)
	}
	added := make(chan (<-chan struct{}), 1)
	go func() { added <- next.servingNext() }()
	select {
	case ch := <-added:
		if ch == nil {
			t.Fatal("no watch for an open connection")
		}
	case <-time.After(10 * time.Second):
		t.Fatal("a connection's first watch waited for another connection's reconnect")
	}
}
