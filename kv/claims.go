package kv

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"strconv"
	"time"

	"github.com/nats-io/nats.go"
	"github.com/nats-io/nats.go/jetstream"
)

// claimKey is the key of the claims bucket that says which broker serves the store: every queue.
// Brokers that own only some queues would each claim keys of their own.
const claimKey = "broker"

// Claim is the value of the store's claim: the broker that serves it, and the lease under which it
// does. Its holder rewrites it every few seconds; a broker that sees it unchanged for TTL may take
// it over.
type Claim struct {
	// Broker identifies the broker, randomly, for its life.
	Broker string `json:"broker"`
	// Host and PID say where it runs, for operators.
	Host string `json:"host,omitempty"`
	PID  int    `json:"pid,omitempty"`
	// Since is when it took the claim.
	Since time.Time `json:"since"`
	// TTLMillis is how long another broker must see the claim unchanged before it takes it over.
	TTLMillis int64 `json:"ttl_ms"`
}

// TTL returns c.TTLMillis as a duration.
func (c *Claim) TTL() time.Duration { return time.Duration(c.TTLMillis) * time.Millisecond }

// ClaimSubject is the subject the claim's writes are published on: a plain subscription to it
// sees them as they happen.
func (s *Store) ClaimSubject() string { return s.claimSubj }

// GetClaim reads the store's claim with its revision, from the leader. No claim, or a released
// one, is ErrNotFound.
func (s *Store) GetClaim(ctx context.Context) (Claim, uint64, error) {
	data, rev, err := s.getKey(ctx, s.claims, claimKey)
	if err != nil {
		return Claim{}, 0, err
	}
	var c Claim
	if err := json.Unmarshal(data, &c); err != nil {
		return Claim{}, 0, fmt.Errorf("kv: decode the claim: %w", err)
	}
	return c, rev, nil
}

// PutClaim stores c as the store's claim if the key's revision is still expect (0: no claim, or a
// released one). ErrConflict says another write came first.
func (s *Store) PutClaim(ctx context.Context, c *Claim, expect uint64) (uint64, error) {
	data, err := json.Marshal(c)
	if err != nil {
		return 0, err
	}
	rev, err := s.publish(s.claimSubj, data, expect).Wait(ctx)
	if expect == 0 && errors.Is(err, ErrConflict) {
		return s.createOverMarker(ctx, s.streams[s.claims], s.claimSubj, data, err)
	}
	return rev, err
}

// ReleaseClaim removes the store's claim, with a delete marker, if its revision is still expect.
func (s *Store) ReleaseClaim(ctx context.Context, expect uint64) error {
	msg := &nats.Msg{Subject: s.claimSubj, Header: nats.Header{}}
	msg.Header.Set(jetstream.ExpectedLastSubjSeqHeader, strconv.FormatUint(expect, 10))
	msg.Header.Set(kvOperationHeader, kvDelete)
	f, err := s.js.PublishMsgAsync(msg)
	_, err = Write{f: f, err: err}.Wait(ctx)
	return err
}
