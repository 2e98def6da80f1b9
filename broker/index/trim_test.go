package index

import (
	"maps"
	"reflect"
	"testing"
)

// TestTrim: a map is copied, with what it holds, once it is under a quarter of the most it held,
// and not before; a map that never held trimFloor entries is never copied.
func TestTrim(t *testing.T) {
	const n = 4 * trimFloor
	m, most := map[int]int{}, 0
	for i := range n {
		m[i] = -i
	}
	want := maps.Clone(m)
	copiedAt := -1
	for i := range n {
		delete(m, i)
		delete(want, i)
		was := reflect.ValueOf(m).UnsafePointer()
		if m = Trim(m, &most); reflect.ValueOf(m).UnsafePointer() != was {
			if copiedAt >= 0 {
				t.Fatalf("copied at %d entries and again at %d", copiedAt, len(m))
			}
			copiedAt = len(m)
		}
		if !maps.Equal(m, want) {
			t.Fatalf("after deleting %d: the map holds %d entries, want %d", i, len(m), len(want))
		}
	}
	if copiedAt != n/4-1 {
		t.Fatalf("copied at %d entries, want %d (under a quarter of %d)", copiedAt, n/4-1, n)
	}

	small, most := map[int]int{}, 0
	for i := range trimFloor - 1 {
		small[i] = i
	}
	for i := range trimFloor - 1 {
		delete(small, i)
		was := reflect.ValueOf(small).UnsafePointer()
		if small = Trim(small, &most); reflect.ValueOf(small).UnsafePointer() != was {
			t.Fatalf("a map of %d entries at most copied at %d", trimFloor-1, len(small))
		}
	}
}
