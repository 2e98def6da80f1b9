//go:build !race

// Built without the race detector in the test process, which runs the cluster: nats-server
// 2.15.2's clustered code has a data race of its own (see broker/cluster_test.go). natstone itself
// still runs with it, as a child process. make test runs this in its second pass, without -race.

package faults

import (
	"math/rand/v2"
	"testing"
	"time"

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
	srvs := natstest.StartCluster(t, &natstest.ClusterOptions{SyncAlways: []int{2}})
	restart := func(rng *rand.Rand) {
		i := rng.IntN(len(srvs))
		srvs[i] = srvs[i].Restart(t)
	}
	// A write whose acknowledgement a restart lost holds its message until it is issued again, a
	// write timeout later (or more: see Restart.Settle): shorter than the default 10s, so that the
	// checker's EDF rule, which must allow for it, still judges most of the run.
	const writeTimeout = 2 * time.Second
	check(t, faultConfig{kills: kills(t, 4), external: true, producers: 2, workers: 4, restartServer: restart, writeTimeout: writeTimeout}, srvs[0].URL(),
		[]string{"serve", "--nats-url", srvs[0].URL(), "--replicas", "3", "--write-timeout", writeTimeout.String()})
}
