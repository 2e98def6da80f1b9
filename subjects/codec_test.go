package subjects_test

import (
	"bytes"
	"encoding/json"
	"errors"
	"net/textproto"
	"reflect"
	"strings"
	"testing"
	"time"
	"unicode/utf8"

	"github.com/natstone/natstone/subjects"
)

func TestDecodeEmptyBody(t *testing.T) {
	for _, body := range [][]byte{nil, {}, []byte(" "), []byte("\n\t\r "), []byte("   \n")} {
		req := subjects.DequeueRequest{}
		if err := subjects.Decode(body, &req); err != nil {
			t.Errorf("Decode(%q): %v", body, err)
		}
		if !reflect.DeepEqual(req, subjects.DequeueRequest{}) {
			t.Errorf("Decode(%q) = %#v, want the zero value", body, req)
		}
	}
	// JSON null is a value too: it leaves v unchanged.
	var req subjects.GetRequest
	if err := subjects.Decode([]byte("null"), &req); err != nil || req != (subjects.GetRequest{}) {
		t.Errorf("Decode(null) = %#v, %v; want the zero value and no error", req, err)
	}
}

func TestDecodeStrict(t *testing.T) {
	tests := []struct {
		name string
		body string
		v    func() any
	}{
		{"unknown field", `{"id":"m1","nope":1}`, func() any { return new(subjects.GetRequest) }},
		{"unknown field only", `{"queue":"q"}`, func() any { return new(subjects.DepthRequest) }},
		{"unknown nested field", `{"messages":[{"payload":"x","extra":true}]}`, func() any { return new(subjects.EnqueueBatchRequest) }},
		{"reply field in request", `{"id":"m1","lease_id":"L","state":"running"}`, func() any { return new(subjects.LeaseRequest) }},
		{"trailing garbage", `{"id":"m1"} x`, func() any { return new(subjects.GetRequest) }},
		{"trailing brace", `{"id":"m1"}}`, func() any { return new(subjects.GetRequest) }},
		{"trailing bracket", `{"id":"m1"}]`, func() any { return new(subjects.GetRequest) }},
		{"trailing comma", `{"id":"m1"},`, func() any { return new(subjects.GetRequest) }},
		{"trailing colon", `{"id":"m1"}:`, func() any { return new(subjects.GetRequest) }},
		{"trailing number", `{"id":"m1"} 1`, func() any { return new(subjects.GetRequest) }},
		{"trailing open string", `{"id":"m1"} "`, func() any { return new(subjects.GetRequest) }},
		{"two objects", `{"id":"m1"}{"id":"m2"}`, func() any { return new(subjects.GetRequest) }},
		{"two objects spaced", "{\"id\":\"m1\"}\n{\"id\":\"m2\"}", func() any { return new(subjects.GetRequest) }},
		{"truncated", `{"id":"m1"`, func() any { return new(subjects.GetRequest) }},
		{"not JSON", `id=m1`, func() any { return new(subjects.GetRequest) }},
		{"array body", `[]`, func() any { return new(subjects.GetRequest) }},
		{"string body", `"m1"`, func() any { return new(subjects.GetRequest) }},
		{"number body", `1`, func() any { return new(subjects.DequeueRequest) }},
		{"string for int", `{"batch":"1"}`, func() any { return new(subjects.DequeueRequest) }},
		{"float for int", `{"lease_ms":1.5}`, func() any { return new(subjects.DequeueRequest) }},
		{"exponent for int", `{"wait_ms":1e3}`, func() any { return new(subjects.DequeueRequest) }},
		{"int overflow", `{"lease_ms":9223372036854775808}`, func() any { return new(subjects.ExtendRequest) }},
		{"negative uint", `{"revision":-1}`, func() any { return new(subjects.UpdateQueueRequest) }},
		{"number for string", `{"id":5}`, func() any { return new(subjects.GetRequest) }},
		{"string for bool", `{"enqueue_blocked":"true"}`, func() any { return new(subjects.CreateQueueRequest) }},
		{"number for bool pointer", `{"dequeue_blocked":1}`, func() any { return new(subjects.UpdateQueueRequest) }},
		{"non-string metadata", `{"metadata":{"a":1}}`, func() any { return new(subjects.EnqueueRequest) }},
		{"array filter", `{"filter":["a"]}`, func() any { return new(subjects.DepthRequest) }},
		// encoding/json alone would take each for "".
		{"null metadata value", `{"metadata":{"a":"b","k":null}}`, func() any { return new(subjects.EnqueueRequest) }},
		{"null metadata value in a batch", `{"messages":[{"metadata":{"k":null}}]}`, func() any { return new(subjects.EnqueueBatchRequest) }},
		{"null filter value", `{"filter":{"k":null}}`, func() any { return new(subjects.DequeueRequest) }},
		{"null filter value in next", `{"id":"m1","lease_id":"L","next":{"filter":{"k":null}}}`, func() any { return new(subjects.LeaseRequest) }},
		{"null depth filter value", `{"filter":{"k":null}}`, func() any { return new(subjects.DepthRequest) }},
		{"null stats filter value", `{"filter":{"k":null}}`, func() any { return new(subjects.StatsRequest) }},
		{"null browse filter value", `{"state":"pending","filter":{"k":null}}`, func() any { return new(subjects.BrowseRequest) }},
		{"bad base64", `{"payload_base64":"!!!"}`, func() any { return new(subjects.EnqueueRequest) }},
		{"object messages", `{"messages":{}}`, func() any { return new(subjects.EnqueueBatchRequest) }},
		// encoding/json alone would replace each invalid byte with U+FFFD.
		{"invalid UTF-8 in an id", "{\"id\":\"a\xffb\"}", func() any { return new(subjects.GetRequest) }},
		{"invalid UTF-8 in a payload", "{\"payload\":\"x\xfey\"}", func() any { return new(subjects.EnqueueRequest) }},
		{"invalid UTF-8 in a key", "{\"metadata\":{\"k\xff\":\"v\"}}", func() any { return new(subjects.EnqueueRequest) }},
		{"invalid UTF-8 between fields", "{\"id\":\"a\"\xc0}", func() any { return new(subjects.GetRequest) }},
		// encoding/json alone would keep the last and drop the others.
		{"duplicate id", `{"id":"d1","id":"d2"}`, func() any { return new(subjects.GetRequest) }},
		{"duplicate id in another case", `{"id":"d3","ID":"d4"}`, func() any { return new(subjects.EnqueueRequest) }},
		{"duplicate id escaped", `{"id":"d3","\u0069d":"d4"}`, func() any { return new(subjects.EnqueueRequest) }},
		{"duplicate field by the Kelvin sign", "{\"worker\":\"a\",\"wor\u212aer\":\"b\"}", func() any { return new(subjects.DequeueRequest) }},
		{"empty id then another", `{"id":"","id":"d5"}`, func() any { return new(subjects.EnqueueRequest) }},
		{"duplicate messages", `{"messages":[{"id":"dm1"}],"messages":[{"id":"dm2"}]}`, func() any { return new(subjects.EnqueueBatchRequest) }},
		{"duplicate in a message", `{"messages":[{"id":"a"},{"payload":"x","payload":"y"}]}`, func() any { return new(subjects.EnqueueBatchRequest) }},
		{"duplicate metadata key", `{"metadata":{"k":"1","k":"2"}}`, func() any { return new(subjects.EnqueueRequest) }},
		{"duplicate metadata", `{"metadata":{"k":"1"},"Metadata":{"j":"2"}}`, func() any { return new(subjects.EnqueueRequest) }},
		{"duplicate filter key", `{"filter":{"k":"1","k":"1"}}`, func() any { return new(subjects.DepthRequest) }},
		{"duplicate batch", `{"batch":1,"batch":2}`, func() any { return new(subjects.DequeueRequest) }},
		{"duplicate in next", `{"id":"m","lease_id":"L","next":{"batch":300,"batch":1}}`, func() any { return new(subjects.LeaseRequest) }},
		{"duplicate next", `{"id":"m","lease_id":"L","next":{"batch":300},"next":{"batch":1}}`, func() any { return new(subjects.LeaseRequest) }},
		// Not JSON's white space; bytes.TrimSpace's.
		{"no-break space only", "\u00a0", func() any { return new(subjects.EnqueueRequest) }},
		{"ideographic space only", "\u3000", func() any { return new(subjects.DequeueRequest) }},
		{"form feed only", "\f", func() any { return new(subjects.CreateQueueRequest) }},
		{"vertical tab only", "\v", func() any { return new(subjects.DepthRequest) }},
		{"no-break space around", "\u00a0{}\u00a0", func() any { return new(subjects.GetRequest) }},
		// encoding/json alone would replace each lone half with U+FFFD.
		{"high surrogate alone in an id", `{"id":"coll\ud800"}`, func() any { return new(subjects.GetRequest) }},
		{"low surrogate alone in an id", `{"id":"coll\udbff"}`, func() any { return new(subjects.EnqueueRequest) }},
		{"low surrogate first", `{"id":"\udc00\ud800"}`, func() any { return new(subjects.GetRequest) }},
		{"high surrogate at the end", `{"payload":"x\uD800"}`, func() any { return new(subjects.EnqueueRequest) }},
		{"high surrogate then a letter", `{"payload":"\ud800\u0041"}`, func() any { return new(subjects.EnqueueRequest) }},
		{"two high surrogates", `{"payload":"\ud800\ud800"}`, func() any { return new(subjects.EnqueueRequest) }},
		{"high surrogate after an escaped backslash", `{"payload":"\\\ud800"}`, func() any { return new(subjects.EnqueueRequest) }},
		{"lone surrogate in a metadata key", `{"metadata":{"k\ud800":"v"}}`, func() any { return new(subjects.EnqueueRequest) }},
		{"lone surrogate in a metadata value", `{"messages":[{"metadata":{"k":"\udfff"}}]}`, func() any { return new(subjects.EnqueueBatchRequest) }},
		{"lone surrogate in a filter", `{"filter":{"k":"\ud800"}}`, func() any { return new(subjects.DequeueRequest) }},
		{"lone surrogate in a lease id", `{"id":"m1","lease_id":"\ud800"}`, func() any { return new(subjects.LeaseRequest) }},
	}
	for _, tc := range tests {
		t.Run(tc.name, func(t *testing.T) {
			err := subjects.Decode([]byte(tc.body), tc.v())
			wantCode(t, err, subjects.CodeBadRequest)
			if !strings.HasPrefix(err.Error(), "natstone: bad_request: malformed JSON body") {
				t.Errorf("error text = %q", err)
			}
		})
	}
}

