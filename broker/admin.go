package broker

import (
	"cmp"
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"iter"
	"reflect"
	"slices"
	"strings"
	"time"

	"github.com/natstone/natstone/kv"
	"github.com/natstone/natstone/subjects"
)

// resolveConfig applies the defaults to a create request and validates the result.
func resolveConfig(r subjects.CreateQueueRequest) (subjects.QueueConfig, error) {
	c := subjects.QueueConfig{
		Type:               r.Type,
		ExclusivityKey:     r.ExclusivityKey,
		LeaseMS:            r.LeaseMS,
		InvisibleMS:        r.InvisibleMS,
		MaxAttempts:        r.MaxAttempts,
		RetentionMS:        subjects.DefaultRetention.Milliseconds(),
		MaxPayloadBytes:    r.MaxPayloadBytes,
		MaxMetadataPairs:   r.MaxMetadataPairs,
		MaxRunning:         r.MaxRunning,
		MaxRunningPerValue: r.MaxRunningPerValue,
		EnqueueBlocked:     r.EnqueueBlocked,
		DequeueBlocked:     r.DequeueBlocked,
	}
	if c.Type == "" {
		c.Type = subjects.Simple
	}
	if c.LeaseMS == 0 {
		c.LeaseMS = subjects.DefaultLease.Milliseconds()
	}
	if c.MaxAttempts == 0 {
		c.MaxAttempts = subjects.DefaultMaxAttempts
	}
	if r.RetentionMS != nil {
		c.RetentionMS = *r.RetentionMS
	}
	if c.MaxPayloadBytes == 0 {
		c.MaxPayloadBytes = subjects.DefaultMaxPayloadBytes
	}
	if c.MaxMetadataPairs == 0 {
		c.MaxMetadataPairs = subjects.DefaultMaxMetadataPairs
	}
	withPerValue(&c)
	return c, validateConfig(&c)
}

// validateConfig checks every field of a complete config against the protocol's bounds.
func validateConfig(c *subjects.QueueConfig) error {
	bad := func(format string, args ...any) error {
		return subjects.Errorf(subjects.CodeInvalidConfig, format, args...)
	}
	switch c.Type {
	case subjects.Simple:
		if c.ExclusivityKey != "" {
			return bad("exclusivity_key is only for exclusive queues")
		}
		if c.MaxRunningPerValue != 0 {
			return bad("max_running_per_value is only for exclusive queues")
		}
	case subjects.Exclusive:
		if err := subjects.ValidateMetadata(map[string]string{c.ExclusivityKey: ""}, 1); err != nil {
			return bad("an exclusive queue needs an exclusivity_key of 1 to %d printable bytes", subjects.MaxMetadataKeyLen)
		}
		if c.MaxRunningPerValue < 1 || c.MaxRunningPerValue > subjects.MaxPerValueLimit {
			return bad("max_running_per_value must be 1 to %d, got %d", subjects.MaxPerValueLimit, c.MaxRunningPerValue)
		}
	default:
		return bad("type must be %q or %q, got %q", subjects.Simple, subjects.Exclusive, c.Type)
	}
	type bound struct {
		field     string
		v, lo, hi int64
	}
	for _, b := range []bound{
		{"lease_ms", c.LeaseMS, subjects.MinLease.Milliseconds(), subjects.MaxLease.Milliseconds()},
		{"invisible_ms", c.InvisibleMS, 0, subjects.MaxInvisible.Milliseconds()},
		{"max_attempts", int64(c.MaxAttempts), 1, subjects.MaxAttemptsLimit},
		{"retention_ms", c.RetentionMS, 0, subjects.MaxRetention.Milliseconds()},
		{"max_payload_bytes", int64(c.MaxPayloadBytes), 0, subjects.MaxPayloadBytes},
		{"max_metadata_pairs", int64(c.MaxMetadataPairs), 1, subjects.MaxMetadataPairs},
		{"max_running", int64(c.MaxRunning), 0, subjects.MaxRunningLimit},
	} {
		if b.v < b.lo || b.v > b.hi {
			return bad("%s must be %d to %d, got %d", b.field, b.lo, b.hi, b.v)
		}
	}
	return nil
}

