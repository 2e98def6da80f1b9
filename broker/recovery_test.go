package broker_test

import (
	"cmp"
	"context"
	"encoding/base64"
	"fmt"
	"slices"
	"testing"
	"time"

	"github.com/nats-io/nats.go"

	"github.com/natstone/natstone/kv"
	"github.com/natstone/natstone/subjects"
)

// TestRestartRebuildsLargeQueuesInOrder: a restart indexes many messages at once (sorted, not one
// by one); afterwards every queue serves them in EDF order, filters and exclusivity still apply,
// and running messages keep their leases.
func TestRestartRebuildsLargeQueuesInOrder(t *testing.T) {
	t.Parallel()
	e := setup(t)
	e.create("s", subjects.CreateQueueRequest{LeaseMS: 600_000})
	e.create("x", subjects.CreateQueueRequest{Type: subjects.Exclusive, ExclusivityKey: "p", LeaseMS: 600_000})
	type msg struct {
		id   string
		prio int64
		at   int // enqueue order: the tie-breaker of equal priorities
	}
	var want []msg
	const n = 5_000 // more than sortKeys sorts by comparison
	for from := 0; from < n; from += subjects.MaxEnqueueBatch {
		var batch, xbatch subjects.EnqueueBatchRequest
		for i := from; i < min(from+subjects.MaxEnqueueBatch, n); i++ {
			prio := int64((i*7919)%1013) - 500 // negatives, and about five messages per priority
			m := subjects.EnqueueRequest{ID: fmt.Sprintf("m%04d", i), Priority: &prio}
			if i%10 == 0 {
				m.Metadata = map[string]string{"tenth": "yes"}
			}
			batch.Messages = append(batch.Messages, m)
			want = append(want, msg{m.ID, prio, i})
			if i%50 == 0 {
				xbatch.Messages = append(xbatch.Messages, subjects.EnqueueRequest{ID: m.ID, Priority: &prio,
					Metadata: map[string]string{"p": fmt.Sprint(i % 3)}})
			}
		}
		must[subjects.EnqueueBatchReply](e, subjects.OpEnqueueBatch, "s", batch)
		must[subjects.EnqueueBatchReply](e, subjects.OpEnqueueBatch, "x", xbatch)
	}
	slices.SortFunc(want, func(a, b msg) int { return cmp.Or(cmp.Compare(a.prio, b.prio), cmp.Compare(a.at, b.at)) })
	held := e.dequeueOne("s")
	if held.ID != want[0].id {
		t.Fatalf("first dequeue %s, want %s", held.ID, want[0].id)
	}
	xheld := e.dequeueOne("x")

	e.restartAll()

	if got := e.get("s", held.ID); got.State != subjects.StateRunning || got.LeaseID != held.LeaseID {
		t.Fatalf("running message after restart: %+v", got)
	}
	if got := e.depth("s", map[string]string{"tenth": "yes"}).Pending; got != n/10-1 {
		t.Fatalf("%d pending match the filter, want %d", got, n/10-1)
	}
	// The exclusivity value of x's running message stays held: its other messages wait.
	for _, m := range e.dequeue("x", subjects.DequeueRequest{Batch: 10}) {
		if m.Metadata["p"] == xheld.Metadata["p"] {
			t.Fatalf("dequeued %s of held value %s", m.ID, xheld.Metadata["p"])
		}
	}
	var got []string
	for len(got) < n-1 {
		ms := e.dequeue("s", subjects.DequeueRequest{Batch: subjects.MaxDequeueBatch})
		if len(ms) == 0 {
			break
		}
		got = append(got, ids(ms)...)
	}
	for i, id := range got {
		if id != want[i+1].id {
			t.Fatalf("dequeue %d after restart: %s, want %s (priority %d)", i, id, want[i+1].id, want[i+1].prio)
		}
	}
	if len(got) != n-1 {
		t.Fatalf("dequeued %d after restart, want %d", len(got), n-1)
	}
}

