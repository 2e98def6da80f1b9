package index

import (
	"cmp"
	"fmt"
	"math/rand/v2"
	"slices"
	"testing"
)

// maxFuzzOps bounds the operations decoded from one input. The invariant
// check after every operation is linear, so an unbounded input would make an
// execution quadratic and starve the fuzzer (and its minimiser) of
// throughput.
const maxFuzzOps = 300

var (
	fuzzKeys   = []string{"k0", "k1", "k2", "k3"} // k3 is never carried
	fuzzVals   = []string{"v0", "v1", "v2"}       // v2 is never carried
	fuzzValues = []string{"a", "b", "c", "d"}     // d is never a message's value
)

// model is the obviously correct reference: a slice sorted on every query.
type model struct {
	exclusive bool
	perValue  int // 1 or more
	items     []*rec
	held      map[string]int
}

func (m *model) contains(r *rec) bool { return slices.Contains(m.items, r) }

func (m *model) add(r *rec) bool {
	for _, o := range m.items {
		if o.Priority == r.Priority && o.Seq == r.Seq {
			return false
		}
	}
	m.items = append(m.items, r)
	return true
}

func (m *model) remove(r *rec) bool {
	i := slices.Index(m.items, r)
	if i < 0 {
		return false
	}
	m.items = slices.Delete(m.items, i, i+1)
	return true
}

func (m *model) sorted() []*rec {
	s := slices.Clone(m.items)
	slices.SortFunc(s, func(a, b *rec) int {
		return cmp.Or(cmp.Compare(a.Priority, b.Priority), cmp.Compare(a.Seq, b.Seq))
	})
	return s
}

func modelMatches(r *rec, f Filter) bool {
	for _, p := range f {
		if !slices.Contains(r.Meta(), p) {
			return false
		}
	}
	return true
}

func (m *model) peek(f Filter, n int) []*rec {
	var out []*rec
	picked := map[string]int{}
	for _, r := range m.sorted() {
		if len(out) >= n {
			break
		}
		if !modelMatches(r, f) {
			continue
		}
		if m.exclusive {
			if m.held[r.Value()]+picked[r.Value()] >= m.perValue {
				continue
			}
			picked[r.Value()]++
		}
		out = append(out, r)
	}
	return out
}

func (m *model) pop(f Filter, n int) []*rec {
	out := m.peek(f, n)
	for _, r := range out {
		m.remove(r)
		if m.exclusive {
			m.held[r.Value()]++
		}
	}
	return out
}

func (m *model) heldCount() int {
	n := 0
	for _, h := range m.held {
		if h > 0 {
			n++
		}
	}
	return n
}

// fuzzReader hands out the fuzz input byte by byte, then zeros.
type fuzzReader struct{ data []byte }

func (r *fuzzReader) done() bool { return len(r.data) == 0 }

func (r *fuzzReader) next() byte {
	if len(r.data) == 0 {
		return 0
	}
	b := r.data[0]
	r.data = r.data[1:]
	return b
}

// fuzzFilters are filters of several pairs that messages carry, which filter hands out again and
// again, so that filters are walked with a set of their own too, not only built and walked at once.
var fuzzFilters = []Filter{
	{{"k0", "v0"}, {"k1", "v0"}},
	{{"k1", "v1"}, {"k0", "v0"}},
	{{"k0", "v1"}, {"k1", "v1"}, {"k2", "v0"}},
	{{"k2", "v1"}, {"k1", "v0"}},
}

func (r *fuzzReader) filter() Filter {
	n := r.next()
	if n&0x80 != 0 {
		return fuzzFilters[(n>>5)&3]
	}
	var f Filter
	for range n % 5 {
		b := r.next()
		f = append(f, Pair{fuzzKeys[b%4], fuzzVals[(b>>2)%3]})
	}
	return f
}

