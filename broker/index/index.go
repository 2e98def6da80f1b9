package index

// Index is the set of pending messages of one queue, ordered earliest
// deadline first. See the package documentation for its structure.
//
// The zero Index is an empty simple (non-exclusive) index. An Index is not
// safe for concurrent use, not even by readers alone: Peek records which
// values it has picked in the index itself.
type Index[T Elem] struct {
	cfg config[T]
	// all holds every pending message.
	all orderedSet[T]
	// pairs holds, for each metadata pair some pending message carries, the
	// messages carrying it. Empty sets are deleted so that a filter pair with
	// no entry here matches nothing.
	pairs map[Pair]*orderedSet[T]
	// pairsMost and groupsMost are the most entries pairs and groups held since Trim last copied
	// them.
	pairsMost, groupsMost int

	exclusive bool
	// groups holds, per exclusivity value, its pending messages and how many
	// times it is held. A value has an entry exactly when it has a pending
	// message or is held.
	groups map[string]*group[T]
	// free holds the best pending message of every value that is not full:
	// its minimum is the next message Pop returns without a filter.
	free orderedSet[T]
	// held counts the values held at least once; perValue is SetPerValue's
	// (0: 1).
	held, perValue int
	// epoch identifies one Pop or Peek that counts what it picks of each value
	// (a filtered one, or one whose values may give several): a group whose
	// mark equals it counts its picks in that call. It is 32 bits to keep groups
	// small; see nextEpoch for the wrap-around.
	epoch uint32

	// filters holds, for filters of several pairs that Pop or Peek was asked for, the pending
	// messages matching all of them (see collect). clock orders their use for eviction.
	filters map[string]*filterSet[T]
	byPair  map[Pair][]*filterSet[T] // filters' sets by their key pair
	clock   uint64
	// maxFilters and filterBudget replace the constants of the same names
	// when non-zero (tests).
	maxFilters, filterBudget int
	// filterWalk bounds how many messages a filter of several pairs without a set of its own may
	// walk past before it gets one (0: defaultFilterWalk); see collect.
	filterWalk int

	// ascending counts Ascend calls in progress. While it is non-zero the
	// sets are being iterated, so Add, Remove and Pop refuse to run rather
	// than corrupt the iteration.
	ascending int
}

// New returns an empty index. exclusive reports whether the queue is
// exclusive: then at most PerValue messages (1 unless SetPerValue says more)
// per exclusivity Value may be leased at a time, and values can be held.
func New[T Elem](exclusive bool) *Index[T] {
	x := &Index[T]{exclusive: exclusive}
	x.init()
	return x
}

func (x *Index[T]) init() {
	if x.pairs == nil {
		x.cfg.init()
		x.pairs = make(map[Pair]*orderedSet[T])
		if x.exclusive {
			x.groups = make(map[string]*group[T])
		}
	}
}

// Add inserts a pending message. It returns false, changing nothing, if e is
// already in the index, if another element has the same (Priority, Seq), if
// e is the zero T, or if called from an Ascend callback.
func (x *Index[T]) Add(e T) bool {
	it := item(e)
	if it == nil || x.ascending > 0 {
		return false
	}
	x.init()
	if !x.all.insert(&x.cfg, e) {
		return false
	}
	for _, p := range it.Meta() {
		s := x.pairs[p]
		if s == nil {
			s = new(orderedSet[T])
			x.pairs[p] = s
		}
		s.insert(&x.cfg, e)
	}
	if len(x.byPair) > 0 {
		for _, p := range it.Meta() {
			for _, fs := range x.byPair[p] {
				if it.matches(fs.f) {
					fs.set.insert(&x.cfg, e)
				}
			}
		}
	}
	if x.exclusive {
		x.addToGroup(e, it)
	}
	return true
}

// Remove removes a pending message (cancel, garbage collection, recovery). It
// returns false if e is not in the index or if called from an Ascend
// callback. Removing a message does not hold or release its value.
func (x *Index[T]) Remove(e T) bool {
	it := item(e)
	if it == nil || x.ascending > 0 || !x.all.delete(&x.cfg, e) {
		return false
	}
	x.unlink(e, it)
	return true
}

