package broker

import (
	"cmp"
	"container/heap"
	"slices"
	"time"

	"github.com/natstone/natstone/broker/clock"
)

// deadlines is a min-heap of entries by a deadline (Unix ms) with one clock timer armed for its
// earliest deadline: the broker's single timer per kind of deadline per queue. An entry is in at most
// one deadlines heap at a time (its state decides which), so entry.heapIdx is its position there.
type deadlines struct {
	key     func(*entry) int64
	items   []*entry
	timer   clock.Timer
	armedAt int64 // deadline the timer is armed for; 0 if not armed
	// notBefore holds the timer back until then (Unix ms), whatever is due: set after a firing that
	// caught up, so that what comes due meanwhile is handled in one batch (garbage collection).
	notBefore int64
}

func (d *deadlines) Len() int           { return len(d.items) }
func (d *deadlines) Less(i, j int) bool { return d.key(d.items[i]) < d.key(d.items[j]) }
func (d *deadlines) Swap(i, j int) {
	d.items[i], d.items[j] = d.items[j], d.items[i]
	d.items[i].heapIdx = int32(i)
	d.items[j].heapIdx = int32(j)
}
func (d *deadlines) Push(x any) {
	e := x.(*entry)
	e.heapIdx = int32(len(d.items))
	d.items = append(d.items, e)
}
func (d *deadlines) Pop() any {
	n := len(d.items) - 1
	e := d.items[n]
	d.items[n] = nil
	d.items = trimmed(d.items[:n])
	e.heapIdx = -1
	return e
}

// trimmed returns s, or a copy of it with half its capacity once it is under a quarter full: a
// heap's array would otherwise keep the room of the largest backlog it held (a copy costs O(len(s))
// once for every quarter of the capacity popped). Arrays under 2048 are left alone.
func trimmed[T any](s []T) []T {
	if c := cap(s); c < 2048 || len(s)*4 >= c {
		return s
	}
	return append(make([]T, 0, cap(s)/2), s...)
}

func (d *deadlines) add(e *entry) { heap.Push(d, e) }

func (d *deadlines) remove(e *entry) {
	if i := int(e.heapIdx); i >= 0 && i < len(d.items) && d.items[i] == e {
		heap.Remove(d, i)
	}
}

// due returns up to max entries whose deadline is at or before now (in heap order, not sorted),
// without removing them.
func (d *deadlines) due(now int64, max int) []*entry {
	out := make([]*entry, 0, min(max, len(d.items)))
	// Walk the heap as a tree, pruning subtrees whose root is not due.
	stack := make([]int, 1, 64)
	for len(stack) > 0 && len(out) < max {
		i := stack[len(stack)-1]
		stack = stack[:len(stack)-1]
		if i >= len(d.items) || d.key(d.items[i]) > now {
			continue
		}
		out = append(out, d.items[i])
		stack = append(stack, 2*i+1, 2*i+2)
	}
	return out
}

// first returns up to n of d's entries that keep accepts, the first in the order of their deadlines,
// ties by Seq (the enqueue order). While matches come often it walks the heap from its root
// (ascend), reading about as many entries as it returns; past a budget of 16 reads per entry it
// wants (a state, or a filter, few entries match) it reads every entry once instead, keeping the n
// first in a bounded heap. Either way it never sorts the whole heap, which under the queue's lock
// held up every request of a queue of a million finished messages for seconds.
func (d *deadlines) first(n int, keep func(*entry) bool) []*entry {
	budget, read := 16*n+64, 0
	var out []*entry
	d.ascend(func(e *entry) bool {
		if read++; read > budget {
			return false
		}
		if keep(e) {
			out = append(out, e)
		}
		return len(out) < n
	})
	if read <= budget {
		return out
	}
	best := &latest{d: d}
	for _, e := range d.items {
		if !keep(e) {
			continue
		}
		if len(best.es) < n {
			heap.Push(best, e)
		} else if d.before(e, best.es[0]) {
			best.es[0] = e
			heap.Fix(best, 0)
		}
	}
	slices.SortFunc(best.es, func(a, b *entry) int { return d.compare(a, b) })
	return best.es
}

