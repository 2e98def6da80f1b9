package broker

import (
	"context"
	"errors"
	"testing"
	"time"

	"github.com/natstone/natstone/kv"
	"github.com/natstone/natstone/subjects"
	"github.com/natstone/natstone/test/natstest"
)

// TestServedLongPollLeasesNothingWithoutTheClaim: a long poll served just as the broker's claim
// stops holding (its process paused there, say, and another broker took the store over) writes no
// lease and no lock from indexes the other broker may have overtaken: it answers unavailable, and
// its message is pending again in memory, leased once the claim holds again.
func TestServedLongPollLeasesNothingWithoutTheClaim(t *testing.T) {
	srv := natstest.Start(t, nil)
	ctx := context.Background()
	a, q := pausedServer(t, srv, "x", subjects.CreateQueueRequest{Type: subjects.Exclusive, ExclusivityKey: "p"})
	p1, p2 := int64(1), int64(2)
	if _, err := q.enqueue(ctx, []subjects.EnqueueRequest{
		{ID: "m1", Priority: &p1, Metadata: map[string]string{"p": "v"}},
		{ID: "m2", Priority: &p2, Metadata: map[string]string{"p": "v"}},
	}); err != nil {
		t.Fatal(err)
	}
	ms, err := q.dequeue(ctx, subjects.DequeueRequest{Batch: 1})
	if err != nil || len(ms) != 1 || ms[0].ID != "m1" {
		t.Fatalf("leased %v, %v; want m1", ms, err)
	}
	parked := make(chan struct{}, 1)
	q.testParked = func() { parked <- struct{}{} }
	held := a.claim.until.Load()
	q.testLeasing = func() { a.claim.until.Store(0) } // the claim ends between the serving and the lease
	type polled struct {
		ms  []subjects.Message
		err error
	}
	done := make(chan polled, 1)
	go func() {
		ms, err := q.dequeue(ctx, subjects.DequeueRequest{Batch: 1, WaitMS: 60_000})
		done <- polled{ms, err}
	}()
	waitOn(t, parked)
	if _, err := q.complete(ctx, subjects.LeaseRequest{ID: "m1", LeaseID: ms[0].LeaseID}); err != nil {
		t.Fatal(err) // frees v: m2 goes to the long poll
	}
	got := waitOn(t, done)
	if len(got.ms) != 0 || !errors.Is(got.err, &subjects.Error{Code: subjects.CodeUnavailable}) {
		t.Fatalf("the long poll served without the claim: %v, %v; want unavailable and no lease", got.ms, got.err)
	}
	if r, _, err := a.store.GetMessage(ctx, "x", "m2"); err != nil || r.State != subjects.StatePending {
		t.Fatalf("m2 stored %s, %v; want pending: no lease written without the claim", r.State, err)
	}
	if l, _, err := a.store.GetSlot(ctx, "x", "v", 0); err == nil && l.MessageID == "m2" {
		t.Fatalf("v's lock names m2: taken without the claim")
	}
	q.testLeasing = nil
	a.claim.until.Store(held)
	if ms, err := q.dequeue(ctx, subjects.DequeueRequest{Batch: 2}); err != nil || len(ms) != 1 || ms[0].ID != "m2" {
		t.Fatalf("once the claim holds again: %v, %v; want m2 leased", ms, err)
	}
}

