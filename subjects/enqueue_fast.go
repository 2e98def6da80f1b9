package subjects

import (
	"bytes"
	"encoding/json"
	"strconv"
)

// DecodeEnqueue decodes an enqueue body, as Decode would.
//
// Most enqueue bodies are one flat object of plain ASCII strings and integers, and the payload is
// most of their bytes. encoding/json reads each body twice, byte by byte (once to find its end,
// once to decode it), which made decoding a sixth of all CPU when enqueueing 2 KiB payloads. Such a
// body is decoded here in one pass that finds each string's end with a byte search. Anything else
// — other keys or another case of them, escapes, non-ASCII text, control characters, nulls,
// fractions or exponents, duplicate keys, trailing data — goes to Decode, so the result (and every
// error) is Decode's; FuzzDecodeEnqueue checks that both agree.
//
// An id given empty is invalid_id, not an id to generate (which omitting it asks for): a client
// that always sends the field with an id it failed to set would lose the enqueue's idempotency.
func DecodeEnqueue(data []byte) (EnqueueRequest, error) {
	var r EnqueueRequest
	if p, ok := fastEnqueue(data, 0, &r); ok && skip(data, p) == len(data) {
		return r, nil
	}
	r = EnqueueRequest{}
	if err := Decode(data, &r); err != nil {
		return r, err
	}
	if r.ID == "" && idGivenEmpty(data) {
		return EnqueueRequest{}, errEmptyID
	}
	return r, nil
}

// idGivenEmpty reports whether the object of data, whose "id" decoded empty, has "id": "" rather
// than no id (or a null one).
func idGivenEmpty(data []byte) bool {
	if !bytes.Contains(data, []byte(`""`)) { // an empty id is "" in any JSON
		return false
	}
	var given struct {
		ID *string `json:"id"`
	}
	return json.Unmarshal(data, &given) == nil && given.ID != nil
}

// DecodeEnqueueBatch decodes an enqueue_batch body, as Decode would; see DecodeEnqueue.
func DecodeEnqueueBatch(data []byte) (EnqueueBatchRequest, error) {
	var r EnqueueBatchRequest
	if fastEnqueueBatch(data, &r) {
		return r, nil
	}
	r = EnqueueBatchRequest{}
	if err := Decode(data, &r); err != nil {
		return r, err
	}
	var given struct {
		Messages []*struct {
			ID *string `json:"id"`
		} `json:"messages"`
	}
	if (bytes.Contains(data, []byte(`""`)) || bytes.Contains(data, []byte("null"))) && json.Unmarshal(data, &given) == nil {
		for i, m := range given.Messages {
			switch {
			case m == nil: // encoding/json would make it a message of defaults
				return EnqueueBatchRequest{}, Errorf(CodeBadRequest, "messages[%d] is null, not a message", i)
			case m.ID != nil && *m.ID == "":
				return EnqueueBatchRequest{}, Errorf(CodeInvalidID, "messages[%d]: %s", i, errEmptyID.Message)
			}
		}
	}
	return r, nil
}

// DecodeScheduleFire decodes a schedule_fire body, as Decode would; an id given empty is
// invalid_id, as an enqueue's: taken for none, it would fire again at every retry.
func DecodeScheduleFire(data []byte) (ScheduleFireRequest, error) {
	var r ScheduleFireRequest
	if err := Decode(data, &r); err != nil {
		return r, err
	}
	if r.ID == "" && idGivenEmpty(data) {
		return ScheduleFireRequest{}, ErrFireIDEmpty
	}
	return r, nil
}

// ErrFireIDEmpty is the error of a schedule_fire whose id is given empty.
var ErrFireIDEmpty = Errorf(CodeInvalidID, "id is empty: omit it for the broker to make one of the schedule's name and the time")

// errEmptyID is the error of an enqueue whose id is given empty.
var errEmptyID = Errorf(CodeInvalidID, "id is empty: omit it for the broker to generate one")

// fastEnqueueBatch decodes {"messages":[<fastEnqueue object>, …]} with nothing after it. An empty
// array goes to Decode, which gives an empty slice rather than nil.
func fastEnqueueBatch(data []byte, r *EnqueueBatchRequest) bool {
	p := skip(data, 0)
	p, ok := expect(data, p, '{')
	if !ok {
		return false
	}
	key, p, ok := plainString(data, skip(data, p))
	if !ok || key != "messages" {
		return false
	}
	if p, ok = expect(data, skip(data, p), ':'); !ok {
		return false
	}
	if p, ok = expect(data, skip(data, p), '['); !ok {
		return false
	}
	for {
		var m EnqueueRequest
		if p, ok = fastEnqueue(data, p, &m); !ok {
			return false
		}
		r.Messages = append(r.Messages, m)
		p = skip(data, p)
		if p < len(data) && data[p] == ',' {
			p++
			continue
		}
		break
	}
	if p, ok = expect(data, p, ']'); !ok {
		return false
	}
	if p, ok = expect(data, skip(data, p), '}'); !ok {
		return false
	}
	return skip(data, p) == len(data)
}

