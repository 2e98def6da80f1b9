package broker

import (
	"bytes"
	"cmp"
	"context"
	"errors"
	"fmt"
	"maps"
	"slices"
	"strings"
	"sync"
	"time"

	"github.com/robfig/cron/v3"

	"github.com/natstone/natstone/broker/clock"
	"github.com/natstone/natstone/kv"
	"github.com/natstone/natstone/subjects"
)

// scheduleRetry is how soon a fire that storage did not take (unavailable) is tried again.
const scheduleRetry = time.Second

// removingPoll is how often a paused schedule whose unschedule's outcome is unknown, still stored
// when last read, is read again: no fire of it will.
const removingPoll = time.Minute

// maxSkipWalk bounds the fire times a late fire walks to find the last one due. A walk cut short
// fires the time it reached, still in the past; the next fire walks on from there.
const maxSkipWalk = 1 << 20

// fireID is the id of the message a schedule's fire at t enqueues: the same for every try of that
// fire, which makes a fire sent again (after a broker restart or a failover) a duplicate.
func fireID(name string, t time.Time) string { return name + "@" + t.UTC().Format(time.RFC3339) }

// schedule is one recurring enqueue, as loaded or last written.
type schedule struct {
	queue, name string
	rec         kv.ScheduleRecord
	rev         uint64
	cron        cron.Schedule
	next        time.Time // the next fire time: the first time of cron after rec.From
	retry       time.Time // not before then: the last try of next was unavailable (zero: none)
	removing    bool      // an unschedule of unknown outcome: the next fire first reads whether it landed
	// unsure: rec is the record of a write of unknown outcome (storage may hold another record), so
	// a request that would change nothing writes it again.
	unsure bool
	// invalid says why a stored schedule this broker cannot read does not fire (its cron no longer
	// parses, its record does not decode): listed, never fired, until set again or unscheduled.
	// Its cron is nil.
	invalid string
}

// due is when sc is to be tried: its next fire time, or later if a try of it failed; zero (never)
// while it is paused, unless its fire is to read whether its unschedule landed. An invalid one has
// no next fire time: only that read makes it due.
func (sc *schedule) due() time.Time {
	if sc.rec.Paused && !sc.removing {
		return time.Time{}
	}
	if sc.retry.After(sc.next) {
		return sc.retry
	}
	return sc.next
}

// info describes sc at now.
func (sc *schedule) info(now time.Time) subjects.ScheduleInfo {
	spec := &sc.rec.Spec
	in := subjects.ScheduleInfo{
		Queue:          sc.queue,
		Name:           sc.name,
		Cron:           spec.Cron,
		Metadata:       spec.Metadata,
		DeadlineMS:     spec.DeadlineMS,
		LeaseMS:        spec.LeaseMS,
		MaxAttempts:    spec.MaxAttempts,
		Overlap:        cmp.Or(spec.Overlap, subjects.OverlapAllow),
		PayloadBytes:   len(spec.PayloadBase64),
		Revision:       sc.rev,
		UpdatedAt:      time.UnixMilli(sc.rec.UpdatedAt).UTC(),
		NextAt:         sc.next.UTC(),
		LastID:         sc.rec.LastID,
		LastError:      sc.rec.LastError,
		LastErrorCode:  sc.rec.LastErrorCode,
		Skipped:        sc.rec.Skipped,
		OverlapSkipped: sc.rec.OverlapSkipped,
		Paused:         sc.rec.Paused,
		Note:           sc.rec.Note,
		Invalid:        sc.invalid,
	}
	if sc.rec.LastAt != 0 {
		t := time.UnixMilli(sc.rec.LastAt).UTC()
		in.LastAt = &t
	}
	if sc.rec.Paused {
		if sc.cron != nil {
			// Its next time were it resumed now: a resume fires from then, none of the times passed.
			in.NextAt = sc.cron.Next(now).UTC()
		}
		t := time.UnixMilli(sc.rec.PausedAt).UTC()
		in.PausedAt = &t
	}
	return in
}

