package broker

import (
	"context"
	"crypto/rand"
	"encoding/base64"
	"errors"
	"strings"
	"sync"
	"time"

	"github.com/nats-io/nats.go"

	"github.com/natstone/natstone/subjects"
)

// A reply that leases messages can reach nobody: its requester's connection closed (a worker
// killed while its long poll was parked), or it unsubscribed its inbox when its request timed out
// (as the nats CLI does). Its messages would then run nowhere until their leases ran out, each with
// an attempt spent: on a queue of one attempt, errored without ever running. So such a reply is
// published as a request of the broker's own, to an inbox of the broker's: when no subscriber takes
// it, the server says so there at once (NATS's "no responders" status, as it does to any request),
// and the reply's leases are given back with their attempts refunded, as an abandon would.
//
// The server answers a publish that reached nobody before it reads what the broker sent next, so
// once a round trip to the server (a flush) has come back, a reply sent before it that has not been
// answered was taken: it is forgotten. A requester whose connection lives on after its request timed
// out, with its inbox still subscribed (nats.go's and nats.js's requests share one inbox
// subscription per connection), takes the reply and does not read it; for those, abandon.
//
// A lease can go out in more than one reply: a dequeue retried with its request id gets the leases
// of the first again (replay). Such a lease is marked (replayedFlag) and never given back: the
// retry's reply may have reached its requester while the first's did not. The mark and the give
// back's check are under the queue's lock, so that one of the two sees the other.
//
// A reply to a subject the server made for another account (a service import's "_R_.", a gateway's
// "_GR_.") is not tracked: the server takes it on the requester's behalf whether or not anybody
// listens, and keeps state for each reply that asks for an answer in return.

// unheardFlushEvery is how often the replies sent are checked with a flush, while there are any.
const unheardFlushEvery = 250 * time.Millisecond

// unheardBuffer bounds the statuses waiting to be read. One the buffer cannot take is dropped by
// the client (a slow consumer), and its leases then run out as before.
const unheardBuffer = 4096

// heardLease is a lease a reply carried.
type heardLease struct{ id, leaseID string }

// sentReply is a reply that carried leases, until it is known to have been taken.
type sentReply struct {
	n      uint64 // the how-manyth published; 0 until it is (a flush before then proves nothing)
	queue  string
	leases []heardLease
}

// unheard tracks the replies sent with leases, to give back those of any that reached nobody.
type unheard struct {
	b      *Broker
	prefix string // the broker's inbox for the statuses, with a trailing "."
	status chan *nats.Msg

	mu   sync.Mutex
	last uint64               // the last sentReply.n given
	sent map[string]sentReply // by the reply subject's last token, 128 random bits: only the
	// requester, which sees the subject, could forge a status for it (and give back its own leases)
	swept    func() // a test's: called after each flush's forgetting,
	hearing  func() // as a status for a tracked reply is read, before its leases are given back,
	gaveBack func() // and once they are
}

// listen subscribes the inbox the server answers unheard replies on, and starts checking them.
func (b *Broker) listen() (*nats.Subscription, error) {
	u := &unheard{
		b:      b,
		prefix: b.cfg.Conn.NewInbox() + ".",
		status: make(chan *nats.Msg, unheardBuffer),
		sent:   make(map[string]sentReply),
	}
	sub, err := b.cfg.Conn.ChanSubscribe(u.prefix+"*", u.status)
	if err != nil {
		return nil, err
	}
	b.unheard = u
	b.wg.Add(1) // a Stop, or a start that fails, waits for it after ending b.ctx
	go func() {
		defer b.wg.Done()
		u.run(b.ctx)
	}()
	return sub, nil
}

// replyTo returns the subject that reply, the answer to req, is to be published with to hear
// whether it reached anybody, when it carries leases; else "". Once the reply is published, published
// says so (or gives its leases back, if it could not be).
func (u *unheard) replyTo(req *nats.Msg, reply any) string {
	var ms []subjects.Message
	switch r := reply.(type) {
	case subjects.DequeueReply:
		ms = r.Messages
	case subjects.SettleReply:
		if r.Next != nil {
			ms = r.Next.Messages
		}
	}
	if len(ms) == 0 || strings.HasPrefix(req.Reply, "_R_.") || strings.HasPrefix(req.Reply, "_GR_.") {
		return ""
	}
	leases := make([]heardLease, len(ms))
	for i := range ms {
		leases[i] = heardLease{id: ms[i].ID, leaseID: ms[i].LeaseID}
	}
	var random [16]byte
	_, _ = rand.Read(random[:]) // never fails (crypto/rand)
	token := base64.RawURLEncoding.EncodeToString(random[:])
	u.mu.Lock()
	u.sent[token] = sentReply{queue: ms[0].Queue, leases: leases}
	u.mu.Unlock()
	return u.prefix + token
}

