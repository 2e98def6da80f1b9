package subjects_test

import (
	"encoding/json"
	"fmt"
	"reflect"
	"strings"
	"testing"

	"github.com/natstone/natstone/subjects"
)

// enqueueBodies are seeds for the enqueue decoders: the shapes clients send, and the near misses
// that must go to encoding/json.
var enqueueBodies = []string{
	`{"payload":"hello","priority":1700000000000}`,
	` { "id" : "job-1" , "payload" : "x" , "priority" : -5 , "invisible_ms" : 0 , "lease_ms" : 30000 } `,
	`{"payload":"x","max_attempts":3}`,
	`{"payload":"x","max_attempts":3,"max_attempts":4}`,
	`{"id":"at","visible_at":"2026-11-28T09:00:00.5+01:00"}`,
	`{"id":"at","visible_at":"2026-11-28T09:00:00"}`,
	`{}`,
	``,
	`   `,
	`{"payload":"` + strings.Repeat("a", 2048) + `"}`,
	`{"payload":"caf\u00e9"}`,
	`{"payload":"café"}`,
	`{"payload":"tab\there"}`,
	"{\"payload\":\"raw\ttab\"}",
	`{"payload":"\x7f"}`,
	`{"Payload":"case"}`,
	`{"payload":"a","payload":"b"}`,
	`{"payload":"a","PAYLOAD":"b"}`,
	`{"priority":1.0}`,
	`{"priority":1e3}`,
	`{"priority":01}`,
	`{"priority":-0}`,
	`{"priority":-}`,
	`{"priority":9223372036854775807}`,
	`{"priority":99999999999999999999}`,
	`{"priority":null}`,
	`{"id":null}`,
	`{"id":""}`,
	`{"id":"","payload":"x"}`,
	`{"ID":"","id":"x"}`,
	`{"messages":[{"id":"a"},{"id":""}]}`,
	`{"payload":"x"} {}`,
	`{"payload":"x"}x`,
	`{"payload":"x",}`,
	`{"payload_base64":"eA=="}`,
	`{"metadata":{"k":"v"},"payload":"x"}`,
	`{"bogus":1}`,
	`[]`,
	`{"payload":"x"`,
	`{"messages":[{"payload":"a"},{"payload":"b","priority":2}]}`,
	`{"messages":[]}`,
	`{"messages":[{}]}`,
	`{"messages":[{"payload":"a"}],"messages":[{"payload":"b"}]}`,
	`{"messages":[{"payload":"a"},]}`,
	`{"messages":[{"payload":"a"}]} `,
	`{"messages":null}`,
	`{"Messages":[{"payload":"a"}]}`,
}

// FuzzDecodeEnqueue: the enqueue decoders' fast path must agree with Decode (encoding/json) on
// every input — the same request, or an error both times (the same one: the fallback is Decode).
func FuzzDecodeEnqueue(f *testing.F) {
	for _, b := range enqueueBodies {
		f.Add([]byte(b))
	}
	f.Fuzz(func(t *testing.T, data []byte) {
		got, err := subjects.DecodeEnqueue(data)
		var want subjects.EnqueueRequest
		wantErr := subjects.Decode(data, &want)
		var given struct {
			ID *string `json:"id"`
		}
		if wantErr == nil && json.Unmarshal(data, &given) == nil && given.ID != nil && *given.ID == "" {
			wantErr = emptyID("")
		}
		checkSame(t, data, got, err, want, wantErr)

		gotBatch, err := subjects.DecodeEnqueueBatch(data)
		var wantBatch subjects.EnqueueBatchRequest
		wantErr = subjects.Decode(data, &wantBatch)
		var givenBatch struct {
			Messages []json.RawMessage `json:"messages"`
		}
		if wantErr == nil && json.Unmarshal(data, &givenBatch) == nil {
			for i, raw := range givenBatch.Messages {
				var m struct {
					ID *string `json:"id"`
				}
				if string(raw) == "null" {
					wantErr = subjects.Errorf(subjects.CodeBadRequest, "messages[%d] is null, not a message", i)
					break
				}
				if json.Unmarshal(raw, &m) == nil && m.ID != nil && *m.ID == "" {
					wantErr = emptyID(fmt.Sprintf("messages[%d]: ", i))
					break
				}
			}
		}
		checkSame(t, data, gotBatch, err, wantBatch, wantErr)
	})
}

