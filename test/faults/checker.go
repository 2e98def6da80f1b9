package faults

import (
	"cmp"
	"fmt"
	"maps"
	"slices"
	"strings"
	"time"
)

// Slack absorbs the broker's millisecond timestamps and scheduling between the broker deciding and
// the client reading its clock (both on one machine's wall clock).
const clockSlack = 5 * time.Millisecond

// freeSlack bounds how late the broker may act on a deadline it owns (a lease expiry timer, the
// value's release after a lease ends) under load. Only the EDF rule uses it, to stay sound: a value
// is freed after an acknowledged write (the lease's end), an fsync in the sync-always variant, in a
// race-detector build sharing two cores with three other variants. It was set when a second write,
// the lock's, followed; it is kept, more generous than needed.
const freeSlack = time.Second

// Violation is one broken rule, with the evidence.
type Violation struct {
	Rule   string
	Detail string
}

func (v Violation) String() string { return v.Rule + ": " + v.Detail }

// Restart is one kill of natstone and the moment it served again.
type Restart struct {
	Killed time.Time
	Ready  time.Time
	// Settle is how long after Ready the broker may still be learning the outcome of a write that
	// was in flight across the restart, holding its message (and the message's exclusivity value)
	// as it was until then: 0 when the broker itself restarted (the new one reads storage); when a
	// NATS server did and the write's acknowledgement was lost with it, about the time of the
	// write's three issues, each waiting out the broker's write timeout (the harness's bound).
	Settle time.Duration
}

// across reports whether something that lasted from start to end was cut short by r: it was
// under way when the broker was killed; or, for a server's restart (Settle), at any moment of the
// restart, since what the broker writes while a server is down may lose its acknowledgement too.
func (r Restart) across(start, end time.Time) bool {
	if r.Settle > 0 {
		return !start.After(r.Ready) && !end.Before(r.Killed)
	}
	return !r.Killed.Before(start) && !r.Killed.After(end)
}

// Run is everything the checker judges.
type Run struct {
	Ops      []Op
	Queues   map[string]QueueSpec
	Restarts []Restart
	Final    map[string]Final // by queue + "/" + message id
	// Failed are the writes storage did not take, as the broker logged them.
	Failed []WriteFailure
}

// WriteFailure is a write of a queue's message or exclusivity lock that storage did not take, or
// whose outcome the broker did not know, when the broker logged it: a lock not taken, a record
// changed or gone, outcomes unknown. A dequeue one of whose picks failed so answers with the
// others, fewer than its batch. MessageID names the (first) message, Count how many failed (a line
// of unknown outcomes counts them all, naming the first).
type WriteFailure struct {
	Queue     string
	MessageID string
	Count     int
	At        time.Time
}

// lease is one lease granted, with what the history proves about how long it lasted.
type lease struct {
	Lease
	queue   string
	request string // the request id of the dequeue that took it
	// certainEnd: the lease was certainly valid in [GrantedAt, certainEnd): nothing acknowledged or
	// possibly applied ended it earlier.
	certainEnd time.Time
	// possibleEnd: its message or exclusivity value may have been held until then (unknown extends,
	// a late timer, a kill delaying the release to the next start).
	possibleEnd time.Time
}

type msgKey struct{ queue, id string }

// Check judges a run and returns every violation found.
func Check(run Run) []Violation {
	c := &checker{run: run, leases: map[string]*lease{}}
	c.collectLeases()
	c.checkDoubleLeases()
	c.checkExclusivity()
	c.checkStaleOps()
	c.checkAttempts()
	c.checkRefunds()
	c.checkInvisible()
	c.checkLost()
	c.checkIdempotentDequeues()
	c.checkEDF()
	return c.out
}

type checker struct {
	run    Run
	leases map[string]*lease // by lease id
	out    []Violation
}

