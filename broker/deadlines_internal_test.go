package broker

import (
	"cmp"
	"math/rand/v2"
	"slices"
	"testing"
)

// TestDeadlinesAscend: ascend gives a heap's entries in the order of their deadlines, ties by Seq,
// whatever the heap's shape (many ties, entries removed), and stops where its function says.
func TestDeadlinesAscend(t *testing.T) {
	rng := rand.New(rand.NewPCG(1, 2))
	for round := range 200 {
		d := &deadlines{key: func(e *entry) int64 { return e.EnqueuedAt }}
		n := rng.IntN(300)
		var all []*entry
		for i := range n {
			e := &entry{EnqueuedAt: int64(rng.IntN(1 + n/4)), heapIdx: -1} // about four per deadline
			e.Seq = uint64(rng.IntN(1_000_000))*1000 + uint64(i)           // distinct, in no order
			d.add(e)
			all = append(all, e)
		}
		for _, e := range all[:len(all)/5] {
			d.remove(e)
		}
		want := slices.Clone(all[len(all)/5:])
		slices.SortFunc(want, func(a, b *entry) int {
			return cmp.Or(cmp.Compare(a.EnqueuedAt, b.EnqueuedAt), cmp.Compare(a.Seq, b.Seq))
		})
		var got []*entry
		d.ascend(func(e *entry) bool {
			got = append(got, e)
			return true
		})
		if !slices.Equal(got, want) {
			t.Fatalf("round %d: ascend gave %d entries out of order (or not all of %d)", round, len(got), len(want))
		}
		if len(want) == 0 {
			continue
		}
		stop := rng.IntN(len(want))
		got = got[:0]
		d.ascend(func(e *entry) bool {
			got = append(got, e)
			return len(got) <= stop
		})
		if !slices.Equal(got, want[:stop+1]) {
			t.Fatalf("round %d: ascend stopped after %d entries, want the first %d", round, len(got), stop+1)
		}
	}
}

// TestDeadlinesFirst: first gives the first n entries a function keeps, in ascend's order, whether
// they are many (the walk from the root) or few (the scan past the walk's budget).
func TestDeadlinesFirst(t *testing.T) {
	rng := rand.New(rand.NewPCG(5, 6))
	for round := range 300 {
		d := &deadlines{key: func(e *entry) int64 { return e.EnqueuedAt }}
		size := rng.IntN(2000)
		for i := range size {
			e := &entry{EnqueuedAt: int64(rng.IntN(1 + size/3)), Attempts: uint16(rng.IntN(100)), heapIdx: -1}
			e.Seq = uint64(rng.IntN(1_000_000))*10_000 + uint64(i)
			d.add(e)
		}
		every := 1 + rng.IntN(200) // keep one entry in every
		keep := func(e *entry) bool { return int(e.Attempts)%every == 0 }
		n := 1 + rng.IntN(60)
		var want []*entry
		for _, e := range d.items {
			if keep(e) {
				want = append(want, e)
			}
		}
		slices.SortFunc(want, d.compare)
		want = want[:min(n, len(want))]
		if got := d.first(n, keep); !slices.Equal(got, want) {
			t.Fatalf("round %d (%d entries, one kept in %d, first %d): got %d entries, not the %d first in order", round, size, every, n, len(got), len(want))
		}
	}
}

// BenchmarkDeadlinesFirst51 compares what a browse of the first 50 entries (and one for "more")
// of a heap of a million costs: first against the sort that browse used to make, of every entry
// when all match, of the matches when few do.
func BenchmarkDeadlinesFirst51(b *testing.B) {
	d := &deadlines{key: func(e *entry) int64 { return e.EnqueuedAt }}
	rng := rand.New(rand.NewPCG(3, 4))
	for i := range 1_000_000 {
		e := &entry{EnqueuedAt: int64(rng.IntN(1_000_000)), heapIdx: -1}
		e.Seq = uint64(i)
		d.add(e)
	}
	b.Run("first", func(b *testing.B) {
		for b.Loop() {
			d.first(51, func(*entry) bool { return true })
		}
	})
	// One entry in 20,000 kept (50 of the million): the walk gives up, and the scan takes over.
	sparse := func(e *entry) bool { return e.Seq%20_000 == 0 }
	b.Run("first-sparse", func(b *testing.B) {
		for b.Loop() {
			d.first(51, sparse)
		}
	})
	b.Run("sort-sparse", func(b *testing.B) {
		for b.Loop() {
			var found []*entry
			for _, e := range d.items {
				if sparse(e) {
					found = append(found, e)
				}
			}
			slices.SortFunc(found, d.compare)
		}
	})
	b.Run("sort", func(b *testing.B) {
		for b.Loop() {
			found := slices.Clone(d.items)
			slices.SortFunc(found, func(a, b *entry) int {
				return cmp.Or(cmp.Compare(d.key(a), d.key(b)), cmp.Compare(a.Seq, b.Seq))
			})
			_ = found[:51]
		}
	})
}

// TestDeadlinesGiveBackTheirRoom: a heap that held a backlog gives its array's room back as it
// drains, and keeps its order and its entries' places meanwhile.
func TestDeadlinesGiveBackTheirRoom(t *testing.T) {
	rng := rand.New(rand.NewPCG(3, 4))
	d := &deadlines{key: func(e *entry) int64 { return e.EnqueuedAt }}
	const n = 20_000
	all := make([]*entry, n)
	for i := range all {
		all[i] = &entry{EnqueuedAt: int64(rng.IntN(n)), heapIdx: -1}
		d.add(all[i])
	}
	peak := cap(d.items)
	for _, e := range all[:n-100] { // removed out of order, as leases settle
		d.remove(e)
	}
	if cap(d.items) >= 2048 {
		t.Fatalf("%d entries left in an array of %d, %d at the peak", len(d.items), cap(d.items), peak)
	}
	for i, e := range d.items {
		if int(e.heapIdx) != i {
			t.Fatalf("entry at %d says it is at %d", i, e.heapIdx)
		}
	}
	last := int64(-1)
	for len(d.items) > 0 {
		e := d.items[0]
		d.remove(e)
		if e.EnqueuedAt < last {
			t.Fatalf("the heap gave %d after %d", e.EnqueuedAt, last)
		}
		last = e.EnqueuedAt
	}
}
