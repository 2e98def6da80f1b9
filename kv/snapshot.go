package kv

import (
	"bufio"
	"bytes"
	"cmp"
	"context"
	"crypto/sha256"
	"encoding/base64"
	"encoding/binary"
	"encoding/json"
	"errors"
	"fmt"
	"hash"
	"io"
	"strconv"
	"strings"
	"time"

	"github.com/nats-io/nats.go"
	"github.com/nats-io/nats.go/jetstream"
	"github.com/nats-io/nuid"
)

// A broker that stops cleanly writes a snapshot: every message record its memory holds, each with
// its revision, to the object store <prefix>-snapshots, together with the state natstone's
// streams were in at that moment (a Fence). The next start reads the streams' state again and,
// when it is still the fence, reads that one object instead of every record through a consumer,
// which is most of a restart (S6 in docs/performance.md). Every write natstone makes moves the
// fence — a record, lock or config write is a new last sequence of its stream, a payload's delete
// or a queue's purge changes the bodies stream's count — so a snapshot is only used while it is
// what reading the records would give.

// SnapshotObject is the name of the snapshot in the snapshots object store.
const SnapshotObject = "records"

// snapshotFormat is the version of the snapshot's encoding, in its object's metadata. A snapshot of
// another version is not read.
const snapshotFormat = "1"

// The object's metadata keys.
const (
	snapshotFormatKey = "format"
	snapshotFenceKey  = "fence"
	snapshotBrokerKey = "broker"
	snapshotCountKey  = "records"
	snapshotTimeKey   = "written_at"
)

// snapshotMagic starts a snapshot's bytes.
const snapshotMagic = "natstone-snapshot\n"

// The sections of a snapshot, after its magic: a queue's ('Q', its name, how many records follow,
// then each record as its revision and its encoding, length first), and the end ('E', how many
// queues and records there were). Numbers are uvarints; a name is a uvarint length and its bytes.
const (
	snapshotQueue = 'Q'
	snapshotEnd   = 'E'
)

// maxSnapshotName bounds a queue name in a snapshot (natstone's are at most 128 bytes), and
// maxSnapshotRecord a record's encoding, so that a corrupted length cannot ask for gigabytes.
const (
	maxSnapshotName   = 1 << 10
	maxSnapshotRecord = 1 << 22
)

// ErrSnapshotBroken is returned by ReadSnapshot when the snapshot cannot be read to its end: what
// was passed to its function before is not the whole snapshot, and should be dropped.
var ErrSnapshotBroken = errors.New("kv: the snapshot is broken")

// Fence is the state of natstone's streams that a snapshot was written at.
type Fence struct {
	Messages uint64 // the last sequence of the messages bucket's stream
	Locks    uint64 // of the locks bucket's
	Queues   uint64 // of the queue configs bucket's
	// The bodies stream's first and last sequences and how many payloads it holds: deleting a
	// payload, and purging a queue's, changes no last sequence.
	BodiesFirst, BodiesLast, BodiesMsgs uint64
}

// String encodes f as it is kept in the snapshot's metadata.
func (f Fence) String() string {
	return fmt.Sprintf("messages=%d locks=%d queues=%d bodies_first=%d bodies_last=%d bodies_msgs=%d",
		f.Messages, f.Locks, f.Queues, f.BodiesFirst, f.BodiesLast, f.BodiesMsgs)
}

// parseFence decodes what Fence.String encodes.
func parseFence(s string) (Fence, error) {
	var f Fence
	fields := map[string]*uint64{
		"messages": &f.Messages, "locks": &f.Locks, "queues": &f.Queues,
		"bodies_first": &f.BodiesFirst, "bodies_last": &f.BodiesLast, "bodies_msgs": &f.BodiesMsgs,
	}
	for _, kv := range strings.Fields(s) {
		k, v, ok := strings.Cut(kv, "=")
		p := fields[k]
		if !ok || p == nil {
			return Fence{}, fmt.Errorf("kv: snapshot fence %q: bad field %q", s, kv)
		}
		n, err := strconv.ParseUint(v, 10, 64)
		if err != nil {
			return Fence{}, fmt.Errorf("kv: snapshot fence %q: %w", s, err)
		}
		*p = n
		delete(fields, k)
	}
	if len(fields) > 0 {
		return Fence{}, fmt.Errorf("kv: snapshot fence %q: fields missing", s)
	}
	return f, nil
}

