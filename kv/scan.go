package kv

import (
	"cmp"
	"context"
	"errors"
	"fmt"
	"math"
	"strconv"
	"strings"
	"time"

	"github.com/nats-io/nats.go"
	"github.com/nats-io/nats.go/jetstream"
)

// scanBatch is how many values scan asks for at a time. Each batch is a round trip: S6 (a restart
// with 200k pending) took 0.94 s with batches of 4096 and 0.79 s with 16384, where the watcher took
// 0.75 s. scanBytes bounds what a batch holds (a batch arrives faster than it is read, and the
// client buffers it whole): after a first batch of scanFirstBatch, scan asks for as many values of
// the average size so far as fit. 16384 records of natstone's largest (about 40 KB: 32 metadata
// pairs of the longest) would otherwise be 640 MB at once.
const (
	scanFirstBatch = 256
	scanBatch      = 16384
	scanBytes      = 32 << 20
	// scanUnheard bounds the requests of a scan that find no responders (waiting 1, 2, 3… ms
	// after each): about 2 s in all.
	scanUnheard = 60
)

// unheardPause waits before the pull that follows the nth to find no responders (n ms), or until
// ctx ends.
func unheardPause(ctx context.Context, n int) error {
	select {
	case <-time.After(time.Duration(n) * time.Millisecond):
		return nil
	case <-ctx.Done():
		return ctx.Err()
	}
}

// scan calls fn with the last value of every key of bucket matching keys, skipping deleted and
// purged ones. It reads what was stored when it started; values written since may or may not be
// seen.
//
// It does not use a KV watcher, which counts the values pending when it starts and reports the end
// only once it has delivered that many, or one with nothing pending after it. Values that go away
// in the meantime — the collection markers, which expire a second after they are written, and which
// a restart expires at once — are never delivered, and a watcher that counted them waits forever: a
// broker's start hung that way after kills in the fault tests. scan reads through an ephemeral pull
// consumer, without waiting: a batch that comes back empty means nothing is left.
//
// On a replicated stream the consumer may be served by any replica, and nothing makes one that is
// behind its leader catch up first: it would deliver its own older state. So scan reads the
// stream's last sequence from the leader before it starts, and afterwards asks the leader whether
// the replica missed a value up to it; and a replica that applies writes while the load reads it
// (one catching up) may deliver an older value of a key and then skip or miss the newer one. In
// either case scan returns ErrStale, after fn saw values that may be stale.
//
// A collection's marker that the server did not remove in its time (staleMarker) is written again
// once the scan has read everything, so that it goes.
func (s *Store) scan(ctx context.Context, bucket jetstream.KeyValue, keys string, fn func(key string, value []byte, rev uint64) error) error {
	prefix := "$KV." + bucket.Bucket() + "."
	read := scanSpec{
		name:   bucket.Bucket(),
		stream: s.streams[bucket],
		config: jetstream.ConsumerConfig{DeliverPolicy: jetstream.DeliverLastPerSubjectPolicy, FilterSubject: prefix + keys},
	}
	var stale []Write
	err := s.scanStream(ctx, read, func(m jetstream.Msg, seq uint64) error {
		if h := m.Headers(); marker(h) {
			if s.staleMarker(m, h) {
				stale = append(stale, s.collectKey(m.Subject(), seq))
			}
			return nil
		}
		key, ok := strings.CutPrefix(m.Subject(), prefix)
		if !ok {
			return nil
		}
		return fn(key, m.Data(), seq)
	})
	if len(stale) > 0 {
		s.collectedAgain(ctx, bucket.Bucket(), stale)
	}
	return err
}

// markerGrace is how long past its TTL a collection's marker may stay before a scan takes it for one
// the server will not remove: far more than the server's expiry takes, and than the clocks of the
// server and the broker are likely to differ by.
const markerGrace = time.Minute

// staleMarker reports whether m, a marker with headers h, is a collection's marker (one with a TTL)
// that has outlived its TTL by markerGrace: one the server no longer means to remove. After an
// unclean stop, nats-server (2.15.2) was seen keeping thousands of them for good, each a message
// and an index entry of its stream, and making a start's snapshot useless (snapshotCurrent's
// counts differ).
func (s *Store) staleMarker(m jetstream.Msg, h nats.Header) bool {
	ttl, ok := parseTTL(h.Get(jetstream.MsgTTLHeader))
	if !ok {
		return false // not a collection's marker, or one meant to stay
	}
	meta, err := m.Metadata()
	if err != nil {
		return false
	}
	return time.Since(meta.Timestamp) > ttl+cmp.Or(s.markerGrace, markerGrace)
}

// parseTTL reads a Nats-TTL header: a Go duration, or whole seconds; "never" and anything else
// that does not parse to a positive time is not a TTL.
func parseTTL(v string) (time.Duration, bool) {
	if d, err := time.ParseDuration(v); err == nil {
		return d, d > 0
	}
	if n, err := strconv.ParseInt(v, 10, 64); err == nil && n > 0 && n < math.MaxInt64/int64(time.Second) {
		return time.Duration(n) * time.Second, true
	}
	return 0, false
}

// collectedAgain waits for the writes of stale markers' replacements, each a marker at the stale
// one's revision with a TTL the server now tracks, and logs how many landed. One that conflicts
// was replaced already; one that fails is left for the next start.
func (s *Store) collectedAgain(ctx context.Context, bucket string, writes []Write) {
	landed, failed := 0, 0
	var last error
	for _, w := range writes {
		switch _, err := w.Wait(ctx); {
		case err == nil:
			landed++
		case !errors.Is(err, ErrConflict):
			failed++
			last = err
		}
	}
	attrs := []any{"bucket", bucket, "markers", len(writes), "written", landed}
	if failed > 0 {
		attrs = append(attrs, "failed", failed, "error", last)
	}
	s.log.Warn("collection markers the server kept past their TTL written again, to go", attrs...)
}

