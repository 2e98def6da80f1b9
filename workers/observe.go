package workers

import (
	"context"
	"time"

	"github.com/natstone/natstone/subjects"
)

// StatsOpts are the optional settings of Stats.
type StatsOpts struct {
	// Filter counts and ages only the messages whose metadata has every pair.
	Filter map[string]string
	// ExpiringWithin lists the leases that end within this long (at most subjects.MaxExpiringWithin).
	// Default subjects.DefaultExpiringWithin.
	ExpiringWithin time.Duration
	// ExpiringLimit bounds how many expiring leases are listed (at most subjects.MaxExpiringLimit).
	// Default subjects.DefaultExpiringLimit.
	ExpiringLimit int
}

// Stats returns queue's current view: counts by state, how long the oldest pending message has
// waited, transition rates over the last minute and totals, and the leases about to expire. opts may
// be nil. Errors: ErrQueueNotFound, ErrInvalidMetadata, ErrOutOfRange.
func (c *Client) Stats(ctx context.Context, queue string, opts *StatsOpts) (subjects.StatsReply, error) {
	var o StatsOpts
	if opts != nil {
		o = *opts
	}
	req := subjects.StatsRequest{Filter: o.Filter, ExpiringWithinMS: ms(o.ExpiringWithin), ExpiringLimit: o.ExpiringLimit}
	var r subjects.StatsReply
	err := c.request(ctx, subjects.OpStats, queue, req, &r)
	return r, err
}

// BrowseOpts are the optional settings of Browse.
type BrowseOpts struct {
	// Filter lists only the messages whose metadata has every pair.
	Filter map[string]string
	// Limit bounds how many messages are returned (1 to subjects.MaxBrowseLimit). Default
	// subjects.DefaultBrowseLimit.
	Limit int
	// After is the next of an earlier Browse: this one returns the page after it.
	After string
}

// Browse lists queue's messages in state, without payloads and without changing them, in that
// state's order: pending ones earliest deadline first, invisible ones by when they become pending,
// running ones by lease expiry, terminal ones by when they ended. next is empty when no more
// matched; else it is the BrowseOpts.After of the next page. opts may be nil. Errors:
// ErrQueueNotFound, ErrBadRequest (an unknown state, an After no Browse gave), ErrInvalidMetadata,
// ErrOutOfRange.
func (c *Client) Browse(ctx context.Context, queue string, state subjects.State, opts *BrowseOpts) (msgs []Message, next string, err error) {
	var o BrowseOpts
	if opts != nil {
		o = *opts
	}
	req := subjects.BrowseRequest{State: state, Filter: o.Filter, Limit: o.Limit, After: o.After}
	var r subjects.BrowseReply
	if err := c.request(ctx, subjects.OpBrowse, queue, req, &r); err != nil {
		return nil, "", err
	}
	msgs = make([]Message, len(r.Messages))
	for i := range r.Messages {
		msgs[i] = newMessage(&r.Messages[i])
	}
	return msgs, r.Next, nil
}

// History returns message id's transitions in version order with the time spent in each state, read
// from the events stream: also after the message was garbage-collected, for as long as the stream
// keeps its events. limit 0 means subjects.DefaultHistoryLimit. Errors: ErrMessageNotFound (no event
// of id is retained), ErrInvalidID, ErrOutOfRange, ErrUnavailable (the broker runs without events).
func (c *Client) History(ctx context.Context, queue, id string, limit int) (subjects.HistoryReply, error) {
	var r subjects.HistoryReply
	err := c.request(ctx, subjects.OpHistory, queue, subjects.HistoryRequest{ID: id, Limit: limit}, &r)
	return r, err
}
