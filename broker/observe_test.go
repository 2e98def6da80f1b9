package broker_test

import (
	"context"
	"encoding/base64"
	"fmt"
	"reflect"
	"slices"
	"strings"
	"testing"
	"time"

	"github.com/nats-io/nats.go/jetstream"

	"github.com/natstone/natstone/broker"
	"github.com/natstone/natstone/subjects"
	"github.com/natstone/natstone/test/natstest"
)

// step is one expected event of a message's history.
type step struct {
	kind   subjects.EventKind
	state  subjects.State
	reason string
}

func (e *env) history(queue, id string) subjects.HistoryReply {
	e.t.Helper()
	return must[subjects.HistoryReply](e, subjects.OpHistory, queue, subjects.HistoryRequest{ID: id})
}

// checkHistory compares a history with the steps: kinds, states and reasons in order, versions
// one after another from 1.
func checkHistory(t *testing.T, h subjects.HistoryReply, want []step) {
	t.Helper()
	var got []string
	for _, ev := range h.Events {
		got = append(got, fmt.Sprintf("%s→%s%s", ev.Kind, ev.State, ev.Reason))
	}
	var exp []string
	for _, s := range want {
		exp = append(exp, fmt.Sprintf("%s→%s%s", s.kind, s.state, s.reason))
	}
	if !slices.Equal(got, exp) {
		t.Fatalf("history of %s:\n got %v\nwant %v", h.ID, got, exp)
	}
	for i, ev := range h.Events {
		if ev.Version != uint64(i+1) {
			t.Errorf("event %d (%s) has version %d, want %d", i, ev.Kind, ev.Version, i+1)
		}
		if ev.ID != h.ID || ev.Queue != h.Queue {
			t.Errorf("event %d is of %s/%s, want %s/%s", i, ev.Queue, ev.ID, h.Queue, h.ID)
		}
	}
}

// TestEventsEveryTransition drives messages through every transition of the state diagram and
// checks each one's history: every kind, in order, with consecutive versions.
func TestEventsEveryTransition(t *testing.T) {
	e := setup(t)
	e.create("q", subjects.CreateQueueRequest{MaxAttempts: 2, LeaseMS: 1000, RetentionMS: ptr[int64](5000)})

	// a: invisible → pending → leased → extended → released → leased → completed → collected.
	e.enqueue("q", subjects.EnqueueRequest{ID: "a", Payload: "x", InvisibleMS: ptr[int64](500), Metadata: map[string]string{"k": "v"}})
	e.advance(500 * time.Millisecond)
	m := e.dequeueWith("q", subjects.DequeueRequest{Worker: "w1", RequestID: "r1"})
	must[subjects.Message](e, subjects.OpExtend, "q", subjects.ExtendRequest{ID: "a", LeaseID: m.LeaseID, LeaseMS: 2000})
	must[subjects.Message](e, subjects.OpRelease, "q", subjects.ReleaseRequest{ID: "a", LeaseID: m.LeaseID})
	m = e.dequeueOne("q")
	must[subjects.Message](e, subjects.OpComplete, "q", subjects.LeaseRequest{ID: "a", LeaseID: m.LeaseID})

	// b: pending → leased → expired → leased → errored (lease ran out, no attempt left).
	e.enqueue("q", subjects.EnqueueRequest{ID: "b", Payload: "x"})
	e.enqueue("other", subjects.EnqueueRequest{ID: "b", Payload: "x"}) // same id, another queue
	e.dequeueOne("q")
	e.advance(time.Second)
	e.dequeueOne("q")
	e.advance(time.Second)

	// c: pending → canceled by an operator.
	e.enqueue("q", subjects.EnqueueRequest{ID: "c", Payload: "x"})
	must[subjects.Message](e, subjects.OpCancel, "q", subjects.LeaseRequest{ID: "c"})

	// d: leased → released for later (invisible) → pending → leased → released with no attempt left.
	e.enqueue("q", subjects.EnqueueRequest{ID: "d", Payload: "x"})
	m = e.dequeueOne("q")
	must[subjects.Message](e, subjects.OpRelease, "q", subjects.ReleaseRequest{ID: "d", LeaseID: m.LeaseID, DelayMS: 300})
	e.advance(300 * time.Millisecond)
	m = e.dequeueOne("q")
	must[subjects.Message](e, subjects.OpRelease, "q", subjects.ReleaseRequest{ID: "d", LeaseID: m.LeaseID})

	// a, b, c and d are collected: a, b and c at once when their retention ends, d (which ended later)
	// in the next collection, because collections are at least 100 ms apart.
	e.advance(5 * time.Second)
	e.advance(100 * time.Millisecond)

	ha := e.history("q", "a")
	checkHistory(t, ha, []step{
		{subjects.EventEnqueued, subjects.StateInvisible, ""},
		{subjects.EventPending, subjects.StatePending, ""},
		{subjects.EventLeased, subjects.StateRunning, ""},
		{subjects.EventExtended, subjects.StateRunning, ""},
		{subjects.EventReleased, subjects.StatePending, ""},
		{subjects.EventLeased, subjects.StateRunning, ""},
		{subjects.EventCompleted, subjects.StateCompleted, ""},
		{subjects.EventCollected, "", ""},
	})
	if !ha.Collected || ha.Failures != 1 {
		t.Errorf("history of a: collected=%v failures=%d, want true and 1", ha.Collected, ha.Failures)
	}
	if ev := ha.Events[0]; ev.Metadata["k"] != "v" || ev.PayloadSize != 1 || ev.VisibleAt == nil {
		t.Errorf("enqueued event %+v lacks metadata, payload size or visible_at", ev)
	}
	if ev := ha.Events[2]; ev.Worker != "w1" || ev.RequestID != "r1" || ev.LeaseID == "" || ev.LeaseExpiresAt == nil || ev.Attempts != 1 {
		t.Errorf("leased event %+v: want worker w1, request r1, a lease and attempt 1", ev)
	}
	// Time in each state comes from the fake clock: 500 ms invisible, 5 s completed until collected.
	if ha.StateMS[subjects.StateInvisible] != 500 || ha.StateMS[subjects.StateCompleted] != 5000 {
		t.Errorf("time in states %v: want invisible 500 ms and completed 5000 ms", ha.StateMS)
	}

	checkHistory(t, e.history("q", "b"), []step{
		{subjects.EventEnqueued, subjects.StatePending, ""},
		{subjects.EventLeased, subjects.StateRunning, ""},
		{subjects.EventExpired, subjects.StatePending, ""},
		{subjects.EventLeased, subjects.StateRunning, ""},
		{subjects.EventErrored, subjects.StateErrored, subjects.ReasonLeaseExpired},
		{subjects.EventCollected, "", ""},
	})
	checkHistory(t, e.history("q", "c"), []step{
		{subjects.EventEnqueued, subjects.StatePending, ""},
		{subjects.EventCanceled, subjects.StateCanceled, ""},
		{subjects.EventCollected, "", ""},
	})
	checkHistory(t, e.history("q", "d"), []step{
		{subjects.EventEnqueued, subjects.StatePending, ""},
		{subjects.EventLeased, subjects.StateRunning, ""},
		{subjects.EventReleased, subjects.StateInvisible, ""},
		{subjects.EventPending, subjects.StatePending, ""},
		{subjects.EventLeased, subjects.StateRunning, ""},
		{subjects.EventErrored, subjects.StateErrored, subjects.ReasonReleased},
		{subjects.EventCollected, "", ""},
	})
	// Same id, other queue: its own history.
	checkHistory(t, e.history("other", "b"), []step{{subjects.EventEnqueued, subjects.StatePending, ""}})

	// The subjects carry queue, kind and the id token.
	subs := e.eventSubjects()
	want := "natstone.events.q.errored." + base64.RawURLEncoding.EncodeToString([]byte("d"))
	if !slices.Contains(subs, want) {
		t.Errorf("no event on %s among %d subjects", want, len(subs))
	}
	if n := 8 + 6 + 3 + 7 + 1; len(subs) != n {
		t.Errorf("events stream holds %d events, want %d", len(subs), n)
	}
}

