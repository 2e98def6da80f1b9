package kv

import (
	"cmp"
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"log/slog"
	"maps"
	"slices"
	"strconv"
	"strings"
	"time"

	"github.com/nats-io/nats.go"
	"github.com/nats-io/nats.go/jetstream"
)

// DefaultPrefix names the buckets and the bodies stream unless configured otherwise.
const DefaultPrefix = "natstone"

// Errors returned by the store.
var (
	// ErrConflict: a compare-and-swap write found another revision than expected.
	ErrConflict = errors.New("kv: revision conflict")
	// ErrNotFound: no such key or body.
	ErrNotFound = errors.New("kv: not found")
	// ErrStale: a load was served by a replica that was behind its stream's leader, so it may have
	// missed values or returned older ones. Loading again may succeed.
	ErrStale = errors.New("kv: a replica behind its stream's leader served the load")
)

// dedupeWindow is the duplicate window of the buckets and the bodies stream: the least the server
// accepts. natstone deduplicates nothing by message id (records are written by compare-and-swap,
// payloads carry no id), but a server that starts reads back every message its streams stored
// within their windows to rebuild them: with JetStream's default of two minutes, after a busy
// minute, a million records and as many payloads, a second of CPU before anything is served.
const dedupeWindow = 100 * time.Millisecond

// Config configures a Store.
type Config struct {
	// JS is the JetStream context to use. Required. Its async publish timeout bounds how long a write
	// may stay unacknowledged (jetstream.WithPublishAsyncTimeout).
	JS jetstream.JetStream
	// Prefix names the buckets (<prefix>-queues, -messages, -locks, -schedules, -claims) and the bodies stream
	// (<prefix>-bodies on subjects <prefix>.body.<queue>). Default DefaultPrefix.
	Prefix string
	// Replicas of every bucket and stream: 1 on a single server, 3 on a production cluster. Default 1.
	Replicas int
	// MemoryStorage keeps everything in memory instead of files (tests and benchmarks only).
	MemoryStorage bool
	// MaxBytes bounds each bucket, the bodies stream and the snapshots store (the events stream
	// has its own bound, EventsConfig.MaxBytes): an account that requires every stream to declare
	// a size (Synadia Cloud's) takes no stream without one. 0 or -1: no bound.
	MaxBytes int64
	// Log receives the store's warnings: what a purge left and purged again. Default: none.
	Log *slog.Logger
}

// maxBytes is the bound of cfg.MaxBytes as a stream configuration says it: -1 for none.
func (cfg *Config) maxBytes() int64 {
	if cfg.MaxBytes <= 0 {
		return -1
	}
	return cfg.MaxBytes
}

// StoreReplicas returns the replicas of the store with prefix (default DefaultPrefix): its messages
// bucket's, or 0 when there is no such bucket yet.
func StoreReplicas(ctx context.Context, js jetstream.JetStream, prefix string) (int, error) {
	st, err := js.Stream(ctx, "KV_"+cmp.Or(prefix, DefaultPrefix)+"-messages")
	switch {
	case errors.Is(err, jetstream.ErrStreamNotFound):
		return 0, nil
	case err != nil:
		return 0, err
	}
	return max(st.CachedInfo().Config.Replicas, 1), nil
}

// Store is natstone's storage in JetStream. It is safe for concurrent use.
type Store struct {
	js        jetstream.JetStream
	prefix    string
	log       *slog.Logger
	queues    jetstream.KeyValue
	messages  jetstream.KeyValue
	locks     jetstream.KeyValue
	schedules jetstream.KeyValue
	bodies    jetstream.Stream
	streams   map[jetstream.KeyValue]jetstream.Stream // each bucket's stream, for subject purges

	snapshots      jetstream.ObjectStore // the records at the last clean stop (snapshot.go)
	snapshotStream jetstream.Stream      // its stream

	scaledFrom int // the most replicas a bucket had that Open scaled down to cfg's; 0 if none

	msgSubj   string // "$KV.<prefix>-messages." — the messages bucket's key subject prefix
	queueSubj string // "$KV.<prefix>-queues."
	lockSubj  string
	schedSubj string // "$KV.<prefix>-schedules."
	bodySubj  string // "<prefix>.body."

	// Set by tests only. scanStarted is called by scan once its consumer exists, before it reads;
	// scanBytes replaces the const scanBytes; scanFetching is called with the size of each batch
	// scan asks for; scanLeaderLast, when set, makes scan check its replica against its leader
	// even on a stream of one replica, with the leader's last sequence replaced by what it returns;
	// scanRead is called once scan has read everything, before it checks with the leader.
	snapshotStall  time.Duration // replaces the const snapshotStall
	scanStarted    func()
	scanBytes      uint64
	scanFetching   func(batch uint64)
	scanLeaderLast func(last uint64) uint64
	scanRead       func()
	markerGrace    time.Duration        // replaces the const markerGrace (a negative one too)
	maxDeleted     uint64               // replaces the const maxDeletedDetails
	purged         func(subject string) // called after each purge, before purge checks what is left
}

