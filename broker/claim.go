package broker

import (
	"context"
	"errors"
	"fmt"
	"os"
	"sync"
	"sync/atomic"
	"time"

	"github.com/nats-io/nats.go"
	"github.com/nats-io/nuid"

	"github.com/natstone/natstone/broker/clock"
	"github.com/natstone/natstone/kv"
)

// DefaultClaimTTL is Config.ClaimTTL's default.
const DefaultClaimTTL = 10 * time.Second

// ErrClaimLost is what Err returns once the broker has stopped because it lost its claim on the
// store: another broker took the store over.
var ErrClaimLost = errors.New("natstone: the broker lost its claim on the store")

// ErrStarted is the error of a Start of a Broker that was started or stopped before: a Broker
// runs once.
var ErrStarted = errors.New("natstone: the broker was started before: a Broker starts once, make another with New")

// ErrStopped is the error of a Start or Claim that a Stop ended, and of a Claim that came after
// one (a Start after a Stop fails with ErrStarted).
var ErrStopped = errors.New("natstone: the broker was stopped")

// A claimer takes and keeps the store's claim: one broker serves a store at a time, and others
// wait as standbys (design.md, "One broker per store"). Its holder rewrites it every ttl/5. A
// standby takes it over once it has seen it unchanged for ttl (or for the holder's ttl, if
// longer); the holder answers nothing done from ttl/2 after the last renewal it sent that was
// stored (held), until a renewal is stored again, and stops when a renewal finds another broker's
// claim.
type claimer struct {
	b      *Broker
	claims *kv.Claims // set by Broker.Claim
	ttl    time.Duration
	mine   kv.Claim
	// clock is real time, not Config.Clock: the claim is a lease between processes, whereas
	// Config.Clock is the queues' time (tests move it by hours). Tests of the claim replace it.
	clock clock.Clock

	write sync.Mutex // held by a renewal and the release: they write one after the other

	// elections ends the wait of a renewal in flight when the claims stream elects a leader
	// (watchElections): the server that took it may be gone, and the new leader takes it at once.
	elections *ackWatch

	// base and until say how long the claim holds, by this broker's clock: until it is
	// base + until (nanoseconds), ttl/2 after the last renewal stored was sent; 0 once ended.
	// base is set when acquire starts, before anything reads it.
	base  time.Time
	until atomic.Int64

	// mu guards the fields below.
	mu     sync.Mutex
	stored chan struct{} // closed, and replaced, when a renewal is stored
	rev    uint64        // the claim's revision; 0 until acquired
	lastOK time.Time     // when the last renewal that was stored was sent
	warned time.Time     // when a failed renewal was last logged
	behind time.Time     // since when renewals have conflicted and read the claim back from a server behind; zero: not
	timer  clock.Timer
	// next is what the renewal timer reaches the claimer through; end clears it. A stopped timer
	// can stay in the runtime's timer heap until it would have fired, and must not keep the
	// stopped broker's memory alive that long (S5 measures it right after a stop).
	next         *atomic.Pointer[claimer]
	ended        bool               // released or lost: nothing renews it any more
	retrying     bool               // a renewal failed, and the next is armed claimRetry later
	electionsSub *nats.Subscription // the claims stream's elections (watchElections)

	testTaking func() // tests': called as a standby writes its take of the claim
}

func newClaimer(b *Broker) *claimer {
	host, _ := os.Hostname()
	return &claimer{
		b:     b,
		ttl:   b.cfg.ClaimTTL,
		clock: clock.Real(),
		mine: kv.Claim{
			Broker:    nuid.Next(),
			Host:      host,
			PID:       os.Getpid(),
			TTLMillis: b.cfg.ClaimTTL.Milliseconds(),
		},
		stored:    make(chan struct{}),
		elections: newAckWatch(),
	}
}

// watchElections ends the wait of a renewal in flight whenever stream, the claims bucket's, elects
// a leader, until the broker stops. After a kill of the server leading the bucket, the renewal it
// had taken went unanswered for its whole ttl/5 although the bucket elected a leader in the
// meantime: an operator's trial on three servers (ttl 10 s) saw the claim unrenewed for up to
// 8.8 s, 1.2 s short of a standby's takeover. A broker whose NATS user may not receive the
// advisory waits its renewals out, as before.
func (c *claimer) watchElections(nc *nats.Conn, stream string) {
	sub, err := nc.Subscribe(leaderElected(stream), func(*nats.Msg) {
		c.elections.ended(fmt.Errorf("%w: stream %s elected a leader", errAcksLost, stream))
		// A renewal that failed and waits to be tried again is tried now: a trial saw the election
		// come in that pause, and the renewal 41 ms after it, where others took 1–5 ms.
		c.mu.Lock()
		defer c.mu.Unlock()
		if c.retrying && !c.ended {
			c.retrying = false
			c.disarm()
			go c.renew()
		}
	})
	if err != nil {
		c.b.log.Warn(notTold, "stream", stream, "error", err)
		return
	}
	c.mu.Lock()
	c.electionsSub = sub // ended with the claim (end), or with the broker if it never held it
	c.mu.Unlock()
	context.AfterFunc(c.b.ctx, func() { _ = sub.Unsubscribe() })
}