// lookup returns the open queue called name, creating it with the defaults if autoCreate is set and
// auto-creation is enabled.
func (b *Broker) lookup(ctx context.Context, name string, autoCreate bool) (*queue, error) {
	b.mu.Lock()
	q := b.queues[name]
	b.mu.Unlock()
	if q != nil {
		return q, nil
	}
	if !autoCreate || b.cfg.DisableAutoCreate {
		return nil, subjects.Errorf(subjects.CodeQueueNotFound, "no queue %s", name)
	}
	q, _, err := b.createQueue(ctx, name, subjects.CreateQueueRequest{})
	if errors.Is(err, &subjects.Error{Code: subjects.CodeQueueExists}) {
		// Created concurrently with another config: use it.
		b.mu.Lock()
		q = b.queues[name]
		b.mu.Unlock()
		if q != nil {
			return q, nil
		}
	}
	return q, err
}

// lookupForEnqueue returns the queue an enqueue goes to. A queue that does not exist is created with
// the defaults — but only if the messages are valid for it, so a bad request writes nothing.
func (b *Broker) lookupForEnqueue(ctx context.Context, name string, reqs []subjects.EnqueueRequest) (*queue, error) {
	q, err := b.lookup(ctx, name, false)
	if err == nil || b.cfg.DisableAutoCreate {
		return q, err
	}
	cfg, err := resolveConfig(subjects.CreateQueueRequest{})
	if err != nil {
		return nil, err
	}
	if _, err := validateEnqueue(&cfg, name, b.replyBudget(), reqs, b.clock.Now().UnixMilli(), nil); err != nil {
		return nil, err
	}
	return b.lookup(ctx, name, true)
}

// createQueue creates a queue, or returns the existing one if its config is the same.
func (b *Broker) createQueue(ctx context.Context, name string, r subjects.CreateQueueRequest) (*queue, subjects.QueueInfo, error) {
	cfg, err := resolveConfig(r)
	if err != nil {
		return nil, subjects.QueueInfo{}, err
	}
	b.mu.Lock()
	q := b.queues[name]
	b.mu.Unlock()
	if q == nil {
		rec := kv.QueueRecord{Config: cfg, CreatedAt: b.clock.Now().UnixMilli()}
		rev, err := b.store.PutQueue(ctx, name, rec, 0)
		switch {
		case err == nil:
			b.mu.Lock()
			if b.closed {
				b.mu.Unlock()
				return nil, subjects.QueueInfo{}, subjects.Errorf(subjects.CodeUnavailable, "the broker is stopping")
			}
			if q = b.queues[name]; q == nil {
				q = newQueue(b, name, rec, rev)
				b.queues[name] = q
			}
			b.mu.Unlock()
		case errors.Is(err, kv.ErrConflict):
			// Stored by a concurrent create; compare with it below.
			if q, err = b.adopt(ctx, name); err != nil {
				return nil, subjects.QueueInfo{}, err
			}
		default:
			return nil, subjects.QueueInfo{}, unavailable("store queue", err)
		}
	}
	q.mu.Lock()
	defer q.mu.Unlock()
	if err := q.usable(); err != nil {
		return nil, subjects.QueueInfo{}, err
	}
	// The blocked flags are an operator's switches (update): a create that does not set one takes
	// the queue's as it is, so that a service making sure of its queue as it starts is not refused
	// while the queue is paused.
	want := cfg
	if !r.EnqueueBlocked {
		want.EnqueueBlocked = q.cfg.EnqueueBlocked
	}
	if !r.DequeueBlocked {
		want.DequeueBlocked = q.cfg.DequeueBlocked
	}
	if q.cfg != want {
		hint, implied := "update it, or create it as it is", ""
		if q.cfg.Type != want.Type || q.cfg.ExclusivityKey != want.ExclusivityKey {
			hint = "a queue's type and exclusivity key do not change: create it under another name, or delete it (its messages go with it) and create it again"
			if r.MaxRunningPerValue == 0 {
				implied = "max_running_per_value" // the type's default, not the request's
			}
		}
		return nil, subjects.QueueInfo{}, subjects.Errorf(subjects.CodeQueueExists, "queue %s exists with another config (%s): %s", name, configDiff(q.cfg, want, implied), hint)
	}
	return q, q.info(), nil
}