// Open creates (or updates) the buckets and the bodies stream and returns a Store over them.
// It is idempotent: every broker calls it at start, once it holds the store's claim (OpenClaims).
func Open(ctx context.Context, cfg *Config) (*Store, error) {
	s, err := newStore(cfg)
	if err != nil {
		return nil, err
	}
	if s.queues, err = s.bucket(ctx, cfg, "queues", "natstone queue configs", false, true); err != nil {
		return nil, err
	}
	if s.messages, err = s.bucket(ctx, cfg, "messages", "natstone message records", true, true); err != nil {
		return nil, err
	}
	if s.locks, err = s.bucket(ctx, cfg, "locks", "natstone exclusivity locks", true, true); err != nil {
		return nil, err
	}
	if s.schedules, err = s.bucket(ctx, cfg, "schedules", "natstone schedules (recurring enqueues)", false, true); err != nil {
		return nil, err
	}
	if _, err = s.bucket(ctx, cfg, "claims", claimsDescription, false, true); err != nil { // its settings
		return nil, err
	}
	storage, replicas := cfg.storage()
	s.bodies, err = ensureStream(ctx, cfg.JS, jetstream.StreamConfig{
		Name:        s.prefix + "-bodies",
		Description: "natstone message payloads",
		Subjects:    []string{s.prefix + ".body.>"},
		Storage:     storage,
		Replicas:    replicas,
		AllowDirect: true,
		Duplicates:  dedupeWindow,
		MaxBytes:    cfg.maxBytes(),
		// Full, it refuses a new payload: the default, discarding the oldest, would delete the
		// payloads of messages still waiting to run.
		Discard: jetstream.DiscardNew,
	})
	if err != nil {
		return nil, fmt.Errorf("kv: open stream %s-bodies: %w", s.prefix, err)
	}
	if s.snapshots, err = s.snapshotStore(ctx, cfg); err != nil {
		return nil, err
	}
	s.msgSubj = "$KV." + s.prefix + "-messages."
	s.queueSubj = "$KV." + s.prefix + "-queues."
	s.lockSubj = "$KV." + s.prefix + "-locks."
	s.schedSubj = "$KV." + s.prefix + "-schedules."
	s.bodySubj = s.prefix + ".body."
	return s, nil
}

// readConsumer creates a consumer of stream for one read, as cfg says but unacknowledged, in memory
// and of one replica. drop deletes it, with a ctx of its own (the read's may have ended); should this
// process die first, the server deletes it a minute later.
func readConsumer(ctx context.Context, js jetstream.JetStream, stream string, cfg jetstream.ConsumerConfig) (c jetstream.Consumer, drop func(), err error) {
	cfg.AckPolicy, cfg.MemoryStorage, cfg.Replicas, cfg.InactiveThreshold = jetstream.AckNonePolicy, true, 1, time.Minute
	if c, err = js.CreateConsumer(ctx, stream, cfg); err != nil {
		return nil, nil, err
	}
	return c, func() {
		dctx, cancel := context.WithTimeout(context.WithoutCancel(ctx), 5*time.Second)
		defer cancel()
		_ = js.DeleteConsumer(dctx, stream, c.CachedInfo().Name)
	}, nil
}

// ScaledDownFrom returns the most replicas a bucket of the store had before Open scaled it down to
// the replicas its Config asks for (Open applies its settings), or 0 when it scaled none down.
func (s *Store) ScaledDownFrom() int { return s.scaledFrom }

func newStore(cfg *Config) (*Store, error) {
	if cfg == nil || cfg.JS == nil {
		return nil, errors.New("kv: Config.JS is required")
	}
	log := cfg.Log
	if log == nil {
		log = slog.New(slog.DiscardHandler)
	}
	return &Store{js: cfg.JS, prefix: cmp.Or(cfg.Prefix, DefaultPrefix), log: log, streams: make(map[jetstream.KeyValue]jetstream.Stream, 3)}, nil
}

