package broker

import (
	"cmp"
	"math"
	"math/rand/v2"
	"slices"
	"testing"
)

// sortKeys must order like a stable comparison sort, for any spread of priorities and sequences.
func TestSortKeysMatchesStableSort(t *testing.T) {
	t.Parallel()
	r := rand.New(rand.NewPCG(1, 2))
	gens := map[string]func(i int) (int64, uint64){
		"a day of deadlines": func(i int) (int64, uint64) {
			return 1_767_225_600_000 + r.Int64N(86_400_000), uint64(i + 1)
		},
		"one priority, FIFO": func(i int) (int64, uint64) { return 0, uint64(r.IntN(1 << 20)) },
		"full range": func(int) (int64, uint64) {
			return int64(r.Uint64()), r.Uint64()
		},
		"extremes and duplicates": func(int) (int64, uint64) {
			ps := []int64{math.MinInt64, -1, 0, 1, math.MaxInt64}
			ss := []uint64{0, 1, math.MaxUint64}
			return ps[r.IntN(len(ps))], ss[r.IntN(len(ss))]
		},
	}
	for name, gen := range gens {
		for _, n := range []int{0, 1, 100, 1<<radixBits - 1, 1 << radixBits, 50_000} {
			keys := make([]pendingKey, n)
			for i := range keys {
				p, s := gen(i)
				keys[i] = pendingKey{priority: p, seq: s, e: &entry{}}
			}
			want := slices.Clone(keys)
			slices.SortStableFunc(want, func(a, b pendingKey) int {
				if c := cmp.Compare(a.priority, b.priority); c != 0 {
					return c
				}
				return cmp.Compare(a.seq, b.seq)
			})
			sortKeys(keys)
			for i := range keys {
				if keys[i] != want[i] {
					t.Fatalf("%s, %d keys: position %d is %+v, want %+v", name, n, i, keys[i], want[i])
				}
			}
		}
	}
}