func (e *env) dequeueWith(queue string, r subjects.DequeueRequest) subjects.Message {
	e.t.Helper()
	ms := e.dequeue(queue, r)
	if len(ms) != 1 {
		e.t.Fatalf("dequeue %s: got %d messages, want 1", queue, len(ms))
	}
	return ms[0]
}

// eventsStream publishes the broker's buffered events and returns the events stream with its
// info as it then is.
func (e *env) eventsStream(ctx context.Context) (jetstream.Stream, *jetstream.StreamInfo) {
	e.t.Helper()
	if err := e.b.FlushEvents(ctx); err != nil {
		e.t.Fatal(err)
	}
	js := e.jetStream()
	st, err := js.Stream(ctx, "natstone-events")
	if err != nil {
		e.t.Fatal(err)
	}
	info, err := st.Info(ctx)
	if err != nil {
		e.t.Fatal(err)
	}
	return st, info
}

// eventSubjects returns the subject of every event in the stream, in order.
func (e *env) eventSubjects() []string {
	e.t.Helper()
	ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
	defer cancel()
	st, info := e.eventsStream(ctx)
	var out []string
	for seq := info.State.FirstSeq; seq <= info.State.LastSeq && info.State.Msgs > 0; seq++ {
		m, err := st.GetMsg(ctx, seq)
		if err != nil {
			e.t.Fatalf("event %d: %v", seq, err)
		}
		out = append(out, m.Subject)
	}
	return out
}

// TestEventsSurviveCleanStop checks that a clean stop loses no event: a stopped broker publishes
// every buffered event (the next broker's history has them all), and a stopped server writes out
// every event it acknowledged (the events stream persists asynchronously: see kv.OpenEvents).
func TestEventsSurviveCleanStop(t *testing.T) {
	e := setup(t)
	e.create("q", subjects.CreateQueueRequest{})
	for i := range 200 {
		e.enqueue("q", subjects.EnqueueRequest{ID: fmt.Sprint(i), Payload: "x"})
	}
	ms := e.dequeue("q", subjects.DequeueRequest{Batch: 200})
	for _, m := range ms[:100] {
		must[subjects.Message](e, subjects.OpComplete, "q", subjects.LeaseRequest{ID: m.ID, LeaseID: m.LeaseID})
	}
	e.restartBroker() // no FlushEvents: Stop must publish what is buffered
	for _, m := range ms[100:] {
		must[subjects.Message](e, subjects.OpComplete, "q", subjects.LeaseRequest{ID: m.ID, LeaseID: m.LeaseID})
	}
	e.restartAll() // the broker, then the server: it must write out what it acknowledged
	for i := range 200 {
		h := e.history("q", fmt.Sprint(i))
		if len(h.Events) != 3 || h.Events[2].Kind != subjects.EventCompleted {
			t.Fatalf("message %d after restarts: %d events, want enqueued, leased, completed", i, len(h.Events))
		}
	}
	ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
	defer cancel()
	if _, info := e.eventsStream(ctx); info.Config.PersistMode != jetstream.AsyncPersistMode {
		t.Errorf("events stream persist mode %v, want async", info.Config.PersistMode)
	}
}

