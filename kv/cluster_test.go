//go:build !race

// Built without the race detector: nats-server 2.15.2's clustered code has a data race of its own
// (see broker/cluster_test.go). make test runs this in its second pass.

package kv_test

import (
	"context"
	"testing"
	"time"

	"github.com/nats-io/nats.go/jetstream"

	"github.com/natstone/natstone/kv"
	"github.com/natstone/natstone/test/natstest"
)

// TestStreamLeaderInACluster: a replicated stream's leader is one of the cluster's servers, with
// the time it was elected; once it steps down, the stream's leader is another, elected later.
func TestStreamLeaderInACluster(t *testing.T) {
	t.Parallel()
	srvs := natstest.StartCluster(t, nil)
	js, err := jetstream.New(srvs[0].Connect(t))
	if err != nil {
		t.Fatal(err)
	}
	ctx, cancel := context.WithTimeout(context.Background(), time.Minute)
	defer cancel()
	s, err := kv.Open(ctx, &kv.Config{JS: js, Replicas: 3})
	if err != nil {
		t.Fatal(err)
	}
	messages, _, _ := s.WriteStreams()
	was, err := s.StreamLeader(ctx, messages)
	if err != nil || was.Name == "" || was.Since.IsZero() {
		t.Fatalf("the leader of %s: %+v (%v), want a server and when it was elected", messages, was, err)
	}
	if _, err := srvs[0].Connect(t).Request("$JS.API.STREAM.LEADER.STEPDOWN."+messages, nil, 10*time.Second); err != nil {
		t.Fatal(err)
	}
	for {
		// Unanswered while the stream elects: each question gets a second.
		actx, acancel := context.WithTimeout(ctx, time.Second)
		now, err := s.StreamLeader(actx, messages)
		acancel()
		if err == nil && now.Name != "" && now.Name != was.Name {
			if !now.Since.After(was.Since) {
				t.Fatalf("the leader of %s after a step down: %+v, elected before %+v", messages, now, was)
			}
			return
		}
		select {
		case <-ctx.Done():
			t.Fatalf("the leader of %s is still %+v (%v) a minute after it stepped down", messages, now, err)
		case <-time.After(50 * time.Millisecond):
		}
	}
}