// storage returns the storage type and the replicas cfg asks for.
func (cfg *Config) storage() (jetstream.StorageType, int) {
	if cfg.MemoryStorage {
		return jetstream.MemoryStorage, cmp.Or(cfg.Replicas, 1)
	}
	return jetstream.FileStorage, cmp.Or(cfg.Replicas, 1)
}

// bucket opens a bucket, creating it if need be. What natstone sets beyond a KeyValueConfig (a
// duplicate window; message TTLs on the messages bucket, for the markers CollectMessage writes)
// and what an operator may have changed since (replicas) are set by updating the stream from its
// own config, which keeps everything else: JetStream refuses to turn message TTLs off once they
// are on, so the bucket is never rewritten from a KeyValueConfig. A bucket already as configured
// is used as it is, with no update; so is any bucket that existed unless update is set.
func (s *Store) bucket(ctx context.Context, cfg *Config, name, desc string, ttls, update bool) (jetstream.KeyValue, error) {
	storage, replicas := cfg.storage()
	full := s.prefix + "-" + name
	st, err := cfg.JS.Stream(ctx, "KV_"+full)
	if errors.Is(err, jetstream.ErrStreamNotFound) {
		_, err = cfg.JS.CreateKeyValue(ctx, jetstream.KeyValueConfig{
			Bucket:      full,
			Description: desc,
			History:     1,
			Storage:     storage,
			Replicas:    replicas,
			MaxBytes:    cfg.maxBytes(),
		})
		if err == nil || errors.Is(err, jetstream.ErrBucketExists) { // another broker may have made it meanwhile
			st, err = cfg.JS.Stream(ctx, "KV_"+full)
		}
		update = true // made now, by this call or another broker's: it needs what KeyValueConfig cannot set
	}
	if err != nil {
		return nil, fmt.Errorf("kv: open bucket %s: %w", full, err)
	}
	have := st.CachedInfo().Config
	want := have
	want.Description, want.MaxMsgsPerSubject, want.Storage, want.Replicas = desc, 1, storage, replicas
	want.Duplicates, want.AllowMsgTTL, want.MaxBytes = dedupeWindow, have.AllowMsgTTL || ttls, cfg.maxBytes()
	if update && (want.Description != have.Description || want.MaxMsgsPerSubject != have.MaxMsgsPerSubject || want.Storage != have.Storage ||
		want.Replicas != have.Replicas || want.Duplicates != have.Duplicates || want.AllowMsgTTL != have.AllowMsgTTL || want.MaxBytes != have.MaxBytes) {
		if st, err = cfg.JS.UpdateStream(ctx, want); err != nil {
			return nil, fmt.Errorf("kv: open bucket %s: %w", full, err)
		}
		if have.Replicas > want.Replicas {
			s.scaledFrom = max(s.scaledFrom, have.Replicas)
		}
	}
	kv, err := cfg.JS.KeyValue(ctx, full)
	if err != nil {
		return nil, fmt.Errorf("kv: open bucket %s: %w", full, err)
	}
	s.streams[kv] = st
	return kv, nil
}

// ensureStream creates or updates the stream want describes, unless it exists with every setting
// natstone chooses as want has it: a broker's start then updates nothing (each update of a
// replicated stream is a proposal to the cluster).
func ensureStream(ctx context.Context, js jetstream.JetStream, want jetstream.StreamConfig) (jetstream.Stream, error) {
	st, err := js.Stream(ctx, want.Name)
	switch {
	case err == nil:
		if have := st.CachedInfo().Config; have.Description == want.Description && slices.Equal(have.Subjects, want.Subjects) &&
			have.Storage == want.Storage && have.Replicas == want.Replicas && have.AllowDirect == want.AllowDirect &&
			have.Duplicates == want.Duplicates && have.MaxAge == want.MaxAge && have.MaxBytes == cmp.Or(want.MaxBytes, -1) &&
			have.Discard == want.Discard && have.PersistMode == want.PersistMode {
			return st, nil
		}
	case !errors.Is(err, jetstream.ErrStreamNotFound):
		return nil, err
	}
	return js.CreateOrUpdateStream(ctx, want)
}

