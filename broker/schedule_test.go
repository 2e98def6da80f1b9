package broker_test

import (
	"encoding/json"
	"fmt"
	"reflect"
	"slices"
	"strings"
	"testing"
	"time"

	"github.com/natstone/natstone/broker"
	"github.com/natstone/natstone/kv"
	"github.com/natstone/natstone/subjects"
)

// fireAt is the id a schedule's fire at t enqueues.
func fireAt(name string, t time.Time) string { return name + "@" + t.UTC().Format(time.RFC3339) }

// schedules returns queue's schedules by name.
func (e *env) schedules(queue string) map[string]subjects.ScheduleInfo {
	e.t.Helper()
	out := make(map[string]subjects.ScheduleInfo)
	for _, s := range must[subjects.SchedulesReply](e, subjects.OpSchedules, queue, nil).Schedules {
		out[s.Name] = s
	}
	return out
}

// pendingIDs returns the ids of queue's pending messages, in their order.
func (e *env) pendingIDs(queue string) []string {
	e.t.Helper()
	var out []string
	for _, m := range must[subjects.BrowseReply](e, subjects.OpBrowse, queue, subjects.BrowseRequest{State: subjects.StatePending, Limit: subjects.MaxBrowseLimit}).Messages {
		out = append(out, m.ID)
	}
	return out
}

// TestScheduleFires: a schedule enqueues a message at each of its times, with the id of its fire
// time and the priority that time plus its deadline; the same schedule sent again writes nothing,
// and an unschedule stops it.
func TestScheduleFires(t *testing.T) {
	e := setup(t)
	e.create("q", subjects.CreateQueueRequest{})
	req := subjects.ScheduleRequest{Name: "tick", Cron: "@every 1m", Payload: "p", Metadata: subjects.Pairs{"kind": "tick"}, DeadlineMS: 5000, MaxAttempts: ptr[int64](2)}
	info := must[subjects.ScheduleInfo](e, subjects.OpSchedule, "q", req)
	if !info.NextAt.Equal(t0.Add(time.Minute)) || info.Revision == 0 || info.PayloadBytes != 1 || info.LastAt != nil || info.Cron != "@every 1m" {
		t.Fatalf("schedule reply %+v, want next_at %v, a revision, 1 payload byte, no fire yet", info, t0.Add(time.Minute))
	}
	before := e.snap()
	if again := must[subjects.ScheduleInfo](e, subjects.OpSchedule, "q", req); again.Revision != info.Revision {
		t.Fatalf("the same schedule sent again: revision %d, want %d (nothing written)", again.Revision, info.Revision)
	}
	same := req // lease_ms 0 is the queue's lease, as none is; the payload in base64 is the same payload
	same.LeaseMS, same.Payload, same.PayloadBase64 = ptr[int64](0), "", []byte("p")
	if again := must[subjects.ScheduleInfo](e, subjects.OpSchedule, "q", same); again.Revision != info.Revision || again.LeaseMS != nil {
		t.Fatalf("the same schedule with lease_ms 0 and payload_base64: %+v, want revision %d (nothing written)", again, info.Revision)
	}
	e.unchanged(before)

	e.advance(59 * time.Second)
	if got := e.pendingIDs("q"); len(got) != 0 {
		t.Fatalf("before its first time the schedule enqueued %v", got)
	}
	e.advance(time.Second)
	first := t0.Add(time.Minute)
	m := e.get("q", fireAt("tick", first))
	if m.State != subjects.StatePending || m.Priority != first.UnixMilli()+5000 || m.Payload == nil || *m.Payload != "p" || m.Metadata["kind"] != "tick" || m.AttemptsLeft != 2 {
		t.Fatalf("fired message %+v, want pending, priority %d, payload p, kind=tick, max_attempts 2", m, first.UnixMilli()+5000)
	}
	got := e.schedules("q")["tick"]
	if got.LastAt == nil || !got.LastAt.Equal(first) || got.LastID != m.ID || !got.NextAt.Equal(first.Add(time.Minute)) || got.Revision <= info.Revision || got.Skipped != 0 {
		t.Fatalf("after the first fire: %+v, want last %v (%s), next a minute later, a new revision", got, first, m.ID)
	}

	if snap := e.b.Snapshot().Schedules; len(snap) != 1 || snap[0].Queue != "q" || snap[0].LastID != m.ID || !snap[0].NextAt.Equal(got.NextAt) {
		t.Fatalf("the broker's snapshot (for metrics) has schedules %+v, want tick as schedules says", snap)
	}

	e.advance(3 * time.Minute) // three more times, each fired at its own
	want := []string{fireAt("tick", first)}
	for i := 1; i <= 3; i++ {
		want = append(want, fireAt("tick", first.Add(time.Duration(i)*time.Minute)))
	}
	if got := e.pendingIDs("q"); !slices.Equal(got, want) {
		t.Fatalf("pending %v, want %v", got, want)
	}

	if r := must[subjects.UnscheduleReply](e, subjects.OpUnschedule, "q", subjects.UnscheduleRequest{Name: "tick"}); !r.Removed {
		t.Fatalf("unschedule: %+v, want removed", r)
	}
	if r := must[subjects.UnscheduleReply](e, subjects.OpUnschedule, "q", subjects.UnscheduleRequest{Name: "tick"}); r.Removed {
		t.Fatalf("unschedule sent again: %+v, want removed false", r)
	}
	e.advance(5 * time.Minute)
	if got := e.pendingIDs("q"); !slices.Equal(got, want) {
		t.Fatalf("after unschedule: pending %v, want %v", got, want)
	}
	if got := e.schedules("q"); len(got) != 0 {
		t.Fatalf("schedules after unschedule: %v", got)
	}
}

