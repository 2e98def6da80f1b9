package broker

import (
	"context"
	"fmt"
	"sync"
	"sync/atomic"
	"time"

	"github.com/natstone/natstone/kv"
	"github.com/natstone/natstone/subjects"
)

// maxBufferedEvents bounds the events waiting to be published. Beyond it new events are dropped
// (and counted) rather than holding up the queues: the events stream is a record, not the truth.
const maxBufferedEvents = 1 << 16

// maxEventBatch bounds the events published together (all in flight at once).
const maxEventBatch = 4096

// eventLinger is how long the publisher lets a batch gather before it publishes it, unless the
// batch fills up first or someone waits for the events (history, FlushEvents, Stop). Under a steady
// load, fewer and larger batches cost the server much less: one acknowledgement, and one wakeup, per
// batch rather than per handful of events.
const eventLinger = 20 * time.Millisecond

// eventPublishTries is how often a batch whose acknowledgement did not come is published at least
// before its events are dropped; a running broker publishes it again, after a pause
// (eventRetryPause doubling up to eventRetryPauseMax), until the broker's write timeout has passed
// since the first try. A stream's leader election, when a server of a cluster is killed, takes a
// second or two, and the writes it refuses meanwhile are issued again like the records' (design.md,
// "Writes"). A closing publisher gives a batch eventPublishTries, and once one is dropped so, drops
// the rest without a try (refusedAtClose).
const (
	eventPublishTries  = 3
	eventRetryPause    = 50 * time.Millisecond
	eventRetryPauseMax = time.Second
)

// pendingEvent is a transition waiting to be published: what the queue knew when it happened. It is
// turned into JSON by the publisher, off the queue's lock.
type pendingEvent struct {
	queue  string
	kind   subjects.EventKind
	reason string
	prev   subjects.State
	rec    kv.Record // the record after the transition (for collected: the last one)
	worker string    // a lease's: the dequeue's worker
	err    string    // a release's: why the attempt failed
	at     int64     // Unix ms
}

// publisher publishes the transitions of every queue to the events stream, in batches, from one
// goroutine: a queue only appends to its buffer under a short lock. Stop publishes what is buffered
// before the broker stops.
type publisher struct {
	store *kv.Events // nil when events are disabled
	b     *Broker

	linger time.Duration // eventLinger, or what a test sets
	enc    []byte        // the run goroutine's encoding buffer
	// refusedAtClose (the run goroutine's) is set when a closing publisher dropped a batch the
	// stream refused: the batches after it are dropped without a try, so that a stop spends the
	// tries of one batch on a refusing stream, not of every batch buffered.
	refusedAtClose bool

	mu       sync.Mutex
	buf      []pendingEvent
	spare    []pendingEvent // an empty array for buf to take when the run goroutine takes all of it
	emitted  uint64         // events ever appended to buf
	handled  uint64         // events of buf published or dropped, in order
	hurry    uint64         // publish without lingering until handled reaches it (someone waits)
	progress chan struct{}  // closed and replaced whenever handled grows
	wake     chan struct{}  // the buffer is no longer empty
	flush    chan struct{}  // stop lingering: the batch is full, or someone waits
	closing  bool
	done     chan struct{}
	closed   chan struct{} // closed when a close begins: refused batches are not waited out
	abort    chan struct{} // closed when a close gave up waiting: what is left is dropped
	aborted  sync.Once

	published atomic.Uint64
	dropped   atomic.Uint64
	refused   atomic.Uint64 // tries of a batch that failed
	lastWarn  atomic.Int64  // Unix ms of the last "events dropped" log

	waitingForClaim func() // tests': called as a batch begins to wait for the claim to hold
}