// emptyID is the error of an enqueue body whose id is given empty, after prefix.
func emptyID(prefix string) error {
	return subjects.Errorf(subjects.CodeInvalidID, "%sid is empty: omit it for the broker to generate one", prefix)
}

func checkSame[T any](t *testing.T, data []byte, got T, err error, want T, wantErr error) {
	t.Helper()
	if (err == nil) != (wantErr == nil) || (err != nil && err.Error() != wantErr.Error()) {
		t.Fatalf("%q: error %v, Decode says %v", data, err, wantErr)
	}
	if err == nil && !reflect.DeepEqual(got, want) {
		t.Fatalf("%q:\n got %#v\nwant %#v", data, got, want)
	}
}

// TestDecodeEnqueueFastPath: the common bodies decode as Decode decodes them (FuzzDecodeEnqueue
// runs the seeds too), and the decoders are used for what they are for.
func TestDecodeEnqueueFastPath(t *testing.T) {
	r, err := subjects.DecodeEnqueue([]byte(`{"id":"j","payload":"hello","priority":-7,"invisible_ms":5,"lease_ms":6,"max_attempts":7}`))
	if err != nil || r.ID != "j" || r.Payload != "hello" || r.Priority == nil || *r.Priority != -7 ||
		r.InvisibleMS == nil || *r.InvisibleMS != 5 || r.LeaseMS == nil || *r.LeaseMS != 6 || r.MaxAttempts == nil || *r.MaxAttempts != 7 {
		t.Fatalf("DecodeEnqueue: %+v, %v", r, err)
	}
	if _, err := subjects.DecodeEnqueue([]byte(`{"bogus":1}`)); err == nil {
		t.Fatal("an unknown field decoded without error")
	}
	// An id given empty is invalid_id, through either path; omitted or null, it is generated.
	for body, wantErr := range map[string]bool{
		`{"id":""}`: true, `{"id":"","payload":"café"}`: true, `{"id" : "" }`: true,
		`{"id":null}`: false, `{}`: false, `{"payload":""}`: false, `{"ID":"","id":"x"}`: false,
	} {
		_, err := subjects.DecodeEnqueue([]byte(body))
		if got := err != nil && strings.Contains(err.Error(), "invalid_id"); got != wantErr {
			t.Errorf("DecodeEnqueue(%s): %v, want invalid_id %v", body, err, wantErr)
		}
	}
	if _, err := subjects.DecodeEnqueueBatch([]byte(`{"messages":[{"id":"a"},{"id":""}]}`)); err == nil || !strings.Contains(err.Error(), "invalid_id: messages[1]: id is empty") {
		t.Errorf("a batch with an empty id: %v", err)
	}
	// A null message is not one of defaults, which encoding/json would make of it.
	for _, body := range []string{`{"messages":[null]}`, `{"messages":[{"id":"a"}, null ]}`} {
		if _, err := subjects.DecodeEnqueueBatch([]byte(body)); subjects.CodeOf(err) != subjects.CodeBadRequest || !strings.Contains(err.Error(), "is null, not a message") {
			t.Errorf("DecodeEnqueueBatch(%s): %v, want a bad_request", body, err)
		}
	}
	b, err := subjects.DecodeEnqueueBatch([]byte(`{"messages":[{"payload":"a"},{"payload":"b","priority":2}]}`))
	if err != nil || len(b.Messages) != 2 || b.Messages[1].Payload != "b" || *b.Messages[1].Priority != 2 {
		t.Fatalf("DecodeEnqueueBatch: %+v, %v", b, err)
	}
}

// BenchmarkDecodeEnqueue compares the one-pass enqueue decoder with Decode (encoding/json) on the
// body S3 sends: a 2 KiB payload and a priority.
func BenchmarkDecodeEnqueue(b *testing.B) {
	body := []byte(`{"priority":1700000000000,"payload":"` + strings.Repeat("abcdefgh", 256) + `"}`)
	b.Run("DecodeEnqueue", func(b *testing.B) {
		b.SetBytes(int64(len(body)))
		for b.Loop() {
			if _, err := subjects.DecodeEnqueue(body); err != nil {
				b.Fatal(err)
			}
		}
	})
	b.Run("Decode", func(b *testing.B) {
		b.SetBytes(int64(len(body)))
		for b.Loop() {
			var r subjects.EnqueueRequest
			if err := subjects.Decode(body, &r); err != nil {
				b.Fatal(err)
			}
		}
	})
}