// TestEventsMaxBytes: the events stream is bounded in size as well as age; past the bound the
// oldest events go and the newest stay (history of the last message is whole, of the first empty).
func TestEventsMaxBytes(t *testing.T) {
	const maxBytes = 32 << 10
	e := setup(t, func(c *broker.Config) { c.EventsMaxBytes = maxBytes })
	e.create("q", subjects.CreateQueueRequest{})
	const n = 500 // an enqueued event is about 300 bytes stored: several times the bound
	for i := range n {
		e.enqueue("q", subjects.EnqueueRequest{ID: fmt.Sprint(i), Payload: "x"})
	}
	ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
	defer cancel()
	_, info := e.eventsStream(ctx)
	if info.Config.MaxBytes != maxBytes || info.Config.Discard != jetstream.DiscardOld {
		t.Errorf("stream max_bytes %d, discard %v; want %d, old", info.Config.MaxBytes, info.Config.Discard, maxBytes)
	}
	if info.State.Bytes > maxBytes || info.State.Msgs == 0 || info.State.Msgs >= n {
		t.Fatalf("stream holds %d events in %d bytes; want some but not all %d, within %d bytes", info.State.Msgs, info.State.Bytes, n, maxBytes)
	}
	if h := e.history("q", fmt.Sprint(n-1)); len(h.Events) != 1 || h.Events[0].Kind != subjects.EventEnqueued {
		t.Errorf("history of the last message: %+v, want its enqueued event", h.Events)
	}
	fails(e, subjects.CodeMessageNotFound, subjects.OpHistory, "q", subjects.HistoryRequest{ID: "0"}) // its events are gone
}

// TestHistoryErrors covers history's bad requests and a broker without events.
func TestHistoryErrors(t *testing.T) {
	e := setup(t)
	e.create("q", subjects.CreateQueueRequest{})
	fails(e, subjects.CodeMessageNotFound, subjects.OpHistory, "q", subjects.HistoryRequest{ID: "nope"})
	fails(e, subjects.CodeInvalidID, subjects.OpHistory, "q", subjects.HistoryRequest{})
	fails(e, subjects.CodeOutOfRange, subjects.OpHistory, "q", subjects.HistoryRequest{ID: "x", Limit: subjects.MaxHistoryLimit + 1})
	fails(e, subjects.CodeBadRequest, subjects.OpHistory, "q", `{"id":"x","bogus":1}`)

	// A limit below the number of events truncates, oldest first.
	e.enqueue("q", subjects.EnqueueRequest{ID: "m", Payload: "x"})
	m := e.dequeueOne("q")
	must[subjects.Message](e, subjects.OpComplete, "q", subjects.LeaseRequest{ID: "m", LeaseID: m.LeaseID})
	h := must[subjects.HistoryReply](e, subjects.OpHistory, "q", subjects.HistoryRequest{ID: "m", Limit: 2})
	if len(h.Events) != 2 || !h.Truncated || h.Events[1].Kind != subjects.EventLeased {
		t.Fatalf("limit 2: %d events, truncated %v; want enqueued and leased, truncated", len(h.Events), h.Truncated)
	}

	off := setup(t, func(c *broker.Config) { c.DisableEvents = true })
	off.create("q", subjects.CreateQueueRequest{})
	off.enqueue("q", subjects.EnqueueRequest{ID: "m", Payload: "x"})
	fails(off, subjects.CodeUnavailable, subjects.OpHistory, "q", subjects.HistoryRequest{ID: "m"})
	for _, s := range off.eventStreams() {
		t.Errorf("events disabled, but stream %s exists", s)
	}
}

func (e *env) eventStreams() []string {
	e.t.Helper()
	ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
	defer cancel()
	js := e.jetStream()
	var out []string
	names := js.StreamNames(ctx)
	for n := range names.Name() {
		if strings.HasSuffix(n, "-events") {
			out = append(out, n)
		}
	}
	if err := names.Err(); err != nil {
		e.t.Fatal(err)
	}
	return out
}

