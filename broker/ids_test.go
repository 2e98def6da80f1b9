package broker

import (
	"math/rand/v2"
	"strconv"
	"testing"
)

// checkIDTable compares t with the model: the same entries by id, and nothing else.
func checkIDTable(tb testing.TB, t *idTable, model map[string]*entry) {
	tb.Helper()
	if t.len() != len(model) {
		tb.Fatalf("len %d, want %d", t.len(), len(model))
	}
	seen := map[string]bool{}
	for e := range t.all() {
		if model[e.ID] != e || seen[e.ID] {
			tb.Fatalf("all yields %q (%p), the model has %p, seen before: %v", e.ID, e, model[e.ID], seen[e.ID])
		}
		seen[e.ID] = true
	}
	for id, e := range model {
		if got := t.get(id); got != e {
			tb.Fatalf("get(%q) = %p, want %p", id, got, e)
		}
	}
}

// runIDTableOps applies ops to a table and a map side by side: each byte picks an operation (put a
// new entry, remove, get) and one of ids ids.
func runIDTableOps(tb testing.TB, ops []byte, ids int) {
	var t idTable
	model := map[string]*entry{}
	for i, op := range ops {
		id := "m" + strconv.Itoa(int(op>>2)%ids)
		switch op & 3 {
		case 0, 1:
			e := &entry{ID: id}
			t.put(e)
			model[id] = e
		case 2:
			t.remove(id)
			delete(model, id)
		case 3:
			if got := t.get(id); got != model[id] {
				tb.Fatalf("op %d: get(%q) = %p, want %p", i, id, got, model[id])
			}
		}
		if t.len() != len(model) {
			tb.Fatalf("op %d: len %d, want %d", i, t.len(), len(model))
		}
	}
	checkIDTable(tb, &t, model)
}

// TestIDTableAgainstMap: random puts, removes and gets, over few ids so that runs wrap around the
// end of small tables and removals shift entries back, each table with a seed of its own.
func TestIDTableAgainstMap(t *testing.T) {
	rng := rand.New(rand.NewPCG(1, 2))
	for range 500 {
		ops := make([]byte, 400)
		for i := range ops {
			ops[i] = byte(rng.Uint32())
		}
		runIDTableOps(t, ops, 1+rng.IntN(40))
	}
}

// TestIDTableReserve: a reserved table holds that many entries without growing, and a large one
// works as a small one does.
func TestIDTableReserve(t *testing.T) {
	var tab idTable
	const n = 100_000
	tab.reserve(n)
	size := len(tab.slots)
	model := map[string]*entry{}
	for i := range n {
		e := &entry{ID: "id-" + strconv.Itoa(i)}
		tab.put(e)
		model[e.ID] = e
	}
	if len(tab.slots) != size {
		t.Fatalf("grew from %d to %d slots", size, len(tab.slots))
	}
	for i := 0; i < n; i += 3 {
		id := "id-" + strconv.Itoa(i)
		tab.remove(id)
		delete(model, id)
	}
	checkIDTable(t, &tab, model)
}

// TestIDTableShrinks: a table gives back the room a peak left once most of its entries are removed,
// and holds what stays and what comes after.
func TestIDTableShrinks(t *testing.T) {
	var tab idTable
	const n = 100_000
	model := map[string]*entry{}
	for i := range n {
		e := &entry{ID: "id-" + strconv.Itoa(i)}
		tab.put(e)
		model[e.ID] = e
	}
	peak := len(tab.slots)
	for i := 100; i < n; i++ {
		id := "id-" + strconv.Itoa(i)
		tab.remove(id)
		delete(model, id)
	}
	if len(tab.slots) > 512 {
		t.Fatalf("%d slots for 100 entries, %d at the peak", len(tab.slots), peak)
	}
	checkIDTable(t, &tab, model)
	for i := n; i < 2*n; i++ {
		e := &entry{ID: "id-" + strconv.Itoa(i)}
		tab.put(e)
		model[e.ID] = e
	}
	checkIDTable(t, &tab, model)
	for id := range model {
		tab.remove(id)
	}
	if tab.len() != 0 || len(tab.slots) != idTableMinSize {
		t.Fatalf("emptied: %d entries in %d slots", tab.len(), len(tab.slots))
	}
}

func FuzzIDTable(f *testing.F) {
	f.Add([]byte{0, 4, 8, 2, 3, 7, 11}, uint8(3))
	f.Add([]byte{0, 1, 4, 5, 8, 9, 12, 13, 2, 6, 10, 14, 3, 7, 11, 15}, uint8(8))
	f.Fuzz(func(t *testing.T, ops []byte, ids uint8) {
		runIDTableOps(t, ops, 1+int(ids)%64)
	})
}

func BenchmarkIDTableGet(b *testing.B) {
	var tab idTable
	const n = 1 << 20
	keys := make([]string, n)
	for i := range n {
		keys[i] = "0123456789abcdef-" + strconv.Itoa(i)
		tab.put(&entry{ID: keys[i]})
	}
	b.ResetTimer()
	for i := range b.N {
		if tab.get(keys[i&(n-1)]) == nil {
			b.Fatal("missing")
		}
	}
}

func BenchmarkMapGet(b *testing.B) {
	m := map[string]*entry{}
	const n = 1 << 20
	keys := make([]string, n)
	for i := range n {
		keys[i] = "0123456789abcdef-" + strconv.Itoa(i)
		m[keys[i]] = &entry{ID: keys[i]}
	}
	b.ResetTimer()
	for i := range b.N {
		if m[keys[i&(n-1)]] == nil {
			b.Fatal("missing")
		}
	}
}