// TestScheduleCron: five-field cron in UTC, or in the zone CRON_TZ names, and descriptors.
func TestScheduleCron(t *testing.T) {
	e := setup(t)
	e.create("q", subjects.CreateQueueRequest{})
	// t0 is 2023-11-14T22:13:20Z: 17:13:20 in New York (EST, UTC-5).
	for _, c := range []struct {
		cron string
		next time.Time
	}{
		{"*/5 * * * *", time.Date(2023, 11, 14, 22, 15, 0, 0, time.UTC)},
		{"0 9 * * 1-5", time.Date(2023, 11, 15, 9, 0, 0, 0, time.UTC)},
		{"CRON_TZ=America/New_York 0 9 * * *", time.Date(2023, 11, 15, 14, 0, 0, 0, time.UTC)},
		{"@hourly", time.Date(2023, 11, 14, 23, 0, 0, 0, time.UTC)},
		{"@every 90s", t0.Add(90 * time.Second)},
	} {
		name := fmt.Sprintf("s%d", len(e.schedules("q")))
		got := must[subjects.ScheduleInfo](e, subjects.OpSchedule, "q", subjects.ScheduleRequest{Name: name, Cron: c.cron})
		if !got.NextAt.Equal(c.next) {
			t.Errorf("cron %q: next_at %v, want %v", c.cron, got.NextAt, c.next)
		}
	}
	e.advance(2 * time.Minute) // s0 at 22:15, s4 at 22:14:50
	if got, want := e.pendingIDs("q"), []string{fireAt("s4", t0.Add(90*time.Second)), fireAt("s0", time.Date(2023, 11, 14, 22, 15, 0, 0, time.UTC))}; !slices.Equal(got, want) {
		t.Fatalf("pending %v, want %v", got, want)
	}
}

