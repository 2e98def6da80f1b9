package broker

import (
	"cmp"
	"context"
	"errors"
	"time"

	"github.com/natstone/natstone/kv"
	"github.com/natstone/natstone/subjects"
)

// setPaused pauses schedule r.Name of q (pause true) or resumes it, with r.Note: the
// schedule_pause and schedule_resume requests. A paused schedule does not fire; a resume fires it
// next at its cron's first time after now, none of the times passed while it was paused. A pause
// of a paused schedule, or a resume of one that is not, changes only the note, and without a note
// keeps it (a pause sent twice, the second time without its note, does not clear the first's); a
// request that changes nothing writes nothing.
func (b *Broker) setPaused(ctx context.Context, q *queue, r subjects.SchedulePauseRequest, pause bool) (subjects.ScheduleInfo, error) {
	if err := subjects.ValidateNote(r.Note); err != nil {
		return subjects.ScheduleInfo{}, err
	}
	s := b.sched
	sc, err := s.lockPresent(ctx, q, r.Name)
	if err != nil {
		return subjects.ScheduleInfo{}, err
	}
	defer s.unlock()
	now := b.clock.Now()
	note := r.Note
	if sc.rec.Paused == pause && note == "" {
		note = sc.rec.Note
	}
	if sc.rec.Paused == pause && sc.rec.Note == note && !sc.unsure {
		return sc.info(now), nil
	}
	rec := sc.rec
	rec.Paused, rec.Note = pause, note
	switch {
	case pause && !sc.rec.Paused:
		rec.PausedAt = now.UnixMilli()
	case !pause && sc.rec.Paused:
		rec.PausedAt, rec.From = 0, now.UnixMilli()
	}
	next, err := s.store(ctx, sc, rec)
	if err != nil {
		return subjects.ScheduleInfo{}, err
	}
	if pause {
		b.log.Info("a schedule is paused", "queue", q.name, "schedule", r.Name, "note", note)
	} else {
		b.log.Info("a schedule is resumed", "queue", q.name, "schedule", r.Name, "note", note, "next_at", next.next)
	}
	return next.info(now), nil
}

// handFireID is the id of a fire by hand of schedule name at t without an id of its own: its time
// to the millisecond, which no time of a cron has in its id (fireID), so that the two never meet.
func handFireID(name string, t time.Time) string {
	return name + "@" + t.UTC().Format("2006-01-02T15:04:05.000Z07:00")
}

// fireNow fires schedule r.Name of q now, paused or not, out of its cron's times (the
// schedule_fire request): it enqueues the schedule's message with the id r.ID, or handFireID's,
// and the priority now + deadline_ms, and makes it the schedule's last fire. An id the queue holds
// already enqueues nothing more: if its message is newer than the last fire, it is this fire, sent
// before, and becomes the last fire; else nothing changes. With overlap skip, a fire while the
// last fire's message is not finished is refused (invalid_state), as a fire of the cron would
// enqueue nothing.
func (b *Broker) fireNow(ctx context.Context, q *queue, r subjects.ScheduleFireRequest) (subjects.ScheduleInfo, error) {
	if r.ID != "" {
		if err := subjects.ValidateID(r.ID); err != nil {
			return subjects.ScheduleInfo{}, err
		}
	}
	s := b.sched
	sc, err := s.lockPresent(ctx, q, r.Name)
	if err != nil {
		return subjects.ScheduleInfo{}, err
	}
	defer s.unlock()
	now := b.clock.Now()
	id := cmp.Or(r.ID, handFireID(r.Name, now))
	rec, at := sc.rec, now
	enqueuedAt, held := q.enqueuedAt(id)
	last := rec.LastAt // when the last fire's message was enqueued: a timed fire's may be after its time
	if t, ok := q.enqueuedAt(rec.LastID); ok {
		last = t
	}
	switch {
	case rec.LastID == id && rec.LastError == "":
		if !sc.unsure {
			return sc.info(now), nil // this fire, sent again
		}
		at = time.UnixMilli(rec.LastAt) // its record's write was of unknown outcome: written again
	case held && enqueuedAt <= last:
		// A message older than the last fire (this fire sent before, and another fired since;
		// or not the schedule's): nothing changes.
		return sc.info(now), nil
	case held:
		// Newer than the last fire: this fire sent before, by a broker that did not store it.
		at = time.UnixMilli(enqueuedAt)
	default:
		if overlapping(&rec, q) {
			return subjects.ScheduleInfo{}, subjects.Errorf(subjects.CodeInvalidState,
				"schedule %s skips overlaps, and the message of its last fire, %s, is not finished", r.Name, rec.LastID)
		}
		if err := enqueueFire(ctx, q, &rec.Spec, id, now); err != nil {
			return subjects.ScheduleInfo{}, err
		}
	}
	rec.LastAt, rec.LastID, rec.LastError, rec.LastErrorCode = at.UnixMilli(), id, "", ""
	next, err := s.store(ctx, sc, rec)
	if err != nil {
		return subjects.ScheduleInfo{}, err // the message is enqueued: the fire sent again with its id stores it
	}
	b.log.Info("a schedule fired by request", "queue", q.name, "schedule", r.Name, "id", id)
	return next.info(now), nil
}

