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
// next at its cron's first time after now, none of the times passed while it was paused. A request
// that changes nothing (a pause of a paused schedule with the same note) writes nothing.
func (b *Broker) setPaused(ctx context.Context, q *queue, r subjects.SchedulePauseRequest, pause bool) (subjects.ScheduleInfo, error) {
	if err := subjects.ValidateScheduleName(r.Name); err != nil {
		return subjects.ScheduleInfo{}, err
	}
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
	if sc.rec.Paused == pause && sc.rec.Note == r.Note && !sc.unsure {
		return sc.info(now), nil
	}
	rec := sc.rec
	rec.Paused, rec.Note = pause, r.Note
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
		b.log.Info("a schedule is paused", "queue", q.name, "schedule", r.Name, "note", r.Note)
	} else {
		b.log.Info("a schedule is resumed", "queue", q.name, "schedule", r.Name, "note", r.Note, "next_at", next.next)
	}
	return next.info(now), nil
}

// fireNow fires schedule r.Name of q now, paused or not, out of its cron's times (the
// schedule_fire request): it enqueues the schedule's message with the id r.ID, or
// "<name>@<now>", and the priority now + deadline_ms, and makes it the schedule's last fire. An id
// the queue holds already is taken for this fire, sent before: nothing more is enqueued. With
// overlap skip, a fire while the last fire's message is not finished is refused (invalid_state),
// as a fire of the cron would enqueue nothing.
func (b *Broker) fireNow(ctx context.Context, q *queue, r subjects.ScheduleFireRequest) (subjects.ScheduleInfo, error) {
	if err := subjects.ValidateScheduleName(r.Name); err != nil {
		return subjects.ScheduleInfo{}, err
	}
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
	id := cmp.Or(r.ID, fireID(r.Name, now))
	rec := sc.rec
	if !q.holds(id) {
		if rec.Spec.Overlap == subjects.OverlapSkip && rec.LastID != "" && q.unfinished(rec.LastID) {
			return subjects.ScheduleInfo{}, subjects.Errorf(subjects.CodeInvalidState,
				"schedule %s skips overlaps, and the message of its last fire, %s, is not finished", r.Name, rec.LastID)
		}
		req := rec.Spec.Template()
		req.ID = id
		prio := now.UnixMilli() + rec.Spec.DeadlineMS
		req.Priority = &prio
		if _, err := q.enqueue(ctx, []subjects.EnqueueRequest{req}); err != nil {
			return subjects.ScheduleInfo{}, err
		}
	}
	if rec.LastID == id && rec.LastError == "" && !sc.unsure {
		return sc.info(now), nil // this fire, sent again
	}
	rec.LastAt, rec.LastID, rec.LastError, rec.LastErrorCode = now.UnixMilli(), id, "", ""
	next, err := s.store(ctx, sc, rec)
	if err != nil {
		return subjects.ScheduleInfo{}, err // the message is enqueued: the fire sent again with its id stores it
	}
	b.log.Info("a schedule fired by request", "queue", q.name, "schedule", r.Name, "id", id)
	return next.info(now), nil
}

// lockPresent takes s.ops and returns schedule name of q, or fails with schedule_not_found (and
// s.ops released). A schedule whose unschedule is of unknown outcome is read first: gone if it
// landed.
func (s *scheduler) lockPresent(ctx context.Context, q *queue, name string) (*schedule, error) {
	if err := s.lock(ctx); err != nil {
		return nil, err
	}
	q.mu.Lock()
	err := q.usable()
	q.mu.Unlock()
	sc := s.get(q.name, name)
	if err == nil && sc != nil && sc.removing {
		var rev uint64
		if rev, err = s.storedRevision(q.name, name); err != nil {
			err = unavailable("schedule", err)
		} else if rev == 0 {
			s.drop(sc) // the unschedule landed
			sc = nil
		}
	}
	if err == nil && sc == nil {
		err = subjects.Errorf(subjects.CodeScheduleNotFound, "queue %s has no schedule %s", q.name, name)
	}
	if err != nil {
		s.unlock()
		return nil, err
	}
	return sc, nil
}

// store writes rec as sc's record and keeps it, its next fire time counted from rec.From, and
// arms the timer. A write of unknown outcome fails with unavailable, and is kept all the same, as
// putSchedule keeps its own: it may land yet, and a later write of the schedule writes over what
// storage holds then. Read back before it landed, it is unsure. Called with s.ops held.
func (s *scheduler) store(ctx context.Context, sc *schedule, rec kv.ScheduleRecord) (*schedule, error) {
	next := &schedule{queue: sc.queue, name: sc.name, rec: rec, rev: sc.rev, cron: sc.cron,
		next: sc.cron.Next(time.UnixMilli(rec.From))}
	rev, err := s.write(ctx, next, false)
	switch {
	case errors.Is(err, errScheduleGone):
		s.drop(sc)
		return nil, subjects.Errorf(subjects.CodeScheduleNotFound, "queue %s has no schedule %s", sc.queue, sc.name)
	case err != nil:
		if s.testWriteFailed != nil {
			s.testWriteFailed()
		}
		next.unsure = true
		if cur, rerr := s.storedRevision(sc.queue, sc.name); rerr == nil && cur != 0 && cur != sc.rev {
			next.rev, next.unsure = cur, false // it landed: only the broker holding the claim writes schedules
		}
		s.set(next)
		s.arm()
		return nil, unavailable("schedule", err)
	}
	next.rev = rev
	s.set(next)
	s.arm()
	return next, nil
}