// published records that the reply with reply subject replyTo gave was published, or, with a
// failure, was not: its leases then reach nobody, and are given back.
func (u *unheard) published(replyTo string, failed error) {
	token := strings.TrimPrefix(replyTo, u.prefix)
	u.mu.Lock()
	r, ok := u.sent[token]
	if ok && failed == nil {
		u.last++
		r.n = u.last
		u.sent[token] = r
	} else if ok {
		delete(u.sent, token)
	}
	u.mu.Unlock()
	if ok && failed != nil {
		u.giveBackLater(r)
	}
}

// run reads the statuses of replies that reached nobody, and forgets, after each flush, the replies
// sent before it that were taken. It ends with ctx.
func (u *unheard) run(ctx context.Context) {
	tick := time.NewTicker(unheardFlushEvery)
	defer tick.Stop()
	for {
		select {
		case <-ctx.Done():
			return
		case m := <-u.status:
			u.heard(m)
		case <-tick.C:
			u.mu.Lock()
			mark, idle := u.last, len(u.sent) == 0
			u.mu.Unlock()
			if idle {
				continue
			}
			fctx, cancel := context.WithTimeout(ctx, u.b.cfg.WriteTimeout)
			err := u.b.cfg.Conn.FlushWithContext(fctx)
			cancel()
			if err != nil {
				continue // tried again at the next tick; the replies are kept meanwhile
			}
			// Every status for a reply before the flush is in the channel now: the client reads
			// them before the flush's answer.
			for len(u.status) > 0 {
				u.heard(<-u.status)
			}
			u.mu.Lock()
			for token, r := range u.sent {
				if r.n != 0 && r.n <= mark {
					delete(u.sent, token)
				}
			}
			swept := u.swept
			u.mu.Unlock()
			if swept != nil {
				swept()
			}
		}
	}
}

// heard handles a status from the server: a reply that reached nobody has its leases given back.
func (u *unheard) heard(m *nats.Msg) {
	if m.Header.Get("Status") != "503" {
		return
	}
	token := strings.TrimPrefix(m.Subject, u.prefix)
	u.mu.Lock()
	r, ok := u.sent[token]
	delete(u.sent, token)
	hook := u.hearing
	u.mu.Unlock()
	if ok && hook != nil {
		hook()
	}
	if ok {
		u.giveBackLater(r)
	}
}

// giveBackLater gives r's leases back on a goroutine of its own: it waits on storage.
func (u *unheard) giveBackLater(r sentReply) {
	u.mu.Lock()
	hook := u.gaveBack
	u.mu.Unlock()
	u.b.giveBackLater(r, givingUnheard, hook)
}

// giveBackLater gives r's leases back (giveBack) on a goroutine of its own, then calls done (if
// not nil).
func (b *Broker) giveBackLater(r sentReply, how giving, done func()) {
	if !b.track() {
		return
	}
	go func() {
		defer b.wg.Done()
		if n := b.giveBack(r, how); n > 0 {
			b.log.Info(how.line(), "queue", r.queue, "released", n)
		}
		if done != nil {
			done()
		}
	}()
}

// giving says why a release gives a lease back that its holder did not release: none (a holder's
// own release), a reply that reached nobody, or a lease that no reply carried.
type giving int

const (
	notGiving giving = iota
	// givingUnheard gives back the leases of a reply that reached nobody: its requester never had
	// them, and its dequeue's request id is marked given back (dequeueRecord.givenBack).
	givingUnheard
	// givingUnanswered gives back a lease its dequeue's reply went without, its write's outcome
	// unknown then: the reply, which may have reached its requester, carried the dequeue's other
	// leases, which its request id keeps for a retry.
	givingUnanswered
)

// why is the error of the released events of the leases given back so.
func (g giving) why() string {
	if g == givingUnanswered {
		return "the dequeue answered before storage took this lease: no reply carried it"
	}
	return "the dequeue's reply reached nobody: its requester was gone"
}

// line is what is logged of the leases given back so.
func (g giving) line() string {
	if g == givingUnanswered {
		return "leases a dequeue's reply went without given back once stored"
	}
	return "a dequeue's reply reached nobody: its leases given back"
}

// giveBack releases r's leases, their attempts refunded, where they are still held, each
// released event saying why (how), and returns how many it released: the leases of a reply that
// reached nobody, or those a dequeue's reply went without.
func (b *Broker) giveBack(r sentReply, how giving) int {
	if !b.claim.held() {
		return 0 // another broker may serve the store: its leases are its own
	}
	ctx, cancel := context.WithTimeout(b.ctx, requestTimeout)
	defer cancel()
	q, err := b.lookup(ctx, r.queue, false)
	if err != nil {
		return 0 // deleted since: its messages went with it
	}
	released := 0
	for _, l := range r.leases {
		_, err := q.releaseUnlessReplayed(ctx, subjects.ReleaseRequest{ID: l.id, LeaseID: l.leaseID, Refund: true, Error: how.why()}, how)
		switch {
		case err == nil:
			released++
		case errors.Is(err, errLeaseKept): // sent again in a retry's reply, which may have reached its requester
		case noLongerHeld(err):
		default:
			q.log().Warn("lease not given back; it runs out instead", "id", l.id, "why", how.why(), "error", err)
		}
	}
	return released
}