// newPublisher starts a publisher that lets batches gather for up to linger (eventLinger).
func newPublisher(b *Broker, store *kv.Events, linger time.Duration) *publisher {
	p := &publisher{
		store:    store,
		b:        b,
		linger:   linger,
		progress: make(chan struct{}),
		wake:     make(chan struct{}, 1),
		flush:    make(chan struct{}, 1),
		done:     make(chan struct{}),
		closed:   make(chan struct{}),
		abort:    make(chan struct{}),
	}
	if store == nil {
		close(p.done)
		return p
	}
	go p.run()
	return p
}

func (p *publisher) enabled() bool { return p != nil && p.store != nil }

// emit buffers one event. It never blocks: past maxBufferedEvents the event is dropped.
func (p *publisher) emit(e pendingEvent) {
	if !p.enabled() {
		return
	}
	p.mu.Lock()
	if p.closing || len(p.buf) >= maxBufferedEvents {
		// Not counted in emitted: handled counts the buffer's events in their order, and a sync
		// waiting for the events buffered before it must not count this one instead.
		p.mu.Unlock()
		p.drop(1, "buffer full")
		return
	}
	p.emitted++
	p.buf = append(p.buf, e)
	n := len(p.buf)
	p.mu.Unlock()
	if n == 1 {
		signal(p.wake)
	}
	if n == maxEventBatch {
		signal(p.flush)
	}
}

// signal wakes whoever waits on ch (buffered, of capacity 1) without blocking.
func signal(ch chan struct{}) {
	select {
	case ch <- struct{}{}:
	default:
	}
}

func (p *publisher) drop(n int, why string) {
	if n == 0 {
		return
	}
	p.dropped.Add(uint64(n))
	now := time.Now().UnixMilli()
	if last := p.lastWarn.Load(); now-last >= 10_000 && p.lastWarn.CompareAndSwap(last, now) {
		p.b.log.Warn("events dropped", "count", n, "why", why, "dropped_total", p.dropped.Load())
	}
}

// run publishes the buffer in batches until closed and drained. A batch is published when it is
// full, when someone waits for it, or after lingering p.linger, whichever comes first.
func (p *publisher) run() {
	defer close(p.done)
	linger := time.NewTimer(p.linger)
	linger.Stop()
	for {
		p.mu.Lock()
		n, closing, hurry := len(p.buf), p.closing, p.handled < p.hurry
		p.mu.Unlock()
		if n == 0 {
			if closing {
				return // everything is published
			}
			<-p.wake
			continue
		}
		if n < maxEventBatch && !closing && !hurry {
			linger.Reset(p.linger)
			select {
			case <-linger.C:
			case <-p.flush:
				linger.Stop()
			}
		}
		p.mu.Lock()
		batch := p.buf[:min(len(p.buf), maxEventBatch)]
		p.buf = p.buf[len(batch):]
		whole := len(p.buf) == 0
		if whole {
			// Let the next appends start at the front of the spare array, not keep extending this
			// one; this one is the spare once published.
			p.buf, p.spare = p.spare, nil
		}
		p.mu.Unlock()
		p.publish(batch)
		clear(batch) // let go of the events' strings
		p.mu.Lock()
		if whole && cap(batch) <= 2*maxEventBatch {
			p.spare = batch[:0] // not an array a burst grew: that one goes
		}
		p.handled += uint64(len(batch))
		close(p.progress)
		p.progress = make(chan struct{})
		p.mu.Unlock()
	}
}

