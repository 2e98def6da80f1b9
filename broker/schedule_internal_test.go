package broker

import (
	"context"
	"fmt"
	"io"
	"log/slog"
	"strings"
	"sync/atomic"
	"testing"
	"time"

	"github.com/natstone/natstone/broker/clock"
	"github.com/natstone/natstone/kv"
	"github.com/natstone/natstone/subjects"
	"github.com/natstone/natstone/test/natstest"
)

// countingHandler counts the log records whose message contains sub.
type countingHandler struct {
	slog.Handler
	n   *atomic.Int64
	sub string
}

func (h countingHandler) Handle(_ context.Context, r slog.Record) error {
	if strings.Contains(r.Message, h.sub) {
		h.n.Add(1)
	}
	return nil
}

// eventually polls cond until it holds, failing the test after 10 s: for what storage does on its
// own (a write sent lands), which no clock of the test drives.
func eventually(t *testing.T, what string, cond func() bool) {
	t.Helper()
	for deadline := time.Now().Add(10 * time.Second); !cond(); {
		if time.Now().After(deadline) {
			t.Fatalf("waited 10s for %s", what)
		}
		<-time.After(10 * time.Millisecond)
	}
}

// scheduleBroker starts a broker on a fake clock (and its claim on a fake clock of its own, so
// that it is renewed only when a test says), counting its log records that contain sub.
func scheduleBroker(t *testing.T, now time.Time, sub string) (*Broker, *clock.Fake, *atomic.Int64) {
	t.Helper()
	clk, n := clock.NewFake(now), new(atomic.Int64)
	b := claimBroker(t, natstest.Start(t, nil), clock.NewFake(time.Unix(0, 0)), func(c *Config) {
		c.Clock = clk
		c.Logger = slog.New(countingHandler{Handler: slog.NewTextHandler(io.Discard, nil), n: n, sub: sub})
	})
	if err := b.Start(context.Background()); err != nil {
		t.Fatal(err)
	}
	return b, clk, n
}

// scheduled starts a broker on a fake clock with the schedule s of queue q, every minute from
// t0 (counting the log records that contain sub), and returns q.
func scheduled(t *testing.T, sub string) (*Broker, *clock.Fake, *atomic.Int64, *queue) {
	t.Helper()
	b, clk, n := scheduleBroker(t, t0, sub)
	if _, err := b.putSchedule(context.Background(), "q", subjects.ScheduleRequest{Name: "s", Cron: "@every 1m"}); err != nil {
		t.Fatal(err)
	}
	q, err := b.lookup(context.Background(), "q", false)
	if err != nil {
		t.Fatal(err)
	}
	return b, clk, n, q
}

// setUnavailable closes q as a delete does first (deleting: as the delete itself), so that an
// enqueue to it is unavailable; with neither, opens it again.
func setUnavailable(q *queue, closed, deleting bool) {
	q.mu.Lock()
	defer q.mu.Unlock()
	q.deleting = deleting
	if closed {
		q.close(subjects.Errorf(subjects.CodeUnavailable, "queue q is being deleted"))
	} else {
		q.closed = nil
	}
}

// t0 is the fake clock's start.
var t0 = time.UnixMilli(1_700_000_000_000)

// TestScheduleUnavailableFireRetries: a fire the queue answers unavailable (its delete has begun)
// is tried again a second later, not at once in a loop, and the fire time is enqueued once the
// queue takes it.
func TestScheduleUnavailableFireRetries(t *testing.T) {
	b, clk, tries, q := scheduled(t, "is tried again")
	first := b.sched.get("q", "s").next
	setUnavailable(q, true, false)
	clk.Advance(time.Minute) // it returns: before, the fire was tried again at once, forever
	if n := tries.Load(); n != 1 {
		t.Fatalf("tried %d times at the fire time, want 1", n)
	}
	clk.Advance(scheduleRetry)
	if n := tries.Load(); n != 2 {
		t.Fatalf("tried %d times a second later, want 2", n)
	}
	setUnavailable(q, false, false)
	clk.Advance(scheduleRetry)
	if !q.holds(fireID("s", first)) {
		t.Fatalf("the fire of %v was not enqueued once the queue took it", first)
	}
	if sc := b.sched.get("q", "s"); sc.rec.Skipped != 0 || !sc.next.Equal(first.Add(time.Minute)) {
		t.Fatalf("after the retried fire: %+v, want nothing skipped and the next minute", sc.info(clk.Now()))
	}
}

