package subjects

import (
	"bytes"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"reflect"
	"slices"
	"strconv"
	"strings"
	"time"
	"unicode"
	"unicode/utf8"
)

// Headers of the enqueue_raw form. Header names are case-insensitive.
const (
	HeaderID          = "Natstone-Id"           // message id
	HeaderPriority    = "Natstone-Priority"     // int64, decimal
	HeaderMetadata    = "Natstone-Metadata"     // a JSON object of string values
	HeaderInvisibleMS = "Natstone-Invisible-Ms" // int64 ms, decimal
	HeaderLeaseMS     = "Natstone-Lease-Ms"     // int64 ms, decimal
	HeaderMaxAttempts = "Natstone-Max-Attempts" // decimal
	HeaderVisibleAt   = "Natstone-Visible-At"   // RFC 3339 time
)

// rawHeaders are the headers enqueue_raw reads.
var rawHeaders = []string{HeaderID, HeaderPriority, HeaderMetadata, HeaderInvisibleMS, HeaderLeaseMS, HeaderMaxAttempts, HeaderVisibleAt}

// Decode strictly decodes a JSON request body into v: one object of valid UTF-8, no unknown fields,
// nothing after it. An empty (or all white space) body, or null, leaves v at its zero value. Errors
// are *Error with CodeBadRequest.
func Decode(data []byte, v any) error {
	if Blank(data) {
		return nil
	}
	if !utf8.Valid(data) {
		// encoding/json would replace each invalid byte with U+FFFD: an id or payload other than
		// the one sent.
		return Errorf(CodeBadRequest, "malformed JSON body: not valid UTF-8")
	}
	if loneSurrogate(data) {
		return Errorf(CodeBadRequest, "malformed JSON body: %s", errLoneSurrogate)
	}
	dec := json.NewDecoder(bytes.NewReader(data))
	dec.DisallowUnknownFields()
	if err := dec.Decode(v); err != nil {
		if where, ok := badTime(data); ok && timeError(err) {
			return Errorf(CodeBadRequest, "malformed JSON body: %s", where)
		}
		return Errorf(CodeBadRequest, "malformed JSON body: %s", describeJSONError(err))
	}
	if _, err := dec.Token(); !errors.Is(err, io.EOF) {
		return Errorf(CodeBadRequest, "malformed JSON body: data after the object")
	}
	if key, ok := duplicateKey(data); ok {
		return Errorf(CodeBadRequest, "malformed JSON body: %q given twice in one object", key)
	}
	return nil
}

// EmptyLeaseID reports whether data, a body that decoded, gives its top-level "lease_id" as "" rather
// than leaving it out (or null): a cancel with a lease id it forgot to fill in, which is not an
// operator's cancel.
func EmptyLeaseID(data []byte) bool {
	var probe struct {
		LeaseID *string `json:"lease_id"`
	}
	return json.Unmarshal(data, &probe) == nil && probe.LeaseID != nil && *probe.LeaseID == ""
}

// describeJSONError words an error of encoding/json for the sender of the body, in the protocol's
// terms rather than Go's: "batch: want an integer, got string", not "cannot unmarshal string into
// Go struct field DequeueRequest.batch of type int".
func describeJSONError(err error) string {
	var te *json.UnmarshalTypeError
	if errors.As(err, &te) {
		where := "the body"
		if te.Field != "" {
			where = te.Field
		}
		return fmt.Sprintf("%s: want %s, got %s", where, jsonKind(te.Type), te.Value)
	}
	return strings.TrimPrefix(err.Error(), "json: ")
}

// timeError reports whether err is time.Time's UnmarshalJSON's: only then does badTime, which
// decodes the body again, look for the time (a body of a request without one, with a visible_at,
// is an unknown field).
func timeError(err error) bool {
	var pe *time.ParseError
	return errors.As(err, &pe) || strings.HasPrefix(err.Error(), "Time.UnmarshalJSON")
}

