package index

import (
	"slices"

	"github.com/google/btree"
)

const (
	// defaultSmallMax is the largest tail kept as a sorted slice. Below it a
	// slice costs 8 bytes per element and no tree header, and shifting up to
	// 64 pointers is cheaper than a tree descent.
	defaultSmallMax = 64
	// defaultDegree is the B-tree degree once a tail outgrows the slice.
	defaultDegree = 32
	// freeListSize bounds the spare B-tree nodes an index keeps for reuse.
	freeListSize = 64
	// minShrinkCap is the slice capacity below which a small tail is never
	// reallocated to give memory back.
	minShrinkCap = 8
)

// config is shared by all sets of one index.
type config[T Elem] struct {
	smallMax int // a tail holding more than smallMax elements is a B-tree
	degree   int
	nodes    *btree.FreeListG[T] // shared so nodes freed by one set feed another
}

func (c *config[T]) init() {
	if c.nodes == nil {
		c.smallMax = defaultSmallMax
		c.degree = defaultDegree
		c.nodes = btree.NewFreeListG[T](freeListSize)
	}
}

// orderedSet is a set of elements in EDF order. Its minimum is kept inline
// and the rest in a separately allocated tail, so the many sets that hold a
// single element (a metadata pair or exclusivity value carried by one pending
// message) cost 16 bytes and no further allocation, and the minimum, which
// Pop wants, is at hand without a tree descent.
//
// Invariants: head is the zero T exactly when the set is empty; rest is nil
// or non-empty; every element of rest is greater than head.
type orderedSet[T Elem] struct {
	head T
	rest *tail[T]
}

func (s *orderedSet[T]) len() int {
	var zero T
	switch {
	case s.head == zero:
		return 0
	case s.rest == nil:
		return 1
	}
	return 1 + s.rest.len()
}

func (s *orderedSet[T]) min() (T, bool) {
	var zero T
	return s.head, s.head != zero
}

// insert adds e. It refuses, returning false and leaving the set unchanged,
// if an element with e's key is already present: keys are unique, so that is
// either e itself or a caller error that must not evict the other element.
func (s *orderedSet[T]) insert(c *config[T], e T) bool {
	var zero T
	if s.head == zero {
		s.head = e
		return true
	}
	if s.rest == nil {
		s.rest = new(tail[T])
	}
	if less(e, s.head) {
		// The old head is below all of rest, so this insert cannot collide.
		s.rest.insert(c, s.head)
		s.head = e
		return true
	}
	if !less(s.head, e) || !s.rest.insert(c, e) {
		if s.rest.len() == 0 {
			s.rest = nil
		}
		return false
	}
	return true
}

// delete removes e itself; an element that merely has e's key is left alone.
func (s *orderedSet[T]) delete(c *config[T], e T) bool {
	var zero T
	switch {
	case s.head == zero:
		return false
	case s.head == e:
		if s.rest == nil {
			s.head = zero
			return true
		}
		s.head = s.rest.popMin(c)
	case s.rest == nil || !s.rest.delete(c, e):
		return false
	}
	if s.rest.len() == 0 {
		s.rest = nil
	}
	return true
}

// get returns the element with e's key.
func (s *orderedSet[T]) get(e T) (T, bool) {
	var zero T
	switch {
	case s.head == zero:
		return zero, false
	case !less(e, s.head) && !less(s.head, e):
		return s.head, true
	case s.rest == nil:
		return zero, false
	}
	return s.rest.get(e)
}

// ascend calls fn in EDF order until it returns false. fn must not modify s.
func (s *orderedSet[T]) ascend(fn func(T) bool) {
	var zero T
	if s.head == zero || !fn(s.head) || s.rest == nil {
		return
	}
	s.rest.ascend(fn)
}

// ascendAfter is ascend from the first element greater than pivot.
func (s *orderedSet[T]) ascendAfter(pivot T, fn func(T) bool) {
	var zero T
	if s.head == zero {
		return
	}
	if less(pivot, s.head) && !fn(s.head) {
		return
	}
	if s.rest != nil {
		s.rest.ascendAfter(pivot, fn)
	}
}

// after returns the least element greater than e, which need not be in s.
func (s *orderedSet[T]) after(e T) (next T, ok bool) {
	s.ascendAfter(e, func(x T) bool {
		next, ok = x, true
		return false
	})
	return next, ok
}

