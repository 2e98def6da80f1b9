package broker

import (
	"context"
	"errors"
	"fmt"
	"sync"

	"github.com/nats-io/nats.go"
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
type ackWatch struct {
	mu     sync.Mutex
	ctx    context.Context
	cancel context.CancelCauseFunc
}

func newAckWatch() *ackWatch {
	w := &ackWatch{}
	w.ctx, w.cancel = context.WithCancelCause(context.Background())
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
	w.cancel(why)
	w.ctx, w.cancel = context.WithCancelCause(context.Background())
}

// errAcksLost is the cause of the waits ackWatch ends: an unknown outcome, as a timeout is, but
// no sign that storage is slow to answer, so the write is issued again without counting a try.
var errAcksLost = errors.New("storage may have dropped the acknowledgement")

// leaderElected is the subject of JetStream's advisory that stream elected a leader.
func leaderElected(stream string) string {
	return "$JS.EVENT.ADVISORY.STREAM.LEADER_ELECTED." + stream
}

// watchAcks ends the waits of the message writes in flight whenever the messages stream elects a
// leader, and those of the lock writes whenever the locks stream does, until the broker stops
// (b.ctx), which waits for it. A subscription the server refuses is logged, and the writes then
// wait out the write timeout, as they did before.
func (b *Broker) watchAcks(messages, locks string) {
	var subs []*nats.Subscription
	for stream, w := range map[string]*ackWatch{messages: b.msgAcks, locks: b.lockAcks} {
		sub, err := b.cfg.Conn.Subscribe(leaderElected(stream), func(*nats.Msg) {
			b.log.Info("a stream of the store elected a leader: writes waiting for its acknowledgements are issued again", "stream", stream)
			w.ended(fmt.Errorf("%w: stream %s elected a leader", errAcksLost, stream))
		})
		if err != nil {
			b.log.Warn("not told of storage's leader elections: writes in flight then wait out the write timeout", "stream", stream, "error", err)
			continue
		}
		subs = append(subs, sub)
	}
	b.wg.Add(1)
	go func() {
		defer b.wg.Done()
		<-b.ctx.Done()
		for _, sub := range subs {
			_ = sub.Unsubscribe()
		}
	}()
}