func TestDecodeSurrogatePairs(t *testing.T) {
	for _, tc := range []struct{ body, want string }{
		{`{"payload":"\ud83d\ude00"}`, "😀"},
		{`{"payload":"\uD83D\uDE00!"}`, "😀!"},
		{`{"payload":"\\ud800"}`, `\ud800`}, // an escaped backslash, then text
		{`{"payload":"\\\\ud800"}`, `\\ud800`},
		{`{"payload":"\u00e9\ud800\udc00"}`, "é\U00010000"},
		{`{"payload":"\ufffd"}`, "\ufffd"}, // U+FFFD itself is a character
	} {
		var r subjects.EnqueueRequest
		if err := subjects.Decode([]byte(tc.body), &r); err != nil {
			t.Errorf("Decode(%s): %v", tc.body, err)
		} else if r.Payload != tc.want {
			t.Errorf("Decode(%s): payload %q, want %q", tc.body, r.Payload, tc.want)
		}
	}
}

// TestDecodeDistinctKeys: the keys of metadata and filters are compared as they are, and the same
// name in different objects is no duplicate.
func TestDecodeDistinctKeys(t *testing.T) {
	var r subjects.EnqueueBatchRequest
	body := `{"messages":[{"id":"a","metadata":{"k":"1","K":"2","id":"3"}},{"id":"b","metadata":{"k":"1"}}]}`
	if err := subjects.Decode([]byte(body), &r); err != nil {
		t.Fatal(err)
	}
	if len(r.Messages) != 2 || r.Messages[0].Metadata["K"] != "2" || r.Messages[1].ID != "b" {
		t.Fatalf("decoded %+v", r)
	}
	var l subjects.LeaseRequest
	if err := subjects.Decode([]byte(`{"id":"m","lease_id":"L","next":{"filter":{"id":"x","ID":"y"},"request_id":"r"}}`), &l); err != nil {
		t.Fatal(err)
	}
	if l.Next == nil || l.Next.Filter["ID"] != "y" {
		t.Fatalf("decoded %+v", l)
	}
}

