package broker

import (
	"bytes"
	"context"
	"errors"
	"fmt"
	"io"
	"log/slog"
	"runtime"
	"slices"
	"strings"
	"sync"
	"testing"
	"time"
	"weak"

	"github.com/nats-io/nats.go"
	"github.com/nats-io/nats.go/jetstream"

	"github.com/natstone/natstone/broker/clock"
	"github.com/natstone/natstone/kv"
	"github.com/natstone/natstone/subjects"
	"github.com/natstone/natstone/test/natstest"
)

// claimBroker returns a broker on srv, not started, whose claim runs on claimClock; the queues'
// clock is another fake one. mod may adjust its config.
func claimBroker(t *testing.T, srv *natstest.Server, claimClock *clock.Fake, mod ...func(*Config)) *Broker {
	t.Helper()
	cfg := Config{
		Conn:   srv.Connect(t),
		Clock:  clock.NewFake(time.UnixMilli(1_700_000_000_000)),
		Logger: slog.New(slog.NewTextHandler(io.Discard, nil)),
	}
	for _, m := range mod {
		m(&cfg)
	}
	b, err := New(&cfg)
	if err != nil {
		t.Fatal(err)
	}
	b.claim.clock = claimClock
	t.Cleanup(func() {
		ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
		defer cancel()
		if err := b.Stop(ctx); err != nil {
			t.Error(err)
		}
	})
	return b
}

// serving starts a broker on srv that serves the store, its claim on a fake clock of its own
// (returned); mod may adjust its config.
func serving(t *testing.T, srv *natstest.Server, mod ...func(*Config)) (*Broker, *clock.Fake) {
	t.Helper()
	clk := clock.NewFake(time.Unix(0, 0))
	b := claimBroker(t, srv, clk, mod...)
	if err := b.Start(context.Background()); err != nil {
		t.Fatal(err)
	}
	return b, clk
}

// standby starts a broker on srv while another serves, and returns once it stands by, with its
// claim's fake clock and the channel of its Start's error; mod may adjust its config.
func standby(t *testing.T, srv *natstest.Server, mod ...func(*Config)) (*Broker, *clock.Fake, <-chan error) {
	t.Helper()
	clk := clock.NewFake(time.Unix(0, 0))
	b := claimBroker(t, srv, clk, mod...)
	started := startAsync(b)
	standingBy(t, b, clk, started)
	return b, clk, started
}

// startAsync starts b on its own goroutine; the channel gets Start's error.
func startAsync(b *Broker) <-chan error {
	started := make(chan error, 1)
	go func() {
		ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
		defer cancel()
		started <- b.Start(ctx)
	}()
	return started
}

// waitStarted waits up to 10 s for Start's error.
func waitStarted(t *testing.T, started <-chan error) {
	t.Helper()
	select {
	case err := <-started:
		if err != nil {
			t.Fatalf("start: %v", err)
		}
	case <-time.After(10 * time.Second):
		t.Fatal("the standby did not start within 10s")
	}
}

// standingBy waits until standby has read the claim and armed its next look (on clk), and checks
// that it has not taken the claim and that its Start has not returned.
func standingBy(t *testing.T, standby *Broker, clk *clock.Fake, started <-chan error) {
	t.Helper()
	ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
	defer cancel()
	if err := clk.WaitForTimers(ctx, 1); err != nil {
		t.Fatalf("the standby never waited: %v", err)
	}
	standby.claim.mu.Lock()
	rev := standby.claim.rev
	standby.claim.mu.Unlock()
	if rev != 0 {
		t.Fatalf("the standby took the claim (revision %d) while another broker held it", rev)
	}
	select {
	case err := <-started:
		t.Fatalf("Start returned (%v) while another broker held the claim", err)
	default:
	}
}

// running fails the test if b has stopped.
func running(t *testing.T, b *Broker) {
	t.Helper()
	select {
	case <-b.Done():
		t.Fatalf("the broker stopped: %v", b.Err())
	default:
	}
}

// stopsOnItsOwn waits up to 10 s for b to stop, its claim lost.
func stopsOnItsOwn(t *testing.T, b *Broker) {
	t.Helper()
	select {
	case <-b.Done():
	case <-time.After(10 * time.Second):
		t.Fatal("the broker still serves, its claim taken")
	}
	if err := b.Err(); !errors.Is(err, ErrClaimLost) {
		t.Fatalf("Err() = %v, want ErrClaimLost", err)
	}
}

// holder returns the broker id the store's claim names.
func holder(t *testing.T, b *Broker) string {
	t.Helper()
	c, _, err := b.claim.claims.Get(context.Background())
	if err != nil {
		t.Fatalf("read the claim: %v", err)
	}
	return c.Broker
}

// TestStandbyTakesOverAtAStop: a second broker on the same store waits until the first stops, then
// serves what the first left, a message it leased included.
func TestStandbyTakesOverAtAStop(t *testing.T) {
	srv := natstest.Start(t, nil)
	ca, cb := clock.NewFake(time.Unix(0, 0)), clock.NewFake(time.Unix(0, 0))
	a := claimBroker(t, srv, ca)
	if err := a.Start(context.Background()); err != nil {
		t.Fatal(err)
	}
	ctx := context.Background()
	q := queueQ(t, a)
	first, second := int64(1), int64(2)
	if _, err := q.enqueue(ctx, []subjects.EnqueueRequest{{ID: "leased", Priority: &first}, {ID: "pending", Priority: &second}}); err != nil {
		t.Fatal(err)
	}
	if ms, err := q.dequeue(ctx, subjects.DequeueRequest{}); err != nil || len(ms) != 1 || ms[0].ID != "leased" {
		t.Fatalf("dequeue: %+v, %v", ms, err)
	}

	b := claimBroker(t, srv, cb)
	started := startAsync(b)
	standingBy(t, b, cb, started)
	if got := holder(t, a); got != a.claim.mine.Broker {
		t.Fatalf("the claim names %s, want the first broker %s", got, a.claim.mine.Broker)
	}

	if err := a.Stop(ctx); err != nil {
		t.Fatal(err)
	}
	waitStarted(t, started) // no clock moved: the release woke it
	if got := holder(t, b); got != b.claim.mine.Broker {
		t.Fatalf("the claim names %s, want the standby %s", got, b.claim.mine.Broker)
	}
	ms, err := b.queues["q"].dequeue(ctx, subjects.DequeueRequest{Batch: 2})
	if err != nil || len(ms) != 1 || ms[0].ID != "pending" {
		t.Fatalf("dequeue from the standby: %+v, %v; want only the pending message", ms, err)
	}
}

// TestStandbyTakesOverAfterTheTTL: a holder that stops renewing (here its claim clock stands still,
// as a dead process's would) loses the store to the standby once the standby has seen the claim
// unchanged for ClaimTTL, not before; when it comes back, its renewal conflicts and it stops.
func TestStandbyTakesOverAfterTheTTL(t *testing.T) {
	srv := natstest.Start(t, nil)
	a, ca := serving(t, srv)
	b, cb, started := standby(t, srv)

	cb.Advance(DefaultClaimTTL - time.Millisecond)
	standingBy(t, b, cb, started) // it looked again, and waits on
	cb.Advance(time.Millisecond)
	waitStarted(t, started)
	if got := holder(t, b); got != b.claim.mine.Broker {
		t.Fatalf("the claim names %s, want the standby %s", got, b.claim.mine.Broker)
	}

	running(t, a)
	ca.Advance(DefaultClaimTTL / 5) // it renews, and finds the standby's claim
	stopsOnItsOwn(t, a)
	if got := holder(t, b); got != b.claim.mine.Broker {
		t.Fatalf("after the first broker stopped, the claim names %s, want %s", got, b.claim.mine.Broker)
	}
}

// TestStandbyThatLostItsTakeSaysItStandsBy: a standby that found the claim unrenewed for its ttl
// and said it takes over, but whose take conflicted with the holder's renewal stored meanwhile,
// says again that another broker serves the store: its last line is not "taking over".
func TestStandbyThatLostItsTakeSaysItStandsBy(t *testing.T) {
	srv := natstest.Start(t, nil)
	a, _ := serving(t, srv)
	var logs natstest.LogBuffer
	b, cb, started := standby(t, srv, func(c *Config) { c.Logger = slog.New(slog.NewTextHandler(&logs, nil)) })
	a.claim.mu.Lock()
	mine := a.claim.mine
	a.claim.mu.Unlock()
	b.claim.testTaking = func() { // the holder's renewal lands first
		b.claim.testTaking = nil
		_, rev, err := a.claim.claims.Get(context.Background())
		if err == nil {
			_, err = a.claim.claims.Put(context.Background(), &mine, rev)
		}
		if err != nil {
			t.Errorf("renew the holder's claim: %v", err)
		}
	}
	cb.Advance(DefaultClaimTTL)
	eventually(t, "the standby standing by again", func() bool { return strings.Count(logs.String(), "standing by") == 2 })
	standingBy(t, b, cb, started)
	if text := logs.String(); strings.Count(text, "taking over") != 1 || strings.LastIndex(text, "taking over") > strings.LastIndex(text, "standing by") {
		t.Fatalf("the log, want it to say it took over once, then that it stands by:\n%s", text)
	}
}