// Fence reads the state of natstone's streams, from their leaders, and how many messages the
// messages bucket's stream holds: its records, and the collections' markers until they expire.
func (s *Store) Fence(ctx context.Context) (f Fence, messages uint64, err error) {
	for _, read := range []struct {
		st   jetstream.Stream
		last *uint64
	}{
		{s.streams[s.messages], &f.Messages}, {s.streams[s.locks], &f.Locks}, {s.streams[s.queues], &f.Queues}, {s.bodies, &f.BodiesLast},
	} {
		info, err := read.st.Info(ctx)
		if err != nil {
			return Fence{}, 0, fmt.Errorf("kv: read the state of %s: %w", read.st.CachedInfo().Config.Name, err)
		}
		*read.last = info.State.LastSeq
		switch read.st {
		case s.bodies:
			f.BodiesFirst, f.BodiesMsgs = info.State.FirstSeq, info.State.Msgs
		case s.streams[s.messages]:
			messages = info.State.Msgs
		}
	}
	return f, messages, nil
}

// SnapshotInfo is what a snapshot's object says of it, without its records.
type SnapshotInfo struct {
	Fence     Fence
	Records   uint64    // how many records it holds
	Broker    string    // the id of the broker that wrote it
	WrittenAt time.Time // when it was written
	Size      uint64    // its bytes
	object    string    // its object's NUID: ReadSnapshot reads that object only
}

// ErrNoSnapshot is returned by SnapshotInfo when there is no snapshot to read.
var ErrNoSnapshot = errors.New("kv: no snapshot")

// SnapshotInfo reads what the snapshot says of itself. It returns ErrNoSnapshot when there is none,
// or none of this version of natstone's format.
func (s *Store) SnapshotInfo(ctx context.Context) (SnapshotInfo, error) {
	info, err := s.snapshots.GetInfo(ctx, SnapshotObject)
	if errors.Is(err, jetstream.ErrObjectNotFound) {
		return SnapshotInfo{}, ErrNoSnapshot
	}
	if err != nil {
		return SnapshotInfo{}, fmt.Errorf("kv: read the snapshot's info: %w", err)
	}
	if f := info.Metadata[snapshotFormatKey]; f != snapshotFormat {
		return SnapshotInfo{}, fmt.Errorf("%w of format %s (format %q found)", ErrNoSnapshot, snapshotFormat, f)
	}
	fence, err := parseFence(info.Metadata[snapshotFenceKey])
	if err != nil {
		return SnapshotInfo{}, err
	}
	records, err := strconv.ParseUint(info.Metadata[snapshotCountKey], 10, 64)
	if err != nil {
		return SnapshotInfo{}, fmt.Errorf("kv: the snapshot's count of records: %w", err)
	}
	at, _ := time.Parse(time.RFC3339Nano, info.Metadata[snapshotTimeKey])
	return SnapshotInfo{Fence: fence, Records: records, Broker: info.Metadata[snapshotBrokerKey], WrittenAt: at, Size: info.Size, object: info.NUID}, nil
}