// scheduler fires the schedules of every queue: one timer, armed for the earliest next fire.
type scheduler struct {
	b *Broker

	// ops serializes what writes schedules (a schedule or unschedule request, a fire, a queue's
	// delete), so that each write expects the revision the one before it stored: held while it
	// has a value in it (lock, unlock). A request waits for it no longer than its ctx.
	ops chan struct{}

	mu      sync.Mutex // guards the fields below
	all     map[string]map[string]*schedule
	timer   clock.Timer
	running bool // the timer may be armed: set as the broker begins to serve, cleared by Stop

	// Set by tests only: called when a schedule or unschedule request's write failed, before its
	// outcome is read back.
	testWriteFailed func()
}

func newScheduler(b *Broker) *scheduler {
	return &scheduler{b: b, all: make(map[string]map[string]*schedule), ops: make(chan struct{}, 1)}
}

// lock takes ops, or fails with unavailable once ctx ends (a fire or a queue's delete holds it
// through storage round trips).
func (s *scheduler) lock(ctx context.Context) error {
	select {
	case s.ops <- struct{}{}:
		return nil
	case <-ctx.Done():
		return unavailable("schedules", fmt.Errorf("busy: %w", ctx.Err()))
	}
}

func (s *scheduler) unlock() { <-s.ops }

// load reads every schedule, once the queues are recovered. A schedule of a queue that no longer
// exists (a write of unknown outcome that landed after the queue's delete, or an old revision the
// server brought back) is removed, whether its record decodes or not.
func (s *scheduler) load(ctx context.Context) error {
	b := s.b
	type orphan struct {
		queue, name string
		rev         uint64
	}
	var orphans []orphan
	err := b.store.LoadSchedules(ctx, "", func(queue, name string, r kv.ScheduleRecord, rev uint64, bad error) error {
		b.mu.Lock()
		_, ok := b.queues[queue]
		b.mu.Unlock()
		if !ok {
			orphans = append(orphans, orphan{queue, name, rev})
			return nil
		}
		if bad != nil {
			b.log.Error("a schedule's record does not decode: it will not fire", "queue", queue, "schedule", name, "err", bad)
			s.set(&schedule{queue: queue, name: name, rev: rev, invalid: "its record does not decode: " + bad.Error()})
			return nil
		}
		c, err := parseCron(r.Spec.Cron, time.UnixMilli(r.From))
		if err != nil {
			// A cron an earlier version took. Listed with why, so that an operator sees it.
			b.log.Error("a schedule's cron does not parse: it will not fire", "queue", queue, "schedule", name, "err", err)
			s.set(&schedule{queue: queue, name: name, rec: r, rev: rev, invalid: err.Error()})
			return nil
		}
		s.set(&schedule{queue: queue, name: name, rec: r, rev: rev, cron: c, next: c.Next(time.UnixMilli(r.From))})
		return nil
	})
	if err != nil {
		return err
	}
	for _, o := range orphans {
		if err := b.store.DeleteSchedule(ctx, o.queue, o.name, o.rev); err != nil {
			b.log.Warn("a schedule of a deleted queue was not removed", "queue", o.queue, "schedule", o.name, "err", err)
		}
	}
	if n := s.count(); n > 0 {
		b.log.Info("schedules loaded", "schedules", n)
	}
	return nil
}

// set stores sc in the map, replacing any schedule of its queue and name.
func (s *scheduler) set(sc *schedule) {
	s.mu.Lock()
	defer s.mu.Unlock()
	m := s.all[sc.queue]
	if m == nil {
		m = make(map[string]*schedule)
		s.all[sc.queue] = m
	}
	m[sc.name] = sc
}

func (s *scheduler) get(queue, name string) *schedule {
	s.mu.Lock()
	defer s.mu.Unlock()
	return s.all[queue][name]
}