// TestBrokerAnswersNothingWhileItCannotRenew: while its NATS server is down the broker cannot renew
// its claim; from ClaimTTL/2 after the last renewal stored it answers requests unavailable, and once
// a renewal is stored again (no standby took over: the revision is still its own) it answers again.
// It never stops.
func TestBrokerAnswersNothingWhileItCannotRenew(t *testing.T) {
	srv := natstest.Start(t, nil)
	ca := clock.NewFake(time.Unix(0, 0))
	reconnected := make(chan struct{}, 1)
	var logs natstest.LogBuffer
	a := claimBroker(t, srv, ca, func(c *Config) {
		c.Conn = srv.Connect(t, nats.ReconnectWait(20*time.Millisecond), nats.MaxReconnects(-1),
			nats.ReconnectHandler(func(*nats.Conn) { reconnected <- struct{}{} }))
		c.Logger = slog.New(slog.NewTextHandler(&logs, nil))
	})
	if err := a.Start(context.Background()); err != nil {
		t.Fatal(err)
	}
	srv.Shutdown()
	ca.Advance(DefaultClaimTTL / 5) // a renewal fails: under ttl/2, it still holds
	if !a.claim.held() {
		t.Fatal("the claim does not hold 2s after the last renewal")
	}
	ca.Advance(DefaultClaimTTL/2 - DefaultClaimTTL/5) // 5 s
	if a.claim.held() || a.Serving() {
		t.Fatal("the claim holds, or the broker says it serves, ttl/2 after the last renewal stored")
	}

	srv = srv.Restart(t)
	select {
	case <-reconnected:
	case <-time.After(10 * time.Second):
		t.Fatal("the broker did not reconnect within 10s")
	}
	if err := a.cfg.Conn.Flush(); err != nil { // the server has its subscriptions again
		t.Fatal(err)
	}
	nc := srv.Connect(t)
	list := a.space.Subject(subjects.OpList, "")
	reply, err := nc.Request(list, nil, 10*time.Second)
	if err != nil {
		t.Fatal(err)
	}
	if !strings.Contains(string(reply.Data), `"code":"unavailable"`) || !strings.Contains(string(reply.Data), "claim") {
		t.Fatalf("a request while the claim has run out: %s, want unavailable", reply.Data)
	}
	// Nor is a write run: another broker may serve the store by now.
	enqueue := a.space.Subject(subjects.OpEnqueue, "q")
	if reply, err = nc.Request(enqueue, []byte(`{"id":"m"}`), 10*time.Second); err != nil {
		t.Fatal(err)
	}
	if !strings.Contains(string(reply.Data), `"code":"unavailable"`) {
		t.Fatalf("an enqueue while the claim has run out: %s, want unavailable", reply.Data)
	}

	ca.Advance(DefaultClaimTTL / 5) // the renewal lands
	if !a.claim.held() || !a.Serving() {
		t.Fatal("the claim does not hold, or the broker does not say it serves, after a renewal stored")
	}
	if reply, err = nc.Request(list, nil, 10*time.Second); err != nil {
		t.Fatal(err)
	}
	if strings.Contains(string(reply.Data), "error") {
		t.Fatalf("a request after the renewal: %s", reply.Data)
	}
	if string(reply.Data) != `{"queues":[]}` {
		t.Fatalf("queues after the refused enqueue: %s, want none (it was not run)", reply.Data)
	}
	// The operator learns that it serves again, and after how long.
	if log := logs.String(); !strings.Contains(log, `msg="the store's claim is renewed: answering requests again" unrenewed_for=`) {
		t.Fatalf("no log of the claim renewed, and after how long:\n%s", log)
	}
	running(t, a)
}

// TestFrozenBrokerLeavesRequestsToTheOneThatTookOver: a broker frozen past its claim (SIGSTOP, a
// stalled VM: here its renewals are stopped) stays subscribed. Until its claim has gone unrenewed
// for its ttl it answers unavailable, no other broker serving yet; from then on it answers nothing,
// and once a standby has taken the store over every request is answered by that one, once. (In a
// queue group the frozen broker took half of the requests, which timed out.)
func TestFrozenBrokerLeavesRequestsToTheOneThatTookOver(t *testing.T) {
	srv := natstest.Start(t, nil)
	var logs natstest.LogBuffer
	a, ca := serving(t, srv, func(c *Config) { c.Logger = slog.New(slog.NewTextHandler(&logs, nil)) })
	b, cb, started := standby(t, srv)
	a.claim.mu.Lock()
	a.claim.timer.Stop() // frozen: it renews no more
	a.claim.mu.Unlock()
	nc := srv.Connect(t)
	list := a.space.Subject(subjects.OpList, "")

	ca.Advance(DefaultClaimTTL - time.Millisecond)
	reply, err := nc.Request(list, nil, 10*time.Second)
	if err != nil {
		t.Fatal(err)
	}
	if !strings.Contains(string(reply.Data), `"code":"unavailable"`) {
		t.Fatalf("a request to the broker whose claim ran out, no other serving: %s, want unavailable", reply.Data)
	}
	ca.Advance(time.Millisecond)
	cb.Advance(DefaultClaimTTL)
	waitStarted(t, started)

	inbox := nats.NewInbox()
	replies, err := nc.SubscribeSync(inbox)
	if err != nil {
		t.Fatal(err)
	}
	const n = 6
	for i := range n {
		subj, body := list, []byte(nil)
		if i%2 == 1 {
			subj, body = b.space.Subject(subjects.OpEnqueue, "q"), []byte(fmt.Sprintf(`{"id":"m%d"}`, i))
		}
		if err := nc.PublishRequest(subj, inbox, body); err != nil {
			t.Fatal(err)
		}
	}
	for i := range n {
		m, err := replies.NextMsg(10 * time.Second)
		if err != nil {
			t.Fatalf("reply %d of %d: %v", i+1, n, err)
		}
		if strings.Contains(string(m.Data), `"error"`) {
			t.Fatalf("reply %d: %s, want the serving broker's answer", i+1, m.Data)
		}
	}
	// The frozen broker left each (the first was logged, and the others counted since).
	eventually(t, "the frozen broker to leave every request", func() bool { return a.silenced.count.Load() == n-1 })
	for _, c := range []*nats.Conn{a.cfg.Conn, nc} { // whatever the frozen broker sent has come
		if err := c.Flush(); err != nil {
			t.Fatal(err)
		}
	}
	if extra, _, _ := replies.Pending(); extra != 0 {
		m, _ := replies.NextMsg(0)
		t.Fatalf("%d replies more than requests, as %s", extra, m.Data)
	}
	running(t, b)
	// Its stop says how many it left since it last said so.
	ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
	defer cancel()
	if err := a.Stop(ctx); err != nil {
		t.Fatal(err)
	}
	if !strings.Contains(logs.String(), fmt.Sprintf("unanswered=%d", n-1)) {
		t.Fatalf("the stop does not log the %d requests left since the first:\n%s", n-1, logs.String())
	}
}