// WriteSnapshot writes a snapshot of records records taken at fence by broker, replacing the one
// stored: fill writes them, while no write moves the fence. A snapshot is stored whole or not at
// all.
//
// Chunks that an earlier write left behind, stopped part way (its deadline passed, say) before it
// could remove them, are removed once this one is stored: every chunk stored before it began, but
// its own (only the broker holding the store's claim writes snapshots). When that fails the
// snapshot is stored all the same, and the error is ErrSnapshotLeftovers.
func (s *Store) WriteSnapshot(ctx context.Context, fence Fence, records uint64, broker string, fill func(w *SnapshotWriter) error) (SnapshotInfo, error) {
	st, err := s.snapshotStream.Info(ctx)
	if err != nil {
		return SnapshotInfo{}, fmt.Errorf("kv: write the snapshot: %w", err)
	}
	before := st.State.LastSeq
	now := time.Now().UTC()
	up := s.newUpload(ctx)
	err = encodeSnapshot(up, records, fill)
	if err == nil {
		err = up.finish(jetstream.ObjectMeta{
			Name:        SnapshotObject,
			Description: "natstone: every message record at a clean stop",
			Metadata: map[string]string{
				snapshotFormatKey: snapshotFormat,
				snapshotFenceKey:  fence.String(),
				snapshotCountKey:  strconv.FormatUint(records, 10),
				snapshotBrokerKey: broker,
				snapshotTimeKey:   now.Format(time.RFC3339Nano),
			},
		})
	}
	if err != nil {
		return SnapshotInfo{}, fmt.Errorf("kv: write the snapshot: %w", err)
	}
	written := SnapshotInfo{Fence: fence, Records: records, Broker: broker, WrittenAt: now, Size: up.info.Size, object: up.info.NUID}
	chunks := s.chunkSubject(">")
	if err := s.snapshotStream.Purge(ctx, jetstream.WithPurgeSubject(chunks), jetstream.WithPurgeSequence(before+1)); err != nil {
		return written, fmt.Errorf("%w: %w", ErrSnapshotLeftovers, err)
	}
	return written, nil
}

// snapshotBucket is the name of the snapshots object store.
func (s *Store) snapshotBucket() string { return s.prefix + "-snapshots" }

// chunkSubject is the subject of the chunks of the snapshot object whose NUID is nuid (ADR-20).
func (s *Store) chunkSubject(nuid string) string { return "$O." + s.snapshotBucket() + ".C." + nuid }

// snapshotChunk is the size of a snapshot's chunks: the object store's default.
const snapshotChunk = 128 << 10

// upload stores an object of the snapshots object store as jetstream.ObjectStore.Put does (ADR-20:
// chunks on a subject of their own, then the object's meta, with its size and SHA-256 digest,
// rolling up the one before), through the store's own JetStream context: each Write publishes
// chunks, finish the meta. Put makes a JetStream context of its own for each call, and in nats.go
// 1.55 the goroutine that context starts to watch for reconnections can be left waiting forever:
// Put's cleanup clears the channel it waits on, and when the cleanup runs first, the goroutine
// reads the cleared (nil) channel. A broker writes a snapshot at every stop; goleak caught the leak
// in CI (the web and workers tests). The chunks of the object an upload replaces are left to
// WriteSnapshot's removal of earlier chunks.
type upload struct {
	ctx     context.Context
	js      jetstream.JetStream
	info    jetstream.ObjectInfo
	subject string // the chunks'
	h       hash.Hash
	acks    []jetstream.PubAckFuture
}

func (s *Store) newUpload(ctx context.Context) *upload {
	u := &upload{ctx: ctx, js: s.js, h: sha256.New()}
	u.info.Bucket, u.info.NUID = s.snapshotBucket(), nuid.Next()
	u.subject = s.chunkSubject(u.info.NUID)
	return u
}

// Write publishes p as chunks of at most snapshotChunk bytes (encodeSnapshot's buffer hands it one
// at a time).
func (u *upload) Write(p []byte) (int, error) {
	for off := 0; off < len(p); off += snapshotChunk {
		chunk := p[off:min(off+snapshotChunk, len(p))]
		u.h.Write(chunk)
		a, err := u.js.PublishAsync(u.subject, chunk) // the data is copied out before it returns
		if err != nil {
			return off, err
		}
		u.acks = append(u.acks, a)
		u.info.Size += uint64(len(chunk))
		u.info.Chunks++
		if len(u.acks) == 256 {
			if err := u.wait(); err != nil {
				return off + len(chunk), err
			}
		}
	}
	return len(p), nil
}