// badTime names the visible_at of data (a request's only time, top level or in an enqueue batch's
// messages) that does not decode as a time, and says what it wants: encoding/json's error for it
// names no field.
func badTime(data []byte) (string, bool) {
	var probe struct {
		VisibleAt json.RawMessage `json:"visible_at"`
		Messages  []struct {
			VisibleAt json.RawMessage `json:"visible_at"`
		} `json:"messages"`
	}
	if json.Unmarshal(data, &probe) != nil {
		return "", false
	}
	describe := func(where string, raw json.RawMessage) (string, bool) {
		var t time.Time
		if len(raw) == 0 || string(raw) == "null" || json.Unmarshal(raw, &t) == nil {
			return "", false
		}
		if raw[0] != '"' {
			return fmt.Sprintf("%s: want an RFC 3339 time in a string (\"2026-11-28T09:00:00Z\"), got %s", where, raw), true
		}
		return fmt.Sprintf("%s: want an RFC 3339 time (2026-11-28T09:00:00Z), got %s", where, raw), true
	}
	if d, ok := describe("visible_at", probe.VisibleAt); ok {
		return d, true
	}
	for i, m := range probe.Messages {
		if d, ok := describe(fmt.Sprintf("messages[%d].visible_at", i), m.VisibleAt); ok {
			return d, true
		}
	}
	return "", false
}

// jsonKind is what JSON value decodes into a value of type t.
func jsonKind(t reflect.Type) string {
	for t != nil && t.Kind() == reflect.Pointer {
		t = t.Elem()
	}
	if t == nil {
		return "another value"
	}
	switch t.Kind() {
	case reflect.String:
		return "a string"
	case reflect.Int, reflect.Int8, reflect.Int16, reflect.Int32, reflect.Int64:
		return fmt.Sprintf("an integer (%d-bit)", t.Bits())
	case reflect.Uint, reflect.Uint8, reflect.Uint16, reflect.Uint32, reflect.Uint64:
		return fmt.Sprintf("a non-negative integer (%d-bit)", t.Bits())
	case reflect.Bool:
		return "true or false"
	case reflect.Struct, reflect.Map:
		return "an object"
	case reflect.Slice, reflect.Array:
		if t.Elem().Kind() == reflect.Uint8 {
			return "a base64 string"
		}
		return "an array"
	}
	return "another value"
}

// duplicateKey returns a key that valid JSON text data gives twice in one object. encoding/json
// keeps the last value and drops the others silently: a batch's messages, an id checked before
// another replaced it. The names of a request's fields match whatever their case (as encoding/json
// matches them), so they are compared case-folded; the keys of metadata and filters are compared as
// they are, "k" and "K" being two keys. It reads data once, decoding only the keys.
func duplicateKey(data []byte) (string, bool) { return duplicateKeyIn(data, true) }

// duplicateKeyIn is duplicateKey of a value whose objects' keys are field names (fields), or, for
// a map, a map's keys.
func duplicateKeyIn(data []byte, fields bool) (string, bool) {
	stack := make([]keyFrame, 0, 4)
	for i := 0; i < len(data); i++ {
		switch c := data[i]; c {
		case '{', '[':
			fold := fields
			if n := len(stack); n > 0 && stack[n-1].object {
				last := string(stack[n-1].last) // not copied to compare
				fold = last != pairsFields[0] && last != pairsFields[1]
			}
			stack = append(stack, keyFrame{object: c == '{', fold: fold, wantKey: c == '{'})
		case '}', ']':
			stack = stack[:len(stack)-1]
		case ',':
			if f := &stack[len(stack)-1]; f.object {
				f.wantKey = true
			}
		case '"':
			end := i + 1
			for {
				end += bytes.IndexByte(data[end:], '"') // valid JSON: there is one
				backslashes := 0
				for data[end-1-backslashes] == '\\' {
					backslashes++
				}
				if backslashes%2 == 0 {
					break // not escaped
				}
				end++
			}
			if n := len(stack); n > 0 && stack[n-1].wantKey {
				f := &stack[n-1]
				k := data[i+1 : end]
				if bytes.IndexByte(k, '\\') >= 0 || f.fold && !folded(k) {
					var key string
					_ = json.Unmarshal(data[i:end+1], &key) // valid JSON: it decodes
					if f.fold {
						key = foldKey(key)
					}
					k = []byte(key)
				}
				if f.seen(k) {
					var key string
					_ = json.Unmarshal(data[i:end+1], &key)
					return key, true
				}
				f.last, f.wantKey = k, false
			}
			i = end
		}
	}
	return "", false
}