// TestBrokerStoppingWithoutItsClaimAnswersNothing: a broker that lost its claim stops; a request
// it still gets meanwhile is not answered "the broker is stopping", which could reach the client
// before the answer of the broker that took the store over, but left to that one. One stopping
// with its claim says so.
func TestBrokerStoppingWithoutItsClaimAnswersNothing(t *testing.T) {
	for _, lost := range []bool{true, false} {
		srv := natstest.Start(t, nil) // each its own: an abandoned claim stays till its ttl
		nc := srv.Connect(t)
		a, _ := serving(t, srv)
		ep := a.svc.endpoints[slices.IndexFunc(a.svc.endpoints, func(ep *endpoint) bool { return ep.op == subjects.OpList })]
		if lost {
			before := a.cfg.Conn.NumSubscriptions()
			a.claim.abandon() // ended, as by a renewal that found another broker's claim
			if after := a.cfg.Conn.NumSubscriptions(); after != before-1 {
				t.Errorf("%d subscriptions after the claim ended, %d before: want the claims' elections' gone", after, before)
			}
		}
		a.mu.Lock()
		a.closed = true // stopping: its subscriptions not yet gone
		a.mu.Unlock()
		inbox := nats.NewInbox()
		replies, err := nc.SubscribeSync(inbox)
		if err != nil {
			t.Fatal(err)
		}
		if err := nc.Flush(); err != nil {
			t.Fatal(err)
		}
		a.dispatch(ep, &nats.Msg{Subject: a.space.Subject(subjects.OpList, ""), Reply: inbox})
		for _, c := range []*nats.Conn{a.cfg.Conn, nc} { // whatever it sent has come
			if err := c.Flush(); err != nil {
				t.Fatal(err)
			}
		}
		n, _, _ := replies.Pending()
		if lost && (n != 0 || a.silenced.logged.Load() == 0) {
			t.Errorf("a broker stopping without its claim: %d replies, logged %v; want none, logged", n, a.silenced.logged.Load() != 0)
		}
		if !lost {
			if m, err := replies.NextMsg(time.Millisecond); err != nil || !strings.Contains(string(m.Data), "the broker is stopping") {
				t.Errorf("a broker stopping with its claim: %v, want unavailable, the broker is stopping", err)
			}
		}
		a.mu.Lock()
		a.closed = false // for its Stop at the test's end
		a.mu.Unlock()
	}
}

// TestRenewalAfterALostAnswer: a renewal stored whose answer never came leaves the broker with an
// older revision; the next renewal conflicts with its own claim, takes its revision and goes on.
func TestRenewalAfterALostAnswer(t *testing.T) {
	srv := natstest.Start(t, nil)
	ca := clock.NewFake(time.Unix(0, 0))
	a := claimBroker(t, srv, ca)
	if err := a.Start(context.Background()); err != nil {
		t.Fatal(err)
	}
	ctx := context.Background()
	_, rev, err := a.claim.claims.Get(ctx)
	if err != nil {
		t.Fatal(err)
	}
	if _, err := a.claim.claims.Put(ctx, &a.claim.mine, rev); err != nil { // as a renewal would
		t.Fatal(err)
	}
	ca.Advance(DefaultClaimTTL / 5)
	_, after, err := a.claim.claims.Get(ctx)
	if err != nil {
		t.Fatal(err)
	}
	if after != rev+2 {
		t.Fatalf("the claim's revision is %d after the renewal, want %d", after, rev+2)
	}
	running(t, a)
}

// TestTakeOverClaim: a broker configured to take the claim at start does not wait for the holder,
// which stops at its next renewal.
func TestTakeOverClaim(t *testing.T) {
	srv := natstest.Start(t, nil)
	ca, cb := clock.NewFake(time.Unix(0, 0)), clock.NewFake(time.Unix(0, 0))
	a := claimBroker(t, srv, ca)
	if err := a.Start(context.Background()); err != nil {
		t.Fatal(err)
	}
	b := claimBroker(t, srv, cb, func(c *Config) { c.TakeOverClaim = true })
	waitStarted(t, startAsync(b))
	ca.Advance(DefaultClaimTTL / 5)
	stopsOnItsOwn(t, a)
	if got := holder(t, b); got != b.claim.mine.Broker {
		t.Fatalf("the claim names %s, want %s", got, b.claim.mine.Broker)
	}
}

// TestTakeOverClaimKeptAtStop: a broker that takes the claim at start (its store is its process's
// alone) keeps it at a clean stop, for its next start: a broker connected to the server that stops
// with it does not take the store over meanwhile.
func TestTakeOverClaimKeptAtStop(t *testing.T) {
	srv := natstest.Start(t, nil)
	a, _ := serving(t, srv, func(c *Config) { c.TakeOverClaim = true })
	b, cb, started := standby(t, srv)
	if err := a.Stop(context.Background()); err != nil {
		t.Fatal(err)
	}
	if got := holder(t, b); got != a.claim.mine.Broker {
		t.Fatalf("after the stop the claim names %q, want the stopped broker's %s", got, a.claim.mine.Broker)
	}
	cb.Advance(DefaultClaimTTL / 5) // the standby looks again
	standingBy(t, b, cb, started)
	cb.Advance(DefaultClaimTTL) // and takes it over once it has seen it unchanged for the ttl
	waitStarted(t, started)
}

// TestFailedStartReleasesTheClaim: a start that fails after taking the claim gives it back.
func TestFailedStartReleasesTheClaim(t *testing.T) {
	srv := natstest.Start(t, nil)
	a := claimBroker(t, srv, clock.NewFake(time.Unix(0, 0)))
	a.loaded = func() error { return errors.New("boom") }
	if err := a.Start(context.Background()); err == nil {
		t.Fatal("Start succeeded")
	}
	if _, _, err := a.claim.claims.Get(context.Background()); !errors.Is(err, kv.ErrNotFound) {
		t.Fatalf("the claim after a failed start: %v, want none", err)
	}
}

// TestStandbyWaitsTheLongerTTL: a holder with a longer ttl than the standby's is waited for that
// long.
func TestStandbyWaitsTheLongerTTL(t *testing.T) {
	srv := natstest.Start(t, nil)
	serving(t, srv, func(c *Config) { c.ClaimTTL = 2 * DefaultClaimTTL })
	b, cb, started := standby(t, srv)
	cb.Advance(DefaultClaimTTL)
	standingBy(t, b, cb, started) // its own ttl is up, not the holder's
	cb.Advance(DefaultClaimTTL)
	waitStarted(t, started)
}

// TestClaimLostDuringRecovery: a start whose claim is taken while it recovers fails, writes nothing
// more and leaves the claim to the broker that took it.
func TestClaimLostDuringRecovery(t *testing.T) {
	srv := natstest.Start(t, nil)
	ca := clock.NewFake(time.Unix(0, 0))
	a := claimBroker(t, srv, ca)
	other := kv.Claim{Broker: "other", TTLMillis: DefaultClaimTTL.Milliseconds()}
	a.loaded = func() error {
		ctx := context.Background()
		_, rev, err := a.claim.claims.Get(ctx)
		if err != nil {
			return err
		}
		if _, err := a.claim.claims.Put(ctx, &other, rev); err != nil {
			return err
		}
		ca.Advance(DefaultClaimTTL / 5) // a's renewal finds the claim taken
		return nil
	}
	err := a.Start(context.Background())
	if !errors.Is(err, errClaimRanOut) && !errors.Is(err, ErrClaimLost) {
		t.Fatalf("Start = %v, want the claim lost", err)
	}
	if got := holder(t, a); got != "other" {
		t.Fatalf("the claim names %s after the failed start, want other", got)
	}
}

// TestStoppedBrokerIsFreed: once stopped and its connections closed, nothing keeps a broker's
// memory alive; S5 measures the broker's share of the heap by dropping it. (The claim's renewal
// timer, stopped, used to keep it until it would have fired.)
func TestStoppedBrokerIsFreed(t *testing.T) {
	srv := natstest.Start(t, nil)
	var w weak.Pointer[Broker]
	func() {
		nc, storeNC := srv.Connect(t), srv.Connect(t)
		defer nc.Close()
		defer storeNC.Close()
		b, err := New(&Config{Conn: nc, StoreConn: storeNC, Logger: slog.New(slog.NewTextHandler(io.Discard, nil))})
		if err != nil {
			t.Fatal(err)
		}
		if err := b.Start(context.Background()); err != nil {
			t.Fatal(err)
		}
		if err := b.Stop(context.Background()); err != nil {
			t.Fatal(err)
		}
		w = weak.Make(b)
	}()
	runtime.GC()
	if w.Value() != nil {
		t.Fatal("the stopped broker is still reachable")
	}
}

// TestStandbyChangesNoSettings: a standby started with other settings (here the events' max age)
// leaves the store's streams as the serving broker set them until it takes over.
func TestStandbyChangesNoSettings(t *testing.T) {
	srv := natstest.Start(t, nil)
	a, _ := serving(t, srv)
	_, _, started := standby(t, srv, func(c *Config) { c.EventsMaxAge = time.Hour })
	js, err := jetstream.New(srv.Connect(t))
	if err != nil {
		t.Fatal(err)
	}
	maxAge := func() time.Duration {
		t.Helper()
		st, err := js.Stream(context.Background(), "natstone-events")
		if err != nil {
			t.Fatal(err)
		}
		return st.CachedInfo().Config.MaxAge
	}
	if got := maxAge(); got != DefaultEventsMaxAge {
		t.Fatalf("events max age while the standby waits: %v, want the serving broker's %v", got, DefaultEventsMaxAge)
	}
	if err := a.Stop(context.Background()); err != nil {
		t.Fatal(err)
	}
	waitStarted(t, started)
	if got := maxAge(); got != time.Hour {
		t.Fatalf("events max age once the standby serves: %v, want its 1h", got)
	}
}

