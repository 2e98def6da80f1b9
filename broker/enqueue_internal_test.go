package broker

import (
	"context"
	"errors"
	"fmt"
	"slices"
	"testing"
	"time"

	"github.com/natstone/natstone/broker/clock"
	"github.com/natstone/natstone/subjects"
)

// TestEnqueueFailingAfterItsPayloadsWritesNothing: an enqueue that fails once its payloads are
// stored deletes them and leaves no entry behind, whether its queue was deleted meanwhile or a
// message it found already stored was collected meanwhile.
func TestEnqueueFailingAfterItsPayloadsWritesNothing(t *testing.T) {
	ctx := context.Background()
	cases := []struct {
		name string
		// meanwhile runs between the payloads' writes and the records'.
		meanwhile func(t *testing.T, b *Broker, q *queue)
		want      subjects.Code
	}{
		{"queue deleted", func(t *testing.T, b *Broker, q *queue) {
			if _, err := b.deleteQueue(ctx, q); err != nil {
				t.Error(err)
			}
		}, subjects.CodeQueueNotFound},
		{"stored message collected", func(t *testing.T, b *Broker, q *queue) {
			q.mu.Lock() // what a collection of D does to the queue's entries
			q.entries.remove("D")
			q.mu.Unlock()
		}, subjects.CodeUnavailable},
	}
	for _, tc := range cases {
		t.Run(tc.name, func(t *testing.T) {
			b, _ := internalBroker(t)
			q := queueQ(t, b)
			if _, err := q.enqueue(ctx, []subjects.EnqueueRequest{{ID: "D", Payload: "stored before"}}); err != nil {
				t.Fatal(err)
			}
			before, err := b.store.ReadBodies(ctx, true)
			if err != nil {
				t.Fatal(err)
			}
			ran := false
			q.testAfterBodies = func() {
				ran = true
				tc.meanwhile(t, b, q)
			}
			_, err = q.enqueue(ctx, []subjects.EnqueueRequest{{ID: "A", Payload: "a"}, {ID: "D", Payload: "again"}, {ID: "B", Payload: "b"}})
			if !ran {
				t.Fatal("the hook did not run")
			}
			if !errors.Is(err, &subjects.Error{Code: tc.want}) {
				t.Fatalf("enqueue: got %v, want %s", err, tc.want)
			}
			after, err := b.store.ReadBodies(ctx, true)
			if err != nil {
				t.Fatal(err)
			}
			if after.Last != before.Last+2 {
				t.Fatalf("bodies stream's last sequence %d, want %d: the enqueue stored A's and B's payloads", after.Last, before.Last+2)
			}
			for seq := before.Last + 1; seq <= after.Last; seq++ {
				if gone, err := b.store.BodyGone(ctx, seq); err != nil || !gone {
					t.Errorf("payload %d of the failed enqueue: gone %v, %v", seq, gone, err)
				}
			}
			q.mu.Lock()
			defer q.mu.Unlock()
			for _, id := range []string{"A", "B"} {
				if q.entries.get(id) != nil {
					t.Errorf("the failed enqueue left an entry for %s", id)
				}
			}
		})
	}
}

// dequeueAsync runs a dequeue of req on q, and gives what it leased on the channel it returns.
func dequeueAsync(ctx context.Context, t *testing.T, q *queue, req subjects.DequeueRequest) <-chan []subjects.Message {
	got := make(chan []subjects.Message, 1)
	go func() {
		ms, err := q.dequeue(ctx, req)
		if err != nil {
			t.Error(err)
		}
		got <- ms
	}()
	return got
}

// TestRetryWaitsForTheFirstDequeue: a dequeue retried while the first with its request id is still
// under way (long-polling here) waits for it, and gets the lease it took.
func TestRetryWaitsForTheFirstDequeue(t *testing.T) {
	_, clk, q := internalQueue(t, subjects.CreateQueueRequest{})
	ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
	defer cancel()
	waiting := make(chan struct{})
	q.testRetryWaits = func() { close(waiting) }
	req := subjects.DequeueRequest{RequestID: "r", WaitMS: 60_000}
	dequeue := func() <-chan []subjects.Message { return dequeueAsync(ctx, t, q, req) }
	first := dequeue()
	if err := clk.WaitForTimers(ctx, 1); err != nil { // it is parked
		t.Fatal(err)
	}
	retry := dequeue()
	select {
	case <-waiting:
	case <-ctx.Done():
		t.Fatal("the retry did not wait for the first dequeue")
	}
	if _, err := q.enqueue(ctx, []subjects.EnqueueRequest{{ID: "a"}}); err != nil {
		t.Fatal(err)
	}
	f, r := <-first, <-retry
	if len(f) != 1 || len(r) != 1 || f[0].ID != "a" || r[0].LeaseID != f[0].LeaseID {
		t.Fatalf("first %v, retry %v: want one lease of a, the same", f, r)
	}
}