// jsonSpace is JSON's white space. Other Unicode spaces (bytes.TrimSpace's) are not JSON.
const jsonSpace = " \t\r\n"

// Blank reports whether data, a request's body, is empty or JSON's white space alone: no body,
// which Decode leaves v as it is for.
func Blank(data []byte) bool { return len(bytes.Trim(data, jsonSpace)) == 0 }

// errLoneSurrogate says why loneSurrogate's text is refused.
const errLoneSurrogate = `a \u escape of half a UTF-16 surrogate pair (such as \ud800) is not a character`

// loneSurrogate reports whether the JSON text data has a \u escape of a UTF-16 surrogate that is not
// half of a pair. encoding/json decodes one to U+FFFD, so that "\ud800" and "\udbff" would be
// the same id, and neither the one sent. A backslash can only be in a string, so data is read
// escape by escape from its first byte.
func loneSurrogate(data []byte) bool {
	for i := bytes.IndexByte(data, '\\'); i >= 0 && i+1 < len(data); {
		if data[i+1] == 'u' {
			switch r := hex4(data[i+2:]); {
			case r >= 0xdc00 && r <= 0xdfff:
				return true // a low half first
			case r >= 0xd800 && r <= 0xdbff:
				if len(data) < i+12 || data[i+6] != '\\' || data[i+7] != 'u' {
					return true
				}
				if r2 := hex4(data[i+8:]); r2 < 0xdc00 || r2 > 0xdfff {
					return true
				}
				i += 6 // the pair's high half; its low half is skipped below
			}
		}
		i += 2 // the escape's backslash and letter: \\ is not the start of another
		j := bytes.IndexByte(data[i:], '\\')
		if j < 0 {
			break
		}
		i += j
	}
	return false
}

// keyFrame is an object or an array that duplicateKey is in.
type keyFrame struct {
	object  bool
	fold    bool // an object of fields, not a map
	wantKey bool
	last    []byte              // the last key read (folded)
	keys    [][]byte            // the keys read (folded), while few
	set     map[string]struct{} // past a few
}

// seen reports whether f has had key k, and records it.
func (f *keyFrame) seen(k []byte) bool {
	if f.set == nil {
		if slices.ContainsFunc(f.keys, func(b []byte) bool { return bytes.Equal(b, k) }) {
			return true
		}
		if f.keys = append(f.keys, k); len(f.keys) <= 8 {
			return false
		}
		f.set = make(map[string]struct{}, 2*len(f.keys))
		for _, k := range f.keys {
			f.set[string(k)] = struct{}{}
		}
		return false
	}
	if _, ok := f.set[string(k)]; ok {
		return true
	}
	f.set[string(k)] = struct{}{}
	return false
}

// folded reports whether foldKey leaves the key k as it is (lower-case ASCII letters, digits and _:
// the names of every field).
func folded(k []byte) bool {
	for _, c := range k {
		if !('a' <= c && c <= 'z' || '0' <= c && c <= '9' || c == '_') {
			return false
		}
	}
	return true
}

// pairsFields are the fields whose values are Pairs (folded): maps, whose keys are compared as
// they are.
var pairsFields = [2]string{foldKey("metadata"), foldKey("filter")}

