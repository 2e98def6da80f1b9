package faults

import (
	"cmp"
	"fmt"
	"os"
	"path/filepath"
	"strconv"
	"strings"
	"testing"
	"time"

	"github.com/natstone/natstone/test/natbin"
	"github.com/natstone/natstone/test/natstest"
)

// kills is how many times each variant kills natstone: a handful by default (make faults, part of
// make test), NATSTONE_FAULT_KILLS for a long run (make faults-long).
func kills(t *testing.T, def int) int {
	if s := os.Getenv("NATSTONE_FAULT_KILLS"); s != "" {
		n, err := strconv.Atoi(s)
		if err != nil || n < 1 {
			t.Fatalf("NATSTONE_FAULT_KILLS=%q: want a positive number", s)
		}
		return n
	}
	return def
}

func TestMain(m *testing.M) {
	path, remove, err := natbin.Build("../../cmd/natstone", true)
	if err != nil {
		fmt.Fprintln(os.Stderr, err)
		os.Exit(1)
	}
	binary = path
	code := m.Run()
	remove()
	os.Exit(code)
}

// TestFaults kills natstone (embedded NATS and broker together) at random moments under load and
// checks the whole history.
func TestFaults(t *testing.T) {
	t.Parallel()
	port := freePort(t)
	dir := t.TempDir()
	check(t, faultConfig{kills: kills(t, 4), producers: 2, workers: 4}, fmt.Sprintf("nats://127.0.0.1:%d", port),
		[]string{"serve", "--data", filepath.Join(dir, "data"), "--listen", fmt.Sprintf("127.0.0.1:%d", port)})
}

// TestFaultsBrokerOnly keeps NATS running (in this process) and kills only the broker. A broker
// restarted on a store whose claim a killed one held waits out --claim-ttl.
func TestFaultsBrokerOnly(t *testing.T) {
	t.Parallel()
	srv := natstest.Start(t, nil)
	check(t, faultConfig{kills: kills(t, 4), external: true, producers: 2, workers: 4}, srv.URL(),
		[]string{"serve", "--nats-url", srv.URL(), "--claim-ttl", "2s"})
}

// TestFaultsStandby runs two brokers on one NATS server (in this process), one serving and one
// standing by. Each kill kills the one serving, or pauses it until the standby has taken over and
// then resumes it: requests it had read before the pause then run against a store another broker
// serves, until its claim's renewal fails and it exits.
func TestFaultsStandby(t *testing.T) {
	t.Parallel()
	srv := natstest.Start(t, nil)
	check(t, faultConfig{kills: kills(t, 4), external: true, standby: true, producers: 2, workers: 4}, srv.URL(),
		[]string{"serve", "--nats-url", srv.URL(), "--claim-ttl", "2s"})
}

// TestFaultsRetentionZero is TestFaults on queues that keep nothing that ended: a message is
// garbage-collected as soon as it is completed, canceled or errored, so collections run all the time.
func TestFaultsRetentionZero(t *testing.T) {
	t.Parallel()
	port := freePort(t)
	dir := t.TempDir()
	check(t, faultConfig{kills: kills(t, 3), collected: true, producers: 2, workers: 4}, fmt.Sprintf("nats://127.0.0.1:%d", port),
		[]string{"serve", "--data", filepath.Join(dir, "data"), "--listen", fmt.Sprintf("127.0.0.1:%d", port)})
}

// TestFaultsSyncAlways is TestFaults with an fsync before every acknowledgement.
func TestFaultsSyncAlways(t *testing.T) {
	t.Parallel()
	port := freePort(t)
	dir := t.TempDir()
	check(t, faultConfig{kills: kills(t, 3), syncAlways: true, producers: 2, workers: 4}, fmt.Sprintf("nats://127.0.0.1:%d", port),
		[]string{"serve", "--data", filepath.Join(dir, "data"), "--listen", fmt.Sprintf("127.0.0.1:%d", port), "--sync", "always"})
}

