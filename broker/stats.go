package broker

import (
	"cmp"
	"context"
	"encoding/json"
	"errors"
	"math"
	"slices"
	"strconv"
	"strings"
	"time"

	"github.com/natstone/natstone/broker/index"
	"github.com/natstone/natstone/kv"
	"github.com/natstone/natstone/subjects"
)

// transitioned counts one stored transition and hands it to the observer and the events stream.
// Called with q.mu held.
func (q *queue) transitioned(ev *pendingEvent) {
	kind, reason, at := ev.kind, ev.reason, ev.at
	t := &q.totals
	switch kind {
	case subjects.EventEnqueued:
		t.Enqueued++
		q.rates.add(at, rateEnqueued)
	case subjects.EventLeased:
		t.Dequeued++
		q.rates.add(at, rateDequeued)
		if w := q.b.waits; w != nil && ev.prev == subjects.StatePending {
			w.Waited(q.name, time.Duration(max(at-ev.rec.VisibleAt, 0))*time.Millisecond) // a pending record's visible_at is when it became pending
		}
	case subjects.EventCompleted:
		t.Completed++
		q.rates.add(at, rateCompleted)
	case subjects.EventCanceled:
		t.Canceled++
	case subjects.EventReleased:
		t.Released++
	case subjects.EventExpired:
		t.Expired++
	case subjects.EventErrored:
		t.Errored++
		q.rates.add(at, rateErrored)
		if reason == subjects.ReasonLeaseExpired {
			t.Expired++
		}
	case subjects.EventRetried:
		t.Retried++
	case subjects.EventRescheduled:
		t.Rescheduled++
	case subjects.EventCollected:
		t.Collected++
	}
	q.b.observer.Transition(q.name, kind, reason)
	ev.queue = q.name
	q.b.events.emit(*ev)
}

// The transitions rateWindow counts.
const (
	rateEnqueued = iota
	rateDequeued
	rateCompleted
	rateErrored
	numRates
)

// rateSeconds is the span of a rateWindow.
const rateSeconds = 60

// rateWindow counts transitions in one-second buckets over the last minute.
type rateWindow struct {
	start   int64 // Unix ms the window started counting (the queue's load)
	last    int64 // the Unix second of the newest bucket
	buckets [rateSeconds][numRates]uint32
}

// add counts one transition of kind at (Unix ms).
func (w *rateWindow) add(at int64, kind int) {
	sec := at / 1000
	w.advance(sec)
	if sec <= w.last-rateSeconds {
		return // older than the window (a clock step back)
	}
	w.buckets[sec%rateSeconds][kind]++
}

// advance moves the newest bucket to sec, clearing the buckets it passes.
func (w *rateWindow) advance(sec int64) {
	if sec <= w.last {
		return
	}
	if sec-w.last >= rateSeconds {
		w.buckets = [rateSeconds][numRates]uint32{}
	} else {
		for s := w.last + 1; s <= sec; s++ {
			w.buckets[s%rateSeconds] = [numRates]uint32{}
		}
	}
	w.last = sec
}

// rates returns transitions per second over the last minute, or over the time since counting
// started if that is shorter.
func (w *rateWindow) rates(now int64) subjects.Rates {
	w.advance(now / 1000)
	var sum [numRates]uint64
	for i := range w.buckets {
		for k := range numRates {
			sum[k] += uint64(w.buckets[i][k])
		}
	}
	span := float64(min(max(now-w.start, 1000), rateSeconds*1000)) / 1000
	per := func(k int) float64 { return float64(sum[k]) / span }
	return subjects.Rates{Enqueued: per(rateEnqueued), Dequeued: per(rateDequeued), Completed: per(rateCompleted), Errored: per(rateErrored)}
}

// waitingAges counts pending entries by the Unix second they became pending (their record's
// VisibleAt, which every write that makes a message pending sets, and a reschedule of its priority
// keeps), so the oldest pending age costs a look at the smallest key, not a walk of the queue.
type waitingAges struct {
	bySec  map[int64]int
	oldest int64 // the smallest key of bySec when valid
	valid  bool
}

func (w *waitingAges) add(at int64) {
	sec := at / 1000
	w.bySec[sec]++
	if w.valid && sec < w.oldest {
		w.oldest = sec
	}
}

