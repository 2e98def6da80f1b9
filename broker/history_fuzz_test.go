package broker

import (
	"bytes"
	"encoding/json"
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
		h := buildHistory("q", "m", events, false, now)
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