// Write is a write in flight. Wait returns the new revision (the write's stream sequence).
type Write struct {
	f   jetstream.PubAckFuture
	err error
	// overMarker, if set, writes again when the write conflicts: a create over a KV marker.
	overMarker func(ctx context.Context, conflict error) (uint64, error)
}

// Wait waits for the write's acknowledgement. It returns ErrConflict if the expected revision did not
// match; any other error leaves the outcome unknown (the write may or may not have been stored).
func (w Write) Wait(ctx context.Context) (uint64, error) { return w.WaitOr(ctx, nil) }

// WaitOr is Wait that also stops waiting, with its cause, when lost ends (nil: never): the caller
// learnt that the acknowledgement may never come.
func (w Write) WaitOr(ctx, lost context.Context) (uint64, error) {
	if w.err != nil {
		return 0, mapErr(w.err)
	}
	var lostDone <-chan struct{}
	if lost != nil {
		lostDone = lost.Done()
	}
	// An answer already there is taken before an ended wait: select picks at random among ready
	// cases, and a write that landed would be issued again for nothing.
	select {
	case ack := <-w.f.Ok():
		return ack.Sequence, nil
	case err := <-w.f.Err():
		return w.failed(ctx, err)
	default:
	}
	select {
	case ack := <-w.f.Ok():
		return ack.Sequence, nil
	case err := <-w.f.Err():
		return w.failed(ctx, err)
	case <-ctx.Done():
		return 0, context.Cause(ctx)
	case <-lostDone:
		return 0, context.Cause(lost)
	}
}

// failed returns what the write's error means: a conflict (which a create over a marker resolves
// by writing again), no leader, or an unknown outcome.
func (w Write) failed(ctx context.Context, err error) (uint64, error) {
	if err = mapErr(err); errors.Is(err, ErrConflict) && w.overMarker != nil {
		return w.overMarker(ctx, err)
	}
	return 0, err
}

// ErrNoLeader is a write's error when no server took it: nothing serves its stream (no
// responders), as while its replicas elect a leader. Nothing was stored: it is safe to issue again.
var ErrNoLeader = errors.New("kv: no server took the write: the stream has no leader")

func mapErr(err error) error {
	if errors.Is(err, jetstream.ErrNoStreamResponse) || errors.Is(err, nats.ErrNoResponders) {
		return fmt.Errorf("%w (%w)", ErrNoLeader, err)
	}
	var apiErr *jetstream.APIError
	if errors.As(err, &apiErr) && (apiErr.ErrorCode == jetstream.JSErrCodeStreamWrongLastSequence ||
		apiErr.ErrorCode == jetstream.JSErrCodeStreamWrongLastSequenceConstant) {
		return fmt.Errorf("%w: %w", ErrConflict, err)
	}
	return err
}

// brokerRetries makes a publish that finds no responders fail at once (ErrNoLeader), rather than
// after nats.go's own two tries 250 ms apart, for the writes the broker issues again itself
// (messages, locks, payloads): a try of nats.go's still pending when the broker has issued the
// write again would store a payload twice.
var brokerRetries = jetstream.WithRetryAttempts(0)

func (s *Store) publish(subject string, data []byte, expect uint64, opts ...jetstream.PublishOpt) Write {
	msg := &nats.Msg{Subject: subject, Data: data, Header: nats.Header{}}
	msg.Header.Set(jetstream.ExpectedLastSubjSeqHeader, strconv.FormatUint(expect, 10))
	f, err := s.js.PublishMsgAsync(msg, opts...)
	return Write{f: f, err: err}
}

// WriteStreams names the streams of the messages and the locks buckets and the payloads stream:
// those whose writes the broker waits on and issues again when their outcome is unknown.
func (s *Store) WriteStreams() (messages, locks, bodies string) {
	return s.streams[s.messages].CachedInfo().Config.Name, s.streams[s.locks].CachedInfo().Config.Name, s.bodies.CachedInfo().Config.Name
}

// Leader is the server that leads a stream, and since when. Since is zero where the server does
// not say: outside a cluster (a stream has no election there), and before nats-server 2.12.
type Leader struct {
	Name  string
	Since time.Time
}

func leaderOf(info *jetstream.StreamInfo) Leader {
	if info == nil || info.Cluster == nil {
		return Leader{}
	}
	l := Leader{Name: info.Cluster.Leader}
	if info.Cluster.LeaderSince != nil {
		l.Since = *info.Cluster.LeaderSince
	}
	return l
}