// TestScheduleBadRequests: each bad schedule request gets its typed error and writes nothing.
func TestScheduleBadRequests(t *testing.T) {
	e := setup(t)
	e.create("q", subjects.CreateQueueRequest{MaxPayloadBytes: 10})
	e.create("x", subjects.CreateQueueRequest{Type: subjects.Exclusive, ExclusivityKey: "project"})
	ok := subjects.ScheduleRequest{Name: "s", Cron: "@every 1m"}
	with := func(f func(r *subjects.ScheduleRequest)) subjects.ScheduleRequest {
		r := ok
		f(&r)
		return r
	}
	before := e.snap()
	for _, c := range []struct {
		code  subjects.Code
		queue string
		body  any
	}{
		{subjects.CodeInvalidSchedule, "q", with(func(r *subjects.ScheduleRequest) { r.Name = "" })},
		{subjects.CodeInvalidSchedule, "q", with(func(r *subjects.ScheduleRequest) { r.Name = "a.b" })},
		{subjects.CodeInvalidSchedule, "q", with(func(r *subjects.ScheduleRequest) { r.Name = strings.Repeat("n", subjects.MaxScheduleNameLen+1) })},
		{subjects.CodeInvalidSchedule, "q", with(func(r *subjects.ScheduleRequest) { r.Cron = "" })},
		{subjects.CodeInvalidSchedule, "q", with(func(r *subjects.ScheduleRequest) { r.Cron = "every minute" })},
		{subjects.CodeInvalidSchedule, "q", with(func(r *subjects.ScheduleRequest) { r.Cron = "* * * * * *" })},
		{subjects.CodeInvalidSchedule, "q", with(func(r *subjects.ScheduleRequest) { r.Cron = "@every 500ms" })},
		{subjects.CodeInvalidSchedule, "q", with(func(r *subjects.ScheduleRequest) { r.Cron = "@every 1.5s" })},
		{subjects.CodeInvalidSchedule, "q", with(func(r *subjects.ScheduleRequest) { r.Cron = "0 0 30 2 *" })},
		{subjects.CodeInvalidSchedule, "q", with(func(r *subjects.ScheduleRequest) { r.Cron = "CRON_TZ=Nowhere/Land 0 * * * *" })},
		{subjects.CodeInvalidSchedule, "q", with(func(r *subjects.ScheduleRequest) { r.Cron = "TZ=" })},
		{subjects.CodeInvalidSchedule, "q", with(func(r *subjects.ScheduleRequest) { r.Cron = "CRON_TZ=UTC" })},
		{subjects.CodeInvalidSchedule, "q", with(func(r *subjects.ScheduleRequest) { r.Cron = "CRON_TZ=UTC   " })},
		{subjects.CodeInvalidSchedule, "q", with(func(r *subjects.ScheduleRequest) { r.Cron = "CRON_TZ=Local @hourly" })},
		{subjects.CodeInvalidSchedule, "q", with(func(r *subjects.ScheduleRequest) { r.Cron = "CRON_TZ=Local @every 1m" })},
		{subjects.CodeInvalidSchedule, "q", with(func(r *subjects.ScheduleRequest) { r.Cron = " @hourly" })},
		{subjects.CodeInvalidSchedule, "q", with(func(r *subjects.ScheduleRequest) { r.Cron = "@every 1h " })},
		{subjects.CodeInvalidSchedule, "q", with(func(r *subjects.ScheduleRequest) { r.Cron = "0" + strings.Repeat(" ", 257-len("0* * * *")) + "* * * *" })},
		{subjects.CodeInvalidSchedule, "q", with(func(r *subjects.ScheduleRequest) { r.Overlap = "never" })},
		{subjects.CodeInvalidSchedule, "q", with(func(r *subjects.ScheduleRequest) { r.Overlap = "Skip" })},
		{subjects.CodeOutOfRange, "q", with(func(r *subjects.ScheduleRequest) { r.DeadlineMS = -1 })},
		{subjects.CodeOutOfRange, "q", with(func(r *subjects.ScheduleRequest) { r.DeadlineMS = subjects.MaxScheduleDeadline.Milliseconds() + 1 })},
		{subjects.CodeOutOfRange, "q", with(func(r *subjects.ScheduleRequest) { r.MaxAttempts = ptr[int64](0) })},
		{subjects.CodeOutOfRange, "q", with(func(r *subjects.ScheduleRequest) { r.LeaseMS = ptr[int64](1) })},
		{subjects.CodePayloadTooLarge, "q", with(func(r *subjects.ScheduleRequest) { r.Payload = "eleven byte" })},
		{subjects.CodeBadRequest, "q", with(func(r *subjects.ScheduleRequest) { r.Payload, r.PayloadBase64 = "a", []byte("b") })},
		{subjects.CodeInvalidMetadata, "q", with(func(r *subjects.ScheduleRequest) { r.Metadata = subjects.Pairs{"": "v"} })},
		{subjects.CodeMissingExclusivityKey, "x", ok},
		{subjects.CodeBadRequest, "q", map[string]any{"name": "s", "cron": "@hourly", "deadline": 5}},
		{subjects.CodeInvalidQueueName, "q-\x01", ok},
		{subjects.CodeInvalidSchedule, "q", subjects.UnscheduleRequest{Name: "a b"}},
		{subjects.CodeInvalidSchedule, "nope", subjects.UnscheduleRequest{Name: "a b"}},
	} {
		op := subjects.OpSchedule
		if _, ok := c.body.(subjects.UnscheduleRequest); ok {
			op = subjects.OpUnschedule
		}
		fails(e, c.code, op, c.queue, c.body)
	}
	fails(e, subjects.CodeInvalidSchedule, subjects.OpSchedules, "q", subjects.SchedulesRequest{After: "a.b"})
	fails(e, subjects.CodeQueueNotFound, subjects.OpSchedules, "nope", nil)
	// A schedule's message with a bad template would create its queue: nothing is created.
	fails(e, subjects.CodeInvalidMetadata, subjects.OpSchedule, "new", with(func(r *subjects.ScheduleRequest) { r.Metadata = subjects.Pairs{"": "v"} }))
	e.unchanged(before)

	// At the limits: accepted.
	for _, r := range []subjects.ScheduleRequest{
		with(func(r *subjects.ScheduleRequest) { r.Name = strings.Repeat("n", subjects.MaxScheduleNameLen) }),
		with(func(r *subjects.ScheduleRequest) { r.Name, r.Cron = "every-second", "@every 1s" }),
		with(func(r *subjects.ScheduleRequest) {
			r.Name, r.Cron = "long-cron", "0"+strings.Repeat(" ", 256-len("0* * * *"))+"* * * *"
		}),
		with(func(r *subjects.ScheduleRequest) {
			r.Name, r.DeadlineMS = "latest", subjects.MaxScheduleDeadline.Milliseconds()
		}),
		with(func(r *subjects.ScheduleRequest) { r.Name, r.Payload = "largest", "ten bytes!" }),
	} {
		must[subjects.ScheduleInfo](e, subjects.OpSchedule, "q", r)
	}
	// An empty after is none, as documented: the list from the first.
	if all, from := must[subjects.SchedulesReply](e, subjects.OpSchedules, "q", nil), must[subjects.SchedulesReply](e, subjects.OpSchedules, "q", `{"after":""}`); len(all.Schedules) != 5 || !reflect.DeepEqual(from, all) {
		t.Fatalf(`schedules with "after":"" = %+v, want %+v`, from, all)
	}
	for name := range e.schedules("q") {
		must[subjects.UnscheduleReply](e, subjects.OpUnschedule, "q", subjects.UnscheduleRequest{Name: name})
	}

	// At most MaxSchedules per queue.
	for i := range subjects.MaxSchedules {
		must[subjects.ScheduleInfo](e, subjects.OpSchedule, "q", with(func(r *subjects.ScheduleRequest) { r.Name = fmt.Sprintf("s%03d", i) }))
	}
	before = e.snap()
	fails(e, subjects.CodeOutOfRange, subjects.OpSchedule, "q", with(func(r *subjects.ScheduleRequest) { r.Name = "one-more" }))
	e.unchanged(before)
	// A replacement is not one more.
	must[subjects.ScheduleInfo](e, subjects.OpSchedule, "q", with(func(r *subjects.ScheduleRequest) { r.Name, r.Cron = "s000", "@hourly" }))
}

