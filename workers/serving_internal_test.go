package workers

import (
	"testing"

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
