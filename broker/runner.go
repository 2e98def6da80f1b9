package broker

import (
	"sync"
	"sync/atomic"
	"time"
)

// runnerIdle is how long a runner goroutine waits for more work before it exits. Under load the
// next request comes within microseconds; after a burst (thousands of long polls) the goroutines
// and their stacks should not stay long.
const runnerIdle = time.Second

// runner runs functions on goroutines of their own, as the go statement does, but hands each to a
// goroutine that has finished an earlier one and is idle, when there is one, rather than starting a
// new goroutine. A goroutine starts with a small stack and grows it by copying as a request's calls
// go deeper (into nats.go and back): with a new goroutine per request, stack growth was 2.8 % of
// the process's CPU in S1, most of it the request goroutines'. An idle goroutine exits after
// runnerIdle, or when stop is called.
type runner struct {
	work     chan func() // unbuffered: a send succeeds only if an idle goroutine takes it
	quit     chan struct{}
	stopOnce sync.Once
	live     sync.WaitGroup // the runner's goroutines
	reused   atomic.Int64   // functions handed to an idle goroutine (read by tests)
}

func newRunner() *runner {
	return &runner{work: make(chan func()), quit: make(chan struct{})}
}

// run runs f on an idle goroutine, or on a new one. It never waits for f.
func (r *runner) run(f func()) {
	select {
	case r.work <- f:
		r.reused.Add(1)
	default:
		r.live.Go(func() { r.loop(f) })
	}
}

func (r *runner) loop(f func()) {
	idle := time.NewTimer(runnerIdle)
	defer idle.Stop()
	for {
		f()
		f = nil // let what it holds go while idle
		idle.Reset(runnerIdle)
		select {
		case f = <-r.work:
		case <-idle.C:
			return
		case <-r.quit:
			return
		}
	}
}

// stop makes the idle goroutines exit, and the busy ones once their function returns. A function
// run after stop runs on a goroutine that exits when it returns.
func (r *runner) stop() { r.stopOnce.Do(func() { close(r.quit) }) }

// wait waits until every goroutine of the runner has exited: after stop, until the functions
// running have returned.
func (r *runner) wait() { r.live.Wait() }
