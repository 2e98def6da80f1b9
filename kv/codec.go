package kv

import (
	"encoding/binary"
	"encoding/json"
	"errors"
	"fmt"
	"math"
	"slices"
	"strconv"

	"github.com/natstone/natstone/subjects"
)

// Records are stored in a compact binary form (JSON cost a tenth of the broker's CPU on the hot
// path and a quarter of its recovery time). The first byte is the format's version; a record that
// starts with '{' is the JSON of earlier versions and is still read.
//
// Version 1, after the version byte, in this order: id (string), state (1 byte), priority (varint),
// body_seq, payload_size (uvarint), metadata (uvarint count, then key and value strings, sorted by
// key), version, attempts, max_attempts (uvarint), lease_ms (varint), lease_id (string),
// lease_expires (varint), request_id (string), released (1 byte), enqueued_at, visible_at,
// updated_at, ended_at (varint). A string is a uvarint length and its bytes.
const recordV1 = 1

// maxRecordString bounds a string in a record, so a corrupted length cannot ask for gigabytes.
const maxRecordString = 1 << 16

var stateCodes = []subjects.State{
	subjects.StateInvisible, subjects.StatePending, subjects.StateRunning,
	subjects.StateCompleted, subjects.StateCanceled, subjects.StateErrored,
}

// EncodeRecord encodes r for storage.
func EncodeRecord(r *Record) ([]byte, error) {
	return AppendRecord(make([]byte, 0, 96+len(r.ID)+len(r.LeaseID)+len(r.RequestID)+metadataSize(r.Metadata)), r)
}

// AppendRecord appends r, encoded for storage, to b. On an error b is returned as it was.
func AppendRecord(b []byte, r *Record) ([]byte, error) {
	state := slices.Index(stateCodes, r.State)
	if state < 0 {
		return b, fmt.Errorf("kv: encode record %q: unknown state %q", r.ID, r.State)
	}
	if r.Attempts < 0 || r.MaxAttempts < 0 || r.PayloadSize < 0 {
		return b, fmt.Errorf("kv: encode record %q: negative count", r.ID)
	}
	b = append(b, recordV1)
	b = appendString(b, r.ID)
	b = append(b, byte(state))
	b = binary.AppendVarint(b, r.Priority)
	b = binary.AppendUvarint(b, r.BodySeq)
	b = binary.AppendUvarint(b, uint64(r.PayloadSize))
	b = binary.AppendUvarint(b, uint64(len(r.Metadata)))
	keys := make([]string, 0, len(r.Metadata))
	for k := range r.Metadata {
		keys = append(keys, k)
	}
	slices.Sort(keys)
	for _, k := range keys {
		b = appendString(b, k)
		b = appendString(b, r.Metadata[k])
	}
	b = binary.AppendUvarint(b, r.Version)
	b = binary.AppendUvarint(b, uint64(r.Attempts))
	b = binary.AppendUvarint(b, uint64(r.MaxAttempts))
	b = binary.AppendVarint(b, r.LeaseMS)
	b = appendString(b, r.LeaseID)
	b = binary.AppendVarint(b, r.LeaseExpires)
	b = appendString(b, r.RequestID)
	released := byte(0)
	if r.Released {
		released = 1
	}
	b = append(b, released)
	for _, t := range []int64{r.EnqueuedAt, r.VisibleAt, r.UpdatedAt, r.EndedAt} {
		b = binary.AppendVarint(b, t)
	}
	return b, nil
}

func metadataSize(md map[string]string) int {
	n := 0
	for k, v := range md {
		n += len(k) + len(v) + 4
	}
	return n
}

func appendString(b []byte, s string) []byte {
	b = binary.AppendUvarint(b, uint64(len(s)))
	return append(b, s...)
}

// DecodeRecord decodes a stored record. It rejects records that fail basic invariants, so that a
// corrupted or foreign value never reaches the broker's indexes.
func DecodeRecord(data []byte) (Record, error) {
	var r Record
	var err error
	switch {
	case len(data) > 0 && data[0] == '{':
		r, err = decodeJSON(data)
	case len(data) > 0 && data[0] == recordV1:
		r, err = decodeV1(data[1:])
	default:
		err = errors.New("unknown format")
	}
	if err != nil {
		return Record{}, fmt.Errorf("kv: decode record: %w", err)
	}
	if r.ID == "" {
		return Record{}, errors.New("kv: decode record: empty id")
	}
	if !slices.Contains(stateCodes, r.State) {
		return Record{}, fmt.Errorf("kv: decode record %q: unknown state %q", r.ID, r.State)
	}
	if r.Attempts < 0 || r.MaxAttempts < 0 || r.PayloadSize < 0 {
		return Record{}, fmt.Errorf("kv: decode record %q: negative count", r.ID)
	}
	return r, nil
}

