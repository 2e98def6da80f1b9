package broker

import (
	"cmp"
	"context"
	"errors"
	"time"

	"github.com/natstone/natstone/kv"
	"github.com/natstone/natstone/subjects"
)

// enqueued is one validated message of an enqueue request.
type enqueued struct {
	rec     kv.Record // the record to create (BodySeq set once the payload is stored)
	payload []byte
	dupOf   int      // index of an earlier message of the same request with this id, else -1
	e       *entry   // the entry (new, or the existing one for a duplicate)
	create  *change  // the record's write, for a new message
	dup     bool     // the id already existed: nothing is written for it
	body    kv.Write // the payload write in flight
}

// validateEnqueue checks every message of a request to queue against the queue's config and builds
// its record; a message without a client id gets its id later, under the queue's lock. budget is
// what a reply may carry (Broker.replyBudget): a message that would not fit in a dequeue's reply
// alone could never be delivered. Nothing is written unless every message is valid. A batch's
// error names the message: messages[i]. stored, if not nil, tells whether the queue holds a
// message of an id: one it holds is let through the limits of the queue's config (its payload's
// size, its metadata's pairs), for its enqueue's retry to be answered duplicate, as before those
// limits were lowered.
func validateEnqueue(cfg *subjects.QueueConfig, queue string, budget int, reqs []subjects.EnqueueRequest, now int64, stored func(id string) bool) ([]*enqueued, error) {
	out := make([]*enqueued, len(reqs))
	seen := make(map[string]int, len(reqs))
	for i := range reqs {
		m, err := validateMessage(cfg, &reqs[i], now)
		if err != nil && stored != nil && reqs[i].ID != "" && configLimit(err) && stored(reqs[i].ID) {
			wide := *cfg
			wide.MaxPayloadBytes, wide.MaxMetadataPairs = subjects.MaxPayloadBytes, subjects.MaxMetadataPairs
			m, err = validateMessage(&wide, &reqs[i], now)
		}
		if err == nil {
			err = fitsReply(queue, budget, &m.rec)
		}
		if err != nil {
			var e *subjects.Error
			if len(reqs) > 1 && errors.As(err, &e) {
				err = subjects.Errorf(e.Code, "messages[%d]: %s", i, e.Message)
			}
			return nil, err
		}
		if id := m.rec.ID; id != "" {
			if j, ok := seen[id]; ok {
				m.dupOf = j
			}
			seen[id] = i
		}
		out[i] = m
	}
	return out, nil
}

// configLimit reports whether err refuses a message for a limit that a queue's config sets below
// natstone's own: a payload's size, a metadata's pairs.
func configLimit(err error) bool {
	var e *subjects.Error
	return errors.As(err, &e) && (e.Code == subjects.CodePayloadTooLarge || e.Code == subjects.CodeInvalidMetadata)
}