// MostSharing returns the most leases of distinct messages of one exclusivity value of queue that
// were certainly valid at once, at a grant: what shows that a queue whose max_running_per_value is
// above 1 ran that many (checkExclusivity fails a run above it).
func MostSharing(run Run, queue string) int {
	c := &checker{run: run, leases: map[string]*lease{}}
	c.collectLeases()
	most := 0
	for _, g := range c.sortedLeases(func(l *lease) string { return l.queue + "/" + l.Value }) {
		if len(g) == 0 || g[0].queue != queue {
			continue
		}
		var valid []*lease
		for _, l := range g {
			valid = slices.DeleteFunc(valid, func(o *lease) bool { return !l.GrantedAt.Before(o.certainEnd.Add(-clockSlack)) })
			ids := map[string]bool{l.MessageID: true}
			for _, o := range valid {
				ids[o.MessageID] = true
			}
			most = max(most, len(ids))
			valid = append(valid, l)
		}
	}
	return most
}

func (c *checker) fail(rule, format string, args ...any) {
	c.out = append(c.out, Violation{Rule: rule, Detail: fmt.Sprintf(format, args...)})
}

// collectLeases gathers every lease some acknowledged dequeue returned and bounds its life.
func (c *checker) collectLeases() {
	for _, op := range c.run.Ops {
		if op.Kind != Dequeue || op.Outcome != OK {
			continue
		}
		for _, l := range op.Leases {
			if c.leases[l.LeaseID] == nil {
				c.leases[l.LeaseID] = &lease{Lease: l, queue: op.Queue, request: op.RequestID, certainEnd: l.ExpiresAt, possibleEnd: l.ExpiresAt}
			}
		}
	}
	for _, op := range c.run.Ops {
		l := c.leases[op.LeaseID]
		if l == nil || op.LeaseID == "" {
			continue
		}
		if op.Kind != Extend {
			continue
		}
		if op.Outcome == OK && op.ExpiresAt.After(l.certainEnd) {
			l.certainEnd = op.ExpiresAt
		}
		if op.Outcome != Failed && op.RequestedExpiry.After(l.possibleEnd) {
			l.possibleEnd = op.RequestedExpiry
		}
		if op.Outcome == OK && op.ExpiresAt.After(l.possibleEnd) {
			l.possibleEnd = op.ExpiresAt
		}
	}
	byMsg := map[msgKey][]*lease{}
	for _, l := range c.leases {
		k := msgKey{l.queue, l.MessageID}
		byMsg[k] = append(byMsg[k], l)
	}
	byRequest := c.leasesByRequest()
	end := func(l *lease, op Op) {
		if op.Outcome != Failed && op.Start.Before(l.certainEnd) {
			l.certainEnd = op.Start // it may have ended as soon as this was sent
		}
		if op.Outcome == OK && op.End.Before(l.possibleEnd) && l.GrantedAt.Before(op.Start) {
			l.possibleEnd = op.End // it had certainly ended when the reply came
		}
	}
	for _, op := range c.run.Ops {
		switch {
		case op.Kind == Abandon:
			// The leases of the dequeue it abandons end, as at a release.
			for _, l := range byRequest[op.Queue+"/"+op.RequestID] {
				end(l, op)
			}
		case op.Kind != Complete && op.Kind != Release && op.Kind != Cancel:
		case op.LeaseID != "":
			if l := c.leases[op.LeaseID]; l != nil {
				end(l, op)
			}
		case op.Kind == Cancel:
			// An operator's cancel (no lease id) ends whichever lease the message had when it landed.
			for _, l := range byMsg[msgKey{op.Queue, op.MessageID}] {
				if l.GrantedAt.Before(op.End) {
					end(l, op)
				}
			}
		}
	}
	// A kill while a lease may still hold its message or value delays the release to the next start;
	// a server's restart, until the broker has learned what became of the writes it cut short.
	for _, l := range c.leases {
		l.possibleEnd = l.possibleEnd.Add(freeSlack)
		for _, r := range c.run.Restarts {
			if r.across(l.GrantedAt, l.possibleEnd) && r.Ready.Add(r.Settle+freeSlack).After(l.possibleEnd) {
				l.possibleEnd = r.Ready.Add(r.Settle + freeSlack)
			}
		}
	}
}

func (c *checker) sortedLeases(key func(*lease) string) map[string][]*lease {
	groups := map[string][]*lease{}
	for _, l := range c.leases {
		k := key(l)
		groups[k] = append(groups[k], l)
	}
	for _, g := range groups {
		// Grant times have the broker's millisecond: leases granted in one millisecond come in
		// the order in which none overlaps another if one does (the earlier certain end first),
		// and otherwise by lease id, so that a run checks the same every time.
		slices.SortFunc(g, func(a, b *lease) int {
			return cmp.Or(a.GrantedAt.Compare(b.GrantedAt), a.certainEnd.Compare(b.certainEnd), cmp.Compare(a.LeaseID, b.LeaseID))
		})
	}
	return groups
}

