package workers

import (
	"context"
	"errors"
	"sync"

	"github.com/nats-io/nats.go"
)

// ErrPollCut is in the error of a long poll given a RequestID that was cut before its reply came:
// the broker it waited at may be gone, its reply never to come. Either its connection reconnected
// (a natstone killed with its embedded NATS server takes the poll with it), or a broker announced
// that it began to serve the store (subjects.Space.Serving: the one before it died or froze while
// its NATS server stayed up). Its outcome is unknown, and the error matches nats.ErrTimeout too:
// send the dequeue again at once with the same RequestID, which gets whatever the first leased,
// also from the broker the first may still be parked at. A Worker does.
var ErrPollCut = errors.New("natstone: long poll cut")

// pollCut is why a long poll was cut; it matches ErrPollCut.
type pollCut string

func (p pollCut) Error() string        { return "long poll cut: " + string(p) }
func (p pollCut) Is(target error) bool { return target == ErrPollCut }

// Why a long poll was cut.
const (
	errReconnected   = pollCut("the connection to NATS was lost and made again while it waited")
	errBrokerServing = pollCut("a broker began to serve while it waited, the one it waited at gone")
)

// untilGone returns ctx, cut when the broker a long poll waits at may be gone, and a stop to call
// once the request is over. A long poll waits up to its wait and the client's timeout for its reply
// (30 s by default for a worker's), and one parked at a broker that is gone gets none. The context
// is cut with errReconnected when the client's connection (re)connects: a natstone killed with its
// embedded NATS server takes the poll with it, and the connection comes back to a new one that
// never heard of it. It is cut with errBrokerServing when a broker announces that it serves the
// store: one killed, or frozen past its claim, while its NATS server stays up, has been replaced,
// by a restart or a standby. Cut, the poll is sent again at once, to the broker serving now.
func (c *Client) untilGone(ctx context.Context) (context.Context, func()) {
	cctx, cancel := context.WithCancelCause(ctx)
	ch := c.nc.StatusChanged(nats.CONNECTED) // a reconnect (or the first connect of a connection made with RetryOnFailedConnect)
	serving := c.servingNext()
	done := make(chan struct{})
	go func() {
		select {
		case _, ok := <-ch:
			if ok {
				cancel(errReconnected)
			}
		case <-serving:
			cancel(errBrokerServing)
		case <-done:
		case <-cctx.Done():
		}
	}()
	return cctx, func() {
		close(done)
		c.nc.RemoveStatusListener(ch)
		cancel(nil)
	}
}

// servingWatch follows the brokers' announcements, on one connection under one prefix, that they
// serve the store, for every Client there: one subscription, made by the first long poll that needs
// it.
type servingWatch struct {
	sub *nats.Subscription // set before the watch is shared: invalid once its connection closed
	mu  sync.Mutex         // guards ch
	ch  chan struct{}      // closed at the next announcement
}

// servingKey is a connection and the subject of its Clients' announcements.
type servingKey struct {
	nc      *nats.Conn
	subject string
}

// watches are the connections' servingWatches, each kept until a new one is added after its
// subscription ended (its connection closed).
var (
	watchesMu sync.Mutex
	watches   = map[servingKey]*servingWatch{}
)

// servingNext returns a channel closed at the next announcement of a broker that it serves c's
// store, subscribing to them first if c's connection has not yet: on the poll's connection, so the
// server has the subscription before the poll. It returns nil, never closed, when c ignores the
// announcements (Config.IgnoreAnnouncements), or when the subscription is refused (a closed or
// draining connection): the poll then waits as it would without them. (One the server refuses, to
// a NATS user not allowed the subject, reaches the connection's error handler at each connect.)
func (c *Client) servingNext() <-chan struct{} {
	if c.ignoreAnnouncements {
		return nil
	}
	key := servingKey{c.nc, c.space.Serving()}
	if w := watched(key); w != nil {
		return w.next()
	}
	// Nothing of nats.go that takes a connection's lock is called with watchesMu held: that lock
	// may be held for as long as a reconnect's handshake takes, and would hold every Client of the
	// process. (A subscription's own lock, which IsValid takes, is held only for moments.)
	w := &servingWatch{ch: make(chan struct{})}
	sub, err := c.nc.Subscribe(key.subject, w.announced)
	if err != nil {
		return nil
	}
	w.sub = sub
	watchesMu.Lock()
	for k, o := range watches {
		if !o.sub.IsValid() { // its connection closed (a program that makes many)
			delete(watches, k)
		}
	}
	first := watches[key] // another poll's, made meanwhile
	if first == nil {
		watches[key] = w
	}
	watchesMu.Unlock()
	if first != nil {
		_ = sub.Unsubscribe()
		return first.next()
	}
	return w.next()
}

// watched returns the watch of key, or nil.
func watched(key servingKey) *servingWatch {
	watchesMu.Lock()
	defer watchesMu.Unlock()
	return watches[key]
}

func (w *servingWatch) next() <-chan struct{} {
	w.mu.Lock()
	defer w.mu.Unlock()
	return w.ch
}

// announced takes an announcement: every poll waiting on the channel is told, and the next ones
// wait on a new one.
func (w *servingWatch) announced(*nats.Msg) {
	w.mu.Lock()
	defer w.mu.Unlock()
	close(w.ch)
	w.ch = make(chan struct{})
}
