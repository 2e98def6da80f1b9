package workers_test

import (
	"context"
	"errors"
	"fmt"
	"os"
	"slices"
	"strings"
	"testing"
	"time"

	"github.com/natstone/natstone/subjects"
	"github.com/natstone/natstone/workers"
)

// TestStatsBrowseHistory drives the three read operations through the client on a fake clock.
func TestStatsBrowseHistory(t *testing.T) {
	e := setupFake(t)
	e.createQueue("q", &workers.QueueOpts{Lease: 10 * time.Second})
	for i := range 3 {
		e.enqueue("q", "x", &workers.EnqueueOpts{ID: fmt.Sprint(i), Priority: new(int64(i)), Metadata: map[string]string{"even": fmt.Sprint(i%2 == 0)}})
	}
	e.clk.Advance(2 * time.Second)
	ms, err := e.c.Dequeue(ctx(t), "q", &workers.DequeueOpts{Worker: "w-7"})
	if err != nil || len(ms) != 1 {
		t.Fatalf("dequeue: %v, %d messages", err, len(ms))
	}

	s, err := e.c.Stats(ctx(t), "q", &workers.StatsOpts{ExpiringWithin: 10 * time.Second})
	if err != nil {
		t.Fatal(err)
	}
	if s.Counts != (subjects.Counts{Pending: 2, Running: 1}) || s.OldestPendingMS != 2000 || s.Totals.Dequeued != 1 {
		t.Errorf("stats: counts %+v oldest %d totals %+v", s.Counts, s.OldestPendingMS, s.Totals)
	}
	if len(s.Expiring) != 1 || s.Expiring[0].ID != "0" || s.Expiring[0].LeaseID != ms[0].LeaseID {
		t.Errorf("expiring leases %+v, want message 0 under %s", s.Expiring, ms[0].LeaseID)
	}
	s, err = e.c.Stats(ctx(t), "q", &workers.StatsOpts{Filter: map[string]string{"even": "true"}})
	if err != nil || s.Counts != (subjects.Counts{Pending: 1, Running: 1}) {
		t.Errorf("filtered stats: %+v, %v", s.Counts, err)
	}

	msgs, next, err := e.c.Browse(ctx(t), "q", subjects.StatePending, &workers.BrowseOpts{Limit: 1})
	if err != nil || len(msgs) != 1 || msgs[0].ID != "1" || next == "" || msgs[0].Payload != nil {
		t.Errorf("browse pending, limit 1: %+v next=%q err=%v; want message 1 without payload, and a next page", msgs, next, err)
	}
	// The pages after it, one message each, until none is left.
	var ids []string
	for next != "" {
		msgs, next, err = e.c.Browse(ctx(t), "q", subjects.StatePending, &workers.BrowseOpts{Limit: 1, After: next})
		if err != nil || len(msgs) > 1 || len(ids) > 10 {
			t.Fatalf("browse pending after %v: %+v, %v", ids, msgs, err)
		}
		for _, m := range msgs {
			ids = append(ids, m.ID)
		}
	}
	if want := []string{"2"}; !slices.Equal(ids, want) {
		t.Errorf("the pages after message 1: %v, want %v", ids, want)
	}
	if _, _, err := e.c.Browse(ctx(t), "q", "asleep", nil); !errors.Is(err, workers.ErrBadRequest) {
		t.Errorf("browse of an unknown state: %v, want ErrBadRequest", err)
	}

	h, err := e.c.History(ctx(t), "q", "0", 0)
	if err != nil {
		t.Fatal(err)
	}
	if len(h.Events) != 2 || h.Events[1].Kind != subjects.EventLeased || h.Events[1].Worker != "w-7" {
		t.Fatalf("history: %+v, want enqueued then leased by w-7", h.Events)
	}
	if h.Events[0].StateMS != 2000 || !h.Events[1].Current {
		t.Errorf("history: pending for %d ms (want 2000), leased current=%v", h.Events[0].StateMS, h.Events[1].Current)
	}
	if _, err := e.c.History(ctx(t), "q", "nope", 0); !errors.Is(err, workers.ErrMessageNotFound) {
		t.Errorf("history of an unknown message: %v, want ErrMessageNotFound", err)
	}
	if _, err := e.c.History(ctx(t), "q", "0", subjects.MaxHistoryLimit+1); !errors.Is(err, workers.ErrOutOfRange) {
		t.Errorf("history limit too high: %v, want ErrOutOfRange", err)
	}
}

// TestWorkerNameInHistory: a worker's leases carry its name, by default host:pid.
func TestWorkerNameInHistory(t *testing.T) {
	e := setup(t)
	e.createQueue("q", nil)
	done := make(chan string, 2)
	h := workers.HandlerFunc(func(_ context.Context, j *workers.Job) error {
		done <- j.ID
		return nil
	})
	e.startWorker(&workers.WorkerConfig{Queue: "q", Name: "billing-1"}, h)
	e.enqueue("q", "x", &workers.EnqueueOpts{ID: "named"})
	<-done
	e.waitState("q", "named", subjects.StateCompleted)
	hist, err := e.c.History(ctx(t), "q", "named", 0)
	if err != nil || len(hist.Events) < 2 || hist.Events[1].Worker != "billing-1" {
		t.Fatalf("history %+v, %v: want the lease taken by billing-1", hist.Events, err)
	}

	e.createQueue("q2", nil)
	e.startWorker(&workers.WorkerConfig{Queue: "q2"}, h)
	e.enqueue("q2", "x", &workers.EnqueueOpts{ID: "anon"})
	<-done
	e.waitState("q2", "anon", subjects.StateCompleted)
	host, _ := os.Hostname()
	hist, err = e.c.History(ctx(t), "q2", "anon", 0)
	if err != nil || len(hist.Events) < 2 || !strings.HasPrefix(hist.Events[1].Worker, host+":") {
		t.Fatalf("history %+v, %v: want the lease taken by %s:<pid>", hist.Events, err, host)
	}
}
