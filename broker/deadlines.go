package broker

import (
	"cmp"
	"math"
	"slices"
	"strings"
	"time"

	"github.com/google/btree"

	"github.com/natstone/natstone/broker/clock"
)

// deadlines holds entries in the order of a deadline (Unix ms) with one clock timer armed for the
// earliest: the broker's single timer per kind of deadline per queue. An entry is in at most one
// deadlines at a time (its state decides which).
//
// The entries are kept sorted, in a B-tree, by group, deadline, Seq (the enqueue order) and id, so
// that a browse reads only what it returns: its state's group from its cursor on, found in
// O(log n). The finished states share one deadlines (their garbage collection) in a group each:
// an errored message's page no longer scans every completed one (a heap did, 80 ms under the
// queue's lock at 334,000 finished messages, whatever page was asked).
type deadlines struct {
	// key is an entry's place in the order, fixed while it is in: its deadline less offset.
	key func(*entry) int64
	// offset is what the deadlines add to the keys: the retention of the finished messages, whose
	// keys are when they ended, so that a change of the retention moves no entry. 0 for the others.
	offset int64
	// group, if set, splits the order: every entry of a lower group comes first. Without it the
	// entries are one group, 0.
	group   func(*entry) int
	tree    *btree.BTreeG[*entry] // made at the first add
	timer   clock.Timer
	armedAt int64 // deadline the timer is armed for; 0 if not armed
	// notBefore holds the timer back until then (Unix ms), whatever is due: set after a firing that
	// caught up, so that what comes due meanwhile is handled in one batch (garbage collection).
	notBefore int64
	// earliest is the earliest key of any group, valid while earliestOK: finding it takes a
	// descent per group, and the timer asks for it at every request's end.
	earliest   int64
	earliestOK bool
	// pivot is the place a search starts from: an entry that is in no tree, whose group and key
	// are pivotGroup and pivotKey.
	pivot      entry
	pivotGroup int
	pivotKey   int64
}

// deadlinesDegree is the B-tree's degree: nodes of 31 to 63 entries, about 10 bytes an entry.
const deadlinesDegree = 32

func (d *deadlines) Len() int {
	if d.tree == nil {
		return 0
	}
	return d.tree.Len()
}

func (d *deadlines) keyOf(e *entry) int64 {
	if e == &d.pivot {
		return d.pivotKey
	}
	return d.key(e)
}

func (d *deadlines) groupOf(e *entry) int {
	switch {
	case e == &d.pivot:
		return d.pivotGroup
	case d.group == nil:
		return 0
	}
	return d.group(e)
}

// compare orders entries as the tree keeps them: by group, deadline, Seq, then id.
func (d *deadlines) compare(a, b *entry) int {
	if d.group != nil {
		if ga, gb := d.groupOf(a), d.groupOf(b); ga != gb {
			if ga < gb {
				return -1
			}
			return 1
		}
	}
	if ka, kb := d.keyOf(a), d.keyOf(b); ka != kb {
		if ka < kb {
			return -1
		}
		return 1
	}
	if a.Seq != b.Seq {
		if a.Seq < b.Seq {
			return -1
		}
		return 1
	}
	return strings.Compare(a.ID, b.ID)
}

func (d *deadlines) less(a, b *entry) bool { return d.compare(a, b) < 0 }

func (d *deadlines) add(e *entry) {
	if d.tree == nil {
		d.tree = btree.NewG(deadlinesDegree, d.less)
	}
	d.tree.ReplaceOrInsert(e)
	if k := d.key(e); d.earliestOK && k < d.earliest {
		d.earliest = k
	}
}

// remove takes e out, if it is in. Its group and deadline must be those it was added with.
func (d *deadlines) remove(e *entry) {
	if d.tree == nil {
		return
	}
	if _, ok := d.tree.Delete(e); ok && d.earliestOK && d.key(e) == d.earliest {
		d.earliestOK = false
	}
}

// from calls fn with the entries at or after (group, key, seq), in order, until fn returns false.
func (d *deadlines) from(group int, key int64, seq uint64, fn func(*entry) bool) {
	if d.tree == nil {
		return
	}
	d.pivotGroup, d.pivotKey, d.pivot.Seq = group, key, seq
	d.tree.AscendGreaterOrEqual(&d.pivot, fn)
}

// groups calls fn with the first entry of each group, in order, until fn returns false.
func (d *deadlines) groups(fn func(first *entry) bool) {
	if d.tree == nil {
		return
	}
	if d.group == nil {
		if first, ok := d.tree.Min(); ok {
			fn(first)
		}
		return
	}
	next := math.MinInt
	for {
		var first *entry
		d.from(next, math.MinInt64, 0, func(e *entry) bool {
			first = e
			return false
		})
		if first == nil || !fn(first) {
			return
		}
		g := d.groupOf(first)
		if g == math.MaxInt {
			return
		}
		next = g + 1
	}
}

// deadline is when e's deadline comes: its key plus offset, at most math.MaxInt64.
func (d *deadlines) deadline(e *entry) int64 { return d.shifted(d.key(e)) }

func (d *deadlines) shifted(key int64) int64 {
	if d.offset > 0 && key > math.MaxInt64-d.offset {
		return math.MaxInt64
	}
	return key + d.offset
}

// earliestKey returns the earliest key of every group, and false when d is empty.
func (d *deadlines) earliestKey() (int64, bool) {
	if d.Len() == 0 {
		return 0, false
	}
	if !d.earliestOK {
		d.earliest = math.MaxInt64
		d.groups(func(first *entry) bool {
			d.earliest = min(d.earliest, d.key(first))
			return true
		})
		d.earliestOK = true
	}
	return d.earliest, true
}

// due returns up to max entries whose deadline is at or before now, the earliest first whatever
// their group (a backlog of completed messages does not hold the errored ones back), without
// removing them.
func (d *deadlines) due(now int64, max int) []*entry {
	var out []*entry
	groups := 0
	d.groups(func(first *entry) bool {
		groups++
		g := d.groupOf(first)
		n := 0
		d.from(g, math.MinInt64, 0, func(e *entry) bool {
			if n == max || d.groupOf(e) != g || d.deadline(e) > now {
				return false
			}
			out = append(out, e)
			n++
			return true
		})
		return true
	})
	if groups > 1 {
		slices.SortStableFunc(out, func(a, b *entry) int { return cmp.Compare(d.key(a), d.key(b)) })
	}
	return out[:min(len(out), max)]
}

// ascend calls fn with d's entries in order (group, deadline, then Seq) until fn returns false.
func (d *deadlines) ascend(fn func(*entry) bool) {
	if d.tree != nil {
		d.tree.Ascend(fn)
	}
}

// arm (re)sets the timer for the earliest deadline; fire runs when it elapses.
func (d *deadlines) arm(clk clock.Clock, fire func()) {
	k, ok := d.earliestKey()
	if !ok {
		if d.timer != nil && d.armedAt != 0 {
			d.timer.Stop()
		}
		d.armedAt = 0
		return
	}
	at := max(d.shifted(k), d.notBefore)
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