func TestDecodeAllowsSurroundingWhiteSpace(t *testing.T) {
	var req subjects.GetRequest
	if err := subjects.Decode([]byte("\n  {\"id\":\"m1\"}  \n\t"), &req); err != nil {
		t.Fatal(err)
	}
	if req.ID != "m1" {
		t.Fatalf("ID = %q", req.ID)
	}
}

func TestDecodeRoundTrip(t *testing.T) {
	tests := []struct {
		name string
		in   any        // a pointer to a populated request
		out  func() any // a pointer to a fresh value of the same type
	}{
		{"CreateQueueRequest", &subjects.CreateQueueRequest{
			Type: subjects.Exclusive, ExclusivityKey: "customer", LeaseMS: 60000, InvisibleMS: 5,
			MaxAttempts: 3, RetentionMS: ptr(int64(0)), MaxPayloadBytes: 1024, MaxMetadataPairs: 4,
			EnqueueBlocked: true, DequeueBlocked: true,
		}, func() any { return new(subjects.CreateQueueRequest) }},
		{"CreateQueueRequest empty", &subjects.CreateQueueRequest{}, func() any { return new(subjects.CreateQueueRequest) }},
		{"UpdateQueueRequest", &subjects.UpdateQueueRequest{
			Revision: 1<<64 - 1, LeaseMS: ptr(int64(100)), InvisibleMS: ptr(int64(0)), MaxAttempts: ptr(0),
			RetentionMS: ptr(int64(-1)), MaxPayloadBytes: ptr(subjects.MaxPayloadBytes), MaxMetadataPairs: ptr(32),
			EnqueueBlocked: ptr(false), DequeueBlocked: ptr(true),
		}, func() any { return new(subjects.UpdateQueueRequest) }},
		{"EnqueueRequest text", &subjects.EnqueueRequest{
			ID: "m-1", Priority: ptr(int64(-9223372036854775808)), Payload: "héllo ✓ <&>\n\"",
			Metadata:    map[string]string{"customer": "c1", "é": "", "k": "v ✓"},
			InvisibleMS: ptr(int64(0)), LeaseMS: ptr(int64(9223372036854775807)),
		}, func() any { return new(subjects.EnqueueRequest) }},
		{"EnqueueRequest payload_base64", &subjects.EnqueueRequest{
			ID: "bin", PayloadBase64: []byte{0, 0xff, 0xfe, 'a', 0x80},
		}, func() any { return new(subjects.EnqueueRequest) }},
		{"EnqueueBatchRequest", &subjects.EnqueueBatchRequest{Messages: []subjects.EnqueueRequest{
			{ID: "a", Payload: "1"},
			{PayloadBase64: []byte{1, 2, 3}, Priority: ptr(int64(7))},
			{Metadata: map[string]string{"x": "y"}, LeaseMS: ptr(int64(100))},
		}}, func() any { return new(subjects.EnqueueBatchRequest) }},
		{"EnqueueBatchRequest empty", &subjects.EnqueueBatchRequest{Messages: []subjects.EnqueueRequest{}}, func() any { return new(subjects.EnqueueBatchRequest) }},
		{"DequeueRequest", &subjects.DequeueRequest{
			Batch: subjects.MaxDequeueBatch, LeaseMS: 30000, WaitMS: 5000,
			Filter: map[string]string{"customer": "c1"}, RequestID: "r-1",
		}, func() any { return new(subjects.DequeueRequest) }},
		{"LeaseRequest", &subjects.LeaseRequest{ID: "m1", LeaseID: "L1"}, func() any { return new(subjects.LeaseRequest) }},
		{"LeaseRequest unconditional", &subjects.LeaseRequest{ID: "m1"}, func() any { return new(subjects.LeaseRequest) }},
		{"ExtendRequest", &subjects.ExtendRequest{ID: "m1", LeaseID: "L1", LeaseMS: 1234}, func() any { return new(subjects.ExtendRequest) }},
		{"ReleaseRequest", &subjects.ReleaseRequest{ID: "m1", LeaseID: "L1", DelayMS: 99}, func() any { return new(subjects.ReleaseRequest) }},
		{"GetRequest", &subjects.GetRequest{ID: "m1 ✓"}, func() any { return new(subjects.GetRequest) }},
		{"DepthRequest", &subjects.DepthRequest{Filter: map[string]string{"a": "1", "b": "2"}}, func() any { return new(subjects.DepthRequest) }},
		{"DepthRequest empty", &subjects.DepthRequest{}, func() any { return new(subjects.DepthRequest) }},
	}
	for _, tc := range tests {
		t.Run(tc.name, func(t *testing.T) {
			b, err := json.Marshal(tc.in)
			if err != nil {
				t.Fatal(err)
			}
			out := tc.out()
			if reflect.TypeOf(out) != reflect.TypeOf(tc.in) {
				t.Fatalf("table error: %T vs %T", out, tc.in)
			}
			if err := subjects.Decode(b, out); err != nil {
				t.Fatalf("Decode(%s): %v", b, err)
			}
			if !reflect.DeepEqual(out, tc.in) {
				t.Fatalf("Decode(json.Marshal(v)) = %+v, want %+v (json %s)", out, tc.in, b)
			}
		})
	}
}