// publish stores a batch with one acknowledgement (kv.Events.PublishBatch); a batch whose
// acknowledgement does not come is published again (eventPublishTries, eventRetryPause). The events are
// encoded into one buffer, reused from batch to batch.
func (p *publisher) publish(batch []pendingEvent) {
	if p.refusedAtClose {
		p.drop(len(batch), "broker stopping, its events stream refusing")
		return
	}
	subjs := make([]string, 0, len(batch))
	spans := make([][2]int, 0, len(batch)) // each event's bytes in buf
	buf := p.enc[:0]
	for i := range batch {
		e := &batch[i]
		ev := eventOf(e)
		start := len(buf)
		var err error
		if buf, err = subjects.AppendEvent(buf, &ev); err != nil { // cannot happen for these types
			p.b.log.Error("event not encoded", "error", err)
			buf = buf[:start]
			continue
		}
		subjs = append(subjs, p.store.Subject(e.queue, string(e.kind), e.rec.ID))
		spans = append(spans, [2]int{start, len(buf)})
	}
	p.enc = buf
	p.drop(len(batch)-len(spans), "not encoded")
	if len(spans) == 0 {
		return
	}
	datas := make([][]byte, len(spans)) // sliced only now: buf may have moved while it grew
	for i, sp := range spans {
		datas[i] = buf[sp[0]:sp[1]:sp[1]]
	}
	ctx := context.Background()
	var err error
	first, pause := time.Now(), eventRetryPause
	for try := 1; ; try++ {
		select {
		case <-p.abort: // a close gave up waiting: what is left is dropped at once
			p.drop(len(datas), "broker stopped")
			return
		default:
		}
		if !p.claimHeld() {
			p.drop(len(datas), "the broker lost its claim on the store: the broker that took it over may have published later events of these messages")
			return
		}
		if _, err = p.store.PublishBatch(subjs, datas).Wait(ctx); err == nil {
			p.published.Add(uint64(len(datas)))
			return
		}
		p.refused.Add(1)
		closing := false
		select {
		case <-p.closed:
			closing = true
		default:
		}
		// Waiting out an election is for a broker that goes on; a stopping one, whose stop waits
		// for the events and then still has a snapshot to write and its claim to release, gives
		// a batch its tries and no more.
		if try >= eventPublishTries && (closing || time.Since(first) >= p.b.cfg.WriteTimeout) {
			p.refusedAtClose = closing
			break
		}
		t := time.NewTimer(pause)
		select {
		case <-t.C:
		case <-p.abort:
			t.Stop()
			p.drop(len(datas), "broker stopped: "+err.Error())
			return
		case <-p.closed: // a close began: no more waiting out an election (above)
		}
		pause = min(2*pause, eventRetryPauseMax)
	}
	// Republishing the whole batch may store some events twice; history drops the duplicates.
	p.drop(len(datas), "stream refused: "+err.Error())
}

// claimHeld waits until the broker's claim holds, and reports whether it does; false once the
// claim ended (lost, released) or a close gave up waiting. Events are published under the claim
// only: a broker frozen past its claim (SIGSTOP) that goes on must not store the events it had
// buffered after those the broker that took the store over stored since, of the same messages
// (history reads a message's life from its last enqueued event: one stored so late made a
// completed message's history end at its enqueue). While the claim is not renewed in time
// (storage slow), the events wait for the renewal.
func (p *publisher) claimHeld() bool {
	if p.b.claim.held() {
		return true
	}
	if p.waitingForClaim != nil {
		p.waitingForClaim()
	}
	ctx, cancel := context.WithCancel(context.Background())
	defer cancel()
	stop := make(chan struct{})
	defer close(stop)
	go func() {
		select {
		case <-p.abort:
			cancel()
		case <-stop:
		}
	}()
	return p.b.claim.waitHeld(ctx) == nil
}

// sync waits until every event buffered before it was called is published or dropped.
func (p *publisher) sync(ctx context.Context) error {
	if !p.enabled() {
		return nil
	}
	p.mu.Lock()
	target := p.emitted
	if p.handled < target {
		p.hurry = max(p.hurry, target)
		signal(p.flush)
	}
	for p.handled < target {
		ch := p.progress
		p.mu.Unlock()
		select {
		case <-ch:
		case <-p.done:
			return nil
		case <-ctx.Done():
			return ctx.Err()
		}
		p.mu.Lock()
	}
	p.mu.Unlock()
	return nil
}

