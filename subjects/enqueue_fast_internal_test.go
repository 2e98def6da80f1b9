package subjects

import "testing"

// TestFastEnqueueTaken: the bodies clients usually send take the one-pass path (FuzzDecodeEnqueue
// shows it agrees with Decode; this shows it is not always falling back).
func TestFastEnqueueTaken(t *testing.T) {
	for _, body := range []string{
		`{"payload":"hello","priority":1700000000000}`,
		` {"id":"job-1", "payload":"x", "invisible_ms":0, "lease_ms":30000, "max_attempts":3}` + "\n",
		`{}`,
	} {
		var r EnqueueRequest
		if p, ok := fastEnqueue([]byte(body), 0, &r); !ok || skip([]byte(body), p) != len(body) {
			t.Errorf("%q: not decoded in one pass", body)
		}
	}
	var b EnqueueBatchRequest
	if !fastEnqueueBatch([]byte(`{"messages":[{"payload":"a"}, {"payload":"b","priority":2}]}`), &b) || len(b.Messages) != 2 {
		t.Errorf("batch not decoded in one pass: %+v", b)
	}
	for _, body := range []string{`{"payload":"caf\u00e9"}`, `{"Payload":"x"}`, `{"payload":"a","payload":"b"}`, `{"priority":1.5}`} {
		var r EnqueueRequest
		if _, ok := fastEnqueue([]byte(body), 0, &r); ok {
			t.Errorf("%q: decoded in one pass; it must go to encoding/json", body)
		}
	}
}