// leasesByMessage groups the leases by "queue/message id", each group by grant time.
func (c *checker) leasesByMessage() map[string][]*lease {
	return c.sortedLeases(func(l *lease) string { return l.queue + "/" + l.MessageID })
}

// leasesByRequest groups the leases by "queue/request id" of the dequeue that took them, each group
// by grant time; those of dequeues without a request id are in the group of "".
func (c *checker) leasesByRequest() map[string][]*lease {
	return c.sortedLeases(func(l *lease) string {
		if l.request == "" {
			return ""
		}
		return l.queue + "/" + l.request
	})
}

// operated returns the messages an operator's cancel or retry may have reached.
func (c *checker) operated() map[msgKey]bool {
	out := map[msgKey]bool{}
	for _, op := range c.run.Ops {
		if (op.Kind == Cancel || op.Kind == Retry) && op.Outcome != Failed {
			out[msgKey{op.Queue, op.MessageID}] = true
		}
	}
	return out
}

// inKeyOrder returns the groups in the order of their keys, leaving out the group of "", so that
// violations come in the same order every time.
func inKeyOrder(groups map[string][]*lease) [][]*lease {
	out := make([][]*lease, 0, len(groups))
	for _, k := range slices.Sorted(maps.Keys(groups)) {
		if k != "" {
			out = append(out, groups[k])
		}
	}
	return out
}

// checkDoubleLeases: no message is granted a lease while another of its leases is certainly valid.
func (c *checker) checkDoubleLeases() {
	for _, g := range inKeyOrder(c.leasesByMessage()) {
		var open *lease // the lease certainly valid the longest so far
		for _, l := range g {
			if open != nil && l.GrantedAt.Before(open.certainEnd.Add(-clockSlack)) {
				c.fail("double-lease", "%s/%s: lease %s granted at %s while lease %s was valid until %s",
					l.queue, l.MessageID, l.LeaseID, ts(l.GrantedAt), open.LeaseID, ts(open.certainEnd))
			}
			if open == nil || l.certainEnd.After(open.certainEnd) {
				open = l
			}
		}
	}
}

// checkExclusivity: in an exclusive queue no lease on a value is granted while leases on as many
// other messages of that value as its max_running_per_value (1 unless said) are certainly valid.
// A message's own earlier lease (the double-lease rule's business) is not counted.
func (c *checker) checkExclusivity() {
	groups := c.sortedLeases(func(l *lease) string {
		if !c.run.Queues[l.queue].Exclusive {
			return ""
		}
		return l.queue + "/" + l.Value
	})
	for _, g := range inKeyOrder(groups) {
		var valid []*lease // the leases granted so far that may still be certainly valid
		for _, l := range g {
			per := max(c.run.Queues[l.queue].PerValue, 1)
			valid = slices.DeleteFunc(valid, func(o *lease) bool { return !l.GrantedAt.Before(o.certainEnd.Add(-clockSlack)) })
			holders := map[string]*lease{}
			for _, o := range valid {
				if o.MessageID != l.MessageID && (holders[o.MessageID] == nil || o.certainEnd.After(holders[o.MessageID].certainEnd)) {
					holders[o.MessageID] = o
				}
			}
			if len(holders) >= per {
				var held []string
				for _, id := range slices.Sorted(maps.Keys(holders)) {
					held = append(held, fmt.Sprintf("%s until %s", id, ts(holders[id].certainEnd)))
				}
				c.fail("exclusivity", "%s value %q: %s leased at %s while %d held it (max_running_per_value %d): %s",
					l.queue, l.Value, l.MessageID, ts(l.GrantedAt), len(holders), per, strings.Join(held, ", "))
			}
			valid = append(valid, l)
		}
	}
}

