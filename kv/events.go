package kv

import (
	"cmp"
	"context"
	"encoding/base64"
	"errors"
	"fmt"
	"strings"
	"time"

	"github.com/nats-io/nats.go"
	"github.com/nats-io/nats.go/jetstream"
)

// EventsConfig configures the events stream.
type EventsConfig struct {
	// JS is the JetStream context to use. Required.
	JS jetstream.JetStream
	// Prefix names the stream <prefix>-events on subjects <prefix>.events.>. Default DefaultPrefix.
	Prefix string
	// Replicas of the stream. Default 1.
	Replicas int
	// MemoryStorage keeps the events in memory (tests and benchmarks only).
	MemoryStorage bool
	// MaxAge is how long an event is kept. Required.
	MaxAge time.Duration
	// MaxBytes bounds the stream: past it the oldest events are dropped. 0 or -1: no bound.
	MaxBytes int64
}

// ErrEventsNotReplicable is OpenEvents' error for replicas asked of an events stream that was
// created with one replica, and so persists asynchronously: JetStream can neither replicate such a
// stream nor change its persist mode. The stream has to be deleted (its events with it) to be
// created again with replicas.
var ErrEventsNotReplicable = errors.New("the events stream was created with one replica and persists asynchronously, " +
	"which JetStream cannot replicate or change: delete it (its events are lost) to create it with replicas, or keep one replica")

// Events is the stream of message transitions: one message per event, on subject
// <prefix>.events.<queue>.<kind>.<id token>, where the token is the message id in unpadded base64url
// (as in the messages bucket's keys). It is safe for concurrent use.
type Events struct {
	js     jetstream.JetStream
	stream jetstream.Stream
	subj   string // "<prefix>.events."
	behind int    // set by tests only: how many reads to come find nothing, as from a server behind
}

// OpenEvents creates (or updates) the events stream. On file storage with one replica the stream
// persists asynchronously (JetStream's async persist mode): the server writes events out in the
// background rather than with one write call per event, which was a fifth of all the CPU that
// publishing events took. A hard kill of the server may then lose the events of its last moments,
// as a crash of the broker loses those it had not yet published; a clean shutdown loses none. The
// transitions themselves are in the messages bucket, which keeps the server's default. JetStream
// cannot change a stream's persist mode, so an existing stream keeps the one it was created with.
func OpenEvents(ctx context.Context, cfg *EventsConfig) (*Events, error) {
	if cfg == nil || cfg.JS == nil {
		return nil, errors.New("kv: EventsConfig.JS is required")
	}
	if cfg.MaxAge <= 0 {
		return nil, fmt.Errorf("kv: EventsConfig.MaxAge %v must be positive", cfg.MaxAge)
	}
	prefix := cmp.Or(cfg.Prefix, DefaultPrefix)
	storage, persist := jetstream.FileStorage, jetstream.AsyncPersistMode
	if cfg.MemoryStorage {
		storage, persist = jetstream.MemoryStorage, jetstream.DefaultPersistMode
	}
	replicas := cmp.Or(cfg.Replicas, 1)
	if replicas > 1 {
		persist = jetstream.DefaultPersistMode // a replicated stream flushes in the background anyway
	}
	name := prefix + "-events"
	switch st, err := cfg.JS.Stream(ctx, name); {
	case err == nil:
		persist = st.CachedInfo().Config.PersistMode
		if persist == jetstream.AsyncPersistMode && replicas > 1 {
			return nil, fmt.Errorf("kv: open stream %s with %d replicas: %w", name, replicas, ErrEventsNotReplicable)
		}
	case !errors.Is(err, jetstream.ErrStreamNotFound):
		return nil, fmt.Errorf("kv: open stream %s: %w", name, err)
	}
	st, err := ensureStream(ctx, cfg.JS, jetstream.StreamConfig{
		Name:        name,
		Description: "natstone message transitions",
		Subjects:    []string{prefix + ".events.>"},
		Storage:     storage,
		Replicas:    replicas,
		PersistMode: persist,
		Duplicates:  dedupeWindow, // no event carries a message id: see dedupeWindow
		MaxAge:      cfg.MaxAge,
		MaxBytes:    cmp.Or(cfg.MaxBytes, -1),
		Discard:     jetstream.DiscardOld,
		AllowDirect: true,
	})
	if err != nil {
		// A size bound is reserved against the account's and the server's storage limits.
		return nil, fmt.Errorf("kv: open stream %s-events (max_bytes %d, max_age %v): %w", prefix, cfg.MaxBytes, cfg.MaxAge, err)
	}
	return &Events{js: cfg.JS, stream: st, subj: prefix + ".events."}, nil
}