// close publishes what is buffered and stops the publisher; events emitted later are dropped.
func (p *publisher) close(ctx context.Context) error {
	if !p.enabled() {
		return nil
	}
	p.mu.Lock()
	if !p.closing {
		close(p.closed)
	}
	p.closing = true
	p.mu.Unlock()
	signal(p.wake)
	signal(p.flush)
	select {
	case <-p.done:
		return nil
	case <-ctx.Done():
		p.mu.Lock()
		n := p.emitted - p.handled // buffered, or in a batch in flight
		p.mu.Unlock()
		p.aborted.Do(func() { close(p.abort) })
		if n == 0 {
			return nil // every event was published (or counted dropped) already
		}
		return fmt.Errorf("events not all published: %d dropped or unconfirmed: %w", n, ctx.Err())
	}
}

func (p *publisher) snapshot() EventsSnapshot {
	if !p.enabled() {
		return EventsSnapshot{}
	}
	p.mu.Lock()
	n := len(p.buf)
	p.mu.Unlock()
	return EventsSnapshot{Enabled: true, Published: p.published.Load(), Dropped: p.dropped.Load(), Buffered: n}
}

// eventOf builds the wire form of an event.
func eventOf(e *pendingEvent) subjects.Event {
	r := &e.rec
	ev := subjects.Event{
		Queue:       e.queue,
		ID:          r.ID,
		Kind:        e.kind,
		State:       r.State,
		PrevState:   e.prev,
		Reason:      e.reason,
		Version:     r.Version,
		Attempts:    r.Attempts,
		MaxAttempts: r.MaxAttempts,
		Priority:    r.Priority,
		LeaseID:     r.LeaseID,
		At:          time.UnixMilli(e.at).UTC(),
	}
	switch e.kind {
	case subjects.EventEnqueued:
		ev.Metadata = r.Metadata
		ev.PayloadSize = r.PayloadSize
	case subjects.EventLeased:
		ev.RequestID = r.RequestID
		ev.Worker = e.worker
	case subjects.EventReleased, subjects.EventErrored, subjects.EventCanceled:
		ev.Error = e.err
	case subjects.EventCollected:
		ev.State = ""
		ev.PrevState = r.State
		ev.Version = r.Version + 1
		ev.LeaseID = ""
	}
	if r.State == subjects.StateRunning && e.kind != subjects.EventCollected {
		t := time.UnixMilli(r.LeaseExpires).UTC()
		ev.LeaseExpiresAt = &t
	}
	if r.State == subjects.StateInvisible {
		t := time.UnixMilli(r.VisibleAt).UTC()
		ev.VisibleAt = &t
	}
	return ev
}

// eventKind names the transition of a stored write from prev (the state before; "" for a create)
// to next, with the reason of an errored one.
func eventKind(created bool, prev subjects.State, next *kv.Record) (subjects.EventKind, string) {
	if created {
		return subjects.EventEnqueued, ""
	}
	if prev.Terminal() && !next.State.Terminal() {
		return subjects.EventRetried, ""
	}
	switch next.State {
	case subjects.StateCompleted:
		return subjects.EventCompleted, ""
	case subjects.StateCanceled:
		return subjects.EventCanceled, ""
	case subjects.StateErrored:
		if next.Released {
			return subjects.EventErrored, subjects.ReasonReleased
		}
		return subjects.EventErrored, subjects.ReasonLeaseExpired
	case subjects.StateRunning:
		if prev == subjects.StateRunning {
			return subjects.EventExtended, ""
		}
		return subjects.EventLeased, ""
	case subjects.StateInvisible:
		return subjects.EventReleased, "" // a release with a delay (a reschedule's event is named by its change)
	case subjects.StatePending:
		switch {
		case prev == subjects.StateInvisible:
			return subjects.EventPending, ""
		case next.Released:
			return subjects.EventReleased, ""
		default:
			return subjects.EventExpired, ""
		}
	}
	return "", ""
}
