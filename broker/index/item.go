package index

// Pair is one metadata key/value pair.
type Pair struct{ Key, Value string }

// Filter selects messages whose metadata contains every pair (AND). An empty
// Filter selects every message.
type Filter []Pair

// Item is the index's view of one message. Callers embed it in their
// per-message record and return a pointer to it from [Elem.IndexItem].
//
// While an element is in an [Index] its Item must not change: every set the
// element is in is ordered by (Priority, Seq) and the per-pair and per-value
// sets are found through [Item.Meta] and [Item.Value], so a change would
// strand it.
//
// Meta and Value sit behind one pointer, nil while both are empty, because
// most messages have neither and an Item is held for every pending message.
type Item struct {
	// Priority orders messages; lower is more urgent (an earlier deadline).
	Priority int64
	// Seq is the enqueue sequence: the FIFO tie-breaker among equal
	// priorities. It must be unique within an Index, because (Priority, Seq)
	// is the key of every set the index keeps.
	Seq uint64
	// attrs holds Meta and Value; nil when Meta is empty and Value is "".
	attrs *itemAttrs
}

// itemAttrs is the out-of-line part of an Item.
type itemAttrs struct {
	meta  []Pair
	value string
}

// Meta is the message's metadata. Keys are unique; order is irrelevant. The
// slice is the one given to [Item.SetAttrs] and must not be modified.
func (it *Item) Meta() []Pair {
	if it.attrs == nil {
		return nil
	}
	return it.attrs.meta
}

// Value is the exclusivity value; "" in a simple queue. In an exclusive
// index "" is an ordinary value like any other.
func (it *Item) Value() string {
	if it.attrs == nil {
		return ""
	}
	return it.attrs.value
}

// SetAttrs sets the Item's [Item.Meta] and [Item.Value]. The Item keeps meta,
// which must not be modified afterwards. Like every change to an Item it must
// not be made while the element is in an [Index].
func (it *Item) SetAttrs(meta []Pair, value string) {
	if len(meta) == 0 && value == "" {
		it.attrs = nil
		return
	}
	it.attrs = &itemAttrs{meta: meta, value: value}
}

// Elem is what the index stores: a pointer-like type giving access to its
// Item. Two elements are the same message exactly when they are ==.
type Elem interface {
	comparable
	IndexItem() *Item
}

// less is the EDF order shared by every set in the package: ascending
// Priority, then ascending Seq. Because Seq is unique it is a total order, so
// equal keys identify the same message.
func less[T Elem](a, b T) bool {
	x, y := a.IndexItem(), b.IndexItem()
	if x.Priority != y.Priority {
		return x.Priority < y.Priority
	}
	return x.Seq < y.Seq
}

// Compare is the EDF order of less as a three-way comparison, for sorting elements outside the
// index (slices.SortFunc).
func Compare[T Elem](a, b T) int {
	switch {
	case less(a, b):
		return -1
	case less(b, a):
		return 1
	}
	return 0
}

// item returns e's Item, or nil if e cannot be dereferenced. The zero T is
// rejected before IndexItem is called because for the usual pointer types
// IndexItem would dereference nil.
func item[T Elem](e T) *Item {
	var zero T
	if e == zero {
		return nil
	}
	return e.IndexItem()
}

// has reports whether it carries the pair p.
func (it *Item) has(p Pair) bool {
	for _, m := range it.Meta() {
		if m == p {
			return true
		}
	}
	return false
}

// matches reports whether it carries every pair of f.
func (it *Item) matches(f Filter) bool {
	for _, p := range f {
		if !it.has(p) {
			return false
		}
	}
	return true
}
