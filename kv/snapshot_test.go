package kv_test

import (
	"bytes"
	"context"
	"errors"
	"fmt"
	"os"
	"path/filepath"
	"reflect"
	"strings"
	"testing"
	"time"

	"github.com/nats-io/nats.go/jetstream"

	"github.com/natstone/natstone/kv"
	"github.com/natstone/natstone/subjects"
	"github.com/natstone/natstone/test/natstest"
)

// snapRecord is a record of a snapshot as ReadSnapshot gives it back.
type snapRecord struct {
	Queue string
	Rec   kv.Record
	Rev   uint64
}

// snapshotRecords is a snapshot's content: two queues, records of every kind of field.
func snapshotRecords() []snapRecord {
	return []snapRecord{
		{"a", kv.Record{ID: "m1", State: subjects.StatePending, Priority: -5, BodySeq: 3, PayloadSize: 10, Version: 1, MaxAttempts: 3, EnqueuedAt: 1, VisibleAt: 1, UpdatedAt: 1}, 7},
		{"a", kv.Record{ID: "m2 é", State: subjects.StateRunning, Priority: 1 << 40, BodySeq: 4, Metadata: map[string]string{"p": "x", "k": "v"},
			Version: 5, Attempts: 1, MaxAttempts: 3, LeaseMS: 2000, LeaseID: "L", LeaseExpires: 99, RequestID: "R", EnqueuedAt: 2, VisibleAt: 2, UpdatedAt: 50}, 12},
		{"b", kv.Record{ID: "m3", State: subjects.StateCompleted, BodySeq: 9, Version: 3, Attempts: 1, MaxAttempts: 1, Released: true, EnqueuedAt: 3, VisibleAt: 3, UpdatedAt: 60, EndedAt: 60}, 1 << 33},
	}
}

// fillWith writes recs, grouped by queue in their order, to w.
func fillWith(recs []snapRecord) func(w *kv.SnapshotWriter) error {
	return func(w *kv.SnapshotWriter) error {
		for i := 0; i < len(recs); {
			j := i
			for j < len(recs) && recs[j].Queue == recs[i].Queue {
				j++
			}
			if err := w.Queue(recs[i].Queue, j-i); err != nil {
				return err
			}
			for _, r := range recs[i:j] {
				if err := w.Record(&r.Rec, r.Rev); err != nil {
					return err
				}
			}
			i = j
		}
		return nil
	}
}

// sameRecords reports whether a and b hold the same records, an empty metadata map and none being
// the same (they encode alike).
func sameRecords(a, b []snapRecord) bool {
	if len(a) != len(b) {
		return false
	}
	for i := range a {
		x, y := a[i], b[i]
		if len(x.Rec.Metadata) == 0 && len(y.Rec.Metadata) == 0 {
			x.Rec.Metadata, y.Rec.Metadata = nil, nil
		}
		if !reflect.DeepEqual(x, y) {
			return false
		}
	}
	return true
}

func readSnapshot(ctx context.Context, t *testing.T, s *kv.Store) ([]snapRecord, error) {
	t.Helper()
	info, err := s.SnapshotInfo(ctx)
	if err != nil {
		return nil, err
	}
	var got []snapRecord
	n, err := s.ReadSnapshot(ctx, info, func(queue string, r kv.Record, rev uint64) error {
		got = append(got, snapRecord{queue, r, rev})
		return nil
	})
	if err == nil && n != len(got) {
		t.Errorf("ReadSnapshot counted %d records, passed %d", n, len(got))
	}
	return got, err
}

