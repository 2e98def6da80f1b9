package subjects

import (
	"encoding/base64"
	"encoding/json"
	"slices"
	"strconv"
	"unicode/utf8"
)

// AppendMessage appends the JSON of m to b: the same bytes as json.Marshal(m). The broker answers
// every dequeue and every complete with messages, so this is on its busiest path; it writes them
// directly when every time in m is a UTC time with a four-digit year (the broker's always are) and
// goes through encoding/json otherwise. FuzzAppendMessage checks that both agree.
func AppendMessage(b []byte, m *Message) ([]byte, error) {
	if !m.plain() {
		data, err := json.Marshal(m)
		return append(b, data...), err
	}
	b = append(b, `{"id":`...)
	b = AppendString(b, m.ID)
	b = append(b, `,"queue":`...)
	b = AppendString(b, m.Queue)
	b = append(b, `,"state":`...)
	b = AppendString(b, string(m.State))
	b = append(b, `,"priority":`...)
	b = strconv.AppendInt(b, m.Priority, 10)
	if len(m.Metadata) > 0 {
		b = append(b, `,"metadata":`...)
		b = appendStringMap(b, m.Metadata)
	}
	if m.Payload != nil {
		b = append(b, `,"payload":`...)
		b = AppendString(b, *m.Payload)
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
		b = AppendString(b, m.LeaseID)
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

// AppendDequeueReply appends the JSON of r to b, as json.Marshal(r) would; see AppendMessage.
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

// plain reports whether AppendMessage can write m directly: its times are plainTime.
func (m *Message) plain() bool {
	return plainTime(m.EnqueuedAt) && plainTime(m.VisibleAt) && plainTime(m.UpdatedAt) &&
		(m.LeaseExpiresAt == nil || plainTime(*m.LeaseExpiresAt)) && (m.EndedAt == nil || plainTime(*m.EndedAt))
}

// appendStringMap appends m as a JSON object the way encoding/json writes it: keys sorted.
func appendStringMap(b []byte, m map[string]string) []byte {
	var stack [16]string
	keys := stack[:0]
	for k := range m {
		keys = append(keys, k)
	}
	slices.Sort(keys)
	b = append(b, '{')
	for i, k := range keys {
		if i > 0 {
			b = append(b, ',')
		}
		b = AppendString(b, k)
		b = append(b, ':')
		b = AppendString(b, m[k])
	}
	return append(b, '}')
}

// jsonSafe holds the ASCII bytes encoding/json writes as they are: printable, DEL too, but for the
// quote, the backslash and <, > and & (escaped for HTML).
var jsonSafe = func() (t [utf8.RuneSelf]bool) {
	for c := range t {
		t[c] = c >= 0x20 && c != '"' && c != '\\' && c != '<' && c != '>' && c != '&'
	}
	return t
}()

// AppendString appends s as a JSON string the way encoding/json writes it: with <, > and & escaped
// for HTML, each invalid UTF-8 byte replaced by U+FFFD, and U+2028 and U+2029 escaped. Encoders that
// write JSON directly use it for their strings.
func AppendString(b []byte, s string) []byte {
	const hex = "0123456789abcdef"
	b = append(b, '"')
	start := 0
	for i := 0; i < len(s); {
		if c := s[i]; c < utf8.RuneSelf {
			if jsonSafe[c] {
				i++
				continue
			}
			b = append(b, s[start:i]...)
			switch c {
			case '"', '\\':
				b = append(b, '\\', c)
			case '\b':
				b = append(b, '\\', 'b')
			case '\f':
				b = append(b, '\\', 'f')
			case '\n':
				b = append(b, '\\', 'n')
			case '\r':
				b = append(b, '\\', 'r')
			case '\t':
				b = append(b, '\\', 't')
			default:
				b = append(b, '\\', 'u', '0', '0', hex[c>>4], hex[c&0xf])
			}
			i++
			start = i
			continue
		}
		r, size := utf8.DecodeRuneInString(s[i:])
		switch {
		case r == utf8.RuneError && size == 1:
			b = append(b, s[start:i]...)
			b = append(b, `\ufffd`...)
		case r == '\u2028' || r == '\u2029':
			b = append(b, s[start:i]...)
			b = append(b, '\\', 'u', '2', '0', '2', hex[r&0xf])
		default:
			i += size
			continue
		}
		i += size
		start = i
	}
	b = append(b, s[start:]...)
	return append(b, '"')
}
