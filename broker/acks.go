package broker

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"strings"
	"sync"
	"sync/atomic"
	"time"

	"github.com/nats-io/nats.go"

	"github.com/natstone/natstone/kv"
)

// ackWatch tells the writes waiting for a stream's acknowledgements when they may never come:
// when the stream elects a leader, since a write the old leader took but did not commit is
// dropped, unanswered. The writes waiting then are issued again at once instead of after the write
// timeout: the same write with the same expected revision, so one that had landed is found, not
// repeated (queue.resolve). Without it a message or an exclusivity value stayed held for one to
// three write timeouts after a NATS server's restart. (A reconnect needs nothing of the kind:
// nats.go fails the acknowledgements pending when its connection drops, at once, and the writes
// issued again while it reconnects are sent once it has.)
//
// A write takes its context from current before it is issued, so an election that comes between
// its publish and its wait still ends the wait.
//
// Should the election's advisory not come (the broker's user may not receive it, or the route
// from a server just restarted does not carry the broker's interest yet), checkLeaders finds the
// new leader by asking, once a write has waited a tick or more.
type ackWatch struct {
	mu     sync.Mutex
	ctx    context.Context
	cancel context.CancelCauseFunc
	ends   uint64    // how often the waits were ended
	stream string    // the stream's name
	leader kv.Leader // its leader as last known: Name "" if none known
	before string    // the leader known before it (without leader_since, an answer of it is an old one's)
	toldAt time.Time // when the advisory that named leader was sent, its Since unknown; else zero
	found  kv.Leader // the leader whose election a check found and ended the waits for: its advisory ends nothing

	// The writes waiting, counted by the checker's tick they began in: those of the current tick,
	// and (checkLeaders' own) those of earlier ticks that had writes waiting at the last tick.
	waiting atomic.Pointer[waiters]
	older   []*waiters
}

// waiters counts the writes waiting that began in one tick of checkLeaders.
type waiters struct{ n atomic.Int64 }

func newAckWatch() *ackWatch {
	w := &ackWatch{}
	w.ctx, w.cancel = context.WithCancelCause(context.Background())
	w.waiting.Store(&waiters{})
	return w
}

// current returns the context a write waits for its acknowledgement under: it ends, with why as
// its cause, at the next change that may lose acknowledgements.
func (w *ackWatch) current() context.Context {
	w.mu.Lock()
	defer w.mu.Unlock()
	return w.ctx
}

// ended ends the waits of the writes in flight: why says what may have lost their
// acknowledgements.
func (w *ackWatch) ended(why error) {
	w.mu.Lock()
	defer w.mu.Unlock()
	w.end(why)
}

// end is ended, called with w.mu held.
func (w *ackWatch) end(why error) {
	w.cancel(why)
	w.ctx, w.cancel = context.WithCancelCause(context.Background())
	w.ends++
}

// errAcksLost is the cause of the waits ackWatch ends: an unknown outcome, as a timeout is, but
// no sign that storage is slow to answer, so the write is issued again without counting a try.
var errAcksLost = errors.New("storage may have dropped the acknowledgement")

// notTold is what a broker whose NATS user may not receive the advisories of its streams' leader
// elections logs at start.
const notTold = "not told of storage's leader elections: a write lost at one is issued again once the broker finds the new leader by asking, a second or more later"

// leaderElected is the subject of JetStream's advisory that stream elected a leader.
func leaderElected(stream string) string {
	return "$JS.EVENT.ADVISORY.STREAM.LEADER_ELECTED." + stream
}