// TestStaleCollectionDeletesNothing: a collection under way when the claim stops holding (a pause
// between its timer and its deletes) deletes no payload and removes no record: the broker that
// took the store over may have retried the message since, and payload deletes carry no revision.
func TestStaleCollectionDeletesNothing(t *testing.T) {
	srv := natstest.Start(t, nil)
	ctx := context.Background()
	a, qa := pausedServer(t, srv, "q", subjects.CreateQueueRequest{})
	if _, err := qa.enqueue(ctx, []subjects.EnqueueRequest{{ID: "x", Payload: "kept"}}); err != nil {
		t.Fatal(err)
	}
	if _, err := qa.cancel(ctx, subjects.LeaseRequest{ID: "x"}); err != nil {
		t.Fatal(err)
	}
	b := takeOver(t, srv)
	if _, err := b.queues["q"].retry(ctx, subjects.RetryRequest{ID: "x"}); err != nil {
		t.Fatal(err)
	}
	a.claim.until.Store(0) // a goes on, past its claim, with the collection its timer began
	qa.mu.Lock()
	qa.collect([]*entry{qa.entries.get("x")})
	qa.mu.Unlock()
	if r, _, err := b.store.GetMessage(ctx, "q", "x"); err != nil || r.State != subjects.StatePending {
		t.Fatalf("x stored %s, %v; want the new broker's retry, pending", r.State, err)
	}
	ms, err := b.queues["q"].dequeue(ctx, subjects.DequeueRequest{})
	if err != nil || len(ms) != 1 || string(ms[0].PayloadBytes()) != "kept" {
		t.Fatalf("the new broker's dequeue: %+v, %v; want x with its payload", ms, err)
	}
}

// TestStopWithWritesInDoubtKeepsTheClaim: a clean stop that leaves a write of unknown outcome
// does not release the claim: the write may land yet, after a standby taking over at once had read
// the record. The claim is left for its ttl to run out.
func TestStopWithWritesInDoubtKeepsTheClaim(t *testing.T) {
	srv := natstest.Start(t, nil)
	ctx := context.Background()
	a, q := pausedServer(t, srv, "q", subjects.CreateQueueRequest{})
	if _, err := q.enqueue(ctx, []subjects.EnqueueRequest{{ID: "M"}}); err != nil {
		t.Fatal(err)
	}
	doubtfulCancel(q, "M") // not asked about again yet
	sctx, cancel := context.WithTimeout(ctx, 10*time.Second)
	defer cancel()
	if err := a.Stop(sctx); err != nil {
		t.Fatal(err)
	}
	if got := holder(t, a); got != a.claim.mine.Broker {
		t.Fatalf("the claim names %q after a stop with a write in doubt, want the stopped broker %q", got, a.claim.mine.Broker)
	}
	if _, _, err := a.store.GetMessage(ctx, "q", "M"); errors.Is(err, kv.ErrNotFound) {
		t.Fatal(err)
	}
}

// doubtfulCancel makes a cancel of pending message id a write of unknown outcome (it timed out),
// as the broker keeps one until it asks storage again.
func doubtfulCancel(q *queue, id string) {
	q.mu.Lock()
	defer q.mu.Unlock()
	e := q.entries.get(id)
	next := e.record()
	next.State, next.EndedAt = subjects.StateCanceled, next.UpdatedAt
	next.Version++
	e.setBusy(true)
	q.doubtful = append(q.doubtful, &change{e: e, next: next, prev: subjects.StatePending, expect: e.rev, err: errors.New("nats: timeout")})
}

// waitOn receives from ch, failing the test if nothing comes within 10 seconds.
func waitOn[T any](t *testing.T, ch <-chan T) T {
	t.Helper()
	select {
	case v := <-ch:
		return v
	case <-time.After(10 * time.Second):
		t.Fatal("nothing came within 10 s")
		panic("unreachable")
	}
}