// validateMessage checks one message of an enqueue request and builds its record.
func validateMessage(cfg *subjects.QueueConfig, r *subjects.EnqueueRequest, now int64) (*enqueued, error) {
	m := &enqueued{dupOf: -1}
	payload, err := r.PayloadBytes()
	if err != nil {
		return nil, err
	}
	if len(payload) > cfg.MaxPayloadBytes {
		return nil, subjects.Errorf(subjects.CodePayloadTooLarge, "payload of %d bytes, the queue accepts at most %d", len(payload), cfg.MaxPayloadBytes)
	}
	m.payload = payload
	if err := subjects.ValidateMetadata(r.Metadata, cfg.MaxMetadataPairs); err != nil {
		return nil, err
	}
	if cfg.Type == subjects.Exclusive {
		if v, ok := r.Metadata[cfg.ExclusivityKey]; !ok || v == "" {
			return nil, subjects.Errorf(subjects.CodeMissingExclusivityKey, "exclusive queue: metadata must carry a non-empty %q", cfg.ExclusivityKey)
		}
	}
	invisible := cfg.InvisibleMS
	switch {
	case r.InvisibleMS != nil && r.VisibleAt != nil:
		return nil, subjects.Errorf(subjects.CodeBadRequest, "give invisible_ms or visible_at, not both")
	case r.InvisibleMS != nil:
		invisible = *r.InvisibleMS
		if err := checkRange("invisible_ms", invisible, 0, subjects.MaxInvisible); err != nil {
			return nil, err
		}
	case r.VisibleAt != nil:
		at, err := visibleAtMS(*r.VisibleAt, now)
		if err != nil {
			return nil, err
		}
		invisible = max(at-now, 0) // a time that has come: pending at once
	}
	var leaseMS int64 // 0: the queue's, as on dequeue and extend
	if r.LeaseMS != nil && *r.LeaseMS != 0 {
		leaseMS = *r.LeaseMS
		if err := checkRange("lease_ms", leaseMS, subjects.MinLease.Milliseconds(), subjects.MaxLease); err != nil {
			return nil, err
		}
	}
	maxAttempts := cfg.MaxAttempts
	if r.MaxAttempts != nil {
		if *r.MaxAttempts < 1 || *r.MaxAttempts > subjects.MaxAttemptsLimit {
			return nil, subjects.Errorf(subjects.CodeOutOfRange, "max_attempts must be 1 to %d, got %d", subjects.MaxAttemptsLimit, *r.MaxAttempts)
		}
		maxAttempts = int(*r.MaxAttempts)
	}
	if r.ID != "" {
		if err := subjects.ValidateID(r.ID); err != nil {
			return nil, err
		}
	}
	prio := now + invisible // when it can run: FIFO by readiness, as a schedule's fire time
	if r.Priority != nil {
		prio = *r.Priority
	}
	m.rec = kv.Record{
		ID:          r.ID,
		State:       subjects.StatePending,
		Priority:    prio,
		PayloadSize: len(payload),
		Metadata:    r.Metadata,
		Version:     1,
		MaxAttempts: maxAttempts,
		LeaseMS:     leaseMS,
		EnqueuedAt:  now,
		VisibleAt:   now + invisible,
		UpdatedAt:   now,
	}
	if invisible > 0 {
		m.rec.State = subjects.StateInvisible
	}
	return m, nil
}

// generatedIDLen is the length of the ids the broker gives messages (NUIDs, of characters JSON
// writes as they are).
const generatedIDLen = 22

// fitsReply checks that the message of r, alone, fits in a dequeue's reply within budget.
func fitsReply(queue string, budget int, r *kv.Record) error {
	share := replyShare(queue, r.ID, r.PayloadSize, r.Metadata)
	if r.ID == "" {
		share += generatedIDLen // the id it will get
	}
	if share > budget {
		return subjects.Errorf(subjects.CodePayloadTooLarge,
			"a dequeue's reply would carry this message in up to %d bytes, and the NATS server's max_payload leaves %d: send a smaller payload or metadata, or raise max_payload", share, budget)
	}
	return nil
}

// visibleAtMS is a visible_at in Unix ms, not before the time asked (a fraction of a millisecond
// goes up to the next one); out_of_range if it is more than subjects.MaxInvisible after now.
func visibleAtMS(t time.Time, now int64) (int64, error) {
	at := t.UnixMilli()
	if t.Nanosecond()%int(time.Millisecond) != 0 {
		at++
	}
	if at-now > subjects.MaxInvisible.Milliseconds() {
		return 0, subjects.Errorf(subjects.CodeOutOfRange, "visible_at must be at most %d days ahead of the broker's clock (%s), got %s", subjects.MaxInvisible/(24*time.Hour), time.UnixMilli(now).UTC().Format(time.RFC3339Nano), t.Format(time.RFC3339Nano))
	}
	return at, nil
}

// checkRange checks that a millisecond field lies in [min, max].
func checkRange(field string, v, min int64, max time.Duration) error {
	if v < min || v > max.Milliseconds() {
		return subjects.Errorf(subjects.CodeOutOfRange, "%s must be %d to %d, got %d", field, min, max.Milliseconds(), v)
	}
	return nil
}

