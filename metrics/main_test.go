package metrics_test

import (
	"testing"

	"go.uber.org/goleak"
)

// TestMain fails the package if a test leaves a goroutine behind: the brokers, servers and health
// checks the tests start must all be waited for.
func TestMain(m *testing.M) {
	goleak.VerifyTestMain(m)
}