// TestDoubtsWaitForTheClaim: a write of unknown outcome is not issued again while the claim does
// not hold (it could land after the broker that took the store over read the record); it is once
// the claim holds again.
func TestDoubtsWaitForTheClaim(t *testing.T) {
	ctx := context.Background()
	a, q, qclk := pausedOnFakeClock(t)
	if _, err := q.enqueue(ctx, []subjects.EnqueueRequest{{ID: "M"}}); err != nil {
		t.Fatal(err)
	}
	doubtfulCancel(q, "M") // never sent, in fact
	q.mu.Lock()
	q.settle() // arms the doubt timer
	q.mu.Unlock()
	held := a.claim.until.Load()
	a.claim.until.Store(0)
	qclk.Advance(doubtRetry)
	if r, _, err := a.store.GetMessage(ctx, "q", "M"); err != nil || r.State != subjects.StatePending {
		t.Fatalf("stored %s, %v: want still pending, nothing issued without the claim", r.State, err)
	}
	a.claim.until.Store(held)
	qclk.Advance(doubtRetry)
	if r, _, err := a.store.GetMessage(ctx, "q", "M"); err != nil || r.State != subjects.StateCanceled {
		t.Fatalf("stored %s, %v: want canceled, issued again once the claim holds", r.State, err)
	}
}

// TestDeleteIssuesNoDoubtWithoutTheClaim: a queue's delete asks storage about writes in doubt by
// issuing them again, which it must not do while the claim does not hold, as the doubt timer does
// not: it answers unavailable, nothing written, and succeeds once the claim holds again.
func TestDeleteIssuesNoDoubtWithoutTheClaim(t *testing.T) {
	ctx := context.Background()
	a, q, _ := pausedOnFakeClock(t)
	if _, err := q.enqueue(ctx, []subjects.EnqueueRequest{{ID: "M"}}); err != nil {
		t.Fatal(err)
	}
	doubtfulCancel(q, "M") // never sent, in fact
	held := a.claim.until.Load()
	a.claim.until.Store(0)
	if _, err := a.deleteQueue(ctx, q); subjects.CodeOf(err) != subjects.CodeUnavailable {
		t.Fatalf("delete without the claim: %v, want unavailable", err)
	}
	if r, _, err := a.store.GetMessage(ctx, "q", "M"); err != nil || r.State != subjects.StatePending {
		t.Fatalf("stored %s, %v: want still pending, nothing issued without the claim", r.State, err)
	}
	a.claim.until.Store(held)
	if rep, err := a.deleteQueue(ctx, q); err != nil || rep.Messages != 1 {
		t.Fatalf("delete once the claim holds: %+v, %v", rep, err)
	}
}

// TestParkedPollServedOnceTheClaimHoldsAgain: a long poll served while the claim did not hold
// answers unavailable and puts its message back; another poll parked beside it is served that
// message once a renewal makes the claim hold again, rather than waiting out its wait_ms.
func TestParkedPollServedOnceTheClaimHoldsAgain(t *testing.T) {
	srv := natstest.Start(t, nil)
	ctx := context.Background()
	a, q := pausedServer(t, srv, "q", subjects.CreateQueueRequest{})
	parked := make(chan struct{}, 2)
	q.testParked = func() { parked <- struct{}{} }
	q.testLeasing = func() { // the claim ends between the first serving and its lease
		q.testLeasing = nil
		a.claim.until.Store(0)
	}
	type polled struct {
		ms  []subjects.Message
		err error
	}
	poll := func() <-chan polled {
		done := make(chan polled, 1)
		go func() {
			ms, err := q.dequeue(ctx, subjects.DequeueRequest{Batch: 1, WaitMS: 60_000})
			done <- polled{ms, err}
		}()
		waitOn(t, parked)
		return done
	}
	first, second := poll(), poll()
	if _, err := q.enqueue(ctx, []subjects.EnqueueRequest{{ID: "m"}}); err != nil {
		t.Fatal(err)
	}
	if got := waitOn(t, first); len(got.ms) != 0 || !errors.Is(got.err, &subjects.Error{Code: subjects.CodeUnavailable}) {
		t.Fatalf("the poll served without the claim: %v, %v; want unavailable and no lease", got.ms, got.err)
	}
	a.claim.renew() // what the renewal timer does: stored, the claim holds again
	if got := waitOn(t, second); got.err != nil || len(got.ms) != 1 || got.ms[0].ID != "m" {
		t.Fatalf("the other poll, once the claim holds again: %v, %v; want m", got.ms, got.err)
	}
}
