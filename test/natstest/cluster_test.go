//go:build !race

// Built without the race detector, as the broker's tests on a cluster are (see
// broker/cluster_test.go): nats-server's clustered code has a data race of its own.

package natstest_test

import (
	"testing"
	"time"

	"github.com/nats-io/nats.go/jetstream"

	"github.com/natstone/natstone/test/natstest"
)

// TestStartCluster: a cluster is ready for a bucket replicated on every server as soon as
// StartCluster returns, and a value put through one server is read through another (in the end:
// a replica may answer before it has applied the put).
func TestStartCluster(t *testing.T) {
	ctx := testContext(t)
	srvs := natstest.StartCluster(t, &natstest.ClusterOptions{SyncAlways: []int{2}})
	if len(srvs) != 3 {
		t.Fatalf("%d servers, want 3", len(srvs))
	}
	js, err := jetstream.New(srvs[0].Connect(t))
	if err != nil {
		t.Fatal(err)
	}
	kv, err := js.CreateKeyValue(ctx, jetstream.KeyValueConfig{Bucket: "natstest", Replicas: 3})
	if err != nil {
		t.Fatalf("CreateKeyValue R3: %v", err)
	}
	if _, err := kv.Put(ctx, "k", []byte("v")); err != nil {
		t.Fatal(err)
	}
	js2, err := jetstream.New(srvs[2].Connect(t))
	if err != nil {
		t.Fatal(err)
	}
	kv2, err := js2.KeyValue(ctx, "natstest")
	if err != nil {
		t.Fatal(err)
	}
	// Any replica may answer a get, and one may not have applied the put yet: ask until one has.
	for {
		e, err := kv2.Get(ctx, "k")
		if err == nil && string(e.Value()) == "v" {
			return
		}
		select {
		case <-ctx.Done():
			t.Fatalf("Get through another server: %v", err)
		case <-time.After(10 * time.Millisecond):
		}
	}
}