// TestAbandonOfALeaseSettledMeanwhile: an abandon gives back the leases its dequeue still holds.
// One its holder settles between the abandon's look and its release (the reply reached it after
// all) stays settled: the abandon neither fails on it nor says it gave it back.
func TestAbandonOfALeaseSettledMeanwhile(t *testing.T) {
	_, _, q := internalQueue(t, subjects.CreateQueueRequest{})
	ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
	defer cancel()
	if _, err := q.enqueue(ctx, []subjects.EnqueueRequest{{ID: "a", Priority: ptrTo(int64(1))}, {ID: "b", Priority: ptrTo(int64(2))}}); err != nil {
		t.Fatal(err)
	}
	ms, err := q.dequeue(ctx, subjects.DequeueRequest{RequestID: "r", Batch: 2})
	if err != nil || len(ms) != 2 {
		t.Fatalf("dequeue: %v, %v", ms, err)
	}
	q.testAbandonReleases = func() {
		if _, err := q.complete(ctx, subjects.LeaseRequest{ID: ms[0].ID, LeaseID: ms[0].LeaseID}); err != nil {
			t.Errorf("complete of %s as the abandon releases: %v", ms[0].ID, err)
		}
	}
	reply, err := q.abandon(ctx, subjects.AbandonRequest{RequestID: "r"})
	if err != nil {
		t.Fatalf("abandon: %v", err)
	}
	if !slices.Equal(reply.Released, []string{ms[1].ID}) {
		t.Fatalf("abandon released %v, want only %s (%s was completed meanwhile)", reply.Released, ms[1].ID, ms[0].ID)
	}
	for id, want := range map[string]subjects.State{ms[0].ID: subjects.StateCompleted, ms[1].ID: subjects.StatePending} {
		if m, err := q.get(ctx, id); err != nil || m.State != want {
			t.Fatalf("%s: %v, %v; want %s", id, m.State, err, want)
		}
	}
}

// TestRetryOfAFirstDequeueThatEndsEmpty: a retry that waited for the first dequeue with its request
// id, which then ended with nothing leased (its wait ran out), is a dequeue of its own, with its own
// wait, as it would be had it come a moment later. It was answered empty at once, its wait_ms not
// run out. (A retry whose first dequeue's leases were given back as it waited, the first reply
// having reached nobody, takes the same way: the give back forgets the id. A black-box probe saw
// it answered empty in 6 runs of 8.)
func TestRetryOfAFirstDequeueThatEndsEmpty(t *testing.T) {
	_, clk, q := internalQueue(t, subjects.CreateQueueRequest{})
	ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
	defer cancel()
	waiting := make(chan struct{})
	q.testRetryWaits = func() { close(waiting) }
	id := "r"
	dequeue := func(waitMS int64) <-chan []subjects.Message {
		return dequeueAsync(ctx, t, q, subjects.DequeueRequest{RequestID: id, WaitMS: waitMS})
	}
	first := dequeue(1_000)
	if err := clk.WaitForTimers(ctx, 1); err != nil { // it is parked
		t.Fatal(err)
	}
	retry := dequeue(60_000)
	select {
	case <-waiting:
	case <-ctx.Done():
		t.Fatal("the retry did not wait for the first dequeue")
	}
	clk.Advance(time.Second) // the first's wait runs out
	if f := <-first; len(f) != 0 {
		t.Fatalf("the first dequeue leased %v from an empty queue", f)
	}
	if err := clk.WaitForTimers(ctx, 1); err != nil { // the retry parks in its turn
		t.Fatal(err)
	}
	select {
	case r := <-retry:
		t.Fatalf("the retry answered %v before its wait ran out", r)
	default:
	}
	if _, err := q.enqueue(ctx, []subjects.EnqueueRequest{{ID: "a"}}); err != nil {
		t.Fatal(err)
	}
	if r := <-retry; len(r) != 1 || r[0].ID != "a" {
		t.Fatalf("the retry got %v, want a lease of a", r)
	}

	// Its wait is what was left of it when the first ended, not all of it again: a requester's
	// timeout runs from when it sent the retry.
	waiting = make(chan struct{})
	parked := make(chan struct{}, 2)
	q.mu.Lock()
	q.testRetryWaits = func() { close(waiting) }
	q.testParked = func() { parked <- struct{}{} }
	q.mu.Unlock()
	id = "s"
	first = dequeue(10_000)
	<-parked
	retry = dequeue(15_000)
	<-waiting
	clk.Advance(10 * time.Second) // the first ends empty; 5 s of the retry's wait are left
	if f := <-first; len(f) != 0 {
		t.Fatalf("the first dequeue of s leased %v", f)
	}
	<-parked // the retry, in its turn
	clk.Advance(5 * time.Second)
	select {
	case r := <-retry:
		if len(r) != 0 {
			t.Fatalf("the retry of s got %v once its wait was over, want nothing", r)
		}
	case <-ctx.Done():
		t.Fatal("the retry of s still waited 15 s after it was sent with a wait of 15 s")
	}
}

