//go:build !race

// Built without the race detector, as every test of a cluster: nats-server 2.15.2's clustered code
// has a data race of its own (see broker/cluster_test.go). make test runs it in its second pass.

package natstest

import (
	"net"
	"testing"
	"time"
)

// TestStartClusterAgainOnATakenRoutePort: a route port taken between its pick and its server's
// start (here by a listener the test holds) makes that server fail to start; StartCluster then
// starts the cluster again on other ports. Not parallel: it replaces routePort and shortens
// readyTimeout, which the failed server waits out.
func TestStartClusterAgainOnATakenRoutePort(t *testing.T) {
	taken, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	defer taken.Close()
	pick, ready := routePort, readyTimeout
	defer func() { routePort, readyTimeout = pick, ready }()
	readyTimeout = 2 * time.Second
	picks := 0
	routePort = func() (int, error) {
		if picks++; picks == 2 { // the second server's, in the first try
			return taken.Addr().(*net.TCPAddr).Port, nil
		}
		return pick()
	}
	servers := StartCluster(t, nil)
	// The first try failed on the taken port; a loaded machine may need a third (a server not
	// ready within the shortened readyTimeout), never fewer than two.
	if len(servers) != 3 || picks < 6 || picks%3 != 0 {
		t.Fatalf("%d servers after %d port picks, want 3 after two tries of 3 or more", len(servers), picks)
	}
	nc := servers[1].Connect(t)
	if _, err := nc.RTT(); err != nil {
		t.Fatal(err)
	}
}
