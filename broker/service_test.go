package broker_test

import (
	"encoding/json"
	"testing"
	"time"

	"github.com/nats-io/nats.go/micro"

	"github.com/natstone/natstone/broker"
	"github.com/natstone/natstone/subjects"
)

// TestServiceDiscovery: what `nats micro ls|info|stats` read describes natstone, its endpoints and
// live request and error counts.
func TestServiceDiscovery(t *testing.T) {
	t.Parallel()
	e := setup(t)
	discover := func(subject string, out any) {
		t.Helper()
		msg, err := e.nc.Request(subject, nil, 5*time.Second)
		if err != nil {
			t.Fatalf("%s: %v", subject, err)
		}
		if err := json.Unmarshal(msg.Data, out); err != nil {
			t.Fatalf("%s: %v", subject, err)
		}
	}
	var ping micro.Ping
	discover("$SRV.PING", &ping)
	if ping.Name != broker.ServiceName || ping.Type != micro.PingResponseType || ping.Version != broker.Version || ping.ID == "" {
		t.Fatalf("ping: %+v", ping)
	}
	var info micro.Info
	discover("$SRV.INFO.natstone."+ping.ID, &info)
	if len(info.Endpoints) != len(subjects.Ops) || info.Metadata["prefix"] != "natstone.v1" || info.Metadata["events"] != "natstone.events" {
		t.Fatalf("info: %+v", info)
	}
	for i, ep := range info.Endpoints {
		want := e.space.Wildcard(subjects.Ops[i])
		if subjects.Ops[i] == subjects.OpList {
			want = e.space.Subject(subjects.OpList, "")
		}
		if ep.Name != string(subjects.Ops[i]) || ep.Subject != want || ep.QueueGroup != "" {
			t.Fatalf("endpoint %d: %+v, want %s on %s", i, ep, subjects.Ops[i], want)
		}
	}

	for range 3 {
		e.enqueue("q", subjects.EnqueueRequest{})
	}
	fails(e, subjects.CodeBadRequest, subjects.OpEnqueue, "q", `{"nope":1}`)
	var stats micro.Stats
	discover("$SRV.STATS.natstone", &stats)
	var enq *micro.EndpointStats
	for _, ep := range stats.Endpoints {
		if ep.Name == string(subjects.OpEnqueue) {
			enq = ep
		}
	}
	if enq == nil || enq.NumRequests != 4 || enq.NumErrors != 1 || enq.LastError == "" || enq.ProcessingTime <= 0 {
		t.Fatalf("enqueue stats: %+v", enq)
	}
	if stats.Type != micro.StatsResponseType || stats.Started.IsZero() {
		t.Fatalf("stats: %+v", stats)
	}
}

// TestServiceMetadataEvents: the discovery's events prefix follows the store prefix, and is absent
// when the events are off.
func TestServiceMetadataEvents(t *testing.T) {
	t.Parallel()
	for _, c := range []struct {
		name string
		mod  func(*broker.Config)
		want string // "" for absent
	}{
		{"store prefix", func(c *broker.Config) { c.StorePrefix = "other" }, "other.events"},
		{"no events", func(c *broker.Config) { c.DisableEvents = true }, ""},
	} {
		t.Run(c.name, func(t *testing.T) {
			t.Parallel()
			e := setup(t, c.mod)
			msg, err := e.nc.Request("$SRV.INFO.natstone", nil, 5*time.Second)
			if err != nil {
				t.Fatal(err)
			}
			var info micro.Info
			if err := json.Unmarshal(msg.Data, &info); err != nil {
				t.Fatal(err)
			}
			if got, ok := info.Metadata["events"]; got != c.want || ok != (c.want != "") {
				t.Fatalf("metadata events = %q (present %v), want %q", got, ok, c.want)
			}
		})
	}
}

// TestServingAnnounced: a broker that begins to serve says so on <prefix>.serving, with its service
// id, so that clients cut the long polls parked at the broker before it, gone. The announcement is
// sent before Start returns: the test subscribes after the first broker's start, and hears the
// second's alone.
func TestServingAnnounced(t *testing.T) {
	t.Parallel()
	e := setup(t, func(c *broker.Config) { c.Prefix = "acme.jobs" })
	sub, err := e.nc.SubscribeSync(e.space.Serving())
	if err != nil {
		t.Fatal(err)
	}
	if err := e.nc.Flush(); err != nil {
		t.Fatal(err)
	}
	e.restartBroker()
	msg, err := sub.NextMsg(5 * time.Second)
	if err != nil {
		t.Fatalf("no announcement on %s: %v", e.space.Serving(), err)
	}
	if msg.Subject != "acme.jobs.serving" {
		t.Fatalf("announced on %s, want acme.jobs.serving", msg.Subject)
	}
	var got subjects.Serving
	if err := json.Unmarshal(msg.Data, &got); err != nil {
		t.Fatal(err)
	}
	reply, err := e.nc.Request("$SRV.PING.natstone", nil, 5*time.Second)
	if err != nil {
		t.Fatal(err)
	}
	var ping micro.Ping
	if err := json.Unmarshal(reply.Data, &ping); err != nil {
		t.Fatal(err)
	}
	if got.ID != ping.ID || got.Started.IsZero() || !got.Started.Equal(got.Started.Truncate(time.Millisecond)) {
		t.Fatalf("announced %+v, want the serving broker's id %q and when it began, to the millisecond as the replies' times", got, ping.ID)
	}
	// Once: the announcement was flushed before Start returned, so after a round trip of this
	// connection (which the server answers after delivering what reached it before) any second
	// one would be here.
	if err := e.nc.Flush(); err != nil {
		t.Fatal(err)
	}
	if n, _, err := sub.Pending(); err != nil || n != 0 {
		t.Fatalf("%d more announcements of one start (%v), want none", n, err)
	}
}