func (w *waitingAges) remove(at int64) {
	sec := at / 1000
	if n := w.bySec[sec]; n > 1 {
		w.bySec[sec] = n - 1
		return
	}
	delete(w.bySec, sec)
	if sec == w.oldest {
		w.valid = false
	}
}

// since returns the Unix ms the oldest pending entry became pending, rounded down to its second;
// ok is false when nothing is pending.
func (w *waitingAges) since() (at int64, ok bool) {
	if len(w.bySec) == 0 {
		return 0, false
	}
	if !w.valid {
		first := true
		for sec := range w.bySec {
			if first || sec < w.oldest {
				w.oldest, first = sec, false
			}
		}
		w.valid = true
	}
	return w.oldest * 1000, true
}

// oldestPendingMS is how long the longest-waiting pending message has been pending (at second
// resolution), 0 when none is. Called with q.mu held.
func (q *queue) oldestPendingMS(now int64) int64 {
	at, ok := q.waiting.since()
	if !ok {
		return 0
	}
	return max(now-at, 0)
}

// stats answers the stats operation: the queue's current view.
func (q *queue) stats(r subjects.StatsRequest) (subjects.StatsReply, error) {
	if err := subjects.ValidateMetadata(r.Filter, subjects.MaxMetadataPairs); err != nil {
		return subjects.StatsReply{}, err
	}
	within := cmp.Or(r.ExpiringWithinMS, subjects.DefaultExpiringWithin.Milliseconds())
	if err := checkRange("expiring_within_ms", within, 1, subjects.MaxExpiringWithin); err != nil {
		return subjects.StatsReply{}, err
	}
	limit := cmp.Or(r.ExpiringLimit, subjects.DefaultExpiringLimit)
	if limit < 1 || limit > subjects.MaxExpiringLimit {
		return subjects.StatsReply{}, subjects.Errorf(subjects.CodeOutOfRange, "expiring_limit must be 1 to %d, got %d", subjects.MaxExpiringLimit, limit)
	}
	q.mu.Lock()
	defer q.mu.Unlock()
	if err := q.usable(); err != nil {
		return subjects.StatsReply{}, err
	}
	var matched subjects.Counts
	var oldest int64
	if len(r.Filter) > 0 {
		// First: the walk lets go of the lock between its steps, and the rest is of after it.
		var err error
		if matched, oldest, err = q.countMatching(r.Filter); err != nil {
			return subjects.StatsReply{}, err
		}
	}
	now := q.now()
	reply := subjects.StatsReply{
		Queue:    q.name,
		At:       time.UnixMilli(now).UTC(),
		Config:   q.cfg,
		Rates:    q.rates.rates(now),
		Totals:   q.totals,
		Expiring: []subjects.ExpiringLease{},
	}
	if len(r.Filter) == 0 {
		reply.Counts = q.countsLocked()
		reply.OldestPendingMS = q.oldestPendingMS(now)
	} else {
		reply.Counts = matched
		if oldest != 0 {
			reply.OldestPendingMS = max(now-oldest, 0)
		}
	}
	var due []*entry // the soonest leases ending within the window, up to limit
	q.leases.ascend(func(e *entry) bool {
		if q.leases.deadline(e) > now+within || len(due) == limit {
			return false
		}
		due = append(due, e)
		return true
	})
	for _, e := range due {
		reply.Expiring = append(reply.Expiring, subjects.ExpiringLease{
			ID:             e.ID,
			LeaseID:        e.extra().LeaseID,
			LeaseExpiresAt: time.UnixMilli(e.extra().LeaseExpires).UTC(),
			ExpiresInMS:    e.extra().LeaseExpires - now,
			Attempts:       int(e.Attempts),
			MaxAttempts:    int(e.MaxAttempts),
		})
	}
	return reply, nil
}

