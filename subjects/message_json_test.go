package subjects_test

import (
	"bytes"
	"encoding/json"
	"strings"
	"testing"
	"time"

	"github.com/natstone/natstone/subjects"
)

// leasedMessage is what a dequeue returns most often.
func leasedMessage() subjects.Message {
	exp := time.UnixMilli(1_790_000_030_123).UTC()
	payload := `{"order":42,"note":"ship <today> & wrap"}`
	return subjects.Message{ID: "01JD0000000000000000000042", Queue: "orders", State: subjects.StateRunning,
		Priority: 1_790_000_000_000, Metadata: map[string]string{"region": "eu", "customer": "c-9"}, Payload: &payload,
		Version: 3, Attempts: 1, AttemptsLeft: 2, LeaseID: "01JDLEASE0000000000000001", LeaseExpiresAt: &exp,
		EnqueuedAt: time.UnixMilli(1_789_999_000_000).UTC(), VisibleAt: time.UnixMilli(1_789_999_000_000).UTC(),
		UpdatedAt: time.UnixMilli(1_790_000_000_123).UTC()}
}

// marshalText is what AppendMessage, AppendDequeueReply and AppendSettleReply must write: v as a
// json.Encoder with SetEscapeHTML(false) writes it, without its newline.
func marshalText(v any) ([]byte, error) {
	var buf bytes.Buffer
	enc := json.NewEncoder(&buf)
	enc.SetEscapeHTML(false)
	err := enc.Encode(v)
	return bytes.TrimSuffix(buf.Bytes(), []byte("\n")), err
}