// TestForgottenByAGiveBackNotByAUse: a retry that waited for its first dequeue leases anew when the
// first's id was forgotten for a give back (its requester never had the reply), and not when it was
// forgotten for a use of a lease (its requester had the reply: leasing anew would give one request
// id two deliveries).
func TestForgottenByAGiveBackNotByAUse(t *testing.T) {
	_, clk, q := internalQueue(t, subjects.CreateQueueRequest{LeaseMS: 30_000})
	ctx := context.Background()
	if _, err := q.enqueue(ctx, []subjects.EnqueueRequest{{ID: "a"}, {ID: "b"}}); err != nil {
		t.Fatal(err)
	}
	leaseOf := func(id string) (subjects.Message, *dequeueRecord) {
		t.Helper()
		ms, err := q.dequeue(ctx, subjects.DequeueRequest{RequestID: id})
		if err != nil || len(ms) != 1 {
			t.Fatalf("dequeue %s: %v, %v", id, ms, err)
		}
		q.mu.Lock()
		defer q.mu.Unlock()
		return ms[0], q.requests[id]
	}
	used, usedRec := leaseOf("u")
	if _, err := q.complete(ctx, subjects.LeaseRequest{ID: used.ID, LeaseID: used.LeaseID}); err != nil {
		t.Fatal(err)
	}
	if q.forgotten("u", usedRec) {
		t.Error("an id forgotten for a use of its lease counts as forgotten: a retry would lease anew")
	}
	given, givenRec := leaseOf("g")
	if _, err := q.releaseUnlessReplayed(ctx, subjects.ReleaseRequest{ID: given.ID, LeaseID: given.LeaseID, Refund: true}, givingUnheard); err != nil {
		t.Fatal(err)
	}
	if !q.forgotten("g", givenRec) {
		t.Error("an id whose leases were given back does not count as forgotten: a retry would answer empty")
	}

	// A give back that comes late, for a lease run out and the message leased again by another
	// dequeue, marks nothing of that dequeue's: a use of its lease is still a use.
	if _, err := q.enqueue(ctx, []subjects.EnqueueRequest{{ID: "c"}}); err != nil {
		t.Fatal(err)
	}
	stale, _ := leaseOf("s")
	clk.Advance(time.Minute) // the queue's lease, 30 s, runs out: c is pending again
	again, againRec := leaseOf("t")
	if again.ID != stale.ID {
		t.Fatalf("leased %s again, want %s", again.ID, stale.ID)
	}
	if _, err := q.releaseUnlessReplayed(ctx, subjects.ReleaseRequest{ID: stale.ID, LeaseID: stale.LeaseID, Refund: true}, givingUnheard); subjects.CodeOf(err) != subjects.CodeLeaseMismatch {
		t.Fatalf("the late give back: %v, want lease_mismatch", err)
	}
	if _, err := q.complete(ctx, subjects.LeaseRequest{ID: again.ID, LeaseID: again.LeaseID}); err != nil {
		t.Fatal(err)
	}
	if q.forgotten("t", againRec) {
		t.Error("a late give back of another lease made a use of t's lease count as a give back")
	}
}