// checkStaleOps: once a newer lease of a message was granted, every operation with an older lease
// of it sent afterwards must have been rejected.
func (c *checker) checkStaleOps() {
	byMsg := c.leasesByMessage()
	for _, op := range c.run.Ops {
		if op.Outcome != OK || op.LeaseID == "" || (op.Kind != Complete && op.Kind != Extend && op.Kind != Release && op.Kind != Cancel) {
			continue
		}
		l := c.leases[op.LeaseID]
		if l == nil {
			continue
		}
		for _, newer := range byMsg[l.queue+"/"+l.MessageID] {
			if newer.GrantedAt.After(l.GrantedAt) && op.Start.After(newer.GrantedAt.Add(clockSlack)) {
				c.fail("stale-holder", "%s/%s: %s with lease %s sent at %s succeeded after lease %s was granted at %s",
					op.Queue, op.MessageID, op.Kind, op.LeaseID, ts(op.Start), newer.LeaseID, ts(newer.GrantedAt))
				break
			}
		}
	}
}

// checkAttempts: no lease beyond the queue's attempts, and a message out of attempts ends errored.
func (c *checker) checkAttempts() {
	for _, l := range c.leases {
		if max := c.run.Queues[l.queue].MaxAttempts; l.Attempts > max {
			c.fail("attempts", "%s/%s leased for attempt %d of %d", l.queue, l.MessageID, l.Attempts, max)
		}
	}
	for _, key := range slices.Sorted(maps.Keys(c.run.Final)) { // violations in the same order every time
		f := c.run.Final[key]
		queue, _, _ := cut(key)
		max := c.run.Queues[queue].MaxAttempts
		if f.Found && f.Attempts > max {
			c.fail("attempts", "%s ended with %d attempts of %d", key, f.Attempts, max)
		}
		if f.Found && f.Attempts >= max && (f.State == "pending" || f.State == "invisible") {
			c.fail("attempts", "%s is %s with no attempts left; it must be errored", key, f.State)
		}
	}
}

// checkRefunds: the lease after an acknowledged release with refund is of the same attempt as the
// refunded one: the attempt was given back. Messages an operator canceled or retried are left out
// (a retry starts the attempts anew), and so is a refund followed by a dequeue of unknown outcome
// on its queue before the next lease: that dequeue may have leased the message, spending an
// attempt the history does not show (its lease then ran out).
func (c *checker) checkRefunds() {
	operated := c.operated()
	var unknown []Op // dequeues of unknown outcome
	for _, op := range c.run.Ops {
		if op.Kind == Dequeue && op.Outcome == Unknown {
			unknown = append(unknown, op)
		}
	}
	unseenLease := func(queue string, from, to time.Time) bool {
		return slices.ContainsFunc(unknown, func(d Op) bool {
			return d.Queue == queue && d.Start.Before(to) && d.End.Add(freeSlack).After(from)
		})
	}
	byMsg, byRequest := c.leasesByMessage(), c.leasesByRequest()
	type refund struct {
		op Op
		l  *lease
	}
	var refunds []refund
	for _, op := range c.run.Ops {
		switch {
		case op.Outcome != OK:
		case op.Kind == Release && op.Refund && !operated[msgKey{op.Queue, op.MessageID}]:
			if l := c.leases[op.LeaseID]; l != nil {
				refunds = append(refunds, refund{op, l})
			}
		case op.Kind == Abandon:
			// What an abandon gave back was given back with its attempt.
			for _, l := range byRequest[op.Queue+"/"+op.RequestID] {
				if slices.Contains(op.Released, l.MessageID) && !operated[msgKey{op.Queue, l.MessageID}] {
					refunds = append(refunds, refund{op, l})
				}
			}
		}
	}
	for _, r := range refunds {
		op, l := r.op, r.l
		for _, next := range byMsg[l.queue+"/"+l.MessageID] {
			if next.GrantedAt.Equal(l.GrantedAt) && next.LeaseID != l.LeaseID {
				// Granted in the same millisecond (the grant times' resolution): which came first
				// is not known, so neither is which is the next. Not judged.
				break
			}
			if next.GrantedAt.After(l.GrantedAt) && next.LeaseID != l.LeaseID {
				if next.Attempts != l.Attempts && !unseenLease(op.Queue, op.Start, next.GrantedAt) {
					c.fail("refund", "%s/%s: lease %s refunded by its %s at %s (attempt %d), yet the next lease %s is attempt %d",
						op.Queue, l.MessageID, l.LeaseID, op.Kind, ts(op.End), l.Attempts, next.LeaseID, next.Attempts)
				}
				break
			}
		}
	}
}