// TestDecodeWireNames pins the JSON field names of the request bodies (docs/protocol.md).
func TestDecodeWireNames(t *testing.T) {
	var enq subjects.EnqueueRequest
	body := `{"id":"m1","priority":5,"payload":"p","payload_base64":"AAE=","metadata":{"k":"v"},"invisible_ms":1,"lease_ms":2}`
	if err := subjects.Decode([]byte(body), &enq); err != nil {
		t.Fatal(err)
	}
	want := subjects.EnqueueRequest{ID: "m1", Priority: ptr(int64(5)), Payload: "p", PayloadBase64: []byte{0, 1},
		Metadata: map[string]string{"k": "v"}, InvisibleMS: ptr(int64(1)), LeaseMS: ptr(int64(2))}
	if !reflect.DeepEqual(enq, want) {
		t.Fatalf("got %+v, want %+v", enq, want)
	}
	var deq subjects.DequeueRequest
	if err := subjects.Decode([]byte(`{"batch":2,"lease_ms":3,"wait_ms":4,"filter":{"a":"b"},"request_id":"r"}`), &deq); err != nil {
		t.Fatal(err)
	}
	if deq.Batch != 2 || deq.LeaseMS != 3 || deq.WaitMS != 4 || deq.Filter["a"] != "b" || deq.RequestID != "r" {
		t.Fatalf("got %+v", deq)
	}
	var cr subjects.CreateQueueRequest
	if err := subjects.Decode([]byte(`{"type":"exclusive","exclusivity_key":"k","lease_ms":1,"invisible_ms":2,"max_attempts":3,"retention_ms":0,"max_payload_bytes":4,"max_metadata_pairs":5,"enqueue_blocked":true,"dequeue_blocked":true}`), &cr); err != nil {
		t.Fatal(err)
	}
	if cr.RetentionMS == nil || *cr.RetentionMS != 0 {
		t.Fatalf("retention_ms 0 must decode as a non-nil pointer to 0: %+v", cr)
	}
	var rel subjects.ReleaseRequest
	if err := subjects.Decode([]byte(`{"id":"m","lease_id":"l","delay_ms":7}`), &rel); err != nil || rel.DelayMS != 7 {
		t.Fatalf("got %+v, %v", rel, err)
	}
}

func TestDecodeRawEnqueueAllHeaders(t *testing.T) {
	h := map[string][]string{
		subjects.HeaderID:          {"m-1"},
		subjects.HeaderPriority:    {"-42"},
		subjects.HeaderMetadata:    {`{"customer":"c1","k":"v ✓"}`},
		subjects.HeaderInvisibleMS: {"1500"},
		subjects.HeaderLeaseMS:     {"60000"},
		subjects.HeaderMaxAttempts: {"3"},
		subjects.HeaderVisibleAt:   {"2026-11-28T09:00:00.5+01:00"},
	}
	body := []byte{0, 1, 0xff, 'x'}
	req, err := subjects.DecodeRawEnqueue(h, body)
	if err != nil {
		t.Fatal(err)
	}
	want := subjects.EnqueueRequest{
		ID: "m-1", Priority: ptr(int64(-42)), PayloadBase64: body,
		Metadata:    map[string]string{"customer": "c1", "k": "v ✓"},
		InvisibleMS: ptr(int64(1500)), LeaseMS: ptr(int64(60000)), MaxAttempts: ptr(int64(3)),
	}
	at := req.VisibleAt
	req.VisibleAt = nil // a time's zone is a pointer: compared with Equal
	if at == nil || !at.Equal(time.Date(2026, 11, 28, 8, 0, 0, 5e8, time.UTC)) {
		t.Fatalf("visible at %v, want 2026-11-28T08:00:00.5Z", at)
	}
	if !reflect.DeepEqual(req, want) {
		t.Fatalf("DecodeRawEnqueue = %+v, want %+v", req, want)
	}
	p, err := req.PayloadBytes()
	if err != nil || !bytes.Equal(p, body) {
		t.Fatalf("PayloadBytes = %q, %v; want the body", p, err)
	}
}

func TestDecodeRawEnqueueHeaderNames(t *testing.T) {
	if subjects.HeaderID != "Natstone-Id" || subjects.HeaderPriority != "Natstone-Priority" ||
		subjects.HeaderMetadata != "Natstone-Metadata" || subjects.HeaderInvisibleMS != "Natstone-Invisible-Ms" ||
		subjects.HeaderLeaseMS != "Natstone-Lease-Ms" || subjects.HeaderMaxAttempts != "Natstone-Max-Attempts" ||
		subjects.HeaderVisibleAt != "Natstone-Visible-At" {
		t.Fatal("header names changed: they are part of the wire contract")
	}
	for _, name := range []string{subjects.HeaderID, subjects.HeaderPriority, subjects.HeaderMetadata, subjects.HeaderInvisibleMS, subjects.HeaderLeaseMS, subjects.HeaderMaxAttempts, subjects.HeaderVisibleAt} {
		if textproto.CanonicalMIMEHeaderKey(name) != name {
			t.Errorf("%q is not in canonical form", name)
		}
	}
}

func TestDecodeRawEnqueueMissingHeaders(t *testing.T) {
	for _, h := range []map[string][]string{
		nil,
		{},
		{"Other": {"x"}},
		// A present key with no values counts as absent.
		{subjects.HeaderID: {}, subjects.HeaderPriority: {}, subjects.HeaderMetadata: nil, subjects.HeaderLeaseMS: {}},
	} {
		req, err := subjects.DecodeRawEnqueue(h, []byte("p"))
		if err != nil {
			t.Fatalf("DecodeRawEnqueue(%v): %v", h, err)
		}
		want := subjects.EnqueueRequest{PayloadBase64: []byte("p")}
		if !reflect.DeepEqual(req, want) {
			t.Errorf("DecodeRawEnqueue(%v) = %+v, want %+v", h, req, want)
		}
	}
}