// TestStats checks the current view: counts (whole and filtered), the oldest pending age, rates,
// totals and the leases about to expire, on a fake clock.
func TestStats(t *testing.T) {
	e := setup(t)
	e.create("q", subjects.CreateQueueRequest{LeaseMS: 10_000})
	for i := range 6 {
		e.enqueue("q", subjects.EnqueueRequest{ID: fmt.Sprint(i), Payload: "x", Priority: ptr(int64(i)), Metadata: map[string]string{"odd": fmt.Sprint(i % 2)}})
		e.advance(time.Second)
	}
	// Now 6 s after the first enqueue. Lease 0 and 1 (10 s and 20 s), complete 2.
	e.dequeueOne("q")
	e.dequeueWith("q", subjects.DequeueRequest{LeaseMS: 20_000})
	m := e.dequeueOne("q")
	must[subjects.Message](e, subjects.OpComplete, "q", subjects.LeaseRequest{ID: m.ID, LeaseID: m.LeaseID})

	s := must[subjects.StatsReply](e, subjects.OpStats, "q", subjects.StatsRequest{ExpiringWithinMS: 15_000})
	if want := (subjects.Counts{Pending: 3, Running: 2, Completed: 1}); s.Counts != want {
		t.Errorf("counts %+v, want %+v", s.Counts, want)
	}
	if s.OldestPendingMS != 3000 { // message 3 was enqueued at t0+3s
		t.Errorf("oldest pending %d ms, want 3000", s.OldestPendingMS)
	}
	if want := (subjects.Totals{Enqueued: 6, Dequeued: 3, Completed: 1}); s.Totals != want {
		t.Errorf("totals %+v, want %+v", s.Totals, want)
	}
	// 6 enqueues, 3 dequeues, 1 completion in the 6 s since the queue was created.
	if s.Rates.Enqueued != 1 || s.Rates.Dequeued != 0.5 || s.Rates.Completed != 1.0/6 {
		t.Errorf("rates %+v, want 1, 0.5 and 1/6 per second", s.Rates)
	}
	if len(s.Expiring) != 1 || s.Expiring[0].ID != "0" || s.Expiring[0].ExpiresInMS != 10_000 {
		t.Errorf("expiring within 15 s: %+v, want message 0 in 10 s", s.Expiring)
	}
	// Within 20 s both leases end, the soonest first; a limit of 1 keeps the soonest.
	s = must[subjects.StatsReply](e, subjects.OpStats, "q", subjects.StatsRequest{ExpiringWithinMS: 20_000})
	if len(s.Expiring) != 2 || s.Expiring[0].ID != "0" || s.Expiring[1].ID != "1" {
		t.Errorf("expiring within 20 s: %+v, want messages 0 then 1", s.Expiring)
	}
	s = must[subjects.StatsReply](e, subjects.OpStats, "q", subjects.StatsRequest{ExpiringWithinMS: 20_000, ExpiringLimit: 1})
	if len(s.Expiring) != 1 || s.Expiring[0].ID != "0" {
		t.Errorf("expiring within 20 s, limit 1: %+v, want message 0 alone", s.Expiring)
	}
	s = must[subjects.StatsReply](e, subjects.OpStats, "q", subjects.StatsRequest{Filter: map[string]string{"odd": "1"}})
	if want := (subjects.Counts{Pending: 2, Running: 1}); s.Counts != want || s.OldestPendingMS != 3000 {
		t.Errorf("odd: counts %+v oldest %d, want %+v and 3000", s.Counts, s.OldestPendingMS, want)
	}
	e.advance(10 * time.Second) // lease 0 expires: pending again since now
	s = must[subjects.StatsReply](e, subjects.OpStats, "q", nil)
	if s.Totals.Expired != 1 || s.Counts.Pending != 4 || s.OldestPendingMS != 13_000 {
		t.Errorf("after expiry: totals %+v counts %+v oldest %d; want 1 expired, 4 pending, oldest 13 s", s.Totals, s.Counts, s.OldestPendingMS)
	}
	e.advance(2 * time.Minute)
	if s = must[subjects.StatsReply](e, subjects.OpStats, "q", nil); s.Rates != (subjects.Rates{}) {
		t.Errorf("rates two minutes later %+v, want zero", s.Rates)
	}

	fails(e, subjects.CodeOutOfRange, subjects.OpStats, "q", subjects.StatsRequest{ExpiringLimit: subjects.MaxExpiringLimit + 1})
	fails(e, subjects.CodeOutOfRange, subjects.OpStats, "q", subjects.StatsRequest{ExpiringWithinMS: -1})
	fails(e, subjects.CodeInvalidMetadata, subjects.OpStats, "q", subjects.StatsRequest{Filter: map[string]string{"": "x"}})
	fails(e, subjects.CodeQueueNotFound, subjects.OpStats, "nope", nil)
}

// TestBrowse lists each state in its order, with filters and limits, and writes nothing.
func TestBrowse(t *testing.T) {
	e := setup(t)
	e.create("q", subjects.CreateQueueRequest{})
	for i := range 5 {
		e.enqueue("q", subjects.EnqueueRequest{ID: fmt.Sprint(i), Payload: "x", Priority: ptr(int64(10 - i)), Metadata: map[string]string{"odd": fmt.Sprint(i % 2)}})
	}
	e.enqueue("q", subjects.EnqueueRequest{ID: "late", Payload: "x", InvisibleMS: ptr[int64](60_000)})
	e.enqueue("q", subjects.EnqueueRequest{ID: "later", Payload: "x", InvisibleMS: ptr[int64](30_000)})
	m := e.dequeueOne("q") // "4": the earliest deadline
	browse := func(r subjects.BrowseRequest) (ids []string, more bool) {
		rep := must[subjects.BrowseReply](e, subjects.OpBrowse, "q", r)
		for _, m := range rep.Messages {
			if m.Payload != nil || m.PayloadBase64 != nil {
				t.Errorf("browse returned the payload of %s", m.ID)
			}
			ids = append(ids, m.ID)
		}
		return ids, rep.More
	}
	before := e.snap()
	for _, tc := range []struct {
		r    subjects.BrowseRequest
		want []string
		more bool
	}{
		{subjects.BrowseRequest{State: subjects.StatePending}, []string{"3", "2", "1", "0"}, false},
		{subjects.BrowseRequest{State: subjects.StatePending, Limit: 2}, []string{"3", "2"}, true},
		{subjects.BrowseRequest{State: subjects.StatePending, Filter: map[string]string{"odd": "0"}}, []string{"2", "0"}, false},
		{subjects.BrowseRequest{State: subjects.StateInvisible}, []string{"later", "late"}, false},
		{subjects.BrowseRequest{State: subjects.StateRunning}, []string{m.ID}, false},
		{subjects.BrowseRequest{State: subjects.StateCompleted}, nil, false},
	} {
		got, more := browse(tc.r)
		if !slices.Equal(got, tc.want) || more != tc.more {
			t.Errorf("browse %+v: %v more=%v, want %v more=%v", tc.r, got, more, tc.want, tc.more)
		}
	}
	e.unchanged(before)
	fails(e, subjects.CodeBadRequest, subjects.OpBrowse, "q", subjects.BrowseRequest{State: "sleeping"})
	fails(e, subjects.CodeBadRequest, subjects.OpBrowse, "q", nil)
	fails(e, subjects.CodeOutOfRange, subjects.OpBrowse, "q", subjects.BrowseRequest{State: subjects.StatePending, Limit: subjects.MaxBrowseLimit + 1})
	fails(e, subjects.CodeQueueNotFound, subjects.OpBrowse, "nope", subjects.BrowseRequest{State: subjects.StatePending})
}

