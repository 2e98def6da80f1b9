package workers

import (
	"context"
	"time"

	"github.com/natstone/natstone/subjects"
)

// ScheduleOpts is what each fire of a schedule enqueues, and when.
type ScheduleOpts struct {
	// Cron says when the schedule fires: five fields (minute hour day-of-month month day-of-week,
	// as "*/15 9-17 * * 1-5"), or a descriptor (@hourly, @daily, @weekly, @monthly, @yearly,
	// "@every 90s"), in UTC unless it starts with CRON_TZ=<IANA zone>. Required.
	Cron string
	// Payload and Metadata are each message's; an exclusive queue requires its exclusivity key.
	Payload  []byte
	Metadata map[string]string
	// Deadline is added to each fire time to make the message's priority: a message fired at T
	// has priority T.UnixMilli() + Deadline in ms (0 to subjects.MaxScheduleDeadline).
	Deadline time.Duration
	// Lease and MaxAttempts, if not 0, are each message's, as in EnqueueOpts.
	Lease       time.Duration
	MaxAttempts int
	// Overlap says what a fire does while the message of the schedule's last fire is still
	// pending, invisible or running: subjects.OverlapAllow (the default, "" alike) enqueues,
	// subjects.OverlapSkip enqueues nothing (and counts the time in ScheduleInfo.OverlapSkipped), so
	// that a job slower than its schedule, or workers down for a while, never piles up fires.
	Overlap subjects.Overlap
}

// Schedule creates the schedule name of queue, or replaces it: a recurring enqueue, which the
// broker serving the store fires at every time of opts.Cron. Each fire enqueues a message with the
// id "<name>@<fire time, RFC 3339 UTC>", so that a fire sent again (after a failover) is a
// duplicate. The queue is created with the defaults if it does not exist and the broker
// auto-creates. The same schedule sent again writes nothing.
//
// Errors: ErrInvalidSchedule (name, cron or overlap), ErrOutOfRange (Deadline, Lease or MaxAttempts, or
// the queue has subjects.MaxSchedules already), and those of an Enqueue of the message.
func (c *Client) Schedule(ctx context.Context, queue, name string, opts ScheduleOpts) (subjects.ScheduleInfo, error) {
	r := subjects.ScheduleRequest{
		Name:          name,
		Cron:          opts.Cron,
		PayloadBase64: opts.Payload,
		Metadata:      opts.Metadata,
		DeadlineMS:    ms(opts.Deadline),
		Overlap:       opts.Overlap,
	}
	if opts.Lease != 0 {
		r.LeaseMS = msPtr(&opts.Lease)
	}
	if opts.MaxAttempts != 0 {
		n := int64(opts.MaxAttempts)
		r.MaxAttempts = &n
	}
	var info subjects.ScheduleInfo
	err := c.request(ctx, subjects.OpSchedule, queue, r, &info)
	return info, err
}

// Unschedule removes the schedule name of queue. It reports whether there was one: an unschedule
// sent again succeeds, reporting false. Errors: ErrQueueNotFound, ErrInvalidSchedule.
func (c *Client) Unschedule(ctx context.Context, queue, name string) (bool, error) {
	var r subjects.UnscheduleReply
	err := c.request(ctx, subjects.OpUnschedule, queue, subjects.UnscheduleRequest{Name: name}, &r)
	return r.Removed, err
}

// Schedules returns queue's schedules, by name, with their next and last fires: as many requests
// as the replies need. Errors: ErrQueueNotFound.
func (c *Client) Schedules(ctx context.Context, queue string) ([]subjects.ScheduleInfo, error) {
	var all []subjects.ScheduleInfo
	var req subjects.SchedulesRequest
	for {
		var r subjects.SchedulesReply
		if err := c.request(ctx, subjects.OpSchedules, queue, req, &r); err != nil {
			return nil, err
		}
		all = append(all, r.Schedules...)
		if !r.More || len(r.Schedules) == 0 {
			return all, nil
		}
		req.After = r.Schedules[len(r.Schedules)-1].Name
	}
}

// PauseSchedule pauses the schedule name of queue: it fires no more until ResumeSchedule, though
// FireSchedule still fires it by hand. note, if not "", says why to whoever lists the schedules
// (ScheduleInfo.Note). Pausing a paused schedule changes only its note, and keeps it when note
// is "". Errors:
// ErrScheduleNotFound, ErrQueueNotFound, ErrInvalidSchedule (name), ErrBadRequest (note).
func (c *Client) PauseSchedule(ctx context.Context, queue, name, note string) (subjects.ScheduleInfo, error) {
	var info subjects.ScheduleInfo
	err := c.request(ctx, subjects.OpSchedulePause, queue, subjects.SchedulePauseRequest{Name: name, Note: note}, &info)
	return info, err
}

// ResumeSchedule resumes the paused schedule name of queue: it fires next at its cron's first
// time after now; the times that passed while it was paused are not fired. note replaces the
// pause's ("" clears it). Resuming a schedule that is not paused changes only its note, and keeps
// it when note is "". Errors: those of
// PauseSchedule.
func (c *Client) ResumeSchedule(ctx context.Context, queue, name, note string) (subjects.ScheduleInfo, error) {
	var info subjects.ScheduleInfo
	err := c.request(ctx, subjects.OpScheduleResume, queue, subjects.SchedulePauseRequest{Name: name, Note: note}, &info)
	return info, err
}

// FireSchedule fires the schedule name of queue now, paused or not, out of its times: it enqueues
// the schedule's message with the priority now + its deadline, and the id id, or if id is ""
// "<name>@<now, RFC 3339 UTC to the millisecond>". Give an id to make the call safe to repeat: a
// fire sent again with the same id enqueues nothing more. The reply's LastID is the message's id
// (unless a fire of the cron came between a fire and its repetition). Errors:
// ErrScheduleNotFound, ErrQueueNotFound, ErrInvalidSchedule (name), ErrInvalidID, ErrInvalidState
// (an overlap skip schedule whose last fire's message is not finished), and those of an Enqueue
// of the message (ErrQueueBlocked…).
func (c *Client) FireSchedule(ctx context.Context, queue, name, id string) (subjects.ScheduleInfo, error) {
	var info subjects.ScheduleInfo
	err := c.request(ctx, subjects.OpScheduleFire, queue, subjects.ScheduleFireRequest{Name: name, ID: id}, &info)
	return info, err
}
