package broker

import (
	"context"
	"fmt"
	"testing"

	"github.com/natstone/natstone/subjects"
)

// TestFilteredCountsLetOthersIn: a filtered depth or stats walks every message of the queue, and
// on a queue of 1.5 million messages it held the queue's lock for about 300 ms, every dequeue of
// the queue waiting that long (a dashboard's page with a filter asks every 2 s). The walk now lets
// go of the lock between its steps; what it counts of a queue that does not change is exact.
func TestFilteredCountsLetOthersIn(t *testing.T) {
	b, _ := internalBroker(t)
	q := queueQ(t, b)
	ctx := context.Background()
	const n = 3 * countStep / 2 // a table of 2 countStep slots or more: at least one step between
	for i := 0; i < n; i += subjects.MaxEnqueueBatch {
		var reqs []subjects.EnqueueRequest
		for j := i; j < min(i+subjects.MaxEnqueueBatch, n); j++ {
			reqs = append(reqs, subjects.EnqueueRequest{ID: fmt.Sprint(j), Metadata: map[string]string{"even": fmt.Sprint(j%2 == 0)}})
		}
		if _, err := q.enqueue(ctx, reqs); err != nil {
			t.Fatal(err)
		}
	}
	steps, held := watchPauses(q)
	c, err := q.depth(map[string]string{"even": "true"})
	if err != nil || c.Pending != n/2 || c.Invisible+c.Running+c.Completed+c.Canceled+c.Errored != 0 {
		t.Fatalf("depth of the even ones: %+v, %v; want %d pending", c, err, n/2)
	}
	st, err := q.stats(subjects.StatsRequest{Filter: map[string]string{"even": "false"}})
	if err != nil || st.Counts.Pending != n/2 {
		t.Fatalf("stats of the odd ones: %+v, %v; want %d pending", st.Counts, err, n/2)
	}
	if *steps < 2 || *held != 0 {
		t.Fatalf("the two walks paused %d times, %d of them with the queue's lock held; want 2 or more, none held", *steps, *held)
	}
}

// TestFilteredCountOfSlotsEmptiedMeanwhile: a slot that empties while a filtered count lets go of
// the lock (a collection landing removes its entry) is skipped. The walk read the slot's tag before
// its pause and its entry after, and a nil entry crashed the broker.
func TestFilteredCountOfSlotsEmptiedMeanwhile(t *testing.T) {
	b, _ := internalBroker(t)
	q := queueQ(t, b)
	ctx := context.Background()
	const n = 3 * countStep / 2
	for i := 0; i < n; i += subjects.MaxEnqueueBatch {
		var reqs []subjects.EnqueueRequest
		for j := i; j < min(i+subjects.MaxEnqueueBatch, n); j++ {
			reqs = append(reqs, subjects.EnqueueRequest{ID: fmt.Sprint(j)})
		}
		if _, err := q.enqueue(ctx, reqs); err != nil {
			t.Fatal(err)
		}
	}
	removed := 0
	q.testPausing = func() {
		q.mu.Lock()
		defer q.mu.Unlock()
		if removed > 0 {
			return
		}
		// Empty the first slot of the next step, and those its entries move back into, as the
		// removals of collections landing meanwhile would; once, at the first pause.
		for ; q.entries.slots[countStep] != nil && removed < 200; removed++ {
			q.untrack(q.entries.slots[countStep])
		}
	}
	for i := 0; ; i++ { // the slot the test empties must hold an entry
		q.mu.Lock()
		held := q.entries.tags[countStep] != 0
		q.mu.Unlock()
		if held {
			break
		}
		if _, err := q.enqueue(ctx, []subjects.EnqueueRequest{{ID: fmt.Sprint("fill-", i)}}); err != nil {
			t.Fatal(err)
		}
	}
	c, err := q.depth(map[string]string{}) // no filter: no walk
	if err != nil {
		t.Fatal(err)
	}
	total := c.Pending
	if c, err = q.depth(map[string]string{"absent": "x"}); err != nil || c.Pending != 0 {
		t.Fatalf("depth with a filter nothing matches, entries removed during it: %+v, %v", c, err)
	}
	if removed == 0 {
		t.Fatalf("the walk made no pause in which to remove entries (%d messages)", total)
	}
}

// watchPauses counts the pauses of q's long walks (testPausing), and those in which the queue's
// lock was held, which would have let no one in.
func watchPauses(q *queue) (steps, held *int) {
	steps, held = new(int), new(int)
	q.testPausing = func() {
		*steps++
		if !q.mu.TryLock() {
			*held++
			return
		}
		q.mu.Unlock()
	}
	return steps, held
}