// TestDeletedQueueStaysDeletedAfterUncleanRestart: after an unclean stop, JetStream can bring back
// a revision of a key that a later one superseded (nats-server#8505), here a config that updates
// replaced. The delete's marker stays the key's last value, so the queue stays deleted, and it can
// be created anew.
func TestDeletedQueueStaysDeletedAfterUncleanRestart(t *testing.T) {
	t.Parallel()
	e := setup(t)
	e.create("q", subjects.CreateQueueRequest{})
	e.create("r", subjects.CreateQueueRequest{})
	for ms := range int64(3) {
		must[subjects.QueueInfo](e, subjects.OpUpdate, "q", subjects.UpdateQueueRequest{LeaseMS: ptr(1000 + ms)})
	}
	e.enqueue("q", subjects.EnqueueRequest{ID: "a"})
	e.enqueue("r", subjects.EnqueueRequest{ID: "b"})
	must[subjects.DeleteReply](e, subjects.OpDelete, "q", nil)

	e.restartAllUnclean()

	var names []string
	for _, qi := range must[subjects.ListReply](e, subjects.OpList, "", nil).Queues {
		names = append(names, qi.Name)
	}
	if !slices.Equal(names, []string{"r"}) {
		t.Fatalf("queues after the restart: %v, want [r]", names)
	}
	fails(e, subjects.CodeQueueNotFound, subjects.OpInfo, "q", nil)
	if ms := e.dequeue("r", subjects.DequeueRequest{Batch: 10}); len(ms) != 1 || ms[0].ID != "b" {
		t.Fatalf("dequeued %v from r, want [b]", ids(ms))
	}
	// Created again over the delete's marker: the new config, and nothing of the old queue.
	info := e.create("q", subjects.CreateQueueRequest{LeaseMS: 5000})
	if info.Config.LeaseMS != 5000 || info.Counts != (subjects.Counts{}) {
		t.Fatalf("q created again: %+v", info)
	}
	e.restartAllUnclean()
	info = must[subjects.QueueInfo](e, subjects.OpInfo, "q", nil)
	if info.Config.LeaseMS != 5000 || info.Counts != (subjects.Counts{}) {
		t.Fatalf("q created again, after another restart: %+v", info)
	}
}

// TestDeletedQueuesRecordsGoAfterUncleanRestart: a queue's delete purges its records, but after an
// unclean stop JetStream can bring back revisions of them that later writes superseded
// (nats-server#8505): here a's record from before its lease and its complete, which comes back at
// every unclean restart. Each start removes such records of a queue that is gone (their payloads
// are) before it serves, so that storage keeps nothing of it, and a queue created again under its
// name starts empty.
func TestDeletedQueuesRecordsGoAfterUncleanRestart(t *testing.T) {
	t.Parallel()
	e := setup(t)
	e.create("q", subjects.CreateQueueRequest{})
	e.create("r", subjects.CreateQueueRequest{})
	for _, id := range []string{"a", "b"} {
		e.enqueue("q", subjects.EnqueueRequest{ID: id, Priority: ptr[int64](int64(id[0]))})
	}
	e.enqueue("r", subjects.EnqueueRequest{ID: "c"})
	m := e.dequeueOne("q")
	must[subjects.Message](e, subjects.OpComplete, "q", subjects.LeaseRequest{ID: m.ID, LeaseID: m.LeaseID})
	must[subjects.DeleteReply](e, subjects.OpDelete, "q", nil)
	e.waitNoKeys("KV_natstone-messages", "$KV.natstone-messages.q.>")

	for range 2 {
		e.restartAllUnclean()
		e.waitNoKeys("KV_natstone-messages", "$KV.natstone-messages.q.>")
	}
	if info := e.create("q", subjects.CreateQueueRequest{}); info.Counts != (subjects.Counts{}) {
		t.Fatalf("q created again: %+v", info.Counts)
	}
	if r := e.enqueue("q", subjects.EnqueueRequest{ID: "a"}); r.Duplicate {
		t.Fatalf("a enqueued in the new q: %+v", r)
	}
	if c := e.depth("r", nil); c.Pending != 1 {
		t.Fatalf("depth of r: %+v", c)
	}
}