// checkInvisible: a message that an acknowledged reschedule made invisible for a delay is not
// leased before the delay is over, counted from when the reschedule was sent. Only leases granted
// after the reschedule's reply are judged (an earlier one may have come before it, its lease since
// run out), and messages an operator canceled or retried are left out (a retry makes a message
// pending at once).
func (c *checker) checkInvisible() {
	operated := c.operated()
	byMsg := c.leasesByMessage()
	for _, op := range c.run.Ops {
		if op.Kind != Reschedule || op.Delay <= 0 || op.Outcome != OK || operated[msgKey{op.Queue, op.MessageID}] {
			continue
		}
		visible := op.Start.Add(op.Delay)
		for _, l := range byMsg[op.Queue+"/"+op.MessageID] {
			if !l.GrantedAt.Before(op.End) && l.GrantedAt.Before(visible.Add(-clockSlack)) {
				c.fail("invisible", "%s/%s: rescheduled at %s to be invisible for %s, yet lease %s was granted at %s",
					op.Queue, op.MessageID, ts(op.Start), op.Delay, l.LeaseID, ts(l.GrantedAt))
				break
			}
		}
	}
}

// checkLost: every acknowledged enqueue is still there at the end, and acknowledged completes and
// cancels stuck (a cancel until a retry that may have landed after it). In a queue that keeps
// nothing that ended (Collected), a message may instead be gone if a complete or cancel of it may
// have taken effect.
func (c *checker) checkLost() {
	mayHaveEnded := map[string]bool{}
	lastEnqueue := map[string]time.Time{} // when the last enqueue of each message that may have happened ended
	lastRetry := map[string]time.Time{}   // when the last retry of each message that may have happened ended
	lastCancel := map[string]time.Time{}  // when the last cancel of each message that may have happened ended
	for _, op := range c.run.Ops {
		key := op.Queue + "/" + op.MessageID
		if (op.Kind == Complete || op.Kind == Cancel) && op.Outcome != Failed {
			mayHaveEnded[key] = true
		}
		if op.Kind == Enqueue && op.Outcome != Failed && op.End.After(lastEnqueue[key]) {
			lastEnqueue[key] = op.End
		}
		if op.Kind == Retry && op.Outcome != Failed && op.End.After(lastRetry[key]) {
			lastRetry[key] = op.End
		}
		if op.Kind == Cancel && op.Outcome != Failed && op.End.After(lastCancel[key]) {
			lastCancel[key] = op.End
		}
	}
	// In a queue that keeps nothing that ended, an id is free again once its message is collected
	// (docs/protocol.md, enqueue), so a retried enqueue that lands after a complete or a cancel
	// enqueues the message anew: what it ended in no longer says anything about that complete.
	reEnqueued := func(op Op) bool {
		return c.run.Queues[op.Queue].Collected && lastEnqueue[op.Queue+"/"+op.MessageID].After(op.Start)
	}
	for _, op := range c.run.Ops {
		if op.Outcome != OK {
			continue
		}
		key := op.Queue + "/" + op.MessageID
		f, read := c.run.Final[key]
		collected := read && !f.Found && c.run.Queues[op.Queue].Collected && mayHaveEnded[key]
		switch op.Kind {
		case Enqueue:
			if (!read || !f.Found) && !collected {
				c.fail("lost", "%s: enqueue acknowledged at %s, gone at the end", key, ts(op.End))
			}
		case Complete:
			if read && f.State != "completed" && !collected && !reEnqueued(op) {
				c.fail("lost", "%s: complete acknowledged at %s, but it ended %s", key, ts(op.End), f.State)
			}
		case Cancel:
			if read && f.State != "canceled" && !collected && !reEnqueued(op) && !lastRetry[key].After(op.Start) {
				c.fail("lost", "%s: cancel acknowledged at %s, but it ended %s", key, ts(op.End), f.State)
			}
		case Retry:
			// Only a cancel can end a retried message canceled again.
			if read && f.State == "canceled" && !lastCancel[key].After(op.Start) {
				c.fail("lost", "%s: retry acknowledged at %s, but it ended canceled", key, ts(op.End))
			}
		}
	}
}