// TestScheduleFireWithoutTheClaim: a fire due while the claim does not hold (a pause past its
// renewal) writes nothing, not even a payload, and is tried again once the claim holds.
func TestScheduleFireWithoutTheClaim(t *testing.T) {
	b, clk, tries := scheduleBroker(t, t0, "is tried again")
	ctx := context.Background()
	if _, err := b.putSchedule(ctx, "q", subjects.ScheduleRequest{Name: "s", Cron: "@every 1m", Payload: "x"}); err != nil {
		t.Fatal(err)
	}
	seq, err := b.store.LastBodySeq(ctx)
	if err != nil {
		t.Fatal(err)
	}
	held := b.claim.until.Load()
	b.claim.until.Store(0)
	clk.Advance(time.Minute)
	if after, err := b.store.LastBodySeq(ctx); err != nil || after != seq {
		t.Fatalf("without the claim the fire stored a payload: last body %d, then %d (%v)", seq, after, err)
	}
	b.claim.until.Store(held)
	clk.Advance(scheduleRetry)
	q, _ := b.lookup(ctx, "q", false)
	if n := tries.Load(); n != 0 || !q.holds(fireID("s", t0.Add(time.Minute))) {
		t.Fatalf("once the claim holds: %d warnings, want the fire enqueued", n)
	}
}

// TestScheduleRemovedMeanwhile: an unschedule whose delete landed though the broker did not learn
// it (its reply timed out): the next fire's record write finds the schedule removed and does not
// store it again; the broker forgets it.
func TestScheduleRemovedMeanwhile(t *testing.T) {
	b, clk, _ := scheduleBroker(t, t0, "-")
	ctx := context.Background()
	info, err := b.putSchedule(ctx, "q", subjects.ScheduleRequest{Name: "s", Cron: "@every 1m"})
	if err != nil {
		t.Fatal(err)
	}
	if err := b.store.DeleteSchedule(ctx, "q", "s", info.Revision); err != nil {
		t.Fatal(err)
	}
	clk.Advance(time.Minute)
	if rev, err := b.store.ScheduleRevision(ctx, "q", "s"); err != nil || rev != 0 {
		t.Fatalf("after a fire, the removed schedule is stored again at revision %d (%v)", rev, err)
	}
	if b.sched.get("q", "s") != nil {
		t.Fatal("the broker still fires the removed schedule")
	}
	// A schedule request made after it creates it again.
	if _, err := b.putSchedule(ctx, "q", subjects.ScheduleRequest{Name: "s", Cron: "@every 1m"}); err != nil {
		t.Fatal(err)
	}
	if rev, err := b.store.ScheduleRevision(ctx, "q", "s"); err != nil || rev == 0 {
		t.Fatalf("schedule after the removal: revision %d, %v", rev, err)
	}
}

// TestUnscheduleUnloaded: a stored schedule that a start could not load (its record does not
// decode, or its cron no longer parses) is still removed by unschedule.
func TestUnscheduleUnloaded(t *testing.T) {
	b, _, _ := scheduleBroker(t, t0, "-")
	ctx := context.Background()
	if _, err := b.putSchedule(ctx, "q", subjects.ScheduleRequest{Name: "s", Cron: "@every 1m"}); err != nil {
		t.Fatal(err)
	}
	b.sched.drop(b.sched.get("q", "s")) // as a load leaves a record it cannot use
	q, _ := b.lookup(ctx, "q", false)
	r, err := b.unscheduleOf(ctx, q, subjects.UnscheduleRequest{Name: "s"})
	if rev, _ := b.store.ScheduleRevision(ctx, "q", "s"); err != nil || !r.Removed || rev != 0 {
		t.Fatalf("unschedule: %+v, %v; the record is at revision %d, want removed", r, err, rev)
	}
}

// TestUnscheduleOfAQueueDeletedMeanwhile: an unschedule that looked its queue up before the queue's
// delete removed it (with its schedules) has nothing to remove: removed false, as for a queue not
// there at all, not queue_not_found.
func TestUnscheduleOfAQueueDeletedMeanwhile(t *testing.T) {
	b, _, _ := scheduleBroker(t, t0, "-")
	ctx := context.Background()
	if _, err := b.putSchedule(ctx, "q", subjects.ScheduleRequest{Name: "s", Cron: "@every 1m"}); err != nil {
		t.Fatal(err)
	}
	q, _ := b.lookup(ctx, "q", false)
	if _, err := b.deleteQueue(ctx, q); err != nil {
		t.Fatal(err)
	}
	if r, err := b.unscheduleOf(ctx, q, subjects.UnscheduleRequest{Name: "s"}); err != nil || r.Removed {
		t.Fatalf("unschedule: %+v, %v; want nothing removed, no error", r, err)
	}
}