// foldKey returns s with each letter replaced by one letter of those it equals under Unicode
// simple case folding (the lower case of the least), as strings.EqualFold (and encoding/json's field
// matching) compares them: "ID" and "id" fold alike, and so do "k", "K" and the Kelvin sign. A key
// in lower-case ASCII is returned as it is.
func foldKey(s string) string {
	return strings.Map(func(r rune) rune {
		if 'a' <= r && r <= 'z' || '0' <= r && r <= '9' || r == '_' {
			return r
		}
		least := r
		for f := unicode.SimpleFold(r); f != r; f = unicode.SimpleFold(f) {
			least = min(least, f)
		}
		return unicode.ToLower(least)
	}, s)
}

// hex4 decodes the four hex digits that start b, or returns -1.
func hex4(b []byte) rune {
	if len(b) < 4 {
		return -1
	}
	var r rune
	for _, c := range b[:4] {
		switch {
		case '0' <= c && c <= '9':
			c -= '0'
		case 'a' <= c && c <= 'f':
			c -= 'a' - 10
		case 'A' <= c && c <= 'F':
			c -= 'A' - 10
		default:
			return -1
		}
		r = r<<4 | rune(c)
	}
	return r
}

// DecodeRawEnqueue builds an EnqueueRequest from the enqueue_raw form: body is the payload, the
// attributes come from the Natstone-* headers (missing headers leave fields unset). Header names
// are matched case-insensitively; an unknown Natstone-* name or one given twice is an error, as an
// unknown field of a JSON body is. Other headers are left to whoever sent them.
func DecodeRawEnqueue(header map[string][]string, body []byte) (EnqueueRequest, error) {
	req := EnqueueRequest{PayloadBase64: body}
	if req.PayloadBase64 == nil {
		req.PayloadBase64 = []byte{}
	}
	values := map[string]string{} // by the name of its constant
	for k, vs := range header {
		if !token(k) {
			// nats.go keeps a malformed line's name as it is (" Natstone-Id", a continuation
			// line; "Natstone Id"): taken for another header, it would enqueue without its id.
			return EnqueueRequest{}, Errorf(CodeBadRequest, "header name %q is not a token (RFC 9110): a line of the header block is malformed", k)
		}
		const prefix = "Natstone-"
		if len(k) < len(prefix) || !strings.EqualFold(k[:len(prefix)], prefix) {
			continue
		}
		i := slices.IndexFunc(rawHeaders, func(name string) bool { return strings.EqualFold(k, name) })
		if i < 0 {
			return EnqueueRequest{}, Errorf(CodeBadRequest, "header %s: unknown; enqueue_raw takes %s", k, strings.Join(rawHeaders, ", "))
		}
		name := rawHeaders[i]
		if _, dup := values[name]; dup || len(vs) > 1 {
			// NATS headers keep the sender's case, so one name can also come under two spellings.
			return EnqueueRequest{}, Errorf(CodeBadRequest, "header %s: given more than once", name)
		}
		if len(vs) == 1 {
			values[name] = vs[0]
		}
	}
	if v, ok := values[HeaderID]; ok {
		if v == "" {
			return EnqueueRequest{}, Errorf(CodeInvalidID, "header %s: %s", HeaderID, errEmptyID.Message)
		}
		if strings.TrimRight(v, " \t") != v {
			// Not part of the value for HTTP, yet kept by nats.go (which drops the leading ones): a
			// client that trims would name another message than one that does not.
			return EnqueueRequest{}, Errorf(CodeInvalidID, "header %s: %q ends in white space", HeaderID, v)
		}
		req.ID = v
	}
	for _, h := range []struct {
		name string
		dst  **int64
	}{{HeaderPriority, &req.Priority}, {HeaderInvisibleMS, &req.InvisibleMS}, {HeaderLeaseMS, &req.LeaseMS}, {HeaderMaxAttempts, &req.MaxAttempts}} {
		v, ok := values[h.name]
		if !ok {
			continue
		}
		n, err := strconv.ParseInt(v, 10, 64)
		if err != nil || v[0] == '+' || leadingZero(v) { // as JSON numbers: no plus sign, no 007
			return EnqueueRequest{}, Errorf(CodeBadRequest, "header %s: %q is not an int64 written as JSON writes it (decimal digits after an optional -, no leading zero, no +)", h.name, v)
		}
		*h.dst = &n
	}
	if v, ok := values[HeaderVisibleAt]; ok {
		var at time.Time
		if err := at.UnmarshalText([]byte(v)); err != nil { // strictly RFC 3339, as in the JSON form
			return EnqueueRequest{}, Errorf(CodeBadRequest, "header %s: %q is not an RFC 3339 time (2026-11-28T09:00:00Z)", HeaderVisibleAt, v)
		}
		req.VisibleAt = &at
	}
	if v, ok := values[HeaderMetadata]; ok {
		if !utf8.ValidString(v) {
			return EnqueueRequest{}, Errorf(CodeBadRequest, "header %s: not valid UTF-8", HeaderMetadata)
		}
		if loneSurrogate([]byte(v)) {
			return EnqueueRequest{}, Errorf(CodeBadRequest, "header %s: %s", HeaderMetadata, errLoneSurrogate)
		}
		if err := json.Unmarshal([]byte(v), &req.Metadata); err != nil {
			return EnqueueRequest{}, Errorf(CodeBadRequest, "header %s: want a JSON object of strings: %v", HeaderMetadata, err)
		}
		if key, dup := duplicateKeyIn([]byte(v), false); dup {
			return EnqueueRequest{}, Errorf(CodeBadRequest, "header %s: %q given twice", HeaderMetadata, key)
		}
	}
	return req, nil
}