// enqueue stores the messages of one request: payloads first (each payload's stream sequence becomes
// its record's BodySeq and FIFO tie-breaker), then the records, created with CAS so an id exists once.
func (q *queue) enqueue(ctx context.Context, reqs []subjects.EnqueueRequest) ([]subjects.EnqueueReply, error) {
	q.mu.Lock()
	if err := q.usable(); err != nil {
		q.mu.Unlock()
		return nil, err
	}
	cfg := q.cfg
	now := q.now()
	q.mu.Unlock()
	// Validation is pure and, for a batch of a thousand, not free: not under the queue's lock.
	ms, err := validateEnqueue(&cfg, q.name, q.b.replyBudget(), reqs, now, q.holds)
	if err != nil {
		return nil, err // a bad request is bad, blocked or not: its retry will not do
	}
	q.mu.Lock()
	if q.cfg.EnqueueBlocked {
		q.mu.Unlock()
		return nil, subjects.Errorf(subjects.CodeQueueBlocked, "queue %s: enqueue is blocked", q.name)
	}
	for _, m := range ms {
		switch {
		case m.rec.ID == "":
			m.rec.ID = q.ids.Next()
		case m.dupOf < 0 && q.entries.get(m.rec.ID) != nil:
			m.dup = true
		}
	}
	q.mu.Unlock()

	issued := q.b.bodyAcks.current() // the payloads' first writes wait under it
	for _, m := range ms {
		if !m.dup && m.dupOf < 0 {
			m.body = q.b.store.WriteBody(q.name, m.rec.ID, m.payload)
		}
	}
	var bodyErr error
	for _, m := range ms {
		if m.dup || m.dupOf >= 0 {
			continue
		}
		seq, err := q.b.bodyAcks.wait(ctx, issued, m.body)
		for again := (reissue{elections: bodyReissues}); again.free(ctx, q.b, q.b.bodyAcks, err); {
			if errors.Is(err, errAcksLost) {
				// The old leader may have dropped the payload. It is stored again; should the
				// first have landed after all, no record references it, and the next start
				// removes it (Broker.dropOrphans).
				q.log().Warn("payload write outcome not known yet; storing it again", "message_id", m.rec.ID, "error", err)
			}
			seq, err = q.b.bodyAcks.issue(ctx, func() kv.Write { return q.b.store.WriteBody(q.name, m.rec.ID, m.payload) })
		}
		if err != nil {
			bodyErr = cmp.Or(bodyErr, err)
			continue
		}
		m.rec.BodySeq = seq
	}
	if bodyErr != nil {
		q.dropBodies(ctx, storedBodies(ms))
		if ctx.Err() == nil { // storage's failure, not the request's end
			q.b.payloadFailed(q.name, bodyErr)
		}
		return nil, unavailable("store payload", bodyErr)
	}
	if q.testAfterBodies != nil {
		q.testAfterBodies()
	}

	q.mu.Lock()
	err = q.usable()
	for _, m := range ms {
		if err == nil && m.dup && m.dupOf < 0 && q.entries.get(m.rec.ID) == nil {
			// It existed a moment ago (so no payload was written for it) and was collected since.
			err = subjects.Errorf(subjects.CodeUnavailable, "message %q was garbage-collected during this enqueue; retry", m.rec.ID)
		}
	}
	if err != nil {
		q.mu.Unlock()
		q.dropBodies(ctx, storedBodies(ms))
		return nil, err
	}
	defer q.mu.Unlock()
	var cs []*change
	var orphans []uint64
	for _, m := range ms {
		if m.dupOf >= 0 {
			continue
		}
		if e := q.entries.get(m.rec.ID); e != nil {
			// Created meanwhile by a concurrent request with the same id: our payload is not needed.
			if !m.dup {
				orphans = append(orphans, m.rec.BodySeq)
			}
			m.e, m.dup = e, true
			continue
		}
		e := &entry{ID: m.rec.ID} // not stored yet (no state), and not placed until it is
		q.setItem(e, &m.rec)
		q.track(e)
		m.e, m.create = e, &change{e: e, next: m.rec}
		cs = append(cs, m.create)
	}
	q.commit(cs)
	for _, m := range ms {
		if m.create == nil || m.create.err == nil {
			continue
		}
		if e := q.entries.get(m.rec.ID); e != nil && e.rev != 0 {
			// Another writer created it first, and its record was taken: a duplicate, whose
			// payload is not needed.
			m.e, m.dup = e, true
			orphans = append(orphans, m.rec.BodySeq)
			continue
		}
		return nil, unavailable("store message", m.create.err)
	}
	replies := make([]subjects.EnqueueReply, len(ms))
	for i, m := range ms {
		if m.dupOf >= 0 {
			replies[i] = replies[m.dupOf]
			replies[i].Duplicate = true
			continue
		}
		e := m.e
		if m.dup {
			// Wait out a write in flight so the reply shows a stored record.
			if err := q.waitIdle(ctx, e); err != nil {
				return nil, unavailable("wait for message", err)
			}
			if q.entries.get(e.ID) != e || e.rev == 0 {
				// Its write failed (a concurrent enqueue of the id), or it was collected meanwhile.
				return nil, subjects.Errorf(subjects.CodeUnavailable, "message %q changed while this enqueue waited for it (a concurrent enqueue of the id failed, or the message was collected); retry", e.ID)
			}
		}
		replies[i] = subjects.EnqueueReply{
			ID:        e.ID,
			State:     e.State(),
			Priority:  e.Priority,
			Version:   e.Version(),
			Duplicate: m.dup,
			VisibleAt: time.UnixMilli(e.VisibleAt()).UTC(),
		}
	}
	if len(orphans) > 0 {
		q.mu.Unlock()
		q.dropBodies(ctx, orphans)
		q.mu.Lock()
	}
	return replies, nil
}

