package workers

import (
	"context"
	"time"

	"github.com/natstone/natstone/subjects"
)

// QueueOpts configures a new queue. Every field is optional: a zero field takes the broker's default
// (docs/protocol.md, "create"). Durations are sent in whole milliseconds, rounded down.
type QueueOpts struct {
	// Type is subjects.Simple (the default) or subjects.Exclusive.
	Type subjects.QueueType
	// ExclusivityKey is the metadata key whose value is exclusive; required for an exclusive queue.
	ExclusivityKey string
	// Lease is the lease of a dequeue that does not ask for one. Default 30s.
	Lease time.Duration
	// Invisible is the invisibility of an enqueue that does not ask for one. Default 0.
	Invisible time.Duration
	// MaxAttempts is how many times a message may be dequeued. Default 5.
	MaxAttempts int
	// Retention is how long completed, canceled and errored messages are kept; nil means the default
	// (24h), a pointer to 0 means collect at once.
	Retention *time.Duration
	// MaxPayloadBytes is the largest payload accepted. Default 32 KiB.
	MaxPayloadBytes int
	// MaxMetadataPairs is the most metadata pairs a message may carry. Default 8.
	MaxMetadataPairs int
	// MaxRunning is the most messages that may run at once, whatever the workers: a dequeue leases
	// no more than make up the difference. Default 0: no limit.
	MaxRunning int
	// MaxRunningPerValue is, in an exclusive queue, the most messages of one exclusivity value
	// that may run at once. Default 1 (one at a time); a simple queue has none.
	MaxRunningPerValue int
	// EnqueueBlocked and DequeueBlocked pause the queue's intake and its dequeues.
	EnqueueBlocked, DequeueBlocked bool
}

// QueueUpdate changes a queue's config: only the non-nil fields change. A non-zero Revision makes the
// update a compare-and-swap on the config's revision (QueueInfo.Revision): it fails with
// ErrRevisionMismatch if the config changed since. The type and exclusivity key cannot change.
type QueueUpdate struct {
	// Revision, if not 0, is the config's revision the update expects.
	Revision uint64
	// Lease is the lease of a dequeue that does not ask for one (subjects.MinLease to
	// subjects.MaxLease).
	Lease *time.Duration
	// Invisible is the invisibility of an enqueue that does not ask for one (0: none).
	Invisible *time.Duration
	// MaxAttempts is how many times a message may be dequeued; messages keep the count they were
	// enqueued with.
	MaxAttempts *int
	// Retention is how long finished messages are kept; a pointer to 0 collects them at once, as in
	// QueueOpts.
	Retention *time.Duration
	// MaxPayloadBytes and MaxMetadataPairs bound the messages enqueued from then on.
	MaxPayloadBytes  *int
	MaxMetadataPairs *int
	// MaxRunning is the most messages that may run at once (0: no limit).
	MaxRunning *int
	// MaxRunningPerValue is an exclusive queue's most running messages of one value, 1 or more.
	MaxRunningPerValue *int
	// EnqueueBlocked and DequeueBlocked pause the queue's intake and its dequeues, or resume them.
	EnqueueBlocked *bool
	DequeueBlocked *bool
}

// CreateQueue creates the queue name with opts (nil for the defaults). Creating an existing queue
// with the same config returns it, paused or not (opts' blocked flags, when set, must match);
// with a different config it fails with ErrQueueExists. Other errors: ErrInvalidQueueName,
// ErrInvalidConfig.
func (c *Client) CreateQueue(ctx context.Context, name string, opts *QueueOpts) (subjects.QueueInfo, error) {
	var o QueueOpts
	if opts != nil {
		o = *opts
	}
	req := subjects.CreateQueueRequest{
		Type:               o.Type,
		ExclusivityKey:     o.ExclusivityKey,
		LeaseMS:            ms(o.Lease),
		InvisibleMS:        ms(o.Invisible),
		MaxAttempts:        o.MaxAttempts,
		RetentionMS:        msPtr(o.Retention),
		MaxPayloadBytes:    o.MaxPayloadBytes,
		MaxMetadataPairs:   o.MaxMetadataPairs,
		MaxRunning:         o.MaxRunning,
		MaxRunningPerValue: o.MaxRunningPerValue,
		EnqueueBlocked:     o.EnqueueBlocked,
		DequeueBlocked:     o.DequeueBlocked,
	}
	var info subjects.QueueInfo
	err := c.request(ctx, subjects.OpCreate, name, req, &info)
	return info, err
}

