package subjects_test

import (
	"reflect"
	"testing"

	"github.com/natstone/natstone/subjects"
)

// requestBodies are seeds for the dequeue and lease decoders: the bodies workers send, and near
// misses that must go to encoding/json.
var requestBodies = []string{
	`{}`,
	``,
	` { } `,
	`{"batch":1}`,
	`{"batch":10,"wait_ms":20000,"lease_ms":60000,"request_id":"r-1","worker":"host:42"}`,
	` { "worker" : "w" , "batch" : 3 } `,
	"\t{\r\n\"id\":\t\"m\"\r,\n\"lease_id\" :\"L\"}\n",
	`{"id":"m","version":3}`,
	"\v{\"batch\":1}",
	`{"batch":-0}`,
	`{"batch":01}`,
	`{"wait_ms":999999999999999999}`,
	`{"wait_ms":9999999999999999999}`,
	`{"lease_ms":-123456789012345678}`,
	`{"batch":1,"filter":{"region":"eu"}}`,
	`{"batch":1,"batch":2}`,
	`{"BATCH":2}`,
	`{"batch":1.5}`,
	`{"batch":-1}`,
	`{"batch":99999999999999999999}`,
	`{"batch":null}`,
	`{"batch":"1"}`,
	`{"worker":"caf\u00e9"}`,
	`{"worker":"tab\there"}`,
	`{"batch":1}x`,
	`{"batch":1} {}`,
	`{"batch":1,}`,
	`{"bogus":1}`,
	`[]`,
	`null`,
	`{"id":"01JD42","lease_id":"01JDLEASE"}`,
	`{"lease_id":"L","id":"m"}`,
	`{"id":"m"}`,
	`{"id":"m","id":"n"}`,
	`{"id":"m","lease_id":null}`,
	`{"Id":"m"}`,
	`{"id":"m","lease_id":"L","delay_ms":5}`,
	`{"id":"m","lease_id":"L","next":{"batch":1}}`,
	`{"id":"m","lease_id":"L","next":{}}`,
	` {"next" : { } , "id":"m"} `,
	`{"id":"m","next":{"batch":2,"lease_ms":60000,"request_id":"r","worker":"w"},"lease_id":"L"}`,
	`{"id":"m","next":{"batch":1,"filter":{"k":"v"}}}`,
	`{"id":"m","next":{"batch":1}}}`,
	`{"id":"m","next":{"batch":1},"next":{"worker":"w"}}`,
	`{"id":"m","next":null}`,
	`{"id":"m","next":{"batch":1,"batch":2}}`,
	`{"id":"m","next":{"bogus":1}}`,
	`{"id":"m","next":{"batch":1}`,
	`{"id":"m","next":[]}`,
}

// FuzzDecodeRequests: DecodeDequeue and DecodeLease must agree with Decode (encoding/json) on every
// input — the same request, or the same error.
func FuzzDecodeRequests(f *testing.F) {
	for _, b := range requestBodies {
		f.Add([]byte(b))
	}
	f.Fuzz(func(t *testing.T, data []byte) {
		got, err := subjects.DecodeDequeue(data)
		var want subjects.DequeueRequest
		checkSame(t, data, got, err, want, subjects.Decode(data, &want))

		gotLease, err := subjects.DecodeLease(data)
		var wantLease subjects.LeaseRequest
		checkSame(t, data, gotLease, err, wantLease, subjects.Decode(data, &wantLease))
	})
}

// TestDecodeRequestsFastPath: a worker's bodies take the fast path, which allocates only the
// strings it returns (Decode allocates a json.Decoder and its buffer per body).
func TestDecodeRequestsFastPath(t *testing.T) {
	dequeue := []byte(`{"batch":10,"wait_ms":20000,"lease_ms":60000,"request_id":"r-1","worker":"host:42"}`)
	r, err := subjects.DecodeDequeue(dequeue)
	if err != nil || !reflect.DeepEqual(r, subjects.DequeueRequest{Batch: 10, WaitMS: 20000, LeaseMS: 60000, RequestID: "r-1", Worker: "host:42"}) {
		t.Fatalf("DecodeDequeue: %+v, %v", r, err)
	}
	if allocs := testing.AllocsPerRun(100, func() { _, _ = subjects.DecodeDequeue(dequeue) }); allocs > 2 {
		t.Errorf("DecodeDequeue: %.0f allocations, want at most 2 (its two strings)", allocs)
	}
	lease := []byte(`{"id":"01JD42","lease_id":"01JDLEASE"}`)
	l, err := subjects.DecodeLease(lease)
	if err != nil || l != (subjects.LeaseRequest{ID: "01JD42", LeaseID: "01JDLEASE"}) {
		t.Fatalf("DecodeLease: %+v, %v", l, err)
	}
	if allocs := testing.AllocsPerRun(100, func() { _, _ = subjects.DecodeLease(lease) }); allocs > 2 {
		t.Errorf("DecodeLease: %.0f allocations, want at most 2 (its two strings)", allocs)
	}
	if _, err := subjects.DecodeLease([]byte(`{"id":"m","bogus":1}`)); err == nil {
		t.Fatal("an unknown field decoded without error")
	}
	next := []byte(`{"id":"01JD42","lease_id":"01JDLEASE","next":{"batch":1,"worker":"host:42"}}`)
	n, err := subjects.DecodeLease(next)
	if err != nil || !reflect.DeepEqual(n, subjects.LeaseRequest{ID: "01JD42", LeaseID: "01JDLEASE", Next: &subjects.DequeueRequest{Batch: 1, Worker: "host:42"}}) {
		t.Fatalf("DecodeLease with next: %+v, %v", n, err)
	}
	if allocs := testing.AllocsPerRun(100, func() { _, _ = subjects.DecodeLease(next) }); allocs > 4 {
		t.Errorf("DecodeLease with next: %.0f allocations, want at most 4 (its three strings and next)", allocs)
	}
}

func BenchmarkDecodeRequests(b *testing.B) {
	lease := []byte(`{"id":"01JD0000000000000000000042","lease_id":"01JDLEASE0000000000000001"}`)
	b.Run("DecodeLease", func(b *testing.B) {
		b.ReportAllocs()
		for b.Loop() {
			_, _ = subjects.DecodeLease(lease)
		}
	})
	b.Run("Decode", func(b *testing.B) {
		b.ReportAllocs()
		for b.Loop() {
			var r subjects.LeaseRequest
			_ = subjects.Decode(lease, &r)
		}
	})
}
