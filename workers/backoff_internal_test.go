package workers

import (
	"errors"
	"fmt"
	"testing"
	"time"

	"github.com/natstone/natstone/subjects"
)

// TestPollRetry holds the slots' retry schedule to its bounds: a missing queue, or one whose
// dequeues are blocked, is asked for again within a second however long it has been so, any other
// failure backs off up to 10 s.
func TestPollRetry(t *testing.T) {
	missing := fmt.Errorf("natstone: dequeue q: %w", &APIError{Code: subjects.CodeQueueNotFound})
	if !errors.Is(missing, ErrQueueNotFound) {
		t.Fatal("the test's error is not ErrQueueNotFound")
	}
	blocked := fmt.Errorf("natstone: dequeue q: %w", &APIError{Code: subjects.CodeQueueBlocked})
	if !errors.Is(blocked, ErrQueueBlocked) {
		t.Fatal("the test's error is not ErrQueueBlocked")
	}
	other := ErrUnavailable
	var longest time.Duration
	for failures := 1; failures <= 40; failures++ {
		for range 50 {
			if d := pollRetry(failures, missing); d <= 0 || d > pollRetryMissing {
				t.Fatalf("after %d polls of a missing queue: %v, want within (0, %v]", failures, d, pollRetryMissing)
			}
			if d := pollRetry(failures, blocked); d <= 0 || d > pollRetryMissing {
				t.Fatalf("after %d polls of a blocked queue: %v, want within (0, %v]", failures, d, pollRetryMissing)
			}
			d := pollRetry(failures, other)
			if d <= 0 || d > pollRetryMax {
				t.Fatalf("after %d failed polls: %v, want within (0, %v]", failures, d, pollRetryMax)
			}
			longest = max(longest, d)
		}
	}
	if longest <= pollRetryMissing {
		t.Fatalf("failed polls backed off %v at most, want them to back off past %v", longest, pollRetryMissing)
	}
}

// TestDefaultBackoff holds the retry schedule of failed messages to attempt⁴ seconds ±25 %, capped
// at a day: a quick first retry, and the 4 retries of a queue's default 5 attempts spread over
// minutes, not seconds, so that an outage of a minute does not error every message in flight.
// (GOARCH=386 go test runs it where an attempt's n⁴ would overflow an int.)
func TestDefaultBackoff(t *testing.T) {
	var budget time.Duration // the least the first 4 retries wait in all
	for attempt := -1; attempt <= 400; attempt++ {
		want := backoffMax
		if n := max(attempt, 1); n < 100 { // 100⁴ s is past the cap
			want = min(time.Duration(n*n*n*n)*time.Second, backoffMax)
		}
		lo, hi := want*3/4, min(want*5/4, backoffMax)
		least := hi
		for range 50 {
			d := DefaultBackoff(attempt)
			if d < lo || d > hi {
				t.Fatalf("DefaultBackoff(%d) = %v, want within [%v, %v]", attempt, d, lo, hi)
			}
			least = min(least, d)
		}
		if attempt >= 1 && attempt <= 4 {
			budget += least
		}
	}
	if budget < 4*time.Minute {
		t.Fatalf("the first 4 retries wait %v in all, want minutes", budget)
	}
}

// TestExtendRetry: a failed extension is tried again in half the time left, within the extensions'
// interval, and never sooner than 100 ms, unless less is left: then at the lease's end.
func TestExtendRetry(t *testing.T) {
	for _, c := range []struct{ every, left, want time.Duration }{
		{10 * time.Second, 30 * time.Second, 10 * time.Second},
		{10 * time.Second, 8 * time.Second, 4 * time.Second},
		{10 * time.Second, 300 * time.Millisecond, 150 * time.Millisecond},
		{10 * time.Second, 150 * time.Millisecond, pollRetryBase},
		{10 * time.Second, 80 * time.Millisecond, 80 * time.Millisecond},
		{10 * time.Second, time.Millisecond, time.Millisecond},
		{10 * time.Second, -time.Millisecond, 0},
		{50 * time.Millisecond, time.Second, pollRetryBase},
	} {
		if got := extendRetry(c.every, c.left); got != c.want {
			t.Errorf("extendRetry(%v, %v) = %v, want %v", c.every, c.left, got, c.want)
		}
	}
}
