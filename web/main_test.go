package web_test

import (
	"testing"

	"go.uber.org/goleak"
)

// TestMain fails the package if a test leaves a goroutine behind: a handler's stats requests, the
// test servers and the browser's connection all have owners that wait for them.
func TestMain(m *testing.M) {
	goleak.VerifyTestMain(m)
}