// TestScheduleNoAutoCreate: with auto-create off, a schedule of an unknown queue is queue_not_found.
func TestScheduleNoAutoCreate(t *testing.T) {
	e := setup(t, func(c *broker.Config) { c.DisableAutoCreate = true })
	before := e.snap()
	fails(e, subjects.CodeQueueNotFound, subjects.OpSchedule, "q", subjects.ScheduleRequest{Name: "s", Cron: "@hourly"})
	e.unchanged(before)
}

// TestUnscheduleOfAQueueNotThere: a queue that does not exist, or no longer does (its delete removed
// its schedules), has no schedule to remove: an unschedule of it succeeds with removed false, as for
// a queue without that schedule, so that a cleanup run again, or after the queue's delete, succeeds;
// it creates no queue and writes nothing. A bad name is refused all the same.
func TestUnscheduleOfAQueueNotThere(t *testing.T) {
	e := setup(t)
	e.create("gone", subjects.CreateQueueRequest{})
	must[subjects.ScheduleInfo](e, subjects.OpSchedule, "gone", subjects.ScheduleRequest{Name: "s", Cron: "@hourly"})
	must[subjects.DeleteReply](e, subjects.OpDelete, "gone", nil)
	before := e.snap()
	for _, queue := range []string{"ghost", "gone"} {
		r := must[subjects.UnscheduleReply](e, subjects.OpUnschedule, queue, subjects.UnscheduleRequest{Name: "s"})
		if r.Removed || r.Queue != queue || r.Name != "s" {
			t.Fatalf("unschedule of %s: %+v, want nothing removed", queue, r)
		}
	}
	fails(e, subjects.CodeInvalidSchedule, subjects.OpUnschedule, "ghost", subjects.UnscheduleRequest{Name: ""})
	e.unchanged(before)
	if qs := must[subjects.ListReply](e, subjects.OpList, "", nil).Queues; len(qs) != 0 {
		t.Fatalf("queues %+v, want none created", qs)
	}
}

// TestScheduleReplace: a schedule sent with another cron fires at the new times from then on; one
// sent with another payload keeps its times.
func TestScheduleReplace(t *testing.T) {
	e := setup(t)
	must[subjects.ScheduleInfo](e, subjects.OpSchedule, "q", subjects.ScheduleRequest{Name: "s", Cron: "@every 1m", Payload: "a"})
	e.advance(time.Minute)
	r := must[subjects.ScheduleInfo](e, subjects.OpSchedule, "q", subjects.ScheduleRequest{Name: "s", Cron: "@every 1m", Payload: "b"})
	if !r.NextAt.Equal(t0.Add(2*time.Minute)) || r.LastID != fireAt("s", t0.Add(time.Minute)) {
		t.Fatalf("new payload: %+v, want the same times (next %v) and the last fire kept", r, t0.Add(2*time.Minute))
	}
	e.advance(30 * time.Second)
	r = must[subjects.ScheduleInfo](e, subjects.OpSchedule, "q", subjects.ScheduleRequest{Name: "s", Cron: "@every 10m", Payload: "c"})
	if want := t0.Add(90*time.Second + 10*time.Minute); !r.NextAt.Equal(want) {
		t.Fatalf("new cron: next_at %v, want %v (from the change)", r.NextAt, want)
	}
	e.advance(11 * time.Minute)
	ids := e.pendingIDs("q")
	if !slices.Equal(ids, []string{fireAt("s", t0.Add(time.Minute)), fireAt("s", t0.Add(90*time.Second+10*time.Minute))}) {
		t.Fatalf("pending %v", ids)
	}
	if m := e.get("q", ids[1]); m.Payload == nil || *m.Payload != "c" {
		t.Fatalf("the fire after the change carried %+v, want payload c", m)
	}
}