// unlink removes e, already deleted from all, from the pair and value sets.
func (x *Index[T]) unlink(e T, it *Item) {
	for _, p := range it.Meta() {
		if s := x.pairs[p]; s != nil && s.delete(&x.cfg, e) && s.len() == 0 {
			delete(x.pairs, p)
			x.pairs = Trim(x.pairs, &x.pairsMost)
		}
	}
	if len(x.byPair) > 0 {
		for _, p := range it.Meta() {
			for _, fs := range x.byPair[p] {
				if it.matches(fs.f) {
					fs.set.delete(&x.cfg, e)
				}
			}
		}
	}
	if x.exclusive {
		x.removeFromGroup(e, it)
	}
}

// Contains reports whether e is in the index. It costs O(log n).
func (x *Index[T]) Contains(e T) bool {
	if item(e) == nil {
		return false
	}
	got, ok := x.all.get(e)
	return ok && got == e
}

// Len returns the number of pending messages, those of held values included.
func (x *Index[T]) Len() int { return x.all.len() }

// Pop removes and returns up to n eligible messages in EDF order: ascending
// (Priority, Seq), matching f, and in an exclusive index only messages whose
// Value is not full. Each returned message's Value is held once more: a
// batch takes as many messages of a value as it has room for, up to PerValue
// holds. It returns nil if n <= 0, if nothing is eligible, or if called from
// an Ascend callback.
func (x *Index[T]) Pop(f Filter, n int) []T {
	if n <= 0 || x.ascending > 0 {
		return nil
	}
	out := x.collect(f, n)
	for _, e := range out {
		it := e.IndexItem()
		if x.exclusive {
			// Holding first takes a value that becomes full out of free,
			// so removing its head below need not promote the next
			// message only to withdraw it again.
			x.Hold(it.Value())
		}
		x.all.delete(&x.cfg, e)
		x.unlink(e, it)
	}
	return out
}

// Peek returns the messages Pop(f, n) would return, in the same order,
// without removing or holding anything.
func (x *Index[T]) Peek(f Filter, n int) []T {
	if n <= 0 {
		return nil
	}
	return x.collect(f, n)
}

// Count returns how many pending messages match f, those of held values
// included. It is O(1) for an empty or single-pair filter and otherwise walks
// the smallest set among f's pairs.
func (x *Index[T]) Count(f Filter) int {
	if len(f) == 0 {
		return x.Len()
	}
	s := x.smallest(f)
	if s == nil {
		return 0
	}
	if len(f) == 1 {
		return s.len()
	}
	n := 0
	s.ascend(func(e T) bool {
		if e.IndexItem().matches(f) {
			n++
		}
		return true
	})
	return n
}

// AscendAfter is Ascend from the first message after pivot in EDF order
// (pivot need not be in the index; only its Priority and Seq count): a
// listing's next page costs O(log n), not a walk past the pages before it.
func (x *Index[T]) AscendAfter(f Filter, pivot T, fn func(T) bool) {
	if fn == nil {
		return
	}
	x.ascending++
	defer func() { x.ascending-- }()
	if len(f) == 0 {
		x.all.ascendAfter(pivot, fn)
		return
	}
	s := x.smallest(f)
	if s == nil {
		return
	}
	s.ascendAfter(pivot, func(e T) bool {
		return !e.IndexItem().matches(f) || fn(e)
	})
}

// Ascend calls fn for the pending messages matching f, those of held values
// included, in EDF order until fn returns false. fn may call the read-only
// methods and Hold and Release; Add, Remove and Pop called from fn do nothing
// and report failure.
func (x *Index[T]) Ascend(f Filter, fn func(T) bool) {
	if fn == nil {
		return
	}
	x.ascending++
	defer func() { x.ascending-- }()
	if len(f) == 0 {
		x.all.ascend(fn)
		return
	}
	s := x.smallest(f)
	if s == nil {
		return
	}
	s.ascend(func(e T) bool {
		return !e.IndexItem().matches(f) || fn(e)
	})
}
