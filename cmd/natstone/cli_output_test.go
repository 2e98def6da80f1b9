package main

import (
	"flag"
	"io"
	"reflect"
	"slices"
	"testing"
	"time"

	"github.com/natstone/natstone/subjects"
	"github.com/natstone/natstone/workers"
)

func TestPayloadPreview(t *testing.T) {
	t.Parallel()
	for _, tc := range []struct {
		payload []byte
		want    string
	}{
		{nil, "-"},
		{[]byte{}, `""`},
		{[]byte("hello"), "hello"},
		{[]byte("a\tb\nc\x1b[31m"), "a.b.c.[31m"},
		{[]byte("ünïcödé"), "ünïcödé"},
		{[]byte("0123456789abc"), "0123456789…"},
		{[]byte{0xff, 0xfe}, "(2 bytes, binary)"},
	} {
		if got := payloadPreview(tc.payload, 10); got != tc.want {
			t.Errorf("payloadPreview(%q) = %q, want %q", tc.payload, got, tc.want)
		}
	}
}

func TestFmtDuration(t *testing.T) {
	t.Parallel()
	for d, want := range map[time.Duration]string{
		0: "0s", 500 * time.Millisecond: "500ms", 30 * time.Second: "30s", time.Minute: "1m",
		90 * time.Second: "1m30s", 24 * time.Hour: "24h", 90 * time.Minute: "1h30m", time.Hour + time.Second: "1h0m1s",
	} {
		if got := fmtDuration(d); got != want {
			t.Errorf("fmtDuration(%v) = %q, want %q", d, got, want)
		}
	}
}

func TestParseInterleaved(t *testing.T) {
	t.Parallel()
	for _, tc := range []struct {
		args    []string
		wantPos []string
		wantID  string
		wantB   bool
	}{
		{[]string{"q", "--id", "x", "payload"}, []string{"q", "payload"}, "x", false},
		{[]string{"--b", "q", "p", "--id=y"}, []string{"q", "p"}, "y", true},
		{[]string{"q", "--", "--id", "-"}, []string{"q", "--id", "-"}, "", false},
		{[]string{"q", "-", "--b"}, []string{"q", "-"}, "", true},
		{nil, nil, "", false},
	} {
		fs := flag.NewFlagSet("t", flag.ContinueOnError)
		fs.SetOutput(io.Discard)
		id := fs.String("id", "", "")
		b := fs.Bool("b", false, "")
		pos, err := parseInterleaved(fs, tc.args, io.Discard)
		if err != nil || !slices.Equal(pos, tc.wantPos) || *id != tc.wantID || *b != tc.wantB {
			t.Errorf("parseInterleaved(%q) = %q, %v, id %q, b %v; want %q, id %q, b %v",
				tc.args, pos, err, *id, *b, tc.wantPos, tc.wantID, tc.wantB)
		}
	}
}

func TestParseDeadline(t *testing.T) {
	t.Parallel()
	now := time.Date(2026, 1, 1, 0, 0, 0, 0, time.UTC)
	for s, want := range map[string]time.Time{
		"2026-03-04T05:06:07Z":        time.Date(2026, 3, 4, 5, 6, 7, 0, time.UTC),
		"2026-03-04T05:06:07.5+01:00": time.Date(2026, 3, 4, 4, 6, 7, 5e8, time.UTC),
		"90m":                         now.Add(90 * time.Minute),
		"-1h":                         now.Add(-time.Hour),
	} {
		if got, err := parseDeadline(s, now); err != nil || !got.Equal(want) {
			t.Errorf("parseDeadline(%q) = %v, %v; want %v", s, got, err, want)
		}
	}
	if _, err := parseDeadline("soon", now); err == nil {
		t.Error("parseDeadline(soon) succeeded")
	}
}

func TestWireMessage(t *testing.T) {
	t.Parallel()
	now := time.Date(2026, 1, 1, 0, 0, 0, 0, time.UTC)
	text := "hi"
	for _, tc := range []struct {
		in   workers.Message
		want subjects.Message
	}{
		{workers.Message{ID: "a", State: subjects.StatePending, Payload: []byte("hi"), EnqueuedAt: now},
			subjects.Message{ID: "a", State: subjects.StatePending, Payload: &text, EnqueuedAt: now}},
		{workers.Message{ID: "b", Payload: []byte{0xff}, LeaseID: "L", LeaseExpiresAt: now, EndedAt: now},
			subjects.Message{ID: "b", PayloadBase64: []byte{0xff}, LeaseID: "L", LeaseExpiresAt: &now, EndedAt: &now}},
		{workers.Message{ID: "c"}, subjects.Message{ID: "c"}},
	} {
		if got := wireMessage(&tc.in); !reflect.DeepEqual(got, tc.want) {
			t.Errorf("wireMessage(%+v) = %+v, want %+v", tc.in, got, tc.want)
		}
	}
}
