package subjects_test

import (
	"bytes"
	"encoding/json"
	"reflect"
	"strconv"
	"strings"
	"testing"
	"time"
	"unicode"
	"unicode/utf8"

	"github.com/natstone/natstone/subjects"
)

// fuzzPrefixes are the spaces the subject fuzz targets exercise.
var fuzzPrefixes = []string{subjects.DefaultPrefix, "a", "acme.prod.natstone"}

func FuzzSpaceParse(f *testing.F) {
	for _, s := range []string{
		"natstone.v1.enqueue.encode",
		"natstone.v1.list",
		"natstone.v1.list.q",
		"natstone.v1.enqueue",
		"natstone.v1.enqueue.",
		"natstone.v1.enqueue.a.b",
		"natstone.v1.bogus.q",
		"natstone.v1.",
		"natstone.v1",
		"",
		".",
		"a.get.x",
		"acme.prod.natstone.enqueue_batch.Q_1-2",
		"acme.prod.natstone.list",
		"natstone.v1.dequeue." + strings.Repeat("z", 128),
		"natstone.v1.dequeue." + strings.Repeat("z", 129),
		"natstone.v1.get.é",
		"natstone.v1.get.\xff",
	} {
		f.Add(s)
	}
	spaces := make([]subjects.Space, len(fuzzPrefixes))
	for i, p := range fuzzPrefixes {
		spaces[i] = mustSpace(f, p)
	}
	f.Fuzz(func(t *testing.T, subject string) {
		for _, s := range spaces {
			op, queue, err := s.Parse(subject)
			if err != nil {
				if op != "" || queue != "" {
					t.Fatalf("[%s] Parse(%q) = (%q, %q, %v): non-empty results with an error", s.Prefix(), subject, op, queue, err)
				}
				if c := subjects.CodeOf(err); c != subjects.CodeBadRequest && c != subjects.CodeInvalidQueueName {
					t.Fatalf("[%s] Parse(%q) error code %q: %v", s.Prefix(), subject, c, err)
				}
				continue
			}
			if got := s.Subject(op, queue); got != subject {
				t.Fatalf("[%s] Parse(%q) = (%q, %q) but Subject of that is %q", s.Prefix(), subject, op, queue, got)
			}
			if op == subjects.OpList {
				if queue != "" {
					t.Fatalf("[%s] Parse(%q): list with queue %q", s.Prefix(), subject, queue)
				}
			} else if err := subjects.ValidateQueueName(queue); err != nil {
				t.Fatalf("[%s] Parse(%q) accepted queue %q: %v", s.Prefix(), subject, queue, err)
			}
		}
	})
}

// fuzzQueueName maps arbitrary bytes onto a valid queue name of 1 to MaxQueueNameLen bytes.
func fuzzQueueName(data []byte, fill byte) string {
	if len(data) == 0 {
		data = []byte{fill}
	}
	if len(data) > subjects.MaxQueueNameLen {
		data = data[:subjects.MaxQueueNameLen]
	}
	b := make([]byte, len(data))
	for i, c := range data {
		b[i] = queueAlphabet[int(c)%len(queueAlphabet)]
	}
	return string(b)
}

func FuzzSubjectRoundTrip(f *testing.F) {
	f.Add([]byte("encode"), uint8(0), uint8(0))
	f.Add([]byte{}, uint8(4), uint8(1)) // list
	f.Add([]byte{63, 62, 0, 255}, uint8(7), uint8(2))
	f.Add(bytes.Repeat([]byte{0xAB}, 200), uint8(14), uint8(0))
	f.Add([]byte("x"), uint8(255), uint8(255))
	spaces := make([]subjects.Space, len(fuzzPrefixes))
	for i, p := range fuzzPrefixes {
		spaces[i] = mustSpace(f, p)
	}
	f.Fuzz(func(t *testing.T, data []byte, opIndex, spaceIndex uint8) {
		s := spaces[int(spaceIndex)%len(spaces)]
		op := subjects.Ops[int(opIndex)%len(subjects.Ops)]
		q := fuzzQueueName(data, opIndex)
		if err := subjects.ValidateQueueName(q); err != nil {
			t.Fatalf("generated queue %q is invalid: %v", q, err)
		}
		subj := s.Subject(op, q)
		gotOp, gotQueue, err := s.Parse(subj)
		if err != nil {
			t.Fatalf("[%s] Parse(Subject(%q, %q) = %q): %v", s.Prefix(), op, q, subj, err)
		}
		wantQueue := q
		if op == subjects.OpList {
			wantQueue = ""
		}
		if gotOp != op || gotQueue != wantQueue {
			t.Fatalf("[%s] Parse(%q) = (%q, %q), want (%q, %q)", s.Prefix(), subj, gotOp, gotQueue, op, wantQueue)
		}
		// The wildcard covers the subject: same tokens but the last, which is "*".
		if op != subjects.OpList {
			w := s.Wildcard(op)
			if strings.TrimSuffix(w, "*")+q != subj {
				t.Fatalf("[%s] Wildcard(%q) = %q does not cover %q", s.Prefix(), op, w, subj)
			}
		}
	})
}