// checkIdempotentDequeues: retries of a dequeue (same request id) never lease more than the first
// acknowledged reply did.
func (c *checker) checkIdempotentDequeues() {
	type req struct {
		first map[string]bool
		batch int
	}
	seen := map[string]*req{}
	for _, op := range c.run.Ops {
		if op.Kind != Dequeue || op.Outcome != OK || op.RequestID == "" {
			continue
		}
		key := op.Queue + "/" + op.RequestID
		ids := map[string]bool{}
		for _, l := range op.Leases {
			ids[l.LeaseID] = true
		}
		if len(ids) > op.Batch {
			c.fail("idempotent-dequeue", "%s returned %d leases for a batch of %d", key, len(ids), op.Batch)
		}
		r := seen[key]
		if r == nil {
			seen[key] = &req{first: ids, batch: op.Batch}
			continue
		}
		for _, id := range slices.Sorted(maps.Keys(ids)) {
			if !r.first[id] {
				c.fail("idempotent-dequeue", "%s: a retry returned lease %s that the first reply did not have", key, id)
			}
		}
	}
}

// checkEDF: a dequeue never returned a message (or fewer than its batch, unless storage failed a
// write of the queue meanwhile) while a strictly more urgent eligible message had been pending
// since before the request: enqueued and acknowledged before it (or rescheduled to a new
// priority, then acknowledged pending at it), never leased, canceled, rescheduled or invisible by
// then, matching its filter, and — in an exclusive queue — of a value certainly free throughout
// the request. Stretches where a dequeue of unknown outcome may have leased that message are
// skipped, as is everything it cannot prove.
func (c *checker) checkEDF() {
	type cand struct {
		id       string
		queue    string
		prio     int64
		md       map[string]string
		enqStart time.Time
		added    time.Time // acknowledged: pending from here
		removed  time.Time // first lease grant or cancel sent: maybe not pending from here
	}
	cands := map[msgKey]*cand{}
	for _, op := range c.run.Ops {
		if op.Kind == Enqueue && op.Outcome == OK && op.InvisibleMS == 0 {
			k := msgKey{op.Queue, op.MessageID}
			if cands[k] == nil {
				cands[k] = &cand{id: op.MessageID, queue: op.Queue, prio: op.Priority, md: op.Metadata, enqStart: op.Start, added: op.End, removed: farFuture}
			}
		}
	}
	// An id enqueued more than once (a retry) counts from its first attempt: drop the ambiguous.
	for _, op := range c.run.Ops {
		if op.Kind == Enqueue && op.Outcome != Failed {
			if cd := cands[msgKey{op.Queue, op.MessageID}]; cd != nil && op.Start.Before(cd.enqStart) {
				cd.enqStart = op.Start
			}
		}
	}
	for _, l := range c.leases {
		if cd := cands[msgKey{l.queue, l.MessageID}]; cd != nil && l.GrantedAt.Before(cd.removed) {
			cd.removed = l.GrantedAt
		}
	}
	// A cancel takes a message out, and so does a reschedule, from its request on. An acknowledged
	// reschedule to a new priority alone, whose reply said pending, puts it back from the reply on:
	// a candidate of its own, at the new priority, until its next lease, cancel or reschedule.
	metadata := map[msgKey]map[string]string{}
	for _, op := range c.run.Ops {
		if op.Kind == Enqueue && op.Outcome == OK {
			metadata[msgKey{op.Queue, op.MessageID}] = op.Metadata
		}
	}
	var rescheduled []*cand
	takenOut := map[msgKey][]time.Time{} // when each cancel or reschedule that may have landed was sent
	for _, op := range c.run.Ops {
		k := msgKey{op.Queue, op.MessageID}
		if (op.Kind == Cancel || op.Kind == Reschedule) && op.Outcome != Failed {
			takenOut[k] = append(takenOut[k], op.Start)
			if cd := cands[k]; cd != nil && op.Start.Before(cd.removed) {
				cd.removed = op.Start
			}
		}
		if op.Kind == Reschedule && op.Outcome == OK && op.Delay == 0 && op.State == "pending" && metadata[k] != nil {
			rescheduled = append(rescheduled, &cand{id: op.MessageID, queue: op.Queue, prio: op.Priority, md: metadata[k],
				enqStart: op.Start, added: op.End, removed: farFuture})
		}
	}
	leasesOf := c.leasesByMessage()
	for _, cd := range rescheduled {
		for _, l := range leasesOf[cd.queue+"/"+cd.id] {
			if l.GrantedAt.After(cd.enqStart) && l.GrantedAt.Before(cd.removed) {
				cd.removed = l.GrantedAt
			}
		}
		for _, t := range takenOut[msgKey{cd.queue, cd.id}] {
			if t.After(cd.enqStart) && t.Before(cd.removed) {
				cd.removed = t
			}
		}
	}
	// Dequeues of unknown outcome may have leased any message pending while they ran; such a
	// message may then be unavailable until that lease ran out (or the next start after a kill).
	type window struct {
		from, to time.Time
		request  string // the dequeue's request id: its retries' own leases are no other dequeue's
	}
	unknown := map[string][]window{}
	// A retry of a dequeue (its request id again) may return the leases of an earlier try: that
	// try's request is when it was decided.
	sent := map[string]time.Time{}
	// When the first try of unknown outcome of each request id was sent: a try after it returns
	// only the leases that try took and still held, fewer than its batch once some ran out.
	unknownTry := map[string]time.Time{}
	for _, op := range c.run.Ops {
		if k := op.Queue + "/" + op.RequestID; op.Kind == Dequeue && op.RequestID != "" {
			if t, ok := sent[k]; !ok || op.Start.Before(t) {
				sent[k] = op.Start
			}
			if t, ok := unknownTry[k]; op.Outcome == Unknown && (!ok || op.Start.Before(t)) {
				unknownTry[k] = op.Start
			}
		}
	}
	for _, op := range c.run.Ops {
		if op.Kind == Dequeue && op.Outcome == Unknown {
			to := op.End.Add(c.run.Queues[op.Queue].Lease + freeSlack)
			for _, r := range c.run.Restarts {
				if r.across(op.Start, to) && r.Ready.Add(r.Settle+c.run.Queues[op.Queue].Lease+freeSlack).After(to) {
					to = r.Ready.Add(r.Settle + c.run.Queues[op.Queue].Lease + freeSlack)
				}
			}
			unknown[op.Queue] = append(unknown[op.Queue], window{op.Start.Add(-clockSlack), to, op.RequestID})
		}
	}
	byValue := c.sortedLeases(func(l *lease) string { return l.queue + "/" + l.Value })
	byQueue := map[string][]*cand{}
	for _, k := range slices.SortedFunc(maps.Keys(cands), func(a, b msgKey) int {
		return cmp.Or(strings.Compare(a.queue, b.queue), strings.Compare(a.id, b.id))
	}) {
		cd := cands[k]
		byQueue[cd.queue] = append(byQueue[cd.queue], cd)
	}
	for _, cd := range rescheduled {
		byQueue[cd.queue] = append(byQueue[cd.queue], cd)
	}
	for _, op := range c.run.Ops {
		if op.Kind != Dequeue || op.Outcome != OK || len(op.Leases) == 0 {
			continue
		}
		spec := c.run.Queues[op.Queue]
		granted := op.Leases[0].GrantedAt
		// When the dequeue that leased was sent: this one, or its first try (sent holds the ops
		// with a request id only).
		from := op.Start
		if t, ok := sent[op.Queue+"/"+op.RequestID]; ok && t.Before(from) {
			from = t
		}
		var worst int64
		values := map[string]int{} // how many messages of each value it leased
		returned := map[string]bool{}
		for _, l := range op.Leases {
			worst = max(worst, l.Priority)
			values[l.Value]++
			returned[l.MessageID] = true
		}
		full := len(op.Leases) >= op.Batch
		if t, ok := unknownTry[op.Queue+"/"+op.RequestID]; ok && op.RequestID != "" && t.Before(op.Start) && !full {
			// A retry returns the leases of that try it still holds: which of them ran out before
			// it (the more urgent, say) is unknown, so fewer than its batch proves nothing.
			continue
		}
		// A pick whose lock or lease storage did not take is left out of the reply: as many as
		// the broker logged failed writes of the queue meanwhile may be missing. The picks were
		// the most urgent eligible messages, so the rest still are: judged as a full batch, a
		// message more urgent than one it returned still fails it, unless it is one whose write
		// failed (it may have been the pick left out, or leased under a lease no reply carried).
		failed, nFailed := c.writesFailed(op.Queue, granted, op.End)
		if !full && len(op.Leases)+nFailed >= op.Batch {
			full = true
		}
		for _, cd := range byQueue[op.Queue] {
			if returned[cd.id] || failed[cd.id] || (full && cd.prio >= worst) {
				continue
			}
			// Pending since before the request, and still not leased or canceled when it was decided.
			if !cd.added.Before(from.Add(-clockSlack)) || !cd.removed.After(granted.Add(clockSlack)) {
				continue
			}
			if !matches(cd.md, op.Filter) {
				continue
			}
			skip := false
			for _, w := range unknown[op.Queue] {
				if (op.RequestID == "" || w.request != op.RequestID) && w.from.Before(granted.Add(clockSlack)) && w.to.After(from) && cd.enqStart.Before(w.to) {
					skip = true
					break
				}
			}
			if skip {
				continue
			}
			if spec.Exclusive {
				v := cd.md[spec.Key]
				// The batch's own messages of the value fill part of its room: the rest had to be
				// free of others' leases.
				room := max(spec.PerValue, 1) - values[v]
				if room <= 0 || !c.valueFree(byValue[op.Queue+"/"+v], from, granted, op.Leases, room) {
					continue
				}
			}
			what := fmt.Sprintf("the less urgent %s", worstID(op.Leases, worst))
			if !full {
				what = fmt.Sprintf("only %d of a batch of %d", len(op.Leases), op.Batch)
			}
			c.fail("edf", "%s: dequeue sent at %s by %s returned %s while %s (priority %d) had been pending since %s",
				op.Queue, ts(from), op.Client, what, cd.id, cd.prio, ts(cd.added))
		}
	}
}