// configDiff names the settings in which a queue's config, have, differs from want, as
// "max_attempts 5, not 3", in the config's order, but for the one named skip.
func configDiff(have, want subjects.QueueConfig, skip string) string {
	var diffs []string
	h, w := reflect.ValueOf(have), reflect.ValueOf(want)
	for i := range h.NumField() {
		if hv, wv := h.Field(i).Interface(), w.Field(i).Interface(); hv != wv {
			name, _, _ := strings.Cut(h.Type().Field(i).Tag.Get("json"), ",")
			if name == skip {
				continue
			}
			format := "%s %v, not %v"
			if h.Field(i).Kind() == reflect.String {
				format = "%s %q, not %q"
			}
			diffs = append(diffs, fmt.Sprintf(format, name, hv, wv))
		}
	}
	return strings.Join(diffs, "; ")
}

// adopt loads a queue another writer stored.
func (b *Broker) adopt(ctx context.Context, name string) (*queue, error) {
	rec, rev, err := b.store.GetQueue(ctx, name)
	if err != nil {
		return nil, unavailable("load queue", err)
	}
	b.mu.Lock()
	defer b.mu.Unlock()
	q := b.queues[name]
	if q == nil {
		q = newQueue(b, name, rec, rev)
		b.queues[name] = q
	}
	return q, nil
}

// info describes the queue. Called with q.mu held.
func (q *queue) info() subjects.QueueInfo {
	return subjects.QueueInfo{
		Name:      q.name,
		Config:    q.cfg,
		Revision:  q.cfgRev,
		CreatedAt: time.UnixMilli(q.createdAt).UTC(),
		Counts:    q.countsLocked(),
	}
}

// update changes the fields of a queue's config that the request sets.
func (q *queue) update(ctx context.Context, r subjects.UpdateQueueRequest) (subjects.QueueInfo, error) {
	q.mu.Lock()
	defer q.mu.Unlock()
	if err := q.usable(); err != nil {
		return subjects.QueueInfo{}, err
	}
	for again := false; ; again = true {
		c := q.cfg
		setIf(&c.LeaseMS, r.LeaseMS)
		setIf(&c.InvisibleMS, r.InvisibleMS)
		setIf(&c.MaxAttempts, r.MaxAttempts)
		setIf(&c.RetentionMS, r.RetentionMS)
		setIf(&c.MaxPayloadBytes, r.MaxPayloadBytes)
		setIf(&c.MaxMetadataPairs, r.MaxMetadataPairs)
		setIf(&c.MaxRunning, r.MaxRunning)
		setIf(&c.MaxRunningPerValue, r.MaxRunningPerValue)
		setIf(&c.EnqueueBlocked, r.EnqueueBlocked)
		setIf(&c.DequeueBlocked, r.DequeueBlocked)
		if err := validateConfig(&c); err != nil {
			return subjects.QueueInfo{}, err
		}
		stale := r.Revision != 0 && r.Revision != q.cfgRev
		setsNothing := r == subjects.UpdateQueueRequest{Revision: r.Revision}
		if c == q.cfg && (!stale || !setsNothing) {
			// Nothing to write. With a stale revision too, so that the retry of an update that was
			// stored (its reply lost, or answered unavailable) succeeds; one that sets no field
			// only asks whether the revision is current.
			return q.info(), nil
		}
		if stale {
			return subjects.QueueInfo{}, subjects.Errorf(subjects.CodeRevisionMismatch, "queue %s is at revision %d, not %d", q.name, q.cfgRev, r.Revision)
		}
		// Held across the write: config changes are rare and must not interleave with each other.
		want := kv.QueueRecord{Config: c, CreatedAt: q.createdAt}
		rev, err := q.b.store.PutQueue(ctx, q.name, want, q.cfgRev)
		for try := 0; err != nil && !errors.Is(err, kv.ErrConflict) && try < rewrites; try++ {
			// Unknown: the same write again, which its expected revision makes idempotent.
			rev, err = q.b.store.PutQueue(ctx, q.name, want, q.cfgRev)
		}
		if err == nil {
			q.setConfig(c, rev)
			return q.info(), nil
		}
		if !errors.Is(err, kv.ErrConflict) {
			return subjects.QueueInfo{}, unavailable("store queue", err)
		}
		// An earlier attempt of this change landed (its acknowledgement lost, here or in an earlier
		// request), or another writer's did: storage's config is the queue's from now on.
		stored, srev, err := q.b.store.GetQueue(ctx, q.name)
		if err != nil {
			return subjects.QueueInfo{}, unavailable("read queue", err)
		}
		q.setConfig(stored.Config, srev)
		switch {
		case stored == want:
			return q.info(), nil
		case r.Revision != 0 || again:
			return subjects.QueueInfo{}, subjects.Errorf(subjects.CodeRevisionMismatch, "queue %s changed in storage; get it and retry", q.name)
		}
		// Without a revision the update applies whatever the config: once more, onto storage's.
	}
}