// TestDequeueWorkerValidated: a worker name that is too long or not printable is refused.
func TestDequeueWorkerValidated(t *testing.T) {
	e := setup(t)
	e.create("q", subjects.CreateQueueRequest{})
	e.enqueue("q", subjects.EnqueueRequest{ID: "m", Payload: "x"})
	before := e.snap()
	fails(e, subjects.CodeBadRequest, subjects.OpDequeue, "q", subjects.DequeueRequest{Worker: strings.Repeat("w", subjects.MaxWorkerLen+1)})
	fails(e, subjects.CodeBadRequest, subjects.OpDequeue, "q", subjects.DequeueRequest{Worker: "a\x00b"})
	e.unchanged(before)
}

// TestReleaseErrorInHistory: a release's error, why its attempt failed, is in its event: the
// released one, and the errored one when no attempt is left. A retried release keeps the first's, a
// complete carries none, and an error over MaxErrorLen is refused and writes nothing.
func TestReleaseErrorInHistory(t *testing.T) {
	e := setup(t)
	e.create("q", subjects.CreateQueueRequest{MaxAttempts: 2})
	e.enqueue("q", subjects.EnqueueRequest{ID: "m", Payload: "x"})
	m := e.dequeueOne("q")
	before := e.snap()
	fails(e, subjects.CodeBadRequest, subjects.OpRelease, "q", subjects.ReleaseRequest{ID: "m", LeaseID: m.LeaseID, Error: strings.Repeat("e", subjects.MaxErrorLen+1)})
	e.unchanged(before)

	first := "upstream said 429\n\tat fetch()"
	must[subjects.Message](e, subjects.OpRelease, "q", subjects.ReleaseRequest{ID: "m", LeaseID: m.LeaseID, Error: first})
	must[subjects.Message](e, subjects.OpRelease, "q", subjects.ReleaseRequest{ID: "m", LeaseID: m.LeaseID, Error: "the retry's"})
	m = e.dequeueOne("q")
	last := strings.Repeat("é", subjects.MaxErrorLen/2) // at the limit
	must[subjects.Message](e, subjects.OpRelease, "q", subjects.ReleaseRequest{ID: "m", LeaseID: m.LeaseID, Error: last})

	h := e.history("q", "m")
	checkHistory(t, h, []step{
		{subjects.EventEnqueued, subjects.StatePending, ""},
		{subjects.EventLeased, subjects.StateRunning, ""},
		{subjects.EventReleased, subjects.StatePending, ""},
		{subjects.EventLeased, subjects.StateRunning, ""},
		{subjects.EventErrored, subjects.StateErrored, subjects.ReasonReleased},
	})
	for i, want := range []string{"", "", first, "", last} {
		if got := h.Events[i].Error; got != want {
			t.Errorf("event %d (%s): error %q, want %q", i, h.Events[i].Kind, got, want)
		}
	}

	// A completed message's events carry no error.
	e.enqueue("q", subjects.EnqueueRequest{ID: "c", Payload: "x"})
	m = e.dequeueOne("q")
	must[subjects.Message](e, subjects.OpComplete, "q", subjects.LeaseRequest{ID: "c", LeaseID: m.LeaseID})
	for _, ev := range e.history("q", "c").Events {
		if ev.Error != "" {
			t.Errorf("%s event of c: error %q, want none", ev.Kind, ev.Error)
		}
	}
}

// TestCancelErrorInHistory: a cancel's error says why in its canceled event, a holder's and an
// operator's alike (at a version too); one too long is refused and writes nothing, as is an error
// on a complete; a cancel again keeps the first event.
func TestCancelErrorInHistory(t *testing.T) {
	e := setup(t)
	e.enqueueInOrder("q", "held", "waiting", "versioned")
	m := e.dequeueOne("q")
	before := e.snap()
	fails(e, subjects.CodeBadRequest, subjects.OpCancel, "q", subjects.LeaseRequest{ID: "held", LeaseID: m.LeaseID, Error: strings.Repeat("e", subjects.MaxErrorLen+1)})
	fails(e, subjects.CodeBadRequest, subjects.OpComplete, "q", subjects.LeaseRequest{ID: "held", LeaseID: m.LeaseID, Error: "done"})
	e.unchanged(before)

	// At the limit: accepted (a cancel of a message of its own, "limit").
	e.enqueue("q", subjects.EnqueueRequest{ID: "limit"})
	atLimit := strings.Repeat("é", subjects.MaxErrorLen/2)
	must[subjects.Message](e, subjects.OpCancel, "q", subjects.LeaseRequest{ID: "limit", Error: atLimit})

	const why = "malformed payload:\n\tline 3"
	must[subjects.Message](e, subjects.OpCancel, "q", subjects.LeaseRequest{ID: "held", LeaseID: m.LeaseID, Error: why})
	must[subjects.Message](e, subjects.OpCancel, "q", subjects.LeaseRequest{ID: "held", LeaseID: m.LeaseID, Error: "again"})
	must[subjects.Message](e, subjects.OpCancel, "q", subjects.LeaseRequest{ID: "waiting", Error: "the operator's"})
	v := e.get("q", "versioned").Version
	must[subjects.Message](e, subjects.OpCancel, "q", subjects.LeaseRequest{ID: "versioned", Version: v, Error: "at its version"})
	for id, want := range map[string]string{"held": why, "waiting": "the operator's", "versioned": "at its version", "limit": atLimit} {
		h := e.history("q", id)
		last := h.Events[len(h.Events)-1]
		if last.Kind != subjects.EventCanceled || last.Error != want {
			t.Errorf("%s's last event: %s with error %q, want canceled with %q", id, last.Kind, last.Error, want)
		}
		if n := len(h.Events); id == "held" && n != 3 {
			t.Errorf("held has %d events, want enqueued, leased, canceled (the cancel again writes none)", n)
		}
	}
}

