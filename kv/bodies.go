package kv

// The bodies stream: each message's payload, written once at its enqueue, read by its dequeues,
// and deleted (by sequence, with a tombstone) before its record at its collection, so a start that
// finds a record whose payload is gone knows its collection was cut short (Bodies.Gone).

import (
	"cmp"
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"iter"
	"slices"
	"strings"
	"time"

	"github.com/nats-io/nats.go"
	"github.com/nats-io/nats.go/jetstream"
)

// BodyIDHeader is the header of a payload that names its message: the message's id as its KV key
// encodes it. It is what lets a start ask whether a payload that no record it read references
// has a record at all (BodyReferenced).
const BodyIDHeader = "Natstone-Message-Id"

// WriteBody publishes the payload of message id to queue's subject of the bodies stream. Wait
// gives the body's sequence. There is no deduplication by message id: JetStream's duplicate window
// would outlive a body's deletion (garbage collection, queue delete) and hand a retry the sequence
// of a deleted payload. The record's create is what makes an enqueue idempotent.
func (s *Store) WriteBody(queue, id string, payload []byte) Write {
	msg := &nats.Msg{Subject: s.bodySubj + queue, Data: payload, Header: nats.Header{BodyIDHeader: {encodeToken(id)}}}
	f, err := s.js.PublishMsgAsync(msg, brokerRetries)
	return Write{f: f, err: err}
}

// GetBody reads the payload at seq. It reads with a direct get, which any replica may answer; one
// that has not caught up yet says "not found" for a payload just written, so that answer is checked
// with the stream's leader before it is believed. While no server answers for the stream at all
// (no responders: its replicas are electing a leader, after a server's restart) it asks again,
// backing off up to half a second, until ctx ends.
func (s *Store) GetBody(ctx context.Context, seq uint64) ([]byte, error) {
	for wait := 10 * time.Millisecond; ; wait = min(2*wait, 500*time.Millisecond) {
		data, err := s.getBody(ctx, seq)
		if !errors.Is(err, nats.ErrNoResponders) {
			return data, err
		}
		select {
		case <-ctx.Done():
			return nil, err
		case <-time.After(wait):
		}
	}
}

func (s *Store) getBody(ctx context.Context, seq uint64) ([]byte, error) {
	m, err := s.bodies.GetMsg(ctx, seq)
	if errors.Is(err, jetstream.ErrMsgNotFound) {
		m, err := s.bodyFromLeader(ctx, seq)
		switch {
		case err != nil:
			return nil, err
		case m.Data == nil:
			return []byte{}, nil
		}
		return m.Data, nil
	}
	if err != nil {
		return nil, err
	}
	return m.Data, nil
}

// msgGetRequest is the body of a JetStream API message get: by sequence, last by subject, or next
// by subject from a sequence.
type msgGetRequest struct {
	Seq     uint64 `json:"seq,omitempty"`
	LastFor string `json:"last_by_subj,omitempty"`
	NextFor string `json:"next_by_subj,omitempty"` // the first message from Seq on of these subjects
}

// storedMsg is a message as the JetStream API's message get returns it.
type storedMsg struct {
	Subject string `json:"subject"`
	Seq     uint64 `json:"seq"`
	Header  []byte `json:"hdrs"`
	Data    []byte `json:"data"`
}

// getFromLeader reads a message of stream through the JetStream API ($JS.API.STREAM.MSG.GET), which
// the stream's leader answers, unlike a direct get. A message that is not there is ErrNotFound.
func (s *Store) getFromLeader(ctx context.Context, stream string, req msgGetRequest) (*storedMsg, error) {
	return getFromLeader(ctx, s.js, stream, req)
}

// getFromLeader is Store.getFromLeader on js.
func getFromLeader(ctx context.Context, js jetstream.JetStream, stream string, req msgGetRequest) (*storedMsg, error) {
	body, _ := json.Marshal(req)
	if _, ok := ctx.Deadline(); !ok {
		var cancel context.CancelFunc
		ctx, cancel = context.WithTimeout(ctx, 10*time.Second)
		defer cancel()
	}
	msg, err := js.Conn().RequestWithContext(ctx, "$JS.API.STREAM.MSG.GET."+stream, body)
	if err != nil {
		return nil, err
	}
	var resp struct {
		Message *storedMsg          `json:"message"`
		Error   *jetstream.APIError `json:"error"`
	}
	if err := json.Unmarshal(msg.Data, &resp); err != nil {
		return nil, fmt.Errorf("kv: get from %s: %w", stream, err)
	}
	switch {
	case resp.Error != nil && resp.Error.ErrorCode == jetstream.JSErrCodeMessageNotFound:
		return nil, ErrNotFound
	case resp.Error != nil:
		return nil, resp.Error
	case resp.Message == nil:
		return nil, fmt.Errorf("kv: get from %s: empty reply", stream)
	}
	return resp.Message, nil
}