// setConfig makes c, stored at revision rev, the queue's config. Called with q.mu held.
func (q *queue) setConfig(c subjects.QueueConfig, rev uint64) {
	retention := c.RetentionMS != q.cfg.RetentionMS
	withPerValue(&c)
	q.cfg, q.cfgRev = c, rev
	q.pending.SetPerValue(c.MaxRunningPerValue)
	if retention {
		q.gc.offset, q.gc.armedAt = c.RetentionMS, 0 // every gc deadline moved, the order with none
	}
	q.settle()
}

func setIf[T any](dst *T, v *T) {
	if v != nil {
		*dst = *v
	}
}

// deleteQueue deletes a queue with all its messages. Waiting dequeues end empty; requests in
// progress on it fail. The queue stays in the broker's map, closed, until storage has forgotten
// it, so that an enqueue cannot auto-create it again from its half-deleted config meanwhile; a delete
// that failed half way can be sent again.
func (b *Broker) deleteQueue(ctx context.Context, q *queue) (subjects.DeleteReply, error) {
	q.mu.Lock()
	if !q.deleting {
		if err := q.usable(); err != nil {
			q.mu.Unlock()
			return subjects.DeleteReply{}, err
		}
		q.deleting = true
		q.deleted = q.entries.len()
		q.close(subjects.Errorf(subjects.CodeUnavailable, "queue %s is being deleted", q.name))
	}
	// Let writes in flight land first, so none lands after the purge. Those of unknown outcome are
	// asked about now, since the closed queue's doubt timer no longer does: once storage answers,
	// none of them can land later (its revision is taken, or it is known to have landed). That
	// goes too for writes that go back into doubt while this waits (the doubt timer was asking
	// about them as the queue closed): an entry in doubt stays busy until someone asks again.
	doubted := func() error {
		if q.doubts() == 0 {
			return nil
		}
		if !q.b.claim.held() { // issued again now, a write could land after another broker read it
			return errNotServing
		}
		q.resolveDoubts()
		if n := q.doubts(); n > 0 {
			return subjects.Errorf(subjects.CodeUnavailable, "delete queue %s: storage has not told the outcome of %d writes; retry", q.name, n)
		}
		return nil
	}
	if err := doubted(); err != nil {
		q.mu.Unlock()
		return subjects.DeleteReply{}, err
	}
	// (Waiting releases q.mu, and the writes that land may change q.entries: walk a copy.)
	for _, e := range slices.Collect(q.entries.all()) {
		for e.busy() {
			err := doubted()
			if err == nil && e.busy() { // (asked about, its write may have ended)
				err = q.awaitIdle(ctx)
			}
			if err != nil {
				q.mu.Unlock()
				return subjects.DeleteReply{}, unavailable("delete queue", err)
			}
		}
	}
	n := q.deleted
	q.mu.Unlock()
	// The purges below carry no revision: they must not run once another broker may serve the
	// store (the waits above can take long, and the claim is checked only before a request runs).
	ctx, cancel, err := b.claim.bound(ctx)
	if err != nil {
		return subjects.DeleteReply{}, unavailable("delete queue", err)
	}
	defer cancel()
	if err := b.sched.lock(ctx); err != nil { // no schedule of the queue is written meanwhile
		return subjects.DeleteReply{}, err
	}
	err = b.store.DeleteQueue(ctx, q.name)
	if err == nil {
		b.sched.dropQueue(q.name)
	}
	b.sched.unlock()
	if err != nil {
		return subjects.DeleteReply{}, unavailable("delete queue", err)
	}
	if o, ok := b.observer.(QueueObserver); ok {
		// While the queue is still in b.queues, deleting: no queue of the name can be made again
		// and count transitions that this would remove.
		o.QueueDeleted(q.name)
	}
	b.mu.Lock()
	if b.queues[q.name] == q {
		delete(b.queues, q.name)
	}
	b.mu.Unlock()
	q.mu.Lock()
	q.closed = subjects.Errorf(subjects.CodeQueueNotFound, "queue %s was deleted", q.name)
	q.mu.Unlock()
	return subjects.DeleteReply{Name: q.name, Messages: n}, nil
}