// pausedServer starts a broker on srv serving queue name (created as cfg says) that then pauses:
// its claim's clock stands still, so it never renews it, nor learns that it lost it. mod may adjust
// the broker's config.
func pausedServer(t *testing.T, srv *natstest.Server, name string, cfg subjects.CreateQueueRequest, mod ...func(*Config)) (*Broker, *queue) {
	t.Helper()
	a := claimBroker(t, srv, clock.NewFake(time.Unix(0, 0)), mod...)
	if err := a.Start(context.Background()); err != nil {
		t.Fatal(err)
	}
	q, _, err := a.createQueue(context.Background(), name, cfg)
	if err != nil {
		t.Fatal(err)
	}
	return a, q
}

// takeOver starts a standby on srv and has it take the store over from a broker that stopped
// renewing its claim.
func takeOver(t *testing.T, srv *natstest.Server) *Broker {
	t.Helper()
	cb := clock.NewFake(time.Unix(0, 0))
	b := claimBroker(t, srv, cb)
	started := startAsync(b)
	standingBy(t, b, cb, started)
	cb.Advance(DefaultClaimTTL)
	waitStarted(t, started)
	return b
}

// pausedOnFakeClock is pausedServer on a server of its own, for a queue "q" of the defaults, with
// the broker's clock the fake it returns.
func pausedOnFakeClock(t *testing.T) (*Broker, *queue, *clock.Fake) {
	t.Helper()
	qclk := clock.NewFake(time.UnixMilli(1_700_000_000_000))
	a, q := pausedServer(t, natstest.Start(t, nil), "q", subjects.CreateQueueRequest{}, func(c *Config) { c.Clock = qclk })
	return a, q, qclk
}

// TestStaleDeletePurgesNothing: a queue's delete that the old broker began while it held the claim
// and goes on with once its claim ran out (a pause, say, before its renewal finds the claim taken)
// purges nothing: the broker that took the store over stored and acknowledged messages since, and
// the purges carry no revision to fence them.
func TestStaleDeletePurgesNothing(t *testing.T) {
	srv := natstest.Start(t, nil)
	ctx := context.Background()
	a, qa := pausedServer(t, srv, "q", subjects.CreateQueueRequest{})
	b := takeOver(t, srv)
	if _, err := b.queues["q"].enqueue(ctx, []subjects.EnqueueRequest{{ID: "acked"}}); err != nil {
		t.Fatal(err)
	}
	a.claim.until.Store(0) // a goes on: its claim ran out, its renewal has not run yet
	if _, err := a.deleteQueue(ctx, qa); !errors.Is(err, &subjects.Error{Code: subjects.CodeUnavailable}) {
		t.Fatalf("the stale delete: %v, want unavailable", err)
	}
	if _, _, err := b.store.GetMessage(ctx, "q", "acked"); err != nil {
		t.Fatalf("the new broker's acknowledged message: %v", err)
	}
	if _, _, err := b.store.GetQueue(ctx, "q"); err != nil {
		t.Fatalf("the queue the new broker serves: %v", err)
	}
}

// TestRescheduleSentAgainWhileItsTimerLags: a visible_at reschedule sent again after its time came
// but before the invisibility timer wrote the message pending (the timer lags: here it waits for
// the claim) finds its work done and writes nothing, as it would have before that time.
func TestRescheduleSentAgainWhileItsTimerLags(t *testing.T) {
	ctx := context.Background()
	a, q, qclk := pausedOnFakeClock(t)
	if _, err := q.enqueue(ctx, []subjects.EnqueueRequest{{ID: "m"}}); err != nil {
		t.Fatal(err)
	}
	at := qclk.Now().Add(5 * time.Second)
	asked := subjects.RescheduleRequest{ID: "m", VisibleAt: &at}
	m, err := q.reschedule(ctx, asked)
	if err != nil || m.State != subjects.StateInvisible {
		t.Fatalf("reschedule: %+v, %v", m, err)
	}
	held := a.claim.until.Load()
	a.claim.until.Store(0)
	qclk.Advance(6 * time.Second) // its time comes while the timer may not write
	a.claim.until.Store(held)
	asked.Version = m.Version + 7
	if again, err := q.reschedule(ctx, asked); err != nil || again.Version != m.Version {
		t.Fatalf("sent again once its time came: %+v, %v; want it left at version %d", again, err, m.Version)
	}
}

// TestStaleStartPurgesNoLocks: a start that goes on past its claim (a pause after it checked the
// claim) purges no locks of a queue it took for deleted: the broker that took the store over may
// have created the queue since, and the purge carries no revision to fence it.
func TestStaleStartPurgesNoLocks(t *testing.T) {
	srv := natstest.Start(t, nil)
	ctx := context.Background()
	a, _ := pausedServer(t, srv, "q", subjects.CreateQueueRequest{})
	b := takeOver(t, srv)
	x, _, err := b.createQueue(ctx, "x", subjects.CreateQueueRequest{Type: subjects.Exclusive, ExclusivityKey: "p"})
	if err != nil {
		t.Fatal(err)
	}
	if _, err := x.enqueue(ctx, []subjects.EnqueueRequest{{ID: "m", Metadata: subjects.Pairs{"p": "v"}}}); err != nil {
		t.Fatal(err)
	}
	if ms, err := x.dequeue(ctx, subjects.DequeueRequest{}); err != nil || len(ms) != 1 {
		t.Fatalf("dequeue: %+v, %v", ms, err)
	}
	a.claim.until.Store(0) // a goes on: its claim ran out, its renewal has not run yet
	a.dropStrayLocks(ctx, map[string]int{"x": 1})
	if l, _, err := b.store.GetSlot(ctx, "x", "v", 0); err != nil || l.MessageID != "m" {
		t.Fatalf("the new broker's lock: %+v, %v", l, err)
	}
}

// TestTimersWaitForTheClaim: a timer that fires while the claim does not hold (the broker went on
// after a pause, its renewal not run yet) writes nothing from the broker's indexes, which another
// broker may have overtaken; it tries again once the claim holds.
func TestTimersWaitForTheClaim(t *testing.T) {
	ctx := context.Background()
	a, q, qclk := pausedOnFakeClock(t)
	invisible := int64(5_000)
	if _, err := q.enqueue(ctx, []subjects.EnqueueRequest{{ID: "m", InvisibleMS: &invisible}}); err != nil {
		t.Fatal(err)
	}
	held := a.claim.until.Load()
	a.claim.until.Store(0)
	qclk.Advance(6 * time.Second) // the invisibility ends while the claim does not hold
	if r, _, err := a.store.GetMessage(ctx, "q", "m"); err != nil || r.State != subjects.StateInvisible {
		t.Fatalf("stored %s, %v: want still invisible, nothing written without the claim", r.State, err)
	}
	a.claim.until.Store(held)
	qclk.Advance(claimRetryMS * time.Millisecond)
	if r, _, err := a.store.GetMessage(ctx, "q", "m"); err != nil || r.State != subjects.StatePending {
		t.Fatalf("stored %s, %v: want pending once the claim holds again", r.State, err)
	}
}