// held says whether the claim holds now: it was renewed less than ttl/2 ago, so no standby can
// have taken the store over yet. A reply is sent only if it holds once the request's writes were
// stored: a broker that was stopped past its claim (a pause of its process, say) and goes on must
// not acknowledge writes that another broker serving the store does not know of.
func (c *claimer) held() bool { return c.left() > 0 }

// silent says whether the broker must not even answer that it does not serve: its last renewal
// stored was sent ttl or more ago (or the claim ended), so a standby may have taken the store over,
// and gets every request this broker gets. Between ttl/2 and ttl no standby can have taken over
// yet (it waits to see the claim unchanged for ttl, from a revision stored after it was sent), and
// the broker answers unavailable.
func (c *claimer) silent() bool {
	until := time.Duration(c.until.Load())
	return until == 0 || c.clock.Now().Sub(c.base)-until >= c.ttl/2
}

// left is how long the claim holds from now, as it stands (≤ 0: it does not).
func (c *claimer) left() time.Duration {
	return time.Duration(c.until.Load()) - c.clock.Now().Sub(c.base)
}

// bound returns ctx ending when the claim stops holding as it stands now (a renewal meanwhile does
// not move the end), or errClaimRanOut if it does not hold now. It is for writes no compare-and-swap
// fences, a queue's purges: a broker that went on after a pause, past its claim, must not purge what
// the broker that took the store over stored since.
func (c *claimer) bound(ctx context.Context) (context.Context, context.CancelFunc, error) {
	left := c.left()
	if left <= 0 {
		return nil, nil, errClaimRanOut
	}
	ctx, cancel := context.WithTimeout(ctx, left)
	return ctx, cancel, nil
}

// renewed records a renewal stored, sent at sent. The caller holds c.mu.
func (c *claimer) renewed(rev uint64, sent time.Time) {
	c.rev, c.lastOK = rev, sent
	c.until.Store(int64(sent.Sub(c.base) + c.ttl/2))
	close(c.stored)
	c.stored = make(chan struct{})
}

// waitHeld returns once the claim holds, after the renewal that makes it hold again if need be;
// errClaimRanOut if it was lost or ctx ends first.
func (c *claimer) waitHeld(ctx context.Context) error {
	for {
		c.mu.Lock()
		ended, stored := c.ended, c.stored
		c.mu.Unlock()
		switch {
		case ended:
			return errClaimRanOut
		case c.held():
			return nil
		}
		select {
		case <-stored:
		case <-ctx.Done():
			return errClaimRanOut
		}
	}
}

// end stops renewing. The caller holds c.mu.
func (c *claimer) end() {
	c.ended = true
	c.until.Store(0)
	close(c.stored) // waitHeld sees it ended
	c.stored = make(chan struct{})
	c.disarm()
	if c.electionsSub != nil {
		_ = c.electionsSub.Unsubscribe() // its callback, should it run now, finds the claim ended
	}
}

// arm schedules the next renewal. The caller holds c.mu.
func (c *claimer) arm() { c.armIn(c.every()) }

// armIn arms the next renewal d from now, in place of one armed before. The caller holds c.mu.
func (c *claimer) armIn(d time.Duration) {
	c.disarm()
	next := new(atomic.Pointer[claimer])
	next.Store(c)
	c.next = next
	c.timer = c.clock.AfterFunc(d, func() {
		if c := next.Load(); c != nil {
			c.renew()
		}
	})
}

// disarm stops the renewal armed, if any: its timer, and its callback should the timer have fired
// already and not yet reached the claimer. The caller holds c.mu.
func (c *claimer) disarm() {
	if c.next != nil {
		c.next.Store(nil)
		c.timer.Stop()
	}
}

// every is how often the holder renews the claim and a standby looks at it.
func (c *claimer) every() time.Duration { return c.ttl / 5 }

