package broker

import (
	"strings"
	"sync/atomic"
	"time"

	"github.com/nats-io/nats.go"

	"github.com/natstone/natstone/subjects"
)

// refusedLogEvery bounds how often refused requests are logged: a client that sends them in a loop
// must not fill the log.
const refusedLogEvery = 10 * time.Second

// A requester names the subject its reply goes to, and NATS checks its right to publish the request
// only, never the reply subject. The broker may publish to its own storage, so an answer sent
// wherever a request says would let a client with the right to read a queue write anywhere the
// broker can: a record, a lock, the claim, an event, an enqueue. replyRefusal says why a request
// with reply subject reply must not be run, or "" when it may:
//   - a reply subject under "$" (the JetStream and KV APIs and their storage subjects, the
//     system's, service discovery's: no client's inbox);
//   - under the broker's own request subjects, or the store's payloads' or events' (the store's
//     only subjects outside "$");
//   - with a wildcard token, which names no inbox;
//   - none, for a dequeue: what it leased would go to nobody and run nowhere until its lease ran out.
//
// Every other request without a reply subject is a publish its sender does not wait on: it is run,
// and a settle's next leases nothing (nextFor).
func (b *Broker) replyRefusal(op subjects.Op, reply string) string {
	switch {
	case reply == "":
		if op == subjects.OpDequeue {
			return "a dequeue without a reply subject: what it leased would reach nobody"
		}
		return ""
	case reply[0] == '$':
		return "the reply subject is a system subject ($…)"
	case strings.HasPrefix(reply, b.space.Prefix()+"."):
		return "the reply subject is one of natstone's request subjects"
	case strings.HasPrefix(reply, b.storePrefix+".body.") || strings.HasPrefix(reply, b.storePrefix+".events."):
		return "the reply subject is one of natstone's storage subjects"
	case strings.ContainsAny(reply, "*>") && hasWildcard(reply):
		return "the reply subject has a wildcard"
	}
	return ""
}

// nextFor is a settle's next, or nil when the settle has no reply subject to send what it leased to.
func nextFor(req *nats.Msg, next *subjects.DequeueRequest) *subjects.DequeueRequest {
	if req.Reply == "" {
		return nil
	}
	return next
}

// hasWildcard reports whether subject has a token that is a wildcard.
func hasWildcard(subject string) bool {
	for tok := range strings.SplitSeq(subject, ".") {
		if tok == "*" || tok == ">" {
			return true
		}
	}
	return false
}

// refused counts and logs requests left unanswered: one not run for its reply subject
// (replyRefusal), where an answer would go where the request must not make the broker publish; or
// one a broker without its claim for its ttl leaves to the broker that may have taken over
// (Broker.unanswered).
type refused struct {
	count  atomic.Int64 // refused since the last log
	logged atomic.Int64 // when the last was logged, in Unix ns
}

// note counts one, and returns how many to log now, with those counted since the last log: 0 if
// the last log was less than refusedLogEvery ago.
func (r *refused) note() int64 {
	n := r.count.Add(1)
	now, last := time.Now().UnixNano(), r.logged.Load()
	if now-last < int64(refusedLogEvery) || !r.logged.CompareAndSwap(last, now) {
		return 0
	}
	r.count.Add(-n)
	return n
}

// refuse records a request refused for why: in its endpoint's statistics and the metrics as a
// bad_request (ep is nil for service discovery's), and in the log at most once every
// refusedLogEvery, with how many were refused since.
func (b *Broker) refuse(ep *endpoint, subject, reply, why string) {
	if ep != nil {
		failed := &subjects.Error{Code: subjects.CodeBadRequest, Message: why}
		ep.record(0, failed)
		b.observer.Request(ep.op, failed.Code, 0)
	}
	if n := b.refused.note(); n > 0 {
		b.log.Warn("request refused and not answered, for its reply subject", "subject", subject, "reply", reply, "why", why, "refused", n)
	}
}

// unanswered leaves a request unanswered, neither run nor refused: this broker has not renewed its
// claim for its ttl (claimer.silent), so another may have taken the store over and answer the same
// request, all brokers' subscriptions receiving every request. Logged at most once every
// refusedLogEvery, with how many since.
func (b *Broker) unanswered(subject string) {
	if n := b.silenced.note(); n > 0 {
		b.log.Warn("request not answered: this broker has not renewed its claim on the store for its ttl, and another may serve it", "subject", subject, "unanswered", n)
	}
}
