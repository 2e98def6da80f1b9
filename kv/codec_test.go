package kv_test

import (
	"encoding/json"
	"reflect"
	"testing"

	"github.com/natstone/natstone/kv"
	"github.com/natstone/natstone/subjects"
)

func fullRecord() kv.Record {
	return kv.Record{
		ID: "héllo ✓ id", State: subjects.StateRunning, Priority: -1767225600000, BodySeq: 1 << 40,
		PayloadSize: 32768, Metadata: map[string]string{"project": "foo", "k": "", "ü": "v v"},
		Version: 7, Attempts: 2, MaxAttempts: 5, LeaseMS: 120000, LeaseID: "Yc2cKq7Jd0YxW9mWk3sV2C",
		LeaseExpires: 1767225660000, RequestID: "w1-000123", Released: true,
		EnqueuedAt: 1767225500000, VisibleAt: 1767225505000, UpdatedAt: 1767225600000, EndedAt: 0,
	}
}

func TestRecordRoundTrip(t *testing.T) {
	t.Parallel()
	for _, r := range []kv.Record{fullRecord(), {ID: "x", State: subjects.StatePending}} {
		b, err := kv.EncodeRecord(&r)
		if err != nil {
			t.Fatal(err)
		}
		got, err := kv.DecodeRecord(b)
		if err != nil {
			t.Fatal(err)
		}
		if !reflect.DeepEqual(got, r) {
			t.Fatalf("round trip:\n got %+v\nwant %+v", got, r)
		}
	}
	if _, err := kv.EncodeRecord(&kv.Record{ID: "x", State: "bogus"}); err == nil {
		t.Fatal("unknown state encoded")
	}
}

// TestRecordLegacyJSON: records written before the binary format are still read.
func TestRecordLegacyJSON(t *testing.T) {
	t.Parallel()
	want := fullRecord()
	b, err := json.Marshal(want)
	if err != nil {
		t.Fatal(err)
	}
	got, err := kv.DecodeRecord(b)
	if err != nil || !reflect.DeepEqual(got, want) {
		t.Fatalf("legacy JSON: %+v %v", got, err)
	}
}

// TestRecordTruncated: every strict prefix of a record, and trailing bytes, are errors, not panics.
func TestRecordTruncated(t *testing.T) {
	t.Parallel()
	r := fullRecord()
	b, err := kv.EncodeRecord(&r)
	if err != nil {
		t.Fatal(err)
	}
	for i := range b {
		if _, err := kv.DecodeRecord(b[:i]); err == nil {
			t.Fatalf("prefix of %d of %d bytes decoded", i, len(b))
		}
	}
	if _, err := kv.DecodeRecord(append(b, 0)); err == nil {
		t.Fatal("trailing byte accepted")
	}
}
