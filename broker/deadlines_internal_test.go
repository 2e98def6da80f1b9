package broker

import (
	"cmp"
	"math"
	"math/rand/v2"
	"slices"
	"strconv"
	"testing"
)

// byDeadline orders entries as deadlines keyed by EnqueuedAt and grouped by Attempts%groups keeps
// them.
func byDeadline(groups int) func(a, b *entry) int {
	return func(a, b *entry) int {
		return cmp.Or(cmp.Compare(int(a.Attempts)%groups, int(b.Attempts)%groups), cmp.Compare(a.EnqueuedAt, b.EnqueuedAt), cmp.Compare(a.Seq, b.Seq), cmp.Compare(a.ID, b.ID))
	}
}

// randomDeadlines returns deadlines of n entries with random deadlines (about four per deadline),
// Seqs in no order and, with groups > 1, in groups by Attempts%groups; a fifth of them added and
// removed again. It returns the entries it holds.
func randomDeadlines(rng *rand.Rand, n, groups int) (*deadlines, []*entry) {
	d := &deadlines{key: func(e *entry) int64 { return e.EnqueuedAt }}
	if groups > 1 {
		d.group = func(e *entry) int { return int(e.Attempts) % groups }
	}
	var all []*entry
	for i := range n {
		e := &entry{EnqueuedAt: int64(rng.IntN(1 + n/4)), Attempts: uint16(rng.IntN(100))}
		e.Seq = uint64(rng.IntN(1_000_000))*1000 + uint64(i)
		d.add(e)
		all = append(all, e)
	}
	for _, e := range all[:n/5] {
		d.remove(e)
	}
	return d, all[n/5:]
}