// TestLateLeaseWriteFencedAtTakeOver: the broker that served an exclusive queue took a value's lock
// for a lease whose record write had not landed when a standby took the store over (it paused
// between the two writes). The standby's start rewrites that record at the revision it loaded, so
// the late lease write conflicts instead of making a second running message of the value. So it
// does for a lock of an earlier version, which names no payload, or no payload and no record
// version.
func TestLateLeaseWriteFencedAtTakeOver(t *testing.T) {
	for _, format := range []string{"current", "no payload", "no version"} {
		t.Run(format, func(t *testing.T) {
			srv := natstest.Start(t, nil)
			ctx := context.Background()
			a, qa := pausedServer(t, srv, "x", subjects.CreateQueueRequest{Type: subjects.Exclusive, ExclusivityKey: "p"})
			p1, p2 := int64(2), int64(1)
			if _, err := qa.enqueue(ctx, []subjects.EnqueueRequest{
				{ID: "m1", Priority: &p1, Metadata: map[string]string{"p": "v"}},
				{ID: "m2", Priority: &p2, Metadata: map[string]string{"p": "v"}},
			}); err != nil {
				t.Fatal(err)
			}
			// a takes v's lock for its lease lz of m1; the lease write, expecting m1's revision, is late.
			r, rev, err := a.store.GetMessage(ctx, "x", "m1")
			if err != nil {
				t.Fatal(err)
			}
			lock := kv.Lock{MessageID: "m1", LeaseID: "lz"}
			switch format {
			case "current":
				lock.Version, lock.BodySeq = r.Version+1, r.BodySeq
			case "no payload":
				lock.Version = r.Version + 1
			}
			if _, err := a.store.WriteSlot("x", "v", 0, lock, 0).Wait(ctx); err != nil {
				t.Fatal(err)
			}
			b := takeOver(t, srv)
			r.State, r.LeaseID, r.Version, r.Attempts = subjects.StateRunning, "lz", r.Version+1, r.Attempts+1
			if _, err := a.store.WriteMessage("x", &r, rev).Wait(ctx); !errors.Is(err, kv.ErrConflict) {
				t.Fatalf("the late lease write: %v, want a conflict", err)
			}
			ms, err := b.queues["x"].dequeue(ctx, subjects.DequeueRequest{Batch: 2})
			if err != nil || len(ms) != 1 || ms[0].ID != "m2" {
				t.Fatalf("b leased %v, %v: want m2 alone, the value's best", ms, err)
			}
			if got, _, err := b.store.GetMessage(ctx, "x", "m1"); err != nil || got.State != subjects.StatePending {
				t.Fatalf("m1 stored %s, %v: want pending", got.State, err)
			}
		})
	}
}

// TestNoFenceOfARecordPastItsLease: a waiting message whose record moved past the lease a lock
// names — released after it ran under another of its value's slots, or retried after it errored —
// can get no late write of that lease (it expects a revision written over since): a start leaves
// its record as it is, its version too, so that an operator's cancel or reschedule fenced by the
// version read before the restart still applies (an operator's probe found them refused).
func TestNoFenceOfARecordPastItsLease(t *testing.T) {
	srv := natstest.Start(t, nil)
	ctx := context.Background()
	a, q := pausedServer(t, srv, "x", subjects.CreateQueueRequest{Type: subjects.Exclusive, ExclusivityKey: "p", MaxRunningPerValue: 2, MaxAttempts: 1})
	p0, p1 := int64(0), int64(1)
	if _, err := q.enqueue(ctx, []subjects.EnqueueRequest{
		{ID: "b1", Priority: &p0, Metadata: map[string]string{"p": "v", "k": "b"}},
		{ID: "m", Priority: &p1, Metadata: map[string]string{"p": "v"}},
		{ID: "r", Priority: &p1, Metadata: map[string]string{"p": "w"}},
	}); err != nil {
		t.Fatal(err)
	}
	lease := func(req subjects.DequeueRequest, id string) subjects.Message {
		t.Helper()
		ms, err := q.dequeue(ctx, req)
		if err != nil || len(ms) != 1 || ms[0].ID != id {
			t.Fatalf("dequeue %+v: %+v, %v; want %s", req, ms, err, id)
		}
		return ms[0]
	}
	// m runs under v's slot 1 (b1 holds slot 0), then, released (its attempt given back), under slot 0.
	b1 := lease(subjects.DequeueRequest{Filter: map[string]string{"k": "b"}}, "b1")
	m := lease(subjects.DequeueRequest{Filter: map[string]string{"p": "v"}}, "m")
	if _, err := q.release(ctx, subjects.ReleaseRequest{ID: "m", LeaseID: m.LeaseID, Refund: true}); err != nil {
		t.Fatal(err)
	}
	if _, err := q.complete(ctx, subjects.LeaseRequest{ID: "b1", LeaseID: b1.LeaseID}); err != nil {
		t.Fatal(err)
	}
	m = lease(subjects.DequeueRequest{Filter: map[string]string{"p": "v"}}, "m")
	if _, err := q.release(ctx, subjects.ReleaseRequest{ID: "m", LeaseID: m.LeaseID, Refund: true}); err != nil {
		t.Fatal(err)
	}
	// r runs once, errors (its one attempt spent), and is retried.
	rl := lease(subjects.DequeueRequest{Filter: map[string]string{"p": "w"}}, "r")
	if _, err := q.release(ctx, subjects.ReleaseRequest{ID: "r", LeaseID: rl.LeaseID}); err != nil {
		t.Fatal(err)
	}
	if _, err := q.retry(ctx, subjects.RetryRequest{ID: "r"}); err != nil {
		t.Fatal(err)
	}
	before := map[string]uint64{}
	for _, id := range []string{"m", "r"} {
		rec, _, err := a.store.GetMessage(ctx, "x", id)
		if err != nil || rec.State != subjects.StatePending {
			t.Fatalf("%s stored %s, %v: want pending", id, rec.State, err)
		}
		before[id] = rec.Version
	}
	b := takeOver(t, srv)
	for _, id := range []string{"m", "r"} {
		if rec, _, err := b.store.GetMessage(ctx, "x", id); err != nil || rec.Version != before[id] {
			t.Errorf("%s at version %d after the start (%v), want %d: written behind everyone's back", id, rec.Version, err, before[id])
		}
	}
}

// TestStopDuringStart: a Stop that comes once a Start's recovery has ended, before it subscribes,
// makes that Start fail with ErrStopped and waits for it: once Stop returns, nothing answers.
func TestStopDuringStart(t *testing.T) {
	srv := natstest.Start(t, nil)
	b := claimBroker(t, srv, clock.NewFake(time.Unix(0, 0)))
	ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
	defer cancel()
	stopped := make(chan error, 1)
	b.recovered = func() {
		go func() { stopped <- b.Stop(ctx) }()
		select {
		case <-b.ctx.Done(): // the Stop has begun
		case <-ctx.Done():
			t.Error("the Stop did not begin")
		}
	}
	if err := b.Start(ctx); !errors.Is(err, ErrStopped) {
		t.Fatalf("Start = %v, want ErrStopped", err)
	}
	select {
	case err := <-stopped:
		if err != nil {
			t.Fatalf("Stop: %v", err)
		}
	case <-ctx.Done():
		t.Fatal("Stop did not return")
	}
	nc := srv.Connect(t)
	for _, subj := range []string{b.space.Subject(subjects.OpList, ""), b.space.Subject(subjects.OpEnqueue, "q")} {
		if _, err := nc.Request(subj, []byte("{}"), 5*time.Second); !errors.Is(err, nats.ErrNoResponders) {
			t.Fatalf("%s after Stop: %v, want no responders", subj, err)
		}
	}
}

// TestStopOfAStandby: a Stop of a broker whose Start waits for the claim ends that wait at once
// (ErrStopped); the Start does not wait on for its own ctx, nor take the claim after the Stop.
func TestStopOfAStandby(t *testing.T) {
	srv := natstest.Start(t, nil)
	a, _ := serving(t, srv)
	b, _, started := standby(t, srv) // its ctx lasts 30 s
	if err := b.Stop(context.Background()); err != nil {
		t.Fatal(err)
	}
	select {
	case err := <-started:
		if !errors.Is(err, ErrStopped) {
			t.Fatalf("the standby's Start = %v, want ErrStopped", err)
		}
	case <-time.After(10 * time.Second):
		t.Fatal("the standby's Start still waits after its Stop returned")
	}
	if got := holder(t, a); got != a.claim.mine.Broker {
		t.Fatalf("the claim names %s, want the serving broker %s", got, a.claim.mine.Broker)
	}
}

// TestStandbySnapshot: a standby serves nothing, and says its events are on, as configured
// (natstone_events_enabled read 0 on every standby).
func TestStandbySnapshot(t *testing.T) {
	srv := natstest.Start(t, nil)
	serving(t, srv)
	b, _, _ := standby(t, srv)
	if s := b.Snapshot(); s.Serving || len(s.Queues) != 0 || !s.Events.Enabled {
		t.Fatalf("a standby's snapshot: %+v, want not serving, no queues, events on", s)
	}
}

// TestStopEndsClaim: a Stop ends a Claim that waits as a standby (ErrStopped), which did wait on
// for its own ctx; and a Claim after a Stop fails at once.
func TestStopEndsClaim(t *testing.T) {
	srv := natstest.Start(t, nil)
	a, _ := serving(t, srv)
	b := claimBroker(t, srv, clock.NewFake(time.Unix(0, 0)))
	claimed := make(chan error, 1)
	go func() {
		ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
		defer cancel()
		claimed <- b.Claim(ctx)
	}()
	standingBy(t, b, b.claim.clock.(*clock.Fake), claimed)
	if err := b.Stop(context.Background()); err != nil {
		t.Fatal(err)
	}
	select {
	case err := <-claimed:
		if !errors.Is(err, ErrStopped) {
			t.Fatalf("Claim = %v, want ErrStopped", err)
		}
	case <-time.After(10 * time.Second):
		t.Fatal("Claim still waits after its broker's Stop returned")
	}
	if err := b.Claim(context.Background()); !errors.Is(err, ErrStopped) {
		t.Fatalf("Claim after Stop = %v, want ErrStopped", err)
	}
	if got := holder(t, a); got != a.claim.mine.Broker {
		t.Fatalf("the claim names %s, want the serving broker %s", got, a.claim.mine.Broker)
	}
}