// writesFailed returns the messages of the failed writes of queue the broker logged between from
// and to, and how many writes failed.
func (c *checker) writesFailed(queue string, from, to time.Time) (map[string]bool, int) {
	ids, n := map[string]bool{}, 0
	for _, f := range c.run.Failed {
		if f.Queue == queue && !f.At.Before(from.Add(-clockSlack)) && !f.At.After(to.Add(clockSlack)) {
			ids[f.MessageID] = true
			n += max(f.Count, 1)
		}
	}
	return ids, n
}

// valueFree reports whether, at every moment from the request to its decision, fewer leases than
// per (the queue's max_running_per_value) but the dequeue's own may have held the value.
func (c *checker) valueFree(leases []*lease, from, to time.Time, own []Lease, per int) bool {
	type edge struct {
		at time.Time
		d  int
	}
	var edges []edge
	lo, hi := from.Add(-clockSlack), to.Add(clockSlack)
	for _, l := range leases {
		if slices.ContainsFunc(own, func(o Lease) bool { return o.LeaseID == l.LeaseID }) {
			continue
		}
		if l.GrantedAt.Before(hi) && l.possibleEnd.After(lo) {
			if per <= 1 {
				return false
			}
			start, end := l.GrantedAt, l.possibleEnd
			if start.Before(lo) {
				start = lo
			}
			if end.After(hi) {
				end = hi
			}
			edges = append(edges, edge{start, 1}, edge{end, -1})
		}
	}
	// At a moment where one ends and another begins, both are counted.
	slices.SortFunc(edges, func(a, b edge) int { return cmp.Or(a.at.Compare(b.at), cmp.Compare(b.d, a.d)) })
	n := 0
	for _, e := range edges {
		if n += e.d; n >= per {
			return false
		}
	}
	return true
}

var farFuture = time.Unix(1<<40, 0)

func matches(md, filter map[string]string) bool {
	for k, v := range filter {
		if md[k] != v {
			return false
		}
	}
	return true
}

func worstID(ls []Lease, prio int64) string {
	for _, l := range ls {
		if l.Priority == prio {
			return fmt.Sprintf("%s (priority %d)", l.MessageID, prio)
		}
	}
	return "?"
}

func cut(key string) (queue, id string, ok bool) {
	for i := 0; i < len(key); i++ {
		if key[i] == '/' {
			return key[:i], key[i+1:], true
		}
	}
	return key, "", false
}

func ts(t time.Time) string { return t.UTC().Format("15:04:05.000") }