// TestEventsConfigErrors: New refuses an events bound it cannot honour.
func TestEventsConfigErrors(t *testing.T) {
	srv := natstest.Start(t, nil)
	for name, c := range map[string]broker.Config{
		"EventsMaxAge":   {EventsMaxAge: -time.Second},
		"EventsMaxBytes": {EventsMaxBytes: -2},
	} {
		c.Conn = srv.Connect(t)
		if _, err := broker.New(&c); err == nil || !strings.Contains(err.Error(), name) {
			t.Errorf("%s: New: %v, want an error naming it", name, err)
		}
	}
}

// TestHistoryOfAnIdEnqueuedAgain: an id enqueued again after its message was collected gets a new
// message, whose versions start at 1 again. Its history is the new message's alone: it once showed
// the first message's events in place of the new one's (same versions, same kinds).
func TestHistoryOfAnIdEnqueuedAgain(t *testing.T) {
	e := setup(t)
	e.create("q", subjects.CreateQueueRequest{RetentionMS: ptr[int64](1000)})
	e.enqueue("q", subjects.EnqueueRequest{ID: "a", Payload: "first"})
	m := e.dequeueOne("q")
	must[subjects.Message](e, subjects.OpComplete, "q", subjects.LeaseRequest{ID: "a", LeaseID: m.LeaseID})
	e.advance(time.Second) // collected

	e.advance(time.Second)
	e.enqueue("q", subjects.EnqueueRequest{ID: "a", Payload: "second"})
	m = e.dequeueOne("q")
	h := e.history("q", "a")
	checkHistory(t, h, []step{
		{subjects.EventEnqueued, subjects.StatePending, ""},
		{subjects.EventLeased, subjects.StateRunning, ""},
	})
	if h.Collected || h.Events[1].LeaseID != m.LeaseID || !h.Events[1].Current {
		t.Fatalf("history %+v: want the second message's lease %s, current, not collected", h, m.LeaseID)
	}
}

// TestHistoryOfAMessageInADeletedQueue: a delete publishes no event for the messages it removes, so
// the last event of a message in a deleted queue was shown current, its time in state growing for
// as long as the events were kept: a pending message that no longer exists.
func TestHistoryOfAMessageInADeletedQueue(t *testing.T) {
	e := setup(t)
	e.create("q", subjects.CreateQueueRequest{})
	e.enqueue("q", subjects.EnqueueRequest{ID: "k"})
	e.enqueue("q", subjects.EnqueueRequest{ID: "r"})
	e.dequeueOne("q")
	e.advance(time.Second)
	for _, id := range []string{"k", "r"} {
		if h := e.history("q", id); !h.Events[len(h.Events)-1].Current || h.Events[len(h.Events)-1].StateMS == 0 {
			t.Fatalf("%s before the delete: %+v, want its last event current, a second in its state", id, h)
		}
	}
	must[subjects.DeleteReply](e, subjects.OpDelete, "q", nil)
	e.advance(time.Minute)
	for _, id := range []string{"k", "r"} {
		h := e.history("q", id)
		last := h.Events[len(h.Events)-1]
		if last.Current || last.StateMS != 0 || h.StateMS[last.State] != 0 {
			t.Fatalf("%s after its queue was deleted: %+v, want no current event, its last state's time not known (0)", id, h)
		}
	}
	// A queue of the same name made again does not hold the message either.
	e.create("q", subjects.CreateQueueRequest{})
	if h := e.history("q", "k"); h.Events[len(h.Events)-1].Current {
		t.Fatalf("k in a queue made again: %+v, want no current event", h)
	}
}

