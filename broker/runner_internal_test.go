package broker

import (
	"testing"
	"time"
)

// stopAndWait stops r and fails the test unless its goroutines exit within ten seconds.
func stopAndWait(t *testing.T, r *runner) {
	t.Helper()
	r.stop()
	waited := make(chan struct{})
	go func() { r.wait(); close(waited) }()
	within(t, waited, "the runner's goroutines did not exit after stop")
}

// within fails the test unless ch is closed within ten seconds.
func within(t *testing.T, ch <-chan struct{}, what string) {
	t.Helper()
	select {
	case <-ch:
	case <-time.After(10 * time.Second):
		t.Fatal(what)
	}
}

// run never waits for its function, and a function that blocks does not hold up the next one.
func TestRunnerRunsConcurrently(t *testing.T) {
	r := newRunner()
	release := make(chan struct{})
	first, second, returned := make(chan struct{}), make(chan struct{}), make(chan struct{})
	go func() {
		r.run(func() { close(first); <-release })
		close(returned)
	}()
	within(t, returned, "run waited for its function")
	within(t, first, "the first function did not run")
	r.run(func() { close(second) })
	within(t, second, "the second function did not run while the first was blocked")
	close(release)
	stopAndWait(t, r)
}

// Functions run one after the other go to the goroutine that ran the one before, which is idle by
// then, rather than to a new goroutine each.
func TestRunnerReusesIdleGoroutines(t *testing.T) {
	r := newRunner()
	const n = 1000
	for range n {
		done := make(chan struct{})
		r.run(func() { close(done) })
		within(t, done, "a function did not run")
	}
	// A function can come before the goroutine that ran the last one is back waiting for work,
	// and then gets a goroutine of its own; measured, that is 0–2 functions of the 1000.
	if reused := r.reused.Load(); reused < n/2 {
		t.Errorf("%d of %d functions run one after the other went to an idle goroutine; want most", reused, n)
	}
	stopAndWait(t, r)
}

// stop lets a function that is running finish, and wait returns once it has; a function run
// after stop still runs.
func TestRunnerStopWhileBusy(t *testing.T) {
	r := newRunner()
	release, started := make(chan struct{}), make(chan struct{})
	r.run(func() { close(started); <-release })
	within(t, started, "the function did not run")
	r.stop()
	waited := make(chan struct{})
	go func() { r.wait(); close(waited) }()
	close(release)
	within(t, waited, "the goroutine did not exit once its function returned after stop")
	after := make(chan struct{})
	r.run(func() { close(after) }) // after stop: still run, on a goroutine that then exits
	within(t, after, "a function run after stop did not run")
	r.wait()
}
