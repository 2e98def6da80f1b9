package index

import (
	"cmp"
	"slices"
	"strconv"
	"strings"
)

// smallest returns the smallest of the sets of f's pairs, or nil if some
// pair of f is carried by no pending message (then nothing can match). f must
// not be empty.
//
// Walking the smallest set and checking the other pairs on each element keeps
// one set per pair rather than one per combination of pairs, at the price of
// visiting elements of that set that fail the other pairs.
func (x *Index[T]) smallest(f Filter) *orderedSet[T] {
	var best *orderedSet[T]
	for _, p := range f {
		s := x.pairs[p]
		if s == nil {
			return nil
		}
		if best == nil || s.len() < best.len() {
			best = s
		}
	}
	return best
}

// collect returns, without changing any set, the up to n messages Pop(f, n)
// returns; n > 0.
//
// A filter of several pairs walks the set of its own (buildFilterSet) once it
// has one. Until then it walks the smallest of its pairs' sets, which is
// cheap while the matches it wants come early there; once a walk passes
// filterWalk messages before it has them, the filter gets its set (built by
// one walk of the whole smallest set), kept up to date from then on. So a
// filter asked for once, or whose matches come early, costs no set, however
// many such filters there are, and one asked for again and again (a
// worker's), whose walks grow as the matches at their front are taken, costs
// one; up to maxFilters are kept (more than that asked again and again would
// take turns at the sets, each rebuilt at its turn).
func (x *Index[T]) collect(f Filter, n int) []T {
	if len(f) == 0 {
		if x.exclusive {
			return x.collectFree(n)
		}
		return x.all.first(n)
	}
	s := x.smallest(f)
	if s == nil {
		return nil
	}
	if len(f) == 1 {
		out, _ := x.walk(f, s, n, 0)
		return out
	}
	key := filterKey(f)
	if fs := x.keptSet(key); fs != nil {
		out, _ := x.walk(f, fs, n, 0)
		return out
	}
	if out, ok := x.walk(f, s, n, cmp.Or(x.filterWalk, defaultFilterWalk)); ok {
		return out
	}
	out, _ := x.walk(f, x.buildFilterSet(key, f, s), n, 0)
	return out
}

// defaultFilterWalk is how many messages of the smallest of its pairs' sets a
// filter of several pairs may walk past without a set of its own: at most
// some tens of microseconds.
const defaultFilterWalk = 1024

// walk returns the first n eligible messages of s matching f, in order, and
// true; or, when budget > 0 and it passes more than budget messages of s
// before it has them (and before s ends), nil and false.
func (x *Index[T]) walk(f Filter, s *orderedSet[T], n, budget int) ([]T, bool) {
	if x.exclusive {
		x.nextEpoch() // what an abandoned walk picked does not count
	}
	var out []T
	complete, seen := true, 0
	s.ascend(func(e T) bool {
		if seen++; budget > 0 && seen > budget {
			complete = false
			return false
		}
		it := e.IndexItem()
		if !it.matches(f) {
			return true
		}
		if x.exclusive {
			if g := x.groups[it.Value()]; g != nil {
				if !x.roomFor(g) {
					return true // full, or as many picked as it has room for
				}
				x.pick(g)
			}
		}
		if out == nil {
			out = make([]T, 0, min(n, s.len()))
		}
		out = append(out, e)
		return len(out) < n
	})
	if !complete {
		return nil, false
	}
	return out, true
}

// collectFree returns the first n eligible messages of an exclusive index,
// without a filter. free holds the best message of every value that is not
// full, so with one message per value its first n are the answer. A value with
// room for more may give several, but only the values of free's first n can:
// any other value's messages come after those n better ones. So the messages
// come from a merge of those values' messages in EDF order, each value's as
// many as it has room for: a heap of each value's next message, free's first
// n to begin with (sorted, so a heap already), and, when a value's message is
// taken, its next one if it has room left.
func (x *Index[T]) collectFree(n int) []T {
	h := x.free.first(n)
	if x.PerValue() == 1 || n == 1 || len(h) == 0 {
		return h
	}
	x.nextEpoch()
	out := make([]T, 0, n)
	for len(out) < n && len(h) > 0 {
		e := h[0]
		out = append(out, e)
		g := x.groups[e.IndexItem().Value()]
		x.pick(g)
		var next T
		ok := x.roomFor(g)
		if ok {
			next, ok = g.set.after(e)
		}
		if ok {
			h[0] = next
		} else {
			h[0] = h[len(h)-1]
			h = h[:len(h)-1]
		}
		siftDown(h, 0)
	}
	return out
}

// pick counts one more message of g picked by the current call (epoch).
func (x *Index[T]) pick(g *group[T]) {
	if g.mark != x.epoch {
		g.mark, g.picked = x.epoch, 0
	}
	g.picked++
}