// TestDeadlinesAscend: ascend gives the entries in the order of their groups, then deadlines,
// ties by Seq, whatever was added and removed, and stops where its function says.
func TestDeadlinesAscend(t *testing.T) {
	rng := rand.New(rand.NewPCG(1, 2))
	for round := range 200 {
		groups := 1 + round%3
		d, want := randomDeadlines(rng, rng.IntN(300), groups)
		slices.SortFunc(want, byDeadline(groups))
		var got []*entry
		d.ascend(func(e *entry) bool {
			got = append(got, e)
			return true
		})
		if !slices.Equal(got, want) || d.Len() != len(want) {
			t.Fatalf("round %d: ascend gave %d entries out of order (or not all of %d; Len %d)", round, len(got), len(want), d.Len())
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

// TestDeadlinesFrom: from starts at the first entry at or after a place (group, deadline, Seq),
// in order.
func TestDeadlinesFrom(t *testing.T) {
	rng := rand.New(rand.NewPCG(7, 8))
	for round := range 200 {
		groups := 1 + round%3
		d, all := randomDeadlines(rng, 1+rng.IntN(300), groups)
		slices.SortFunc(all, byDeadline(groups))
		group, key, seq := rng.IntN(groups), int64(rng.IntN(80)), uint64(rng.IntN(1_000_000_000))
		if rng.IntN(2) == 0 && len(all) > 0 { // at an entry
			e := all[rng.IntN(len(all))]
			group, key, seq = int(e.Attempts)%groups, e.EnqueuedAt, e.Seq
		}
		i, _ := slices.BinarySearchFunc(all, [3]int64{int64(group), key, int64(seq)}, func(e *entry, p [3]int64) int {
			return cmp.Or(cmp.Compare(int64(e.Attempts)%int64(groups), p[0]), cmp.Compare(e.EnqueuedAt, p[1]), cmp.Compare(e.Seq, uint64(p[2])))
		})
		var got []*entry
		d.from(group, key, seq, func(e *entry) bool {
			got = append(got, e)
			return true
		})
		if !slices.Equal(got, all[i:]) {
			t.Fatalf("round %d: from (%d, %d, %d) gave %d entries, want the last %d in order", round, group, key, seq, len(got), len(all)-i)
		}
	}
}

// TestDeadlinesDueAndEarliest: due gives every entry of every group whose deadline has come, up to
// its bound, and the timer's deadline is the earliest of all groups as entries come and go.
func TestDeadlinesDueAndEarliest(t *testing.T) {
	rng := rand.New(rand.NewPCG(9, 10))
	for round := range 300 {
		groups := 1 + round%4
		d, live := randomDeadlines(rng, rng.IntN(200), groups)
		for k := range rng.IntN(50) { // adds and removes after the earliest was asked
			d.earliestKey()
			if len(live) > 0 && rng.IntN(2) == 0 {
				i := rng.IntN(len(live))
				d.remove(live[i])
				live = slices.Delete(live, i, i+1)
				continue
			}
			e := &entry{EnqueuedAt: int64(rng.IntN(100)), Attempts: uint16(rng.IntN(100)), ID: "late" + strconv.Itoa(k)}
			e.Seq = uint64(rng.IntN(1000))
			d.add(e)
			live = append(live, e)
		}
		// The deadlines are the keys plus an offset (a finished message's end plus the retention),
		// which saturates.
		switch round % 3 {
		case 1:
			d.offset = int64(rng.IntN(40))
		case 2:
			d.offset = math.MaxInt64 - 30
		}
		deadline := func(e *entry) int64 { return int64(min(uint64(e.EnqueuedAt)+uint64(d.offset), math.MaxInt64)) }
		earliest, ok := d.earliestKey()
		if want := slices.MinFunc(append(live, &entry{EnqueuedAt: math.MaxInt64}), func(a, b *entry) int { return cmp.Compare(a.EnqueuedAt, b.EnqueuedAt) }).EnqueuedAt; ok != (len(live) > 0) || ok && earliest != want {
			t.Fatalf("round %d: earliest %d (%v) of %d entries, want %d", round, earliest, ok, len(live), want)
		}
		now, bound := int64(rng.IntN(80))+min(d.offset, 40), 1+rng.IntN(100)
		if d.offset > 40 {
			now = math.MaxInt64 - int64(rng.IntN(2)) // the saturated ones come due only at the end of time
		}
		var want []*entry
		for _, e := range live {
			if deadline(e) <= now {
				want = append(want, e)
			}
		}
		got := d.due(now, bound)
		latest := int64(math.MinInt64)
		for _, e := range got {
			if deadline(e) > now || !slices.Contains(want, e) {
				t.Fatalf("round %d: due at %d gave an entry of deadline %d", round, now, deadline(e))
			}
			latest = max(latest, e.EnqueuedAt)
		}
		if len(got) != min(bound, len(want)) || len(slices.Compact(slices.SortedFunc(slices.Values(got), byDeadline(groups)))) != len(got) {
			t.Fatalf("round %d: due at %d gave %d entries, want %d distinct (%d due, bound %d)", round, now, len(got), min(bound, len(want)), len(want), bound)
		}
		for _, e := range want { // the earliest first, whatever their group
			if !slices.Contains(got, e) && e.EnqueuedAt < latest {
				t.Fatalf("round %d: due at %d left out an entry of key %d, and gave one of %d", round, now, e.EnqueuedAt, latest)
			}
		}
	}
}

// BenchmarkDeadlines measures what the hot paths cost a queue with a million finished messages
// waiting for their collection: a message finishing (added at the end of the order), the
// collection of the earliest, and a lease taken and settled among 64.
func BenchmarkDeadlines(b *testing.B) {
	gc := &deadlines{key: func(e *entry) int64 { return e.EnqueuedAt }, group: stateGroup}
	const n = 1_000_000
	for i := range n {
		e := &entry{EnqueuedAt: int64(i)}
		e.Seq = uint64(i)
		gc.add(e)
	}
	// A message finishes, and every maxFire the earliest maxFire are collected, as a queue that
	// keeps up does.
	b.Run("finish-collect", func(b *testing.B) {
		i := n
		for b.Loop() {
			e := &entry{EnqueuedAt: int64(i)}
			e.Seq = uint64(i)
			gc.add(e)
			if i++; i%maxFire == 0 {
				for _, e := range gc.due(math.MaxInt64, maxFire) {
					gc.remove(e)
				}
			}
			gc.earliestKey()
		}
	})
	leases := &deadlines{key: func(e *entry) int64 { return e.EnqueuedAt }}
	held := make([]*entry, 64)
	for i := range held {
		held[i] = &entry{EnqueuedAt: int64(i * 7 % 64)}
		held[i].Seq = uint64(i)
		leases.add(held[i])
	}
	b.Run("lease-settle", func(b *testing.B) {
		i := 0
		for b.Loop() {
			e := held[i%64]
			leases.remove(e)
			e.EnqueuedAt += 64
			leases.add(e)
			leases.earliestKey()
			i++
		}
	})
}