// Prefix returns the prefix of every event's subject: <prefix>.<queue>.<kind>.<id token>.
func (ev *Events) Prefix() string { return strings.TrimSuffix(ev.subj, ".") }

// Subject returns the subject of an event of kind on message id of queue.
func (ev *Events) Subject(queue, kind, id string) string {
	var stack [256]byte // one allocation per subject, the string: the publisher makes one per event
	b := append(stack[:0], ev.subj...)
	b = append(b, queue...)
	b = append(b, '.')
	b = append(b, kind...)
	b = append(b, '.')
	return string(base64.RawURLEncoding.AppendEncode(b, []byte(id)))
}

// Publish stores one event. It returns at once; Wait on the result.
func (ev *Events) Publish(subject string, data []byte) Write {
	f, err := ev.js.PublishMsgAsync(&nats.Msg{Subject: subject, Data: data})
	return Write{f: f, err: err}
}

// PublishBatch stores events: every one but the last as a plain NATS publish, without an
// acknowledgement, and the last with one. The server stores one connection's publishes in order, so
// the last one's acknowledgement says the others were taken in before it: one acknowledgement per
// batch instead of one per event, which is most of what an event costs the server besides storing
// it. (A plain publish the stream refuses — it never does under its age limit — goes unnoticed.)
func (ev *Events) PublishBatch(subjects []string, datas [][]byte) Write {
	n := len(subjects)
	if n == 0 {
		return Write{err: errors.New("kv: empty events batch")}
	}
	nc := ev.js.Conn()
	for i := range n - 1 {
		if err := nc.Publish(subjects[i], datas[i]); err != nil {
			return Write{err: err}
		}
	}
	return ev.Publish(subjects[n-1], datas[n-1])
}

// Read returns the stored events of message id of queue in stream order, at most limit of them;
// more reports that there were more. It returns ErrNotFound when there are none. With a from
// kind, it reads from the last stored event of that kind on, if the stream holds one: an id
// enqueued again after its message was collected names a new message, whose events start at its
// last enqueued event, however many the earlier messages left before it.
//
// The read's consumer has one replica, which the server places on any server of a replicated
// stream, one behind the stream's leader among them: it would miss the latest events, or all of
// them. So Read first asks the leader where to start (the last event of the from kind) and how far
// to read (the message's last event), then reads again (up to readBehindTries times, a little later
// each time) while a read stops short of that, asking the leader again after each short read (its
// last event may have left the stream meanwhile). Events published after the leader's answer may
// be read or not.
func (ev *Events) Read(ctx context.Context, queue, id, from string, limit int) (events [][]byte, more bool, err error) {
	stream, filter := ev.stream.CachedInfo().Config.Name, ev.subj+queue+".*."+encodeToken(id)
	lastOf := func(subject string) (uint64, error) { // 0: none
		m, err := getFromLeader(ctx, ev.js, stream, msgGetRequest{LastFor: subject})
		switch {
		case errors.Is(err, ErrNotFound):
			return 0, nil
		case err != nil:
			return 0, fmt.Errorf("kv: read events: ask the stream's leader: %w", err)
		}
		return m.Seq, nil
	}
	var start uint64 // 0: from the first
	if from != "" {
		if start, err = lastOf(ev.Subject(queue, from, id)); err != nil {
			return nil, false, err
		}
	}
	target, err := lastOf(filter)
	for try := 1; ; try++ {
		switch {
		case err != nil:
			return nil, false, err
		case target == 0:
			return nil, false, ErrNotFound // none stored, or none left
		}
		var last uint64
		events, more, last, err = ev.read(ctx, filter, start, limit)
		switch {
		case err != nil && !errors.Is(err, ErrNotFound):
			return nil, false, err
		case more || last >= target:
			return events, more, nil
		case try == readBehindTries:
			return nil, false, fmt.Errorf("%w: the events read stop at %d, the stream's leader holds %d", ErrStale, last, target)
		}
		if err := unheardPause(ctx, 10*try); err != nil {
			return nil, false, fmt.Errorf("kv: read events: %w", err)
		}
		target, err = lastOf(filter)
	}
}