// wait waits for the chunks published so far to be stored.
func (u *upload) wait() error {
	for _, a := range u.acks {
		select {
		case <-a.Ok():
		case err := <-a.Err():
			return err
		case <-u.ctx.Done():
			return u.ctx.Err()
		}
	}
	u.acks = u.acks[:0]
	return nil
}

// finish stores the object's meta once its chunks are: the object then replaces the one of that
// name.
func (u *upload) finish(meta jetstream.ObjectMeta) error {
	if err := u.wait(); err != nil {
		return err
	}
	u.info.ObjectMeta = meta
	u.info.Digest = jetstream.GetObjectDigestValue(u.h)
	data, err := json.Marshal(&u.info)
	if err != nil {
		return err
	}
	m := nats.NewMsg("$O." + u.info.Bucket + ".M." + base64.URLEncoding.EncodeToString([]byte(meta.Name)))
	m.Header.Set(jetstream.MsgRollup, jetstream.MsgRollupSubject)
	m.Data = data
	_, err = u.js.PublishMsg(u.ctx, m)
	return err
}

// ErrSnapshotLeftovers is returned by WriteSnapshot when the snapshot was stored but chunks an
// earlier write left behind could not be removed.
var ErrSnapshotLeftovers = errors.New("kv: the snapshot is written, but earlier chunks are left")

// DeleteSnapshot removes the snapshot, if there is one.
func (s *Store) DeleteSnapshot(ctx context.Context) error {
	err := s.snapshots.Delete(ctx, SnapshotObject)
	if err != nil && !errors.Is(err, jetstream.ErrObjectNotFound) {
		return fmt.Errorf("kv: delete the snapshot: %w", err)
	}
	return nil
}

// ReadSnapshot calls fn for every record of the snapshot that SnapshotInfo described as of, with
// its queue's name and its revision, and returns how many there were. A record that does not
// decode, a snapshot cut short and one whose bytes do not match their digest all fail it with
// ErrSnapshotBroken; fn may have been called before that. So does another snapshot than info's:
// the object store answers its reads of an object's info from any replica (direct gets), and one
// behind may hold the snapshot that of's replaced, whose fence was never checked.
//
// The chunks are read through a consumer of the store's own, not jetstream.ObjectStore.Get: Get's
// reader waits for a chunk until its ctx ends (for a start, its whole --start-timeout), and one the
// server counts but cannot deliver (its block damaged on disk) never comes. A chunk that does not
// come within snapshotStall, or fewer chunks stored than the object has, make the snapshot broken
// at once, and leave the ctx to the read of every record that follows.
func (s *Store) ReadSnapshot(ctx context.Context, of SnapshotInfo, fn func(queue string, r Record, rev uint64) error) (int, error) {
	broken := func(err error) error { return fmt.Errorf("%w: %w", ErrSnapshotBroken, err) }
	info, err := s.snapshots.GetInfo(ctx, SnapshotObject)
	if err != nil {
		return 0, broken(err)
	}
	if info.NUID != of.object {
		return 0, broken(fmt.Errorf("the snapshot read (object %s) is not the one whose fence was checked (object %s)", info.NUID, of.object))
	}
	want, err := jetstream.DecodeObjectDigest(info.Digest)
	if err != nil {
		return 0, broken(err)
	}
	c, drop, err := readConsumer(ctx, s.js, s.snapshotStream.CachedInfo().Config.Name,
		jetstream.ConsumerConfig{FilterSubject: s.chunkSubject(info.NUID)})
	if err != nil {
		return 0, broken(err)
	}
	defer drop()
	if stored := c.CachedInfo().NumPending; stored != uint64(info.Chunks) {
		return 0, broken(fmt.Errorf("%d of its %d chunks are stored", stored, info.Chunks))
	}
	r := &chunkReader{ctx: ctx, left: info.Chunks, size: info.Size, digest: want, h: sha256.New(),
		stall: cmp.Or(s.snapshotStall, snapshotStall)}
	// The first chunk alone, until a pull reaches the consumer: in a cluster the consumer may live
	// on another server, whose interest in its pulls reaches this connection's server a moment
	// after the consumer was made. Until then a pull finds no responders, which the iterator below
	// does not see: it would wait for the pull it thinks pending until a missed heartbeat, 30 s.
	first, err := firstChunk(ctx, c, r.stall)
	if err != nil {
		return 0, broken(err)
	}
	if err := r.take(first); err != nil {
		return 0, broken(err)
	}
	// Pulls of 32 chunks (4 MiB), the next asked for while the last is read.
	if r.it, err = c.Messages(jetstream.PullMaxMessages(32)); err != nil {
		return 0, broken(err)
	}
	defer r.it.Stop()
	return DecodeSnapshot(bufio.NewReaderSize(r, 1<<20), fn)
}