// bodyFromLeader reads the payload at seq, with its subject and headers, from the bodies
// stream's leader.
func (s *Store) bodyFromLeader(ctx context.Context, seq uint64) (*storedMsg, error) {
	return s.getFromLeader(ctx, s.bodies.CachedInfo().Config.Name, msgGetRequest{Seq: seq})
}

// BodyReferenced reports whether the payload at seq may still be needed, as the leaders of the
// bodies stream and of the messages bucket say: whether the record of the message its header
// names references it. Only a payload known to have no such record is not referenced: one whose
// message has no record, or a record of another payload (another message of that id). A payload
// without the header, or whose message's record does not decode, counts as referenced; one that
// is gone does not.
func (s *Store) BodyReferenced(ctx context.Context, seq uint64) (bool, error) {
	body, err := s.bodyFromLeader(ctx, seq)
	switch {
	case errors.Is(err, ErrNotFound):
		return false, nil
	case err != nil:
		return false, err
	}
	queue, ok := strings.CutPrefix(body.Subject, s.bodySubj)
	if !ok {
		return true, nil
	}
	var tok string
	if len(body.Header) > 0 {
		h, err := nats.DecodeHeadersMsg(body.Header)
		if err != nil {
			return true, nil
		}
		tok = h.Get(BodyIDHeader)
	}
	if tok == "" || !validToken(tok) {
		return true, nil
	}
	data, _, err := s.getKey(ctx, s.messages, queue+"."+tok) // a marker: no record
	switch {
	case errors.Is(err, ErrNotFound):
		return false, nil
	case err != nil:
		return false, err
	}
	r, err := DecodeRecord(data)
	if err != nil {
		return true, nil
	}
	return r.BodySeq == seq, nil
}

// maxDeletedDetails bounds the deleted sequences ReadBodies asks the server to list (8 bytes and
// a JSON number each). Past it, ReadBodies lists the payloads the stream holds instead, when asked
// to; otherwise only the payloads before the stream's first sequence are known to be gone. One
// message that stays (a long delay, a long retention) keeps the first sequence where it is, and a
// soak at 188 messages/s added a deleted sequence per message behind it: 2^20 of them in about
// an hour and a half.
const maxDeletedDetails = 1 << 20

// Bodies is the bodies stream's state, read once (ReadBodies): which payloads it holds and which
// are known to be gone. A server that answers with a state behind the leader's (a replica catching
// up) knows of fewer deletions and fewer payloads: what it says is gone is asked of the leader
// again before anything is removed for it (BodyGone, BodyReferenced).
type Bodies struct {
	First, Last uint64 // the stream's first and last sequences
	Msgs        uint64 // how many payloads it holds
	// Complete reports whether every payload between First and Last is known to be held or gone;
	// if not, only the payloads before First are known to be gone.
	Complete bool
	deleted  []uint64 // sorted: the sequences gone between First and Last
	stored   []uint64 // sorted, instead of deleted when listed: the sequences held up to Last
	listed   bool
}