func (r *fuzzReader) meta() []Pair {
	b := r.next()
	var meta []Pair
	for i := range 3 {
		if v := (b >> (2 * i)) & 3; v != 0 {
			meta = append(meta, Pair{fuzzKeys[i], fuzzVals[(v-1)%2]})
		}
	}
	if b&0x40 != 0 {
		slices.Reverse(meta)
	}
	return meta
}

func sameRecs(a, b []*rec) bool { return len(a) == len(b) && slices.Equal(a, b) }

// TestIndexRandomSequences runs FuzzIndex's body over random operation
// sequences on exclusive indexes: more of them, and longer, than its seeds,
// so that batches of values with room for several messages are taken often.
func TestIndexRandomSequences(t *testing.T) {
	t.Parallel()
	rng := rand.New(rand.NewPCG(7, 9))
	for range 5000 {
		data := make([]byte, 20+rng.IntN(400))
		for j := range data {
			data[j] = byte(rng.IntN(256))
		}
		data[0] |= 1 // exclusive
		runOps(t, data)
	}
}

// FuzzIndex applies a decoded sequence of operations to an Index and to the
// model and requires identical results and intact invariants after each.
func FuzzIndex(f *testing.F) {
	f.Add([]byte{0, 0, 1, 0x15, 0, 0, 2, 0x2a, 1, 6, 0, 2, 8, 0, 7, 1, 4, 6, 0, 3})
	f.Add([]byte{1, 0, 1, 0x15, 0, 1, 1, 0x15, 0, 2, 3, 0x01, 1, 6, 0, 3, 9, 0, 6, 1, 0, 4})
	f.Add([]byte{3, 0, 0, 0, 0, 0, 0, 0, 1, 0, 0, 0, 2, 1, 1, 0, 2, 2, 2, 4, 1, 5, 0, 1, 0x3f, 2, 6, 2, 1, 5, 6, 4})
	rng := rand.New(rand.NewPCG(1, 2))
	for cfgByte := range byte(4) {
		seed := []byte{cfgByte}
		for range 600 {
			seed = append(seed, byte(rng.IntN(256)))
		}
		f.Add(seed)
	}
	f.Fuzz(runOps)
}