// compare orders entries as first and ascend give them: by deadline, then Seq.
func (d *deadlines) compare(a, b *entry) int {
	return cmp.Or(cmp.Compare(d.key(a), d.key(b)), cmp.Compare(a.Seq, b.Seq))
}

func (d *deadlines) before(a, b *entry) bool { return d.compare(a, b) < 0 }

// latest is a max-heap of entries by (deadline, Seq): first's n best so far, the worst on top.
type latest struct {
	d  *deadlines
	es []*entry
}

func (l *latest) Len() int           { return len(l.es) }
func (l *latest) Less(i, j int) bool { return l.d.before(l.es[j], l.es[i]) }
func (l *latest) Swap(i, j int)      { l.es[i], l.es[j] = l.es[j], l.es[i] }
func (l *latest) Push(x any)         { l.es = append(l.es, x.(*entry)) }
func (l *latest) Pop() any {
	n := len(l.es) - 1
	e := l.es[n]
	l.es = l.es[:n]
	return e
}

// ascend calls fn with d's entries in the order of their deadlines, ties by Seq (the enqueue
// order), until fn returns false. It walks the heap from its root with a frontier of the nodes
// not yet reached, reading about as many entries as fn takes.
func (d *deadlines) ascend(fn func(*entry) bool) {
	if len(d.items) == 0 {
		return
	}
	f := &frontier{d: d, idx: []int{0}}
	var group []*entry
	var stack []int
	for f.Len() > 0 {
		// Every entry of the smallest deadline left: the frontier's with it, and those below them
		// with it too (a heap's children are never earlier), in Seq order.
		k := d.key(d.items[f.idx[0]])
		group, stack = group[:0], stack[:0]
		for f.Len() > 0 && d.key(d.items[f.idx[0]]) == k {
			stack = append(stack, heap.Pop(f).(int))
		}
		for len(stack) > 0 {
			i := stack[len(stack)-1]
			stack = stack[:len(stack)-1]
			group = append(group, d.items[i])
			for _, c := range [2]int{2*i + 1, 2*i + 2} {
				switch {
				case c >= len(d.items):
				case d.key(d.items[c]) == k:
					stack = append(stack, c)
				default:
					heap.Push(f, c)
				}
			}
		}
		slices.SortFunc(group, func(a, b *entry) int { return cmp.Compare(a.Seq, b.Seq) })
		for _, e := range group {
			if !fn(e) {
				return
			}
		}
	}
}

// frontier is a min-heap of positions in d's heap, by their entries' deadlines (ascend).
type frontier struct {
	d   *deadlines
	idx []int
}

func (f *frontier) Len() int { return len(f.idx) }
func (f *frontier) Less(i, j int) bool {
	return f.d.key(f.d.items[f.idx[i]]) < f.d.key(f.d.items[f.idx[j]])
}
func (f *frontier) Swap(i, j int) { f.idx[i], f.idx[j] = f.idx[j], f.idx[i] }
func (f *frontier) Push(x any)    { f.idx = append(f.idx, x.(int)) }
func (f *frontier) Pop() any {
	n := len(f.idx) - 1
	i := f.idx[n]
	f.idx = f.idx[:n]
	return i
}

// arm (re)sets the timer for the earliest deadline; fire runs when it elapses.
func (d *deadlines) arm(clk clock.Clock, fire func()) {
	if len(d.items) == 0 {
		if d.timer != nil && d.armedAt != 0 {
			d.timer.Stop()
		}
		d.armedAt = 0
		return
	}
	at := max(d.key(d.items[0]), d.notBefore)
	if at == d.armedAt || d.armedAt == parked {
		return
	}
	d.armedAt = at
	wait := time.Duration(at-clk.Now().UnixMilli()) * time.Millisecond
	if wait < 0 {
		wait = 0
	}
	if d.timer == nil {
		d.timer = clk.AfterFunc(wait, fire)
		return
	}
	d.timer.Reset(wait)
}

func (d *deadlines) stop() {
	if d.timer != nil {
		d.timer.Stop()
	}
	d.armedAt = 0
}
