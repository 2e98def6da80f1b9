package subjects

import (
	"slices"
	"time"
	"unicode/utf8"
)

// The JSON writers that AppendMessage, AppendEvent and kv.EncodeLock share: each writes what
// encoding/json would, without reflection. Events and locks are written as json.Marshal writes them,
// with <, > and & escaped for HTML; messages (replies) as a json.Encoder with SetEscapeHTML(false)
// writes them, which leaves HTML and XML payloads readable and no larger than escapes must make them.

// appendStringMap appends m as a JSON object the way encoding/json writes it: keys sorted. safe is
// htmlSafe or textSafe.
func appendStringMap(b []byte, m map[string]string, safe *[utf8.RuneSelf]bool) []byte {
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
		b = appendString(b, k, safe)
		b = append(b, ':')
		b = appendString(b, m[k], safe)
	}
	return append(b, '}')
}

// htmlSafe holds the ASCII bytes json.Marshal writes as they are: printable, DEL too, but for the
// quote, the backslash and <, > and & (escaped for HTML). textSafe holds those a json.Encoder with
// SetEscapeHTML(false) writes as they are: <, > and & too.
var htmlSafe, textSafe = func() (html, text [utf8.RuneSelf]bool) {
	for c := range html {
		text[c] = c >= 0x20 && c != '"' && c != '\\'
		html[c] = text[c] && c != '<' && c != '>' && c != '&'
	}
	return html, text
}()

// AppendString appends s as a JSON string the way json.Marshal writes it: with <, > and & escaped
// for HTML, each invalid UTF-8 byte replaced by U+FFFD, and U+2028 and U+2029 escaped. Encoders that
// write JSON directly use it for their strings.
func AppendString(b []byte, s string) []byte { return appendString(b, s, &htmlSafe) }

// appendText appends s as a JSON string the way a json.Encoder with SetEscapeHTML(false) writes it:
// as AppendString does, but for <, > and &, which it writes as they are.
func appendText(b []byte, s string) []byte { return appendString(b, s, &textSafe) }

// appendString appends s as a JSON string, writing the ASCII bytes that safe holds as they are.
func appendString(b []byte, s string, safe *[utf8.RuneSelf]bool) []byte {
	const hex = "0123456789abcdef"
	b = append(b, '"')
	start := 0
	for i := 0; i < len(s); {
		if c := s[i]; c < utf8.RuneSelf {
			if safe[c] {
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

// StringLen returns what s takes in a message's JSON (AppendMessage), quotes included, without
// writing it.
func StringLen(s string) int {
	n := 2
	for i := 0; i < len(s); {
		if c := s[i]; c < utf8.RuneSelf {
			n += int(textWidth[c])
			i++
			continue
		}
		r, size := utf8.DecodeRuneInString(s[i:])
		switch {
		case r == utf8.RuneError && size == 1, r == '\u2028', r == '\u2029':
			n += 6
		default:
			n += size
		}
		i += size
	}
	return n
}

// textWidth is what each ASCII byte takes in a JSON string that appendText writes: one byte as it
// is (textSafe), two as \", \\ or a short escape of a control character (\n, \t…), six as \u00XX.
var textWidth = func() (w [utf8.RuneSelf]uint8) {
	for c := range w {
		switch {
		case textSafe[c]:
			w[c] = 1
		case c == '"' || c == '\\' || c == '\b' || c == '\f' || c == '\n' || c == '\r' || c == '\t':
			w[c] = 2
		default:
			w[c] = 6
		}
	}
	return w
}()

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
