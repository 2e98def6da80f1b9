package kv_test

import (
	"context"
	"encoding/json"
	"errors"
	"strings"
	"testing"
	"time"

	"github.com/nats-io/nats.go/jetstream"

	"github.com/natstone/natstone/kv"
	"github.com/natstone/natstone/test/natstest"
)

// TestOpenEventsPersistMode: a new events stream persists asynchronously; one an earlier version
// created keeps its mode, which JetStream cannot change (updating it would fail every start).
func TestOpenEventsPersistMode(t *testing.T) {
	t.Parallel()
	srv := natstest.Start(t, nil)
	js := jsOn(t, srv)
	ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
	defer cancel()
	if _, err := js.CreateStream(ctx, jetstream.StreamConfig{Name: "old-events", Subjects: []string{"old.events.>"},
		MaxAge: time.Hour}); err != nil {
		t.Fatal(err)
	}
	mem := &kv.EventsConfig{JS: js, Prefix: "mem", MaxAge: time.Hour, MemoryStorage: true}
	if _, err := kv.OpenEvents(ctx, mem); err != nil {
		t.Fatal(err)
	}
	if st, err := js.Stream(ctx, "mem-events"); err != nil || st.CachedInfo().Config.PersistMode != jetstream.DefaultPersistMode {
		t.Errorf("memory stream: %v, want the default persist mode (async is for files only)", err)
	}
	for prefix, want := range map[string]jetstream.PersistModeType{"new": jetstream.AsyncPersistMode, "old": jetstream.DefaultPersistMode} {
		for range 2 { // creating, then opening what exists
			if _, err := kv.OpenEvents(ctx, &kv.EventsConfig{JS: js, Prefix: prefix, MaxAge: time.Hour}); err != nil {
				t.Fatalf("%s: %v", prefix, err)
			}
			st, err := js.Stream(ctx, prefix+"-events")
			if err != nil {
				t.Fatal(err)
			}
			if c := st.CachedInfo().Config; c.PersistMode != want || c.Duplicates != 100*time.Millisecond {
				t.Errorf("%s: persist mode %v, duplicate window %v; want %v, 100ms", prefix, c.PersistMode, c.Duplicates, want)
			}
		}
	}
	// Opening it again as it is updates nothing; a changed bound does update it.
	updates := watchUpdates(t, srv, js.Conn())
	for _, maxAge := range []time.Duration{time.Hour, 2 * time.Hour} {
		if _, err := kv.OpenEvents(ctx, &kv.EventsConfig{JS: js, Prefix: "new", MaxAge: maxAge}); err != nil {
			t.Fatal(err)
		}
	}
	var update jetstream.StreamConfig
	if got := updates.collect(); len(got) != 1 || got[0].Subject != "$JS.API.STREAM.UPDATE.new-events" {
		t.Errorf("stream updates of opening as it is, then with a new max age: %d, want 1 of new-events", len(got))
	} else if err := json.Unmarshal(got[0].Data, &update); err != nil || update.MaxAge != 2*time.Hour {
		t.Errorf("stream update: max age %v (%v), want 2h", update.MaxAge, err)
	}
	// Replicas for a stream made with one: JetStream cannot have it; say what to do.
	_, err := kv.OpenEvents(ctx, &kv.EventsConfig{JS: js, Prefix: "new", MaxAge: time.Hour, Replicas: 3})
	if !errors.Is(err, kv.ErrEventsNotReplicable) || !strings.Contains(err.Error(), "new-events") {
		t.Errorf("3 replicas of an asynchronous stream: %v, want ErrEventsNotReplicable naming the stream", err)
	}
}

// TestReadAsksTheLeader: a read whose consumer finds fewer events than the stream's leader holds
// (placed on a server behind it) reads again until it has them; one that never does is ErrStale,
// not "no events". A message without events is ErrNotFound.
func TestReadAsksTheLeader(t *testing.T) {
	t.Parallel()
	srv := natstest.Start(t, nil)
	ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
	defer cancel()
	ev, err := kv.OpenEvents(ctx, &kv.EventsConfig{JS: jsOn(t, srv), Prefix: "p", MaxAge: time.Hour})
	if err != nil {
		t.Fatal(err)
	}
	if _, err := ev.Publish(ev.Subject("q", "enqueued", "m"), []byte(`{}`)).Wait(ctx); err != nil {
		t.Fatal(err)
	}
	ev.SetBehind(2)
	if got, more, err := ev.Read(ctx, "q", "m", "", 10); err != nil || len(got) != 1 || more {
		t.Fatalf("after two reads behind: %d events (more %v), %v; want the one", len(got), more, err)
	}
	ev.SetBehind(1 << 20)
	if _, _, err := ev.Read(ctx, "q", "m", "", 10); !errors.Is(err, kv.ErrStale) {
		t.Fatalf("reads behind to the end: %v, want ErrStale", err)
	}
	ev.SetBehind(0)
	if _, _, err := ev.Read(ctx, "q", "z", "", 10); !errors.Is(err, kv.ErrNotFound) {
		t.Fatalf("a message without events: %v, want ErrNotFound", err)
	}
}