// leadingZero reports whether the decimal v has a zero before other digits ("007", "-01"), which a
// JSON number may not.
func leadingZero(v string) bool {
	v = strings.TrimPrefix(v, "-")
	return len(v) > 1 && v[0] == '0'
}

// PayloadBytes returns the payload of r and whether both payload forms were given (which is an error).
func (r *EnqueueRequest) PayloadBytes() ([]byte, error) {
	if r.Payload != "" && len(r.PayloadBase64) > 0 {
		return nil, Errorf(CodeBadRequest, "give payload or payload_base64, not both")
	}
	if r.Payload != "" {
		return []byte(r.Payload), nil
	}
	if r.PayloadBase64 == nil {
		return []byte{}, nil
	}
	return r.PayloadBase64, nil
}

// SetPayload stores p in m as Payload, a JSON string, when p is valid UTF-8 that JSON escapes grow by
// no more than MaxPayloadJSON allows; else as PayloadBase64. Text, JSON and HTML stay readable, while
// bytes that happen to be UTF-8 but are mostly control characters (six bytes each in a JSON string,
// as in many protobuf messages) go as base64, so that no payload takes more than MaxPayloadJSON of
// its size in a reply.
func (m *Message) SetPayload(p []byte) {
	if utf8.Valid(p) {
		if s := string(p); StringLen(s) <= MaxPayloadJSON(len(p)) {
			m.Payload, m.PayloadBase64 = &s, nil
			return
		}
	}
	m.Payload, m.PayloadBase64 = nil, p
}

// MaxPayloadJSON is the most a payload of n bytes takes in a reply, quotes included (SetPayload): half
// again its size, and 18 bytes, enough for short strings of quotes and for base64's padding.
func MaxPayloadJSON(n int) int { return n + n/2 + 18 }

// PayloadBytes returns the payload carried by m (nil if it carries none).
func (m *Message) PayloadBytes() []byte {
	if m.Payload != nil {
		return []byte(*m.Payload)
	}
	return m.PayloadBase64
}

// ValidateID checks a message id: 1 to MaxIDLen bytes of printable UTF-8.
func ValidateID(id string) error {
	if id == "" || len(id) > MaxIDLen {
		return Errorf(CodeInvalidID, "id must be 1 to %d bytes, got %d", MaxIDLen, len(id))
	}
	if !printable(id) {
		return Errorf(CodeInvalidID, "id %q must be printable UTF-8", id)
	}
	return nil
}