// bodyReissues bounds how often an enqueue stores a payload again because the payloads stream
// elected a leader while it waited for the payload's acknowledgement.
const bodyReissues = 3

// storedBodies lists the payloads an enqueue stored: those of its messages that were neither
// duplicates of a stored message nor of an earlier one in the batch.
func storedBodies(ms []*enqueued) []uint64 {
	var seqs []uint64
	for _, m := range ms {
		if m.dupOf < 0 && m.rec.BodySeq != 0 {
			seqs = append(seqs, m.rec.BodySeq)
		}
	}
	return seqs
}

// dropBodies deletes payloads an enqueue stored but no record will reference: all of them when
// the request fails (nothing is written for a request that fails, also when the request's own
// time is what ran out), and those of messages a concurrent request created first. One that
// cannot be deleted now, or whose write's outcome was unknown, is left to the next start
// (Broker.dropOrphans).
func (q *queue) dropBodies(ctx context.Context, seqs []uint64) {
	if len(seqs) == 0 {
		return
	}
	dctx, cancel := context.WithTimeout(context.WithoutCancel(ctx), q.b.cfg.WriteTimeout)
	defer cancel()
	for _, seq := range seqs {
		if err := q.b.store.DeleteBody(dctx, seq); err != nil {
			q.log().Warn("payload no record references not deleted", "body_seq", seq, "error", err)
		}
	}
}

// payloadFailed records an enqueue of queue whose payloads storage did not take (err): for the
// observer, and in the log at most once every refusedLogEvery, with how many since. No record write
// shows such a failure: the enqueue fails before its records are written.
func (b *Broker) payloadFailed(queue string, err error) {
	if b.payloads != nil {
		b.payloads.PayloadWriteFailed(err)
	}
	if n := b.unstored.note(); n > 0 {
		b.log.Warn("payloads not stored: enqueues answered unavailable", "enqueues", n, "last_queue", queue, "error", err)
	}
}