// TestScheduleOverlapSkip: a schedule with overlap skip enqueues nothing while its last fire's
// message is pending or running, counting each such time in overlap_skipped (kept across a restart
// and a replace), and enqueues again once that message finished; with overlap allow it enqueues
// whatever its last message does.
func TestScheduleOverlapSkip(t *testing.T) {
	e := setup(t)
	req := subjects.ScheduleRequest{Name: "s", Cron: "@every 1m", Overlap: subjects.OverlapSkip}
	if info := must[subjects.ScheduleInfo](e, subjects.OpSchedule, "q", req); info.Overlap != subjects.OverlapSkip {
		t.Fatalf("schedule reply %+v, want overlap skip", info)
	}
	at := func(m int) time.Time { return t0.Add(time.Duration(m) * time.Minute) }
	check := func(when string, lastID string, overlapped int64, pending ...string) {
		t.Helper()
		s := e.schedules("q")["s"]
		if s.LastID != lastID || s.OverlapSkipped != overlapped || s.Skipped != 0 || s.LastError != "" {
			t.Fatalf("%s: %+v, want last_id %s, overlap_skipped %d, skipped 0", when, s, lastID, overlapped)
		}
		if got := e.pendingIDs("q"); !slices.Equal(got, pending) {
			t.Fatalf("%s: pending %v, want %v", when, got, pending)
		}
	}

	e.advance(time.Minute)
	m1 := fireAt("s", at(1))
	check("the first fire", m1, 0, m1)
	e.advance(time.Minute)
	check("a fire while the last message is pending", m1, 1, m1)
	leased := e.dequeue("q", subjects.DequeueRequest{LeaseMS: time.Hour.Milliseconds()})
	if len(leased) != 1 || leased[0].ID != m1 {
		t.Fatalf("dequeue: %+v, want %s", leased, m1)
	}
	e.advance(time.Minute)
	check("a fire while it is running", m1, 2)
	must[subjects.Message](e, subjects.OpComplete, "q", subjects.LeaseRequest{ID: m1, LeaseID: leased[0].LeaseID})
	e.advance(time.Minute)
	m4 := fireAt("s", at(4))
	check("the fire after it completed", m4, 2, m4)
	must[subjects.Message](e, subjects.OpCancel, "q", subjects.LeaseRequest{ID: m4})
	e.advance(time.Minute)
	m5 := fireAt("s", at(5))
	check("the fire after it was canceled", m5, 2, m5)
	e.advance(time.Minute)
	check("a fire while that one is pending", m5, 3, m5)

	e.restartBroker()
	check("after a restart", m5, 3, m5)
	e.advance(time.Minute)
	check("a fire after the restart", m5, 4, m5)

	// The same request with overlap allow spelled out is another schedule: written, the counts
	// and times kept; it fires whatever its last message does. Then "" is the same as allow.
	req.Overlap = subjects.OverlapAllow
	info := must[subjects.ScheduleInfo](e, subjects.OpSchedule, "q", req)
	if info.Overlap != subjects.OverlapAllow || info.OverlapSkipped != 4 || !info.NextAt.Equal(at(8)) {
		t.Fatalf("replaced with overlap allow: %+v, want overlap allow, overlap_skipped 4, next_at %v", info, at(8))
	}
	req.Overlap = ""
	if again := must[subjects.ScheduleInfo](e, subjects.OpSchedule, "q", req); again.Revision != info.Revision {
		t.Fatalf("overlap \"\" after allow: revision %d, want %d (nothing written)", again.Revision, info.Revision)
	}
	e.advance(time.Minute)
	check("a fire with overlap allow", fireAt("s", at(8)), 4, m5, fireAt("s", at(8)))
}

// TestScheduleOverlapFireEnqueuedAlready: a fire time whose message is in the queue already (a
// client enqueued its id first, or a broker that died before storing the fire) is that time's fire,
// even while enqueues are blocked, and with overlap skip even while the one before is pending: it is
// not counted as left out, nor as refused, and the next fire looks at its message.
func TestScheduleOverlapFireEnqueuedAlready(t *testing.T) {
	e := setup(t)
	must[subjects.ScheduleInfo](e, subjects.OpSchedule, "q", subjects.ScheduleRequest{Name: "s", Cron: "@every 1m", Overlap: subjects.OverlapSkip})
	at := func(m int) time.Time { return t0.Add(time.Duration(m) * time.Minute) }
	e.advance(time.Minute)
	e.enqueue("q", subjects.EnqueueRequest{ID: fireAt("s", at(2))})
	info := must[subjects.QueueInfo](e, subjects.OpUpdate, "q", subjects.UpdateQueueRequest{EnqueueBlocked: ptr(true)})
	e.advance(time.Minute)
	s := e.schedules("q")["s"]
	if s.LastID != fireAt("s", at(2)) || !s.LastAt.Equal(at(2)) || s.LastError != "" || s.OverlapSkipped != 0 {
		t.Fatalf("a fire enqueued already: %+v, want it the last fire, none left out or refused", s)
	}
	must[subjects.QueueInfo](e, subjects.OpUpdate, "q", subjects.UpdateQueueRequest{Revision: info.Revision, EnqueueBlocked: ptr(false)})
	e.advance(time.Minute)
	if s = e.schedules("q")["s"]; s.LastID != fireAt("s", at(2)) || s.OverlapSkipped != 1 {
		t.Fatalf("the next fire: %+v, want it left out while %s is pending", s, fireAt("s", at(2)))
	}
	if got := e.pendingIDs("q"); !slices.Equal(got, []string{fireAt("s", at(1)), fireAt("s", at(2))}) {
		t.Fatalf("pending %v, want the two fires' messages", got)
	}
}