// infos describes every schedule, by queue and name.
func (s *scheduler) infos() []subjects.ScheduleInfo {
	now := s.b.clock.Now()
	s.mu.Lock()
	var out []subjects.ScheduleInfo
	for _, m := range s.all {
		for _, sc := range m {
			out = append(out, sc.info(now))
		}
	}
	s.mu.Unlock()
	slices.SortFunc(out, func(x, y subjects.ScheduleInfo) int {
		return cmp.Or(strings.Compare(x.Queue, y.Queue), strings.Compare(x.Name, y.Name))
	})
	return out
}

func (s *scheduler) count() int {
	s.mu.Lock()
	defer s.mu.Unlock()
	n := 0
	for _, m := range s.all {
		n += len(m)
	}
	return n
}

// start arms the timer: the broker serves.
func (s *scheduler) start() {
	s.mu.Lock()
	s.running = true
	s.mu.Unlock()
	s.arm()
}

// stop disarms the timer for good. A fire under way ends on its own: its queue is closed.
func (s *scheduler) stop() {
	s.mu.Lock()
	defer s.mu.Unlock()
	s.running = false
	if s.timer != nil {
		s.timer.Stop()
	}
}

// arm sets the timer for the earliest fire due.
func (s *scheduler) arm() {
	s.mu.Lock()
	defer s.mu.Unlock()
	if !s.running {
		return
	}
	var first time.Time
	for _, m := range s.all {
		for _, sc := range m {
			if d := sc.due(); !d.IsZero() && (first.IsZero() || d.Before(first)) {
				first = d // (zero: the cron has no time left)
			}
		}
	}
	if s.timer != nil {
		s.timer.Stop()
	}
	if first.IsZero() {
		return
	}
	s.timer = s.b.clock.AfterFunc(max(first.Sub(s.b.clock.Now()), 0), s.fire)
}

// fire enqueues what every schedule due owes, then arms the timer again.
func (s *scheduler) fire() {
	b := s.b
	if !b.track() {
		return
	}
	defer b.wg.Done()
	if s.lock(b.ctx) != nil {
		return // the broker stops
	}
	s.fireDue()
	s.arm()
}

// fireDue fires every schedule due, under s.ops, which it releases.
func (s *scheduler) fireDue() {
	b := s.b
	defer s.unlock()
	now := b.clock.Now()
	s.mu.Lock()
	var due []*schedule
	for _, m := range s.all {
		for _, sc := range m {
			if d := sc.due(); !d.IsZero() && !d.After(now) {
				due = append(due, sc)
			}
		}
	}
	s.mu.Unlock()
	slices.SortFunc(due, func(x, y *schedule) int { return x.next.Compare(y.next) })
	for _, sc := range due {
		if !s.fireOne(sc, now) {
			again := *sc
			again.retry = b.clock.Now().Add(scheduleRetry) // after the try, which may have waited for storage
			s.mu.Lock()
			if s.all[sc.queue][sc.name] == sc {
				s.all[sc.queue][sc.name] = &again
			}
			s.mu.Unlock()
		}
	}
}

// fireOne enqueues sc's last fire time due at now, counting those before it as skipped (unless
// their messages are there), and stores what it did. It reports false when the fire is to be tried
// again: storage did not take the enqueue (unavailable), or the claim does not hold. A schedule of
// a queue deleted, or being deleted, is forgotten (a delete that stops part way leaves the queue
// closed until it is sent again, and the stored schedules for a restart to load). Called with
// s.ops held.
func (s *scheduler) fireOne(sc *schedule, now time.Time) bool {
	b := s.b
	q, err := b.lookup(b.ctx, sc.queue, false)
	if err == nil {
		q.mu.Lock()
		if q.deleting {
			err = q.usable()
		}
		q.mu.Unlock()
	}
	if err != nil {
		s.drop(sc)
		return true
	}
	if sc.removing {
		rev, err := s.storedRevision(sc.queue, sc.name)
		switch {
		case err != nil:
			return false // read again at the retry
		case rev == 0:
			s.drop(sc) // the unschedule landed
			return true
		case sc.rec.Paused || sc.invalid != "":
			kept := *sc // still stored: a paused schedule is kept, not fired, and read again later
			kept.retry = b.clock.Now().Add(removingPoll)
			s.mu.Lock()
			if s.all[sc.queue][sc.name] == sc {
				s.all[sc.queue][sc.name] = &kept
			}
			s.mu.Unlock()
			return true
		}
	}
	// The times before the last one due are skipped, unless a broker fired them already and died
	// before it stored that (the queue holds their messages).
	t, skipped, held := s.walk(sc, q, now)
	return s.fireAt(sc, q, t, skipped, held)
}