// TestDecodeRawEnqueueRejectsUnclearHeaders: a header of natstone's that the request cannot mean
// is refused, as an unknown field of a JSON body is, rather than ignored or picked from.
func TestDecodeRawEnqueueRejectsUnclearHeaders(t *testing.T) {
	for name, h := range map[string]map[string][]string{
		"misspelled":               {"Natstone-Lease": {"5000"}},
		"unknown, other case":      {"natstone-invisible": {"10000"}},
		"repeated":                 {subjects.HeaderPriority: {"1", "2"}},
		"repeated in another case": {subjects.HeaderPriority: {"1"}, "natstone-priority": {"2"}},
		"metadata not UTF-8":       {subjects.HeaderMetadata: {"{\"k\":\"v\xff\"}"}},
		// nats.go keeps a malformed line's name: a continuation line, a space in the name.
		"name after a space": {" Natstone-Id": {"m1"}},
		"name with a space":  {"Natstone Id": {"m1"}},
		"name with a colon":  {"Natstone-Id:": {"m1"}},
		"other, not a token": {"X(1)": {"a"}, subjects.HeaderID: {"m1"}},
		"empty name":         {"": {"a"}},
	} {
		_, err := subjects.DecodeRawEnqueue(h, []byte("p"))
		if !errors.Is(err, &subjects.Error{Code: subjects.CodeBadRequest}) {
			t.Errorf("%s: DecodeRawEnqueue(%v) = %v, want bad_request", name, h, err)
		}
	}
	// An id ending in white space: nats.go drops the leading spaces of a value, not the trailing.
	for _, id := range []string{"m1 ", "m1\t"} {
		if _, err := subjects.DecodeRawEnqueue(map[string][]string{subjects.HeaderID: {id}}, []byte("p")); !errors.Is(err, &subjects.Error{Code: subjects.CodeInvalidID}) {
			t.Errorf("id %q: %v, want invalid_id", id, err)
		}
	}
	// Headers outside natstone's own are the sender's business.
	req, err := subjects.DecodeRawEnqueue(map[string][]string{"Nats-Msg-Id": {"x"}, "Traceparent": {"00-1"}, "Natstone": {"x"}}, []byte("p"))
	if err != nil || !reflect.DeepEqual(req, subjects.EnqueueRequest{PayloadBase64: []byte("p")}) {
		t.Errorf("other headers: %+v, %v", req, err)
	}
}

func TestDecodeRawEnqueueNilBody(t *testing.T) {
	for _, body := range [][]byte{nil, {}} {
		req, err := subjects.DecodeRawEnqueue(nil, body)
		if err != nil {
			t.Fatal(err)
		}
		if req.PayloadBase64 == nil || len(req.PayloadBase64) != 0 {
			t.Fatalf("DecodeRawEnqueue(nil, %#v).PayloadBase64 = %#v, want empty and non-nil", body, req.PayloadBase64)
		}
		p, err := req.PayloadBytes()
		if err != nil || p == nil || len(p) != 0 {
			t.Fatalf("PayloadBytes = %#v, %v; want empty and non-nil", p, err)
		}
	}
}

// TestDecodeRawEnqueueCanonicalizedKeys: keys as net/http or textproto store them.
func TestDecodeRawEnqueueCanonicalizedKeys(t *testing.T) {
	h := textproto.MIMEHeader{}
	h.Set("natstone-priority", "9")
	h.Set("NATSTONE-LEASE-MS", "100")
	h.Set("natstone-id", "m")
	req, err := subjects.DecodeRawEnqueue(h, nil)
	if err != nil {
		t.Fatal(err)
	}
	if req.Priority == nil || *req.Priority != 9 || req.LeaseMS == nil || *req.LeaseMS != 100 || req.ID != "m" {
		t.Fatalf("got %+v", req)
	}
}

// TestDecodeRawEnqueueNonCanonicalKeys: NATS headers (nats.Header) are case-sensitive maps that keep
// the key as the sender wrote it, so "natstone-priority" reaches the broker as that literal map key.
// The package documents header names as case-insensitive.
func TestDecodeRawEnqueueNonCanonicalKeys(t *testing.T) {
	tests := []struct {
		key, value string
		check      func(subjects.EnqueueRequest) bool
	}{
		{"natstone-priority", "7", func(r subjects.EnqueueRequest) bool { return r.Priority != nil && *r.Priority == 7 }},
		{"NATSTONE-PRIORITY", "7", func(r subjects.EnqueueRequest) bool { return r.Priority != nil && *r.Priority == 7 }},
		{"natstone-id", "m1", func(r subjects.EnqueueRequest) bool { return r.ID == "m1" }},
		{"Natstone-ID", "m1", func(r subjects.EnqueueRequest) bool { return r.ID == "m1" }},
		{"natstone-invisible-ms", "5", func(r subjects.EnqueueRequest) bool { return r.InvisibleMS != nil && *r.InvisibleMS == 5 }},
		{"Natstone-Invisible-MS", "5", func(r subjects.EnqueueRequest) bool { return r.InvisibleMS != nil && *r.InvisibleMS == 5 }},
		{"natstone-lease-ms", "6", func(r subjects.EnqueueRequest) bool { return r.LeaseMS != nil && *r.LeaseMS == 6 }},
		{"natstone-metadata", `{"a":"b"}`, func(r subjects.EnqueueRequest) bool { return r.Metadata["a"] == "b" }},
	}
	var missed []string
	for _, tc := range tests {
		req, err := subjects.DecodeRawEnqueue(map[string][]string{tc.key: {tc.value}}, []byte("p"))
		if err != nil {
			t.Errorf("header %q: %v", tc.key, err)
			continue
		}
		if !tc.check(req) {
			missed = append(missed, tc.key)
		}
		// And an invalid value under that key must be rejected, not ignored.
		if tc.key != "natstone-id" && tc.key != "Natstone-ID" {
			_, err := subjects.DecodeRawEnqueue(map[string][]string{tc.key: {"{bad"}}, nil)
			if err == nil {
				missed = append(missed, tc.key+" (bad value accepted)")
			} else {
				wantCode(t, err, subjects.CodeBadRequest)
			}
		}
	}
	if len(missed) > 0 {
		t.Fatalf("header names must match case-insensitively; ignored %q", missed)
	}
}