// requestTypes makes a fresh pointer to each request body type.
var requestTypes = []func() any{
	func() any { return new(subjects.CreateQueueRequest) },
	func() any { return new(subjects.UpdateQueueRequest) },
	func() any { return new(subjects.EnqueueRequest) },
	func() any { return new(subjects.EnqueueBatchRequest) },
	func() any { return new(subjects.DequeueRequest) },
	func() any { return new(subjects.LeaseRequest) },
	func() any { return new(subjects.ExtendRequest) },
	func() any { return new(subjects.ReleaseRequest) },
	func() any { return new(subjects.RetryRequest) },
	func() any { return new(subjects.RescheduleRequest) },
	func() any { return new(subjects.GetRequest) },
	func() any { return new(subjects.DepthRequest) },
	func() any { return new(subjects.StatsRequest) },
	func() any { return new(subjects.BrowseRequest) },
	func() any { return new(subjects.HistoryRequest) },
	func() any { return new(subjects.ScheduleRequest) },
	func() any { return new(subjects.UnscheduleRequest) },
	func() any { return new(subjects.SchedulesRequest) },
	func() any { return new(subjects.SchedulePauseRequest) },
	func() any { return new(subjects.ScheduleFireRequest) },
	func() any { return new(subjects.AbandonRequest) },
}