// watchAcks ends the waits of the message writes in flight whenever store's messages stream elects
// a leader, those of the lock writes whenever the locks stream does, and those of the payload
// writes whenever the payloads stream does, until the broker stops (b.ctx), which waits for it. A
// subscription the server refuses is logged; checkLeaders then finds the elections, later.
func (b *Broker) watchAcks(ctx context.Context, store *kv.Store) {
	messages, locks, bodies := store.WriteStreams()
	b.msgAcks.stream, b.lockAcks.stream, b.bodyAcks.stream = messages, locks, bodies
	var subs []*nats.Subscription
	for _, w := range []*ackWatch{b.msgAcks, b.lockAcks, b.bodyAcks} {
		stream := w.stream
		sub, err := b.cfg.Conn.Subscribe(leaderElected(stream), func(m *nats.Msg) {
			var adv struct {
				Leader string    `json:"leader"`
				Time   time.Time `json:"timestamp"`
			}
			_ = json.Unmarshal(m.Data, &adv) // an advisory without them ends the waits all the same
			if w.told(adv.Leader, adv.Time, fmt.Errorf("%w: stream %s elected a leader", errAcksLost, stream)) {
				b.log.Info("a stream of the store elected a leader: writes waiting for its acknowledgements are issued again", "stream", stream, "leader", adv.Leader)
			}
		})
		if err != nil {
			b.log.Warn(notTold, "stream", stream, "error", err)
			continue
		}
		subs = append(subs, sub)
	}
	// The server refuses a subscription after the fact, as an asynchronous error: one it refused
	// is known once a round trip has come back.
	if err := flush(ctx, b.cfg.Conn); err == nil {
		if last := b.cfg.Conn.LastError(); errors.Is(last, nats.ErrPermissionViolation) && strings.Contains(last.Error(), leaderElected("")) {
			b.log.Warn(notTold, "error", last)
		}
	}
	// Start is under way (counted in b.calls), and Stop waits for it before it waits for b.wg.
	b.wg.Add(2)
	go func() {
		defer b.wg.Done()
		<-b.ctx.Done()
		for _, sub := range subs {
			_ = sub.Unsubscribe()
		}
	}()
	go func() {
		defer b.wg.Done()
		b.checkLeaders(b.msgAcks, b.lockAcks, b.bodyAcks)
	}()
}

// issue issues a write with write and waits for its answer, for ctx to end, or for w's stream to
// elect a leader. The watch's context is taken before the write is published, so an election
// between the two still ends the wait.
func (w *ackWatch) issue(ctx context.Context, write func() kv.Write) (uint64, error) {
	lost := w.current()
	return w.wait(ctx, lost, write())
}

// wait waits for wr's answer, for ctx to end, or for lost (taken from current before wr was
// issued) to end; checkLeaders counts it meanwhile.
func (w *ackWatch) wait(ctx, lost context.Context, wr kv.Write) (uint64, error) {
	c := w.waiting.Load()
	c.n.Add(1)
	defer c.n.Add(-1)
	return wr.WaitOr(ctx, lost)
}

// read runs get, a read of w's stream, until it is answered or ctx ends: a try unanswered after
// try (a tick of checkLeaders, doubled at each try unanswered), or when the stream elects a leader
// (told, or found by checkLeaders, which counts the read among the waits it looks at: a try of
// two ticks or more), is made again. A read is
// idempotent, and one that a server took and lost with itself (the stream's leader, or the
// replica a direct get went to), or that reached the cluster while the stream had no leader, is
// answered by nobody: it waited out its timeout, the write timeout (seen in
// TestLeaderElectionInAClusterIssuesLostWritesAgain, a dequeue's payload read unanswered for its
// minute).
func (w *ackWatch) read(ctx context.Context, try time.Duration, get func(context.Context) error) error {
	for {
		lost := w.current()
		rctx, cancel := context.WithTimeoutCause(ctx, try, errReadUnanswered)
		stop := context.AfterFunc(lost, cancel)
		c := w.waiting.Load()
		c.n.Add(1)
		err := get(rctx)
		c.n.Add(-1)
		stop()
		unanswered := errors.Is(context.Cause(rctx), errReadUnanswered)
		again := err != nil && ctx.Err() == nil && (lost.Err() != nil || unanswered)
		cancel()
		if !again {
			return err
		}
		if unanswered {
			try *= 2 // a server slow to answer is not asked ever more often
		}
	}
}

// errReadUnanswered ends a try of a read that got no answer within its time (ackWatch.read).
var errReadUnanswered = errors.New("no answer to the read in time: asking again")