func TestDecodeRawEnqueueBadHeaders(t *testing.T) {
	for _, tc := range []struct{ header, value string }{
		{subjects.HeaderPriority, ""},
		{subjects.HeaderPriority, "1.5"},
		{subjects.HeaderPriority, "0x10"},
		{subjects.HeaderPriority, "1e3"},
		{subjects.HeaderPriority, " 1"},
		{subjects.HeaderPriority, "1 "},
		{subjects.HeaderPriority, "9223372036854775808"},
		{subjects.HeaderPriority, "-9223372036854775809"},
		{subjects.HeaderPriority, "1_000"},
		{subjects.HeaderInvisibleMS, "soon"},
		{subjects.HeaderInvisibleMS, ""},
		{subjects.HeaderLeaseMS, "30s"},
		{subjects.HeaderLeaseMS, "٣"}, // an Arabic-Indic digit
		{subjects.HeaderMetadata, ""},
		{subjects.HeaderMetadata, "{"},
		{subjects.HeaderMetadata, `{"a":1}`},
		{subjects.HeaderMetadata, `{"a":null}x`},
		{subjects.HeaderMetadata, `["a"]`},
		{subjects.HeaderMetadata, `"a"`},
		{subjects.HeaderMetadata, `{"a":"b"}{}`},
		{subjects.HeaderMetadata, `a=b`},
		{subjects.HeaderMetadata, `{"a":null}`},
		{subjects.HeaderMetadata, `{"a":"\ud800"}`},
		{subjects.HeaderMetadata, `{"a":"1","a":"2"}`},
		{subjects.HeaderPriority, "+5"},  // JSON has no plus sign either
		{subjects.HeaderPriority, "007"}, // nor leading zeros
		{subjects.HeaderInvisibleMS, "-01"},
		{subjects.HeaderLeaseMS, "+1000"},
		{subjects.HeaderVisibleAt, ""},
		{subjects.HeaderVisibleAt, "2026-11-28"},
		{subjects.HeaderVisibleAt, "2026-11-28 09:00:00Z"},
		{subjects.HeaderVisibleAt, "2026-11-28T09:00:00"}, // no zone
		{subjects.HeaderVisibleAt, "1764320400000"},       // Unix ms
		{subjects.HeaderVisibleAt, "2026-11-28T24:00:00Z"},
	} {
		h := map[string][]string{
			subjects.HeaderID: {"m1"},
			tc.header:         {tc.value},
		}
		req, err := subjects.DecodeRawEnqueue(h, []byte("payload"))
		if err == nil {
			t.Errorf("%s: %q accepted: %+v", tc.header, tc.value, req)
			continue
		}
		wantCode(t, err, subjects.CodeBadRequest)
		if !reflect.DeepEqual(req, subjects.EnqueueRequest{}) {
			t.Errorf("%s: %q: want the zero request with the error, got %+v", tc.header, tc.value, req)
		}
		// A number's error says how one is written: "007" is decimal, but has a leading zero.
		if want := "as JSON writes it (decimal digits after an optional -, no leading zero, no +)"; tc.value == "007" && !strings.Contains(err.Error(), want) {
			t.Errorf("%s: %q: %v, want it to say %q", tc.header, tc.value, err, want)
		}
	}
}

func TestDecodeRawEnqueueGoodInts(t *testing.T) {
	for _, tc := range []struct {
		value string
		want  int64
	}{
		{"0", 0}, {"-0", 0}, {"-5", -5}, {"70", 70},
		{"9223372036854775807", 9223372036854775807},
		{"-9223372036854775808", -9223372036854775808},
	} {
		req, err := subjects.DecodeRawEnqueue(map[string][]string{subjects.HeaderPriority: {tc.value}}, nil)
		if err != nil {
			t.Errorf("priority %q: %v", tc.value, err)
			continue
		}
		if req.Priority == nil || *req.Priority != tc.want {
			t.Errorf("priority %q = %v, want %d", tc.value, req.Priority, tc.want)
		}
	}
}

func TestDecodeRawEnqueueMetadataForms(t *testing.T) {
	for _, tc := range []struct {
		value string
		want  subjects.Pairs
	}{
		{`{}`, subjects.Pairs{}},
		{`null`, nil},
		{` {"a" : "b"} `, subjects.Pairs{"a": "b"}},
		{`{"a":"b","A":"c"}`, subjects.Pairs{"a": "b", "A": "c"}},
		{`{"é":"✓","x":""}`, subjects.Pairs{"é": "✓", "x": ""}},
	} {
		req, err := subjects.DecodeRawEnqueue(map[string][]string{subjects.HeaderMetadata: {tc.value}}, nil)
		if err != nil {
			t.Errorf("metadata %q: %v", tc.value, err)
			continue
		}
		if !reflect.DeepEqual(req.Metadata, tc.want) {
			t.Errorf("metadata %q = %#v, want %#v", tc.value, req.Metadata, tc.want)
		}
	}
}

func TestEnqueueRequestPayloadBytes(t *testing.T) {
	tests := []struct {
		name string
		req  subjects.EnqueueRequest
		want []byte
	}{
		{"none", subjects.EnqueueRequest{}, []byte{}},
		{"empty base64", subjects.EnqueueRequest{PayloadBase64: []byte{}}, []byte{}},
		{"text", subjects.EnqueueRequest{Payload: "héllo ✓"}, []byte("héllo ✓")},
		{"binary", subjects.EnqueueRequest{PayloadBase64: []byte{0, 0xff}}, []byte{0, 0xff}},
		{"text with empty base64", subjects.EnqueueRequest{Payload: "t", PayloadBase64: []byte{}}, []byte("t")},
	}
	for _, tc := range tests {
		got, err := tc.req.PayloadBytes()
		if err != nil {
			t.Errorf("%s: %v", tc.name, err)
			continue
		}
		if got == nil || !bytes.Equal(got, tc.want) {
			t.Errorf("%s: PayloadBytes = %#v, want %#v", tc.name, got, tc.want)
		}
	}
	both := subjects.EnqueueRequest{Payload: "a", PayloadBase64: []byte("a")}
	got, err := both.PayloadBytes()
	wantCode(t, err, subjects.CodeBadRequest)
	if got != nil {
		t.Errorf("PayloadBytes with both forms = %#v, want nil", got)
	}
	// The same through a decoded JSON body.
	var req subjects.EnqueueRequest
	if err := subjects.Decode([]byte(`{"payload":"x","payload_base64":"eA=="}`), &req); err != nil {
		t.Fatal(err)
	}
	_, err = req.PayloadBytes()
	wantCode(t, err, subjects.CodeBadRequest)
}

