package workers

import (
	"sync"
	"time"
)

// streak counts failures in a row of one kind across a worker's slots, for the log: the nth is said
// at failureLevel(n), so that an outage is said a dozen times per worker, not per slot.
type streak struct {
	mu    sync.Mutex // guards n and since
	n     int
	since time.Time // when its first failure was seen (not when its poll was sent, maybe long before)
}

// fail counts a failure seen now and returns how many are in the streak now.
func (s *streak) fail() int {
	s.mu.Lock()
	defer s.mu.Unlock()
	if s.n++; s.n == 1 {
		s.since = time.Now()
	}
	return s.n
}

// on reports whether the streak has failures.
func (s *streak) on() bool {
	s.mu.Lock()
	defer s.mu.Unlock()
	return s.n > 0
}

// end ends the streak, and returns how many failures it had (0 if none: another slot ended it, or
// none failed) and when the first was seen.
func (s *streak) end() (int, time.Time) {
	s.mu.Lock()
	defer s.mu.Unlock()
	n, since := s.n, s.since
	s.n, s.since = 0, time.Time{}
	return n, since
}
