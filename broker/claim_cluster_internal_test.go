//go:build !race

// Built without the race detector, as the other tests on a cluster (cluster_test.go says why).

package broker

import (
	"context"
	"slices"
	"testing"
	"time"

	"github.com/nats-io/nats-server/v2/server"

	"github.com/natstone/natstone/broker/clock"
	"github.com/natstone/natstone/test/natstest"
)

// TestStandbyTakesOverAtAStopInACluster: on a cluster, with the claim replicated three times, a
// standby takes over as soon as the broker serving stops, without its claim clock moving. Its
// subscription hears of the release as it is sent, and the read that follows could find the
// claim not yet stored released: the standby then waited ttl/5 (3 clean stops in 9, seen by hand).
// (A release published before a's server knew of the standby's subscription reached nobody: seen
// with three busy loops beside the test, a round in about 30. The standby then takes over at its
// next look, ttl/5 later.)
func TestStandbyTakesOverAtAStopInACluster(t *testing.T) {
	t.Parallel()
	srvs := natstest.StartCluster(t, nil)
	replicated := func(c *Config) { c.Replicas = 3 }
	for round := range 6 {
		a := claimBroker(t, srvs[round%3], clock.NewFake(time.Unix(0, 0)), replicated)
		if err := a.Start(context.Background()); err != nil {
			t.Fatal(err)
		}
		if round == 0 && routedTo(t, srvs[0], srvs[1], a.claim.claims.Subject()) {
			t.Fatal("a's server knows of a subscription to the claim from the standby's before any standby")
		}
		cb := clock.NewFake(time.Unix(0, 0))
		b := claimBroker(t, srvs[(round+1)%3], cb, replicated)
		started := startAsync(b)
		standingBy(t, b, cb, started)
		// The standby hears of the release through its subscription, which a's server learns of
		// from b's over a route, in its own time: a release published before that reaches nobody,
		// and the standby finds it at its next look, which its claim clock never brings here.
		eventually(t, "a's server to know of the standby's subscription", func() bool {
			return routedTo(t, srvs[round%3], srvs[(round+1)%3], b.claim.claims.Subject())
		})
		if err := a.Stop(context.Background()); err != nil {
			t.Fatal(err)
		}
		waitStarted(t, started) // no claim clock moved: the release woke it
		if err := b.Stop(context.Background()); err != nil {
			t.Fatal(err)
		}
	}
}

// routedTo reports whether srv knows of a subscription to subject on from, another server of its
// cluster. (The account's interest alone says nothing: the KV stream's own subscription covers
// subject.)
func routedTo(t *testing.T, srv, from *natstest.Server, subject string) bool {
	t.Helper()
	rz, err := srv.NATS().Routez(&server.RoutezOptions{Subscriptions: true})
	if err != nil {
		t.Fatal(err)
	}
	for _, r := range rz.Routes {
		if r.RemoteID == from.NATS().ID() && slices.Contains(r.Subs, subject) {
			return true
		}
	}
	return false
}