// unstoredSecondFire leaves a schedule s of queue q, every interval with overlap skip, whose first
// fire's message completed and whose second fire's message is pending, but whose stored record is
// as before the second fire (a broker died between the two), with the broker stopped. It returns
// the two fire times.
func unstoredSecondFire(e *env, interval time.Duration) (first, second time.Time) {
	e.t.Helper()
	spec := subjects.ScheduleRequest{Name: "s", Cron: "@every " + interval.String(), Overlap: subjects.OverlapSkip}
	must[subjects.ScheduleInfo](e, subjects.OpSchedule, "q", spec)
	first, second = t0.Add(interval), t0.Add(2*interval)
	e.advance(interval)
	leased := e.dequeueOne("q")
	must[subjects.Message](e, subjects.OpComplete, "q", subjects.LeaseRequest{ID: leased.ID, LeaseID: leased.LeaseID})
	e.advance(interval)
	if got := e.pendingIDs("q"); !slices.Equal(got, []string{fireAt("s", second)}) {
		e.t.Fatalf("pending %v, want the second fire's message", got)
	}
	rec := kv.ScheduleRecord{Spec: spec, UpdatedAt: t0.UnixMilli(), From: first.UnixMilli(), LastAt: first.UnixMilli(), LastID: leased.ID}
	data, err := json.Marshal(&rec)
	if err != nil {
		e.t.Fatal(err)
	}
	e.storeRaw("$KV.natstone-schedules."+kv.ScheduleKey("q", "s"), data)
	e.stopBroker(e.b)
	return first, second
}

// TestScheduleOverlapAfterAnUnstoredFire: a broker that enqueued a fire and died before it stored
// so leaves a record whose last fire is the one before; with overlap skip, the broker that starts
// finds that message among the times it walks (also past a walk's length, after a long outage) and
// looks at it, not at the stored last one, so it does not enqueue while that message is pending.
// So does a replace with another cron before that broker's first fire.
func TestScheduleOverlapAfterAnUnstoredFire(t *testing.T) {
	t.Run("restart", func(t *testing.T) {
		e := setup(t)
		_, second := unstoredSecondFire(e, time.Minute)
		e.advance(2 * time.Minute) // nothing serves: the third and fourth fire times pass
		e.startBroker()
		e.advance(0)
		if got := e.pendingIDs("q"); !slices.Equal(got, []string{fireAt("s", second)}) {
			t.Fatalf("pending %v after the restart, want the second fire's message alone", got)
		}
		s := e.schedules("q")["s"]
		if s.LastID != fireAt("s", second) || !s.LastAt.Equal(second) || s.OverlapSkipped != 1 || s.Skipped != 1 || !s.NextAt.Equal(second.Add(3*time.Minute)) {
			t.Fatalf("after the restart: %+v, want last %s, the third time skipped, the fourth overlap-skipped", s, fireAt("s", second))
		}
	})
	t.Run("long outage", func(t *testing.T) {
		e := setup(t)
		_, second := unstoredSecondFire(e, time.Second)
		outage := 13 * 24 * time.Hour // more fire times than a walk goes
		e.advance(outage)
		e.startBroker()
		e.advance(0)
		if got := e.pendingIDs("q"); !slices.Equal(got, []string{fireAt("s", second)}) {
			t.Fatalf("pending %v after the outage, want the second fire's message alone", got)
		}
		s := e.schedules("q")["s"]
		times := int64(outage/time.Second) + 1 // from the second fire time to the last, both in
		if s.LastID != fireAt("s", second) || s.OverlapSkipped != 1 || s.Skipped != times-2 {
			t.Fatalf("after the outage: %+v, want last %s, %d skipped and the last overlap-skipped", s, fireAt("s", second), times-2)
		}
	})
	t.Run("replace", func(t *testing.T) {
		e := setup(t)
		_, second := unstoredSecondFire(e, time.Minute)
		e.advance(10 * time.Second)
		e.startBroker() // its fire of the second time is due, not run before the clock moves
		r := must[subjects.ScheduleInfo](e, subjects.OpSchedule, "q", subjects.ScheduleRequest{Name: "s", Cron: "@every 2m", Overlap: subjects.OverlapSkip})
		if r.LastID != fireAt("s", second) || r.Skipped != 0 {
			t.Fatalf("replaced: %+v, want last %s, none skipped", r, fireAt("s", second))
		}
		e.advance(3 * time.Minute)
		if got := e.pendingIDs("q"); !slices.Equal(got, []string{fireAt("s", second)}) {
			t.Fatalf("pending %v after the replace, want the second fire's message alone", got)
		}
	})
}