func FuzzDecode(f *testing.F) {
	for _, s := range []string{
		``,
		`   `,
		`null`,
		`{}`,
		`{"id":"m1"}`,
		`{"id":"m1","lease_id":"L1","lease_ms":100,"delay_ms":5}`,
		`{"id":"m1","version":7,"priority":0,"delay_ms":0}`,
		`{"id":"m1","visible_at":"2026-11-28T10:00:00.5+01:00"}`,
		`{"id":"m1","visible_at":"2026-11-28T09:00:00"}`,
		`{"id":"m1","visible_at":17643204000}`,
		`{"type":"exclusive","exclusivity_key":"k","retention_ms":0,"enqueue_blocked":true}`,
		`{"revision":18446744073709551615,"lease_ms":null,"max_attempts":3,"dequeue_blocked":false}`,
		`{"max_running":1000000,"max_metadata_pairs":32}`,
		`{"name":"s","cron":"@every 1s","overlap":"skip","deadline_ms":1}`,
		`{"overlap":1}`,
		`{"name":"s","note":"db migration"}`,
		`{"name":"s","id":"by-hand"}`,
		`{"name":"s","id":""}`,
		`{"name":"s","id":null}`,
		`{"request_id":"r"}`,
		`{"note":null,"id":7}`,
		`{"id":"m","priority":-9223372036854775808,"payload":"héllo ✓","metadata":{"k":"v"},"invisible_ms":1,"lease_ms":2}`,
		`{"payload_base64":"AP8="}`,
		`{"payload_base64":""}`,
		`{"metadata":{}}`,
		`{"messages":[{"payload":"a"},{"payload_base64":"AQID","metadata":{}}]}`,
		`{"messages":[]}`,
		`{"batch":256,"wait_ms":5000,"filter":{"a":"b"},"request_id":"r","worker":"w"}`,
		`{"filter":{"a":"b"},"expiring_within_ms":30000,"expiring_limit":20}`,
		`{"state":"pending","filter":{"a":"b"},"limit":50}`,
		`{"id":"m1","limit":1000}`,
		`{"filter":{"\u00e9":"\ud800"}}`,
		`{"id":"\ud83d\ude00\udc00"}`,
		`{"payload":"\\\ud800"}`,
		`{"id":"\xff\xfe"}`,
		`{"ID":"case"}`,
		`{"id":"m1"} x`,
		`{"id":"m1"}{"id":"m2"}`,
		`{"nope":1}`,
		`{"batch":"1"}`,
		`{"lease_ms":1e3}`,
		`[`,
	} {
		f.Add([]byte(s))
	}
	f.Fuzz(func(t *testing.T, data []byte) {
		for _, newV := range requestTypes {
			v1 := newV()
			err := subjects.Decode(data, v1)
			if err != nil {
				if c := subjects.CodeOf(err); c != subjects.CodeBadRequest {
					t.Fatalf("Decode(%q, %T): code %q: %v", data, v1, c, err)
				}
				continue
			}
			b1, err := json.Marshal(v1)
			if err != nil {
				t.Fatalf("json.Marshal(%T %+v): %v", v1, v1, err)
			}
			// Nothing decoded is changed into U+FFFD (which encoding/json makes of invalid UTF-8
			// and of lone surrogate escapes): only a U+FFFD that was sent comes back.
			if bytes.Contains(b1, []byte("\ufffd")) && !bytes.Contains(data, []byte("\ufffd")) &&
				!bytes.Contains(bytes.ToLower(data), []byte(`\ufffd`)) {
				t.Fatalf("Decode(%q, %T) made a U+FFFD: %s", data, v1, b1)
			}
			if key, dup := tokenDuplicate(data, true); dup {
				t.Fatalf("Decode(%q, %T) took %q twice", data, v1, key)
			}
			v2 := newV()
			if err := subjects.Decode(b1, v2); err != nil {
				t.Fatalf("Decode(%s) of the re-marshaled %T (from %q): %v", b1, v1, data, err)
			}
			// omitempty cannot carry the difference between an empty and a nil slice or map
			// ("payload_base64":"", "metadata":{}), so compare with those normalized ...
			if !reflect.DeepEqual(normalize(v1), normalize(v2)) {
				t.Fatalf("%T from %q:\n first  %+v\n second %+v\n via %s", v1, data, v1, v2, b1)
			}
			// ... and demand that one round trip reaches the fixed point exactly.
			b2, err := json.Marshal(v2)
			if err != nil {
				t.Fatal(err)
			}
			if !bytes.Equal(b1, b2) {
				t.Fatalf("%T from %q: marshal not stable:\n %s\n %s", v1, data, b1, b2)
			}
			v3 := newV()
			if err := subjects.Decode(b2, v3); err != nil {
				t.Fatal(err)
			}
			if !reflect.DeepEqual(v2, v3) {
				t.Fatalf("%T from %q: second round trip differs:\n %+v\n %+v", v1, data, v2, v3)
			}
		}
		// schedule_fire's decoder is Decode but for an id given empty, which is invalid_id.
		fire, ferr := subjects.DecodeScheduleFire(data)
		var plain subjects.ScheduleFireRequest
		perr := subjects.Decode(data, &plain)
		switch {
		case perr != nil:
			if subjects.CodeOf(ferr) != subjects.CodeOf(perr) {
				t.Fatalf("DecodeScheduleFire(%q) = %v, Decode %v", data, ferr, perr)
			}
		case ferr == nil:
			if fire != plain {
				t.Fatalf("DecodeScheduleFire(%q) = %+v, Decode %+v", data, fire, plain)
			}
		case subjects.CodeOf(ferr) != subjects.CodeInvalidID || plain.ID != "":
			t.Fatalf("DecodeScheduleFire(%q) refused %+v, which Decode took: %v", data, plain, ferr)
		}
	})
}