// lockPresent checks name, takes s.ops and returns schedule name of q, or fails with
// invalid_schedule or schedule_not_found (and s.ops released). A schedule whose unschedule is of
// unknown outcome is read first: gone if it landed.
func (s *scheduler) lockPresent(ctx context.Context, q *queue, name string) (*schedule, error) {
	if err := subjects.ValidateScheduleName(name); err != nil {
		return nil, err
	}
	if err := s.lock(ctx); err != nil {
		return nil, err
	}
	q.mu.Lock()
	err := q.usable()
	q.mu.Unlock()
	var sc *schedule
	if err == nil {
		sc, err = s.present(q.name, name)
	}
	switch {
	case err == nil && sc == nil:
		err = subjects.Errorf(subjects.CodeScheduleNotFound, "queue %s has no schedule %s", q.name, name)
	case err == nil && sc.invalid != "":
		err = subjects.Errorf(subjects.CodeInvalidSchedule, "schedule %s of queue %s does not fire: %s; set it again or unschedule it", name, q.name, sc.invalid)
	}
	if err != nil {
		s.unlock()
		return nil, err
	}
	return sc, nil
}

// present returns schedule name of queue, or nil if there is none. One whose unschedule is of
// unknown outcome is read first: forgotten, and nil, if the unschedule landed. Called with s.ops
// held.
func (s *scheduler) present(queue, name string) (*schedule, error) {
	sc := s.get(queue, name)
	if sc == nil || !sc.removing {
		return sc, nil
	}
	rev, err := s.storedRevision(queue, name)
	if err != nil {
		return nil, unavailable("schedule", err)
	}
	if rev == 0 {
		s.drop(sc) // the unschedule landed
		return nil, nil
	}
	return sc, nil
}

// store writes rec as sc's record and keeps it (put), its next fire time counted from rec.From.
func (s *scheduler) store(ctx context.Context, sc *schedule, rec kv.ScheduleRecord) (*schedule, error) {
	next := &schedule{queue: sc.queue, name: sc.name, rec: rec, rev: sc.rev, cron: sc.cron,
		next: sc.cron.Next(time.UnixMilli(rec.From))}
	if err := s.put(ctx, next, false); err != nil {
		if errors.Is(err, errScheduleGone) {
			s.drop(sc)
			return nil, subjects.Errorf(subjects.CodeScheduleNotFound, "queue %s has no schedule %s", sc.queue, sc.name)
		}
		return nil, err
	}
	return next, nil
}

// put writes sc (write: create as there), keeps it as the schedule of its name and arms the timer.
// A write not sent (the claim does not hold) fails with unavailable and changes nothing; errScheduleGone
// is returned as it is. One of unknown outcome fails with unavailable too, and is kept all the
// same: it may land yet, and a later write of the schedule writes over what storage holds then
// (lest a schedule stored late live only in storage, unseen until a restart). It is unsure, so that
// the request sent again writes it again: the revision read back cannot tell this write from an
// earlier one of unknown outcome that landed. Called with s.ops held.
func (s *scheduler) put(ctx context.Context, sc *schedule, create bool) error {
	rev, err := s.write(ctx, sc, create)
	switch {
	case errors.Is(err, errScheduleGone):
		return err
	case errors.Is(err, errNotWritten):
		return unavailable("schedule", err)
	case err != nil:
		if s.testWriteFailed != nil {
			s.testWriteFailed()
		}
		sc.unsure = true
		if cur, rerr := s.storedRevision(sc.queue, sc.name); rerr == nil && cur != 0 {
			sc.rev = cur
		}
	default:
		sc.rev = rev
	}
	s.set(sc)
	s.arm()
	if err != nil {
		return unavailable("schedule", err)
	}
	return nil
}
