//go:build !race

// Built without the race detector, as the other tests on a cluster (cluster_test.go says why).

package broker

import (
	"context"
	"testing"
	"time"

	"github.com/natstone/natstone/broker/clock"
	"github.com/natstone/natstone/test/natstest"
)

// TestStandbyTakesOverAtAStopInACluster: on a cluster, with the claim replicated three times, a
// standby takes over as soon as the broker serving stops, without its claim clock moving. Its
// subscription hears of the release as it is sent, and the read that follows could find the
// claim not yet stored released: the standby then waited ttl/5 (3 clean stops in 9, seen by hand).
func TestStandbyTakesOverAtAStopInACluster(t *testing.T) {
	t.Parallel()
	srvs := natstest.StartCluster(t, nil)
	replicated := func(c *Config) { c.Replicas = 3 }
	for round := range 6 {
		a := claimBroker(t, srvs[round%3], clock.NewFake(time.Unix(0, 0)), replicated)
		if err := a.Start(context.Background()); err != nil {
			t.Fatal(err)
		}
		cb := clock.NewFake(time.Unix(0, 0))
		b := claimBroker(t, srvs[(round+1)%3], cb, replicated)
		started := startAsync(b)
		standingBy(t, b, cb, started)
		if err := a.Stop(context.Background()); err != nil {
			t.Fatal(err)
		}
		waitStarted(t, started) // no claim clock moved: the release woke it
		if err := b.Stop(context.Background()); err != nil {
			t.Fatal(err)
		}
	}
}
