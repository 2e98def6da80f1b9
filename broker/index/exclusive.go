package index

// group is the state of one exclusivity value.
type group[T Elem] struct {
	// set holds the value's pending messages. Its minimum, when the value
	// is not full, is the value's entry in Index.free.
	set orderedSet[T]
	// mark is the Index.epoch of the last call that picked this value (pick),
	// and picked how many of its messages that call picked: with held, at most
	// PerValue.
	mark, picked uint32
	// held counts the value's holds: its messages leased (or taken by Pop).
	// The value is full, its messages ineligible, at Index.PerValue holds.
	held int
}

// full reports whether g's value has as many holds as a value may have.
func (x *Index[T]) full(g *group[T]) bool { return g.held >= x.PerValue() }

// PerValue returns how many messages of one value may be held at once: 1
// unless SetPerValue said more.
func (x *Index[T]) PerValue() int { return max(x.perValue, 1) }

// SetPerValue sets how many messages of one value may be held at once (at
// least 1; below it is 1). Values held that many times or more are full;
// lowering it below a value's holds leaves them held, and the value full
// until enough are released. It costs O(values) when it changes.
func (x *Index[T]) SetPerValue(n int) {
	n = max(n, 1)
	old := x.PerValue()
	x.perValue = n
	if n == old || !x.exclusive {
		return
	}
	for _, g := range x.groups {
		wasFull, full := g.held >= old, g.held >= n
		head, ok := g.set.min()
		switch {
		case !ok || wasFull == full:
		case full:
			x.free.delete(&x.cfg, head)
		default:
			x.free.insert(&x.cfg, head)
		}
	}
}

// addToGroup adds e to its value's set and, if e becomes the best message of
// a value that is not full, replaces the value's entry in free.
func (x *Index[T]) addToGroup(e T, it *Item) {
	g := x.groups[it.Value()]
	if g == nil {
		g = new(group[T])
		x.groups[it.Value()] = g
	}
	head, had := g.set.min()
	g.set.insert(&x.cfg, e)
	if x.full(g) || (had && less(head, e)) {
		return
	}
	if had {
		x.free.delete(&x.cfg, head)
	}
	x.free.insert(&x.cfg, e)
}

// removeFromGroup removes e from its value's set, promotes the value's next
// message into free if e was the value's entry there, and forgets a value
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
	if !x.full(g) && head == e {
		x.free.delete(&x.cfg, e)
		if next, ok := g.set.min(); ok {
			x.free.insert(&x.cfg, next)
		}
	}
	if g.set.len() == 0 && g.held == 0 {
		delete(x.groups, it.Value())
		x.groups = Trim(x.groups, &x.groupsMost)
	}
}

// Hold counts one more message of an exclusivity value as leased; at
// PerValue holds the value is full and its messages are ineligible for Pop
// until a [Index.Release]. Pop holds the value of each message it returns;
// Hold is for a message running outside Pop, e.g. on recovery. A value may
// be held while it has no pending messages, and held beyond PerValue (the
// holds are counted all the same). It is a no-op in a simple index.
func (x *Index[T]) Hold(value string) {
	if !x.exclusive {
		return
	}
	g := x.groups[value]
	if g == nil {
		g = new(group[T])
		x.groups[value] = g
	}
	wasFull := x.full(g)
	g.held++
	if g.held == 1 {
		x.held++
	}
	if !wasFull && x.full(g) {
		if head, ok := g.set.min(); ok {
			x.free.delete(&x.cfg, head)
		}
	}
}

// Release ends one hold of value: a value that is no longer full has its
// best pending message eligible again. Releasing a value not held does
// nothing; so does Release in a simple index.
func (x *Index[T]) Release(value string) {
	if !x.exclusive {
		return
	}
	g := x.groups[value]
	if g == nil || g.held == 0 {
		return
	}
	wasFull := x.full(g)
	g.held--
	if g.held == 0 {
		x.held--
	}
	head, ok := g.set.min()
	switch {
	case ok && wasFull && !x.full(g):
		x.free.insert(&x.cfg, head)
	case !ok && g.held == 0:
		delete(x.groups, value)
		x.groups = Trim(x.groups, &x.groupsMost)
	}
}

// Held reports whether value is full: held PerValue times or more. It is
// always false in a simple index.
func (x *Index[T]) Held(value string) bool {
	g := x.groups[value]
	return g != nil && x.full(g)
}

// Holds returns how many times value is held.
func (x *Index[T]) Holds(value string) int {
	if g := x.groups[value]; g != nil {
		return g.held
	}
	return 0
}

// HeldCount returns the number of values held at least once.
func (x *Index[T]) HeldCount() int { return x.held }