// TestScheduleNextAfterCreation: over a clock change that the cron library steps back across
// (Pacific/Chatham's 45 minutes), a new schedule's first fire is still after its creation.
func TestScheduleNextAfterCreation(t *testing.T) {
	b, clk, _ := scheduleBroker(t, time.Date(2023, 4, 1, 14, 0, 0, 0, time.UTC), "-")
	info, err := b.putSchedule(context.Background(), "q", subjects.ScheduleRequest{Name: "s", Cron: "CRON_TZ=Pacific/Chatham 0 3 * * *"})
	if err != nil {
		t.Fatal(err)
	}
	if !info.NextAt.After(clk.Now()) {
		t.Fatalf("created at %v, next_at %v", clk.Now(), info.NextAt)
	}
}

// TestScheduleRequestsWaitNoLongerThanTheirContext: a schedule or unschedule request behind a fire
// or a queue's delete that holds the schedules' lock through slow storage gives up with
// unavailable when its context ends, writing nothing.
func TestScheduleRequestsWaitNoLongerThanTheirContext(t *testing.T) {
	b, _, _ := scheduleBroker(t, t0, "-")
	ctx := context.Background()
	if _, err := b.putSchedule(ctx, "q", subjects.ScheduleRequest{Name: "s", Cron: "@hourly"}); err != nil {
		t.Fatal(err)
	}
	q, _ := b.lookup(ctx, "q", false)
	if err := b.sched.lock(ctx); err != nil {
		t.Fatal(err)
	}
	short, cancel := context.WithTimeout(ctx, 50*time.Millisecond)
	defer cancel()
	if _, err := b.putSchedule(short, "q", subjects.ScheduleRequest{Name: "t", Cron: "@hourly"}); subjects.CodeOf(err) != subjects.CodeUnavailable {
		t.Fatalf("schedule behind the lock: %v, want unavailable", err)
	}
	if _, err := b.unscheduleOf(short, q, subjects.UnscheduleRequest{Name: "s"}); subjects.CodeOf(err) != subjects.CodeUnavailable {
		t.Fatalf("unschedule behind the lock: %v, want unavailable", err)
	}
	b.sched.unlock()
	if rev, err := b.store.ScheduleRevision(ctx, "q", "t"); err != nil || rev != 0 || b.sched.get("q", "s") == nil {
		t.Fatalf("the requests that gave up wrote: t at revision %d (%v), s still there: %v", rev, err, b.sched.get("q", "s") != nil)
	}
}

// TestScheduleReplacedWhileAFireWaits: a schedule replaced with another cron while times of the
// old one wait for a retry (five of them passed) counts them skipped: they will not be fired.
func TestScheduleReplacedWhileAFireWaits(t *testing.T) {
	b, clk, _, q := scheduled(t, "-")
	ctx := context.Background()
	setUnavailable(q, true, false)
	clk.Advance(5 * time.Minute) // the fires wait for a retry
	setUnavailable(q, false, false)
	info, err := b.putSchedule(ctx, "q", subjects.ScheduleRequest{Name: "s", Cron: "@hourly"})
	if err != nil {
		t.Fatal(err)
	}
	if info.Skipped != 5 || !info.NextAt.After(clk.Now()) {
		t.Fatalf("replaced while a fire waited: %+v, want it counted skipped", info)
	}
	clk.Advance(scheduleRetry)
	q.mu.Lock()
	n := q.entries.len()
	q.mu.Unlock()
	if n != 0 {
		t.Fatal("the old cron's time was fired after the replacement")
	}
}

// TestScheduleSameRequestAfterALostUnschedule: an unschedule whose delete landed though its reply
// was lost, then the same schedule request sent again (the client keeps it after all): the request
// stores the schedule again, and the next fire keeps it.
func TestScheduleSameRequestAfterALostUnschedule(t *testing.T) {
	b, clk, _ := scheduleBroker(t, t0, "-")
	ctx := context.Background()
	req := subjects.ScheduleRequest{Name: "s", Cron: "@every 1m"}
	info, err := b.putSchedule(ctx, "q", req)
	if err != nil {
		t.Fatal(err)
	}
	if err := b.store.DeleteSchedule(ctx, "q", "s", info.Revision); err != nil { // the unschedule's delete
		t.Fatal(err)
	}
	if _, err := b.putSchedule(ctx, "q", req); err != nil {
		t.Fatal(err)
	}
	if rev, err := b.store.ScheduleRevision(ctx, "q", "s"); err != nil || rev == 0 {
		t.Fatalf("the schedule request succeeded, but the record is at revision %d (%v)", rev, err)
	}
	clk.Advance(time.Minute)
	if sc := b.sched.get("q", "s"); sc == nil || sc.rec.LastAt == 0 {
		t.Fatal("after a successful schedule request, the next fire forgot the schedule")
	}
}