func TestMessagePayload(t *testing.T) {
	tests := []struct {
		name     string
		payload  []byte
		wantText bool
	}{
		{"nil", nil, true},
		{"empty", []byte{}, true},
		{"ascii", []byte("hello"), true},
		{"unicode", []byte("héllo ✓ 日本"), true},
		{"nul byte", []byte("a\x00b"), true}, // valid UTF-8, even if not printable
		{"invalid utf8", []byte{0xff, 0xfe, 0xfd}, false},
		{"truncated rune", []byte("h\xc3"), false},
		{"surrogate", []byte("\xed\xa0\x80"), false},
		{"binary", []byte{0, 1, 2, 0x80, 0x81, 255}, false},
	}
	for _, tc := range tests {
		t.Run(tc.name, func(t *testing.T) {
			var m subjects.Message
			// Start with the other form set, to check SetPayload clears it.
			other := "stale"
			m.Payload, m.PayloadBase64 = &other, []byte("stale")
			m.SetPayload(tc.payload)
			if tc.wantText {
				if m.Payload == nil || m.PayloadBase64 != nil {
					t.Fatalf("SetPayload(%q): Payload = %v, PayloadBase64 = %v; want text only", tc.payload, m.Payload, m.PayloadBase64)
				}
				if *m.Payload != string(tc.payload) {
					t.Fatalf("Payload = %q, want %q", *m.Payload, tc.payload)
				}
			} else if m.Payload != nil || !bytes.Equal(m.PayloadBase64, tc.payload) {
				t.Fatalf("SetPayload(%q): Payload = %v, PayloadBase64 = %v; want base64 only", tc.payload, m.Payload, m.PayloadBase64)
			}
			if got := m.PayloadBytes(); !bytes.Equal(got, tc.payload) {
				t.Fatalf("PayloadBytes = %q, want %q", got, tc.payload)
			}

			// Through JSON, as a dequeue or get reply carries it.
			b, err := json.Marshal(m)
			if err != nil {
				t.Fatal(err)
			}
			if !utf8.Valid(b) {
				t.Fatalf("json.Marshal produced invalid UTF-8: %q", b)
			}
			var back subjects.Message
			if err := json.Unmarshal(b, &back); err != nil {
				t.Fatalf("json.Unmarshal(%s): %v", b, err)
			}
			if got := back.PayloadBytes(); !bytes.Equal(got, tc.payload) {
				t.Fatalf("payload after JSON round trip = %q, want %q (json %s)", got, tc.payload, b)
			}
			if (back.Payload != nil) != tc.wantText {
				t.Fatalf("after JSON round trip Payload = %v, want text form %v", back.Payload, tc.wantText)
			}
			if !reflect.DeepEqual(normalize(back), normalize(m)) {
				t.Fatalf("Message JSON round trip = %+v, want %+v", back, m)
			}
		})
	}
}

func TestMessagePayloadBytesNone(t *testing.T) {
	var m subjects.Message
	if got := m.PayloadBytes(); got != nil {
		t.Fatalf("PayloadBytes of a message without payload = %#v, want nil", got)
	}
	b, err := json.Marshal(m)
	if err != nil {
		t.Fatal(err)
	}
	if bytes.Contains(b, []byte(`"payload`)) {
		t.Fatalf("a message without payload marshals payload fields: %s", b)
	}
}

func TestValidateID(t *testing.T) {
	valid := []string{
		"a", "m-1", "héllo ✓", "with space", "日本語", "emoji 🚀", "a.b*c>d", `"quoted"`,
		strings.Repeat("x", subjects.MaxIDLen),
		strings.Repeat("é", subjects.MaxIDLen/2), // 256 bytes, 128 runes
	}
	for _, id := range valid {
		if err := subjects.ValidateID(id); err != nil {
			t.Errorf("ValidateID(%q): %v", id, err)
		}
	}
	invalid := []string{
		"",
		strings.Repeat("x", subjects.MaxIDLen+1),
		strings.Repeat("é", subjects.MaxIDLen/2) + "x", // 257 bytes
		strings.Repeat("✓", 86),                        // 258 bytes, 86 runes
		"a\x00", "\t", "a\nb", "\r", "\x1b[0m", "a\x7f", "\u0085", "\u009f",
		"\xff", "a\xc3", "\xed\xa0\x80", "\xc0\xaf",
	}
	for _, id := range invalid {
		err := subjects.ValidateID(id)
		if err == nil {
			t.Errorf("ValidateID(%q) = nil, want invalid_id", id)
			continue
		}
		wantCode(t, err, subjects.CodeInvalidID)
	}
}

func TestValidateRequestID(t *testing.T) {
	valid := []string{
		"", "r", "héllo ✓", "req 1",
		strings.Repeat("r", subjects.MaxRequestIDLen),
	}
	for _, id := range valid {
		if err := subjects.ValidateRequestID(id); err != nil {
			t.Errorf("ValidateRequestID(%q): %v", id, err)
		}
	}
	invalid := []string{
		strings.Repeat("r", subjects.MaxRequestIDLen+1),
		"a\x00", "\n", "\x7f", "\u0080", "\xff", "ok\xe2\x9c",
	}
	for _, id := range invalid {
		err := subjects.ValidateRequestID(id)
		if err == nil {
			t.Errorf("ValidateRequestID(%q) = nil, want bad_request", id)
			continue
		}
		wantCode(t, err, subjects.CodeBadRequest)
	}
}

// TestValidateNote: a note over MaxNoteLen is refused for its length, and a short one with a
// control character or a bad byte for what it holds, not for its length.
func TestValidateNote(t *testing.T) {
	for _, n := range []string{"", "db migrates until Monday ✓", strings.Repeat("n", subjects.MaxNoteLen)} {
		if err := subjects.ValidateNote(n); err != nil {
			t.Errorf("ValidateNote(%q): %v", n, err)
		}
	}
	for n, want := range map[string]string{
		strings.Repeat("n", subjects.MaxNoteLen+1): "at most 1024 bytes",
		"two\nlines": "control characters",
		"tab\there":  "control characters",
		"bad\xff":    "control characters",
	} {
		err := subjects.ValidateNote(n)
		if err == nil || !strings.Contains(err.Error(), want) {
			t.Errorf("ValidateNote(%.20q) = %v, want bad_request saying %q", n, err, want)
			continue
		}
		wantCode(t, err, subjects.CodeBadRequest)
	}
}