// ValidateRequestID checks a dequeue request id (empty means none).
func ValidateRequestID(id string) error {
	if len(id) > MaxRequestIDLen || !printable(id) {
		return Errorf(CodeBadRequest, "request_id must be at most %d bytes of printable UTF-8", MaxRequestIDLen)
	}
	return nil
}

// token reports whether s is an HTTP token (RFC 9110, 5.6.2), as a header's name must be.
func token(s string) bool {
	if s == "" {
		return false
	}
	for i := range len(s) {
		c := s[i]
		if c >= 'a' && c <= 'z' || c >= 'A' && c <= 'Z' || c >= '0' && c <= '9' || strings.IndexByte("!#$%&'*+-.^_`|~", c) >= 0 {
			continue
		}
		return false
	}
	return true
}

// CutText returns the longest prefix of s of at most n bytes that ends on a character's boundary.
func CutText(s string, n int) string {
	if len(s) <= n {
		return s
	}
	for n > 0 && !utf8.RuneStart(s[n]) {
		n--
	}
	return s[:n]
}

// Pairs are a message's metadata, or a filter on it: keys and values are strings. They decode as
// a map[string]string does, except that a null value is an error: encoding/json would take it for
// "", a value the sender did not give. A null for the whole object is no pairs, as usual.
type Pairs map[string]string

// UnmarshalJSON decodes a JSON object of strings.
func (p *Pairs) UnmarshalJSON(data []byte) error {
	var m map[string]*string
	if err := json.Unmarshal(data, &m); err != nil {
		return err
	}
	if m == nil {
		*p = nil
		return nil
	}
	out := make(Pairs, len(m))
	for k, v := range m {
		if v == nil {
			return fmt.Errorf("the value of %q is null, not a string", k)
		}
		out[k] = *v
	}
	*p = out
	return nil
}

// ValidateMetadata checks metadata pairs (or a filter) against the protocol limits and maxPairs.
func ValidateMetadata(md map[string]string, maxPairs int) error {
	if len(md) > maxPairs {
		return Errorf(CodeInvalidMetadata, "%d metadata pairs, at most %d allowed", len(md), maxPairs)
	}
	for k, v := range md {
		if k == "" || len(k) > MaxMetadataKeyLen || !printable(k) {
			return Errorf(CodeInvalidMetadata, "metadata key %q must be 1 to %d bytes of printable UTF-8", k, MaxMetadataKeyLen)
		}
		if len(v) > MaxMetadataValueLen || !printable(v) {
			return Errorf(CodeInvalidMetadata, "metadata value of %q must be at most %d bytes of printable UTF-8", k, MaxMetadataValueLen)
		}
	}
	return nil
}

// printable reports whether s is valid UTF-8 without control characters.
func printable(s string) bool {
	if !utf8.ValidString(s) {
		return false
	}
	for _, r := range s {
		if unicode.IsControl(r) {
			return false
		}
	}
	return true
}

// ValidateError checks a release's error (why the attempt failed) or a cancel's (why it was
// canceled); empty means not said. Any text
// goes, new lines too (the body's decoding has checked that it is UTF-8); only its length is bounded.
func ValidateError(e string) error {
	if len(e) > MaxErrorLen {
		return Errorf(CodeBadRequest, "error must be at most %d bytes, got %d", MaxErrorLen, len(e))
	}
	return nil
}

// ValidateNote checks the note of a schedule's pause or resume (empty means none).
func ValidateNote(n string) error {
	switch {
	case len(n) > MaxNoteLen:
		return Errorf(CodeBadRequest, "note must be at most %d bytes of printable UTF-8, got %d bytes", MaxNoteLen, len(n))
	case !printable(n):
		return Errorf(CodeBadRequest, "note must be printable UTF-8: no control characters (new lines, tabs) or invalid bytes")
	}
	return nil
}

// ValidateWorker checks a dequeue's worker name (empty means none).
func ValidateWorker(w string) error {
	if len(w) > MaxWorkerLen || !printable(w) {
		return Errorf(CodeBadRequest, "worker must be at most %d bytes of printable UTF-8", MaxWorkerLen)
	}
	return nil
}