// TestDeletedQueuesLocksGoAtStart: JetStream brings back exclusivity locks of a deleted queue after
// an unclean stop, as it brings back records (nats-server#8505; seen in TestFaultsRetentionZero,
// docs/faults.md). Here such a lock is stored behind the broker's back: one naming message a under
// a lease of the queue's earlier life. A start removes it, so storage keeps nothing of the queue,
// and the queue created again under its name leases its own a at once, its value's slot free.
func TestDeletedQueuesLocksGoAtStart(t *testing.T) {
	t.Parallel()
	e := setup(t)
	exclusive := subjects.CreateQueueRequest{Type: subjects.Exclusive, ExclusivityKey: "p"}
	e.create("q", exclusive)
	e.create("r", exclusive)
	e.enqueue("r", subjects.EnqueueRequest{ID: "c", Metadata: map[string]string{"p": "v"}})
	e.dequeueOne("r") // r's lock, which must stay
	must[subjects.DeleteReply](e, subjects.OpDelete, "q", nil)
	e.storeLock("q", "v", 0, "a", "earlier")

	e.restartBroker()
	e.waitNoKeys("KV_natstone-locks", "$KV.natstone-locks.q.>")
	if l, _, err := e.store().GetSlot(context.Background(), "r", "v", 0); err != nil || l.MessageID != "c" {
		t.Fatalf("r's lock after the start: %+v, %v", l, err)
	}
	e.create("q", exclusive)
	e.enqueue("q", subjects.EnqueueRequest{ID: "a", Metadata: map[string]string{"p": "v"}})
	if m := e.dequeueOne("q"); m.ID != "a" {
		t.Fatalf("dequeued %s, want a", m.ID)
	}
}

// TestCollectedStaysCollectedAfterUncleanRestart: JetStream may bring back an earlier revision of
// a record that was removed, when the server rebuilds its blocks after an unclean stop
// (nats-server issue 8505). A collected message must stay collected all the same: not running,
// not pending, not served again.
func TestCollectedStaysCollectedAfterUncleanRestart(t *testing.T) {
	t.Parallel()
	e := setup(t)
	e.create("q", subjects.CreateQueueRequest{RetentionMS: ptr[int64](0)})
	for _, id := range []string{"a", "b", "c"} {
		e.enqueue("q", subjects.EnqueueRequest{ID: id, Priority: ptr[int64](int64(id[0]))})
	}
	for _, id := range []string{"a", "b"} {
		m := e.dequeueOne("q")
		if m.ID != id {
			t.Fatalf("dequeued %s, want %s", m.ID, id)
		}
		must[subjects.Message](e, subjects.OpComplete, "q", subjects.LeaseRequest{ID: id, LeaseID: m.LeaseID})
	}
	e.advance(0) // collects a and b
	fails(e, subjects.CodeMessageNotFound, subjects.OpGet, "q", subjects.GetRequest{ID: "a"})
	// The collections' markers expire (their TTL, on the server's clock): only c's record is left.
	e.waitStreamMsgs("KV_natstone-messages", 1)

	e.restartAllUnclean()

	for _, id := range []string{"a", "b"} {
		fails(e, subjects.CodeMessageNotFound, subjects.OpGet, "q", subjects.GetRequest{ID: id})
	}
	if c := e.depth("q", nil); c.Pending != 1 || c.Running != 0 || c.Completed != 0 {
		t.Fatalf("depth after the restart: %+v", c)
	}
	if ms := e.dequeue("q", subjects.DequeueRequest{Batch: 10}); len(ms) != 1 || ms[0].ID != "c" {
		t.Fatalf("dequeued %v after the restart, want [c]", ids(ms))
	}
}

