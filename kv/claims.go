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

// claimsDescription is the claims bucket's description.
const claimsDescription = "natstone broker claims"

// Claims is the store's claim: which broker serves the store. A broker opens it before anything
// else, and waits for the claim before it opens the rest (Open), which may change the buckets'
// settings: a standby, with settings of its own, must not change them under the broker serving.
// It is safe for concurrent use.
type Claims struct {
	s    *Store // its claims bucket only
	kv   jetstream.KeyValue
	subj string // "$KV.<prefix>-claims.broker": the claim's key subject
}

// OpenClaims opens the claims bucket, creating it if need be; an existing one is used as it is.
func OpenClaims(ctx context.Context, cfg *Config) (*Claims, error) {
	s, err := newStore(cfg)
	if err != nil {
		return nil, err
	}
	kv, err := s.bucket(ctx, cfg, "claims", claimsDescription, false, false)
	if err != nil {
		return nil, err
	}
	return &Claims{s: s, kv: kv, subj: "$KV." + s.prefix + "-claims." + claimKey}, nil
}

// Subject is the subject the claim's writes are published on: a plain subscription to it sees
// them as they happen.
func (c *Claims) Subject() string { return c.subj }

// Stream is the name of the claims bucket's stream, whose leader elections JetStream announces.
func (c *Claims) Stream() string { return c.s.streams[c.kv].CachedInfo().Config.Name }

// Get reads the store's claim with its revision, from the leader. No claim, or a released one, is
// ErrNotFound, with the revision of the release (0: none).
func (c *Claims) Get(ctx context.Context) (Claim, uint64, error) {
	data, rev, err := c.s.getKey(ctx, c.kv, claimKey)
	if err != nil {
		return Claim{}, rev, err
	}
	var cl Claim
	if err := json.Unmarshal(data, &cl); err != nil {
		return Claim{}, 0, fmt.Errorf("kv: decode the claim: %w", err)
	}
	return cl, rev, nil
}

// Put stores cl as the store's claim if the key's revision is still expect (0: no claim, or a
// released one). ErrConflict says another write came first.
func (c *Claims) Put(ctx context.Context, cl *Claim, expect uint64) (uint64, error) {
	data, err := json.Marshal(cl)
	if err != nil {
		return 0, err
	}
	rev, err := c.s.publish(c.subj, data, expect).Wait(ctx)
	if expect == 0 && errors.Is(err, ErrConflict) {
		return c.s.createOverMarker(ctx, c.s.streams[c.kv], c.subj, data, err)
	}
	return rev, err
}

// Release removes the store's claim, with a delete marker, if its revision is still expect.
func (c *Claims) Release(ctx context.Context, expect uint64) error {
	msg := &nats.Msg{Subject: c.subj, Header: nats.Header{}}
	msg.Header.Set(jetstream.ExpectedLastSubjSeqHeader, strconv.FormatUint(expect, 10))
	msg.Header.Set(kvOperationHeader, kvDelete)
	f, err := c.s.js.PublishMsgAsync(msg)
	_, err = Write{f: f, err: err}.Wait(ctx)
	return err
}