// acquire returns once the broker holds the store's claim. While another broker holds it, it waits
// as a standby: it reads the claim every ttl/5, when its ttl is up, and at once when the claim is
// written (a plain subscription to the key's subject tells it), and takes it when it was released
// or has stayed unchanged for its ttl. takeOver takes it at once, whoever holds it.
func (c *claimer) acquire(ctx context.Context, takeOver bool) error {
	nudge, written := make(chan struct{}, 1), make(chan struct{}, 1)
	signal := func(ch chan struct{}) {
		select {
		case ch <- struct{}{}:
		default:
		}
	}
	poke := func() { signal(nudge) }
	sub, err := c.b.cfg.Conn.Subscribe(c.claims.Subject(), func(*nats.Msg) { signal(written) })
	if err != nil {
		return fmt.Errorf("natstone: watch the store's claim: %w", err)
	}
	defer func() { _ = sub.Unsubscribe() }()
	c.base = c.clock.Now() // before anything serves, which reads it

	var (
		seen   uint64    // the holder's revision last read
		seenAt time.Time // when it was first read
		holder string    // the broker standing by was last told about
		tried  time.Time // when the last take was sent
		// Reads left before the standby waits ttl/5 again, after a write of the claim woke it:
		// the subscription hears of a write as it is sent, and a replicated stream may not have
		// stored it yet when the read that follows gets there. A read that shows a change does not
		// end them: two writes heard as one (a renewal, then the release it held up) show the
		// first.
		unseen int
		// When the first of the reads failing since the last that did not failed (zero: none
		// fails): a read that works again says so, after their warnings.
		failing time.Time
	)
	for {
		// Each read bounded by ttl/5, the time between two looks: one that found no answer
		// (JetStream off, say) waited up to its start's timeout, and the takeover with it.
		rctx, cancel := context.WithTimeout(ctx, c.every())
		cur, rev, err := c.claims.Get(rctx)
		cancel()
		// After the read: the holder may have renewed while it was on its way, and a standby must
		// not count that time as the claim's.
		now := c.clock.Now()
		switch read := err == nil || errors.Is(err, kv.ErrNotFound); {
		case read && !failing.IsZero():
			c.b.log.Info("the store's claim is read again", "failing_for", now.Sub(failing))
			failing = time.Time{}
		case !read && failing.IsZero():
			failing = now
		}
		take, wait := false, c.every()
		switch {
		case errors.Is(err, kv.ErrNotFound):
			rev, take = 0, true
		case err != nil:
			if ctx.Err() != nil {
				return fmt.Errorf("natstone: wait for the store's claim: %w", ctx.Err())
			}
			c.b.log.Warn("could not read the store's claim", "err", err)
		case cur.Broker == c.mine.Broker && !tried.IsZero():
			c.took(rev, tried) // a take whose answer was lost was stored after all
			return nil
		case cur.Broker == c.mine.Broker:
			// Taken by an earlier call of this broker whose answer was lost (its ctx ended): it is
			// this broker's, to take again at its revision.
			take = true
		default:
			if rev != seen {
				seen, seenAt = rev, now
			}
			if cur.Broker != holder && !takeOver {
				holder = cur.Broker
				c.b.log.Info("another broker serves the store: standing by", "broker", cur.Broker, "host", cur.Host,
					"pid", cur.PID, "since", cur.Since, "ttl", cur.TTL())
				c.b.warnReplicasDiffer(ctx, c.every()) // within a look's time: the standby's next is due then
			}
			ttl := max(c.ttl, cur.TTL())
			take = takeOver || now.Sub(seenAt) >= ttl
			wait = min(wait, seenAt.Add(ttl).Sub(now))
			if take && !takeOver {
				c.b.log.Warn("the broker serving the store stopped renewing its claim: taking over", "broker", cur.Broker,
					"host", cur.Host, "pid", cur.PID, "unchanged_for", now.Sub(seenAt))
			}
		}
		if take {
			if c.testTaking != nil {
				c.testTaking()
			}
			sent := c.clock.Now()
			c.mine.Since, tried = sent, sent
			rev, err = c.claims.Put(ctx, &c.mine, rev)
			if err == nil {
				c.took(rev, sent)
				return nil
			}
			if errors.Is(err, kv.ErrConflict) {
				// Another write came first (the holder's renewal, or another standby's take): read
				// it, and say who serves, as the "taking over" line said otherwise.
				holder = ""
				continue
			}
			if ctx.Err() != nil {
				c.disown(context.WithoutCancel(ctx))
				return fmt.Errorf("natstone: take the store's claim: %w", ctx.Err())
			}
			c.b.log.Warn("could not take the store's claim", "err", err)
			wait = c.every()
		}
		t := c.clock.AfterFunc(max(wait, time.Millisecond), poke)
		var again *time.Timer // in real time: how soon storage stores a write is not the claim's clock's
		if unseen > 0 {
			again = time.AfterFunc(claimReread<<(claimRereads-unseen), poke)
			unseen--
		}
		select {
		case <-nudge:
		case <-written:
			unseen = claimRereads
		case <-ctx.Done():
			t.Stop()
			stopTimer(again)
			return fmt.Errorf("natstone: wait for the store's claim: %w", ctx.Err())
		}
		t.Stop()
		stopTimer(again)
	}
}