// StreamLeader asks stream who leads it now. Its leader answers (a stream's info comes from its
// leader); while it has none the request fails, waits until ctx ends, or is answered by a replica
// with no leader's name.
func (s *Store) StreamLeader(ctx context.Context, stream string) (Leader, error) {
	st, err := s.js.Stream(ctx, stream)
	if err != nil {
		return Leader{}, mapErr(err)
	}
	return leaderOf(st.CachedInfo()), nil
}

// MessageKey returns the KV key of message id in queue.
func MessageKey(queue, id string) string { return queue + "." + encodeToken(id) }

// WriteMessage stores r as message r.ID of queue if the key's revision is still expect (0: the key
// must not exist). It returns at once; Wait on the result.
func (s *Store) WriteMessage(queue string, r *Record, expect uint64) Write {
	data, err := EncodeRecord(r)
	if err != nil {
		return Write{err: err}
	}
	return s.writeKey(s.messages, s.msgSubj+MessageKey(queue, r.ID), data, expect)
}

// writeKey publishes data to the KV key of subject in bucket if its revision is still expect; a
// create (expect 0) writes over the marker a collection (or a KV delete or purge) left there.
func (s *Store) writeKey(bucket jetstream.KeyValue, subject string, data []byte, expect uint64) Write {
	w := s.publish(subject, data, expect, brokerRetries)
	if expect == 0 {
		w.overMarker = func(ctx context.Context, conflict error) (uint64, error) {
			return s.createOverMarker(ctx, s.streams[bucket], subject, data, conflict)
		}
	}
	return w
}

// createOverMarker creates the key of subject with data, over the marker that a collection (or a
// KV delete or purge) may have left there: a create conflicts with a marker as with a record.
// conflict is the create's error, returned if the key holds a record.
func (s *Store) createOverMarker(ctx context.Context, st jetstream.Stream, subject string, data []byte, conflict error) (uint64, error) {
	err := conflict
	for range 3 { // a marker expiring between the read and the write makes the write conflict again
		m, gerr := st.GetLastMsgForSubject(ctx, subject)
		var expect uint64
		switch {
		case errors.Is(gerr, jetstream.ErrMsgNotFound): // the marker is gone: create
		case gerr != nil:
			return 0, gerr
		case marker(m.Header):
			expect = m.Sequence
		default:
			return 0, err // a record: the conflict stands
		}
		var rev uint64
		if rev, err = s.publish(subject, data, expect).Wait(ctx); !errors.Is(err, ErrConflict) {
			return rev, err
		}
	}
	return 0, err
}

// getKey reads key's value in bucket, with its revision, from the bucket's leader: the reads that
// learn what a conflicting write found (GetMessage, GetSlot, GetQueue) must not be answered by a
// replica behind it, as a KV get (a direct get) may be, with an older value or none. A deleted or
// purged key is ErrNotFound, with the revision of its marker (0 for a key without any message): a
// write expecting that revision replaces the marker.
func (s *Store) getKey(ctx context.Context, bucket jetstream.KeyValue, key string) ([]byte, uint64, error) {
	m, err := s.getFromLeader(ctx, "KV_"+bucket.Bucket(), msgGetRequest{LastFor: "$KV." + bucket.Bucket() + "." + key})
	if err != nil {
		return nil, 0, err
	}
	if len(m.Header) > 0 {
		h, err := nats.DecodeHeadersMsg(m.Header)
		if err != nil {
			return nil, 0, fmt.Errorf("kv: %s %q: %w", bucket.Bucket(), key, err)
		}
		if marker(h) {
			return nil, m.Seq, ErrNotFound
		}
	}
	return m.Data, m.Seq, nil
}

// GetMessage reads message id of queue with its revision, from the leader. A collected one is
// ErrNotFound, with its marker's revision while the marker stays (0 after). A record that does not
// decode is an error with its revision.
func (s *Store) GetMessage(ctx context.Context, queue, id string) (Record, uint64, error) {
	data, rev, err := s.getKey(ctx, s.messages, MessageKey(queue, id))
	if err != nil {
		return Record{}, rev, err
	}
	r, err := DecodeRecord(data)
	return r, rev, err
}

// MarkerTTL is how long the marker CollectMessage (or CollectSlot) leaves stays, and so how long
// the messages (or locks) bucket may hold a collected key's marker: JetStream's least TTL.
const MarkerTTL = time.Second