// TestRestartDeletesPayloadsWithoutRecord: an enqueue stores its payload before its record, so a
// crash between the two leaves a payload that no record references. A start deletes such payloads
// and keeps every other: those of pending, running and retained messages, one whose record
// belongs to a queue that is gone, and one that does not name its message (as natstone's payloads
// did not before they carried kv.BodyIDHeader).
func TestRestartDeletesPayloadsWithoutRecord(t *testing.T) {
	t.Parallel()
	e := setup(t)
	e.create("q", subjects.CreateQueueRequest{LeaseMS: 600_000})
	for i, id := range []string{"done", "running", "pending"} {
		e.enqueue("q", subjects.EnqueueRequest{ID: id, Priority: ptr(int64(i)), Payload: "payload of " + id})
	}
	m := e.dequeueOne("q")
	must[subjects.Message](e, subjects.OpComplete, "q", subjects.LeaseRequest{ID: m.ID, LeaseID: m.LeaseID})
	e.dequeueOne("q")

	ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
	defer cancel()
	js := e.jetStream()
	publish := func(subject, id string, data []byte) uint64 {
		t.Helper()
		msg := nats.NewMsg(subject)
		msg.Data = data
		if id != "" {
			msg.Header.Set(kv.BodyIDHeader, base64.RawURLEncoding.EncodeToString([]byte(id)))
		}
		ack, err := js.PublishMsg(ctx, msg)
		if err != nil {
			t.Fatal(err)
		}
		return ack.Sequence
	}
	// What crashes between payload and record leave: a message never stored, an earlier attempt at
	// a message whose record references another payload, and one of a queue since deleted.
	publish("natstone.body.q", "lost", []byte("orphan"))
	publish("natstone.body.q", "pending", []byte("orphan"))
	publish("natstone.body.old", "x", []byte("orphan"))
	unnamed := publish("natstone.body.q", "", []byte("who knows"))
	// A record of a queue that is gone (a delete a crash interrupted) keeps its payload: it is
	// read, though not loaded.
	seq := publish("natstone.body.old", "z", []byte("payload of z"))
	rec, err := kv.EncodeRecord(&kv.Record{ID: "z", State: subjects.StatePending, BodySeq: seq, Version: 1, MaxAttempts: 3})
	if err != nil {
		t.Fatal(err)
	}
	e.storeRaw("$KV.natstone-messages."+kv.MessageKey("old", "z"), rec)
	e.waitStreamMsgs("natstone-bodies", 8)

	e.restartAll()

	e.waitStreamMsgs("natstone-bodies", 5)
	for _, id := range []string{"done", "running", "pending"} {
		if got := e.get("q", id); got.Payload == nil || *got.Payload != "payload of "+id {
			t.Errorf("%s after the restart: payload %v", id, got.Payload)
		}
	}
	st, err := js.Stream(ctx, "natstone-bodies")
	if err != nil {
		t.Fatal(err)
	}
	for _, seq := range []uint64{seq, unnamed} {
		if _, err := st.GetMsg(ctx, seq); err != nil {
			t.Errorf("payload %d after the restart: %v", seq, err)
		}
	}
}

// TestRestartKeepsPayloadsWhenARecordIsUnreadable: a payload that no loaded record references, of
// a message whose record does not decode, may still be that message's: a start keeps it.
func TestRestartKeepsPayloadsWhenARecordIsUnreadable(t *testing.T) {
	t.Parallel()
	e := setup(t)
	e.create("q", subjects.CreateQueueRequest{})
	e.enqueue("q", subjects.EnqueueRequest{ID: "a"})
	ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
	defer cancel()
	js := e.jetStream()
	body := nats.NewMsg("natstone.body.q")
	body.Data = []byte("the payload of b, perhaps")
	body.Header.Set(kv.BodyIDHeader, base64.RawURLEncoding.EncodeToString([]byte("b")))
	if _, err := js.PublishMsg(ctx, body); err != nil {
		t.Fatal(err)
	}
	e.storeRaw("$KV.natstone-messages."+kv.MessageKey("q", "b"), []byte("not a record"))

	e.restartAll()

	if ms := e.dequeue("q", subjects.DequeueRequest{Batch: 10}); len(ms) != 1 || ms[0].ID != "a" {
		t.Fatalf("dequeued %v after the restart, want [a]", ids(ms))
	}
	e.waitStreamMsgs("natstone-bodies", 2)
}

