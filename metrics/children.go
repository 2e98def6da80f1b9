package metrics

import "sync"

// children caches values made from a key — a vector's resolved children — so that an observer on a
// hot path finds its counter with one map lookup under a read lock, instead of hashing label values
// into a vector and allocating their slice on every call. The zero value needs create set.
type children[K comparable, V any] struct {
	// create makes the value of a key seen for the first time; it is called under mu.
	create func(K) V

	// mu guards byKey.
	mu    sync.RWMutex
	byKey map[K]V
}

// get returns k's value, making it the first time.
func (c *children[K, V]) get(k K) V {
	c.mu.RLock()
	v, ok := c.byKey[k]
	c.mu.RUnlock()
	if ok {
		return v
	}
	c.mu.Lock()
	defer c.mu.Unlock()
	if v, ok = c.byKey[k]; !ok {
		if c.byKey == nil {
			c.byKey = make(map[K]V)
		}
		v = c.create(k)
		c.byKey[k] = v
	}
	return v
}

// remove forgets k's value, which is made again if k is seen again, and calls drop (which undoes
// what create did) under the same lock, so that no get makes k's value again meanwhile from what
// drop is undoing.
func (c *children[K, V]) remove(k K, drop func()) {
	c.mu.Lock()
	defer c.mu.Unlock()
	delete(c.byKey, k)
	drop()
}