// CollectMessage removes message id of queue if the key's revision is still expect, with one
// stored write instead of a JetStream API request: a KV purge marker that rolls the record up (the
// server drops it) and that the server removes a second later (its Nats-TTL), leaving neither a
// message nor an index entry behind. Until then, GetMessage says ErrNotFound, LoadMessages skips
// it, and WriteMessage with expect 0 writes over it. It returns at once; Wait on the result.
func (s *Store) CollectMessage(queue, id string, expect uint64) Write {
	return s.collectKey(s.msgSubj+MessageKey(queue, id), expect)
}

// collectKey writes a purge marker over the KV key of subject if its revision is still expect,
// which the server removes after MarkerTTL (the bucket allows message TTLs).
func (s *Store) collectKey(subject string, expect uint64) Write {
	msg := &nats.Msg{Subject: subject, Header: nats.Header{}}
	msg.Header.Set(jetstream.ExpectedLastSubjSeqHeader, strconv.FormatUint(expect, 10))
	msg.Header.Set(kvOperationHeader, kvPurge)
	msg.Header.Set(jetstream.MsgRollup, jetstream.MsgRollupSubject)
	msg.Header.Set(jetstream.MsgTTLHeader, MarkerTTL.String())
	f, err := s.js.PublishMsgAsync(msg)
	return Write{f: f, err: err}
}

// The header a KV marker carries (nats.go's names for them are not exported).
const (
	kvOperationHeader = "KV-Operation"
	kvPurge           = "PURGE"
	kvDelete          = "DEL"
)

// marker reports whether a KV value's headers h make it a marker, not a value: a delete or purge,
// or one the server wrote (a TTL's removal, say).
func marker(h nats.Header) bool {
	op := h.Get(kvOperationHeader)
	return op == kvPurge || op == kvDelete || h.Get(jetstream.MarkerReasonHeader) != ""
}

// LoadMessages calls fn for every stored message of queue ("" for every queue), with its queue
// name and revision, in key-update order. It reads a consistent snapshot: writes after it started
// are not seen. A value that does not decode is passed as bad (with the zero Record) so the caller
// can report it and go on.
func (s *Store) LoadMessages(ctx context.Context, queue string, fn func(queue string, r Record, rev uint64, bad error) error) error {
	return s.load(ctx, s.messages, queue, func(q, tok string, value []byte, rev uint64) error {
		// The key's token is only checked here, not decoded: the record carries the id, and decoding
		// a million keys (two allocations each) is a measurable share of a restart.
		if !validToken(tok) {
			return nil // not a key natstone wrote; nothing to load
		}
		r, err := DecodeRecord(value)
		if err != nil {
			name, _ := decodeToken(tok)
			return fn(q, Record{}, rev, fmt.Errorf("message %q: %w", name, err))
		}
		return fn(q, r, rev, nil)
	})
}

// LockKey returns the KV key of exclusivity value in queue: its slot 0 (SlotKey).
func LockKey(queue, value string) string { return SlotKey(queue, value, 0) }

// SlotKey returns the KV key of slot of exclusivity value in queue. A value has as many slots as
// messages of it may run at once (max_running_per_value), each a lock of its own. Slot 0's key is
// <queue>.<value token>, the key of the value's one lock before values had more; slot k's adds .k.
func SlotKey(queue, value string, slot int) string {
	key := queue + "." + encodeToken(value)
	if slot > 0 {
		key += "." + strconv.Itoa(slot)
	}
	return key
}

// WriteSlot stores l as slot of value's lock in queue if its revision is still expect (0: the key
// must hold no lock; it may hold the marker CollectSlot left).
func (s *Store) WriteSlot(queue, value string, slot int, l Lock, expect uint64) Write {
	return s.writeKey(s.locks, s.lockSubj+SlotKey(queue, value, slot), EncodeLock(l), expect)
}

// CollectSlot removes slot of value's lock in queue if its revision is still expect, as
// CollectMessage removes a record: a purge marker that the server drops after MarkerTTL. Until
// then, GetSlot says ErrNotFound, LoadLocks skips it, and WriteSlot with expect 0 writes over it.
// It returns at once; Wait on the result.
func (s *Store) CollectSlot(queue, value string, slot int, expect uint64) Write {
	return s.collectKey(s.lockSubj+SlotKey(queue, value, slot), expect)
}

