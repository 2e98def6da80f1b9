package index

// group is the state of one exclusivity value.
type group[T Elem] struct {
	// set holds the value's pending messages. Its minimum, when the value
	// is not held, is the value's entry in Index.free.
	set  orderedSet[T]
	mark uint32 // Index.epoch of the last Pop or Peek that picked this value
	held bool
}

// addToGroup adds e to its value's set and, if e becomes the best message of
// a free value, replaces the value's entry in free.
func (x *Index[T]) addToGroup(e T, it *Item) {
	g := x.groups[it.Value()]
	if g == nil {
		g = new(group[T])
		x.groups[it.Value()] = g
	}
	head, had := g.set.min()
	g.set.insert(&x.cfg, e)
	if g.held || (had && less(head, e)) {
		return
	}
	if had {
		x.free.delete(&x.cfg, head)
	}
	x.free.insert(&x.cfg, e)
}

// removeFromGroup removes e from its value's set, promotes the value's next
// message into free if e was a free value's entry there, and forgets a value
// left with no messages and no hold.
func (x *Index[T]) removeFromGroup(e T, it *Item) {
	g := x.groups[it.Value()]
	if g == nil {
		return
	}
	head, _ := g.set.min()
	if !g.set.delete(&x.cfg, e) {
		return
	}
	if g.held {
		return
	}
	if head == e {
		x.free.delete(&x.cfg, e)
		if next, ok := g.set.min(); ok {
			x.free.insert(&x.cfg, next)
		}
	}
	if g.set.len() == 0 {
		delete(x.groups, it.Value())
	}
}

// Hold marks an exclusivity value as leased, making its messages ineligible
// for Pop until [Index.Release]. It is used when a message of that value is
// running outside Pop, e.g. on recovery. A value may be held while it has no
// pending messages. Hold is idempotent and a no-op in a simple index.
func (x *Index[T]) Hold(value string) {
	if !x.exclusive {
		return
	}
	g := x.groups[value]
	if g == nil {
		g = new(group[T])
		x.groups[value] = g
	}
	if g.held {
		return
	}
	g.held = true
	x.held++
	if head, ok := g.set.min(); ok {
		x.free.delete(&x.cfg, head)
	}
}

// Release frees a held value so that its best pending message becomes
// eligible again. It is idempotent and a no-op in a simple index.
func (x *Index[T]) Release(value string) {
	if !x.exclusive {
		return
	}
	g := x.groups[value]
	if g == nil || !g.held {
		return
	}
	g.held = false
	x.held--
	if head, ok := g.set.min(); ok {
		x.free.insert(&x.cfg, head)
	} else {
		delete(x.groups, value)
	}
}

// Held reports whether value is held. It is always false in a simple index.
func (x *Index[T]) Held(value string) bool {
	g := x.groups[value]
	return g != nil && g.held
}

// HeldCount returns the number of held values.
func (x *Index[T]) HeldCount() int { return x.held }