// list describes the queues after r.After, by name: at most r.Limit, and no more than one reply
// carries (replyBudget), with More set when some were left out.
func (b *Broker) list(r subjects.ListRequest) (subjects.ListReply, error) {
	if r.After != "" && subjects.ValidateQueueName(r.After) != nil {
		return subjects.ListReply{}, subjects.Errorf(subjects.CodeInvalidQueueName, "after must be a queue name (1 to %d characters of A-Z a-z 0-9 _ -), got %q", subjects.MaxQueueNameLen, r.After)
	}
	limit := cmp.Or(r.Limit, subjects.MaxListLimit)
	if limit < 1 || limit > subjects.MaxListLimit {
		return subjects.ListReply{}, subjects.Errorf(subjects.CodeOutOfRange, "limit must be 1 to %d, got %d", subjects.MaxListLimit, limit)
	}
	b.mu.Lock()
	qs := make([]*queue, 0, len(b.queues))
	for name, q := range b.queues {
		if name > r.After {
			qs = append(qs, q)
		}
	}
	b.mu.Unlock()
	slices.SortFunc(qs, func(a, b *queue) int { return strings.Compare(a.name, b.name) })
	infos := func(yield func(subjects.QueueInfo) bool) {
		for _, q := range qs {
			q.mu.Lock()
			var info subjects.QueueInfo
			usable := q.usable() == nil
			if usable {
				info = q.info()
			}
			q.mu.Unlock()
			if usable && !yield(info) {
				return
			}
		}
	}
	var out subjects.ListReply
	var err error
	out.Queues, out.More, err = fitReply(b.replyBudget(), limit, infos)
	return out, err
}

// fitReply takes items in their order, at most limit of them (0: no limit) and as many as a reply
// of budget bytes carries, each counted at its JSON size (one at least, whatever its size). more
// says that some were left out.
func fitReply[T any](budget, limit int, items iter.Seq[T]) (out []T, more bool, err error) {
	out, size := []T{}, 0
	for it := range items {
		data, err := json.Marshal(&it)
		if err != nil {
			return nil, false, err
		}
		if size += len(data) + 1; limit > 0 && len(out) == limit || size > budget && len(out) > 0 {
			return out, true, nil
		}
		out = append(out, it)
	}
	return out, false, nil
}
