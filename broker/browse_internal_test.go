package broker

import (
	"context"
	"fmt"
	"slices"
	"testing"

	"github.com/natstone/natstone/subjects"
)

// finishedQueue returns queue q holding n messages, stored pending, then finished in memory alone
// as finish says (their state; their ends one millisecond apart, in the order of their ids), which
// is all a browse reads. Message i's metadata is {"tenth": "yes"} when i%10 == 0, else "no".
func finishedQueue(t *testing.T, n int, finish func(i int) subjects.State) *queue {
	t.Helper()
	b, clk := internalBroker(t)
	q := queueQ(t, b)
	for i := 0; i < n; i += subjects.MaxEnqueueBatch {
		var reqs []subjects.EnqueueRequest
		for j := i; j < min(i+subjects.MaxEnqueueBatch, n); j++ {
			reqs = append(reqs, subjects.EnqueueRequest{ID: msgID(j), Metadata: map[string]string{"tenth": map[bool]string{true: "yes", false: "no"}[j%10 == 0]}})
		}
		if _, err := q.enqueue(context.Background(), reqs); err != nil {
			t.Fatal(err)
		}
	}
	q.mu.Lock()
	defer q.mu.Unlock()
	for i := range n {
		end(q, q.entries.get(msgID(i)), finish(i), clk.Now().UnixMilli()+int64(i))
	}
	return q
}

func msgID(i int) string { return fmt.Sprintf("m%06d", i) }

// end makes e's record one of state s that ended at endedAt, in memory. Called with q.mu held.
func end(q *queue, e *entry, s subjects.State, endedAt int64) {
	r := e.record()
	r.State, r.EndedAt = s, endedAt
	q.apply(e, r, e.rev)
}

// browseAll browses every page of state s with filter, limit messages a page, and returns the ids.
func browseAll(t *testing.T, q *queue, s subjects.State, filter map[string]string, limit int) []string {
	t.Helper()
	var ids []string
	after := ""
	for {
		page, err := q.browse(subjects.BrowseRequest{State: s, Filter: filter, Limit: limit, After: after})
		if err != nil {
			t.Fatal(err)
		}
		for _, m := range page.Messages {
			if m.State != s {
				t.Fatalf("browse of %s gave message %s, %s", s, m.ID, m.State)
			}
			ids = append(ids, m.ID)
		}
		if !page.More {
			return ids
		}
		after = page.Next
	}
}

// TestBrowseReadsItsStateOnly: a browse of one finished state reads that state's messages from
// its cursor on, not the others' nor those of earlier pages. The finished states were one heap, and
// a page of the 3 errored messages among 12,288 canceled ones read every canceled one, under the
// queue's lock (80 ms at 334,000), as did any page but the first.
func TestBrowseReadsItsStateOnly(t *testing.T) {
	const n = 3 * countStep
	q := finishedQueue(t, n+3, func(i int) subjects.State {
		if i >= n {
			return subjects.StateErrored
		}
		return subjects.StateCanceled
	})
	reads := 0
	key := q.gc.key
	q.gc.key = func(e *entry) int64 {
		reads++
		return key(e)
	}
	if got := browseAll(t, q, subjects.StateErrored, nil, 2); !slices.Equal(got, []string{msgID(n), msgID(n + 1), msgID(n + 2)}) {
		t.Fatalf("the errored messages: %v", got)
	}
	if reads > 200 {
		t.Fatalf("two pages of the 3 errored messages read %d deadlines", reads)
	}
	// A page far into the canceled ones, after the cursor of the 10th from the end.
	first, err := q.browse(subjects.BrowseRequest{State: subjects.StateCanceled, Limit: 1})
	if err != nil || len(first.Messages) != 1 || first.Messages[0].ID != msgID(0) {
		t.Fatalf("the first canceled message: %+v, %v", first, err)
	}
	q.mu.Lock()
	e := q.entries.get(msgID(n - 10))
	after := cursor{key: key(e), seq: e.Seq, set: true}.String()
	q.mu.Unlock()
	reads = 0
	if got := browseAll(t, q, subjects.StateCanceled, nil, 50); len(got) != n {
		t.Fatalf("every canceled message: %d of %d", len(got), n)
	}
	all := reads
	reads = 0
	page, err := q.browse(subjects.BrowseRequest{State: subjects.StateCanceled, Limit: 50, After: after})
	if err != nil || len(page.Messages) != 9 || page.Messages[0].ID != msgID(n-9) || page.More {
		t.Fatalf("the last 9 canceled messages: %d, more %v, %v", len(page.Messages), page.More, err)
	}
	if reads > 200 {
		t.Fatalf("the last page of %d canceled messages read %d deadlines (all the pages %d)", n, reads, all)
	}
}