// TestScheduleOverlapAfterARefusedFire: a fire the queue refuses keeps last_id, the message of the
// last fire that enqueued one, so that with overlap skip an operator's retry of that message holds
// the next fires back again.
func TestScheduleOverlapAfterARefusedFire(t *testing.T) {
	e := setup(t)
	info := e.create("q", subjects.CreateQueueRequest{})
	must[subjects.ScheduleInfo](e, subjects.OpSchedule, "q", subjects.ScheduleRequest{Name: "s", Cron: "@every 1m", Overlap: subjects.OverlapSkip})
	e.advance(time.Minute)
	m := fireAt("s", t0.Add(time.Minute))
	must[subjects.Message](e, subjects.OpCancel, "q", subjects.LeaseRequest{ID: m})
	info = must[subjects.QueueInfo](e, subjects.OpUpdate, "q", subjects.UpdateQueueRequest{Revision: info.Revision, EnqueueBlocked: ptr(true)})
	e.advance(time.Minute)
	s := e.schedules("q")["s"]
	if s.LastErrorCode != subjects.CodeQueueBlocked || s.LastID != m || !s.LastAt.Equal(t0.Add(2*time.Minute)) {
		t.Fatalf("a refused fire: %+v, want last_error queue_blocked at %v, last_id still %s", s, t0.Add(2*time.Minute), m)
	}
	must[subjects.Message](e, subjects.OpRetry, "q", subjects.RetryRequest{ID: m})
	must[subjects.QueueInfo](e, subjects.OpUpdate, "q", subjects.UpdateQueueRequest{Revision: info.Revision, EnqueueBlocked: ptr(false)})
	e.advance(time.Minute)
	if got := e.pendingIDs("q"); !slices.Equal(got, []string{m}) {
		t.Fatalf("pending %v after the retry, want %s alone: it holds the fire back", got, m)
	}
	if s = e.schedules("q")["s"]; s.OverlapSkipped != 1 || s.LastID != m || s.LastError != "" {
		t.Fatalf("the fire after the retry: %+v, want it left out, last_id %s", s, m)
	}
}

// TestScheduleRefusedFire: a fire the queue refuses (enqueue blocked) enqueues nothing and says why;
// the next fire, once the queue takes it, clears that.
func TestScheduleRefusedFire(t *testing.T) {
	e := setup(t)
	info := e.create("q", subjects.CreateQueueRequest{})
	must[subjects.ScheduleInfo](e, subjects.OpSchedule, "q", subjects.ScheduleRequest{Name: "s", Cron: "@every 1m"})
	info = must[subjects.QueueInfo](e, subjects.OpUpdate, "q", subjects.UpdateQueueRequest{Revision: info.Revision, EnqueueBlocked: ptr(true)})
	e.advance(time.Minute)
	s := e.schedules("q")["s"]
	if s.LastErrorCode != subjects.CodeQueueBlocked || !strings.Contains(s.LastError, "enqueue is blocked") || s.LastID != "" || s.LastAt == nil || len(e.pendingIDs("q")) != 0 {
		t.Fatalf("a refused fire: %+v, pending %v; want last_error queue_blocked and nothing enqueued", s, e.pendingIDs("q"))
	}
	must[subjects.QueueInfo](e, subjects.OpUpdate, "q", subjects.UpdateQueueRequest{Revision: info.Revision, EnqueueBlocked: ptr(false)})
	e.advance(time.Minute)
	s = e.schedules("q")["s"]
	if s.LastError != "" || s.LastErrorCode != "" || s.LastID != fireAt("s", t0.Add(2*time.Minute)) || len(e.pendingIDs("q")) != 1 {
		t.Fatalf("the next fire: %+v, pending %v; want it enqueued and last_error cleared", s, e.pendingIDs("q"))
	}
}