// walk returns the last fire time of sc due at now, how many of the times before it were skipped,
// and the latest of those whose message the queue holds (zero if none): a broker fired it and died
// before it stored so.
func (s *scheduler) walk(sc *schedule, q *queue, now time.Time) (time.Time, int64, time.Time) {
	t, skipped, held := sc.next, int64(0), time.Time{}
	pass := func(t time.Time) {
		if q.holds(fireID(sc.name, t)) {
			held = t
		} else {
			skipped++
		}
	}
	if d, ok := sc.cron.(cron.ConstantDelaySchedule); ok && d.Delay > 0 && now.After(t) {
		// "@every" missed for longer than a walk goes: the times older than the walk's are
		// counted at once, but for the first, which a broker that died may have fired unstored
		// (one whose stores kept failing may have fired the next few too: they are counted).
		if k := now.Sub(t)/d.Delay - maxSkipWalk; k > 0 {
			pass(t)
			t, skipped = t.Add(k*d.Delay), skipped+int64(k)-1
		}
	}
	for walked, n := 0, sc.cron.Next(t); !n.IsZero() && !n.After(now) && walked < maxSkipWalk; walked, n = walked+1, sc.cron.Next(t) {
		pass(t)
		t = n
	}
	return t, skipped, held
}

// fireAt enqueues sc's fire at t and stores its time, with skipped more times skipped; held, if
// not zero, is a fire time before t whose message a broker enqueued without storing so (walk),
// which is then the last fire. What it reports is fireOne's. A fire whose message the queue holds
// already (a broker fired it and died before storing so, or a client enqueued its id) is done. A
// schedule whose overlap is skip enqueues nothing while its last fire's message is not finished:
// it counts the time in OverlapSkipped and keeps its last fire, whose message the next fire looks
// at again.
func (s *scheduler) fireAt(sc *schedule, q *queue, t time.Time, skipped int64, held time.Time) bool {
	b := s.b
	if !b.claim.held() {
		return false // another broker may serve the store: nothing is written, not even the payload
	}
	rec := sc.rec
	rec.From = t.UnixMilli()
	rec.Skipped += skipped
	lastFire(&rec, sc.name, held)
	id := fireID(sc.name, t)
	switch {
	case q.holds(id):
		lastFire(&rec, sc.name, t)
		return s.saveFire(sc, rec, t)
	case overlapping(&rec, q):
		rec.OverlapSkipped++
		rec.LastError, rec.LastErrorCode = "", "" // left out by the policy: no fire was refused
		b.log.Debug("a schedule's fire enqueued nothing: its last fire's message is not finished", "queue", sc.queue, "schedule", sc.name, "last_id", rec.LastID)
		return s.saveFire(sc, rec, t)
	}
	ctx, cancel := context.WithTimeout(b.ctx, b.cfg.WriteTimeout)
	defer cancel()
	err := enqueueFire(ctx, q, &sc.rec.Spec, id, t)
	if subjects.CodeOf(err) == subjects.CodeUnavailable {
		b.log.Warn("a schedule's fire was not stored; it is tried again", "queue", sc.queue, "schedule", sc.name, "id", id, "err", err)
		return false
	}
	if err == nil {
		lastFire(&rec, sc.name, t)
	} else {
		// The queue refuses it (blocked, or its config changed since): this fire is lost, and says
		// why; the next one tries again. LastID stays the message of the last fire that enqueued
		// one, which overlap skip looks at (an operator may retry it).
		rec.LastAt, rec.LastError, rec.LastErrorCode = t.UnixMilli(), err.Error(), subjects.CodeOf(err)
		var e *subjects.Error
		if errors.As(err, &e) {
			rec.LastError = e.Message
		}
		b.log.Warn("a schedule's fire enqueued nothing", "queue", sc.queue, "schedule", sc.name, "id", id, "err", err)
	}
	return s.saveFire(sc, rec, t)
}

