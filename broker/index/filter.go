package index

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
func (x *Index[T]) collect(f Filter, n int) []T {
	if len(f) == 0 {
		if x.exclusive {
			// free holds one message per free value, its best, so its
			// first n are exactly what n successive single pops return.
			return x.free.first(n)
		}
		return x.all.first(n)
	}
	s := x.smallest(f)
	if s == nil {
		return nil
	}
	if x.exclusive {
		x.nextEpoch()
	}
	var out []T
	s.ascend(func(e T) bool {
		it := e.IndexItem()
		if !it.matches(f) {
			return true
		}
		if x.exclusive {
			g := x.groups[it.Value]
			if g != nil {
				if g.held || g.mark == x.epoch {
					return true
				}
				g.mark = x.epoch
			}
		}
		if out == nil {
			out = make([]T, 0, min(n, s.len()))
		}
		out = append(out, e)
		return len(out) < n
	})
	return out
}

// nextEpoch starts a new Pop or Peek. When the counter wraps, marks left by
// calls 2^32 ago could equal the new epoch and wrongly skip a value, so every
// mark is cleared first: O(values) once per 2^32 filtered calls.
func (x *Index[T]) nextEpoch() {
	x.epoch++
	if x.epoch == 0 {
		for _, g := range x.groups {
			g.mark = 0
		}
		x.epoch = 1
	}
}