// Bits of FuzzDecodeRawEnqueue's present mask: which headers are sent.
const (
	rawID = 1 << iota
	rawPriority
	rawMetadata
	rawInvisible
	rawLease
	rawLowerCase   // send every header key in lower case (as a nats.Header map would keep it)
	rawMaxAttempts // Natstone-Max-Attempts, with the invisible argument's value
	rawVisibleAt   // Natstone-Visible-At, with the lease argument's value
)

func FuzzDecodeRawEnqueue(f *testing.F) {
	all := uint8(rawID | rawPriority | rawMetadata | rawInvisible | rawLease | rawMaxAttempts)
	f.Add("m1", "5", `{"a":"b"}`, "1000", "30000", []byte("payload"), all)
	f.Add("", "", "", "", "", []byte(nil), uint8(0))
	f.Add("héllo ✓", "-9223372036854775808", `{}`, "0", "+1", []byte{0, 0xff}, all)
	f.Add("x", "1.5", `{"a":1}`, "soon", "30s", []byte("p"), all)
	f.Add("x", "9223372036854775808", `null`, "-0", "007", []byte{}, uint8(rawPriority|rawMetadata))
	f.Add("x", "7", `{"k":"v"}`, "1", "2", []byte("lower"), all|rawLowerCase)
	f.Add("\x00", " 1", `{"a":"b"}x`, "", "", []byte("\xff"), all)
	f.Add("v", "1", `{}`, "1", "2026-11-28T09:00:00.5+01:00", []byte("at"), uint8(rawID|rawVisibleAt))
	f.Add("v", "1", `{}`, "1", "2026-11-28T09:00:00", []byte("at"), uint8(rawID|rawVisibleAt))
	f.Fuzz(func(t *testing.T, id, priority, metadata, invisible, lease string, body []byte, present uint8) {
		key := func(name string) string {
			if present&rawLowerCase != 0 {
				return strings.ToLower(name)
			}
			return name
		}
		h := map[string][]string{}
		for _, hv := range []struct {
			bit         uint8
			name, value string
		}{
			{rawID, subjects.HeaderID, id},
			{rawPriority, subjects.HeaderPriority, priority},
			{rawMetadata, subjects.HeaderMetadata, metadata},
			{rawInvisible, subjects.HeaderInvisibleMS, invisible},
			{rawLease, subjects.HeaderLeaseMS, lease},
			{rawMaxAttempts, subjects.HeaderMaxAttempts, invisible},
			{rawVisibleAt, subjects.HeaderVisibleAt, lease},
		} {
			if present&hv.bit != 0 {
				h[key(hv.name)] = []string{hv.value}
			}
		}
		bodyCopy := bytes.Clone(body)
		req, err := subjects.DecodeRawEnqueue(h, body)
		if !bytes.Equal(body, bodyCopy) {
			t.Fatalf("DecodeRawEnqueue modified the body")
		}
		// invalid_id: omit the header for a generated id; white space at its end is not kept.
		badID := present&rawID != 0 && (id == "" || strings.TrimRight(id, " \t") != id)
		if err != nil {
			if c := subjects.CodeOf(err); c != subjects.CodeBadRequest && (c != subjects.CodeInvalidID || !badID) {
				t.Fatalf("DecodeRawEnqueue: code %q: %v", c, err)
			}
		} else {
			if req.PayloadBase64 == nil || !bytes.Equal(req.PayloadBase64, body) || req.Payload != "" {
				t.Fatalf("payload = %q/%q, want the body %q", req.Payload, req.PayloadBase64, body)
			}
			p, err := req.PayloadBytes()
			if err != nil || !bytes.Equal(p, body) {
				t.Fatalf("PayloadBytes = %q, %v; want the body %q", p, err, body)
			}
		}
		if present&rawLowerCase != 0 {
			// Lower-case keys: see TestDecodeRawEnqueueNonCanonicalKeys. Only the invariants above hold.
			return
		}

		// Canonical keys: the result must be exactly what each header says.
		wantErr := badID
		wantInt := func(bit uint8, v string) *int64 {
			if present&bit == 0 {
				return nil
			}
			n, err := strconv.ParseInt(v, 10, 64)
			if digits := strings.TrimPrefix(v, "-"); err != nil || strings.HasPrefix(v, "+") || len(digits) > 1 && digits[0] == '0' {
				wantErr = true
				return nil
			}
			return &n
		}
		want := subjects.EnqueueRequest{
			PayloadBase64: body,
			Priority:      wantInt(rawPriority, priority),
			InvisibleMS:   wantInt(rawInvisible, invisible),
			LeaseMS:       wantInt(rawLease, lease),
			MaxAttempts:   wantInt(rawMaxAttempts, invisible),
		}
		if want.PayloadBase64 == nil {
			want.PayloadBase64 = []byte{}
		}
		var wantAt *time.Time
		if present&rawVisibleAt != 0 {
			var at time.Time
			if err := at.UnmarshalText([]byte(lease)); err != nil { // as encoding/json reads a time
				wantErr = true
			}
			wantAt = &at
		}
		if present&rawID != 0 {
			want.ID = id
		}
		// encoding/json reads invalid UTF-8, and an escaped half of a surrogate pair, as U+FFFD; the
		// decoder refuses both. Where the metadata has a U+FFFD of its own, it cannot be told which.
		ambiguous := false
		if present&rawMetadata != 0 {
			var md map[string]*string
			if err := json.Unmarshal([]byte(metadata), &md); err != nil {
				wantErr = true
			}
			ambiguous = strings.ContainsRune(metadata, utf8.RuneError) || strings.Contains(strings.ToLower(metadata), `\ufffd`)
			if !utf8.ValidString(metadata) {
				wantErr = true
			}
			for k, v := range md {
				if !ambiguous && (strings.ContainsRune(k, utf8.RuneError) || v != nil && strings.ContainsRune(*v, utf8.RuneError)) {
					wantErr = true // made by encoding/json: a lone surrogate
				}
			}
			if md != nil {
				want.Metadata = subjects.Pairs{}
			}
			for k, v := range md {
				if v == nil {
					wantErr = true // null is not a string
					break
				}
				want.Metadata[k] = *v
			}
			if _, dup := tokenDuplicate([]byte(metadata), false); dup {
				wantErr = true
			}
		}
		if ambiguous && !wantErr && subjects.CodeOf(err) == subjects.CodeBadRequest {
			return // a lone surrogate beside a U+FFFD of its own: refused, rightly
		}
		if (err != nil) != wantErr {
			t.Fatalf("DecodeRawEnqueue(%v) error = %v, want error %v", h, err, wantErr)
		}
		if err != nil {
			return
		}
		if at := req.VisibleAt; (at == nil) != (wantAt == nil) || at != nil && (!at.Equal(*wantAt) || at.Location().String() != wantAt.Location().String()) {
			t.Fatalf("DecodeRawEnqueue(%v): visible at %v, want %v", h, at, wantAt)
		}
		req.VisibleAt = nil
		if !reflect.DeepEqual(req, want) {
			t.Fatalf("DecodeRawEnqueue(%v) =\n %+v, want\n %+v", h, req, want)
		}
	})
}