// TestClaimNamingThisBrokerIsTaken: a claim that names this broker (a take of an earlier Claim
// whose answer was lost as its ctx ended) is this broker's: the next Start takes it at once, and
// does not stand by for its own claim's ttl.
func TestClaimNamingThisBrokerIsTaken(t *testing.T) {
	srv := natstest.Start(t, nil)
	b := claimBroker(t, srv, clock.NewFake(time.Unix(0, 0)))
	js, err := jetstream.New(srv.Connect(t))
	if err != nil {
		t.Fatal(err)
	}
	ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
	defer cancel()
	claims, err := kv.OpenClaims(ctx, &kv.Config{JS: js})
	if err != nil {
		t.Fatal(err)
	}
	mine := b.claim.mine
	if _, err := claims.Put(ctx, &mine, 0); err != nil {
		t.Fatal(err)
	}
	if err := b.Start(ctx); err != nil {
		t.Fatalf("Start over a claim naming this broker: %v (its claim clock never moved)", err)
	}
}

// TestClaimAfterItWasLost: a Claim after the claim it took was lost, before any Start, fails with
// ErrClaimLost; it answered that the claim was held.
func TestClaimAfterItWasLost(t *testing.T) {
	srv := natstest.Start(t, nil)
	clk := clock.NewFake(time.Unix(0, 0))
	b := claimBroker(t, srv, clk)
	ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
	defer cancel()
	if err := b.Claim(ctx); err != nil {
		t.Fatal(err)
	}
	_, rev, err := b.claim.claims.Get(ctx)
	if err != nil {
		t.Fatal(err)
	}
	if _, err := b.claim.claims.Put(ctx, &kv.Claim{Broker: "other", TTLMillis: DefaultClaimTTL.Milliseconds()}, rev); err != nil {
		t.Fatal(err)
	}
	clk.Advance(DefaultClaimTTL / 5) // the renewal finds the claim taken
	select {
	case <-b.ctx.Done(): // lost
	case <-ctx.Done():
		t.Fatal("the claim taken by another was not found lost")
	}
	if err := b.Claim(ctx); !errors.Is(err, ErrClaimLost) {
		t.Fatalf("Claim after the claim was lost = %v, want ErrClaimLost", err)
	}
}

// TestRenewalRetriedSoonWhileTheClaimsHaveNoLeader: a renewal refused because nothing serves the
// claims bucket (no responders: here JetStream is off for a moment; on a cluster, the bucket's
// leader was killed and the others are electing one) is tried again claimRetry later, not ttl/5
// later, so that the broker serves again within moments of the bucket taking writes.
func TestRenewalRetriedSoonWhileTheClaimsHaveNoLeader(t *testing.T) {
	srv := natstest.Start(t, nil)
	ca := clock.NewFake(time.Unix(0, 0))
	var logs natstest.LogBuffer
	a := claimBroker(t, srv, ca, func(c *Config) { c.Logger = slog.New(slog.NewTextHandler(&logs, nil)) })
	if err := a.Start(context.Background()); err != nil {
		t.Fatal(err)
	}
	js := srv.NATS().JetStreamConfig()
	js.StoreDir = srv.StoreDir() // the server's option, under which it keeps "jetstream"
	if err := srv.NATS().ShutdownJetStream(); err != nil {
		t.Fatal(err)
	}
	ca.Advance(DefaultClaimTTL / 5) // the renewal is refused: no responders
	if !strings.Contains(logs.String(), "could not renew the store's claim") || !strings.Contains(logs.String(), "no server took the write") {
		t.Fatalf("no refused renewal logged:\n%s", logs.String())
	}
	ca.Advance(2 * claimRetry) // two more tries, refused too: logged once per ttl/5, not per try
	if n := strings.Count(logs.String(), "could not renew the store's claim"); n != 1 {
		t.Fatalf("%d failed renewals logged within ttl/5, want 1:\n%s", n, logs.String())
	}
	a.claim.mu.Lock()
	last := a.claim.lastOK
	a.claim.mu.Unlock()
	if err := srv.NATS().EnableJetStream(js); err != nil {
		t.Fatal(err)
	}
	// The bucket takes writes again (its stream answers): the next try, claimRetry later, lands.
	nc := srv.Connect(t)
	jsc, err := jetstream.New(nc)
	if err != nil {
		t.Fatal(err)
	}
	for deadline := time.Now().Add(10 * time.Second); ; {
		ctx, cancel := context.WithTimeout(context.Background(), time.Second)
		_, err := jsc.Stream(ctx, "KV_natstone-claims")
		cancel()
		if err == nil {
			break
		}
		if time.Now().After(deadline) {
			t.Fatalf("the claims bucket after JetStream came back: %v", err)
		}
	}
	ca.Advance(claimRetry)
	a.claim.mu.Lock()
	renewed := a.claim.lastOK.After(last)
	a.claim.mu.Unlock()
	if !renewed {
		t.Fatalf("the claim was not renewed %v after a refused renewal, with the bucket back:\n%s", claimRetry, logs.String())
	}
	running(t, a)
}

// unansweredClaims starts a broker with claim ttl, its claim on the fake clock returned, and then
// makes its renewals go unanswered: the claims stream is gone, and a subscriber (taken, on nc)
// takes its subject, so that a renewal waits out its ttl/5. logs has the broker's log.
func unansweredClaims(t *testing.T, ttl time.Duration) (*Broker, *clock.Fake, *nats.Conn, *nats.Subscription, *natstest.LogBuffer) {
	t.Helper()
	srv := natstest.Start(t, nil)
	ca := clock.NewFake(time.Unix(0, 0))
	logs := new(natstest.LogBuffer)
	a := claimBroker(t, srv, ca, func(c *Config) {
		c.Logger = slog.New(slog.NewTextHandler(logs, nil))
		c.ClaimTTL = ttl
	})
	if err := a.Start(context.Background()); err != nil {
		t.Fatal(err)
	}
	nc := srv.Connect(t)
	js, err := jetstream.New(nc)
	if err != nil {
		t.Fatal(err)
	}
	if err := js.DeleteStream(context.Background(), "KV_natstone-claims"); err != nil {
		t.Fatal(err)
	}
	taken, err := nc.SubscribeSync("$KV.natstone-claims.>")
	if err != nil {
		t.Fatal(err)
	}
	if err := nc.Flush(); err != nil {
		t.Fatal(err)
	}
	return a, ca, nc, taken, logs
}

// TestRenewalRetriedSoonAfterItTimedOut: a renewal that storage took in but never answered (a
// server leading the claims bucket killed with it; here the bucket is gone and a subscriber takes
// the writes) times out, and is tried again claimRetry later, not ttl/5 later: an operator's
// trial saw the claim unrenewed for its whole ttl when it waited.
func TestRenewalRetriedSoonAfterItTimedOut(t *testing.T) {
	const ttl = 2 * time.Second // a renewal waits ttl/5 for its answer, in real time
	_, ca, _, taken, logs := unansweredClaims(t, ttl)
	ca.Advance(ttl / 5)
	if _, err := taken.NextMsg(10 * time.Second); err != nil {
		t.Fatalf("the renewal: %v", err)
	}
	eventually(t, "the renewal to time out", func() bool {
		return strings.Contains(logs.String(), "could not renew the store's claim") && strings.Contains(logs.String(), "deadline exceeded")
	})
	wctx, wcancel := context.WithTimeout(context.Background(), 10*time.Second)
	defer wcancel()
	if err := ca.WaitForTimers(wctx, 1); err != nil { // the next try armed (after the log line)
		t.Fatalf("no renewal armed after the one that timed out: %v", err)
	}
	if claimRetry >= ttl/5 {
		t.Fatalf("claimRetry %v is not sooner than ttl/5 %v: the test tells nothing", claimRetry, ttl/5)
	}
	ca.Advance(claimRetry)
	if _, err := taken.NextMsg(10 * time.Second); err != nil {
		t.Fatalf("no renewal %v after one timed out: %v\n%s", claimRetry, err, logs.String())
	}
}

