package broker

import (
	"runtime"
	"sync"
	"testing"
	"time"

	"go.uber.org/goleak"
)

// A function never waits for another: one that blocks does not hold up the next.
func TestRunnerRunsConcurrently(t *testing.T) {
	r := newRunner()
	defer r.stop()
	release := make(chan struct{})
	first, second := make(chan struct{}), make(chan struct{})
	r.run(func() { close(first); <-release })
	<-first
	r.run(func() { close(second) })
	select {
	case <-second:
	case <-time.After(10 * time.Second):
		t.Fatal("the second function did not run while the first was blocked")
	}
	close(release)
}

// Functions run one after the other reuse an idle goroutine instead of starting one each: an unused
// goroutine stays alive for runnerIdle, so without reuse a thousand would be alive at the end.
func TestRunnerReusesIdleGoroutines(t *testing.T) {
	defer goleak.VerifyNone(t, goleak.IgnoreCurrent())
	r := newRunner()
	before := runtime.NumGoroutine()
	var ran sync.WaitGroup
	for range 1000 {
		ran.Add(1)
		done := make(chan struct{})
		r.run(func() { ran.Done(); close(done) })
		<-done
	}
	ran.Wait()
	if alive := runtime.NumGoroutine() - before; alive > 100 {
		t.Errorf("%d runner goroutines alive after 1000 functions run one at a time: idle ones are not reused", alive)
	}
	r.stop() // the idle goroutines exit: VerifyNone checks
}

// stop lets a function that is running finish, and ends its goroutine afterwards.
func TestRunnerStopWhileBusy(t *testing.T) {
	defer goleak.VerifyNone(t, goleak.IgnoreCurrent())
	r := newRunner()
	release, finished := make(chan struct{}), make(chan struct{})
	started := make(chan struct{})
	r.run(func() { close(started); <-release; close(finished) })
	<-started
	r.stop()
	close(release)
	select {
	case <-finished:
	case <-time.After(10 * time.Second):
		t.Fatal("the running function did not finish after stop")
	}
}