// GetSlot reads slot of value's lock in queue with its revision.
func (s *Store) GetSlot(ctx context.Context, queue, value string, slot int) (Lock, uint64, error) {
	data, rev, err := s.getKey(ctx, s.locks, SlotKey(queue, value, slot))
	if err != nil {
		return Lock{}, 0, err
	}
	var l Lock
	if err := json.Unmarshal(data, &l); err != nil {
		return Lock{}, 0, fmt.Errorf("kv: decode lock %s/%q slot %d: %w", queue, value, slot, err)
	}
	return l, rev, nil
}

// LoadLocks calls fn for every lock slot of queue ("" for every queue). A lock that does not decode
// comes as the empty Lock, which names no holder, with bad saying why.
func (s *Store) LoadLocks(ctx context.Context, queue string, fn func(queue, value string, slot int, l Lock, rev uint64, bad error) error) error {
	return s.load(ctx, s.locks, queue, func(q, tok string, data []byte, rev uint64) error {
		tok, slotTok, hasSlot := strings.Cut(tok, ".")
		slot := 0
		if hasSlot {
			n, err := strconv.Atoi(slotTok)
			if err != nil || n < 1 || strconv.Itoa(n) != slotTok {
				return nil // not a key natstone wrote; nothing to load
			}
			slot = n
		}
		value, err := decodeToken(tok)
		if err != nil {
			return nil // not a key natstone wrote; nothing to load
		}
		var l Lock
		if err := json.Unmarshal(data, &l); err != nil {
			return fn(q, value, slot, Lock{}, rev, fmt.Errorf("kv: decode lock %s/%q slot %d: %w", q, value, slot, err))
		}
		return fn(q, value, slot, l, rev, nil)
	})
}

// load reads the last value of every key of bucket (under queue, or all) with scan. fn gets each key
// split into its queue and its token, still encoded (decodeToken); keys without a token are skipped.
func (s *Store) load(ctx context.Context, bucket jetstream.KeyValue, queue string, fn func(queue, tok string, value []byte, rev uint64) error) error {
	keys := ">"
	if queue != "" {
		keys = queue + ".>"
	}
	return s.scan(ctx, bucket, keys, func(key string, value []byte, rev uint64) error {
		q, tok, ok := strings.Cut(key, ".")
		if !ok {
			return nil // not a key natstone wrote; nothing to load
		}
		return fn(q, tok, value, rev)
	})
}

// GetQueue reads a queue's record with its revision.
func (s *Store) GetQueue(ctx context.Context, name string) (QueueRecord, uint64, error) {
	data, rev, err := s.getKey(ctx, s.queues, name)
	if err != nil {
		return QueueRecord{}, 0, err
	}
	var q QueueRecord
	if err := json.Unmarshal(data, &q); err != nil {
		return QueueRecord{}, 0, fmt.Errorf("kv: decode queue %q: %w", name, err)
	}
	return q, rev, nil
}

// PutQueue stores a queue's record if its revision is still expect (0: the queue must not exist;
// it may have been deleted, which leaves a marker the create replaces).
func (s *Store) PutQueue(ctx context.Context, name string, q QueueRecord, expect uint64) (uint64, error) {
	data, err := json.Marshal(q)
	if err != nil {
		return 0, err
	}
	subject := s.queueSubj + name
	rev, err := s.publish(subject, data, expect).Wait(ctx)
	if expect == 0 && errors.Is(err, ErrConflict) {
		return s.createOverMarker(ctx, s.streams[s.queues], subject, data, err)
	}
	return rev, err
}

// LoadQueues calls fn for every queue.
func (s *Store) LoadQueues(ctx context.Context, fn func(name string, q QueueRecord, rev uint64) error) error {
	return s.scan(ctx, s.queues, ">", func(key string, value []byte, rev uint64) error {
		var q QueueRecord
		if err := json.Unmarshal(value, &q); err != nil {
			return fmt.Errorf("kv: decode queue %q: %w", key, err)
		}
		return fn(key, q, rev)
	})
}