// printableOracle is the documented rule: valid UTF-8 without control characters.
func printableOracle(s string) bool {
	return utf8.ValidString(s) && !strings.ContainsFunc(s, unicode.IsControl)
}

func FuzzValidateMetadata(f *testing.F) {
	f.Add("customer", "c1", "k", "v", 8, true)
	f.Add("", "v", "k", "v", 8, false)
	f.Add("héllo ✓", "héllo ✓", "a\x00", "", 2, true)
	f.Add(strings.Repeat("k", 128), strings.Repeat("v", 1024), "x", "y", 2, true)
	f.Add(strings.Repeat("k", 129), "v", "x", "y", 2, true)
	f.Add("k", strings.Repeat("v", 1025), "x", "\xff", 1, true)
	f.Add("a", "b", "a", "c", 1, true)
	f.Add("a", "b", "c", "d", 0, false)
	f.Add("a", "b", "c", "d", -1, true)
	f.Fuzz(func(t *testing.T, k1, v1, k2, v2 string, maxPairs int, two bool) {
		md := map[string]string{k1: v1}
		if two {
			md[k2] = v2
		}
		maxPairs %= 2 * subjects.MaxMetadataPairs // keep it near the interesting range, sign kept
		err := subjects.ValidateMetadata(md, maxPairs)
		if err != nil {
			if c := subjects.CodeOf(err); c != subjects.CodeInvalidMetadata {
				t.Fatalf("ValidateMetadata(%q, %d): code %q: %v", md, maxPairs, c, err)
			}
		}
		wantOK := len(md) <= maxPairs
		for k, v := range md {
			if k == "" || len(k) > subjects.MaxMetadataKeyLen || !printableOracle(k) ||
				len(v) > subjects.MaxMetadataValueLen || !printableOracle(v) {
				wantOK = false
			}
		}
		if (err == nil) != wantOK {
			t.Fatalf("ValidateMetadata(%q, %d) = %v, want ok %v", md, maxPairs, err, wantOK)
		}
		// nil and empty maps are always fine for a non-negative limit.
		if maxPairs >= 0 {
			if err := subjects.ValidateMetadata(nil, maxPairs); err != nil {
				t.Fatalf("ValidateMetadata(nil, %d): %v", maxPairs, err)
			}
		}
	})
}