// browse answers the browse operation: up to r.Limit messages of one state, in that state's order.
func (q *queue) browse(r subjects.BrowseRequest) (subjects.BrowseReply, error) {
	if stateIndex(r.State) < 0 {
		return subjects.BrowseReply{}, subjects.Errorf(subjects.CodeBadRequest, "state must be one of invisible, pending, running, completed, canceled, errored; got %q", r.State)
	}
	if err := subjects.ValidateMetadata(r.Filter, subjects.MaxMetadataPairs); err != nil {
		return subjects.BrowseReply{}, err
	}
	limit := cmp.Or(r.Limit, subjects.DefaultBrowseLimit)
	if limit < 1 || limit > subjects.MaxBrowseLimit {
		return subjects.BrowseReply{}, subjects.Errorf(subjects.CodeOutOfRange, "limit must be 1 to %d, got %d", subjects.MaxBrowseLimit, limit)
	}
	after, err := parseCursor(r.After)
	if err != nil {
		return subjects.BrowseReply{}, err
	}
	q.mu.Lock()
	defer q.mu.Unlock()
	if err := q.usable(); err != nil {
		return subjects.BrowseReply{}, err
	}
	reply := subjects.BrowseReply{Queue: q.name, State: r.State, Messages: []subjects.Message{}}
	var found []*entry
	var key func(*entry) int64 // the order's first key; ties by Seq
	if r.State == subjects.StatePending {
		// The index holds the pending messages in EDF order; the filter is the dequeue's. A page
		// after the first starts after its cursor, found in O(log n).
		key = func(e *entry) int64 { return e.Priority }
		visit := func(e *entry) bool {
			found = append(found, e)
			return len(found) <= limit
		}
		if after.set {
			q.pending.AscendAfter(toFilter(r.Filter), &entry{Item: index.Item{Priority: after.key, Seq: after.seq}}, visit)
		} else {
			q.pending.Ascend(toFilter(r.Filter), visit)
		}
	} else {
		d := q.orderOf(r.State)
		key = d.key
		if found, err = q.page(d, r.State, r.Filter, after, limit+1); err != nil {
			return subjects.BrowseReply{}, err
		}
	}
	if len(found) > limit {
		found, reply.More = found[:limit], true
	}
	budget, size := q.b.replyBudget(), 0
	for i, e := range found {
		// No more than the server takes in one reply (max_payload): large metadata can fill it.
		if size += replyShare(q.name, e.ID, 0, e.extra().Metadata); size > budget && i > 0 {
			reply.More = true
			break
		}
		reply.Messages = append(reply.Messages, q.view(e))
	}
	if reply.More {
		last := found[len(reply.Messages)-1]
		reply.Next = cursor{key: key(last), seq: last.Seq, set: true}.String()
	}
	return reply, nil
}

// page returns up to n entries of state s, which d holds, whose metadata matches filter: the first
// after the cursor in d's order (deadline, then Seq). It reads the entries of s from the cursor on,
// found in O(log n), and no other state's.
//
// A filter few entries match can make it read every entry of s: a million finished messages take
// about a quarter of a second. So it lets go of q.mu every countStep entries read, for the requests
// waiting on it, as countMatching does, and goes on after the last entry it read. An entry that
// leaves s or enters it meanwhile may be missed or found; one that stays in s all along is found
// once, in its place. An error says the queue closed meanwhile. Called with q.mu held, which it
// releases and takes again.
func (q *queue) page(d *deadlines, s subjects.State, filter map[string]string, after cursor, n int) ([]*entry, error) {
	group := 0
	if d.group != nil {
		group = groupOfState(s)
	}
	type place struct {
		e   *entry
		key int64
	}
	var found []place
	var last struct { // the last entry read before a pause; its id is "" until there is one
		key int64
		seq uint64
		id  string
	}
	read, start := 0, after
	for {
		paused := false
		from, seq := int64(math.MinInt64), uint64(0)
		if start.set {
			from, seq = start.key, start.seq
		}
		d.from(group, from, seq, func(e *entry) bool {
			k := d.key(e)
			switch {
			case d.groupOf(e) != group:
				return false
			case !start.set || start.before(k, e.Seq):
			case last.id == "" || k != last.key || e.Seq != last.seq || e.ID <= last.id:
				return true // the cursor's, or read before the pause
			}
			if e.State() == s && matches(e.extra().Metadata, filter) {
				found = append(found, place{e, k})
			}
			if read++; read%countStep == 0 {
				last.key, last.seq, last.id, paused = k, e.Seq, e.ID, true
			}
			return len(found) < n && !paused
		})
		if !paused || len(found) == n {
			break
		}
		if err := q.letOthersIn(); err != nil {
			return nil, err
		}
		// What was found and has moved since (left s, or was collected, or ended anew at another
		// time) is no longer in its place on the page.
		found = slices.DeleteFunc(found, func(p place) bool {
			return p.e.State() != s || q.entries.get(p.e.ID) != p.e || d.key(p.e) != p.key
		})
		start = cursor{key: last.key, seq: last.seq, set: true}
	}
	out := make([]*entry, len(found))
	for i, p := range found {
		out[i] = p.e
	}
	return out, nil
}