// TestSnapshotRoundTrip: a snapshot written is read back record for record, with its fence and
// count; writing another replaces it; deleting it leaves none.
func TestSnapshotRoundTrip(t *testing.T) {
	t.Parallel()
	s, srv := open(t)
	ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
	defer cancel()
	if _, err := s.SnapshotInfo(ctx); !errors.Is(err, kv.ErrNoSnapshot) {
		t.Fatalf("info of no snapshot: %v, want ErrNoSnapshot", err)
	}
	r := kv.Record{ID: "x", State: subjects.StatePending, Version: 1}
	if _, err := s.WriteMessage("a", &r, 0).Wait(ctx); err != nil {
		t.Fatal(err)
	}
	fence, stored, err := s.Fence(ctx)
	if err != nil {
		t.Fatal(err)
	}
	if fence.Messages == 0 || stored != 1 {
		t.Fatalf("fence %v with %d messages stored", fence, stored)
	}
	recs := snapshotRecords()
	info, err := s.WriteSnapshot(ctx, fence, uint64(len(recs)), "broker-1", fillWith(recs))
	if err != nil {
		t.Fatal(err)
	}
	got, err := s.SnapshotInfo(ctx)
	if err != nil {
		t.Fatal(err)
	}
	if got.Fence != fence || got.Records != 3 || got.Broker != "broker-1" || got.Size != info.Size || got.Size == 0 ||
		got.WrittenAt.Sub(info.WrittenAt).Abs() > time.Millisecond {
		t.Fatalf("snapshot info %+v, want %+v", got, info)
	}
	read, err := readSnapshot(ctx, t, s)
	if err != nil {
		t.Fatal(err)
	}
	if !reflect.DeepEqual(read, recs) {
		t.Fatalf("read back:\n%+v\nwant\n%+v", read, recs)
	}

	// Another replaces it whole, and takes with it the chunks a write stopped part way left.
	js := jsOn(t, srv)
	if _, err := js.Publish(ctx, "$O.natstone-snapshots.C.leftover", []byte("a chunk nobody references")); err != nil {
		t.Fatal(err)
	}
	fence.Messages++
	if _, err := s.WriteSnapshot(ctx, fence, 1, "broker-2", fillWith(recs[2:])); err != nil {
		t.Fatal(err)
	}
	st, err := js.Stream(ctx, "OBJ_natstone-snapshots")
	if err != nil {
		t.Fatal(err)
	}
	chunks, err := st.Info(ctx, jetstream.WithSubjectFilter("$O.natstone-snapshots.C.>"))
	if err != nil {
		t.Fatal(err)
	}
	if n := len(chunks.State.Subjects); n != 1 {
		t.Fatalf("chunk subjects after the second snapshot: %v, want only its own", chunks.State.Subjects)
	}
	if got, err := s.SnapshotInfo(ctx); err != nil || got.Fence != fence || got.Broker != "broker-2" {
		t.Fatalf("second snapshot's info %+v, %v", got, err)
	}
	if read, err := readSnapshot(ctx, t, s); err != nil || !reflect.DeepEqual(read, recs[2:]) {
		t.Fatalf("second snapshot read back %+v, %v", read, err)
	}
	// A read for the first one, whose info a replica behind could still give, does not read the
	// second one in its place: its fence was never checked.
	if _, err := s.ReadSnapshot(ctx, got, func(string, kv.Record, uint64) error { return nil }); !errors.Is(err, kv.ErrSnapshotBroken) {
		t.Fatalf("the second snapshot read for the first one's info: %v, want ErrSnapshotBroken", err)
	}

	if err := s.DeleteSnapshot(ctx); err != nil {
		t.Fatal(err)
	}
	if _, err := s.SnapshotInfo(ctx); !errors.Is(err, kv.ErrNoSnapshot) {
		t.Fatalf("info after delete: %v, want ErrNoSnapshot", err)
	}
	if err := s.DeleteSnapshot(ctx); err != nil {
		t.Fatalf("deleting no snapshot: %v", err)
	}
}