// Queue returns the queue's config, revision and counts. Errors: ErrQueueNotFound.
func (c *Client) Queue(ctx context.Context, name string) (subjects.QueueInfo, error) {
	var info subjects.QueueInfo
	err := c.request(ctx, subjects.OpInfo, name, nil, &info)
	return info, err
}

// UpdateQueue applies u (nil changes nothing) and returns the queue's new state. Errors:
// ErrQueueNotFound, ErrInvalidConfig, ErrRevisionMismatch.
func (c *Client) UpdateQueue(ctx context.Context, name string, u *QueueUpdate) (subjects.QueueInfo, error) {
	var req subjects.UpdateQueueRequest
	if u != nil {
		req = subjects.UpdateQueueRequest{
			Revision:           u.Revision,
			LeaseMS:            msPtr(u.Lease),
			InvisibleMS:        msPtr(u.Invisible),
			MaxAttempts:        u.MaxAttempts,
			RetentionMS:        msPtr(u.Retention),
			MaxPayloadBytes:    u.MaxPayloadBytes,
			MaxMetadataPairs:   u.MaxMetadataPairs,
			MaxRunning:         u.MaxRunning,
			MaxRunningPerValue: u.MaxRunningPerValue,
			EnqueueBlocked:     u.EnqueueBlocked,
			DequeueBlocked:     u.DequeueBlocked,
		}
	}
	var info subjects.QueueInfo
	err := c.request(ctx, subjects.OpUpdate, name, req, &info)
	return info, err
}

// DeleteQueue deletes the queue with all its messages. Dequeues long-polling on it return empty.
// Errors: ErrQueueNotFound.
func (c *Client) DeleteQueue(ctx context.Context, name string) (subjects.DeleteReply, error) {
	var r subjects.DeleteReply
	err := c.request(ctx, subjects.OpDelete, name, nil, &r)
	return r, err
}

// ListOpts are the options of ListQueues.
type ListOpts struct {
	// After lists the queues whose names sort after it (byte order): the last name of the page
	// before. It need not be a queue's, but must be a valid name.
	After string
	// Limit is the most queues of the page, 1 to subjects.MaxListLimit; 0: as many as one reply
	// carries.
	Limit int
}

// ListQueues returns one page of the queues, sorted by name: those after opts.After, at most
// opts.Limit of them. more says that queues after the last were left out: ask for the next page
// with After its name. Errors: ErrInvalidQueueName (After), ErrOutOfRange (Limit).
func (c *Client) ListQueues(ctx context.Context, opts *ListOpts) (queues []subjects.QueueInfo, more bool, err error) {
	var req any // without options, no body, which a broker of any version takes
	if opts != nil && (opts.After != "" || opts.Limit != 0) {
		req = subjects.ListRequest{After: opts.After, Limit: opts.Limit}
	}
	var r subjects.ListReply
	if err := c.request(ctx, subjects.OpList, "", req, &r); err != nil {
		return nil, false, err
	}
	return r.Queues, r.More && len(r.Queues) > 0, nil
}

// Queues returns every queue, sorted by name: as many list requests as the replies need (each
// carries what fits in the server's max_payload).
func (c *Client) Queues(ctx context.Context) ([]subjects.QueueInfo, error) {
	var all []subjects.QueueInfo
	var req any // the first request has no body, which a broker of any version takes
	for {
		var r subjects.ListReply
		if err := c.request(ctx, subjects.OpList, "", req, &r); err != nil {
			return nil, err
		}
		all = append(all, r.Queues...)
		if !r.More || len(r.Queues) == 0 {
			return all, nil
		}
		req = subjects.ListRequest{After: r.Queues[len(r.Queues)-1].Name}
	}
}
