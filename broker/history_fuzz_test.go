package broker

import (
	"bytes"
	"encoding/json"
	"slices"
	"testing"
	"time"

	"github.com/natstone/natstone/subjects"
)

// FuzzHistory feeds arbitrary events-stream contents (one event per line, as anyone allowed to
// publish on the events subjects could write them) through history's decoding and buildHistory:
// nothing panics, undecodable events are skipped, and the result is in version order with no
// negative durations.
func FuzzHistory(f *testing.F) {
	f.Add([]byte(`{"kind":"enqueued","state":"pending","version":1,"at":"2026-11-22T15:04:05.123Z"}
{"kind":"leased","state":"running","version":2,"at":"2026-11-22T15:04:06Z"}
{"kind":"leased","state":"running","version":2,"at":"2026-11-22T15:04:06Z"}
{"kind":"collected","version":3,"at":"2026-11-22T15:04:01Z"}`))
	f.Add([]byte(`{"version":18446744073709551615,"at":"0001-01-01T00:00:00Z"}
not json
{"kind":"errored","state":"errored","reason":"x","version":0}`))
	now := time.Date(2026, 11, 22, 16, 0, 0, 0, time.UTC)
	f.Fuzz(func(t *testing.T, data []byte) {
		var events []subjects.Event
		for _, line := range bytes.Split(data, []byte("\n")) {
			var e subjects.Event
			if json.Unmarshal(line, &e) == nil {
				events = append(events, e)
			}
		}
		h := buildHistory("q", "m", events, false, nil, now)
		for i, e := range h.Events {
			if e.StateMS < 0 {
				t.Fatalf("event %d: negative state_ms %d", i, e.StateMS)
			}
			if i > 0 && h.Events[i-1].Version > e.Version {
				t.Fatalf("event %d: version %d after %d", i, e.Version, h.Events[i-1].Version)
			}
		}
		for s, ms := range h.StateMS {
			if ms < 0 {
				t.Fatalf("state %s: negative total %d", s, ms)
			}
		}
	})
}

// TestLatestLife: the events of the latest message with an id, from its first enqueued event, even
// when a batch holding an earlier message's last event and the enqueue was published twice.
func TestLatestLife(t *testing.T) {
	at := func(s int) time.Time { return time.Unix(int64(s), 0) }
	first := []subjects.Event{
		{Kind: subjects.EventEnqueued, Version: 1, At: at(1)},
		{Kind: subjects.EventLeased, Version: 2, At: at(2)},
		{Kind: subjects.EventCompleted, Version: 3, At: at(3)},
	}
	collected := subjects.Event{Kind: subjects.EventCollected, Version: 4, At: at(4)}
	enqueued := subjects.Event{Kind: subjects.EventEnqueued, Version: 1, At: at(5)}
	leased := subjects.Event{Kind: subjects.EventLeased, Version: 2, At: at(6)}
	for name, tc := range map[string]struct{ in, want []subjects.Event }{
		"one message":    {first, first},
		"no enqueued":    {first[1:], first[1:]},
		"enqueued again": {append(slices.Clone(first), collected, enqueued, leased), []subjects.Event{enqueued, leased}},
		"batch published twice": {append(slices.Clone(first), collected, enqueued, collected, enqueued, leased),
			[]subjects.Event{enqueued, enqueued, leased}},
	} {
		if got := latestLife(tc.in); !slices.EqualFunc(got, tc.want, func(a, b subjects.Event) bool {
			return a.Kind == b.Kind && a.Version == b.Version && a.At.Equal(b.At)
		}) {
			t.Errorf("%s: got %+v, want %+v", name, got, tc.want)
		}
	}
}