// TestUsedLeasesFreeTheirRequestIDs: a worker's cycle — a dequeue with a request id, then a complete
// whose next carries a new one — keeps one request id per lease held, not one per dequeue of the
// window, and the records leave the expiry heap too.
func TestUsedLeasesFreeTheirRequestIDs(t *testing.T) {
	_, _, q := internalQueue(t, subjects.CreateQueueRequest{})
	ctx := context.Background()
	const cycles = 2000
	for range cycles / subjects.MaxEnqueueBatch {
		batch := make([]subjects.EnqueueRequest, subjects.MaxEnqueueBatch)
		if _, err := q.enqueue(ctx, batch); err != nil {
			t.Fatal(err)
		}
	}
	ms, err := q.dequeue(ctx, subjects.DequeueRequest{RequestID: "r0"})
	if err != nil || len(ms) != 1 {
		t.Fatalf("dequeue: %v, %v", ms, err)
	}
	for i := 1; i < cycles; i++ {
		if ms = completeNext(t, q, ms[0], fmt.Sprintf("r%d", i)); len(ms) != 1 {
			t.Fatalf("cycle %d: next leased %d messages", i, len(ms))
		}
	}
	q.mu.Lock()
	defer q.mu.Unlock()
	if len(q.requests) != 1 || len(q.reqEnds) != 1 {
		t.Fatalf("after %d cycles: %d request ids remembered, %d records in the heap; want 1 (the lease held)", cycles, len(q.requests), len(q.reqEnds))
	}
}

// settleIdle runs n cycles of a worker that keeps up: an enqueue, a dequeue with a request id, and a
// complete whose next, with a request id of its own, finds nothing.
func settleIdle(t *testing.T, q *queue, n int) {
	t.Helper()
	ctx := context.Background()
	for i := range n {
		if _, err := q.enqueue(ctx, []subjects.EnqueueRequest{{}}); err != nil {
			t.Fatal(err)
		}
		ms, err := q.dequeue(ctx, subjects.DequeueRequest{RequestID: fmt.Sprintf("poll%d", i)})
		if err != nil || len(ms) != 1 {
			t.Fatalf("dequeue: %v, %v", ms, err)
		}
		if next := completeNext(t, q, ms[0], fmt.Sprintf("next%d", i)); len(next) != 0 {
			t.Fatalf("complete with next leased %d messages, want none", len(next))
		}
	}
}

// completeNext completes m, with a next of request id next, as a worker does, and returns what the
// next leased.
func completeNext(t *testing.T, q *queue, m subjects.Message, next string) []subjects.Message {
	t.Helper()
	ctx := context.Background()
	k := settleKey{op: subjects.OpComplete, id: m.ID, leaseID: m.LeaseID}
	reply, err := q.andNext(ctx, k, &subjects.DequeueRequest{RequestID: next}, func() (subjects.Message, error) {
		return q.complete(ctx, subjects.LeaseRequest{ID: m.ID, LeaseID: m.LeaseID})
	})
	if err != nil {
		t.Fatal(err)
	}
	r := reply.(subjects.SettleReply)
	if r.Next.Error != nil {
		t.Fatalf("complete %s: its next failed: %v", m.ID, r.Next.Error)
	}
	return r.Next.Messages
}

// remembered expires q's request ids at its clock's time and counts those left, checking that the
// expiry heap holds just them.
func remembered(t *testing.T, q *queue) int {
	t.Helper()
	q.mu.Lock()
	defer q.mu.Unlock()
	q.expireRequests(q.now())
	if len(q.reqEnds) != len(q.requests) {
		t.Fatalf("%d records in the expiry heap, %d remembered", len(q.reqEnds), len(q.requests))
	}
	return len(q.requests)
}

