package workers

import (
	"errors"
	"fmt"
	"testing"
	"time"

	"github.com/natstone/natstone/subjects"
)

// TestPollRetry holds the slots' retry schedule to its bounds: a missing queue is asked for again
// within a second however long it has been missing, any other failure backs off up to 10 s.
func TestPollRetry(t *testing.T) {
	missing := fmt.Errorf("natstone: dequeue q: %w", &APIError{Code: subjects.CodeQueueNotFound})
	if !errors.Is(missing, ErrQueueNotFound) {
		t.Fatal("the test's error is not ErrQueueNotFound")
	}
	other := ErrUnavailable
	var longest time.Duration
	for failures := 1; failures <= 40; failures++ {
		for range 50 {
			if d := pollRetry(failures, missing); d <= 0 || d > pollRetryMissing {
				t.Fatalf("after %d polls of a missing queue: %v, want within (0, %v]", failures, d, pollRetryMissing)
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
