package broker

import (
	"errors"
	"math"
	"testing"
	"time"

	"github.com/natstone/natstone/subjects"
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
