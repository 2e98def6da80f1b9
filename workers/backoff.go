package workers

import (
	"errors"
	"math/rand/v2"
	"time"
)

// The default retry schedule of failed messages: 1s, 2s, 4s, … up to 5 min, each ±25 %.
const (
	backoffBase = time.Second
	backoffMax  = 5 * time.Minute
)

// The retry schedule of failed dequeues (no broker, broker unavailable, queue blocked): 100 ms
// doubling up to 10 s, each ±25 %, so a worker never spins on a failing broker. A queue that does not
// exist (yet: a worker started before the producer that creates it, say) is asked for again every
// second at most, so that the worker starts within a second of its queue.
const (
	pollRetryBase    = 100 * time.Millisecond
	pollRetryMax     = 10 * time.Second
	pollRetryMissing = time.Second
)

// pollRetry returns how long a slot waits before it polls again, after failures polls in a row
// that failed, the last with err (nil: it came back empty too early).
func pollRetry(failures int, err error) time.Duration {
	if errors.Is(err, ErrQueueNotFound) {
		return exponential(failures, pollRetryBase, pollRetryMissing)
	}
	return exponential(failures, pollRetryBase, pollRetryMax)
}

// DefaultBackoff is the default WorkerConfig.BackoffFunc: how long a message released after its
// attempt-th failed attempt (1 for the first) stays invisible. It is 1s·2^(attempt-1), capped at
// 5 minutes, with ±25 % of jitter so that messages failing together do not come back together.
func DefaultBackoff(attempt int) time.Duration {
	return exponential(attempt, backoffBase, backoffMax)
}

// exponential returns base·2^(n-1) capped at most, jittered by ±25 % (and still capped).
func exponential(n int, base, most time.Duration) time.Duration {
	d := most
	if n < 1 {
		n = 1
	}
	if n <= 32 {
		if shifted := base << (n - 1); shifted > 0 && shifted < most {
			d = shifted
		}
	}
	d = d*3/4 + rand.N(d/2+1)
	return min(d, most)
}
