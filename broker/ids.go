package broker

import (
	"hash/maphash"
	"iter"
	"math/bits"
)

// idTable is a queue's entries by message id: an open-addressing hash table (linear probing,
// deletion by shifting back) whose slots hold the entries themselves, keyed by their own id. A slot
// is a pointer and a tag byte, 9 bytes, where a map[string]*entry slot holds the id's string header
// too, 25 bytes: about 20 bytes less per message at the loads both keep (see docs/design.md,
// "Memory"). The tag holds 7 bits of the id's hash, so a probe reads an entry only when they match.
// It grows at 4/5 full and shrinks under 1/10. The zero value is an empty table. Not safe for
// concurrent use.
type idTable struct {
	seed  maphash.Seed
	tags  []uint8 // 0: empty; else 0x80 | the hash's low 7 bits
	slots []*entry
	n     int
}

// idTableMinSize is the number of slots a table starts with.
const idTableMinSize = 8

func (t *idTable) hash(id string) (h uint64, tag uint8) {
	h = maphash.String(t.seed, id)
	return h, 0x80 | uint8(h&0x7f)
}

// home is the slot where probing for hash h starts: its high bits, the low ones being the tag's.
func (t *idTable) home(h uint64) int {
	return int(h >> (64 - bits.TrailingZeros(uint(len(t.slots)))))
}

// get returns the entry of id, or nil.
func (t *idTable) get(id string) *entry {
	if t.n == 0 {
		return nil
	}
	h, tag := t.hash(id)
	mask := len(t.slots) - 1
	for i := t.home(h); ; i = (i + 1) & mask {
		switch t.tags[i] {
		case 0:
			return nil
		case tag:
			if e := t.slots[i]; e.ID == id {
				return e
			}
		}
	}
}

// put makes e the entry of its id, replacing the one there was.
func (t *idTable) put(e *entry) {
	if (t.n+1)*5 > len(t.slots)*4 { // load at most 4/5
		t.resize(max(idTableMinSize, 2*len(t.slots)))
	}
	h, tag := t.hash(e.ID)
	mask := len(t.slots) - 1
	for i := t.home(h); ; i = (i + 1) & mask {
		switch t.tags[i] {
		case 0:
			t.tags[i], t.slots[i] = tag, e
			t.n++
			return
		case tag:
			if t.slots[i].ID == e.ID {
				t.slots[i] = e
				return
			}
		}
	}
}

// remove removes the entry of id, if there is one.
func (t *idTable) remove(id string) {
	if t.n == 0 {
		return
	}
	h, tag := t.hash(id)
	mask := len(t.slots) - 1
	i := t.home(h)
	for ; ; i = (i + 1) & mask {
		if t.tags[i] == 0 {
			return
		}
		if t.tags[i] == tag && t.slots[i].ID == id {
			break
		}
	}
	// Shift back what follows in the run, so that no probe meets the gap before its entry: an
	// entry at j may move to the gap at i if its home is not in (i, j], cyclically.
	for j := (i + 1) & mask; t.tags[j] != 0; j = (j + 1) & mask {
		hj, _ := t.hash(t.slots[j].ID)
		k := t.home(hj)
		if (i <= j && (k <= i || k > j)) || (i > j && k <= i && k > j) {
			t.tags[i], t.slots[i] = t.tags[j], t.slots[j]
			i = j
		}
	}
	t.tags[i], t.slots[i] = 0, nil
	t.n--
	if len(t.slots) > idTableMinSize && t.n*10 < len(t.slots) {
		// Under a tenth full, as after a peak's messages are collected: give the room back, down to
		// a table at most 2/5 full, so that neither a shrink nor a growth follows the other soon.
		t.resize(sizeFor(2 * t.n))
	}
}

// len returns the number of entries.
func (t *idTable) len() int { return t.n }

// all yields every entry, in no particular order. The table must not change meanwhile.
func (t *idTable) all() iter.Seq[*entry] {
	return func(yield func(*entry) bool) {
		tags, slots := t.tags, t.slots
		for i, tag := range tags {
			if tag != 0 && !yield(slots[i]) {
				return
			}
		}
	}
}

// reserve makes room for n entries in all, without growing on the way.
func (t *idTable) reserve(n int) {
	if size := sizeFor(n); size > len(t.slots) {
		t.resize(size)
	}
}

// sizeFor is the fewest slots, a power of two, that hold n entries at most 4/5 full.
func sizeFor(n int) int {
	size := idTableMinSize
	for n*5 > size*4 {
		size *= 2
	}
	return size
}

// resize rehashes the table into size slots, a power of two.
func (t *idTable) resize(size int) {
	if t.slots == nil {
		t.seed = maphash.MakeSeed()
	}
	tags, slots := t.tags, t.slots
	t.tags, t.slots = make([]uint8, size), make([]*entry, size)
	mask := size - 1
	for j, tag := range tags {
		if tag == 0 {
			continue
		}
		h, _ := t.hash(slots[j].ID)
		i := t.home(h)
		for t.tags[i] != 0 {
			i = (i + 1) & mask
		}
		t.tags[i], t.slots[i] = tag, slots[j]
	}
}