// readBehindTries bounds the reads of Events.Read from a server behind the stream's leader: with
// 10, 20, 30… ms between them, about 4.5 s in all.
const readBehindTries = 30

// read is one read of Read, through a consumer of its own, of the events matching filter from
// stream sequence start on (0: from the first); last is the stream sequence of the last event it
// read (0 if none).
func (ev *Events) read(ctx context.Context, filter string, start uint64, limit int) (events [][]byte, more bool, last uint64, err error) {
	if ev.behind > 0 {
		ev.behind--
		return nil, false, 0, ErrNotFound
	}
	cfg := jetstream.ConsumerConfig{FilterSubject: filter}
	if start > 0 {
		cfg.DeliverPolicy, cfg.OptStartSeq = jetstream.DeliverByStartSequencePolicy, start
	}
	c, drop, err := readConsumer(ctx, ev.js, ev.stream.CachedInfo().Config.Name, cfg)
	if err != nil {
		return nil, false, 0, fmt.Errorf("kv: read events: %w", err)
	}
	defer drop()
	pending := int(c.CachedInfo().NumPending)
	if pending == 0 {
		return nil, false, 0, ErrNotFound
	}
	want := min(pending, limit)
	unheard := 0 // pulls that found no responders
	for len(events) < want {
		// Each fetch waits readFetchWait at most: events counted above may have left the stream
		// (its age or size bound) before they came, and a fetch of them would wait for the
		// request's whole time.
		fctx, cancel := context.WithTimeout(ctx, readFetchWait)
		batch, err := c.Fetch(want-len(events), jetstream.FetchContext(fctx))
		if err != nil {
			cancel()
			return nil, false, 0, fmt.Errorf("kv: read events: %w", err)
		}
		got := 0
		for m := range batch.Messages() {
			events = append(events, m.Data())
			got++
			if meta, err := m.Metadata(); err == nil {
				last = max(last, meta.Sequence.Stream)
			}
		}
		berr := batch.Error()
		cancel()
		switch {
		case ctx.Err() != nil:
			return nil, false, 0, fmt.Errorf("kv: read events: %w", ctx.Err())
		case got == 0 && errors.Is(berr, nats.ErrNoResponders) && unheard < scanUnheard:
			// In a cluster the consumer may live on another server, whose interest in its pull
			// requests reaches this connection's server a moment after the consumer was made (as
			// in scan): the events are there, the pull is made again.
			unheard++
			if err := unheardPause(ctx, unheard); err != nil {
				return nil, false, 0, fmt.Errorf("kv: read events: %w", err)
			}
			continue
		case got == 0 && len(events) == 0:
			return nil, false, 0, ErrNotFound
		case got == 0:
			return events, false, last, nil // the rest left the stream
		case berr != nil && fctx.Err() == nil:
			return nil, false, 0, fmt.Errorf("kv: read events: %w", berr)
		}
	}
	return events, pending > limit, last, nil
}

// readFetchWait bounds each fetch of Read.
const readFetchWait = 2 * time.Second