// firstChunk fetches c's first message, asking again while a pull finds no responders (as scan
// does, about 2 s in all).
func firstChunk(ctx context.Context, c jetstream.Consumer, stall time.Duration) (jetstream.Msg, error) {
	for unheard := 1; ; unheard++ {
		batch, err := c.Fetch(1, jetstream.FetchMaxWait(stall))
		if err != nil {
			return nil, err
		}
		var m jetstream.Msg
		for msg := range batch.Messages() {
			m = msg
		}
		switch err := batch.Error(); {
		case m != nil:
			return m, nil
		case errors.Is(err, nats.ErrNoResponders) && unheard <= scanUnheard:
			if err := unheardPause(ctx, unheard); err != nil {
				return nil, err
			}
		case err != nil && ctx.Err() == nil && !errors.Is(err, nats.ErrTimeout):
			return nil, err
		case ctx.Err() != nil:
			return nil, ctx.Err()
		default:
			return nil, fmt.Errorf("no chunk came within %v", stall)
		}
	}
}

// snapshotStall is how long a snapshot's read waits for a chunk before it gives the snapshot up
// (ReadSnapshot). Chunks stored come in milliseconds.
const snapshotStall = 5 * time.Second

// chunkReader reads a snapshot's chunks from its consumer, one at a time, and checks at the end
// that they were all there: their number, their size and their digest.
type chunkReader struct {
	ctx    context.Context
	it     jetstream.MessagesContext
	left   uint32 // chunks not fetched yet
	size   uint64 // bytes not read yet
	chunk  []byte // what is left of the chunk being read
	digest []byte
	h      hash.Hash
	stall  time.Duration
}

func (r *chunkReader) Read(p []byte) (int, error) {
	for len(r.chunk) == 0 {
		if r.left == 0 {
			switch {
			case r.size != 0:
				return 0, fmt.Errorf("%d bytes short", r.size)
			case !bytes.Equal(r.h.Sum(nil), r.digest):
				return 0, jetstream.ErrDigestMismatch
			}
			return 0, io.EOF
		}
		if err := r.fetch(); err != nil {
			return 0, err
		}
	}
	n := copy(p, r.chunk)
	r.chunk = r.chunk[n:]
	return n, nil
}

// fetch gets the next chunk.
func (r *chunkReader) fetch() error {
	ctx, cancel := context.WithTimeout(r.ctx, r.stall)
	defer cancel()
	m, err := r.it.Next(jetstream.NextContext(ctx))
	switch {
	case r.ctx.Err() != nil:
		return r.ctx.Err()
	case errors.Is(err, context.DeadlineExceeded):
		return fmt.Errorf("no chunk came within %v", r.stall)
	case err != nil:
		return err
	}
	return r.take(m)
}

// take makes m the chunk being read.
func (r *chunkReader) take(m jetstream.Msg) error {
	data := m.Data()
	if uint64(len(data)) > r.size {
		return errors.New("chunks longer than the object")
	}
	r.h.Write(data)
	r.size -= uint64(len(data))
	r.chunk = data
	r.left--
	return nil
}

