//go:build !race

// Built without the race detector in the test process, which runs the cluster: nats-server
// 2.15.2's clustered code has a data race of its own (see broker/cluster_test.go). natstone itself
// still runs with it, as a child process. make test runs this in its second pass, without -race.

package faults

import (
	"math/rand/v2"
	"net/url"
	"testing"
	"time"

	"github.com/nats-io/nats-server/v2/server"

	"github.com/natstone/natstone/test/natstest"
)

// TestFaultsCluster is TestFaultsBrokerOnly on a cluster of three servers (in this process), every
// bucket and stream replicated three times, one server fsyncing before every ack so that it falls
// behind its leaders: each restarted broker's loads may be served by a replica behind its leader,
// which the broker must detect and read again (design.md, Recovery).
func TestFaultsCluster(t *testing.T) {
	t.Parallel()
	srvs := natstest.StartCluster(t, &natstest.ClusterOptions{SyncAlways: []int{2}})
	check(t, faultConfig{kills: kills(t, 4), external: true, producers: 2, workers: 4}, srvs[0].URL(),
		[]string{"serve", "--nats-url", srvs[0].URL(), "--replicas", "3", "--claim-ttl", "2s"})
}

// TestFaultsClusterServers keeps natstone running and restarts, instead, the servers of its
// cluster, one at random each time, the one natstone and its clients are connected to included
// (they reconnect, to it or to another server the cluster told them of). Streams lose replicas and
// leaders while natstone and its clients work on.
func TestFaultsClusterServers(t *testing.T) {
	t.Parallel()
	restartingServers(t, &natstest.ClusterOptions{SyncAlways: []int{2}}, nil, false)
}

// TestFaultsClusterServersUnannounced is TestFaultsClusterServers with natstone's NATS user denied
// JetStream's advisories: it learns of its streams' leader elections only by asking them, once a
// write has waited (design.md, "Writes"). The clients log in as a user who may do anything.
func TestFaultsClusterServersUnannounced(t *testing.T) {
	t.Parallel()
	restartingServers(t, &natstest.ClusterOptions{SyncAlways: []int{2}, NoAuthUser: "any", Users: []*server.User{
		{Username: "any", Password: "any"},
		{Username: "natstone", Password: "natstone", Permissions: &server.Permissions{Subscribe: &server.SubjectPermission{Deny: []string{"$JS.EVENT.>"}}}},
	}}, url.UserPassword("natstone", "natstone"), true)
}

// restartingServers runs TestFaultsClusterServers on a cluster of opts, natstone logging in as
// login (nil: as nobody); unannounced: login may not receive JetStream's advisories.
func restartingServers(t *testing.T, opts *natstest.ClusterOptions, login *url.Userinfo, unannounced bool) {
	srvs := natstest.StartCluster(t, opts)
	restart := func(rng *rand.Rand) {
		i := rng.IntN(len(srvs))
		srvs[i] = srvs[i].Restart(t)
	}
	natsURL, err := url.Parse(srvs[0].URL())
	if err != nil {
		t.Fatal(err)
	}
	natsURL.User = login
	// A write whose acknowledgement a restart lost holds its message until it is issued again, a
	// write timeout later (or more: see Restart.Settle): shorter than the default 10s, so that the
	// checker's EDF rule, which must allow for it, still judges most of the run.
	const writeTimeout = 2 * time.Second
	check(t, faultConfig{kills: kills(t, 4), external: true, producers: 2, workers: 4, restartServer: restart, writeTimeout: writeTimeout, unannounced: unannounced}, srvs[0].URL(),
		[]string{"serve", "--nats-url", natsURL.String(), "--replicas", "3", "--write-timeout", writeTimeout.String()})
}