// TestSnapshotWriteFailsWhole: a snapshot whose records cannot all be written — fill fails, writes
// fewer or more records than it announced — is not stored, and the one stored before stays.
func TestSnapshotWriteFailsWhole(t *testing.T) {
	t.Parallel()
	s, _ := open(t)
	ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
	defer cancel()
	recs := snapshotRecords()
	fence := kv.Fence{Messages: 1}
	if _, err := s.WriteSnapshot(ctx, fence, uint64(len(recs)), "before", fillWith(recs)); err != nil {
		t.Fatal(err)
	}
	boom := errors.New("boom")
	for name, fill := range map[string]func(w *kv.SnapshotWriter) error{
		"fill fails": func(w *kv.SnapshotWriter) error {
			if err := fillWith(recs[:1])(w); err != nil {
				return err
			}
			return boom
		},
		"fewer records than its queue announced": func(w *kv.SnapshotWriter) error {
			if err := w.Queue("a", 2); err != nil {
				return err
			}
			return w.Record(&recs[0].Rec, 1)
		},
		"more records than its queue announced": func(w *kv.SnapshotWriter) error {
			if err := fillWith(recs[:1])(w); err != nil {
				return err
			}
			return w.Record(&recs[1].Rec, 2)
		},
		"fewer records than the snapshot announced": fillWith(recs[:2]),
		"a record that does not encode": func(w *kv.SnapshotWriter) error {
			if err := w.Queue("a", 1); err != nil {
				return err
			}
			return w.Record(&kv.Record{ID: "bad", State: "bogus"}, 1)
		},
	} {
		if _, err := s.WriteSnapshot(ctx, kv.Fence{Messages: 2}, uint64(len(recs)), "after", fill); err == nil {
			t.Errorf("%s: written", name)
		}
		info, err := s.SnapshotInfo(ctx)
		if err != nil || info.Broker != "before" || info.Fence != fence {
			t.Fatalf("%s: the snapshot stored is %+v, %v", name, info, err)
		}
		if read, err := readSnapshot(ctx, t, s); err != nil || !reflect.DeepEqual(read, recs) {
			t.Fatalf("%s: the snapshot stored reads %+v, %v", name, read, err)
		}
	}
}

// TestSnapshotBrokenIsReported: a snapshot whose bytes were changed, or that another format wrote,
// is not taken for one: ReadSnapshot fails with ErrSnapshotBroken (the digest no longer matches),
// SnapshotInfo with ErrNoSnapshot.
func TestSnapshotBrokenIsReported(t *testing.T) {
	t.Parallel()
	s, srv, ctx := storedSnapshot(t)
	// A letter of a message id: the snapshot still decodes, only its digest tells.
	natstest.ChangeObjectByte(t, jsOn(t, srv), "natstone-snapshots", kv.SnapshotObject, []byte("m2 é"), 'n')
	if _, err := s.SnapshotInfo(ctx); err != nil {
		t.Fatalf("info of the changed snapshot: %v", err)
	}
	if _, err := readSnapshot(ctx, t, s); !errors.Is(err, kv.ErrSnapshotBroken) || !errors.Is(err, jetstream.ErrDigestMismatch) {
		t.Fatalf("reading a changed snapshot: %v, want ErrSnapshotBroken for its digest", err)
	}

	// Another format's snapshot is none.
	obs, err := jsOn(t, srv).ObjectStore(ctx, "natstone-snapshots")
	if err != nil {
		t.Fatal(err)
	}
	if _, err := obs.Put(ctx, jetstream.ObjectMeta{Name: kv.SnapshotObject, Metadata: map[string]string{"format": "0"}}, bytes.NewReader([]byte("x"))); err != nil {
		t.Fatal(err)
	}
	if _, err := s.SnapshotInfo(ctx); !errors.Is(err, kv.ErrNoSnapshot) {
		t.Fatalf("info of another format's snapshot: %v, want ErrNoSnapshot", err)
	}
}

