package kv

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"strconv"

	"github.com/nats-io/nats.go"
	"github.com/nats-io/nats.go/jetstream"

	"github.com/natstone/natstone/subjects"
)

// ScheduleRecord is a schedule (a recurring enqueue) as stored, under the key <queue>.<name> of the
// schedules bucket. Its payload is in Spec.PayloadBase64 whichever way the request gave it.
type ScheduleRecord struct {
	Spec          subjects.ScheduleRequest `json:"spec"`
	UpdatedAt     int64                    `json:"updated_at"`           // Unix ms of the last schedule request that changed Spec
	From          int64                    `json:"from"`                 // Unix ms: the next fire is the first time of Spec.Cron after it
	LastAt        int64                    `json:"last_at,omitempty"`    // Unix ms of the last fire, 0 if none
	LastID        string                   `json:"last_id,omitempty"`    // the id of the last fire that enqueued a message
	LastError     string                   `json:"last_error,omitempty"` // why the last fire enqueued nothing
	LastErrorCode subjects.Code            `json:"last_error_code,omitempty"`
	Skipped       int64                    `json:"skipped,omitempty"` // fire times passed with no message enqueued for them
	// OverlapSkipped counts the fire times that enqueued nothing because the last fire's message
	// was not finished (Spec.Overlap skip).
	OverlapSkipped int64 `json:"overlap_skipped,omitempty"`
	// Paused: the schedule does not fire until resumed, which fires it next at the first time of
	// Spec.Cron after the resume (From). PausedAt is the Unix ms of the pause, Note the note of the
	// last pause or resume.
	Paused   bool   `json:"paused,omitempty"`
	PausedAt int64  `json:"paused_at,omitempty"`
	Note     string `json:"note,omitempty"`
}

// ScheduleKey is the key of schedule name of queue; names are valid key tokens as they are.
func ScheduleKey(queue, name string) string { return queue + "." + name }

// PutSchedule stores schedule name of queue if its revision is still expect (0: it must not exist;
// it may have been removed, which leaves a marker the create replaces).
func (s *Store) PutSchedule(ctx context.Context, queue, name string, r *ScheduleRecord, expect uint64) (uint64, error) {
	data, err := json.Marshal(r)
	if err != nil {
		return 0, err
	}
	subject := s.schedSubj + ScheduleKey(queue, name)
	rev, err := s.publish(subject, data, expect).Wait(ctx)
	if expect == 0 && errors.Is(err, ErrConflict) {
		return s.createOverMarker(ctx, s.streams[s.schedules], subject, data, err)
	}
	return rev, err
}

// DeleteSchedule removes schedule name of queue if its revision is still expect, with a delete
// marker: after an unclean stop, JetStream can bring back a revision that a later one superseded
// (nats-server#8505), which must not bring a removed schedule back.
func (s *Store) DeleteSchedule(ctx context.Context, queue, name string, expect uint64) error {
	msg := &nats.Msg{Subject: s.schedSubj + ScheduleKey(queue, name), Header: nats.Header{}}
	msg.Header.Set(kvOperationHeader, kvDelete)
	msg.Header.Set(jetstream.ExpectedLastSubjSeqHeader, strconv.FormatUint(expect, 10))
	f, err := s.js.PublishMsgAsync(msg)
	if _, err = (Write{f: f, err: err}).Wait(ctx); err != nil {
		return fmt.Errorf("kv: delete schedule %s/%s: %w", queue, name, err)
	}
	return nil
}

// LoadSchedules calls fn for every schedule (of queue, or of every queue if queue is ""). A record
// that does not decode is passed with bad set.
func (s *Store) LoadSchedules(ctx context.Context, queue string, fn func(queue, name string, r ScheduleRecord, rev uint64, bad error) error) error {
	return s.load(ctx, s.schedules, queue, func(q, name string, value []byte, rev uint64) error {
		var r ScheduleRecord
		if err := json.Unmarshal(value, &r); err != nil {
			return fn(q, name, r, rev, fmt.Errorf("kv: decode schedule %s/%s: %w", q, name, err))
		}
		return fn(q, name, r, rev, nil)
	})
}

// ScheduleRevision reads the revision of schedule name of queue from the leader: 0 if it does not
// exist.
func (s *Store) ScheduleRevision(ctx context.Context, queue, name string) (uint64, error) {
	_, rev, err := s.getKey(ctx, s.schedules, ScheduleKey(queue, name))
	if errors.Is(err, ErrNotFound) {
		return 0, nil
	}
	return rev, err
}
