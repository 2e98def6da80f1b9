// Package index is the broker's in-memory index of one queue's pending
// messages, ordered earliest deadline first (EDF): ascending Priority, ties
// broken by enqueue sequence (Seq), so equal priorities are FIFO.
//
// The index is pure data: no I/O, no clock, no goroutines and no locking (the
// caller serialises access). Misuse such as adding an element twice or
// removing an absent one is reported by a false or empty result, never a
// panic.
//
// # Structure
//
// Every set below is ordered by (Priority, Seq) and holds the caller's
// elements (pointers) directly, so an element costs one slot per set it is
// in and the index allocates nothing per element; [Item] carries no
// bookkeeping fields. A set keeps its minimum inline, so singleton sets (a
// pair or value carried by one message) need no further allocation and the
// next message to pop is found in O(1). The other elements form a sorted
// slice while there are at most 64 of them and a github.com/google/btree
// B-tree of degree 32 beyond that. All B-trees of an index share one node
// free list.
//
//   - all: every pending message.
//   - pairs: for each metadata (key, value) pair carried by some pending
//     message, the messages carrying it. A pair's set is deleted when it
//     empties, so a filter pair nobody carries is answered in O(1).
//   - groups (exclusive index only): for each exclusivity value, its pending
//     messages and whether the value is held (leased).
//   - free (exclusive index only): the best pending message of every value
//     that has messages and is not held.
//
// # Complexity
//
// With n pending messages and m metadata pairs on the message concerned:
//
//   - Add, Remove: O((m+1) log n); in an exclusive index plus O(log n) to
//     keep free right.
//   - Pop or Peek without a filter: O(log n) per message. A simple index
//     takes the minimum of all; an exclusive one takes the minima of free,
//     which holds exactly one candidate per free value, and Pop holds the
//     value of each message it returns. When a value may be held more than
//     once (SetPerValue), a batch of k merges the values of free's first k
//     in a heap, each value's next message found in O(log n) as one is
//     taken: O(k log n).
//   - Pop, Peek, Count or Ascend with a filter: walks the smallest set among
//     the filter's pairs in order, checking the other pairs on each element
//     and, in an exclusive index, skipping full values and values of which
//     the same call picked as many as they have room for. The cost is therefore proportional to the
//     elements of that set visited before n are found. Count with a single
//     pair is O(1).
//   - Hold, Release: O(log n).
//   - Contains: O(log n) (a lookup in all, since Item has no "in index" flag).
package index
