package kv_test

import (
	"context"
	"encoding/json"
	"errors"
	"reflect"
	"testing"
	"time"

	"github.com/nats-io/nats.go/jetstream"
	"go.uber.org/goleak"

	"github.com/natstone/natstone/kv"
	"github.com/natstone/natstone/subjects"
	"github.com/natstone/natstone/test/natstest"
)

func TestMain(m *testing.M) { goleak.VerifyTestMain(m) }

func open(t *testing.T) (*kv.Store, *natstest.Server) {
	t.Helper()
	srv := natstest.Start(t, nil)
	js, err := jetstream.New(srv.Connect(t))
	if err != nil {
		t.Fatal(err)
	}
	ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
	defer cancel()
	s, err := kv.Open(ctx, &kv.Config{JS: js})
	if err != nil {
		t.Fatal(err)
	}
	// Opening again is a no-op.
	if _, err := kv.Open(ctx, &kv.Config{JS: js}); err != nil {
		t.Fatalf("second Open: %v", err)
	}
	return s, srv
}

func TestMessageCASAndPurge(t *testing.T) {
	t.Parallel()
	s, _ := open(t)
	ctx := context.Background()
	id := "héllo/wörld. *>" // any printable UTF-8 round-trips through the key encoding
	r := kv.Record{ID: id, State: subjects.StatePending, Priority: 7, Metadata: map[string]string{"k": "v v"}, Version: 1}
	rev, err := s.WriteMessage("q", &r, 0).Wait(ctx)
	if err != nil {
		t.Fatal(err)
	}
	if _, err := s.WriteMessage("q", &r, 0).Wait(ctx); !errors.Is(err, kv.ErrConflict) {
		t.Fatalf("second create: %v, want ErrConflict", err)
	}
	r.State, r.Version = subjects.StateRunning, 2
	if _, err := s.WriteMessage("q", &r, rev+100).Wait(ctx); !errors.Is(err, kv.ErrConflict) {
		t.Fatalf("stale update: %v, want ErrConflict", err)
	}
	rev2, err := s.WriteMessage("q", &r, rev).Wait(ctx)
	if err != nil {
		t.Fatal(err)
	}
	got, gotRev, err := s.GetMessage(ctx, "q", id)
	if err != nil || gotRev != rev2 || got.ID != id || got.State != subjects.StateRunning || got.Metadata["k"] != "v v" {
		t.Fatalf("get: %+v rev %d (want %d) err %v", got, gotRev, rev2, err)
	}
	var loaded []string
	if err := s.LoadMessages(ctx, "", func(q string, r kv.Record, _ uint64, bad error) error {
		if bad != nil {
			return bad
		}
		loaded = append(loaded, q+"/"+r.ID)
		return nil
	}); err != nil || len(loaded) != 1 || loaded[0] != "q/"+id {
		t.Fatalf("load: %v %v", loaded, err)
	}
	if err := s.PurgeMessage(ctx, "q", id); err != nil {
		t.Fatal(err)
	}
	if _, _, err := s.GetMessage(ctx, "q", id); !errors.Is(err, kv.ErrNotFound) {
		t.Fatalf("after purge: %v", err)
	}
	// Purge leaves no tombstone: the id can be created again with revision 0.
	if _, err := s.WriteMessage("q", &r, 0).Wait(ctx); err != nil {
		t.Fatalf("create after purge: %v", err)
	}
}

func TestBodiesAndQueueDelete(t *testing.T) {
	t.Parallel()
	s, _ := open(t)
	ctx := context.Background()
	seq, err := s.WriteBody("q", []byte{0, 1, 2}).Wait(ctx)
	if err != nil {
		t.Fatal(err)
	}
	// No deduplication: the same payload again is a new body (the record's create is what dedups).
	if again, err := s.WriteBody("q", []byte{0, 1, 2}).Wait(ctx); err != nil || again == seq {
		t.Fatalf("second body: seq %d vs %d (%v)", again, seq, err)
	}
	if b, err := s.GetBody(ctx, seq); err != nil || string(b) != "\x00\x01\x02" {
		t.Fatalf("body %q %v", b, err)
	}
	if _, err := s.PutQueue(ctx, "q", kv.QueueRecord{Config: subjects.QueueConfig{Type: subjects.Simple}}, 0); err != nil {
		t.Fatal(err)
	}
	if _, err := s.WriteLock("q", "v", kv.Lock{MessageID: "a", LeaseID: "L"}, 0).Wait(ctx); err != nil {
		t.Fatal(err)
	}
	if l, _, err := s.GetLock(ctx, "q", "v"); err != nil || l.MessageID != "a" {
		t.Fatalf("lock %+v %v", l, err)
	}
	if err := s.DeleteQueue(ctx, "q"); err != nil {
		t.Fatal(err)
	}
	if _, err := s.GetBody(ctx, seq); !errors.Is(err, kv.ErrNotFound) {
		t.Fatalf("body after delete: %v", err)
	}
	if _, _, err := s.GetQueue(ctx, "q"); !errors.Is(err, kv.ErrNotFound) {
		t.Fatalf("queue after delete: %v", err)
	}
	if _, _, err := s.GetLock(ctx, "q", "v"); !errors.Is(err, kv.ErrNotFound) {
		t.Fatalf("lock after delete: %v", err)
	}
}

func TestKeysAreValidTokens(t *testing.T) {
	t.Parallel()
	for _, id := range []string{"a", "with space", "dots.and.more", "*", ">", "日本語", "emoji 🎉", "tab\tnot-printable-but-encodable"} {
		for _, k := range []string{kv.MessageKey("q", id), kv.LockKey("q", id)} {
			for _, c := range k[2:] {
				if !(c >= 'a' && c <= 'z' || c >= 'A' && c <= 'Z' || c >= '0' && c <= '9' || c == '-' || c == '_') {
					t.Fatalf("key %q for %q has %q", k, id, c)
				}
			}
		}
	}
}

// FuzzDecodeRecord: stored values are read back at every start; a corrupted or foreign value must
// be rejected with an error, never panic or produce a record that breaks an invariant.
func FuzzDecodeRecord(f *testing.F) {
	good, _ := kv.EncodeRecord(&kv.Record{ID: "a", State: subjects.StateRunning, Priority: -1, Metadata: map[string]string{"k": "v"}, LeaseID: "L"})
	f.Add(good)
	legacy, _ := json.Marshal(kv.Record{ID: "a", State: subjects.StatePending, Metadata: map[string]string{"k": "v"}})
	f.Add(legacy)
	f.Add([]byte(`{}`))
	f.Add([]byte(`{"id":"x","state":"bogus"}`))
	f.Add([]byte(`null`))
	f.Fuzz(func(t *testing.T, data []byte) {
		r, err := kv.DecodeRecord(data)
		if err != nil {
			return
		}
		if r.ID == "" || stateIndex(r.State) < 0 {
			t.Fatalf("accepted a record breaking invariants: %+v", r)
		}
		again, err := kv.EncodeRecord(&r)
		if err != nil {
			t.Fatal(err)
		}
		back, err := kv.DecodeRecord(again)
		if err != nil {
			t.Fatalf("re-encoded record does not decode: %v", err)
		}
		if len(r.Metadata) == 0 {
			r.Metadata = nil // an empty map and none encode alike
		}
		if !reflect.DeepEqual(back, r) {
			t.Fatalf("decode(encode(r)) != r:\n%+v\n%+v", back, r)
		}
	})
}

func stateIndex(s subjects.State) int {
	for i, x := range subjects.States {
		if x == s {
			return i
		}
	}
	return -1
}
