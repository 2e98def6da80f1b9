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

// BenchmarkDeadlinesFirst51 compares what a browse of the first 50 entries (and one for "more")
// of a heap of a million costs: ascend against the sort of every entry that browse used to make.
func BenchmarkDeadlinesFirst51(b *testing.B) {
	d := &deadlines{key: func(e *entry) int64 { return e.EnqueuedAt }}
	rng := rand.New(rand.NewPCG(3, 4))
	for i := range 1_000_000 {
		e := &entry{EnqueuedAt: int64(rng.IntN(1_000_000)), heapIdx: -1}
		e.Seq = uint64(i)
		d.add(e)
	}
	b.Run("ascend", func(b *testing.B) {
		for b.Loop() {
			n := 0
			d.ascend(func(*entry) bool { n++; return n < 51 })
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
