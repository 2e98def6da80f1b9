package index

import (
	"cmp"
	"fmt"
	"slices"
)

// rec is the test element: a record embedding Item, as the broker does.
type rec struct {
	Item
	name string
}

func (r *rec) IndexItem() *Item { return &r.Item }

func (r *rec) String() string { return r.name }

// checkSet verifies s's representation and order and returns its elements.
func checkSet[T Elem](c *config[T], s *orderedSet[T]) ([]T, error) {
	var zero T
	if s.head == zero && s.rest != nil {
		return nil, fmt.Errorf("empty set has a tail")
	}
	if t := s.rest; t != nil {
		if t.len() == 0 {
			return nil, fmt.Errorf("empty tail kept")
		}
		if t.big != nil {
			if t.small != nil {
				return nil, fmt.Errorf("tail uses both slice and tree")
			}
			if t.big.Len() <= c.smallMax/4 {
				return nil, fmt.Errorf("tree of %d elements should have shrunk (smallMax %d)", t.big.Len(), c.smallMax)
			}
		} else if len(t.small) > c.smallMax {
			return nil, fmt.Errorf("slice of %d elements exceeds smallMax %d", len(t.small), c.smallMax)
		}
	}
	var out []T
	s.ascend(func(e T) bool {
		out = append(out, e)
		return true
	})
	if len(out) != s.len() {
		return nil, fmt.Errorf("set len %d, ascended %d", s.len(), len(out))
	}
	for i, e := range out {
		if e == zero {
			return nil, fmt.Errorf("zero element stored")
		}
		if i > 0 && !less(out[i-1], e) {
			return nil, fmt.Errorf("set out of order at %d", i)
		}
	}
	return out, nil
}

// check verifies every invariant of the index against its own contents.
func (x *Index[T]) check() error {
	all, err := checkSet(&x.cfg, &x.all)
	if err != nil {
		return fmt.Errorf("all: %w", err)
	}
	in := make(map[T]bool, len(all))
	for _, e := range all {
		in[e] = true
	}
	for key, fs := range x.filters {
		got, err := checkSet(&x.cfg, &fs.set)
		if err != nil {
			return fmt.Errorf("filter %s: %w", key, err)
		}
		want := 0
		for _, e := range all {
			if e.IndexItem().matches(fs.f) {
				want++
				if g, ok := fs.set.get(e); !ok || g != e {
					return fmt.Errorf("filter %s set lacks a matching element", key)
				}
			}
		}
		if len(got) != want {
			return fmt.Errorf("filter %s set has %d elements, %d match", key, len(got), want)
		}
	}
	if limit := cmp.Or(x.maxFilters, maxFilters); len(x.filters) > limit {
		return fmt.Errorf("%d filter sets, at most %d", len(x.filters), limit)
	}
	keyed := 0
	for p, sets := range x.byPair {
		if len(sets) == 0 {
			return fmt.Errorf("pair %v keys no filter set, yet is listed", p)
		}
		for _, fs := range sets {
			keyed++
			if fs.key != p || x.filters[filterKey(fs.f)] != fs || !slices.Contains(fs.f, p) {
				return fmt.Errorf("pair %v keys a filter set it should not (%v)", p, fs.f)
			}
		}
	}
	if keyed != len(x.filters) {
		return fmt.Errorf("%d filter sets keyed, %d kept", keyed, len(x.filters))
	}
	wantPairs := 0
	for _, e := range all {
		for _, p := range e.IndexItem().Meta() {
			wantPairs++
			s := x.pairs[p]
			if s == nil {
				return fmt.Errorf("no set for pair %v", p)
			}
			if got, ok := s.get(e); !ok || got != e {
				return fmt.Errorf("pair %v set lacks an element", p)
			}
		}
	}
	gotPairs := 0
	for p, s := range x.pairs {
		es, err := checkSet(&x.cfg, s)
		if err != nil {
			return fmt.Errorf("pair %v: %w", p, err)
		}
		if len(es) == 0 {
			return fmt.Errorf("pair %v: empty set kept", p)
		}
		for _, e := range es {
			if !in[e] || !e.IndexItem().has(p) {
				return fmt.Errorf("pair %v: stray element", p)
			}
		}
		gotPairs += len(es)
	}
	if gotPairs != wantPairs {
		return fmt.Errorf("pair sets hold %d slots, want %d", gotPairs, wantPairs)
	}
	if !x.exclusive {
		if x.groups != nil || x.free.len() != 0 || x.held != 0 {
			return fmt.Errorf("simple index has exclusive state")
		}
		return nil
	}
	free, err := checkSet(&x.cfg, &x.free)
	if err != nil {
		return fmt.Errorf("free: %w", err)
	}
	inFree := make(map[T]bool, len(free))
	for _, e := range free {
		inFree[e] = true
	}
	total, held, wantFree := 0, 0, 0
	for v, g := range x.groups {
		es, err := checkSet(&x.cfg, &g.set)
		if err != nil {
			return fmt.Errorf("group %q: %w", v, err)
		}
		if len(es) == 0 && g.held == 0 {
			return fmt.Errorf("group %q: empty and not held but kept", v)
		}
		if g.held < 0 {
			return fmt.Errorf("group %q: held %d times", v, g.held)
		}
		for _, e := range es {
			if !in[e] || e.IndexItem().Value() != v {
				return fmt.Errorf("group %q: stray element", v)
			}
		}
		total += len(es)
		if g.held > 0 {
			held++
		}
		if !x.full(g) && len(es) > 0 {
			wantFree++
			if !inFree[es[0]] {
				return fmt.Errorf("group %q: head not in free", v)
			}
		}
	}
	if total != len(all) {
		return fmt.Errorf("groups hold %d elements, want %d", total, len(all))
	}
	if held != x.held {
		return fmt.Errorf("held count %d, want %d", x.held, held)
	}
	if wantFree != len(free) {
		return fmt.Errorf("free holds %d, want %d", len(free), wantFree)
	}
	return nil
}