// fastEnqueue decodes one flat enqueue object starting at data[p] (after optional white space):
// keys id, payload (plain strings) and priority, invisible_ms, lease_ms, max_attempts (integers),
// each at most once. It returns the position after the object and false for anything else.
func fastEnqueue(data []byte, p int, r *EnqueueRequest) (int, bool) {
	p, ok := expect(data, skip(data, p), '{')
	if !ok {
		return 0, false
	}
	var seen [6]bool
	p = skip(data, p)
	if p < len(data) && data[p] == '}' {
		return p + 1, true
	}
	for {
		var key string
		if key, p, ok = plainString(data, p); !ok {
			return 0, false
		}
		if p, ok = expect(data, skip(data, p), ':'); !ok {
			return 0, false
		}
		p = skip(data, p)
		var i int
		switch key {
		case "id":
			i = 0
			r.ID, p, ok = plainString(data, p)
			ok = ok && r.ID != "" // an empty id is an error: Decode's path says so
		case "payload":
			i = 1
			r.Payload, p, ok = plainString(data, p)
		case "priority":
			i = 2
			r.Priority, p, ok = plainInt(data, p)
		case "invisible_ms":
			i = 3
			r.InvisibleMS, p, ok = plainInt(data, p)
		case "lease_ms":
			i = 4
			r.LeaseMS, p, ok = plainInt(data, p)
		case "max_attempts":
			i = 5
			r.MaxAttempts, p, ok = plainInt(data, p)
		default:
			return 0, false
		}
		if !ok || seen[i] { // encoding/json keeps the last of duplicate keys; leave them to it
			return 0, false
		}
		seen[i] = true
		p = skip(data, p)
		if p < len(data) && data[p] == ',' {
			p = skip(data, p+1)
			continue
		}
		return expect(data, p, '}')
	}
}

// plainString reads a JSON string at data[p] made only of printable ASCII without escapes.
func plainString(data []byte, p int) (string, int, bool) {
	b, p, ok := plainBytes(data, p)
	return string(b), p, ok
}

// plainBytes is plainString without the copy: the string's bytes in data.
func plainBytes(data []byte, p int) ([]byte, int, bool) {
	if p >= len(data) || data[p] != '"' {
		return nil, 0, false
	}
	for i := p + 1; i < len(data); i++ {
		switch c := data[i]; {
		case c == '"':
			return data[p+1 : i], i + 1, true
		case c == '\\' || c < 0x20 || c >= 0x7f:
			return nil, 0, false
		}
	}
	return nil, 0, false
}

// plainInt is plainInt64 for the optional fields of a request.
func plainInt(data []byte, p int) (*int64, int, bool) {
	v, p, ok := plainInt64(data, p)
	return &v, p, ok
}

// plainInt64 reads a JSON integer at data[p]: an optional minus, then 0 or a digit 1–9 and more
// digits, 18 digits at most (so it fits an int64), with no fraction or exponent after it.
func plainInt64(data []byte, p int) (int64, int, bool) {
	start := p
	if p < len(data) && data[p] == '-' {
		p++
	}
	digits := p
	for p < len(data) && data[p] >= '0' && data[p] <= '9' {
		p++
	}
	switch n := p - digits; {
	case n == 0 || n > 18, n > 1 && data[digits] == '0':
		return 0, 0, false
	}
	if p < len(data) && (data[p] == '.' || data[p] == 'e' || data[p] == 'E') {
		return 0, 0, false
	}
	v, err := strconv.ParseInt(string(data[start:p]), 10, 64)
	return v, p, err == nil
}

// expect consumes the byte c at data[p].
func expect(data []byte, p int, c byte) (int, bool) {
	if p < len(data) && data[p] == c {
		return p + 1, true
	}
	return 0, false
}

// skip returns the position of the first byte at or after p that is not JSON white space.
func skip(data []byte, p int) int {
	for p < len(data) && (data[p] == ' ' || data[p] == '\t' || data[p] == '\n' || data[p] == '\r') {
		p++
	}
	return p
}
