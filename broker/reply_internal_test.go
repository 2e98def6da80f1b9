package broker

import (
	"context"
	"errors"
	"io"
	"log/slog"
	"math"
	"strings"
	"testing"
	"time"

	"github.com/nats-io/nats.go"
	"github.com/nats-io/nats.go/jetstream"

	"github.com/natstone/natstone/kv"
	"github.com/natstone/natstone/subjects"
	"github.com/natstone/natstone/test/natstest"
)

// FuzzReplyShare checks that replyShare bounds what a message adds to a reply: the JSON that
// AppendMessage writes for it, with its payload in the form SetPayload picks, and a comma. The numbers
// and times are pushed to their longest unless the fuzzer picks them.
func FuzzReplyShare(f *testing.F) {
	f.Add("orders", "01JD42", "region", "eu", []byte("hello"), int64(1_790_000_000_123), uint64(3), 1, 0)
	f.Add("q", `"<>&"`, "k\u2028", "\"\\\"\\", []byte{0, 0, 0, 0, 0}, int64(math.MinInt64), uint64(math.MaxUint64), math.MinInt, 7)
	f.Add("Q_-9", "é", "", "", []byte("\x08\x96\x01\xff"), int64(-1), uint64(0), math.MaxInt, 3)
	f.Fuzz(func(t *testing.T, queue, id, mk, mv string, payload []byte, priority int64, version uint64, attempts, pick int) {
		if subjects.ValidateQueueName(queue) != nil || subjects.ValidateID(id) != nil ||
			subjects.ValidateMetadata(map[string]string{mk: mv}, 1) != nil {
			return // what an enqueue refuses never reaches a reply
		}
		states := []subjects.State{subjects.StatePending, subjects.StateInvisible, subjects.StateRunning,
			subjects.StateCompleted, subjects.StateCanceled, subjects.StateErrored}
		latest := time.UnixMilli(253_402_300_799_999).UTC() // the last millisecond of year 9999
		m := subjects.Message{ID: id, Queue: queue, State: states[uint(pick)%uint(len(states))], Priority: priority,
			Metadata: map[string]string{mk: mv, mk + "2": mv + mv}, Version: version, Attempts: attempts,
			AttemptsLeft: math.MinInt, LeaseID: "NUIDNUIDNUIDNUIDNUID22", LeaseExpiresAt: &latest,
			EnqueuedAt: latest, VisibleAt: latest, UpdatedAt: latest, EndedAt: &latest}
		m.SetPayload(payload)
		got, err := subjects.AppendMessage(nil, &m)
		if err != nil {
			t.Fatal(err)
		}
		if share := replyShare(queue, id, len(payload), m.Metadata); len(got)+1 > share {
			t.Fatalf("the message takes %d bytes with its comma, replyShare says at most %d:\n%s", len(got)+1, share, got)
		}
	})
}

// TestStoppingSaysSo: a request that failed unavailable because the broker stopped while it waited
// on storage says the broker is stopping; any other error, or one while the broker runs, is kept.
func TestStoppingSaysSo(t *testing.T) {
	waited := subjects.Errorf(subjects.CodeUnavailable, "store payload: context canceled")
	got := stopping(waited, true)
	var e *subjects.Error
	if !errors.As(got, &e) || e.Code != subjects.CodeUnavailable || e.Message != "the broker is stopping: store payload: context canceled" {
		t.Fatalf("stopping: %v", got)
	}
	for _, kept := range []struct {
		err     error
		stopped bool
	}{
		{waited, false},
		{subjects.Errorf(subjects.CodeInvalidID, "bad id"), true},
		{subjects.Errorf(subjects.CodeUnavailable, "the broker is stopping"), true},
		{nil, true},
	} {
		if got := stopping(kept.err, kept.stopped); got != kept.err { //nolint:errorlint // the very value, not one wrapping it
			t.Errorf("stopping(%v, %v) = %v, want it kept", kept.err, kept.stopped, got)
		}
	}
}

// TestRequestCutByAStopSaysSo: a request waiting on storage when the broker stops is answered
// unavailable saying the broker is stopping (dispatch's stopping), not only what it waited for.
// Here a history waits for the events before it, which a stream that is gone refuses.
func TestRequestCutByAStopSaysSo(t *testing.T) {
	srv := natstest.Start(t, nil)
	b := startedBroker(t, &Config{Conn: srv.Connect(t), Logger: slog.New(slog.NewTextHandler(io.Discard, nil))})
	ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
	defer cancel()
	js, err := jetstream.New(srv.Connect(t))
	if err != nil {
		t.Fatal(err)
	}
	if err := js.DeleteStream(ctx, kv.DefaultPrefix+"-events"); err != nil {
		t.Fatal(err)
	}
	nc := srv.Connect(t)
	if _, err := nc.Request(b.space.Subject(subjects.OpEnqueue, "q"), []byte(`{"id":"m"}`), 10*time.Second); err != nil {
		t.Fatal(err)
	}
	replies := make(chan *nats.Msg, 1)
	go func() {
		msg, err := nc.Request(b.space.Subject(subjects.OpHistory, "q"), []byte(`{"id":"m"}`), 20*time.Second)
		if err != nil {
			t.Error(err)
		}
		replies <- msg
	}()
	tick := time.NewTicker(5 * time.Millisecond)
	defer tick.Stop()
	for b.events.refused.Load() == 0 { // the enqueued event's batch refused: the history waits on it
		select {
		case <-tick.C:
		case <-ctx.Done():
			t.Fatal("the enqueued event was never refused")
		}
	}
	if err := b.Stop(ctx); err != nil {
		t.Fatal(err)
	}
	msg := <-replies
	if msg == nil || !strings.Contains(string(msg.Data), `"code":"unavailable"`) || !strings.Contains(string(msg.Data), "the broker is stopping: ") {
		t.Fatalf("the history cut by the stop: %v, want unavailable saying the broker is stopping", msg)
	}
}
