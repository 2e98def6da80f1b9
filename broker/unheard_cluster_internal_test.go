//go:build !race

// Built without the race detector, as the other tests on a cluster (cluster_test.go says why).

package broker

import (
	"context"
	"encoding/base64"
	"encoding/json"
	"errors"
	"strings"
	"testing"
	"time"

	"github.com/nats-io/nats.go"

	"github.com/natstone/natstone/broker/clock"
	"github.com/natstone/natstone/subjects"
	"github.com/natstone/natstone/test/natstest"
)

// TestRepliesInAClusterReachRequestersOnOtherServers: on a cluster, a requester on another server
// than the broker's gets its reply through a route. The broker's server knows that interest, so no
// "no responders" status comes: once the broker has forgotten the reply (a flush came back after
// it), the lease still holds. A requester on another server that is gone has its lease given back,
// as on one server.
func TestRepliesInAClusterReachRequestersOnOtherServers(t *testing.T) {
	t.Parallel()
	srvs := natstest.StartCluster(t, nil)
	b := claimBroker(t, srvs[0], clock.NewFake(time.Unix(0, 0)), func(c *Config) { c.Replicas = 3 })
	if err := b.Start(context.Background()); err != nil {
		t.Fatal(err)
	}
	swept := make(chan struct{}, 1)
	b.unheard.mu.Lock()
	b.unheard.swept = func() {
		select {
		case swept <- struct{}{}:
		default:
		}
	}
	b.unheard.mu.Unlock()
	tracked := func() int {
		b.unheard.mu.Lock()
		defer b.unheard.mu.Unlock()
		return len(b.unheard.sent)
	}

	nc := srvs[1].Connect(t)
	call := func(op subjects.Op, body any, out any) {
		t.Helper()
		data, err := json.Marshal(body)
		if err != nil {
			t.Fatal(err)
		}
		msg, err := nc.Request(b.space.Subject(op, "q"), data, 10*time.Second)
		// The broker's subscriptions reach this server over the route in their own time after
		// its Start, which made sure of its own server only.
		tick := time.NewTicker(10 * time.Millisecond)
		defer tick.Stop()
		for end := time.Now().Add(10 * time.Second); errors.Is(err, nats.ErrNoResponders) && time.Now().Before(end); {
			<-tick.C
			msg, err = nc.Request(b.space.Subject(op, "q"), data, 10*time.Second)
		}
		if err != nil {
			t.Fatalf("%s: %v", op, err)
		}
		if code := msg.Header.Get("Nats-Service-Error-Code"); code != "" {
			t.Fatalf("%s: %s %s", op, code, msg.Data)
		}
		if out != nil {
			if err := json.Unmarshal(msg.Data, out); err != nil {
				t.Fatal(err)
			}
		}
	}
	call(subjects.OpCreate, subjects.CreateQueueRequest{LeaseMS: 600_000}, nil)
	for _, id := range []string{"a", "b", "c", "d"} {
		call(subjects.OpEnqueue, subjects.EnqueueRequest{ID: id}, nil)
	}
	released := make(chan *nats.Msg, 4)
	sub, err := nc.ChanSubscribe("natstone.events.q.released.>", released)
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { _ = sub.Unsubscribe() })
	if err := nc.Flush(); err != nil {
		t.Fatal(err)
	}

	for _, want := range []string{"a", "b", "c"} {
		var got subjects.DequeueReply
		call(subjects.OpDequeue, subjects.DequeueRequest{}, &got)
		if len(got.Messages) != 1 || got.Messages[0].ID != want {
			t.Fatalf("dequeued %+v, want %s", got.Messages, want)
		}
		for tracked() > 0 { // the reply forgotten: a flush came back after it without a status
			select {
			case <-swept:
			case <-time.After(10 * time.Second):
				t.Fatalf("the reply of %s's lease is still tracked", want)
			}
		}
		call(subjects.OpComplete, subjects.LeaseRequest{ID: want, LeaseID: got.Messages[0].LeaseID}, nil)
	}

	gone := srvs[2].Connect(t)
	if err := gone.PublishRequest(b.space.Subject(subjects.OpDequeue, "q"), gone.NewInbox(), nil); err != nil {
		t.Fatal(err)
	}
	select {
	case m := <-released:
		if !strings.HasSuffix(m.Subject, "."+base64.RawURLEncoding.EncodeToString([]byte("d"))) {
			t.Fatalf("released %s, want d", m.Subject)
		}
	case <-time.After(10 * time.Second):
		t.Fatal("d's lease, whose reply reached nobody on the cluster, was not given back")
	}
}