// overlapping reports whether rec's overlap policy holds a fire back: skip, with the message of
// the last fire not finished.
func overlapping(rec *kv.ScheduleRecord, q *queue) bool {
	return rec.Spec.Overlap == subjects.OverlapSkip && rec.LastID != "" && q.unfinished(rec.LastID)
}

// enqueueFire enqueues spec's message of a fire at t into q, with the id id and the priority t +
// its deadline.
func enqueueFire(ctx context.Context, q *queue, spec *subjects.ScheduleRequest, id string, t time.Time) error {
	req := spec.Template()
	req.ID = id
	prio := t.UnixMilli() + spec.DeadlineMS
	req.Priority = &prio
	_, err := q.enqueue(ctx, []subjects.EnqueueRequest{req})
	return err
}

// lastFire makes the fire of schedule name at t, unless t is zero, rec's last: it enqueued its
// message.
func lastFire(rec *kv.ScheduleRecord, name string, t time.Time) {
	if !t.IsZero() {
		rec.LastAt, rec.LastID, rec.LastError, rec.LastErrorCode = t.UnixMilli(), fireID(name, t), "", ""
	}
}

// saveFire stores rec, what sc's fire at t did, and keeps it as sc's; what it reports is fireOne's.
func (s *scheduler) saveFire(sc *schedule, rec kv.ScheduleRecord, t time.Time) bool {
	b := s.b
	next := &schedule{queue: sc.queue, name: sc.name, rec: rec, rev: sc.rev, cron: sc.cron, next: sc.cron.Next(t)}
	wctx, wcancel := context.WithTimeout(b.ctx, b.cfg.WriteTimeout) // a slow enqueue leaves it its own time
	defer wcancel()
	rev, err := s.write(wctx, next, false)
	switch {
	case errors.Is(err, errScheduleGone):
		s.drop(sc)
		return true
	case err != nil:
		// The fire happened: it is not fired again by this broker, whose memory goes on. A broker
		// that starts from the stored record fires it again, as a duplicate.
		b.log.Warn("a schedule's last fire was not stored", "queue", sc.queue, "schedule", sc.name, "err", err)
		next.unsure = true
	default:
		next.rev = rev
	}
	s.set(next)
	return true
}

// drop forgets sc, if it is still the schedule of its name.
func (s *scheduler) drop(sc *schedule) {
	s.mu.Lock()
	defer s.mu.Unlock()
	if s.all[sc.queue][sc.name] == sc {
		delete(s.all[sc.queue], sc.name)
	}
}

// dropQueue forgets every schedule of queue (deleted).
func (s *scheduler) dropQueue(queue string) {
	s.mu.Lock()
	defer s.mu.Unlock()
	delete(s.all, queue)
}

// errScheduleGone: a fire's record write found its schedule removed (an unschedule whose reply was
// lost, say): the schedule is not written back.
var errScheduleGone = errors.New("the schedule was removed")

// errNotWritten: a schedule's write was not sent, the claim not holding: its outcome is known.
var errNotWritten = errors.New("the schedule was not written")