// A standby that a write of the claim woke reads it again claimRereads times, after pauses that
// double from claimReread (2.5 s in all), before it waits ttl/5: a clean stop's release, stored a
// moment after its subscription heard of it, is then taken over at once. (Five reads 20 ms apart
// missed it on a loaded machine, a cluster replicating the release more slowly: one CI run.)
const (
	claimRereads = 7
	claimReread  = 20 * time.Millisecond
)

func stopTimer(t *time.Timer) {
	if t != nil {
		t.Stop()
	}
}

// took records the claim taken at revision rev by a write sent at sent, and arms its renewals.
func (c *claimer) took(rev uint64, sent time.Time) {
	c.mu.Lock()
	c.renewed(rev, sent)
	c.arm()
	c.mu.Unlock()
	c.b.log.Info("took the store's claim", "broker", c.mine.Broker)
}

// renew rewrites the claim, and arms the next renewal; it gives the claim up, and stops the
// broker, when another broker holds it.
func (c *claimer) renew() {
	c.write.Lock()
	defer c.write.Unlock()
	c.mu.Lock()
	if c.ended {
		c.mu.Unlock()
		return
	}
	rev := c.rev
	c.retrying = false // an election meanwhile ends this one's wait
	c.mu.Unlock()

	var (
		sent time.Time
		next uint64
		err  error
	)
	for issues := 1; ; issues++ {
		sent = c.clock.Now()
		lost := c.elections.current()
		ctx, cancel := context.WithTimeout(context.Background(), c.every())
		stop := context.AfterFunc(lost, cancel)
		next, err = c.claims.Put(ctx, &c.mine, rev)
		stop()
		cancel()
		if err == nil || lost.Err() == nil || issues > electionIssues {
			break
		}
		// The claims stream elected a leader while the renewal waited: the new leader takes it
		// now. One that had landed is found by the conflict below. Elections (or forged
		// advisories: docs/security.md) that keep coming end the renewal as a failure after
		// electionIssues, as they end a write.
	}
	if errors.Is(err, kv.ErrConflict) {
		// A renewal whose answer was lost may have been stored: then the claim is still this one's.
		// Only a claim read back past rev as another broker's (or released) is lost. The conflict
		// proves the claim is past rev, so a read back of rev or before (or of none) came from a
		// server behind, a claims stream's leader just elected before it applied what it had
		// committed: it says nothing, and the renewal is tried again soon, as is one whose read
		// failed (a cluster's run saw a broker stop so, the store's only one).
		gctx, gcancel := context.WithTimeout(context.Background(), c.every())
		cur, curRev, gerr := c.claims.Get(gctx)
		read := gerr == nil || errors.Is(gerr, kv.ErrNotFound)
		switch {
		case gerr == nil && cur.Broker == c.mine.Broker:
			next, err = c.claims.Put(gctx, &c.mine, curRev)
			if errors.Is(err, kv.ErrConflict) && curRev <= rev {
				err = errClaimBehind
			}
		case read && curRev <= rev:
			err = errClaimBehind
		case !read:
			err = gerr
		}
		gcancel()
	}

	c.mu.Lock()
	defer c.mu.Unlock()
	if c.ended {
		if err == nil {
			c.rev = next // a release waiting for this renewal deletes this revision
		}
		return
	}
	if errors.Is(err, errClaimBehind) {
		// Behind for the claim's ttl, it is no longer a server catching up: storage lost the
		// revisions read (an unclean stop of a server that had not written them), and nothing
		// tells whose the claim is. It is given up, as one another broker holds.
		if now := c.clock.Now(); c.behind.IsZero() {
			c.behind = now
		} else if now.Sub(c.behind) >= c.ttl {
			err = kv.ErrConflict
		}
	} else {
		c.behind = time.Time{}
	}
	switch {
	case err == nil:
		back, was := !c.held(), c.lastOK
		c.renewed(next, sent)
		if back {
			c.b.log.Info("the store's claim is renewed: answering requests again", "unrenewed_for", sent.Sub(was))
			// Long polls parked meanwhile may have been served messages whose leases were not
			// written, and put back: they are offered again now, not at the next transition.
			go c.b.serveParked()
		}
	case errors.Is(err, kv.ErrConflict):
		c.end()
		why := "another broker holds it"
		if !c.behind.IsZero() { // (set only when read behind for the ttl: reset otherwise)
			why = "its renewals read it back from a server behind for its whole ttl"
		}
		go c.b.lose(errors.New(why))
		return
	default:
		// Storage out of reach: past ttl/2 the broker answers unavailable (held), and a renewal
		// that lands later, at the same revision, proves that no standby took over meanwhile.
		if now := c.clock.Now(); now.Sub(c.warned) >= c.every() { // once per ttl/5, not per retry
			c.warned = now
			c.b.log.Warn("could not renew the store's claim", "err", err, "unrenewed_for", now.Sub(c.lastOK))
		}
		// Tried again soon, not ttl/5 later: the claims bucket of a cluster whose server leading
		// it was killed takes writes again once it has elected a leader, and the queues, which
		// stop ttl/2 after the last renewal stored, should serve again within moments of that.
		// A renewal the killed server took (or the route to it, before its end was known) times
		// out rather than finding no leader: an operator's trial saw the next renewal 3.6 s after
		// the election when it waited ttl/5 more, the claim unrenewed for its whole ttl. A try
		// that timed out took ttl/5 already; one that fails at once (no leader, no connection) is
		// a small write, four a second.
		c.armIn(min(claimRetry, c.every()))
		c.retrying = true
		return
	}
	c.arm()
}