// TestRenewalIssuedAgainAtTheClaimsElection: a renewal that waits for its answer when the claims
// stream elects a leader is issued again at once, to the new leader, rather than after its wait
// of ttl/5 and a retry. Here the renewal goes unanswered (the stream is gone, a subscriber takes its
// subject), and the election is its advisory; the broker's clock, which arms the retries, does not
// move, so only the advisory can bring the next renewal.
func TestRenewalIssuedAgainAtTheClaimsElection(t *testing.T) {
	const ttl = 10 * time.Second // a renewal waits ttl/5 for its answer, in real time
	_, ca, nc, taken, logs := unansweredClaims(t, ttl)
	advanced := make(chan struct{})
	go func() { // the renewal runs in the timer's callback, here for as long as it waits
		defer close(advanced)
		ca.Advance(ttl / 5)
	}()
	if _, err := taken.NextMsg(10 * time.Second); err != nil {
		t.Fatalf("the renewal: %v", err)
	}
	if err := nc.Publish(leaderElected("KV_natstone-claims"), []byte(`{"leader":"n2"}`)); err != nil {
		t.Fatal(err)
	}
	if _, err := taken.NextMsg(ttl / 5); err != nil {
		t.Fatalf("no renewal issued again at the claims stream's election, within the first one's wait: %v\n%s", err, logs.String())
	}
	<-advanced
}

// TestRenewalRetriedAtOnceAtTheClaimsElection: a renewal that failed waits claimRetry before it
// is tried again; the claims stream's election in that pause has it tried at once.
func TestRenewalRetriedAtOnceAtTheClaimsElection(t *testing.T) {
	const ttl = 2 * time.Second // a renewal waits ttl/5 for its answer, in real time
	a, ca, nc, taken, logs := unansweredClaims(t, ttl)
	ca.Advance(ttl / 5) // the renewal, unanswered: it times out, and the next is armed
	if _, err := taken.NextMsg(10 * time.Second); err != nil {
		t.Fatalf("the renewal: %v", err)
	}
	eventually(t, "the renewal to fail and wait to be tried again", func() bool {
		a.claim.mu.Lock()
		defer a.claim.mu.Unlock()
		return a.claim.retrying
	})
	if err := nc.Publish(leaderElected("KV_natstone-claims"), []byte(`{"leader":"n2"}`)); err != nil {
		t.Fatal(err)
	}
	if _, err := taken.NextMsg(10 * time.Second); err != nil { // the broker's clock stands still
		t.Fatalf("no renewal tried at once at the claims stream's election: %v\n%s", err, logs.String())
	}
}

// TestStandbyWarnsOfOtherReplicas: a standby whose replicas differ from the store's says so in its
// log as it stands by, not only once its takeover has scaled the store; one with the store's
// replicas, or none given (the store's own), says nothing of them.
func TestStandbyWarnsOfOtherReplicas(t *testing.T) {
	srv := natstest.Start(t, nil)
	serving(t, srv)
	for _, replicas := range []int{2, 1, 0} {
		var logs natstest.LogBuffer
		standby(t, srv, func(c *Config) {
			c.Replicas = replicas
			c.Logger = slog.New(slog.NewTextHandler(&logs, nil))
		})
		warned := strings.Contains(logs.String(), "this broker's replicas differ from the store's") &&
			strings.Contains(logs.String(), "replicas=2 store_replicas=1")
		if warned != (replicas == 2) {
			t.Errorf("a standby with replicas %d: warned %v, want %v:\n%s", replicas, warned, replicas == 2, logs.String())
		}
	}
}

// TestStandbySaysWhenItReadsTheClaimAgain: a standby whose reads of the claim fail (here the
// claims bucket is gone for a while) warns of them, and says when a read works again, so that its
// log does not end on the warning.
func TestStandbySaysWhenItReadsTheClaimAgain(t *testing.T) {
	srv := natstest.Start(t, nil)
	a, _ := serving(t, srv)
	var logs natstest.LogBuffer
	_, cb, _ := standby(t, srv, func(c *Config) { c.Logger = slog.New(slog.NewTextHandler(&logs, nil)) })
	ctx := context.Background()
	js, err := jetstream.New(srv.Connect(t))
	if err != nil {
		t.Fatal(err)
	}
	if err := js.DeleteStream(ctx, "KV_natstone-claims"); err != nil {
		t.Fatal(err)
	}
	cb.Advance(DefaultClaimTTL / 5)
	eventually(t, "the failed read's warning", func() bool { return strings.Contains(logs.String(), "could not read the store's claim") })
	if strings.Contains(logs.String(), "the store's claim is read again") {
		t.Fatalf("a read said to work again while they fail:\n%s", logs.String())
	}
	// The bucket again, with the serving broker's claim: the next read works.
	claims, err := kv.OpenClaims(ctx, a.kvConfig(js, 1))
	if err != nil {
		t.Fatal(err)
	}
	a.claim.mu.Lock()
	mine := a.claim.mine
	a.claim.mu.Unlock()
	if _, err := claims.Put(ctx, &mine, 0); err != nil {
		t.Fatal(err)
	}
	wctx, cancel := context.WithTimeout(ctx, 10*time.Second)
	defer cancel()
	if err := cb.WaitForTimers(wctx, 1); err != nil {
		t.Fatalf("the standby stopped reading the claim: %v\n%s", err, logs.String())
	}
	cb.Advance(DefaultClaimTTL / 5)
	eventually(t, "the read's recovery", func() bool { return strings.Contains(logs.String(), "the store's claim is read again") })
	if !strings.Contains(logs.String(), "failing_for=") {
		t.Fatalf("the read's recovery does not say how long reads failed:\n%s", logs.String())
	}
}

// TestRenewalReadingTheClaimFromAServerBehind: a renewal that conflicts and reads the claim back at
// or before the revision it expected read it from a server behind (a claims stream's leader just
// elected, before it applied what it had committed). That says nothing of who holds the claim, and
// the broker tries again soon rather than stopping as if another broker held it: a run on a
// cluster stopped the store's only broker so. Here the revision the broker knows is ahead of
// storage's, which holds another broker's claim: the same reads. Once storage holds this broker's
// claim past that revision, the renewal goes on from it; read behind for the claim's ttl, the
// broker gives the claim up.
func TestRenewalReadingTheClaimFromAServerBehind(t *testing.T) {
	srv := natstest.Start(t, nil)
	ca := clock.NewFake(time.Unix(0, 0))
	logs := new(natstest.LogBuffer)
	a := claimBroker(t, srv, ca, func(c *Config) { c.Logger = slog.New(slog.NewTextHandler(logs, nil)) })
	ctx := context.Background()
	if err := a.Start(ctx); err != nil {
		t.Fatal(err)
	}
	behind := func() uint64 {
		t.Helper()
		_, rev, err := a.claim.claims.Get(ctx)
		if err != nil {
			t.Fatal(err)
		}
		other, err := a.claim.claims.Put(ctx, &kv.Claim{Broker: "other", TTLMillis: DefaultClaimTTL.Milliseconds()}, rev)
		if err != nil {
			t.Fatal(err)
		}
		a.claim.mu.Lock()
		a.claim.rev = other + 3 // a renewal of its own stored past it, as far as the broker knows
		a.claim.mu.Unlock()
		return other
	}
	other := behind()
	ca.Advance(DefaultClaimTTL / 5) // the renewal conflicts, and reads another's claim from before
	running(t, a)
	if !strings.Contains(logs.String(), "a server behind") {
		t.Fatalf("the renewal's read back from a server behind is not logged:\n%s", logs.String())
	}
	// Storage catches up: this broker's claim, past the revision it expects.
	rev := other
	for range 4 {
		var err error
		if rev, err = a.claim.claims.Put(ctx, &a.claim.mine, rev); err != nil {
			t.Fatal(err)
		}
	}
	ca.Advance(claimRetry)
	if cur, renewed, err := a.claim.claims.Get(ctx); err != nil || cur.Broker != a.claim.mine.Broker || renewed != rev+1 {
		t.Fatalf("the claim after the retry: %+v at revision %d, %v; want this broker's, renewed at %d", cur, renewed, err, rev+1)
	}
	running(t, a)

	behind()
	ca.Advance(DefaultClaimTTL / 5)
	for range DefaultClaimTTL/claimRetry - 1 {
		ca.Advance(claimRetry)
		running(t, a)
	}
	ca.Advance(claimRetry) // behind for the claim's ttl
	stopsOnItsOwn(t, a)
	if !errors.Is(a.Err(), ErrClaimLost) || !strings.Contains(a.Err().Error(), "server behind") {
		t.Fatalf("the broker stopped with %v, want ErrClaimLost, read behind", a.Err())
	}
}

