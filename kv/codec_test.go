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

// TestEncodeLock: EncodeLock writes what json.Marshal writes, escapes included, and it reads back.
func TestEncodeLock(t *testing.T) {
	t.Parallel()
	for _, l := range []kv.Lock{
		{},
		{MessageID: "m1"},
		{MessageID: "m1", LeaseID: "Yc2cKq7Jd0YxW9mWk3sV2C"},
		{LeaseID: "L"},
		{MessageID: `a"b\c`, LeaseID: "L"},
		{MessageID: "<tag>&", LeaseID: "L"},
		{MessageID: "héllo ✓", LeaseID: "L"},
		{MessageID: "tab\there", LeaseID: "L"},
		{MessageID: "m1", LeaseID: "L", Version: 7},
		{Version: 1},
		{LeaseID: "L", Version: 18446744073709551615},
		{MessageID: "m1", LeaseID: "L", Version: 7, BodySeq: 42},
		{BodySeq: 18446744073709551615},
	} {
		got := kv.EncodeLock(l)
		want, err := json.Marshal(l)
		if err != nil {
			t.Fatal(err)
		}
		if string(got) != string(want) {
			t.Errorf("%+v: %s, want %s", l, got, want)
		}
		var back kv.Lock
		if err := json.Unmarshal(got, &back); err != nil || back != l {
			t.Errorf("%+v: read back as %+v (%v)", l, back, err)
		}
	}
}

// FuzzEncodeLock holds EncodeLock to json.Marshal's bytes for any ids.
func FuzzEncodeLock(f *testing.F) {
	f.Add("m1", "Yc2cKq7Jd0YxW9mWk3sV2C", uint64(2), uint64(9))
	f.Add("", "", uint64(0), uint64(0))
	f.Add(`a"<b>`, "\x00\xff", uint64(1<<63), uint64(1))
	f.Fuzz(func(t *testing.T, id, lease string, version, bodySeq uint64) {
		l := kv.Lock{MessageID: id, LeaseID: lease, Version: version, BodySeq: bodySeq}
		got := kv.EncodeLock(l)
		want, err := json.Marshal(l)
		if err != nil {
			t.Fatal(err)
		}
		if string(got) != string(want) {
			t.Fatalf("%+v: %s, want %s", l, got, want)
		}
	})
}

// BenchmarkEncodeLock: a lock as an exclusive queue writes it at every lease, directly and through
// encoding/json.
func BenchmarkEncodeLock(b *testing.B) {
	l := kv.Lock{MessageID: "order-000123456", LeaseID: "Yc2cKq7Jd0YxW9mWk3sV2C"}
	b.Run("EncodeLock", func(b *testing.B) {
		b.ReportAllocs()
		for b.Loop() {
			kv.EncodeLock(l)
		}
	})
	b.Run("json.Marshal", func(b *testing.B) {
		b.ReportAllocs()
		for b.Loop() {
			if _, err := json.Marshal(l); err != nil {
				b.Fatal(err)
			}
		}
	})
}