// readAgain makes get, a read of w's stream, as ackWatch.read does, bounded by the write timeout as
// well as by ctx: the payload reads of a dequeue, and the reads that settle a write's conflict.
func (b *Broker) readAgain(ctx context.Context, w *ackWatch, get func(context.Context) error) error {
	ctx, cancel := context.WithTimeout(ctx, b.cfg.WriteTimeout)
	defer cancel()
	return w.read(ctx, b.tick(), get)
}

// tick is how often checkLeaders looks at the writes waiting, and how long a try of a read waits
// before it is made again: a second, or a quarter of the write timeout if less, but at least
// 100 ms.
func (b *Broker) tick() time.Duration {
	return min(time.Second, max(b.cfg.WriteTimeout/4, 100*time.Millisecond))
}

// sameElection bounds the time between a leader's election (its leader_since) and its advisory,
// both by its server's clock.
const sameElection = 2 * time.Second

// told ends the waits, with why, for the election of leader that an advisory sent at at
// announced, unless a check found that election first and ended them then (a new leader answers
// for its stream a moment before it sends its advisory), or the same advisory came before. It
// reports whether it ended them. An advisory without a leader's name (forged, or garbled) ends
// them all the same, and leaves the leader known as it was.
func (w *ackWatch) told(leader string, at time.Time, why error) bool {
	w.mu.Lock()
	defer w.mu.Unlock()
	switch {
	case leader == "":
	case leader == w.found.Name && !w.found.Since.IsZero() && !at.Before(w.found.Since) && at.Sub(w.found.Since) < sameElection:
		return false
	case leader == w.leader.Name && !w.toldAt.IsZero() && at.Equal(w.toldAt):
		return false
	default:
		if leader != w.leader.Name {
			w.before = w.leader.Name
		}
		w.leader, w.toldAt = kv.Leader{Name: leader}, at
	}
	w.found = kv.Leader{}
	w.end(why)
	return true
}

// asked takes now, the stream's leader as a check found it, asked after the waits had been ended
// ends times, and ends the waits, with why, if it is another than the last known: an election
// the watch was not told of. It reports whether it ended them. The first leader known is learnt
// without ending anything. It takes nothing from an answer that may be older than what the watch
// knows: one without a leader's name (the stream has none yet); one asked before an advisory came
// or the waits were ended otherwise; one of a leader elected before the last known (an old leader
// still answers for its stream until it finds it has lost its peers), by their leader_since, or
// by the advisory's time less sameElection; and, where no leader_since tells (nats-server 2.11),
// one naming the leader known before the last.
func (w *ackWatch) asked(now kv.Leader, ends uint64, why error) bool {
	w.mu.Lock()
	defer w.mu.Unlock()
	was, toldAt := w.leader, w.toldAt
	timed := !now.Since.IsZero() && !was.Since.IsZero()
	switch {
	case now.Name == "" || ends != w.ends:
		return false
	case timed && now.Since.Before(was.Since):
		return false
	case was.Since.IsZero() && !toldAt.IsZero() && !now.Since.IsZero() && now.Since.Before(toldAt.Add(-sameElection)):
		return false
	case !timed && now.Name != was.Name && now.Name == w.before:
		return false
	}
	var other bool
	switch {
	case was.Name == "":
	case timed:
		other = now.Name != was.Name || !now.Since.Equal(was.Since)
	case !toldAt.IsZero() && !now.Since.IsZero():
		other = now.Name != was.Name || now.Since.After(toldAt)
	default: // no times to compare (outside a cluster, nats-server 2.11): the names
		other = now.Name != was.Name
	}
	if now.Name != was.Name {
		w.before = was.Name
	}
	w.leader, w.toldAt = now, time.Time{}
	if other {
		w.found = now
		w.end(why)
	}
	return other
}