// decodeJSON decodes a record of the JSON form. It is a function of its own so that DecodeRecord's
// Record, whose address json.Unmarshal would take, stays off the heap.
func decodeJSON(data []byte) (Record, error) {
	var r Record
	err := json.Unmarshal(data, &r)
	return r, err
}

// decoder reads the fields of a version 1 record; the first error sticks.
type decoder struct {
	b   []byte
	err error
}

func (d *decoder) fail(what string) {
	if d.err == nil {
		d.err = fmt.Errorf("truncated or malformed %s", what)
	}
}

func (d *decoder) uvarint(what string) uint64 {
	if d.err != nil {
		return 0
	}
	v, n := binary.Uvarint(d.b)
	if n <= 0 {
		d.fail(what)
		return 0
	}
	d.b = d.b[n:]
	return v
}

func (d *decoder) varint(what string) int64 {
	if d.err != nil {
		return 0
	}
	v, n := binary.Varint(d.b)
	if n <= 0 {
		d.fail(what)
		return 0
	}
	d.b = d.b[n:]
	return v
}

func (d *decoder) int(what string) int {
	v := d.uvarint(what)
	if v > math.MaxInt32 {
		d.fail(what)
		return 0
	}
	return int(v)
}

func (d *decoder) byte(what string) byte {
	if d.err != nil || len(d.b) == 0 {
		d.fail(what)
		return 0
	}
	c := d.b[0]
	d.b = d.b[1:]
	return c
}

func (d *decoder) string(what string) string {
	n := d.uvarint(what)
	if d.err != nil || n > maxRecordString || n > uint64(len(d.b)) {
		d.fail(what)
		return ""
	}
	s := string(d.b[:n])
	d.b = d.b[n:]
	return s
}

func decodeV1(b []byte) (Record, error) {
	d := &decoder{b: b}
	var r Record
	r.ID = d.string("id")
	if s := int(d.byte("state")); d.err == nil && s < len(stateCodes) {
		r.State = stateCodes[s]
	} else {
		d.fail("state")
	}
	r.Priority = d.varint("priority")
	r.BodySeq = d.uvarint("body_seq")
	r.PayloadSize = d.int("payload_size")
	if n := d.int("metadata count"); n > 0 {
		if n > len(d.b) { // every pair takes at least two bytes
			d.fail("metadata count")
		} else {
			r.Metadata = make(map[string]string, n)
			for range n {
				k := d.string("metadata key")
				r.Metadata[k] = d.string("metadata value")
			}
		}
	}
	r.Version = d.uvarint("version")
	r.Attempts = d.int("attempts")
	r.MaxAttempts = d.int("max_attempts")
	r.LeaseMS = d.varint("lease_ms")
	r.LeaseID = d.string("lease_id")
	r.LeaseExpires = d.varint("lease_expires")
	r.RequestID = d.string("request_id")
	switch d.byte("released") {
	case 0:
	case 1:
		r.Released = true
	default:
		d.fail("released")
	}
	r.EnqueuedAt = d.varint("enqueued_at")
	r.VisibleAt = d.varint("visible_at")
	r.UpdatedAt = d.varint("updated_at")
	r.EndedAt = d.varint("ended_at")
	if d.err == nil && len(d.b) != 0 {
		d.err = fmt.Errorf("%d bytes after the record", len(d.b))
	}
	return r, d.err
}

// EncodeLock returns l's JSON: the bytes json.Marshal writes (subjects.AppendString escapes the ids
// as encoding/json does). An exclusive queue writes a lock at every lease, so this is on its hot
// path.
func EncodeLock(l Lock) []byte {
	b := make([]byte, 0, len(`{"message_id":"","lease_id":"","version":18446744073709551615,"body_seq":18446744073709551615}`)+len(l.MessageID)+len(l.LeaseID))
	b = append(b, '{')
	if l.MessageID != "" {
		b = append(b, `"message_id":`...)
		b = subjects.AppendString(b, l.MessageID)
	}
	if l.LeaseID != "" {
		if len(b) > 1 {
			b = append(b, ',')
		}
		b = append(b, `"lease_id":`...)
		b = subjects.AppendString(b, l.LeaseID)
	}
	if l.Version != 0 {
		if len(b) > 1 {
			b = append(b, ',')
		}
		b = append(b, `"version":`...)
		b = strconv.AppendUint(b, l.Version, 10)
	}
	if l.BodySeq != 0 {
		if len(b) > 1 {
			b = append(b, ',')
		}
		b = append(b, `"body_seq":`...)
		b = strconv.AppendUint(b, l.BodySeq, 10)
	}
	return append(b, '}')
}
