package index

import (
	"fmt"
	"math/rand/v2"
	"runtime"
	"testing"
	"unsafe"
)

const benchN = 1_000_000

// benchIndex returns an index of n records with random priorities, each
// given meta and value by decorate, plus the next unused Seq.
func benchIndex(exclusive bool, n int, decorate func(i int, r *rec)) (*Index[*rec], uint64, *rand.Rand) {
	rng := rand.New(rand.NewPCG(1, 2))
	x := New[*rec](exclusive)
	for i := range n {
		r := &rec{}
		r.Priority, r.Seq = rng.Int64N(1<<30), uint64(i)
		if decorate != nil {
			decorate(i, r)
		}
		x.Add(r)
	}
	return x, uint64(n), rng
}

// BenchmarkPopAdd pops the most urgent message of a 1M-message simple index
// and adds it back with a later deadline.
func BenchmarkPopAdd(b *testing.B) {
	x, seq, rng := benchIndex(false, benchN, nil)
	b.ReportAllocs()
	for b.Loop() {
		r := x.Pop(nil, 1)[0]
		r.Priority += rng.Int64N(1 << 30)
		r.Seq, seq = seq, seq+1
		x.Add(r)
	}
}

// BenchmarkExclusivePopAdd pops from a 1M-message exclusive index spread over
// 10k values, releases the value and adds the message back.
func BenchmarkExclusivePopAdd(b *testing.B) {
	x, seq, rng := benchIndex(true, benchN, func(i int, r *rec) { r.SetAttrs(nil, fmt.Sprint("v", i%10_000)) })
	b.ReportAllocs()
	for b.Loop() {
		r := x.Pop(nil, 1)[0]
		x.Release(r.Value())
		r.Priority += rng.Int64N(1 << 30)
		r.Seq, seq = seq, seq+1
		x.Add(r)
	}
}

// BenchmarkExclusivePeekBatch peeks at a batch of 256 from a 100k-message
// exclusive index spread over 1000 values, with one message of a value per
// batch (1) and with room for several (2, 1000): the batch then merges the
// values' messages.
func BenchmarkExclusivePeekBatch(b *testing.B) {
	for _, per := range []int{1, 2, 1000} {
		b.Run(fmt.Sprint("per_value_", per), func(b *testing.B) {
			x, _, _ := benchIndex(true, 100_000, func(i int, r *rec) { r.SetAttrs(nil, fmt.Sprint("v", i%1000)) })
			x.SetPerValue(per)
			b.ReportAllocs()
			for b.Loop() {
				x.Peek(nil, 256)
			}
		})
	}
}

// BenchmarkDeepPage lists a page of 50 messages 90% deep into a 1M-message
// index, as browse's next page does: from its cursor (AscendAfter), and by
// walking past the messages before it (what browse did until 2026-11-26).
func BenchmarkDeepPage(b *testing.B) {
	x, _, _ := benchIndex(false, benchN, nil)
	var pivot *rec
	n := 0
	x.Ascend(nil, func(r *rec) bool {
		pivot, n = r, n+1
		return n < benchN*9/10
	})
	page := func(r *rec) bool { n++; return n < 50 }
	b.Run("after", func(b *testing.B) {
		for b.Loop() {
			n = 0
			x.AscendAfter(nil, pivot, page)
		}
	})
	b.Run("walk", func(b *testing.B) {
		for b.Loop() {
			n = 0
			x.Ascend(nil, func(r *rec) bool { return less(r, pivot) || !less(pivot, r) || page(r) })
		}
	})
}

// BenchmarkFilteredPopAdd pops with a filter matching 0.1% of a 1M-message
// index; every message carries two pairs.
func BenchmarkFilteredPopAdd(b *testing.B) {
	decorate := func(i int, r *rec) {
		tenant := fmt.Sprint("t", i%100)
		if i%1000 == 0 {
			tenant = "rare"
		}
		r.SetAttrs([]Pair{{"region", "eu"}, {"tenant", tenant}}, fmt.Sprint("v", i%10_000))
	}
	for _, bc := range []struct {
		name      string
		exclusive bool
		filter    Filter
	}{
		{"simple/1pair", false, Filter{{"tenant", "rare"}}},
		{"simple/2pairs", false, Filter{{"region", "eu"}, {"tenant", "rare"}}},
		{"exclusive/1pair", true, Filter{{"tenant", "rare"}}},
	} {
		b.Run(bc.name, func(b *testing.B) {
			x, seq, rng := benchIndex(bc.exclusive, benchN, decorate)
			b.ReportAllocs()
			for b.Loop() {
				r := x.Pop(bc.filter, 1)[0]
				x.Release(r.Value())
				r.Priority += rng.Int64N(1 << 30)
				r.Seq, seq = seq, seq+1
				x.Add(r)
			}
		})
	}
}

