package broker_test

import (
	"fmt"
	"strings"
	"sync/atomic"
	"testing"
	"time"

	"github.com/natstone/natstone/broker"
	"github.com/natstone/natstone/subjects"
)

// payloadFailures is an observer that counts the payload writes that failed, and nothing else.
type payloadFailures struct{ n atomic.Int64 }

func (*payloadFailures) Request(subjects.Op, subjects.Code, time.Duration) {}
func (*payloadFailures) Write(time.Duration, error)                        {}
func (*payloadFailures) Transition(string, subjects.EventKind, string)     {}
func (p *payloadFailures) PayloadWriteFailed(error)                        { p.n.Add(1) }

// TestStoreMaxBytesRefusesNewPayloads: a store bounded by StoreMaxBytes refuses an enqueue once its
// payloads fill it (unavailable, nothing written) and keeps every payload it took: a full stream
// must not make room by dropping the oldest, the payloads of messages waiting to run. The observer
// is told of the refusal, which no record write shows.
func TestStoreMaxBytesRefusesNewPayloads(t *testing.T) {
	t.Parallel()
	failures := &payloadFailures{}
	e := setup(t, func(c *broker.Config) { c.StoreMaxBytes, c.Observer = 300_000, failures })
	e.create("q", subjects.CreateQueueRequest{})
	payload := func(i int) string { return fmt.Sprint(i) + strings.Repeat("x", 20_000) }
	stored := 0
	for ; stored < 40; stored++ {
		_, err := call[subjects.EnqueueReply](e, subjects.OpEnqueue, "q", subjects.EnqueueRequest{ID: fmt.Sprint("m", stored), Payload: payload(stored)})
		if err != nil {
			if err.Code != subjects.CodeUnavailable || !strings.Contains(err.Message, "maximum bytes") {
				t.Fatalf("enqueue %d past the bound: %s %s; want unavailable, maximum bytes exceeded", stored, err.Code, err.Message)
			}
			break
		}
	}
	if stored == 0 || stored == 40 {
		t.Fatalf("%d of 40 payloads of 20 kB stored under a bound of 300 kB", stored)
	}
	if n := failures.n.Load(); n != 1 {
		t.Fatalf("the observer was told of %d payload writes that failed, want the refused enqueue's", n)
	}
	for i := range stored {
		m := e.dequeueOne("q")
		if m.ID != fmt.Sprint("m", i) || m.Payload == nil || *m.Payload != payload(i) {
			t.Fatalf("dequeue %d: %s with %d bytes of payload; want m%d's whole", i, m.ID, len(derefOr(m.Payload)), i)
		}
	}
	if got := must[subjects.DepthReply](e, subjects.OpDepth, "q", subjects.DepthRequest{}); got.Counts.Pending != 0 {
		t.Fatalf("pending after the dequeues: %d; the refused enqueue wrote a record", got.Counts.Pending)
	}
}

func derefOr(s *string) string {
	if s == nil {
		return ""
	}
	return *s
}