// errClaimBehind is a renewal's error when it conflicted and the claim read back was at or before
// the revision it expected: read from a server behind, it says nothing of who holds the claim.
var errClaimBehind = errors.New("the claim read back after a conflict is not past the revision the renewal expected (a server behind): read again")

// claimRetry is how soon a renewal that failed is tried again.
const claimRetry = 250 * time.Millisecond

// abandon stops renewing the claim, and leaves it to expire.
func (c *claimer) abandon() {
	c.mu.Lock()
	defer c.mu.Unlock()
	c.end()
}

// disown removes the claim if it names this broker: a take that the ctx cut short may have been
// stored all the same, and nobody would renew or release it.
func (c *claimer) disown(ctx context.Context) {
	ctx, cancel := context.WithTimeout(ctx, c.every())
	defer cancel()
	cur, rev, err := c.claims.Get(ctx)
	if err != nil || cur.Broker != c.mine.Broker {
		return // not stored, or not known: a claim never renewed runs out in its ttl
	}
	if err := c.claims.Release(ctx, rev); err != nil && !errors.Is(err, kv.ErrConflict) {
		c.b.log.Warn("could not remove the store's claim, taken as the wait for it ended", "err", err)
	}
}

// giveBack removes the claim that acquire has just taken for a broker stopped meanwhile, whose
// Stop found none to release (and ended the claimer): release would take it for ended already.
func (c *claimer) giveBack(ctx context.Context) {
	c.mu.Lock()
	c.end()
	c.mu.Unlock()
	c.remove(ctx, "could not give back the store's claim, taken as the broker stopped")
}

// release removes the claim, so that a standby takes the store over at once, unless it was lost.
// It waits up to ttl/5 for that; a release that fails (storage out of reach) is only logged: the
// standby then waits out the ttl.
func (c *claimer) release(ctx context.Context) {
	c.mu.Lock()
	held := !c.ended && c.rev != 0
	c.end()
	c.mu.Unlock()
	if held {
		c.remove(ctx, "the store's claim was not released: a standby takes over once its ttl is up")
	}
}

// remove deletes the ended claimer's claim, within ttl/5, at its revision once a renewal in flight
// has ended; a failure is logged as failed says.
func (c *claimer) remove(ctx context.Context, failed string) {
	c.write.Lock() // a renewal in flight ends first, so that rev is its
	defer c.write.Unlock()
	c.mu.Lock()
	rev := c.rev
	c.mu.Unlock()
	ctx, cancel := context.WithTimeout(ctx, c.every())
	defer cancel()
	if err := c.claims.Release(ctx, rev); err != nil && !errors.Is(err, kv.ErrConflict) {
		c.b.log.Warn(failed, "err", err)
	}
}