// scanSpec is what scanStream reads: the messages of stream that config's consumer delivers
// (its filter, and its deliver policy: the last of each subject, or all), under a name for errors.
type scanSpec struct {
	name   string
	stream jetstream.Stream
	config jetstream.ConsumerConfig
}

// scanStream calls fn with each message of what.stream that what.config delivers, with its stream
// sequence, as scan describes (which reads a bucket's keys through it).
func (s *Store) scanStream(ctx context.Context, what scanSpec, fn func(m jetstream.Msg, seq uint64) error) error {
	stream := what.stream.CachedInfo().Config.Name
	info, err := what.stream.Info(ctx) // the leader answers
	if err != nil {
		return fmt.Errorf("kv: load %s: read the stream's state: %w", what.name, err)
	}
	check, leaderLast := info.Config.Replicas > 1, info.State.LastSeq
	if check && (info.Cluster == nil || info.Cluster.Leader == "") {
		return fmt.Errorf("%w: %s has no leader", ErrStale, stream) // a member answered for it
	}
	if s.scanLeaderLast != nil {
		check, leaderLast = true, s.scanLeaderLast(leaderLast)
	}
	c, drop, err := readConsumer(ctx, s.js, stream, what.config)
	if err != nil {
		return fmt.Errorf("kv: load %s: %w", what.name, err)
	}
	defer drop()
	initial := c.CachedInfo().NumPending // what was stored when it started
	if s.scanStarted != nil {
		s.scanStarted()
	}
	// A batch left part way (fn failed) is read to its end before the consumer goes: its fetch ends
	// when the server has delivered it, which a deleted consumer may not do, and nats.go's goroutine
	// would then wait on, up to a second of silence, after the load returned.
	var batch jetstream.MessageBatch
	defer func() {
		if batch != nil {
			for range batch.Messages() {
			}
		}
	}()
	maxBytes := cmp.Or(s.scanBytes, scanBytes)
	var got, size uint64 // size: the bytes of the keys and values got so far
	var lastSeen uint64  // the stream sequence of the last value got
	unheard := 0         // requests that found no responders
	for got < initial {
		want := min(initial-got, scanFirstBatch) // to learn the values' size
		if got > 0 {
			want = min(initial-got, scanBatch, max(1, maxBytes/max(1, size/got)))
		}
		if s.scanFetching != nil {
			s.scanFetching(want)
		}
		var err error
		if batch, err = c.FetchNoWait(int(want)); err != nil {
			return fmt.Errorf("kv: load %s: %w", what.name, err)
		}
		n := 0
		for m := range batch.Messages() {
			n++
			size += uint64(len(m.Subject()) + len(m.Data()))
			meta, err := m.Metadata()
			if err != nil {
				return fmt.Errorf("kv: load %s: %w", what.name, err)
			}
			// Without acknowledgements nothing is redelivered, so a gap in the consumer's sequence
			// is a value the connection dropped: the load would be incomplete.
			if meta.Sequence.Consumer != got+1 {
				return fmt.Errorf("kv: load %s: value %d of the scan arrived as %d; some were dropped", what.name, got+1, meta.Sequence.Consumer)
			}
			got++
			lastSeen = max(lastSeen, meta.Sequence.Stream)
			if check && meta.NumPending > initial-got {
				// More pending than when it began: the replica applied writes meanwhile, so what
				// it delivered may mix older and newer values of a key (in a load no one else
				// writes: it was catching up).
				return fmt.Errorf("%w: %s applied writes during the load", ErrStale, stream)
			}
			if err := fn(m, meta.Sequence.Stream); err != nil {
				return err
			}
		}
		if err := batch.Error(); err != nil {
			// In a cluster the consumer may live on another server, whose interest in its pull
			// requests reaches this connection's server a moment after the consumer was made:
			// until then a request finds no responders, and is made again.
			if n == 0 && errors.Is(err, nats.ErrNoResponders) && unheard < scanUnheard {
				unheard++
				if err := unheardPause(ctx, unheard); err != nil {
					return err
				}
				continue
			}
			return fmt.Errorf("kv: load %s: %w", what.name, err)
		}
		if n == 0 {
			// The rest went away (expired markers, deletions) before it was read; or not: nats.go
			// also ends a fetch, empty and without an error, after a second without a message
			// (a server stalled that long), and a value the server delivers after that is lost to
			// this load. The consumer's own count tells the two apart.
			ci, err := c.Info(ctx)
			if err != nil {
				return fmt.Errorf("kv: load %s: %w", what.name, err)
			}
			if ci.NumPending > 0 || ci.Delivered.Consumer != got {
				return fmt.Errorf("kv: load %s: a batch came back empty after %d of %d values, with %d pending and %d delivered", what.name, got, initial, ci.NumPending, ci.Delivered.Consumer)
			}
			break
		}
	}
	if !check {
		return nil
	}
	if s.scanRead != nil {
		s.scanRead()
	}
	// A replica applies its leader's messages in order, so one that delivered the message at
	// lastSeen held every message before it as the leader had them. It missed nothing the leader
	// held up to leaderLast if the leader holds no value of these keys between the two.
	m, err := s.getFromLeader(ctx, stream, msgGetRequest{Seq: lastSeen + 1, NextFor: what.config.FilterSubject})
	switch {
	case errors.Is(err, ErrNotFound):
		return nil
	case err != nil:
		return fmt.Errorf("kv: load %s: check with the leader: %w", what.name, err)
	case m.Seq <= leaderLast:
		return fmt.Errorf("%w: %s read to sequence %d, its leader holds %d", ErrStale, stream, lastSeen, m.Seq)
	}
	return nil
}