// failWritesAfterSending makes the broker's next write fail as a write whose acknowledgement does
// not come in time does: its claim holds for a nanosecond more, so the write is sent and its wait
// ends at once (unless the acknowledgement is there first: the wait's select takes either). The
// claim holds again once the broker reads the outcome back (testWriteFailed), or once the returned
// restore is called.
func failWritesAfterSending(b *Broker) (restore func()) {
	held := b.claim.until.Load()
	b.claim.until.Store(int64(b.claim.clock.Now().Sub(b.claim.base)) + 1)
	restore = func() { b.claim.until.Store(held) }
	b.sched.testWriteFailed = restore
	return restore
}

// untilUnknown runs op under failWritesAfterSending until its write's outcome is unknown
// (unavailable), calling undo after each try whose acknowledgement won the race.
func untilUnknown(t *testing.T, b *Broker, what string, op func() error, undo func()) {
	t.Helper()
	for try := 0; try < 50; try++ {
		restore := failWritesAfterSending(b)
		err := op()
		restore()
		switch {
		case subjects.CodeOf(err) == subjects.CodeUnavailable:
			return
		case err != nil:
			t.Fatalf("%s: %v, want unavailable", what, err)
		}
		undo()
	}
	t.Fatalf("%s: acknowledged 50 times, never unavailable", what)
}

// TestScheduleOfUnknownOutcome: a schedule request whose write's outcome is unknown (its reply is
// unavailable) and that landed leaves the broker firing the schedule as stored, and an
// unschedule alike leaves it removed: memory and storage agree, and nothing fires after the
// unschedule.
func TestScheduleOfUnknownOutcome(t *testing.T) {
	b, clk, _ := scheduleBroker(t, t0, "-")
	ctx := context.Background()
	b.createQueue(ctx, "q", subjects.CreateQueueRequest{})
	name := "s"
	put := func() error {
		_, err := b.putSchedule(ctx, "q", subjects.ScheduleRequest{Name: name, Cron: "@every 1m"})
		return err
	}
	// Each try under a name of its own: one acknowledged is left as it is. (Undone by an
	// unschedule, its delete marker made the next try's create conflict, and the read that
	// resolves a conflict failed within the claim's nanosecond: unknown, and nothing sent to land.
	// One CI run waited so for the landing.)
	tries := 0
	untilUnknown(t, b, "schedule whose write's wait ended", func() error {
		tries++
		name = fmt.Sprintf("s%d", tries)
		return put()
	}, func() {})
	// The write was sent: it lands, a moment later under load (one CI run read storage first).
	eventually(t, "the write sent landing (else the test tests nothing)", func() bool {
		rev, err := b.store.ScheduleRevision(ctx, "q", name)
		return err == nil && rev != 0
	})
	if b.sched.get("q", name) == nil {
		t.Fatal("the schedule stored is not the broker's: it would fire only after a restart")
	}
	clk.Advance(time.Minute)
	q, _ := b.lookup(ctx, "q", false)
	if !q.holds(fireID(name, t0.Add(time.Minute))) {
		t.Fatal("the schedule stored did not fire")
	}
	if rev, err := b.store.ScheduleRevision(ctx, "q", name); err != nil || b.sched.get("q", name).rev != rev {
		t.Fatalf("after the fire the broker's revision is %d, storage's %d (%v)", b.sched.get("q", name).rev, rev, err)
	}

	untilUnknown(t, b, "unschedule whose write's wait ended", func() error {
		_, err := b.unscheduleOf(ctx, q, subjects.UnscheduleRequest{Name: name})
		return err
	}, func() {
		if err := put(); err != nil {
			t.Fatal(err)
		}
	})
	eventually(t, "the delete sent landing (else the test tests nothing)", func() bool {
		rev, err := b.store.ScheduleRevision(ctx, "q", name)
		return err == nil && rev == 0
	})
	clk.Advance(time.Minute)
	if b.sched.get("q", name) != nil {
		t.Fatal("the broker still fires a schedule whose removal landed")
	}
	if q.holds(fireID(name, t0.Add(2*time.Minute))) {
		t.Fatal("the schedule fired after its removal landed")
	}
}

