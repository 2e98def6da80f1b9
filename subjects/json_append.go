package subjects

import (
	"slices"
	"time"
	"unicode/utf8"
)

// The JSON writers that AppendMessage, AppendEvent and kv.EncodeLock share: each writes what
// encoding/json would, without reflection.

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

// plainTime reports whether t is a UTC time whose RFC 3339 form time.Time's MarshalJSON accepts
// (a four-digit year).
func plainTime(t time.Time) bool {
	return t.Location() == time.UTC && t.Year() >= 0 && t.Year() <= 9999
}

// appendTime appends t as time.Time's MarshalJSON does.
func appendTime(b []byte, t time.Time) []byte {
	b = append(b, '"')
	b = t.AppendFormat(b, time.RFC3339Nano)
	return append(b, '"')
}