// FuzzValidateID is an extra: ValidateID and ValidateRequestID agree with their documented rules.
func FuzzValidateID(f *testing.F) {
	for _, s := range []string{"", "m1", "héllo ✓", "a\x00", "\xff", strings.Repeat("x", 256), strings.Repeat("x", 257)} {
		f.Add(s)
	}
	f.Fuzz(func(t *testing.T, id string) {
		err := subjects.ValidateID(id)
		want := id != "" && len(id) <= subjects.MaxIDLen && printableOracle(id)
		if (err == nil) != want {
			t.Fatalf("ValidateID(%q) = %v, want ok %v", id, err, want)
		}
		if err != nil && subjects.CodeOf(err) != subjects.CodeInvalidID {
			t.Fatalf("ValidateID(%q): code %q", id, subjects.CodeOf(err))
		}
		err = subjects.ValidateRequestID(id)
		want = len(id) <= subjects.MaxRequestIDLen && printableOracle(id)
		if (err == nil) != want {
			t.Fatalf("ValidateRequestID(%q) = %v, want ok %v", id, err, want)
		}
		if err != nil && subjects.CodeOf(err) != subjects.CodeBadRequest {
			t.Fatalf("ValidateRequestID(%q): code %q", id, subjects.CodeOf(err))
		}
	})
}

// tokenDuplicate is the oracle of Decode's duplicate keys, read another way (json.Decoder's tokens,
// strings.EqualFold): a key that the JSON text data gives twice in one object, field names
// compared in any case, the keys of metadata and filters (and of a top object that is a map: not
// fold) as they are. Text that is not JSON has none.
func tokenDuplicate(data []byte, fold bool) (string, bool) {
	type object struct {
		keys    []string
		fold    bool
		wantKey bool
		last    string
	}
	var stack []*object
	var arrays []int // for each object, the arrays open in it
	dec := json.NewDecoder(bytes.NewReader(data))
	for {
		tok, err := dec.Token()
		if err != nil {
			return "", false
		}
		var top *object
		if len(stack) > 0 && arrays[len(arrays)-1] == 0 {
			top = stack[len(stack)-1]
		}
		if key, ok := tok.(string); ok && top != nil && top.wantKey {
			for _, k := range top.keys {
				if k == key || top.fold && strings.EqualFold(k, key) {
					return key, true
				}
			}
			top.keys = append(top.keys, key)
			top.last, top.wantKey = key, false
			continue
		}
		if top != nil {
			top.wantKey = true
		}
		switch tok {
		case json.Delim('{'):
			f := fold
			if top != nil {
				f = !strings.EqualFold(top.last, "metadata") && !strings.EqualFold(top.last, "filter")
			} else if len(stack) > 0 {
				f = true // an object in an array: a message
			}
			stack = append(stack, &object{fold: f, wantKey: true})
			arrays = append(arrays, 0)
		case json.Delim('}'):
			stack, arrays = stack[:len(stack)-1], arrays[:len(arrays)-1]
		case json.Delim('['):
			if len(arrays) > 0 {
				arrays[len(arrays)-1]++
			}
		case json.Delim(']'):
			if len(arrays) > 0 {
				arrays[len(arrays)-1]--
			}
		}
	}
}