// TestScheduleOfADeletingQueue: a queue whose delete began (and stopped part way: the queue stays
// closed until the delete is sent again) does not have its schedules tried every second: the
// broker forgets them, and storage keeps them for a restart.
func TestScheduleOfADeletingQueue(t *testing.T) {
	b, clk, tries, q := scheduled(t, "is tried again")
	setUnavailable(q, true, true)
	clk.Advance(time.Minute + 5*scheduleRetry)
	if n := tries.Load(); n != 0 || b.sched.get("q", "s") != nil {
		t.Fatalf("%d tries, schedule still there: %v; want it forgotten", n, b.sched.get("q", "s") != nil)
	}
}

// TestSchedulePauseOfUnknownOutcome: a pause whose write's outcome is unknown (its reply is
// unavailable) and that landed leaves the broker's schedule paused, as stored: it does not fire.
func TestSchedulePauseOfUnknownOutcome(t *testing.T) {
	b, clk, _, q := scheduled(t, "-")
	ctx := context.Background()
	setPaused := func(pause bool) error {
		_, err := b.setPaused(ctx, q, subjects.SchedulePauseRequest{Name: "s"}, pause)
		return err
	}
	untilUnknown(t, b, "pause whose write's wait ended", func() error { return setPaused(true) }, func() {
		if err := setPaused(false); err != nil {
			t.Fatal(err)
		}
	})
	if !b.sched.get("q", "s").rec.Paused {
		t.Fatal("the pause may land, but the broker's schedule is not paused")
	}
	clk.Advance(2 * time.Minute)
	if q.holds(fireID("s", t0.Add(time.Minute))) {
		t.Fatal("the schedule whose pause may land fired")
	}
	// The pause sent again, as its client does after unavailable, is written (over the first,
	// if it landed meanwhile): storage and the broker agree.
	if err := setPaused(true); err != nil {
		t.Fatal(err)
	}
	rec, rev := storedSchedule(t, b)
	if !rec.Paused || rev != b.sched.get("q", "s").rev {
		t.Fatalf("stored after the pause sent again: %+v at revision %d, the broker's revision %d; want paused, the same", rec, rev, b.sched.get("q", "s").rev)
	}
}

// storedSchedule reads schedule s of queue q as storage holds it.
func storedSchedule(t *testing.T, b *Broker) (kv.ScheduleRecord, uint64) {
	t.Helper()
	var rec kv.ScheduleRecord
	var rev uint64
	err := b.store.LoadSchedules(context.Background(), "q", func(_, _ string, r kv.ScheduleRecord, at uint64, _ error) error {
		rec, rev = r, at
		return nil
	})
	if err != nil {
		t.Fatal(err)
	}
	return rec, rev
}

// TestScheduleReplaceOfUnknownOutcome: a replace not sent (the claim not holding) changes
// nothing; one whose write's outcome is unknown, sent again as its client does after unavailable,
// is written again, whether or not the first write had landed: storage and the broker then hold
// the new schedule at the same revision.
func TestScheduleReplaceOfUnknownOutcome(t *testing.T) {
	b, _, _ := scheduleBroker(t, t0, "-")
	ctx := context.Background()
	b.createQueue(ctx, "q", subjects.CreateQueueRequest{})
	put := func(cron string) error {
		_, err := b.putSchedule(ctx, "q", subjects.ScheduleRequest{Name: "s", Cron: cron})
		return err
	}
	if err := put("@every 1m"); err != nil {
		t.Fatal(err)
	}
	held := b.claim.until.Load()
	b.claim.until.Store(0) // the claim does not hold: no write is sent
	if err := put("@every 2m"); subjects.CodeOf(err) != subjects.CodeUnavailable {
		t.Fatalf("a replace without the claim: %v, want unavailable", err)
	}
	b.claim.until.Store(held)
	if sc := b.sched.get("q", "s"); sc.rec.Spec.Cron != "@every 1m" || sc.unsure {
		t.Fatalf("after a replace not sent the broker has %q (unsure %v), want @every 1m as stored", sc.rec.Spec.Cron, sc.unsure)
	}

	minutes := 2
	cron := "@every 2m"
	untilUnknown(t, b, "replace whose write's wait ended", func() error { return put(cron) }, func() {
		minutes++ // a new replace for the next try: @every 3m, 4m…
		cron = fmt.Sprintf("@every %dm", minutes)
	})
	eventually(t, "the replace sent landing", func() bool {
		rec, _ := storedSchedule(t, b)
		return rec.Spec.Cron == cron
	})
	_, landed := storedSchedule(t, b)
	if err := put(cron); err != nil {
		t.Fatal(err)
	}
	rec, rev := storedSchedule(t, b)
	if rec.Spec.Cron != cron || rev == landed || rev != b.sched.get("q", "s").rev {
		t.Fatalf("stored after the replace sent again: cron %q at revision %d (the first landed at %d), the broker's revision %d; want %q written again", rec.Spec.Cron, rev, landed, b.sched.get("q", "s").rev, cron)
	}
}