// write stores sc.rec over sc.rev, within the claim. Only the broker holding the claim writes
// schedules, so a conflict means that a write before, of unknown outcome, landed: a record, over
// which the write is tried again, or a removal (an unschedule), which only a schedule request
// (create) writes over; a fire gets errScheduleGone. Called with s.ops held.
func (s *scheduler) write(ctx context.Context, sc *schedule, create bool) (uint64, error) {
	b := s.b
	ctx, cancel, err := b.claim.bound(ctx)
	if err != nil {
		return 0, fmt.Errorf("%w: %w", errNotWritten, err)
	}
	defer cancel()
	rev, err := b.store.PutSchedule(ctx, sc.queue, sc.name, &sc.rec, sc.rev)
	if errors.Is(err, kv.ErrConflict) {
		var cur uint64
		if cur, err = b.store.ScheduleRevision(ctx, sc.queue, sc.name); err != nil {
			return 0, err
		}
		if cur == 0 && !create {
			return 0, errScheduleGone
		}
		rev, err = b.store.PutSchedule(ctx, sc.queue, sc.name, &sc.rec, cur)
	}
	return rev, err
}

// storedRevision reads schedule name of queue's revision after a write of unknown outcome, with a
// ctx of its own (the request's may have ended), within the claim: 0 if it is not stored.
func (s *scheduler) storedRevision(queue, name string) (uint64, error) {
	b := s.b
	ctx, cancel := context.WithTimeout(b.ctx, b.cfg.WriteTimeout)
	defer cancel()
	ctx, cancelClaim, err := b.claim.bound(ctx)
	if err != nil {
		return 0, err
	}
	defer cancelClaim()
	return b.store.ScheduleRevision(ctx, queue, name)
}

// putSchedule creates or replaces schedule r.Name of queue (the schedule request).
func (b *Broker) putSchedule(ctx context.Context, queue string, r subjects.ScheduleRequest) (subjects.ScheduleInfo, error) {
	if err := subjects.ValidateScheduleName(r.Name); err != nil {
		return subjects.ScheduleInfo{}, err
	}
	now := b.clock.Now()
	c, err := parseCron(r.Cron, now)
	if err != nil {
		return subjects.ScheduleInfo{}, err
	}
	if r.DeadlineMS < 0 || r.DeadlineMS > subjects.MaxScheduleDeadline.Milliseconds() {
		return subjects.ScheduleInfo{}, subjects.Errorf(subjects.CodeOutOfRange, "deadline_ms must be 0 to %d, got %d", subjects.MaxScheduleDeadline.Milliseconds(), r.DeadlineMS)
	}
	switch r.Overlap {
	case "", subjects.OverlapAllow, subjects.OverlapSkip:
	default:
		return subjects.ScheduleInfo{}, subjects.Errorf(subjects.CodeInvalidSchedule, "overlap must be %q or %q, got %q", subjects.OverlapAllow, subjects.OverlapSkip, r.Overlap)
	}
	// Each fire is an enqueue: it must be one the queue takes, with the id it will carry.
	tmpl := r.Template()
	tmpl.ID = fireID(r.Name, now)
	payload, err := tmpl.PayloadBytes()
	if err != nil {
		return subjects.ScheduleInfo{}, err
	}
	reqs := []subjects.EnqueueRequest{tmpl}
	q, err := b.lookupForEnqueue(ctx, queue, reqs)
	if err != nil {
		return subjects.ScheduleInfo{}, err
	}
	q.mu.Lock()
	cfg, err := q.cfg, q.usable()
	q.mu.Unlock()
	if err == nil {
		_, err = validateEnqueue(&cfg, queue, b.replyBudget(), reqs, now.UnixMilli(), nil)
	}
	if err != nil {
		return subjects.ScheduleInfo{}, err
	}
	spec := r
	spec.Payload, spec.PayloadBase64 = "", nil
	if spec.LeaseMS != nil && *spec.LeaseMS == 0 {
		spec.LeaseMS = nil // 0 is the queue's lease, as none is
	}
	if spec.Overlap == subjects.OverlapAllow {
		spec.Overlap = "" // the default, as none is
	}
	if len(payload) > 0 {
		spec.PayloadBase64 = payload
	}

	s := b.sched
	if err := s.lock(ctx); err != nil {
		return subjects.ScheduleInfo{}, err
	}
	defer s.unlock()
	q.mu.Lock()
	err = q.usable() // a delete may have begun meanwhile: it removes the queue's schedules under ops
	q.mu.Unlock()
	if err != nil {
		return subjects.ScheduleInfo{}, err
	}
	old, err := s.present(queue, r.Name) // nil: a new schedule, also if an unschedule in doubt landed
	if err != nil {
		return subjects.ScheduleInfo{}, err
	}
	if old != nil && sameSpec(&old.rec.Spec, &spec) {
		// As asked already: nothing is written, unless the record went meanwhile (an unschedule
		// of unknown outcome landed).
		if cur, err := b.store.ScheduleRevision(ctx, queue, r.Name); err != nil {
			return subjects.ScheduleInfo{}, unavailable("schedule", err)
		} else if cur == old.rev && !old.unsure {
			return old.info(now), nil
		}
	}
	rec := kv.ScheduleRecord{Spec: spec, UpdatedAt: now.UnixMilli(), From: now.UnixMilli()}
	sc := &schedule{queue: queue, name: r.Name, cron: c}
	if old != nil {
		sc.rev = old.rev
		rec.LastAt, rec.LastID, rec.LastError, rec.LastErrorCode = old.rec.LastAt, old.rec.LastID, old.rec.LastError, old.rec.LastErrorCode
		rec.Skipped, rec.OverlapSkipped = old.rec.Skipped, old.rec.OverlapSkipped
		rec.Paused, rec.PausedAt, rec.Note = old.rec.Paused, old.rec.PausedAt, old.rec.Note // a replace keeps its state
		if old.rec.Spec.Cron == spec.Cron {
			rec.From = old.rec.From // the same times: none is skipped or fired twice by the change
		} else if !old.rec.Paused && !old.next.IsZero() && !old.next.After(now) {
			// The times due are not fired; the last one a broker fired unstored is the last fire.
			last, k, held := s.walk(old, q, now)
			rec.Skipped += k
			if q.holds(fireID(r.Name, last)) {
				held = last
			} else {
				rec.Skipped++
			}
			lastFire(&rec, r.Name, held)
		}
	} else if n := s.countQueue(queue); n >= subjects.MaxSchedules {
		return subjects.ScheduleInfo{}, subjects.Errorf(subjects.CodeOutOfRange, "queue %s has %d schedules, the most a queue may have", queue, n)
	}
	sc.rec = rec
	sc.next = c.Next(time.UnixMilli(rec.From))
	if err := s.put(ctx, sc, true); err != nil {
		return subjects.ScheduleInfo{}, err
	}
	return sc.info(now), nil
}