// TestIdleSettlesForgottenAfterTheirLease: with workers that keep up, a settle's next finds nothing.
// Its request id is kept for the settle's retry, but only until a settleRetry after the settled
// lease would have run out (its holder retries no longer), not for the whole RequestIDWindow. A
// lease longer than that window is remembered for the window only.
func TestIdleSettlesForgottenAfterTheirLease(t *testing.T) {
	for _, tc := range []struct {
		name    string
		leaseMS int64
		kept    time.Duration // how long the settles' ids are remembered (the fake clock stands still)
	}{
		{"10 s lease", 10_000, 10*time.Second + settleRetry},
		{"1 h lease", 3_600_000, RequestIDWindow},
	} {
		t.Run(tc.name, func(t *testing.T) {
			_, clk, q := internalQueue(t, subjects.CreateQueueRequest{LeaseMS: tc.leaseMS})
			const cycles = 500
			settleIdle(t, q, cycles)
			if n := remembered(t, q); n != cycles {
				t.Fatalf("%d request ids remembered, want the %d settles' (each may be retried until its lease's end)", n, cycles)
			}
			clk.Advance(tc.kept)
			if n := remembered(t, q); n != cycles {
				t.Fatalf("%d request ids remembered after %v, want the %d still", n, tc.kept, cycles)
			}
			clk.Advance(time.Millisecond)
			if n := remembered(t, q); n != 0 {
				t.Fatalf("%d request ids remembered after %v, want none", n, tc.kept+time.Millisecond)
			}
		})
	}
}

// TestAbandonAsThePollIsServed: an abandon that comes while its long poll, just served, stores its
// lease waits for that lease and gives it back: the poll's reply goes to no one.
func TestAbandonAsThePollIsServed(t *testing.T) {
	_, clk, q := internalQueue(t, subjects.CreateQueueRequest{})
	ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
	defer cancel()
	waited := make(chan struct{})
	q.testRetryWaits = func() { close(waited) }
	abandoned := make(chan subjects.AbandonReply, 1)
	q.testLeasing = func() { // q.mu held: the abandon takes it once the lease's write is under way
		q.testLeasing = nil
		go func() {
			r, err := q.abandon(ctx, subjects.AbandonRequest{RequestID: "r"})
			if err != nil {
				t.Error(err)
			}
			abandoned <- r
		}()
	}
	polled := parkedPoll(ctx, t, clk, q, "r")
	if _, err := q.enqueue(ctx, []subjects.EnqueueRequest{{ID: "a"}}); err != nil {
		t.Fatal(err)
	}
	if ms := <-polled; len(ms) != 1 || ms[0].ID != "a" {
		t.Fatalf("the poll got %v, want a's lease", ms)
	}
	select {
	case <-waited:
	case <-ctx.Done():
		t.Fatal("the abandon did not wait for the poll's lease")
	}
	if r := <-abandoned; !slices.Equal(r.Released, []string{"a"}) {
		t.Fatalf("the abandon gave back %v, want [a]", r.Released)
	}
	q.mu.Lock()
	defer q.mu.Unlock()
	if e := q.entries.get("a"); e.State() != subjects.StatePending || e.record().Attempts != 0 {
		t.Fatalf("a after the abandon: %s at %d attempts, want pending with its attempt given back", e.State(), e.record().Attempts)
	}
}

// TestAbandonedPollIsServedNoMore: the abandon of a parked long poll takes it out of the waiters
// at once, so that a message pending before the poll's goroutine wakes goes to the next waiter,
// not to the poll nobody reads.
func TestAbandonedPollIsServedNoMore(t *testing.T) {
	_, clk, q := internalQueue(t, subjects.CreateQueueRequest{})
	ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
	defer cancel()
	polled := parkedPoll(ctx, t, clk, q, "r")
	q.mu.Lock()
	if len(q.waiters) != 1 {
		q.mu.Unlock()
		t.Fatalf("%d waiters, want the poll", len(q.waiters))
	}
	rec := q.markAbandoned("r", q.now())
	waiters := len(q.waiters)
	q.mu.Unlock()
	if waiters != 0 || rec.gaveUp == nil {
		t.Fatalf("after the abandon's mark: %d waiters, mark %v; want none, marked", waiters, rec.gaveUp)
	}
	if ms := <-polled; len(ms) != 0 {
		t.Fatalf("the abandoned poll got %v", ms)
	}
}

// parkedPoll starts a long poll of q with request id id, and returns once it is parked: its reply
// comes on the channel.
func parkedPoll(ctx context.Context, t *testing.T, clk *clock.Fake, q *queue, id string) <-chan []subjects.Message {
	t.Helper()
	polled := make(chan []subjects.Message, 1)
	go func() {
		ms, err := q.dequeue(ctx, subjects.DequeueRequest{RequestID: id, WaitMS: 60_000})
		if err != nil {
			t.Error(err)
		}
		polled <- ms
	}()
	if err := clk.WaitForTimers(ctx, 1); err != nil {
		t.Fatal(err)
	}
	return polled
}