// TestSchedulePauseNotSent: a pause not sent (the claim not holding) is unavailable and leaves
// the schedule as it was, firing.
func TestSchedulePauseNotSent(t *testing.T) {
	b, clk, _, q := scheduled(t, "-")
	ctx := context.Background()
	held := b.claim.until.Load()
	b.claim.until.Store(0)
	if _, err := b.setPaused(ctx, q, subjects.SchedulePauseRequest{Name: "s"}, true); subjects.CodeOf(err) != subjects.CodeUnavailable {
		t.Fatalf("a pause without the claim: %v, want unavailable", err)
	}
	b.claim.until.Store(held)
	clk.Advance(time.Minute)
	if !q.holds(fireID("s", t0.Add(time.Minute))) {
		t.Fatal("a schedule whose pause was not sent did not fire")
	}
}

// TestSchedulePausedUnscheduleOfUnknownOutcome: a schedule paused for longer than its interval
// (its next time past) whose unschedule's outcome is unknown, and which landed, is read a second
// after the unschedule, not at once (giving the delete that time to land), and then forgotten,
// not fired; a schedule request of its name before that makes a new schedule, not paused.
func TestSchedulePausedUnscheduleOfUnknownOutcome(t *testing.T) {
	for _, recreate := range []bool{false, true} {
		t.Run(fmt.Sprintf("recreate=%v", recreate), func(t *testing.T) {
			b, clk, _ := scheduleBroker(t, t0, "-")
			ctx := context.Background()
			b.createQueue(ctx, "q", subjects.CreateQueueRequest{})
			q, _ := b.lookup(ctx, "q", false)
			pausedLong := func() { // made, paused, and two of its times passed
				if _, err := b.putSchedule(ctx, "q", subjects.ScheduleRequest{Name: "s", Cron: "@every 1m"}); err != nil {
					t.Fatal(err)
				}
				if _, err := b.setPaused(ctx, q, subjects.SchedulePauseRequest{Name: "s", Note: "n"}, true); err != nil {
					t.Fatal(err)
				}
				clk.Advance(2 * time.Minute)
			}
			pausedLong()
			for try := 0; ; try++ {
				untilUnknown(t, b, "unschedule whose write's wait ended", func() error {
					_, err := b.unscheduleOf(ctx, q, subjects.UnscheduleRequest{Name: "s"})
					return err
				}, pausedLong)
				if sc := b.sched.get("q", "s"); sc != nil && sc.removing {
					break // in doubt: it had not landed when the broker read it back
				}
				if try == 50 {
					t.Fatal("50 unschedules of unknown outcome, each read back landed: the test tests nothing")
				}
				pausedLong()
			}
			eventually(t, "the unschedule sent landing", func() bool {
				_, rev := storedSchedule(t, b)
				return rev == 0
			})
			if recreate {
				if _, err := b.putSchedule(ctx, "q", subjects.ScheduleRequest{Name: "s", Cron: "@every 1m"}); err != nil {
					t.Fatal(err)
				}
				if sc := b.sched.get("q", "s"); sc.rec.Paused || sc.rec.Note != "" {
					t.Fatalf("made again after its unschedule landed: %+v, want a new schedule, not paused", sc.rec)
				}
				now := clk.Now()
				clk.Advance(time.Minute)
				if !q.holds(fireID("s", now.Add(time.Minute))) {
					t.Fatal("the schedule made again did not fire")
				}
				return
			}
			clk.Advance(scheduleRetry - time.Millisecond)
			if sc := b.sched.get("q", "s"); sc == nil || !sc.removing {
				t.Fatalf("a paused schedule whose unschedule is in doubt was read before a second passed: %+v", sc)
			}
			clk.Advance(time.Millisecond)
			if sc := b.sched.get("q", "s"); sc != nil {
				t.Fatalf("a paused schedule whose unschedule landed is still there a second later: %+v", sc)
			}
			q.mu.Lock()
			for e := range q.entries.all() {
				t.Errorf("the paused schedule fired: %s", e.ID)
			}
			q.mu.Unlock()
		})
	}
}

