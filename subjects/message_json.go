package subjects

import (
	"bytes"
	"encoding/base64"
	"encoding/json"
	"strconv"
)

// AppendMessage appends the JSON of m to b: the same bytes as a json.Encoder with
// SetEscapeHTML(false) writes (without its newline), so that <, > and & in payloads and metadata
// take one byte each, not six. The broker answers every dequeue and every complete with messages,
// so this is on its busiest path; it writes them directly when every time in m is a UTC time with
// a four-digit year (the broker's always are) and goes through encoding/json otherwise.
// FuzzAppendMessage checks that both agree.
func AppendMessage(b []byte, m *Message) ([]byte, error) {
	if !m.plain() {
		return appendMarshal(b, m)
	}
	b = append(b, `{"id":`...)
	b = appendText(b, m.ID)
	b = append(b, `,"queue":`...)
	b = appendText(b, m.Queue)
	b = append(b, `,"state":`...)
	b = appendText(b, string(m.State))
	b = append(b, `,"priority":`...)
	b = strconv.AppendInt(b, m.Priority, 10)
	if len(m.Metadata) > 0 {
		b = append(b, `,"metadata":`...)
		b = appendStringMap(b, m.Metadata, &textSafe)
	}
	if m.Payload != nil {
		b = append(b, `,"payload":`...)
		b = appendText(b, *m.Payload)
	}
	if len(m.PayloadBase64) > 0 {
		b = append(b, `,"payload_base64":"`...)
		b = base64.StdEncoding.AppendEncode(b, m.PayloadBase64)
		b = append(b, '"')
	}
	b = append(b, `,"version":`...)
	b = strconv.AppendUint(b, m.Version, 10)
	b = append(b, `,"attempts":`...)
	b = strconv.AppendInt(b, int64(m.Attempts), 10)
	b = append(b, `,"attempts_left":`...)
	b = strconv.AppendInt(b, int64(m.AttemptsLeft), 10)
	if m.LeaseID != "" {
		b = append(b, `,"lease_id":`...)
		b = appendText(b, m.LeaseID)
	}
	if m.LeaseExpiresAt != nil {
		b = append(b, `,"lease_expires_at":`...)
		b = appendTime(b, *m.LeaseExpiresAt)
	}
	b = append(b, `,"enqueued_at":`...)
	b = appendTime(b, m.EnqueuedAt)
	b = append(b, `,"visible_at":`...)
	b = appendTime(b, m.VisibleAt)
	b = append(b, `,"updated_at":`...)
	b = appendTime(b, m.UpdatedAt)
	if m.EndedAt != nil {
		b = append(b, `,"ended_at":`...)
		b = appendTime(b, *m.EndedAt)
	}
	return append(b, '}'), nil
}

// AppendDequeueReply appends the JSON of r to b, as AppendMessage writes messages.
func AppendDequeueReply(b []byte, r *DequeueReply) ([]byte, error) {
	if r.Messages == nil {
		return append(b, `{"messages":null}`...), nil
	}
	b = append(b, `{"messages":[`...)
	for i := range r.Messages {
		if i > 0 {
			b = append(b, ',')
		}
		var err error
		if b, err = AppendMessage(b, &r.Messages[i]); err != nil {
			return b, err
		}
	}
	return append(b, "]}"...), nil
}

// AppendSettleReply appends the JSON of r to b, as AppendMessage writes messages.
func AppendSettleReply(b []byte, r *SettleReply) ([]byte, error) {
	if !r.plain() || r.Next == nil || r.Next.Messages == nil || r.Next.Error != nil {
		return appendMarshal(b, r) // rare: only a failed next has an error
	}
	b, err := AppendMessage(b, &r.Message)
	if err != nil {
		return b, err
	}
	b = append(b[:len(b)-1], `,"next":`...) // in place of the message's closing brace
	if b, err = AppendDequeueReply(b, &DequeueReply{Messages: r.Next.Messages}); err != nil {
		return b, err
	}
	return append(b, '}'), nil
}

// Marshal returns the JSON of v as the broker's replies carry it: as json.Marshal writes it, but
// with HTML escaping off (see AppendMessage).
func Marshal(v any) ([]byte, error) { return appendMarshal(nil, v) }

// appendMarshal appends v as a json.Encoder with SetEscapeHTML(false) writes it, without its newline.
func appendMarshal(b []byte, v any) ([]byte, error) {
	buf := bytes.NewBuffer(b)
	enc := json.NewEncoder(buf)
	enc.SetEscapeHTML(false)
	if err := enc.Encode(v); err != nil {
		return b, err
	}
	return bytes.TrimSuffix(buf.Bytes(), []byte("\n")), nil
}

// plain reports whether AppendMessage can write m directly: its times are plainTime.
func (m *Message) plain() bool {
	return plainTime(m.EnqueuedAt) && plainTime(m.VisibleAt) && plainTime(m.UpdatedAt) &&
		(m.LeaseExpiresAt == nil || plainTime(*m.LeaseExpiresAt)) && (m.EndedAt == nil || plainTime(*m.EndedAt))
}
