package kv

import (
	"encoding/base64"

	"github.com/natstone/natstone/subjects"
)

// Record is a message as stored: everything but the payload. Times are Unix milliseconds.
type Record struct {
	ID           string            `json:"id"`
	State        subjects.State    `json:"state"`
	Priority     int64             `json:"priority"`
	BodySeq      uint64            `json:"body_seq"` // the payload's sequence in the bodies stream
	PayloadSize  int               `json:"payload_size"`
	Metadata     map[string]string `json:"metadata,omitempty"`
	Version      uint64            `json:"version"`
	Attempts     int               `json:"attempts"`
	MaxAttempts  int               `json:"max_attempts"`
	LeaseMS      int64             `json:"lease_ms,omitempty"` // the message's own lease default; 0 = the queue's
	LeaseID      string            `json:"lease_id,omitempty"`
	LeaseExpires int64             `json:"lease_expires,omitempty"`
	RequestID    string            `json:"request_id,omitempty"` // the dequeue request of the current or last lease
	Released     bool              `json:"released,omitempty"`   // the last lease ended by release
	EnqueuedAt   int64             `json:"enqueued_at"`
	VisibleAt    int64             `json:"visible_at"`
	UpdatedAt    int64             `json:"updated_at"`
	EndedAt      int64             `json:"ended_at,omitempty"`
}

// Lock names the message and lease that last took an exclusivity value. It holds the value only
// while that message is running under that lease; one with an empty MessageID (as earlier versions
// wrote to free a value) holds nothing. Version is the version the message's record has once that
// lease is written (0 in locks of earlier versions): a record past it has been written since, so
// no write of that lease can still land (recovery's fence). BodySeq is the message's payload
// sequence (0 in locks written before 2026-11-28), which tells it apart from a message enqueued
// later under the same id.
type Lock struct {
	MessageID string `json:"message_id,omitempty"`
	LeaseID   string `json:"lease_id,omitempty"`
	Version   uint64 `json:"version,omitempty"`
	BodySeq   uint64 `json:"body_seq,omitempty"`
}

// QueueRecord is a queue as stored.
type QueueRecord struct {
	Config    subjects.QueueConfig `json:"config"`
	CreatedAt int64                `json:"created_at"` // Unix ms
}

// encodeToken maps an arbitrary string (message id, exclusivity value) to a KV key token:
// unpadded base64url, whose alphabet ([A-Za-z0-9_-]) is valid in keys and subjects.
func encodeToken(s string) string { return base64.RawURLEncoding.EncodeToString([]byte(s)) }

func decodeToken(tok string) (string, error) {
	b, err := base64.RawURLEncoding.DecodeString(tok)
	return string(b), err
}

// validToken reports whether decodeToken would accept tok, without decoding it: unpadded base64url
// has no length of the form 4k+1 and only the 64 characters of its alphabet.
func validToken(tok string) bool {
	if len(tok)%4 == 1 {
		return false
	}
	for i := 0; i < len(tok); i++ {
		switch c := tok[i]; {
		case 'A' <= c && c <= 'Z', 'a' <= c && c <= 'z', '0' <= c && c <= '9', c == '-', c == '_':
		default:
			return false
		}
	}
	return true
}