func TestValidateMetadata(t *testing.T) {
	pairs := func(n int) map[string]string {
		md := make(map[string]string, n)
		for i := range n {
			md[string(rune('a'+i%26))+strings.Repeat("k", i/26)] = "v"
		}
		return md
	}
	key := strings.Repeat("k", subjects.MaxMetadataKeyLen)
	val := strings.Repeat("v", subjects.MaxMetadataValueLen)
	valid := []struct {
		md       map[string]string
		maxPairs int
	}{
		{nil, 0},
		{map[string]string{}, 0},
		{pairs(1), 1},
		{pairs(subjects.DefaultMaxMetadataPairs), subjects.DefaultMaxMetadataPairs},
		{pairs(subjects.MaxMetadataPairs), subjects.MaxMetadataPairs},
		{map[string]string{key: val}, 1},
		{map[string]string{"k": ""}, 1},
		{map[string]string{"héllo ✓": "héllo ✓", "日本": "語", "with space": "a b"}, 3},
		{map[string]string{strings.Repeat("é", subjects.MaxMetadataKeyLen/2): strings.Repeat("é", subjects.MaxMetadataValueLen/2)}, 1},
	}
	for _, tc := range valid {
		if err := subjects.ValidateMetadata(tc.md, tc.maxPairs); err != nil {
			t.Errorf("ValidateMetadata(%d pairs, %d): %v", len(tc.md), tc.maxPairs, err)
		}
	}
	invalid := []struct {
		name     string
		md       map[string]string
		maxPairs int
	}{
		{"one over zero", pairs(1), 0},
		{"limit+1", pairs(subjects.DefaultMaxMetadataPairs + 1), subjects.DefaultMaxMetadataPairs},
		{"protocol limit+1", pairs(subjects.MaxMetadataPairs + 1), subjects.MaxMetadataPairs},
		{"empty key", map[string]string{"": "v"}, 1},
		{"key limit+1", map[string]string{key + "k": "v"}, 1},
		{"key limit+1 multibyte", map[string]string{strings.Repeat("é", subjects.MaxMetadataKeyLen/2) + "k": "v"}, 1},
		{"value limit+1", map[string]string{"k": val + "v"}, 1},
		{"key control", map[string]string{"a\nb": "v"}, 1},
		{"key nul", map[string]string{"\x00": "v"}, 1},
		{"key DEL", map[string]string{"\x7f": "v"}, 1},
		{"key C1", map[string]string{"\u0085": "v"}, 1},
		{"value control", map[string]string{"k": "a\tb"}, 1},
		{"value escape", map[string]string{"k": "\x1b[31m"}, 1},
		{"key invalid utf8", map[string]string{"\xff": "v"}, 1},
		{"value invalid utf8", map[string]string{"k": "ok\xc3"}, 1},
		{"one bad among good", map[string]string{"a": "1", "b": "2", "c": "\x00"}, 3},
	}
	for _, tc := range invalid {
		err := subjects.ValidateMetadata(tc.md, tc.maxPairs)
		if err == nil {
			t.Errorf("%s: ValidateMetadata = nil, want invalid_metadata", tc.name)
			continue
		}
		wantCode(t, err, subjects.CodeInvalidMetadata)
	}
}

func TestStates(t *testing.T) {
	want := []subjects.State{"invisible", "pending", "running", "completed", "canceled", "errored"}
	if !reflect.DeepEqual(subjects.States, want) {
		t.Fatalf("States = %v, want %v", subjects.States, want)
	}
	terminal := map[subjects.State]bool{subjects.StateCompleted: true, subjects.StateCanceled: true, subjects.StateErrored: true}
	for _, s := range append(subjects.States, "", "unknown") {
		if got := s.Terminal(); got != terminal[s] {
			t.Errorf("%q.Terminal() = %v, want %v", s, got, terminal[s])
		}
	}
}

// TestDecodeErrorsNameFieldsNotGoTypes: a body of the wrong shape is refused in the protocol's
// terms — the field as the body names it, the JSON it wants — not in Go's.
func TestDecodeErrorsNameFieldsNotGoTypes(t *testing.T) {
	for body, want := range map[string]string{
		`{"batch":"x"}`:                     "batch: want an integer (64-bit), got string",
		`{"filter":[1]}`:                    "filter: want an object, got array",
		`[1]`:                               "the body: want an object, got array",
		`{"lease_ms":1.5}`:                  "lease_ms: want an integer (64-bit), got number 1.5",
		`{"worker":true}`:                   "worker: want a string, got bool",
		`{"request_id":{"a":"b"}}`:          "request_id: want a string, got object",
		`{"lease_ms":99999999999999999999}`: "lease_ms: want an integer (64-bit), got number 99999999999999999999",
	} {
		var r subjects.DequeueRequest
		err := subjects.Decode([]byte(body), &r)
		if !errors.Is(err, &subjects.Error{Code: subjects.CodeBadRequest}) || !strings.Contains(err.Error(), want) || strings.Contains(err.Error(), "Go ") {
			t.Errorf("%s: %v, want bad_request saying %q", body, err, want)
		}
	}
}

// TestDecodeNamesABadTime: encoding/json's error for a time it cannot read names no field; Decode
// names the visible_at, in an enqueue batch its message too, and says what it wants.
func TestDecodeNamesABadTime(t *testing.T) {
	for _, tc := range []struct {
		body string
		into any
		want string
	}{
		{`{"id":"a","visible_at":"tomorrow"}`, &subjects.EnqueueRequest{}, `visible_at: want an RFC 3339 time (2026-11-28T09:00:00Z), got "tomorrow"`},
		{`{"id":"a","visible_at":17}`, &subjects.RescheduleRequest{}, `visible_at: want an RFC 3339 time in a string ("2026-11-28T09:00:00Z"), got 17`},
		{`{"messages":[{"visible_at":null},{"visible_at":"2026-11-28T09:00:00"}]}`, &subjects.EnqueueBatchRequest{}, `messages[1].visible_at: want an RFC 3339 time (2026-11-28T09:00:00Z), got "2026-11-28T09:00:00"`},
	} {
		err := subjects.Decode([]byte(tc.body), tc.into)
		if want := "malformed JSON body: " + tc.want; err == nil || err.Error() != "natstone: bad_request: "+want {
			t.Errorf("Decode(%s): %v, want %s", tc.body, err, want)
		}
	}
	// A request that takes no time: its visible_at is an unknown field, whatever it holds.
	if err := subjects.Decode([]byte(`{"id":"a","lease_id":"l","visible_at":"soon"}`), &subjects.LeaseRequest{}); err == nil ||
		err.Error() != `natstone: bad_request: malformed JSON body: unknown field "visible_at"` {
		t.Errorf("a release with a visible_at: %v, want it an unknown field", err)
	}
}