// ReadBodies reads the bodies stream's state. With list, a stream with more deleted sequences than
// the server is asked to list (maxDeletedDetails) has the sequences it holds listed instead, read
// through a consumer of their headers (as a load reads records); without it, its state is not
// Complete.
func (s *Store) ReadBodies(ctx context.Context, list bool) (*Bodies, error) {
	info, err := s.bodies.Info(ctx)
	if err != nil {
		return nil, fmt.Errorf("kv: read the bodies stream's state: %w", err)
	}
	b := &Bodies{Complete: uint64(info.State.NumDeleted) <= cmp.Or(s.maxDeleted, maxDeletedDetails)}
	switch {
	case b.Complete && info.State.NumDeleted > 0:
		if info, err = s.bodies.Info(ctx, jetstream.WithDeletedDetails(true)); err != nil {
			return nil, fmt.Errorf("kv: read the bodies stream's deleted sequences: %w", err)
		}
		b.deleted = slices.Clone(info.State.Deleted)
		slices.Sort(b.deleted)
	case !b.Complete && list:
		read := scanSpec{
			name:   info.Config.Name,
			stream: s.bodies,
			config: jetstream.ConsumerConfig{DeliverPolicy: jetstream.DeliverAllPolicy, FilterSubject: s.bodySubj + ">", HeadersOnly: true},
		}
		b.stored = make([]uint64, 0, info.State.Msgs)
		began := time.Now()
		err := s.scanStream(ctx, read, func(_ jetstream.Msg, seq uint64) error {
			b.stored = append(b.stored, seq) // those past Last (stored since) are not looked at
			return nil
		})
		if err != nil {
			return nil, fmt.Errorf("kv: list the bodies stream's payloads: %w", err)
		}
		s.log.Info("the bodies stream's payloads listed, as it has more deleted sequences than are listed", "payloads", len(b.stored), "deleted", info.State.NumDeleted, "took", time.Since(began).Round(time.Millisecond))
		b.Complete, b.listed = true, true
	}
	b.First, b.Last, b.Msgs = info.State.FirstSeq, info.State.LastSeq, info.State.Msgs
	return b, nil
}

// Gone reports whether the payload at seq is known to be gone: before the stream's first
// sequence, or, when Complete, deleted (or not held, when the payloads were listed). A sequence
// past Last, stored after the state was read, is not known to be gone.
func (b *Bodies) Gone(seq uint64) bool {
	switch {
	case seq < b.First:
		return true
	case seq > b.Last || !b.Complete:
		return false
	case b.listed:
		_, held := slices.BinarySearch(b.stored, seq)
		return !held
	}
	_, found := slices.BinarySearch(b.deleted, seq)
	return found
}

// Stored yields, in order, the sequences from First to min(to, Last) that hold a payload. It
// yields nothing unless Complete.
func (b *Bodies) Stored(to uint64) iter.Seq[uint64] {
	return func(yield func(uint64) bool) {
		if !b.Complete || b.Msgs == 0 {
			return
		}
		if b.listed {
			for _, seq := range b.stored {
				if seq > min(to, b.Last) {
					return
				}
				if seq >= b.First && !yield(seq) {
					return
				}
			}
			return
		}
		deleted := b.deleted
		for seq := b.First; seq <= min(to, b.Last); seq++ {
			for len(deleted) > 0 && deleted[0] < seq {
				deleted = deleted[1:]
			}
			if len(deleted) > 0 && deleted[0] == seq {
				continue
			}
			if !yield(seq) {
				return
			}
		}
	}
}

// LastBodySeq returns the bodies stream's last sequence: every payload stored so far is at or
// before it.
func (s *Store) LastBodySeq(ctx context.Context) (uint64, error) {
	info, err := s.bodies.Info(ctx)
	if err != nil {
		return 0, fmt.Errorf("kv: read the bodies stream's state: %w", err)
	}
	return info.State.LastSeq, nil
}

// BodyGone reports whether the payload at seq is gone, as the bodies stream's leader says.
func (s *Store) BodyGone(ctx context.Context, seq uint64) (bool, error) {
	_, err := s.bodyFromLeader(ctx, seq)
	switch {
	case errors.Is(err, ErrNotFound):
		return true, nil
	case err != nil:
		return false, err
	}
	return false, nil
}

// DeleteBody removes the payload at seq. A missing body is not an error.
//
// nats.go reports every refusal of the server as ErrMsgDeleteUnsuccessful: a sequence already
// gone, but also a store that failed to remove it. Only the first is success (a collection takes
// a payload's absence as the proof that its record may go), so a refusal is checked with the
// stream's leader.
func (s *Store) DeleteBody(ctx context.Context, seq uint64) error {
	err := s.bodies.DeleteMsg(ctx, seq)
	if !errors.Is(err, jetstream.ErrMsgNotFound) && !errors.Is(err, jetstream.ErrMsgDeleteUnsuccessful) {
		return err
	}
	if gone, gerr := s.BodyGone(ctx, seq); gerr != nil || !gone {
		return fmt.Errorf("kv: delete payload %d: %w", seq, err)
	}
	return nil
}