// TestSchedulePausedRemovingReadAgain: a paused schedule whose unschedule is in doubt, found still
// stored, is read again a minute later (not at every turn of the timer, and not never): once its
// record is gone, it is forgotten.
func TestSchedulePausedRemovingReadAgain(t *testing.T) {
	b, clk, _, q := scheduled(t, "-")
	ctx := context.Background()
	if _, err := b.setPaused(ctx, q, subjects.SchedulePauseRequest{Name: "s"}, true); err != nil {
		t.Fatal(err)
	}
	clk.Advance(2 * time.Minute)
	doubt := *b.sched.get("q", "s") // as an unschedule of unknown outcome that has not landed leaves it
	doubt.removing, doubt.retry = true, clk.Now().Add(scheduleRetry)
	b.sched.set(&doubt)
	b.sched.arm()
	clk.Advance(scheduleRetry)
	sc := b.sched.get("q", "s")
	if sc == nil || !sc.removing || !sc.retry.Equal(clk.Now().Add(removingPoll)) {
		t.Fatalf("read and found stored: %+v, want it kept, in doubt, read again in %v", sc, removingPoll)
	}
	if err := b.store.DeleteSchedule(ctx, "q", "s", sc.rev); err != nil { // the delete lands late
		t.Fatal(err)
	}
	clk.Advance(removingPoll)
	if sc := b.sched.get("q", "s"); sc != nil {
		t.Fatalf("its record gone, the paused schedule is still there a poll later: %+v", sc)
	}
	q.mu.Lock()
	n := q.entries.len()
	q.mu.Unlock()
	if n != 0 {
		t.Fatalf("the paused schedule fired %d messages", n)
	}
}

// TestScheduleFireByHandSentAgainAfterALateTimedFire: a fire by hand h enqueued between a cron
// time t and the timed fire of t, late (retried), is older than the timed fire's message, though
// enqueued after t: h sent again (its reply lost) changes nothing, and overlap skip goes on
// looking at the timed fire's message.
func TestScheduleFireByHandSentAgainAfterALateTimedFire(t *testing.T) {
	b, clk, _ := scheduleBroker(t, t0, "-")
	ctx := context.Background()
	if _, err := b.putSchedule(ctx, "q", subjects.ScheduleRequest{Name: "s", Cron: "@every 1m", Overlap: subjects.OverlapSkip}); err != nil {
		t.Fatal(err)
	}
	q, _ := b.lookup(ctx, "q", false)
	setUnavailable(q, true, false)
	clk.Advance(time.Minute) // the fire of t0+1m is unavailable: retried at t0+61s
	setUnavailable(q, false, false)
	clk.Advance(500 * time.Millisecond)
	if _, err := b.fireNow(ctx, q, subjects.ScheduleFireRequest{Name: "s", ID: "h"}); err != nil {
		t.Fatal(err)
	}
	if _, err := q.cancel(ctx, subjects.LeaseRequest{ID: "h"}); err != nil {
		t.Fatal(err)
	}
	clk.Advance(500 * time.Millisecond) // the retry enqueues s@t0+1m, after h
	tid := fireID("s", t0.Add(time.Minute))
	if sc := b.sched.get("q", "s"); sc.rec.LastID != tid || !q.unfinished(tid) {
		t.Fatalf("after the retried timed fire last_id %s, want %s (pending)", sc.rec.LastID, tid)
	}
	info, err := b.fireNow(ctx, q, subjects.ScheduleFireRequest{Name: "s", ID: "h"}) // h's reply was lost
	if err != nil {
		t.Fatal(err)
	}
	if info.LastID != tid {
		t.Errorf("h sent again: last_id %s, want %s (h is older than the timed fire's message)", info.LastID, tid)
	}
	clk.Advance(time.Minute)
	if q.holds(fireID("s", t0.Add(2*time.Minute))) {
		t.Errorf("overlap skip: s@t0+2m enqueued while %s is still pending", tid)
	}
}

