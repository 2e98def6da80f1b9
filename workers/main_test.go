package workers_test

import (
	"testing"

	"go.uber.org/goleak"
)

// TestMain fails the package if a test leaves a goroutine behind: every goroutine of a Worker has an
// owner that waits for it on Stop.
func TestMain(m *testing.M) {
	goleak.VerifyTestMain(m)
}