// first returns up to n elements in EDF order; nil if there are none.
func (s *orderedSet[T]) first(n int) []T {
	n = min(n, s.len())
	if n <= 0 {
		return nil
	}
	out := make([]T, 0, n)
	s.ascend(func(e T) bool {
		out = append(out, e)
		return len(out) < n
	})
	return out
}

// tail holds the elements of an orderedSet after its head. It is a sorted
// slice (small) while it has at most smallMax elements and a B-tree (big)
// above that; it only turns back into a slice at smallMax/4 so that a set
// hovering around the threshold does not convert on every operation. Exactly
// one of small and big is in use: big != nil means big.
type tail[T Elem] struct {
	small []T
	big   *btree.BTreeG[T]
}

func (t *tail[T]) len() int {
	if t.big != nil {
		return t.big.Len()
	}
	return len(t.small)
}

// search returns the position of the first element of small not less than e.
func (t *tail[T]) search(e T) int {
	lo, hi := 0, len(t.small)
	for lo < hi {
		m := int(uint(lo+hi) >> 1)
		if less(t.small[m], e) {
			lo = m + 1
		} else {
			hi = m
		}
	}
	return lo
}

// insert is orderedSet.insert for the tail.
func (t *tail[T]) insert(c *config[T], e T) bool {
	if t.big == nil {
		i := t.search(e)
		if i < len(t.small) && !less(e, t.small[i]) {
			return false
		}
		if len(t.small) < c.smallMax {
			t.small = slices.Insert(t.small, i, e)
			return true
		}
		t.grow(c)
	}
	old, had := t.big.ReplaceOrInsert(e)
	if had {
		t.big.ReplaceOrInsert(old)
		return false
	}
	return true
}

// delete is orderedSet.delete for the tail.
func (t *tail[T]) delete(c *config[T], e T) bool {
	if t.big != nil {
		old, ok := t.big.Delete(e)
		if !ok {
			return false
		}
		if old != e {
			t.big.ReplaceOrInsert(old)
			return false
		}
	} else {
		i := t.search(e)
		if i == len(t.small) || t.small[i] != e {
			return false
		}
		t.small = slices.Delete(t.small, i, i+1)
	}
	t.shrink(c)
	return true
}

// popMin removes and returns the minimum; the tail must not be empty.
func (t *tail[T]) popMin(c *config[T]) T {
	var e T
	if t.big != nil {
		e, _ = t.big.DeleteMin()
	} else {
		e = t.small[0]
		t.small = slices.Delete(t.small, 0, 1)
	}
	t.shrink(c)
	return e
}

func (t *tail[T]) get(e T) (T, bool) {
	if t.big != nil {
		return t.big.Get(e)
	}
	i := t.search(e)
	if i < len(t.small) && !less(e, t.small[i]) {
		return t.small[i], true
	}
	var zero T
	return zero, false
}

// ascendAfter is orderedSet.ascendAfter for the tail.
func (t *tail[T]) ascendAfter(pivot T, fn func(T) bool) {
	if t.big != nil {
		t.big.AscendGreaterOrEqual(pivot, func(x T) bool {
			return !less(pivot, x) || fn(x) // an element of pivot's key is not after it
		})
		return
	}
	for i := t.search(pivot); i < len(t.small); i++ {
		if less(pivot, t.small[i]) && !fn(t.small[i]) {
			return
		}
	}
}

func (t *tail[T]) ascend(fn func(T) bool) {
	if t.big != nil {
		t.big.Ascend(fn)
		return
	}
	for _, e := range t.small {
		if !fn(e) {
			return
		}
	}
}

func (t *tail[T]) grow(c *config[T]) {
	b := btree.NewWithFreeListG(c.degree, less[T], c.nodes)
	for _, e := range t.small {
		b.ReplaceOrInsert(e)
	}
	t.small, t.big = nil, b
}

// shrink gives memory back after a removal: a tree that fell to smallMax/4
// becomes a slice, and a slice using a quarter of its capacity is
// reallocated.
func (t *tail[T]) shrink(c *config[T]) {
	if t.big != nil {
		if t.big.Len() > c.smallMax/4 {
			return
		}
		small := make([]T, 0, max(t.big.Len(), c.smallMax/2))
		t.big.Ascend(func(e T) bool {
			small = append(small, e)
			return true
		})
		t.big.Clear(true)
		t.small, t.big = small, nil
	}
	switch n := len(t.small); {
	case n == 0:
		t.small = nil
	case cap(t.small) > minShrinkCap && n*4 <= cap(t.small):
		t.small = append(make([]T, 0, 2*n), t.small...)
	}
}
