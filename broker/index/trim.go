package index

// trimFloor is the size under which Trim leaves a map as it is.
const trimFloor = 1024

// Trim returns m, or a copy of it sized to what it holds once it holds under a quarter of the most
// it held (*most, which Trim keeps: call it after each delete from m). Go maps never give back the
// room they grew to, nor does maps.Clone, which keeps it: without a copy, a queue that once held a
// million values or metadata pairs would keep their room for the life of the process. A copy costs
// O(len(m)) once for every three quarters of m deleted; maps under trimFloor entries are left
// alone. The index trims its maps by pair and by value with it, and the broker its own by value.
func Trim[K comparable, V any](m map[K]V, most *int) map[K]V {
	if *most = max(*most, len(m)+1); *most < trimFloor || len(m)*4 >= *most {
		return m
	}
	c := make(map[K]V, len(m))
	for k, v := range m {
		c[k] = v
	}
	*most = len(c)
	return c
}