// TestDecodeSnapshotCutShort: a snapshot cut anywhere before its end is broken, never read as a
// shorter one; one with bytes after its end is broken too.
func TestDecodeSnapshotCutShort(t *testing.T) {
	t.Parallel()
	recs := snapshotRecords()
	var buf bytes.Buffer
	if err := kv.EncodeSnapshot(&buf, uint64(len(recs)), fillWith(recs)); err != nil {
		t.Fatal(err)
	}
	whole := buf.Bytes()
	for cut := range len(whole) {
		if _, err := kv.DecodeSnapshot(bytes.NewReader(whole[:cut]), func(string, kv.Record, uint64) error { return nil }); !errors.Is(err, kv.ErrSnapshotBroken) {
			t.Fatalf("cut at %d of %d: %v, want ErrSnapshotBroken", cut, len(whole), err)
		}
	}
	longer := append(bytes.Clone(whole), 0)
	if _, err := kv.DecodeSnapshot(bytes.NewReader(longer), func(string, kv.Record, uint64) error { return nil }); !errors.Is(err, kv.ErrSnapshotBroken) {
		t.Fatalf("a byte after the end: %v, want ErrSnapshotBroken", err)
	}
	// The function's own error is returned as it is.
	boom := errors.New("boom")
	if _, err := kv.DecodeSnapshot(bytes.NewReader(whole), func(string, kv.Record, uint64) error { return boom }); !errors.Is(err, boom) || errors.Is(err, kv.ErrSnapshotBroken) {
		t.Fatalf("fn's error: %v", err)
	}
}

// FuzzDecodeSnapshot: any bytes decode to records that re-encode to the same snapshot, or fail
// with ErrSnapshotBroken; nothing panics.
func FuzzDecodeSnapshot(f *testing.F) {
	recs := snapshotRecords()
	var buf bytes.Buffer
	if err := kv.EncodeSnapshot(&buf, uint64(len(recs)), fillWith(recs)); err != nil {
		f.Fatal(err)
	}
	f.Add(buf.Bytes())
	var empty bytes.Buffer
	if err := kv.EncodeSnapshot(&empty, 0, func(*kv.SnapshotWriter) error { return nil }); err != nil {
		f.Fatal(err)
	}
	f.Add(empty.Bytes())
	f.Add([]byte("natstone-snapshot\nQ\x01a\xff\xff\xff\xff\xff\xff\xff\xff\xff\x01"))
	f.Fuzz(func(t *testing.T, data []byte) {
		var got []snapRecord
		n, err := kv.DecodeSnapshot(bytes.NewReader(data), func(queue string, r kv.Record, rev uint64) error {
			got = append(got, snapRecord{queue, r, rev})
			return nil
		})
		if err != nil {
			if !errors.Is(err, kv.ErrSnapshotBroken) {
				t.Fatalf("error not ErrSnapshotBroken: %v", err)
			}
			return
		}
		if n != len(got) {
			t.Fatalf("counted %d, passed %d", n, len(got))
		}
		// What was read is what a queue's records were: grouping them again writes a snapshot that
		// reads the same. (Two sections of one queue read as one here, so bytes may differ.)
		var again bytes.Buffer
		if err := kv.EncodeSnapshot(&again, uint64(len(got)), fillWith(got)); err != nil {
			t.Fatalf("records read do not encode: %v", err)
		}
		var back []snapRecord
		if _, err := kv.DecodeSnapshot(bytes.NewReader(again.Bytes()), func(queue string, r kv.Record, rev uint64) error {
			back = append(back, snapRecord{queue, r, rev})
			return nil
		}); err != nil {
			t.Fatalf("re-encoded snapshot does not decode: %v", err)
		}
		if !sameRecords(back, got) {
			t.Fatalf("decode(encode(records)) != records:\n%+v\n%+v", back, got)
		}
	})
}