// roomFor reports whether g may give the current call one more message: its
// holds and what the call picked of it are fewer than PerValue.
func (x *Index[T]) roomFor(g *group[T]) bool {
	picked := 0
	if g.mark == x.epoch {
		picked = int(g.picked)
	}
	return g.held+picked < x.PerValue()
}

// siftDown restores the min-heap order of h below i, whose element may be
// greater than its children's.
func siftDown[T Elem](h []T, i int) {
	for {
		m := 2*i + 1
		if m >= len(h) {
			return
		}
		if r := m + 1; r < len(h) && less(h[r], h[m]) {
			m = r
		}
		if !less(h[m], h[i]) {
			return
		}
		h[i], h[m] = h[m], h[i]
		i = m
	}
}

// nextEpoch starts a new Pop or Peek. When the counter wraps, marks left by
// calls 2^32 ago could equal the new epoch and wrongly skip a value, so every
// mark is cleared first: O(values) once per 2^32 calls that count picks.
func (x *Index[T]) nextEpoch() {
	x.epoch++
	if x.epoch == 0 {
		for _, g := range x.groups {
			g.mark = 0
		}
		x.epoch = 1
	}
}

// maxFilters bounds how many multi-pair filters keep a set of their own, and
// minFilterBudget, with the number of pending messages, how many messages
// those sets hold in all: the least recently used sets go first. A set is
// kept up to date only by the messages carrying its key, one of its filter's
// pairs, so that many sets cost an add or a removal little more than a few.
const (
	maxFilters      = 1024
	minFilterBudget = 1 << 16
)

// filterSet is the set of pending messages matching every pair of a filter of several pairs.
type filterSet[T Elem] struct {
	f    Filter
	key  Pair // the pair of f whose messages were the fewest when the set was built
	set  orderedSet[T]
	used uint64
}

// keptSet returns the set kept for the filter whose filterKey is key, or nil if
// it has none.
func (x *Index[T]) keptSet(key string) *orderedSet[T] {
	fs := x.filters[key]
	if fs == nil {
		return nil
	}
	x.clock++
	fs.used = x.clock
	return &fs.set
}

// buildFilterSet gives f, whose filterKey is key, a set of its own: the
// pending messages matching f, found in smallest, the smallest of its pairs'
// sets. It is kept up to date on every Add and removal of a message carrying
// that pair after that (every message matching f does); the least recently
// used sets go when more than maxFilters are kept, or they hold more than
// the budget.
func (x *Index[T]) buildFilterSet(key string, f Filter, smallest *orderedSet[T]) *orderedSet[T] {
	if x.filters == nil {
		x.filters = make(map[string]*filterSet[T])
		x.byPair = make(map[Pair][]*filterSet[T])
	}
	x.clock++
	fs := &filterSet[T]{f: append(Filter(nil), f...), used: x.clock}
	fs.key = f[0] // any of f's pairs would do: every message matching f carries them all
	for _, p := range f {
		if x.pairs[p] == smallest {
			fs.key = p
			break
		}
	}
	smallest.ascend(func(e T) bool {
		if e.IndexItem().matches(f) {
			fs.set.insert(&x.cfg, e)
		}
		return true
	})
	x.filters[key] = fs
	x.byPair[fs.key] = append(x.byPair[fs.key], fs)
	x.evictFilters(fs)
	return &fs.set
}

// evictFilters drops the least recently used filter sets but keep while more
// than maxFilters are kept, or while they hold more messages in all than the
// budget: the pending messages, or minFilterBudget if more.
func (x *Index[T]) evictFilters(keep *filterSet[T]) {
	limit, budget := cmp.Or(x.maxFilters, maxFilters), max(x.all.len(), cmp.Or(x.filterBudget, minFilterBudget))
	total := 0
	for _, fs := range x.filters {
		total += fs.set.len()
	}
	for len(x.filters) > 1 && (len(x.filters) > limit || total > budget) {
		var oldest *filterSet[T]
		var oldestKey string
		for k, fs := range x.filters {
			if fs != keep && (oldest == nil || fs.used < oldest.used) {
				oldest, oldestKey = fs, k
			}
		}
		total -= oldest.set.len()
		delete(x.filters, oldestKey)
		x.byPair[oldest.key] = slices.DeleteFunc(x.byPair[oldest.key], func(fs *filterSet[T]) bool { return fs == oldest })
		if len(x.byPair[oldest.key]) == 0 {
			delete(x.byPair, oldest.key)
		}
	}
}

// filterKey identifies a filter whatever the order of its pairs.
func filterKey(f Filter) string {
	parts := make([]string, len(f))
	for i, p := range f {
		parts[i] = strconv.Itoa(len(p.Key)) + ":" + p.Key + "=" + strconv.Itoa(len(p.Value)) + ":" + p.Value
	}
	slices.Sort(parts)
	return strings.Join(parts, ",")
}