// cursor is a place in a state's order (browse's after and next): the order's first key
// (priority, or the key of the state's deadline order: visible_at, lease end, ended_at) and the
// body sequence that breaks its ties.
type cursor struct {
	key int64
	seq uint64
	set bool // the zero cursor is before every message
}

func (c cursor) String() string {
	return strconv.FormatInt(c.key, 10) + ":" + strconv.FormatUint(c.seq, 10)
}

// before reports whether c comes before the message at (key, seq): the message is on a later page.
func (c cursor) before(key int64, seq uint64) bool {
	return !c.set || key > c.key || key == c.key && seq > c.seq
}

// parseCursor reads browse's after: empty for the first page, else a next a reply gave.
func parseCursor(s string) (cursor, error) {
	if s == "" {
		return cursor{}, nil
	}
	k, sq, ok := strings.Cut(s, ":")
	key, kerr := strconv.ParseInt(k, 10, 64)
	seq, serr := strconv.ParseUint(sq, 10, 64)
	c := cursor{key: key, seq: seq, set: true}
	if !ok || kerr != nil || serr != nil || c.String() != s { // as a next is written: no "+1", no "01"
		return cursor{}, subjects.Errorf(subjects.CodeBadRequest, "after %q is not a browse's next", s)
	}
	return c, nil
}

// orderOf returns the deadline order that holds the entries of state s (not pending).
func (q *queue) orderOf(s subjects.State) *deadlines {
	switch s {
	case subjects.StateInvisible:
		return &q.invisible
	case subjects.StateRunning:
		return &q.leases
	default:
		return &q.gc
	}
}

// history answers the history operation from the events stream.
func (b *Broker) history(ctx context.Context, queue string, r subjects.HistoryRequest) (subjects.HistoryReply, error) {
	if err := subjects.ValidateID(r.ID); err != nil {
		return subjects.HistoryReply{}, err
	}
	limit := cmp.Or(r.Limit, subjects.DefaultHistoryLimit)
	if limit < 1 || limit > subjects.MaxHistoryLimit {
		return subjects.HistoryReply{}, subjects.Errorf(subjects.CodeOutOfRange, "limit must be 1 to %d, got %d", subjects.MaxHistoryLimit, limit)
	}
	if !b.events.enabled() {
		return subjects.HistoryReply{}, subjects.Errorf(subjects.CodeUnavailable, "this broker runs without the events stream")
	}
	// Read what this broker has done so far: every transition before this request is in the stream.
	if err := b.events.sync(ctx); err != nil {
		return subjects.HistoryReply{}, unavailable("publish pending events", err)
	}
	// From the latest message's enqueued event (latestLife), and past limit: the first event left
	// out is when the last one given ended (state_ms), and copies of events (a batch of events
	// published twice) do not count.
	raw, more, err := b.events.store.Read(ctx, queue, r.ID, string(subjects.EventEnqueued), limit+historyCopies+1)
	if errors.Is(err, kv.ErrNotFound) {
		return subjects.HistoryReply{}, subjects.Errorf(subjects.CodeMessageNotFound, "no events of message %q in queue %s", r.ID, queue)
	}
	if err != nil {
		return subjects.HistoryReply{}, unavailable("read events", err)
	}
	events := make([]subjects.Event, 0, min(len(raw), limit))
	var after *subjects.Event // the first event left out, if one is
	type key struct {
		version uint64
		kind    subjects.EventKind
		at      int64
	}
	kept := make(map[key]bool, min(len(raw), limit))
	budget, size := b.replyBudget(), 0
	for _, data := range raw {
		var e subjects.Event
		if err := json.Unmarshal(data, &e); err != nil {
			b.log.Warn("undecodable event skipped", "queue", queue, "message_id", r.ID, "error", err)
			continue
		}
		k := key{e.Version, e.Kind, e.At.UnixNano()}
		if kept[k] {
			continue // a copy of an event kept
		}
		// No more than limit, and no more than the server takes in one reply (max_payload): an
		// event grows by about 100 bytes in it (its time in state).
		if size += len(data) + 128; len(events) == limit || size > budget && len(events) > 0 {
			more, after = true, &e
			break
		}
		kept[k] = true
		events = append(events, e)
	}
	reply := buildHistory(queue, r.ID, events, more, after, b.clock.Now())
	if n := len(reply.Events); n > 0 && reply.Events[n-1].Current && !b.holds(queue, r.ID, reply.Events[n-1].Version) {
		// The message left its queue without an event: its queue was deleted (a delete publishes
		// none). Its last state ended then, at a time no event gives.
		last := &reply.Events[n-1]
		reply.StateMS[last.State] -= last.StateMS
		last.StateMS, last.Current = 0, false
	}
	return reply, nil
}