// TestScheduleAcrossRestarts: a broker that starts after fire times passed fires the last of them
// once and counts the others skipped; a fire enqueued whose record was not stored (a crash between
// the two) is fired again by the next broker as a duplicate, which enqueues nothing more, and the
// times walked past whose messages the queue holds are not counted skipped. For an "@every"
// schedule (whose missed times are counted, not walked) and a cron one.
func TestScheduleAcrossRestarts(t *testing.T) {
	at := func(m int) time.Time { return time.Date(2023, 11, 14, 22, m, 0, 0, time.UTC) } // t0 is 22:13:20
	for _, c := range []struct {
		cron        string
		first, last time.Time
	}{
		{"@every 1m", t0.Add(time.Minute), t0.Add(11 * time.Minute)},
		{"* * * * *", at(14), at(24)},
	} {
		t.Run(c.cron, func(t *testing.T) {
			cleanRestarts(t, func(t *testing.T, restart func(e *env)) {
				e := setup(t)
				must[subjects.ScheduleInfo](e, subjects.OpSchedule, "q", subjects.ScheduleRequest{Name: "s", Cron: c.cron, Payload: "p"})
				e.advance(time.Minute) // the first fire
				e.stopBroker(e.b)
				e.advance(10 * time.Minute) // nothing serves: 10 fire times pass
				restart(e)
				e.advance(0) // the starting broker's fire, due at once
				if got, want := e.pendingIDs("q"), []string{fireAt("s", c.first), fireAt("s", c.last)}; !slices.Equal(got, want) {
					t.Fatalf("pending %v, want %v: the last time missed fired once", got, want)
				}
				s := e.schedules("q")["s"]
				if s.Skipped != 9 || !s.LastAt.Equal(c.last) || !s.NextAt.Equal(c.last.Add(time.Minute)) {
					t.Fatalf("after the restart: %+v, want 9 skipped, last %v", s, c.last)
				}

				// Store the record as it was before every fire but the first: as if the broker
				// that fired the last had died before it stored it, and the one before it too.
				rec := kv.ScheduleRecord{Spec: subjects.ScheduleRequest{Name: "s", Cron: c.cron, PayloadBase64: []byte("p")},
					UpdatedAt: t0.UnixMilli(), From: t0.UnixMilli()}
				data, err := json.Marshal(&rec)
				if err != nil {
					t.Fatal(err)
				}
				e.storeRaw("$KV.natstone-schedules."+kv.ScheduleKey("q", "s"), data)
				before := e.get("q", fireAt("s", c.last))
				restart(e)
				e.advance(0)
				if got := e.pendingIDs("q"); len(got) != 2 {
					t.Fatalf("pending %v after the fires sent again, want the same two", got)
				}
				s = e.schedules("q")["s"]
				if !s.LastAt.Equal(c.last) || s.LastID != before.ID || !s.NextAt.Equal(c.last.Add(time.Minute)) || s.Skipped != 9 {
					t.Fatalf("after the fires sent again: %+v, want last %s, and 9 skipped: the first fire's message is there", s, before.ID)
				}
				if after := e.get("q", before.ID); after.Version != before.Version {
					t.Fatalf("the duplicate fire wrote the message: version %d, then %d", before.Version, after.Version)
				}
			})
		})
	}
}

// TestScheduleQueueDelete: deleting a queue removes its schedules, for good.
func TestScheduleQueueDelete(t *testing.T) {
	e := setup(t)
	must[subjects.ScheduleInfo](e, subjects.OpSchedule, "q", subjects.ScheduleRequest{Name: "s", Cron: "@every 1m"})
	must[subjects.DeleteReply](e, subjects.OpDelete, "q", nil)
	e.create("q", subjects.CreateQueueRequest{})
	e.advance(time.Minute)
	if got := e.pendingIDs("q"); len(got) != 0 {
		t.Fatalf("a deleted queue's schedule fired into its namesake: %v", got)
	}
	e.restartBroker()
	e.advance(time.Minute)
	if got, n := e.pendingIDs("q"), len(e.schedules("q")); len(got) != 0 || n != 0 {
		t.Fatalf("after a restart: pending %v, %d schedules; want none", got, n)
	}
}

// TestScheduleLongOutage: an "@every 1s" schedule whose broker was down for 30 days (2.6 million
// fire times, more than a walk goes) fires the last time once and counts every other one skipped.
func TestScheduleLongOutage(t *testing.T) {
	e := setup(t)
	must[subjects.ScheduleInfo](e, subjects.OpSchedule, "q", subjects.ScheduleRequest{Name: "s", Cron: "@every 1s"})
	e.advance(time.Second)
	e.stopBroker(e.b)
	e.advance(30 * 24 * time.Hour)
	e.startBroker()
	e.advance(0)
	last := t0.Add(time.Second + 30*24*time.Hour)
	if got, want := e.pendingIDs("q"), []string{fireAt("s", t0.Add(time.Second)), fireAt("s", last)}; !slices.Equal(got, want) {
		t.Fatalf("pending %v, want %v", got, want)
	}
	if s := e.schedules("q")["s"]; s.Skipped != 30*24*3600-1 || !s.LastAt.Equal(last) {
		t.Fatalf("after 30 days: %+v, want %d skipped, last %v", s, 30*24*3600-1, last)
	}
}