// BenchmarkManyFilters pops with filters of four pairs that each match 0.1%
// of a 1M-message index (S8's), one after the other: with one filter, as a
// worker asks, and with 64, 100 and 1,000 in turn. Each popped
// message goes back with a later deadline, so a filter asked again walks
// further to its next match, until it gets a set of its own.
func BenchmarkManyFilters(b *testing.B) {
	digit := func(i, d int) string { return fmt.Sprint((i / d) % 10) }
	decorate := func(i int, r *rec) {
		r.SetAttrs([]Pair{{"a", digit(i, 1)}, {"b", digit(i, 10)}, {"c", digit(i, 100)}, {"d", "x"}}, "")
	}
	filterOf := func(k int) Filter {
		return Filter{{"a", digit(k, 1)}, {"b", digit(k, 10)}, {"c", digit(k, 100)}, {"d", "x"}}
	}
	for _, bc := range []struct {
		name    string
		filters int
	}{{"one", 1}, {"64", 64}, {"100", 100}, {"1000", 1000}} {
		b.Run(bc.name, func(b *testing.B) {
			x, seq, rng := benchIndex(false, benchN, decorate)
			fs := make([]Filter, bc.filters)
			for k := range fs {
				fs[k] = filterOf(k)
			}
			k := 0
			b.ReportAllocs()
			for b.Loop() {
				r := x.Pop(fs[k%len(fs)], 1)[0]
				k++
				r.Priority += rng.Int64N(1 << 30)
				r.Seq, seq = seq, seq+1
				x.Add(r)
			}
		})
	}
}

// BenchmarkMemory reports the heap the index itself uses per message for 1M
// messages: the records are allocated before the first measurement, so
// B/item excludes them (Item is item-B, the caller's record more).
func BenchmarkMemory(b *testing.B) {
	for _, bc := range []struct {
		name      string
		exclusive bool
		ascending bool
		decorate  func(i int, r *rec)
	}{
		{"simple/random", false, false, nil},
		{"simple/ascending", false, true, nil},
		{"simple/2pairs", false, false, func(i int, r *rec) {
			r.SetAttrs([]Pair{{"region", "eu"}, {"tenant", fmt.Sprint("t", i%100)}}, "")
		}},
		{"exclusive/10kvalues", true, false, func(i int, r *rec) { r.SetAttrs(nil, fmt.Sprint("v", i%10_000)) }},
		{"exclusive/1Mvalues", true, false, func(i int, r *rec) { r.SetAttrs(nil, fmt.Sprint("v", i)) }},
	} {
		b.Run(bc.name, func(b *testing.B) {
			for b.Loop() {
				rng := rand.New(rand.NewPCG(1, 2))
				recs := make([]rec, benchN)
				for i := range recs {
					r := &recs[i]
					r.Priority, r.Seq = rng.Int64N(1<<30), uint64(i)
					if bc.ascending {
						r.Priority = int64(i)
					}
					if bc.decorate != nil {
						bc.decorate(i, r)
					}
				}
				var before, after runtime.MemStats
				runtime.GC()
				runtime.ReadMemStats(&before)
				x := New[*rec](bc.exclusive)
				for i := range recs {
					x.Add(&recs[i])
				}
				runtime.GC()
				runtime.ReadMemStats(&after)
				b.ReportMetric(float64(after.HeapAlloc-before.HeapAlloc)/benchN, "B/item")
				b.ReportMetric(float64(unsafe.Sizeof(Item{})), "item-B")
				runtime.KeepAlive(x)
				runtime.KeepAlive(recs)
			}
		})
	}
}