// TestBrowseOfAFewLetsOthersIn: a browse with a filter few messages match reads every message of its
// state, and lets go of the queue's lock between its steps, as a filtered count does; what it gives
// of a queue that does not change is exact.
func TestBrowseOfAFewLetsOthersIn(t *testing.T) {
	const n = 3 * countStep
	q := finishedQueue(t, n, func(int) subjects.State { return subjects.StateCompleted })
	steps, held := watchPauses(q)
	var want []string
	for i := 0; i < n; i += 10 {
		want = append(want, msgID(i))
	}
	if got := browseAll(t, q, subjects.StateCompleted, map[string]string{"tenth": "yes"}, subjects.MaxBrowseLimit); !slices.Equal(got, want) {
		t.Fatalf("the completed tenth: %d messages, want %d in order", len(got), len(want))
	}
	if *steps < 2 || *held != 0 {
		t.Fatalf("the browse paused %d times, %d of them with the queue's lock held; want 2 or more, none held", *steps, *held)
	}
}

// TestBrowseOfMessagesMovedMeanwhile: messages collected while a browse lets go of the lock, or
// that end anew (retried and canceled again: last in the order), are not given where they were:
// the collected ones not at all, the others in their new place. Every other message of the state
// is given once, in its place, though the queue's retention changed too.
func TestBrowseOfMessagesMovedMeanwhile(t *testing.T) {
	const n = 4 * countStep
	q := finishedQueue(t, n, func(int) subjects.State { return subjects.StateCanceled })
	collected, ended := map[string]bool{}, []string{}
	pauses := 0
	q.testPausing = func() {
		q.mu.Lock()
		defer q.mu.Unlock()
		if pauses++; pauses > 1 {
			return
		}
		// The retention changes meanwhile: every message's deadline, none's place.
		c := q.cfg
		c.RetentionMS -= 2000
		q.setConfig(c, q.cfgRev)
		// At the first pause, countStep messages in: of the tenth, some found already, some ahead.
		for i := 10; i < n; i += 490 {
			e := q.entries.get(msgID(i))
			if i%20 == 0 {
				collected[e.ID] = true
				q.unplace(e)
				q.untrack(e)
				continue
			}
			ended = append(ended, e.ID)
			end(q, e, subjects.StateCanceled, 1<<50+int64(i))
		}
	}
	got := browseAll(t, q, subjects.StateCanceled, map[string]string{"tenth": "yes"}, subjects.MaxBrowseLimit)
	if pauses < 2 {
		t.Fatalf("the browse paused %d times", pauses)
	}
	var want []string
	for i := 0; i < n; i += 10 {
		if id := msgID(i); !collected[id] && !slices.Contains(ended, id) {
			want = append(want, id)
		}
	}
	want = append(want, ended...)
	if !slices.Equal(got, want) {
		t.Fatalf("gave %d messages, want %d: the %d that stayed in order, then the %d that ended anew, not the %d collected", len(got), len(want), len(want)-len(ended), len(ended), len(collected))
	}
}
