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
	steps, held := 0, 0
	q.testCounting = func() {
		steps++
		if !q.mu.TryLock() {
			held++
			return
		}
		q.mu.Unlock()
	}
	c, err := q.depth(map[string]string{"even": "true"})
	if err != nil || c.Pending != n/2 || c.Invisible+c.Running+c.Completed+c.Canceled+c.Errored != 0 {
		t.Fatalf("depth of the even ones: %+v, %v; want %d pending", c, err, n/2)
	}
	st, err := q.stats(subjects.StatsRequest{Filter: map[string]string{"even": "false"}})
	if err != nil || st.Counts.Pending != n/2 {
		t.Fatalf("stats of the odd ones: %+v, %v; want %d pending", st.Counts, err, n/2)
	}
	if steps < 2 || held != 0 {
		t.Fatalf("the two walks paused %d times, %d of them with the queue's lock held; want 2 or more, none held", steps, held)
	}
}
