package faults

import (
	"fmt"
	"math/rand/v2"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/natstone/natstone/subjects"
)

// cappedQueue is a queue with max_running cappedLimit, filled before the run and worked through the
// kills by its own workers (workCapped), whose leases cappedTracker checks. Its requests are kept
// out of the checker's history.
const (
	cappedQueue    = "capped"
	cappedLimit    = 3
	cappedMessages = 3000
)

// startCapped creates cappedQueue and fills it, each request sent again until its outcome is known.
func startCapped(t *testing.T, admin *client) {
	t.Helper()
	lease, retention, limit := (2 * time.Second).Milliseconds(), time.Hour.Milliseconds(), cappedLimit
	untilKnown(t, "create "+cappedQueue, func() (Outcome, string) {
		var info subjects.QueueInfo
		return admin.call(subjects.OpCreate, cappedQueue, subjects.CreateQueueRequest{LeaseMS: lease, RetentionMS: &retention, MaxRunning: limit}, &info)
	})
	for b := 0; b < cappedMessages; b += subjects.MaxEnqueueBatch {
		var req subjects.EnqueueBatchRequest
		for i := b; i < b+subjects.MaxEnqueueBatch; i++ {
			req.Messages = append(req.Messages, subjects.EnqueueRequest{ID: fmt.Sprintf("c%05d", i), Payload: "c"})
		}
		untilKnown(t, "enqueue_batch "+cappedQueue, func() (Outcome, string) {
			var r subjects.EnqueueBatchReply
			return admin.call(subjects.OpEnqueueBatch, cappedQueue, req, &r) // ids make it idempotent
		})
	}
}

// cappedTracker follows the leases cappedQueue's workers hold, by the broker's clock: a lease from
// its grant (the message's updated_at) until its holder sends its settle or its lease_expires_at,
// whichever comes first. At every grant it counts the leases held then; more than cappedLimit is a
// violation. A lease whose dequeue's outcome was unknown is not seen, and a settle is counted as
// ended when it is sent: both can only make the count smaller than the broker's, never larger.
type cappedTracker struct {
	mu         sync.Mutex
	held       map[string]cappedLease
	leases     int // grants seen
	most       int // the most leases held at one grant
	violations []string
}

type cappedLease struct{ granted, expires time.Time }

func (tr *cappedTracker) grant(ms []subjects.Message) {
	tr.mu.Lock()
	defer tr.mu.Unlock()
	for _, m := range ms {
		if m.LeaseExpiresAt == nil {
			tr.violations = append(tr.violations, fmt.Sprintf("%s leased without lease_expires_at", m.ID))
			continue
		}
		tr.held[m.ID] = cappedLease{m.UpdatedAt, *m.LeaseExpiresAt}
		tr.leases++
	}
	for _, m := range ms {
		at, n := m.UpdatedAt, 0
		var ids []string
		for id, l := range tr.held {
			if !l.granted.After(at) && l.expires.After(at) {
				n++
				ids = append(ids, id)
			}
		}
		tr.most = max(tr.most, n)
		if n > cappedLimit {
			tr.violations = append(tr.violations, fmt.Sprintf("at %s's grant (%v), %d leases held under max_running %d: %s",
				m.ID, at.Format("15:04:05.000"), n, cappedLimit, strings.Join(ids, " ")))
		}
	}
}

func (tr *cappedTracker) end(id string) {
	tr.mu.Lock()
	delete(tr.held, id)
	tr.mu.Unlock()
}

// workCapped dequeues from cappedQueue until stop, holds each message 0–50 ms, and completes it.
func workCapped(c *client, stop <-chan struct{}, tr *cappedTracker) {
	rng := rand.New(rand.NewPCG(uint64(time.Now().UnixNano()), uint64(len(c.name))+13))
	next := func() subjects.DequeueRequest { return subjects.DequeueRequest{Batch: 1 + rng.IntN(3), WaitMS: 200} }
	pollUntil(c, stop, cappedQueue, next, func(ms []subjects.Message) {
		tr.grant(ms)
		<-time.After(time.Duration(rng.IntN(50)) * time.Millisecond)
		for _, m := range ms {
			tr.end(m.ID) // before the complete is sent: the broker may free the room at once
			var done subjects.Message
			c.call(subjects.OpComplete, cappedQueue, subjects.LeaseRequest{ID: m.ID, LeaseID: m.LeaseID}, &done)
		}
	})
}

// checkCapped reports the tracker's violations and returns the leases it saw and the most held at
// once.
func checkCapped(t *testing.T, tr *cappedTracker) (leases, most int) {
	t.Helper()
	tr.mu.Lock()
	defer tr.mu.Unlock()
	for _, v := range tr.violations {
		t.Errorf("%s: %s", cappedQueue, v)
	}
	return tr.leases, tr.most
}