// DecodeSnapshot reads a snapshot's bytes from r and calls fn for each record, with its queue's
// name and its revision. It reads r to its end, so that a reader that checks a digest there can
// fail it; any error but fn's is ErrSnapshotBroken.
func DecodeSnapshot(r interface {
	io.Reader
	io.ByteReader
}, fn func(queue string, rec Record, rev uint64) error) (int, error) {
	broken := func(format string, a ...any) error {
		return fmt.Errorf("%w: %s", ErrSnapshotBroken, fmt.Sprintf(format, a...))
	}
	magic, err := readBytes(r, nil, len(snapshotMagic))
	switch {
	case err != nil:
		return 0, fmt.Errorf("%w: no snapshot header: %w", ErrSnapshotBroken, err)
	case string(magic) != snapshotMagic:
		return 0, broken("no snapshot header")
	}
	var buf []byte
	var queues, n uint64
	for {
		kind, err := r.ReadByte()
		if err != nil {
			return int(n), fmt.Errorf("%w: cut short after %d records: %w", ErrSnapshotBroken, n, err)
		}
		switch kind {
		case snapshotQueue:
			ln, err := binary.ReadUvarint(r)
			if err != nil || ln == 0 || ln > maxSnapshotName {
				return int(n), broken("queue %d: bad name", queues+1)
			}
			if buf, err = readBytes(r, buf, int(ln)); err != nil {
				return int(n), broken("queue %d: %v", queues+1, err)
			}
			name := string(buf)
			count, err := binary.ReadUvarint(r)
			if err != nil {
				return int(n), broken("queue %s: bad count: %v", name, err)
			}
			queues++
			for i := uint64(0); i < count; i++ {
				rev, err := binary.ReadUvarint(r)
				if err != nil {
					return int(n), broken("queue %s, record %d: bad revision: %v", name, i, err)
				}
				ln, err := binary.ReadUvarint(r)
				if err != nil || ln == 0 || ln > maxSnapshotRecord {
					return int(n), broken("queue %s, record %d: bad length", name, i)
				}
				if buf, err = readBytes(r, buf, int(ln)); err != nil {
					return int(n), broken("queue %s, record %d: %v", name, i, err)
				}
				rec, err := DecodeRecord(buf)
				if err != nil {
					return int(n), broken("queue %s, record %d: %v", name, i, err)
				}
				if err := fn(name, rec, rev); err != nil {
					return int(n), err
				}
				n++
			}
		case snapshotEnd:
			wantQueues, err1 := binary.ReadUvarint(r)
			wantN, err2 := binary.ReadUvarint(r)
			if err1 != nil || err2 != nil || wantQueues != queues || wantN != n {
				return int(n), broken("its end says %d queues and %d records, %d and %d were read", wantQueues, wantN, queues, n)
			}
			switch _, err := r.ReadByte(); {
			case err == nil:
				return int(n), broken("bytes after its end")
			case !errors.Is(err, io.EOF): // a reader that checks a digest at the end fails there
				return int(n), fmt.Errorf("%w: at its end: %w", ErrSnapshotBroken, err)
			}
			return int(n), nil
		default:
			return int(n), broken("unknown section %q after %d records", kind, n)
		}
	}
}

// readBytes reads n bytes from r into buf's array, growing it if need be.
func readBytes(r io.Reader, buf []byte, n int) ([]byte, error) {
	if cap(buf) < n {
		buf = make([]byte, n)
	}
	buf = buf[:n]
	_, err := io.ReadFull(r, buf)
	return buf, err
}

// encodeSnapshot writes to out a snapshot of records records, which fill writes.
func encodeSnapshot(out io.Writer, records uint64, fill func(w *SnapshotWriter) error) error {
	w := &SnapshotWriter{w: bufio.NewWriterSize(out, snapshotChunk)}
	err := w.start()
	if err == nil {
		err = fill(w)
	}
	if err == nil {
		err = w.close(records)
	}
	return err
}