// TestRestartSkipsARecordWithoutPayload: a record that names no payload (body_seq 0: not one
// natstone writes) is reported and skipped like an unreadable one. It once stopped every start: the
// recovery's checks asked the bodies stream for sequence 0, which the server refuses.
func TestRestartSkipsARecordWithoutPayload(t *testing.T) {
	t.Parallel()
	e := setup(t)
	e.create("q", subjects.CreateQueueRequest{})
	e.enqueue("q", subjects.EnqueueRequest{ID: "a"})
	for _, id := range []string{"pending", "completed"} {
		r := kv.Record{ID: id, State: subjects.StatePending, Version: 1, MaxAttempts: 5}
		if id == "completed" {
			r.State, r.EndedAt = subjects.StateCompleted, 1
		}
		data, err := kv.EncodeRecord(&r)
		if err != nil {
			t.Fatal(err)
		}
		e.storeRaw("$KV.natstone-messages."+kv.MessageKey("q", id), data)
	}

	e.restartAll()

	if ms := e.dequeue("q", subjects.DequeueRequest{Batch: 10}); len(ms) != 1 || ms[0].ID != "a" {
		t.Fatalf("dequeued %v after the restart, want [a]", ids(ms))
	}
}

// TestRestartTakesAnUnreadableLockAsFree: a lock that does not decode names no holder, so a start
// takes its value as free (held again if one of its messages runs) instead of failing, as it once
// did at every start.
func TestRestartTakesAnUnreadableLockAsFree(t *testing.T) {
	t.Parallel()
	e := setup(t)
	e.create("q", subjects.CreateQueueRequest{Type: subjects.Exclusive, ExclusivityKey: "g"})
	e.enqueue("q", subjects.EnqueueRequest{ID: "a1", Priority: ptr(int64(1)), Metadata: map[string]string{"g": "v1"}})
	e.enqueue("q", subjects.EnqueueRequest{ID: "a2", Priority: ptr(int64(2)), Metadata: map[string]string{"g": "v1"}})
	e.enqueue("q", subjects.EnqueueRequest{ID: "b1", Priority: ptr(int64(3)), Metadata: map[string]string{"g": "v2"}})
	running := e.dequeueOne("q")
	if running.ID != "a1" {
		t.Fatalf("dequeued %s, want a1", running.ID)
	}
	ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
	defer cancel()
	for _, value := range []string{"v1", "v2"} {
		e.storeRaw("$KV.natstone-locks."+kv.LockKey("q", value), []byte("not a lock"))
	}

	e.restartAll()

	// v1 stays held by a1, which still runs; v2 is free, and its take overwrites the bad lock.
	if ms := e.dequeue("q", subjects.DequeueRequest{Batch: 10}); len(ms) != 1 || ms[0].ID != "b1" {
		t.Fatalf("dequeued %v after the restart, want [b1]", ids(ms))
	}
	store, err := kv.Open(ctx, &kv.Config{JS: e.jetStream()})
	if err != nil {
		t.Fatal(err)
	}
	for value, holder := range map[string]string{"v1": "a1", "v2": "b1"} {
		l, _, err := store.GetSlot(ctx, "q", value, 0)
		if err != nil || l.MessageID != holder {
			t.Errorf("lock of %s: %+v, %v; want it to name %s", value, l, err, holder)
		}
	}
}