// TestFenceMovesWithEveryWrite: every kind of write natstone makes moves the fence — a record, a
// collection's marker, a lock, a config, a payload, a payload's delete and a queue's purge.
func TestFenceMovesWithEveryWrite(t *testing.T) {
	t.Parallel()
	s, _ := open(t)
	ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
	defer cancel()
	seq, err := s.WriteBody("q", "a", []byte("p")).Wait(ctx)
	if err != nil {
		t.Fatal(err)
	}
	r := kv.Record{ID: "a", State: subjects.StatePending, BodySeq: seq, Version: 1}
	rev, err := s.WriteMessage("q", &r, 0).Wait(ctx)
	if err != nil {
		t.Fatal(err)
	}
	if _, err := s.PutQueue(ctx, "q", kv.QueueRecord{}, 0); err != nil {
		t.Fatal(err)
	}
	writes := []struct {
		name  string
		write func() error
	}{
		{"record", func() error {
			r.Version++
			var err error
			rev, err = s.WriteMessage("q", &r, rev).Wait(ctx)
			return err
		}},
		{"lock", func() error { _, err := s.WriteSlot("q", "v", 0, kv.Lock{MessageID: "a"}, 0).Wait(ctx); return err }},
		{"config", func() error { _, err := s.PutQueue(ctx, "q2", kv.QueueRecord{}, 0); return err }},
		{"payload", func() error { _, err := s.WriteBody("q", "b", []byte("p")).Wait(ctx); return err }},
		{"payload delete", func() error { return s.DeleteBody(ctx, seq) }},
		{"collection", func() error { _, err := s.CollectMessage("q", "a", rev).Wait(ctx); return err }},
		{"queue delete", func() error { return s.DeleteQueue(ctx, "q") }},
	}
	before, _, err := s.Fence(ctx)
	if err != nil {
		t.Fatal(err)
	}
	for _, w := range writes {
		if err := w.write(); err != nil {
			t.Fatalf("%s: %v", w.name, err)
		}
		after, _, err := s.Fence(ctx)
		if err != nil {
			t.Fatal(err)
		}
		if after == before {
			t.Errorf("%s: the fence stayed %v", w.name, before)
		}
		before = after
	}
}

// TestSnapshotOfManyChunks: a snapshot larger than a chunk is stored in several, and read back
// whole.
func TestSnapshotOfManyChunks(t *testing.T) {
	t.Parallel()
	s, srv := open(t)
	ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
	defer cancel()
	recs := manySnapshotRecords(5000)
	info, err := s.WriteSnapshot(ctx, kv.Fence{Messages: 5000}, uint64(len(recs)), "b", fillWith(recs))
	if err != nil {
		t.Fatal(err)
	}
	obs, err := jsOn(t, srv).ObjectStore(ctx, "natstone-snapshots")
	if err != nil {
		t.Fatal(err)
	}
	oi, err := obs.GetInfo(ctx, kv.SnapshotObject)
	if err != nil {
		t.Fatal(err)
	}
	if oi.Chunks < 2 || oi.Size != info.Size {
		t.Fatalf("object of %d chunks and %d bytes, want several chunks and %d bytes", oi.Chunks, oi.Size, info.Size)
	}
	read, err := readSnapshot(ctx, t, s)
	if err != nil {
		t.Fatal(err)
	}
	if !sameRecords(read, recs) {
		t.Fatalf("read back %d records, want the %d written", len(read), len(recs))
	}
}

// manySnapshotRecords returns n records in queues of 1000, enough for several chunks at 5000.
func manySnapshotRecords(n int) []snapRecord {
	var recs []snapRecord
	for i := range n {
		r := snapshotRecords()[i%3]
		r.Queue = fmt.Sprintf("q%d", i/1000)
		r.Rec.ID = fmt.Sprintf("message-%06d", i)
		r.Rev = uint64(i + 1)
		recs = append(recs, r)
	}
	return recs
}

