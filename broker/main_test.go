package broker_test

import (
	"testing"

	"go.uber.org/goleak"
)

// TestMain fails the package if a test leaves a goroutine behind: every broker goroutine has an
// owner that waits for it on Stop.
func TestMain(m *testing.M) {
	goleak.VerifyTestMain(m)
}