// TestPublishersCleanedUpAfterTheirFirstPublish: a JetStream context whose first asynchronous
// publish came just before the broker stopped publishing (the snapshot's upload is the first of a
// broker that wrote nothing else) is cleaned up without leaving nats.go's goroutine that watches
// the connection's status waiting on a nil channel. Cleaned up at once, 18 to 20 of the 20 did in
// four runs.
func TestPublishersCleanedUpAfterTheirFirstPublish(t *testing.T) {
	t.Parallel()
	srv := natstest.Start(t, nil)
	nc := srv.Connect(t)
	const brokers = 20
	cleaned := make(chan struct{}, brokers)
	for range brokers {
		b, err := New(&Config{Conn: nc})
		if err != nil {
			t.Fatal(err)
		}
		b.publishersCleaned = func() { cleaned <- struct{}{} }
		js, err := jetstream.New(nc)
		if err != nil {
			t.Fatal(err)
		}
		b.publishing(js)
		if _, err := js.PublishAsync("nowhere", nil); err != nil {
			t.Fatal(err)
		}
		b.stopPublishing()
	}
	for range brokers {
		select {
		case <-cleaned:
		case <-time.After(10 * time.Second):
			t.Fatal("the JetStream contexts were not cleaned up")
		}
	}
	buf := make([]byte, 8<<20)
	stacks := strings.Split(string(buf[:runtime.Stack(buf, true)]), "\n\n")
	stuck := 0
	for _, g := range stacks {
		if strings.Contains(g, "(nil chan)") && strings.Contains(g, "resetPendingAcksOnReconnect") {
			stuck++
		}
	}
	if stuck > 0 {
		t.Fatalf("%d of nats.go's goroutines watching a connection's status wait on a nil channel", stuck)
	}
}

// TestStopAgainWaitsForTheFirst: a Stop called while another is under way returns once that one
// has ended (its ctx ending first, it says so), not at once; one called after a Stop whose ctx
// ended before the work in progress waits for that work; and the Stops of a broker whose Start
// failed wait for nothing.
func TestStopAgainWaitsForTheFirst(t *testing.T) {
	t.Parallel()
	srv := natstest.Start(t, nil)
	b, _ := serving(t, srv)
	if !b.track() { // work in progress: a request, say, that the first Stop waits for
		t.Fatal("a serving broker tracks no work")
	}
	done := sync.OnceFunc(b.wg.Done)
	t.Cleanup(done) // should the test fail first, before the broker's Stop
	first := make(chan error, 1)
	go func() { first <- b.Stop(context.Background()) }()
	deadline := time.Now().Add(10 * time.Second)
	for b.mu.Lock(); !b.closed; b.mu.Lock() {
		b.mu.Unlock()
		if time.Now().After(deadline) {
			t.Fatal("the first Stop did not begin")
		}
		runtime.Gosched()
	}
	b.mu.Unlock()
	short, cancel := context.WithTimeout(context.Background(), 50*time.Millisecond)
	defer cancel()
	if err := b.Stop(short); err == nil || !strings.Contains(err.Error(), "before the Stop under way ended") {
		t.Fatalf("a second Stop while the first waits for work: %v, want its ctx's end said", err)
	}
	select {
	case <-b.Done():
		t.Fatal("stopped while work was in progress")
	default:
	}
	done()
	if err := b.Stop(context.Background()); err != nil {
		t.Fatalf("a Stop while the first ends: %v", err)
	}
	select {
	case <-b.Done(): // the second returned after the first ended
	default:
		t.Fatal("a second Stop returned before the first ended")
	}
	select {
	case err := <-first:
		if err != nil {
			t.Fatalf("the first Stop: %v", err)
		}
	case <-time.After(10 * time.Second):
		t.Fatal("the first Stop did not return")
	}

	// A first Stop whose ctx ends before the work in progress does: a second waits for that work.
	b, _ = serving(t, srv)
	if !b.track() {
		t.Fatal("a serving broker tracks no work")
	}
	done = sync.OnceFunc(b.wg.Done)
	t.Cleanup(done)
	ended, cancel2 := context.WithCancel(context.Background())
	cancel2()
	if err := b.Stop(ended); err == nil {
		t.Fatal("a Stop whose ctx had ended waited for the work in progress")
	}
	short, cancel3 := context.WithTimeout(context.Background(), 50*time.Millisecond)
	defer cancel3()
	if err := b.Stop(short); err == nil || !strings.Contains(err.Error(), "work in progress that an earlier Stop left") {
		t.Fatalf("a second Stop while that work runs: %v, want its ctx's end said", err)
	}
	done()
	if err := b.Stop(context.Background()); err != nil {
		t.Fatalf("a Stop once that work ends: %v", err)
	}

	// A broker whose Start failed on its own has nothing to stop: every Stop returns nil at once.
	// (On a store of its own: the claim of the broker above, its first Stop cut short, stays.)
	b = claimBroker(t, natstest.Start(t, nil), clock.NewFake(time.Unix(0, 0)))
	b.loaded = func() error { return errors.New("the test's failed load") }
	if err := b.Start(context.Background()); err == nil {
		t.Fatal("a Start whose load failed succeeded")
	}
	for i := range 3 {
		ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
		err := b.Stop(ctx)
		cancel()
		if err != nil {
			t.Fatalf("Stop %d of a broker whose Start failed: %v", i+1, err)
		}
	}
}

// TestFlushEventsDuringStart: FlushEvents may be called while Start runs (a metrics loop, say):
// the race detector finds nothing, and it returns.
func TestFlushEventsDuringStart(t *testing.T) {
	t.Parallel()
	srv := natstest.Start(t, nil)
	b := claimBroker(t, srv, clock.NewFake(time.Unix(0, 0)))
	stop := make(chan struct{})
	flushed := make(chan error, 1)
	go func() {
		for {
			if err := b.FlushEvents(context.Background()); err != nil {
				flushed <- err
				return
			}
			select {
			case <-stop:
				flushed <- nil
				return
			default:
			}
		}
	}()
	if err := b.Start(context.Background()); err != nil {
		t.Fatal(err)
	}
	close(stop)
	select {
	case err := <-flushed:
		if err != nil {
			t.Fatalf("FlushEvents during Start: %v", err)
		}
	case <-time.After(10 * time.Second):
		t.Fatal("FlushEvents did not return")
	}
}

// TestBrokersLeaveNoSubscriptions: brokers made, started and stopped one after another on the
// same connections (a supervisor that makes a new one after ErrClaimLost) leave no subscription
// behind on them: their JetStream contexts' acknowledgement subscriptions end with them.
func TestBrokersLeaveNoSubscriptions(t *testing.T) {
	t.Parallel()
	srv := natstest.Start(t, nil)
	nc, store, client := srv.Connect(t), srv.Connect(t), srv.Connect(t)
	cycle := func() {
		t.Helper()
		b, err := New(&Config{Conn: nc, StoreConn: store, Logger: slog.New(slog.NewTextHandler(io.Discard, nil))})
		if err != nil {
			t.Fatal(err)
		}
		cleaned := make(chan struct{})
		b.publishersCleaned = func() { close(cleaned) }
		ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
		defer cancel()
		if err := b.Start(ctx); err != nil {
			t.Fatal(err)
		}
		// Writes of records, payloads and events: every context publishes.
		if reply, err := client.Request(b.space.Subject(subjects.OpEnqueue, "q"), []byte(`{"id":"m"}`), 10*time.Second); err != nil || bytes.Contains(reply.Data, []byte(`"error"`)) {
			t.Fatalf("enqueue: %v %s", err, reply.Data)
		}
		if err := b.FlushEvents(ctx); err != nil {
			t.Fatal(err)
		}
		if err := b.Stop(ctx); err != nil {
			t.Fatal(err)
		}
		select {
		case <-cleaned:
		case <-ctx.Done():
			t.Fatal("the broker's JetStream contexts were not cleaned up after its stop")
		}
	}
	cycle() // nats.go's own subscriptions, made once per connection, are there now
	want, wantStore := nc.NumSubscriptions(), store.NumSubscriptions()
	for range 2 {
		cycle()
	}
	if got, gotStore := nc.NumSubscriptions(), store.NumSubscriptions(); got != want || gotStore != wantStore {
		t.Fatalf("after two more brokers, %d and %d subscriptions on the connections, want %d and %d as after the first", got, gotStore, want, wantStore)
	}
}