// sameSpec reports whether a and b (both with their payload in PayloadBase64) enqueue the same
// messages at the same times.
func sameSpec(a, b *subjects.ScheduleRequest) bool {
	return a.Cron == b.Cron && a.DeadlineMS == b.DeadlineMS && a.Overlap == b.Overlap && bytes.Equal(a.PayloadBase64, b.PayloadBase64) &&
		maps.Equal(a.Metadata, b.Metadata) && equalPtr(a.LeaseMS, b.LeaseMS) && equalPtr(a.MaxAttempts, b.MaxAttempts)
}

func equalPtr(a, b *int64) bool { return a == nil && b == nil || a != nil && b != nil && *a == *b }

func (s *scheduler) countQueue(queue string) int {
	s.mu.Lock()
	defer s.mu.Unlock()
	return len(s.all[queue])
}

// unschedule removes schedule r.Name of queue; one that does not exist is removed already, and so
// is every schedule of a queue that does not exist (a queue's delete removes its schedules), so
// that a cleanup run again, or after the queue's delete, succeeds.
func (b *Broker) unschedule(ctx context.Context, queue string, r subjects.UnscheduleRequest) (subjects.UnscheduleReply, error) {
	if err := subjects.ValidateScheduleName(r.Name); err != nil {
		return subjects.UnscheduleReply{}, err
	}
	q, err := b.lookup(ctx, queue, false)
	if subjects.CodeOf(err) == subjects.CodeQueueNotFound {
		return subjects.UnscheduleReply{Queue: queue, Name: r.Name}, nil
	}
	if err != nil {
		return subjects.UnscheduleReply{}, err
	}
	return b.unscheduleOf(ctx, q, r)
}