// TestSnapshotMissingChunk: a snapshot whose chunk is not stored (deleted, as `nats stream rmm`
// does) is broken at once. It was read until its ctx ended, a start's whole --start-timeout, and
// the read of every record that should have followed then had no time left.
func TestSnapshotMissingChunk(t *testing.T) {
	t.Parallel()
	s, srv, ctx := storedSnapshot(t)
	js := jsOn(t, srv)
	obs, err := js.ObjectStore(ctx, "natstone-snapshots")
	if err != nil {
		t.Fatal(err)
	}
	oi, err := obs.GetInfo(ctx, kv.SnapshotObject)
	if err != nil {
		t.Fatal(err)
	}
	st, err := js.Stream(ctx, "OBJ_natstone-snapshots")
	if err != nil {
		t.Fatal(err)
	}
	chunk, err := st.GetLastMsgForSubject(ctx, "$O.natstone-snapshots.C."+oi.NUID)
	if err != nil {
		t.Fatal(err)
	}
	if err := st.DeleteMsg(ctx, chunk.Sequence); err != nil {
		t.Fatal(err)
	}
	if _, err := readSnapshot(ctx, t, s); !errors.Is(err, kv.ErrSnapshotBroken) || ctx.Err() != nil {
		t.Fatalf("reading a snapshot with its chunk gone: %v (ctx: %v), want ErrSnapshotBroken before the ctx ends", err, ctx.Err())
	}
}

// TestSnapshotChunkDamagedOnDisk: a chunk whose block was damaged on disk, which the server counts
// but does not deliver, makes the snapshot broken once no chunk came for snapshotStall, not when
// the read's ctx ends.
func TestSnapshotChunkDamagedOnDisk(t *testing.T) {
	t.Parallel()
	_, srv, ctx := storedSnapshot(t)
	srv.Shutdown()
	blocks, err := filepath.Glob(filepath.Join(srv.StoreDir(), "jetstream", "*", "streams", "OBJ_natstone-snapshots", "msgs", "*.blk"))
	if err != nil || len(blocks) == 0 {
		t.Fatalf("the snapshots stream's blocks: %v, %v", blocks, err)
	}
	damaged := false
	for _, f := range blocks {
		data, err := os.ReadFile(f)
		if err != nil {
			t.Fatal(err)
		}
		if at := bytes.LastIndex(data, []byte("natstone-snapshot\n")); at >= 0 && at+30 < len(data) {
			data[at+30] ^= 1
			if err := os.WriteFile(f, data, 0o600); err != nil {
				t.Fatal(err)
			}
			damaged = true
		}
	}
	if !damaged {
		t.Fatal("no block holds the snapshot's chunk")
	}
	srv = srv.Restart(t)
	s, err := kv.Open(ctx, &kv.Config{JS: jsOn(t, srv)})
	if err != nil {
		t.Fatal(err)
	}
	s.SetSnapshotStall(500 * time.Millisecond)
	if _, err := s.SnapshotInfo(ctx); err != nil {
		t.Fatalf("the damaged snapshot's info: %v", err)
	}
	if _, err := readSnapshot(ctx, t, s); !errors.Is(err, kv.ErrSnapshotBroken) || !strings.Contains(err.Error(), "no chunk came") || ctx.Err() != nil {
		t.Fatalf("reading a damaged snapshot: %v (ctx: %v), want ErrSnapshotBroken for a chunk that did not come, before the ctx ends", err, ctx.Err())
	}
}

// storedSnapshot opens a store and writes a snapshot of snapshotRecords to it, in one chunk. ctx
// lasts 30 s, the test's bound.
func storedSnapshot(t *testing.T) (*kv.Store, *natstest.Server, context.Context) {
	t.Helper()
	s, srv := open(t)
	ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
	t.Cleanup(cancel)
	recs := snapshotRecords()
	if _, err := s.WriteSnapshot(ctx, kv.Fence{Messages: 1}, uint64(len(recs)), "b", fillWith(recs)); err != nil {
		t.Fatal(err)
	}
	return s, srv, ctx
}