func check(t *testing.T, cfg faultConfig, url string, args []string) {
	run, stats := runFaults(t, cfg, url, args)
	violations := append(Check(run), stats.churnViolations...)
	leases, canceled, retries, retried, reschedules, rescheduled := 0, 0, 0, 0, 0, 0
	for _, op := range run.Ops {
		if op.Kind == Reschedule {
			reschedules++
			if op.Outcome == OK {
				rescheduled++
			}
		}
		leases += len(op.Leases)
		if op.Outcome == OK && op.Kind == Cancel {
			canceled++
		}
		if op.Kind == Retry {
			retries++
			if op.Outcome == OK {
				retried++
			}
		}
	}
	if canceled > 0 && retries == 0 {
		t.Errorf("%d messages canceled, none retried: the operator retries the first it cancels", canceled)
	}
	if reschedules == 0 {
		t.Errorf("no reschedule sent: the operator reschedules the first message it does not cancel")
	}
	t.Logf("kills=%d clean_stops=%d starts_from_snapshot=%d paused=%d paused_starting=%d starts_lost=%d ops=%d messages=%d enqueued=%d batches=%d leases=%d completed=%d canceled=%d retried=%d rescheduled=%d leased_by_next=%d extended=%d polls_abandoned=%d (messages given back %d) unheard_leases_given_back=%d orphan_payloads_deleted=%d records_replaced=%d stale_loads_read_again=%d conflict_reads_behind=%d lock_slots_fenced=%d lock_slots_held_by_others=%d elections_told=%d elections_asked=%d queues_deleted=%d (storage unchecked %d, markers left %d, counted but gone %d) deleted_queue_records_removed=%d deleted_queue_locks_removed=%d purged_again=%d %s violations=%d",
		stats.kills, stats.cleanStops, stats.snapshotStarts, stats.paused, stats.pausedStarting, stats.startsLost, len(run.Ops), len(run.Final), stats.enqueued, stats.batches, leases, stats.completed, canceled, retried, rescheduled, stats.nextLeased, stats.ex, stats.abandons, stats.abandonedLeases, stats.givenBack, stats.orphans, stats.replaced, stats.stale, stats.behind, stats.fenced, stats.heldByOthers, stats.told, stats.asked, stats.churned, stats.churnUnchecked, stats.churnMarkers, stats.churnUnbacked, stats.ghosts, stats.ghostLocks, stats.repurged, tickSummary(stats), len(violations))
	if cfg.unannounced && (stats.told > 0 || !strings.Contains(stats.log, "not told of storage's leader elections")) {
		t.Errorf("natstone, refused JetStream's advisories, was told of %d elections (want none), or did not log that it is refused", stats.told)
	}
	if stats.cappedMost < 2 {
		t.Errorf("the max_running queue had at most %d leases held at once (%d leases): its check checked nothing", stats.cappedMost, stats.cappedLeases)
	}
	if most := MostSharing(run, "pairs"); most < 2 {
		t.Errorf("the queue of two running messages per value never ran two of a value at once (at most %d): its check checked nothing", most)
	} else {
		t.Logf("pairs: at most %d messages of one value running at once (max_running_per_value 2); %d dequeues leased two of a value in one batch", most, batchedTwice(run, "pairs"))
	}
	if stats.haltedFor < 3*time.Second {
		t.Errorf("the paused schedule was paused for %v at the end: its check checked too little", stats.haltedFor)
	}
	if stats.soloFired == 0 || stats.soloOverlapped == 0 {
		t.Errorf("the overlap-skip schedule fired %d messages and left out %d seconds: its check checked nothing", stats.soloFired, stats.soloOverlapped)
	}
	if stats.completed == 0 || stats.enqueued == 0 || stats.churned == 0 {
		t.Errorf("the run did no work: %+v", stats)
	}
	if len(violations) > 0 {
		saveRun(t, run)
		saveLog(t, stats.log)
	}
	for i, v := range violations {
		if i == 50 {
			t.Errorf("… and %d more", len(violations)-50)
			break
		}
		t.Error(v)
	}
}

// saveLog keeps natstone's log of a run with violations beside its history (see saveRun).
func saveLog(t *testing.T, log string) {
	dir := cmp.Or(os.Getenv("NATSTONE_FAULT_HISTORY_DIR"), os.TempDir())
	path := filepath.Join(dir, fmt.Sprintf("natstone-%s-%d.log", t.Name(), time.Now().UnixNano()))
	if err := os.WriteFile(path, []byte(log), 0o644); err != nil {
		t.Errorf("natstone's log was not saved: %v", err)
		return
	}
	t.Logf("natstone's log is in %s", path)
}

// saveRun keeps a failed run's history where the test's own directories do not remove it:
// NATSTONE_FAULT_HISTORY_DIR, else the system's temporary directory. ReadRun reads it back, and
// Check on it gives the same violations, unless the wall clock was stepped during the run (the live
// times compare by the monotonic clock, the saved ones by the wall clock).
func saveRun(t *testing.T, run Run) {
	dir := cmp.Or(os.Getenv("NATSTONE_FAULT_HISTORY_DIR"), os.TempDir())
	path := filepath.Join(dir, fmt.Sprintf("natstone-%s-%d.json", t.Name(), time.Now().UnixNano()))
	if err := WriteRun(path, run); err != nil {
		t.Errorf("the run's history was not saved: %v", err)
		return
	}
	t.Logf("the run's history (%d operations) is in %s", len(run.Ops), path)
}

// batchedTwice counts the acknowledged dequeues of queue that leased two messages or more of one
// exclusivity value in one batch.
func batchedTwice(run Run, queue string) int {
	n := 0
	for _, op := range run.Ops {
		if op.Kind != Dequeue || op.Outcome != OK || op.Queue != queue {
			continue
		}
		seen := map[string]bool{}
		for _, l := range op.Leases {
			if seen[l.Value] {
				n++
				break
			}
			seen[l.Value] = true
		}
	}
	return n
}