// TestHistoryWithACopyAtItsLimit: an event stored twice (a batch of events published again, its
// acknowledgement lost) just past the limit is not one more event: the history is whole, its last
// event current, not truncated with that event's time cut to 0.
func TestHistoryWithACopyAtItsLimit(t *testing.T) {
	t.Parallel()
	e := setup(t)
	e.enqueue("q", subjects.EnqueueRequest{ID: "m"})
	e.dequeueOne("q")
	ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
	defer cancel()
	st, _ := e.eventsStream(ctx)
	subject := "natstone.events.q.leased." + base64.RawURLEncoding.EncodeToString([]byte("m"))
	leased, err := st.GetLastMsgForSubject(ctx, subject)
	if err != nil {
		t.Fatal(err)
	}
	e.storeRaw(subject, leased.Data)
	e.advance(time.Second)
	h := must[subjects.HistoryReply](e, subjects.OpHistory, "q", subjects.HistoryRequest{ID: "m", Limit: 2})
	if len(h.Events) != 2 || h.Truncated || !h.Events[1].Current || h.Events[1].StateMS != 1000 {
		t.Fatalf("history %+v: want enqueued and leased, not truncated, leased current for 1000 ms", h)
	}
	// With an event after the copy, the leased event's time runs to it.
	e.advance(time.Second)
	must[subjects.Message](e, subjects.OpComplete, "q", subjects.LeaseRequest{ID: "m", LeaseID: e.get("q", "m").LeaseID})
	h = must[subjects.HistoryReply](e, subjects.OpHistory, "q", subjects.HistoryRequest{ID: "m", Limit: 2})
	if len(h.Events) != 2 || !h.Truncated || h.Events[1].Current || h.Events[1].StateMS != 2000 {
		t.Fatalf("history %+v: want enqueued and leased, truncated, leased for 2000 ms until its completion", h)
	}
}

// TestHistoryOfAnIdEnqueuedManyTimes: the history of an id is its latest message's also when the
// earlier messages of the id left more events than the limit: it once read the oldest events and
// showed the first message in place of the latest.
func TestHistoryOfAnIdEnqueuedManyTimes(t *testing.T) {
	t.Parallel()
	e := setup(t)
	e.create("q", subjects.CreateQueueRequest{RetentionMS: ptr[int64](1000)})
	for range 3 { // four events each: enqueued, leased, completed, collected
		e.enqueue("q", subjects.EnqueueRequest{ID: "a"})
		m := e.dequeueOne("q")
		must[subjects.Message](e, subjects.OpComplete, "q", subjects.LeaseRequest{ID: "a", LeaseID: m.LeaseID})
		e.advance(time.Second) // collected
		e.advance(time.Second)
	}
	e.enqueue("q", subjects.EnqueueRequest{ID: "a", Priority: ptr[int64](42)})
	m := e.dequeueOne("q")
	h := must[subjects.HistoryReply](e, subjects.OpHistory, "q", subjects.HistoryRequest{ID: "a", Limit: 3})
	checkHistory(t, h, []step{
		{subjects.EventEnqueued, subjects.StatePending, ""},
		{subjects.EventLeased, subjects.StateRunning, ""},
	})
	if h.Truncated || h.Collected || h.Events[0].Priority != 42 || h.Events[1].LeaseID != m.LeaseID {
		t.Fatalf("history %+v: want the latest message's, priority 42, lease %s, not truncated", h, m.LeaseID)
	}
}

// TestBrowseReplyFitsMaxPayload: a browse whose messages' metadata would make the reply larger than
// the server's max_payload (1 MiB), which would drop it, returns those that fit, with more set.
func TestBrowseReplyFitsMaxPayload(t *testing.T) {
	t.Parallel()
	e := setup(t)
	md := map[string]string{}
	for i := range subjects.DefaultMaxMetadataPairs {
		md[fmt.Sprintf("%0*d", subjects.MaxMetadataKeyLen, i)] = strings.Repeat("v", subjects.MaxMetadataValueLen)
	}
	const n = 150 // about 1.4 MiB of metadata
	for i := range n {
		e.enqueue("q", subjects.EnqueueRequest{ID: fmt.Sprintf("m%03d", i), Metadata: md})
	}
	r := must[subjects.BrowseReply](e, subjects.OpBrowse, "q", subjects.BrowseRequest{State: subjects.StatePending, Limit: subjects.MaxBrowseLimit})
	if !r.More || len(r.Messages) < 2 || len(r.Messages) >= n {
		t.Fatalf("browse returned %d of %d, more %v: want as many as fit in 1 MiB, and more", len(r.Messages), n, r.More)
	}
	// Metadata of the characters that JSON's HTML escaping would make six bytes each: the reply
	// writes them as they are, as the broker counts them. At the default limit (50), 2.4 MiB with
	// the escaping.
	amps := map[string]string{}
	for i := range subjects.DefaultMaxMetadataPairs {
		amps[fmt.Sprint(i)] = strings.Repeat("&", subjects.MaxMetadataValueLen)
	}
	for i := range 60 {
		e.enqueue("amps", subjects.EnqueueRequest{ID: fmt.Sprintf("m%03d", i), Metadata: amps})
	}
	if r := must[subjects.BrowseReply](e, subjects.OpBrowse, "amps", subjects.BrowseRequest{State: subjects.StatePending}); len(r.Messages) != subjects.DefaultBrowseLimit {
		t.Fatalf("browse of metadata full of & returned %d, want %d", len(r.Messages), subjects.DefaultBrowseLimit)
	}
}

// TestTruncatedHistoryTimesItsLastEvent: a history cut short by its limit gives its last event the
// time until the first event left out, not 0, as it gives every other event.
func TestTruncatedHistoryTimesItsLastEvent(t *testing.T) {
	t.Parallel()
	e := setup(t)
	e.enqueue("q", subjects.EnqueueRequest{ID: "m"})
	e.advance(3 * time.Second)
	m := e.dequeueOne("q")
	e.advance(2 * time.Second)
	must[subjects.Message](e, subjects.OpComplete, "q", subjects.LeaseRequest{ID: "m", LeaseID: m.LeaseID})
	for _, c := range []struct {
		limit int
		last  subjects.EventKind
		ms    int64
		state subjects.State
	}{{1, subjects.EventEnqueued, 3000, subjects.StatePending}, {2, subjects.EventLeased, 2000, subjects.StateRunning}} {
		h := must[subjects.HistoryReply](e, subjects.OpHistory, "q", subjects.HistoryRequest{ID: "m", Limit: c.limit})
		if len(h.Events) != c.limit || !h.Truncated {
			t.Fatalf("limit %d: %d events, truncated %v", c.limit, len(h.Events), h.Truncated)
		}
		last := h.Events[c.limit-1]
		if last.Kind != c.last || last.StateMS != c.ms || last.Current || h.StateMS[c.state] != c.ms {
			t.Errorf("limit %d: last event %s, state_ms %d (current %v), %s in all %d; want %s, %d",
				c.limit, last.Kind, last.StateMS, last.Current, c.state, h.StateMS[c.state], c.last, c.ms)
		}
	}
}