// FuzzAppendMessage holds AppendMessage, AppendDequeueReply and AppendSettleReply to marshalText:
// the same bytes for every message, whether it takes the direct path or falls back.
func FuzzAppendMessage(f *testing.F) {
	f.Add("01JD42", "orders", "running", "region", "eu", "hello", []byte(nil), "L1", uint64(3), 1, 2, int64(-5),
		int64(1_790_000_000_123), int64(1_790_000_030_123), byte(0x07), byte(0))
	f.Add("é<&>\"\\\n\x00", "q", "pending", "k\u2028", "v\u2029\xff", "{\"a\":[1,2]}\t\x7f", []byte{0, 1, 2, 255}, "", uint64(1), 0, 5,
		int64(1)<<62, int64(-62_200_000_000_000), int64(0), byte(0x38), byte(0x04))
	f.Add("m", "q", "completed", "", "", "", []byte{}, "", uint64(9), 3, 0, int64(0),
		int64(253_402_300_800_000), int64(1), byte(0x5f), byte(0x1f))
	f.Add("m", "q", "running", "k", "v", "", []byte("bin"), "L", uint64(2), 1, 1, int64(7),
		int64(1_790_000_000_123), int64(1_790_000_030_123), byte(0x97), byte(0x10))
	f.Fuzz(func(t *testing.T, id, queue, state, mk, mv, payload string, payloadB64 []byte, lease string,
		version uint64, attempts, left int, priority, at, other int64, flags, zones byte) {
		// Bit i of zones puts the i-th time (enqueued, visible, updated, lease expiry, end) in
		// another zone than UTC, which AppendMessage leaves to encoding/json.
		in := func(i int, ms int64) time.Time {
			if zones&(1<<i) != 0 {
				return time.UnixMilli(ms).In(time.FixedZone("x", 3600))
			}
			return time.UnixMilli(ms).UTC()
		}
		m := subjects.Message{ID: id, Queue: queue, State: subjects.State(state), Priority: priority,
			PayloadBase64: payloadB64, Version: version, Attempts: attempts, AttemptsLeft: left, LeaseID: lease,
			EnqueuedAt: in(0, at), VisibleAt: in(1, other), UpdatedAt: in(2, at)}
		if flags&0x01 != 0 {
			m.Payload = &payload
		}
		if flags&0x02 != 0 {
			t := in(3, other)
			m.LeaseExpiresAt = &t
		}
		if flags&0x04 != 0 {
			m.Metadata = map[string]string{mk: mv, "z" + mk: mv + mv}
		}
		if flags&0x08 != 0 {
			m.Metadata = map[string]string{} // empty, not nil: omitted all the same
		}
		if flags&0x10 != 0 {
			t := in(4, at/3)
			m.EndedAt = &t
		}
		if flags&0x80 != 0 { // more keys than AppendMessage sorts on its stack
			m.Metadata = map[string]string{}
			for i := range 20 {
				m.Metadata[mk+string(rune('a'+i))] = mv
			}
		}
		want, wantErr := marshalText(&m)
		got, err := subjects.AppendMessage([]byte("prefix"), &m)
		if (err == nil) != (wantErr == nil) {
			t.Fatalf("error %v, marshalText says %v", err, wantErr)
		}
		if err == nil && string(got) != "prefix"+string(want) {
			t.Fatalf("\n got %s\nwant prefix%s", got, want)
		}

		r := subjects.DequeueReply{Messages: []subjects.Message{m, leasedMessage()}}
		if flags&0x20 != 0 {
			r.Messages = r.Messages[:0]
		}
		want, wantErr = marshalText(&r)
		got, err = subjects.AppendDequeueReply(nil, &r)
		if (err == nil) != (wantErr == nil) {
			t.Fatalf("reply: error %v, marshalText says %v", err, wantErr)
		}
		if err == nil && string(got) != string(want) {
			t.Fatalf("reply:\n got %s\nwant %s", got, want)
		}

		// The settled message first, then what its next dequeue leased (or why it failed).
		s := subjects.SettleReply{Message: leasedMessage(), Next: &subjects.NextReply{Messages: r.Messages}}
		if flags&0x40 != 0 {
			s = subjects.SettleReply{Message: m, Next: &subjects.NextReply{Messages: []subjects.Message{},
				Error: subjects.Errorf(subjects.CodeQueueBlocked, "%s", payload)}}
		}
		want, wantErr = marshalText(&s)
		got, err = subjects.AppendSettleReply([]byte("prefix"), &s)
		if (err == nil) != (wantErr == nil) {
			t.Fatalf("settle: error %v, marshalText says %v", err, wantErr)
		}
		if err == nil && string(got) != "prefix"+string(want) {
			t.Fatalf("settle:\n got %s\nwant prefix%s", got, want)
		}
	})
}

// TestAppendMessageDirect: a dequeue's reply takes the direct path, which allocates nothing in a
// buffer large enough but the sorting of the metadata keys (encoding/json allocates several times
// per message).
func TestAppendMessageDirect(t *testing.T) {
	r := subjects.DequeueReply{Messages: []subjects.Message{leasedMessage()}}
	want, err := marshalText(&r)
	if err != nil {
		t.Fatal(err)
	}
	buf := make([]byte, 0, 2048)
	got, err := subjects.AppendDequeueReply(buf, &r)
	if err != nil || string(got) != string(want) {
		t.Fatalf("AppendDequeueReply: %s, %v\nwant %s", got, err, want)
	}
	if nilReply, _ := subjects.AppendDequeueReply(nil, &subjects.DequeueReply{}); string(nilReply) != `{"messages":null}` {
		t.Fatalf("a reply without messages: %s", nilReply)
	}
	allocs := testing.AllocsPerRun(100, func() {
		if _, err := subjects.AppendDequeueReply(buf[:0], &r); err != nil {
			t.Fatal(err)
		}
	})
	if allocs > 2 {
		t.Errorf("AppendDequeueReply of a leased message: %.0f allocations, want at most 2 (it went through encoding/json)", allocs)
	}
}