// longWaits reports whether a write has waited since before the previous tick, and starts a new
// tick. Only checkLeaders calls it. A tick's count is dropped once it is zero at a tick, so a
// wait that took its count a tick or more before adding itself to it, paused that long between two
// instructions, is not seen.
func (w *ackWatch) longWaits() bool {
	long, kept := false, w.older[:0]
	for _, c := range w.older {
		if c.n.Load() > 0 {
			long, kept = true, append(kept, c)
		}
	}
	kept = append(kept, w.waiting.Swap(&waiters{}))
	w.older = kept
	return long
}

// unknown reports whether no leader of the stream is known yet.
func (w *ackWatch) unknown() bool {
	w.mu.Lock()
	defer w.mu.Unlock()
	return w.leader.Name == ""
}

// generation returns how often the waits were ended.
func (w *ackWatch) generation() uint64 {
	w.mu.Lock()
	defer w.mu.Unlock()
	return w.ends
}

// checkLeaders asks each watch's stream who leads it every tick (a second, or a quarter of the
// write timeout if less, but at least 100 ms) until it knows, and then whenever a write of the
// watch has waited a tick or more, and ends that watch's waits when the leader is another than
// last known: an election whose advisory did not come. While writes are answered it asks nothing.
// It returns when the broker stops (b.ctx); the ticks are real time, as the write timeout is.
func (b *Broker) checkLeaders(watches ...*ackWatch) {
	every := b.tick()
	ask := func(w *ackWatch, within time.Duration) {
		ends := w.generation()
		ctx, cancel := context.WithTimeout(b.ctx, within)
		now, err := b.store.StreamLeader(ctx, w.stream)
		cancel()
		if err == nil && w.asked(now, ends, fmt.Errorf("%w: stream %s has another leader", errAcksLost, w.stream)) {
			b.log.Info("a stream of the store has another leader, whose election was not announced to the broker: writes waiting for its acknowledgements are issued again", "stream", w.stream, "leader", now.Name)
		}
	}
	for _, w := range watches {
		ask(w, every)
	}
	t := time.NewTicker(every)
	defer t.Stop()
	for {
		select {
		case <-b.ctx.Done():
			return
		case <-t.C:
		}
		for _, w := range watches {
			if long := w.longWaits(); long || w.unknown() {
				ask(w, every)
			}
		}
	}
}

// electionIssues bounds how often one write is issued again because its stream elected a leader
// without that counting a try: elections come seconds apart, and more of them while one write
// waits means a stream that cannot keep a leader (or forged advisories, which only the broker's
// JetStream may publish: docs/security.md).
const electionIssues = 10

// reissue tells whether a write whose outcome a failure left unknown is issued again without
// counting a try, as neither failure says storage is slow:
//   - its wait was ended by its stream's election (errAcksLost), up to elections times;
//   - no server took it (kv.ErrNoLeader: its stream has no leader, as while its replicas elect
//     one), so nothing was stored; it is issued again once the stream's election is announced, or
//     after a pause that doubles from 10 ms to half a second, for at most the write timeout from
//     its first refusal.
type reissue struct {
	elections int           // how many more elections may be free
	pause     time.Duration // the last pause for a leader
	until     time.Time     // the first refusal for want of a leader, plus the write timeout
}

// free reports whether the write that failed with err is issued again without counting a try,
// having waited for a leader when it found none (w is its stream's watch); ctx ending (the
// request gave up, or the broker stops) ends the wait, and nothing more is free.
func (r *reissue) free(ctx context.Context, b *Broker, w *ackWatch, err error) bool {
	switch {
	case ctx.Err() != nil:
		return false
	case errors.Is(err, errAcksLost):
		r.elections--
		return r.elections >= 0
	case !errors.Is(err, kv.ErrNoLeader):
		return false
	}
	if r.until.IsZero() {
		r.until = time.Now().Add(b.cfg.WriteTimeout)
	}
	if !time.Now().Before(r.until) {
		return false
	}
	r.pause = min(max(2*r.pause, 10*time.Millisecond), 500*time.Millisecond)
	select {
	case <-w.current().Done():
	case <-time.After(r.pause):
	case <-ctx.Done():
		return false
	}
	return true
}