// unscheduleOf is unschedule of queue q, looked up.
func (b *Broker) unscheduleOf(ctx context.Context, q *queue, r subjects.UnscheduleRequest) (subjects.UnscheduleReply, error) {
	reply := subjects.UnscheduleReply{Queue: q.name, Name: r.Name}
	s := b.sched
	if err := s.lock(ctx); err != nil {
		return reply, err
	}
	defer s.unlock()
	q.mu.Lock()
	err := q.usable()
	q.mu.Unlock()
	if subjects.CodeOf(err) == subjects.CodeQueueNotFound {
		return reply, nil // deleted since it was looked up, with its schedules: none to remove
	}
	if err != nil {
		return reply, err
	}
	ctx, cancel, err := b.claim.bound(ctx)
	if err != nil {
		return reply, unavailable("unschedule", err)
	}
	defer cancel()
	sc := s.get(q.name, r.Name)
	if sc == nil {
		// None known; a record stored since this broker loaded (by one that served before it and
		// was paused, say) is still removed.
		rev, err := b.store.ScheduleRevision(ctx, q.name, r.Name)
		if err != nil {
			return reply, unavailable("unschedule", err)
		}
		if rev == 0 {
			return reply, nil
		}
		sc = &schedule{queue: q.name, name: r.Name, rev: rev}
	}
	err = b.store.DeleteSchedule(ctx, q.name, r.Name, sc.rev)
	if errors.Is(err, kv.ErrConflict) {
		// A write before, of unknown outcome, landed (see write): remove what is stored.
		var cur uint64
		if cur, err = b.store.ScheduleRevision(ctx, q.name, r.Name); err == nil && cur != 0 {
			err = b.store.DeleteSchedule(ctx, q.name, r.Name, cur)
		}
	}
	if err != nil {
		// Its outcome is unknown: a delete that landed is one no fire may undo, or fire after.
		if s.testWriteFailed != nil {
			s.testWriteFailed()
		}
		if cur, rerr := s.storedRevision(q.name, r.Name); rerr == nil && cur == 0 {
			s.drop(sc)
			s.arm()
		} else if s.get(q.name, r.Name) == sc {
			doubt := *sc // it may land yet: the next fire, a second from now at the soonest, reads first whether it did
			doubt.removing = true
			doubt.retry = b.clock.Now().Add(scheduleRetry)
			s.set(&doubt)
			s.arm() // (due even while paused)
		}
		return reply, unavailable("unschedule", err)
	}
	s.drop(sc)
	s.arm()
	reply.Removed = true
	return reply, nil
}

// schedules lists q's schedules by name, after r.After, as many as one reply carries.
func (b *Broker) schedules(q *queue, r subjects.SchedulesRequest) (subjects.SchedulesReply, error) {
	if r.After != "" {
		if subjects.ValidateScheduleName(r.After) != nil {
			return subjects.SchedulesReply{}, subjects.Errorf(subjects.CodeInvalidSchedule, "after must be a schedule name (1 to %d characters of A-Z a-z 0-9 _ -), got %q", subjects.MaxScheduleNameLen, r.After)
		}
	}
	q.mu.Lock()
	err := q.usable()
	q.mu.Unlock()
	if err != nil {
		return subjects.SchedulesReply{}, err
	}
	s, now := b.sched, b.clock.Now()
	s.mu.Lock()
	var infos []subjects.ScheduleInfo
	for name, sc := range s.all[q.name] {
		if name > r.After {
			infos = append(infos, sc.info(now))
		}
	}
	s.mu.Unlock()
	slices.SortFunc(infos, func(x, y subjects.ScheduleInfo) int { return strings.Compare(x.Name, y.Name) })
	out := subjects.SchedulesReply{Queue: q.name}
	out.Schedules, out.More, err = fitReply(b.replyBudget(), 0, slices.Values(infos))
	return out, err
}
