package workers

import (
	"errors"
	"log/slog"
	"math/rand/v2"
	"time"
)

// backoffMax caps the default retry schedule of failed messages (DefaultBackoff).
const backoffMax = 24 * time.Hour

// The retry schedule of failed dequeues (no broker, broker unavailable): 100 ms doubling up to 10 s,
// each ±25 %, so a worker never spins on a failing broker. A queue that does not exist (yet: a
// worker started before the producer that creates it, say), or whose dequeues an operator blocked,
// is asked for again every second at most, so that the worker starts within a second of its queue,
// or of the unblock.
const (
	pollRetryBase    = 100 * time.Millisecond
	pollRetryMax     = 10 * time.Second
	pollRetryMissing = time.Second
)

// settleRetryMax caps the retry schedule of a complete, release or cancel that failed (100 ms
// doubling, ±25 %): its lease runs meanwhile, and a broker taking over answers no sooner for a
// longer wait. At the polls' 10 s, an operator's trial saw completes land 4–5 s after the standby
// served, their leases of 20 s nearly spent.
const settleRetryMax = 2 * time.Second

// extendRetry returns how long a failed lease extension waits before it is tried again, left before
// the lease ends: half of that, so that a few tries fit before the end, but not more than the
// extensions' interval every, nor less than pollRetryBase, unless less than that is left: then at the
// lease's end, when a failure means the lease is lost (and the handler is told so then, not up to
// pollRetryBase after). A request that fails at once (a closed connection) would otherwise be tried
// again sooner each time, some twenty times in its lease's last second.
func extendRetry(every, left time.Duration) time.Duration {
	return min(max(min(every, left/2), pollRetryBase), max(left, 0))
}

// pollRetry returns how long a slot waits before it polls again, after failures polls in a row
// that failed, the last with err (nil: it came back empty too early).
func pollRetry(failures int, err error) time.Duration {
	if errors.Is(err, ErrQueueNotFound) || errors.Is(err, ErrQueueBlocked) {
		return exponential(failures, pollRetryBase, pollRetryMissing)
	}
	return exponential(failures, pollRetryBase, pollRetryMax)
}

// DefaultBackoff is the default WorkerConfig.BackoffFunc: how long a message released after its
// attempt-th failed attempt (1 for the first) stays invisible. It is attempt⁴ seconds, as River's:
// 1 s, 16 s, 81 s, 4 min 16 s, 10 min 25 s, …, capped at a day, with ±25 % of jitter so that
// messages failing together do not come back together. A queue's default 5 attempts so span about
// six minutes, enough for a dependency's restart or a deploy; more attempts span hours, then days.
func DefaultBackoff(attempt int) time.Duration {
	n := max(attempt, 1)
	d := backoffMax
	if n < 18 { // 18⁴ s is past the cap, and a larger n⁴ overflows a 32-bit int
		d = min(time.Duration(n*n*n*n)*time.Second, backoffMax)
	}
	return jitter(d, backoffMax)
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
	return jitter(d, most)
}

// jitter returns d ±25 %, capped at most.
func jitter(d, most time.Duration) time.Duration {
	return min(d*3/4+rand.N(d/2+1), most)
}

// failureLevel is the level of the log line of the nth failure in a row of the same thing (a poll,
// a settle's tries): WARN for the 1st, 2nd, 4th, 8th…, DEBUG for those between, so that an outage
// of an hour says so a dozen times (per worker: see streak; per message for a settle), not thousands.
func failureLevel(n int) slog.Level {
	if n&(n-1) == 0 {
		return slog.LevelWarn
	}
	return slog.LevelDebug
}
