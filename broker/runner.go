package broker

import "time"

// runnerIdle is how long a runner goroutine waits for more work before it exits. Under load the
// next request comes within microseconds; after a burst (thousands of long polls) the goroutines
// and their stacks should not stay long.
const runnerIdle = time.Second

// runner runs functions on goroutines of their own, as the go statement does, but hands each to a
// goroutine that has finished an earlier one and is idle, when there is one, rather than starting a
// new goroutine. A goroutine starts with a small stack and grows it by copying as a request's calls
// go deeper (into nats.go and back): with a new goroutine per request that growth was 2.6–3.4 % of
// the process's CPU in S1 and S7. An idle goroutine exits after runnerIdle, or when stop is called.
type runner struct {
	work chan func()   // unbuffered: a send succeeds only if an idle goroutine takes it
	quit chan struct{} // closed by stop
}

func newRunner() *runner {
	return &runner{work: make(chan func()), quit: make(chan struct{})}
}

// run runs f on an idle goroutine, or on a new one. It never waits for f.
func (r *runner) run(f func()) {
	select {
	case r.work <- f:
	default:
		go r.loop(f)
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

// stop makes the idle goroutines exit, and the busy ones once their function returns. Call it once.
func (r *runner) stop() { close(r.quit) }