// TestScheduleFireByHandAdoptedReply: a paused schedule fired by hand with the id of a message
// enqueued long before replies with the next_at of now, as its listing says, not of that message's
// time.
func TestScheduleFireByHandAdoptedReply(t *testing.T) {
	b, clk, _, q := scheduled(t, "-")
	ctx := context.Background()
	if _, err := q.enqueue(ctx, []subjects.EnqueueRequest{{ID: "h"}}); err != nil {
		t.Fatal(err)
	}
	if _, err := b.setPaused(ctx, q, subjects.SchedulePauseRequest{Name: "s"}, true); err != nil {
		t.Fatal(err)
	}
	clk.Advance(10 * time.Minute)
	info, err := b.fireNow(ctx, q, subjects.ScheduleFireRequest{Name: "s", ID: "h"})
	if err != nil {
		t.Fatal(err)
	}
	listed := b.sched.get("q", "s").info(clk.Now())
	if !info.NextAt.Equal(listed.NextAt) || info.NextAt.Before(clk.Now()) {
		t.Errorf("reply next_at %v, listing %v, now %v", info.NextAt, listed.NextAt, clk.Now())
	}
}

// TestScheduleThisVersionCannotRead: a stored schedule whose cron this version refuses (an earlier
// one took "*-5 * * * *", as "*") is listed with why it never fires, and never fires; pause, resume
// and fire refuse it with invalid_schedule, a set with a valid cron replaces it, and unschedule
// removes it. Such a schedule used to vanish from the API at the upgrade, still stored.
func TestScheduleThisVersionCannotRead(t *testing.T) {
	b, clk, _ := scheduleBroker(t, t0, "-")
	ctx := context.Background()
	for _, name := range []string{"old", "older"} {
		if _, err := b.putSchedule(ctx, "q", subjects.ScheduleRequest{Name: name, Cron: "@every 1m"}); err != nil {
			t.Fatal(err)
		}
		sc := b.sched.get("q", name)
		rec := sc.rec
		rec.Spec.Cron = "*-5 * * * *" // as a version before 2026-11-27 stored it
		if _, err := b.store.PutSchedule(ctx, "q", name, &rec, sc.rev); err != nil {
			t.Fatal(err)
		}
	}
	if err := b.sched.load(ctx); err != nil { // as the next start does
		t.Fatal(err)
	}
	q, err := b.lookup(ctx, "q", false)
	if err != nil {
		t.Fatal(err)
	}
	list, err := b.schedules(q, subjects.SchedulesRequest{})
	if err != nil {
		t.Fatal(err)
	}
	if len(list.Schedules) != 2 {
		t.Fatalf("schedules after the load: %+v, want old and older", list.Schedules)
	}
	for _, s := range list.Schedules {
		if !strings.Contains(s.Invalid, `"*-5"`) || !s.NextAt.IsZero() || s.Cron != "*-5 * * * *" {
			t.Errorf("schedule %s: invalid %q, next_at %v, cron %q; want why it never fires, no next time, its cron", s.Name, s.Invalid, s.NextAt, s.Cron)
		}
	}
	clk.Advance(10 * time.Minute)
	q.mu.Lock()
	n := 0
	for range q.entries.all() {
		n++
	}
	q.mu.Unlock()
	if n != 0 {
		t.Errorf("%d messages enqueued over 10 minutes by schedules that cannot fire", n)
	}
	if _, err := b.setPaused(ctx, q, subjects.SchedulePauseRequest{Name: "old"}, true); subjects.CodeOf(err) != subjects.CodeInvalidSchedule {
		t.Errorf("pause: %v, want invalid_schedule", err)
	}
	if _, err := b.setPaused(ctx, q, subjects.SchedulePauseRequest{Name: "old"}, false); subjects.CodeOf(err) != subjects.CodeInvalidSchedule {
		t.Errorf("resume: %v, want invalid_schedule", err)
	}
	if _, err := b.fireNow(ctx, q, subjects.ScheduleFireRequest{Name: "old"}); subjects.CodeOf(err) != subjects.CodeInvalidSchedule {
		t.Errorf("fire: %v, want invalid_schedule", err)
	}
	info, err := b.putSchedule(ctx, "q", subjects.ScheduleRequest{Name: "old", Cron: "*/5 * * * *"})
	if err != nil || info.Invalid != "" || info.NextAt.IsZero() {
		t.Errorf("set again with a valid cron: %+v, %v; want it valid, with a next time", info, err)
	}
	if r, err := b.unscheduleOf(ctx, q, subjects.UnscheduleRequest{Name: "older"}); err != nil || !r.Removed {
		t.Errorf("unschedule: %+v, %v; want removed", r, err)
	}
	if rev, err := b.store.ScheduleRevision(ctx, "q", "older"); err != nil || rev != 0 {
		t.Errorf("older after its unschedule: revision %d, %v; want gone", rev, err)
	}
}