// runOps is the body of FuzzIndex.
func runOps(t *testing.T, data []byte) {
	r := &fuzzReader{data: data}
	cfgByte := r.next()
	exclusive := cfgByte&1 != 0
	x := New[*rec](exclusive)
	if cfgByte&2 != 0 {
		// Tiny sets and trees so that short inputs cross the slice/tree
		// threshold and split and merge B-tree nodes.
		x.cfg.smallMax = 1 + int(cfgByte>>2)%6
		x.cfg.degree = 2 + int(cfgByte>>5)%3
		// And filters of several pairs that get a set of their own after a walk past one, two or
		// three messages, so that they are walked both with and without one.
		x.filterWalk = 1 + int(cfgByte>>3)%3
		// And few sets, so that they are evicted, for their number or their size.
		x.maxFilters = 1 + int(cfgByte>>4)%3
		x.filterBudget = 1 + int(cfgByte>>6)%3
	}
	m := &model{exclusive: exclusive, perValue: 1, held: map[string]int{}}
	var created []*rec
	pick := func() *rec {
		if len(created) == 0 {
			return nil
		}
		return created[int(r.next())%len(created)]
	}
	for op := 0; !r.done() && op < maxFuzzOps; op++ {
		switch code := r.next() % 14; code {
		case 0, 1, 2, 5:
			// A new message, or (5) a twin of an existing one: a different
			// element with the same (Priority, Seq).
			e := &rec{name: fmt.Sprint("s", len(created))}
			if code == 5 {
				o := pick()
				if o == nil {
					continue
				}
				e.name, e.Priority, e.Seq = "twin-of-"+o.name, o.Priority, o.Seq
			} else {
				e.Priority, e.Seq = int64(r.next()%4)-1, uint64(len(created))
			}
			e.SetAttrs(r.meta(), fuzzValues[r.next()%3])
			created = append(created, e)
			if got, want := x.Add(e), m.add(e); got != want {
				t.Fatalf("op %d: Add(%s) = %v, want %v", op, e.name, got, want)
			}
		case 3:
			if e := pick(); e != nil {
				if got, want := x.Add(e), m.add(e); got != want {
					t.Fatalf("op %d: re-Add = %v, want %v", op, got, want)
				}
			}
		case 4:
			if e := pick(); e != nil {
				if got, want := x.Remove(e), m.remove(e); got != want {
					t.Fatalf("op %d: Remove = %v, want %v", op, got, want)
				}
			}
		case 6, 7:
			fl := r.filter()
			n := int(r.next()%6) - 1
			var got, want []*rec
			if code == 6 {
				got, want = x.Pop(fl, n), m.pop(fl, n)
			} else {
				got, want = x.Peek(fl, n), m.peek(fl, n)
			}
			if !sameRecs(got, want) {
				t.Fatalf("op %d: Pop/Peek(%v, %d) (code %d) = %v, want %v", op, fl, n, code, got, want)
			}
		case 8:
			v := fuzzValues[r.next()%4]
			x.Hold(v)
			if exclusive {
				m.held[v]++
			}
		case 9:
			v := fuzzValues[r.next()%4]
			x.Release(v)
			if m.held[v] > 0 {
				m.held[v]--
			}
		case 13:
			fl, pivot := r.filter(), pick()
			if pivot == nil {
				continue
			}
			var got []*rec
			x.AscendAfter(fl, pivot, func(e *rec) bool {
				got = append(got, e)
				return true
			})
			var want []*rec
			for _, e := range m.peekAll(fl) {
				if less(pivot, e) {
					want = append(want, e)
				}
			}
			if !sameRecs(got, want) {
				t.Fatalf("op %d: AscendAfter(%v, %s) = %v, want %v", op, fl, pivot.name, got, want)
			}
		case 12:
			n := int(r.next()%6) - 1 // -1 and 0 are 1
			x.SetPerValue(n)
			m.perValue = max(n, 1)
		case 10:
			fl := r.filter()
			if got, want := x.Count(fl), len(m.peekAll(fl)); got != want {
				t.Fatalf("op %d: Count(%v) = %d, want %d", op, fl, got, want)
			}
			if e := pick(); e != nil && x.Contains(e) != m.contains(e) {
				t.Fatalf("op %d: Contains = %v", op, x.Contains(e))
			}
			for _, v := range fuzzValues {
				if full := exclusive && m.held[v] >= m.perValue; x.Held(v) != full || x.Holds(v) != m.held[v] {
					t.Fatalf("op %d: Held(%q) = %v, Holds %d; want %v, %d", op, v, x.Held(v), x.Holds(v), full, m.held[v])
				}
			}
		case 11:
			fl := r.filter()
			stop := int(r.next() % 8)
			var got []*rec
			x.Ascend(fl, func(e *rec) bool {
				got = append(got, e)
				return len(got) < stop
			})
			want := m.peekAll(fl)
			want = want[:min(len(want), max(stop, 1))]
			if !sameRecs(got, want) {
				t.Fatalf("op %d: Ascend(%v) stop %d = %v, want %v", op, fl, stop, got, want)
			}
		}
		if x.Len() != len(m.items) || x.HeldCount() != m.heldCount() {
			t.Fatalf("op %d: Len %d HeldCount %d, want %d %d", op, x.Len(), x.HeldCount(), len(m.items), m.heldCount())
		}
		// The full check is linear; every few operations still pins a
		// broken invariant to a short window.
		if op%8 == 0 {
			if err := x.check(); err != nil {
				t.Fatalf("op %d: %v", op, err)
			}
		}
	}
	if err := x.check(); err != nil {
		t.Fatalf("end: %v", err)
	}
}

// peekAll returns every pending message matching f, held values included.
func (m *model) peekAll(f Filter) []*rec {
	var out []*rec
	for _, r := range m.sorted() {
		if modelMatches(r, f) {
			out = append(out, r)
		}
	}
	return out
}