// SnapshotWriter writes a snapshot's records, queue by queue.
type SnapshotWriter struct {
	w        *bufio.Writer
	buf, rec []byte
	left     uint64 // the records the current queue still owes
	queue    string
	queues   uint64
	messages uint64
}

func (w *SnapshotWriter) start() error {
	_, err := w.w.WriteString(snapshotMagic)
	return err
}

// Queue starts the records of queue, of which there are n.
func (w *SnapshotWriter) Queue(name string, n int) error {
	if w.left > 0 {
		return fmt.Errorf("kv: snapshot: queue %s: %d records missing", w.queue, w.left)
	}
	w.buf = append(w.buf[:0], snapshotQueue)
	w.buf = appendString(w.buf, name)
	w.buf = binary.AppendUvarint(w.buf, uint64(n))
	w.queue, w.left = name, uint64(n)
	w.queues++
	_, err := w.w.Write(w.buf)
	return err
}

// Record writes one record of the current queue, stored at revision rev.
func (w *SnapshotWriter) Record(r *Record, rev uint64) error {
	if w.left == 0 {
		return fmt.Errorf("kv: snapshot: queue %s: more records than announced", w.queue)
	}
	var err error
	if w.rec, err = AppendRecord(w.rec[:0], r); err != nil {
		return err
	}
	w.buf = binary.AppendUvarint(w.buf[:0], rev)
	w.buf = binary.AppendUvarint(w.buf, uint64(len(w.rec)))
	if _, err := w.w.Write(w.buf); err != nil {
		return err
	}
	w.left--
	w.messages++
	_, err = w.w.Write(w.rec)
	return err
}

func (w *SnapshotWriter) close(records uint64) error {
	if w.left > 0 {
		return fmt.Errorf("kv: snapshot: queue %s: %d records missing", w.queue, w.left)
	}
	if w.messages != records {
		return fmt.Errorf("kv: snapshot: %d records written, %d announced", w.messages, records)
	}
	w.buf = append(w.buf[:0], snapshotEnd)
	w.buf = binary.AppendUvarint(w.buf, w.queues)
	w.buf = binary.AppendUvarint(w.buf, w.messages)
	if _, err := w.w.Write(w.buf); err != nil {
		return err
	}
	return w.w.Flush()
}

// snapshotStore opens the snapshots object store, creating it if need be. Its stream gets natstone's
// duplicate window: with JetStream's default of two minutes, a server started soon after a
// snapshot was written would read the whole snapshot back before anything could start.
func (s *Store) snapshotStore(ctx context.Context, cfg *Config) (jetstream.ObjectStore, error) {
	storage, replicas := cfg.storage()
	name := s.snapshotBucket()
	obs, err := cfg.JS.ObjectStore(ctx, name)
	if errors.Is(err, jetstream.ErrBucketNotFound) {
		obs, err = cfg.JS.CreateObjectStore(ctx, jetstream.ObjectStoreConfig{
			Bucket:      name,
			Description: "natstone message records at a clean stop",
			Storage:     storage,
			Replicas:    replicas,
			MaxBytes:    cfg.maxBytes(),
		})
		if errors.Is(err, jetstream.ErrBucketExists) { // another broker may have made it meanwhile
			obs, err = cfg.JS.ObjectStore(ctx, name)
		}
	}
	if err != nil {
		return nil, fmt.Errorf("kv: open object store %s: %w", name, err)
	}
	st, err := cfg.JS.Stream(ctx, "OBJ_"+name)
	if err != nil {
		return nil, fmt.Errorf("kv: open object store %s: %w", name, err)
	}
	s.snapshotStream = st
	if have := st.CachedInfo().Config; have.Duplicates != dedupeWindow || have.Replicas != replicas || have.MaxBytes != cfg.maxBytes() {
		want := have
		want.Duplicates, want.Replicas, want.MaxBytes = dedupeWindow, replicas, cfg.maxBytes()
		if _, err := cfg.JS.UpdateStream(ctx, want); err != nil {
			return nil, fmt.Errorf("kv: open object store %s: %w", name, err)
		}
	}
	return obs, nil
}