func BenchmarkAppendMessage(b *testing.B) {
	m := leasedMessage()
	b.Run("AppendMessage", func(b *testing.B) {
		b.ReportAllocs()
		buf := make([]byte, 0, 2048)
		for b.Loop() {
			buf, _ = subjects.AppendMessage(buf[:0], &m)
		}
	})
	b.Run("encoding/json", func(b *testing.B) {
		b.ReportAllocs()
		for b.Loop() {
			_, _ = json.Marshal(&m)
		}
	})
}

// FuzzStringLen holds StringLen to what a message's JSON holds for a string (marshalText's).
func FuzzStringLen(f *testing.F) {
	for _, s := range []string{"", "plain", "é<&>\"\\\n\x00\x1f\x7f", "\u2028\u2029", "\xff\xfe", "a\xe2\x80"} {
		f.Add(s)
	}
	f.Fuzz(func(t *testing.T, s string) {
		want, err := marshalText(s)
		if err != nil {
			t.Fatal(err)
		}
		if got := subjects.StringLen(s); got != len(want) {
			t.Fatalf("StringLen(%q) = %d, the JSON is %d bytes: %s", s, got, len(want), want)
		}
	})
}

// FuzzSetPayloadBound checks that no payload takes more than MaxPayloadJSON of its size in a reply,
// whichever form SetPayload picks, and that the form carries the payload back.
func FuzzSetPayloadBound(f *testing.F) {
	for _, p := range []string{"", "\"\"", "hello", `{"a":"b","c":[1,2]}`, "<p>a &amp; b</p>", "\x00\x00\x00\x00", "\x08\x96\x01\x12\x04abcd", "\xff"} {
		f.Add([]byte(p))
	}
	f.Fuzz(func(t *testing.T, p []byte) {
		var m subjects.Message
		m.SetPayload(p)
		with, err := subjects.AppendMessage(nil, &m)
		if err != nil {
			t.Fatal(err)
		}
		m.Payload, m.PayloadBase64 = nil, nil
		without, err := subjects.AppendMessage(nil, &m)
		if err != nil {
			t.Fatal(err)
		}
		// The field's name, `,"payload_base64":` at most, is the reply's to count (18 bytes).
		if grew := len(with) - len(without) - 18; grew > subjects.MaxPayloadJSON(len(p)) {
			t.Fatalf("a payload of %d bytes took %d in the reply, over MaxPayloadJSON's %d", len(p), grew, subjects.MaxPayloadJSON(len(p)))
		}
		var back subjects.Message
		if err := json.Unmarshal(with, &back); err != nil {
			t.Fatal(err)
		}
		if got := back.PayloadBytes(); string(got) != string(p) {
			t.Fatalf("the reply carries %q, want %q", got, p)
		}
	})
}

func TestSetPayloadForm(t *testing.T) {
	for _, c := range []struct {
		payload string
		text    bool
	}{
		{"hello, world", true},
		{`{"order":42,"lines":[{"sku":"a","n":1},{"sku":"b","n":2}]}`, true},
		{`<ul><li class="x">a &amp; b</li><li>c</li></ul>`, true},
		{"line one\nline two\ttabbed\r\n", true},
		{"", true},
		{`""`, true},
		{strings.Repeat("\x00", 64), false},                        // valid UTF-8, six bytes each as JSON
		{"\x08\x96\x01\x12\x07testing\x1a\x03\x08\x01\x10", false}, // invalid UTF-8 (a protobuf)
		{"\x08\x01\x12\x02ab\x1a\x02\x08\x01\x20\x05", false},      // valid UTF-8, mostly control bytes (a protobuf)
	} {
		var m subjects.Message
		m.SetPayload([]byte(c.payload))
		if text := m.Payload != nil; text != c.text {
			t.Errorf("SetPayload(%q): as a JSON string %v, want %v", c.payload, text, c.text)
		}
		if got := string(m.PayloadBytes()); got != c.payload {
			t.Errorf("SetPayload(%q) carries %q", c.payload, got)
		}
	}
}