// DeleteQueue removes a queue with all its messages, locks and payloads. The config goes last, so a
// crash part way leaves a queue that still exists and can be deleted again.
func (s *Store) DeleteQueue(ctx context.Context, name string) error {
	// The payloads first, as a collection does: a record whose payload is gone is known to be
	// removed, should JetStream bring it back after an unclean stop (see the broker's recovery).
	if err := s.purge(ctx, s.bodies, s.bodySubj+name); err != nil {
		return err
	}
	if err := s.purge(ctx, s.streams[s.messages], s.msgSubj+name+".>"); err != nil {
		return err
	}
	if err := s.PurgeLocks(ctx, name); err != nil {
		return err
	}
	// Schedules go with delete markers, as the config (below) does, and before it: a crash part way
	// leaves the queue, to be deleted again.
	var names []string
	err := s.LoadSchedules(ctx, name, func(_, sched string, _ ScheduleRecord, _ uint64, _ error) error {
		names = append(names, sched)
		return nil
	})
	if err != nil {
		return err
	}
	for _, sched := range names {
		if err := s.schedules.Delete(ctx, ScheduleKey(name, sched)); err != nil {
			return fmt.Errorf("kv: delete schedule %s/%s: %w", name, sched, err)
		}
	}
	// The config goes with a delete marker, not a purge. After an unclean stop, JetStream can bring
	// back a revision of a key that a later one superseded (nats-server#8505): a config that an
	// update replaced, which a purge would leave as the key's last value, and the deleted queue would
	// be back. The marker stays the key's last value, so a load skips the key whatever comes back.
	if err := s.queues.Delete(ctx, name); err != nil {
		return fmt.Errorf("kv: delete queue config %s: %w", name, err)
	}
	return nil
}

// PurgeLocks removes every exclusivity lock of queue. DeleteQueue does, and a broker's start for
// the locks of queues that are gone, which JetStream can bring back after an unclean stop
// (nats-server#8505). It must not run while a broker that may take locks of queue serves the
// store: a purge carries no revision.
func (s *Store) PurgeLocks(ctx context.Context, queue string) error {
	return s.purge(ctx, s.streams[s.locks], s.lockSubj+queue+".>")
}

// purgeTries bounds how many times purge asks for a subject's purge.
const purgeTries = 3

// purgeEach bounds how many subjects that a purge left purge asks to purge one by one.
const purgeEach = 100

// purge removes every message on subject from st, and asks the stream whether any is left: after
// an unclean stop, the file store's purge of a subject has been seen to leave a key written after
// the restart, which its count of the subject still showed (2026-11-27, docs/faults.md). What is
// left is purged again, each subject by its own name (the file store finds a literal subject's
// messages otherwise than a wildcard's), up to purgeTries purges in all; then purge fails, and its
// caller, whose work is idempotent, can be asked again.
func (s *Store) purge(ctx context.Context, st jetstream.Stream, subject string) error {
	subjs := []string{subject}
	var left map[string]uint64
	for range purgeTries {
		for _, subj := range subjs {
			if err := st.Purge(ctx, jetstream.WithPurgeSubject(subj)); err != nil {
				return fmt.Errorf("kv: purge %s: %w", subj, err)
			}
		}
		if s.purged != nil {
			s.purged(subject)
		}
		info, err := st.Info(ctx, jetstream.WithSubjectFilter(subject))
		if err != nil {
			return fmt.Errorf("kv: purge %s: check what is left: %w", subject, err)
		}
		if left = info.State.Subjects; len(left) == 0 {
			return nil
		}
		s.log.Warn("a purge left part of what it purges; purging again", "subject", subject, "left", describeLeft(left))
		if subjs = slices.Sorted(maps.Keys(left)); len(subjs) > purgeEach {
			subjs = []string{subject}
		}
	}
	return fmt.Errorf("kv: purge %s: %s left after %d purges; retry", subject, describeLeft(left), purgeTries)
}

// describeLeft says how many messages a purge left, on how many subjects, naming up to 3 of them
// in order.
func describeLeft(left map[string]uint64) string {
	var msgs uint64
	for _, n := range left {
		msgs += n
	}
	subjs, more := slices.Sorted(maps.Keys(left)), ""
	if len(subjs) > 3 {
		subjs, more = subjs[:3], ", …"
	}
	return fmt.Sprintf("%s on %s (%s%s)", plural(msgs, "message"), plural(uint64(len(left)), "subject"), strings.Join(subjs, ", "), more)
}

// plural is n with noun, in the plural unless n is 1.
func plural(n uint64, noun string) string {
	if n == 1 {
		return "1 " + noun
	}
	return fmt.Sprintf("%d %ss", n, noun)
}