// holds reports whether queue holds message id at version or later (a crash may lose the events
// of its last writes, and a recovery's fence moves its version without one), or a write of it is
// in flight, whose event is still to come: then its last event stays current.
func (b *Broker) holds(queue, id string, version uint64) bool {
	b.mu.Lock()
	q := b.queues[queue]
	b.mu.Unlock()
	if q == nil {
		return false
	}
	q.mu.Lock()
	defer q.mu.Unlock()
	if q.deleting {
		return false // its messages go with it (a broker stopping still holds them)
	}
	e := q.entries.get(id)
	return e != nil && (e.busy() || e.rev != 0 && e.Version() >= version)
}

// historyCopies is how many copies of events (a batch of events published twice) history reads
// past its limit, to find the first event left out.
const historyCopies = 16

// buildHistory orders events (in the stream's order) by version (an event published twice counts
// once) and works out the time spent in each state. An id can be enqueued again once its message
// was collected, and versions start again at 1: only the latest message's events are kept (see
// latestLife). When more events exist, after is the first of them, if it was read: the last
// event's time in its state ends there (without it, that time is not known, and is 0).
func buildHistory(queue, id string, events []subjects.Event, more bool, after *subjects.Event, now time.Time) subjects.HistoryReply {
	events = latestLife(events)
	slices.SortStableFunc(events, func(a, b subjects.Event) int { return cmp.Compare(a.Version, b.Version) })
	events = slices.CompactFunc(events, func(a, b subjects.Event) bool { return a.Version == b.Version && a.Kind == b.Kind })
	reply := subjects.HistoryReply{
		Queue:     queue,
		ID:        id,
		Events:    make([]subjects.HistoryEvent, len(events)),
		StateMS:   map[subjects.State]int64{},
		Truncated: more,
	}
	for i, e := range events {
		h := subjects.HistoryEvent{Event: e}
		switch {
		case e.Kind == subjects.EventCollected:
			reply.Collected = true
		case i+1 < len(events):
			h.StateMS = max(events[i+1].At.Sub(e.At).Milliseconds(), 0)
		case more && after != nil:
			h.StateMS = max(after.At.Sub(e.At).Milliseconds(), 0)
		case !more:
			h.StateMS, h.Current = max(now.Sub(e.At).Milliseconds(), 0), true
		}
		if e.State != "" {
			reply.StateMS[e.State] += h.StateMS
		}
		switch e.Kind {
		case subjects.EventExpired, subjects.EventErrored:
			reply.Failures++
		case subjects.EventReleased:
			if e.Reason != subjects.ReasonRefunded {
				reply.Failures++
			}
		}
		reply.Events[i] = h
	}
	return reply
}

// latestLife returns the events, in the stream's order, of the latest message that had their id:
// from its enqueued event on, leaving out events of earlier ones. A batch of events published twice
// (its acknowledgement lost) repeats that enqueued event, so the first copy is where the message
// starts; an earlier message's event in such a batch happened before the enqueue.
func latestLife(events []subjects.Event) []subjects.Event {
	last := -1
	for i, e := range events {
		if e.Kind == subjects.EventEnqueued {
			last = i
		}
	}
	if last < 0 {
		return events
	}
	enq := events[last]
	start := slices.IndexFunc(events, func(e subjects.Event) bool {
		return e.Kind == subjects.EventEnqueued && e.Version == enq.Version && e.At.Equal(enq.At)
	})
	return slices.DeleteFunc(slices.Clone(events[start:]), func(e subjects.Event) bool { return e.At.Before(enq.At) })
}