// TestHistoryReplyFitsMaxPayload: a history whose events would make the reply larger than the
// server's max_payload (1 MiB), which would drop it, returns the oldest that fit, truncated.
func TestHistoryReplyFitsMaxPayload(t *testing.T) {
	t.Parallel()
	e := setup(t)
	e.enqueue("q", subjects.EnqueueRequest{ID: "m"})
	m := e.dequeueOne("q")
	const extends = 4000 // an event of over 300 bytes each
	for range extends {
		must[subjects.Message](e, subjects.OpExtend, "q", subjects.ExtendRequest{ID: "m", LeaseID: m.LeaseID})
	}
	h := must[subjects.HistoryReply](e, subjects.OpHistory, "q", subjects.HistoryRequest{ID: "m", Limit: subjects.MaxHistoryLimit})
	if !h.Truncated || len(h.Events) < 2 || len(h.Events) >= extends+2 || h.Events[0].Kind != subjects.EventEnqueued {
		t.Fatalf("history: %d of %d events, truncated %v: want the oldest that fit in 1 MiB, truncated", len(h.Events), extends+2, h.Truncated)
	}
}

// TestBrowsePages: a browse's next, given back as after, lists the page after it, until no more
// match: the pages together are the whole listing, in its order, for the pending index (ties of
// priority) and for a deadline heap (ties of end time), with a filter too.
func TestBrowsePages(t *testing.T) {
	e := setup(t)
	e.create("q", subjects.CreateQueueRequest{})
	for i := range 9 {
		e.enqueue("q", subjects.EnqueueRequest{ID: fmt.Sprint("m", i), Priority: ptr(int64(i / 3)), Metadata: map[string]string{"odd": fmt.Sprint(i % 2)}})
	}
	pages := func(state subjects.State, filter map[string]string, limit int) (all, paged []string) {
		t.Helper()
		whole := must[subjects.BrowseReply](e, subjects.OpBrowse, "q", subjects.BrowseRequest{State: state, Filter: filter, Limit: 1000})
		for _, m := range whole.Messages {
			all = append(all, m.ID)
		}
		after := ""
		for range 20 {
			r := must[subjects.BrowseReply](e, subjects.OpBrowse, "q", subjects.BrowseRequest{State: state, Filter: filter, Limit: limit, After: after})
			for _, m := range r.Messages {
				paged = append(paged, m.ID)
			}
			if r.More != (r.Next != "") {
				t.Fatalf("%s page after %q: more %v, next %q", state, after, r.More, r.Next)
			}
			if after = r.Next; after == "" {
				return all, paged
			}
		}
		t.Fatalf("%s: more than 20 pages", state)
		return nil, nil
	}
	check := func(state subjects.State, filter map[string]string, limit, want int) {
		t.Helper()
		all, paged := pages(state, filter, limit)
		if len(all) != want || !slices.Equal(all, paged) {
			t.Errorf("%s %v by %d: pages %v, the whole listing %v (want %d)", state, filter, limit, paged, all, want)
		}
	}
	check(subjects.StatePending, nil, 2, 9)
	check(subjects.StatePending, map[string]string{"odd": "1"}, 1, 4)
	// Completed in two batches at two times: ties of end time, broken by enqueue order.
	for i := range 9 {
		if i == 5 {
			e.advance(time.Millisecond)
		}
		m := e.dequeueOne("q")
		must[subjects.Message](e, subjects.OpComplete, "q", subjects.LeaseRequest{ID: m.ID, LeaseID: m.LeaseID})
	}
	check(subjects.StateCompleted, nil, 2, 9)
	check(subjects.StateCompleted, map[string]string{"odd": "0"}, 2, 5)
	check(subjects.StatePending, nil, 3, 0)

	fails(e, subjects.CodeBadRequest, subjects.OpBrowse, "q", subjects.BrowseRequest{State: subjects.StatePending, After: "soon"})
	fails(e, subjects.CodeBadRequest, subjects.OpBrowse, "q", subjects.BrowseRequest{State: subjects.StatePending, After: "1:-2"})
	for _, after := range []string{"01:1", "+1:1", "1:01", "1:+1", " 1:1"} { // not as a next is written
		fails(e, subjects.CodeBadRequest, subjects.OpBrowse, "q", subjects.BrowseRequest{State: subjects.StatePending, After: after})
	}
	// An empty cursor is none, as documented: the first page.
	first := must[subjects.BrowseReply](e, subjects.OpBrowse, "q", subjects.BrowseRequest{State: subjects.StateCompleted, Limit: 2})
	empty := must[subjects.BrowseReply](e, subjects.OpBrowse, "q", `{"state":"completed","limit":2,"after":""}`)
	if len(first.Messages) != 2 || !reflect.DeepEqual(empty, first) {
		t.Fatalf(`browse with "after":"" = %+v, want the first page %+v`, empty, first)
	}
}
