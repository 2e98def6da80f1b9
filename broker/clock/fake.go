package clock

import (
	"container/heap"
	"context"
	"sync"
	"time"
)

// Fake is a manually driven Clock for tests. Its time only moves when
// [Fake.Advance] or [Fake.Set] is called, and its timers' callbacks run
// synchronously inside those calls. A Fake is safe for concurrent use; its
// zero value is a clock at the zero time.
type Fake struct {
	mu     sync.Mutex
	now    time.Time
	nextID uint64
	timers timerHeap     // armed timers, earliest deadline first
	armed  chan struct{} // closed (and cleared) when a timer is armed; nil if nobody waits
}

var _ Clock = (*Fake)(nil)

// NewFake returns a Fake clock whose current time is now.
func NewFake(now time.Time) *Fake {
	return &Fake{now: now}
}

// Now returns the fake current time. While a timer's callback runs inside
// Advance, Now returns that timer's deadline.
func (c *Fake) Now() time.Time {
	c.mu.Lock()
	defer c.mu.Unlock()
	return c.now
}

// AfterFunc arms a timer that calls f once the clock has been advanced by at
// least d past the current Now. Unlike [Real], f does not run in its own
// goroutine: it runs synchronously in the goroutine that calls
// [Fake.Advance] or [Fake.Set]. A non-positive d makes the timer due
// immediately; it runs on the next Advance (Advance(0) suffices).
func (c *Fake) AfterFunc(d time.Duration, f func()) Timer {
	c.mu.Lock()
	defer c.mu.Unlock()
	c.nextID++
	t := &fakeTimer{c: c, f: f, id: c.nextID, index: -1}
	c.armLocked(t, d)
	return t
}

// Advance moves the clock forward by d (a negative d is treated as 0) and
// runs every timer that became due, in deadline order with ties broken by
// creation order. Each callback runs synchronously in the caller's goroutine,
// with Now set to the timer's deadline, and Advance returns only after all of
// them have returned: this is what makes tests deterministic. Callbacks are
// never run while the Fake's lock is held, so they may freely call Now,
// AfterFunc, Stop and Reset; timers they arm or reset that fall due within
// the advanced window also run before Advance returns. On return Now is the
// old Now plus d.
func (c *Fake) Advance(d time.Duration) {
	if d < 0 {
		d = 0
	}
	c.mu.Lock()
	c.runUntilLocked(c.now.Add(d))
}

// Set advances the clock to the absolute time t, running due timers exactly
// like [Fake.Advance]. It is a no-op if t is not after Now: a Fake never goes
// backwards.
func (c *Fake) Set(t time.Time) {
	c.mu.Lock()
	if !t.After(c.now) {
		c.mu.Unlock()
		return
	}
	c.runUntilLocked(t)
}

// Pending returns the number of armed timers: created or reset, and neither
// fired nor stopped since.
func (c *Fake) Pending() int {
	c.mu.Lock()
	defer c.mu.Unlock()
	return len(c.timers)
}

// WaitForTimers blocks until at least n timers are armed (see
// [Fake.Pending]) or ctx is done, in which case it returns ctx.Err(). It lets
// a test wait for the code under test to arm its timers before calling
// Advance, without sleeping: it is woken each time a timer is armed.
func (c *Fake) WaitForTimers(ctx context.Context, n int) error {
	for {
		c.mu.Lock()
		if len(c.timers) >= n {
			c.mu.Unlock()
			return nil
		}
		if c.armed == nil {
			c.armed = make(chan struct{})
		}
		ch := c.armed
		c.mu.Unlock()

		select {
		case <-ch:
		case <-ctx.Done():
			return ctx.Err()
		}
	}
}

// runUntilLocked runs due timers up to and including target, then sets Now
// to target (unless it is already later). It must be called with c.mu held
// and returns with it released; the lock is dropped around each callback.
func (c *Fake) runUntilLocked(target time.Time) {
	for len(c.timers) > 0 && !c.timers[0].when.After(target) {
		t := heap.Pop(&c.timers).(*fakeTimer)
		if t.when.After(c.now) {
			c.now = t.when
		}
		f := t.f
		c.mu.Unlock()
		f()
		c.mu.Lock()
	}
	if target.After(c.now) {
		c.now = target
	}
	c.mu.Unlock()
}

// armLocked (re)arms t to fire d after Now and wakes WaitForTimers callers.
// c.mu must be held.
func (c *Fake) armLocked(t *fakeTimer, d time.Duration) {
	if d < 0 {
		d = 0
	}
	t.when = c.now.Add(d)
	if t.index >= 0 {
		heap.Fix(&c.timers, t.index)
	} else {
		heap.Push(&c.timers, t)
	}
	if c.armed != nil {
		close(c.armed)
		c.armed = nil
	}
}

// fakeTimer is the Timer returned by Fake.AfterFunc.
type fakeTimer struct {
	c     *Fake
	f     func()
	when  time.Time
	id    uint64 // creation order; breaks deadline ties
	index int    // position in c.timers, or -1 when not armed
}

// Stop disarms the timer. It returns true if the timer was armed, i.e. if
// this call prevented the callback from running.
func (t *fakeTimer) Stop() bool {
	c := t.c
	c.mu.Lock()
	defer c.mu.Unlock()
	if t.index < 0 {
		return false
	}
	heap.Remove(&c.timers, t.index)
	return true
}

// Reset re-arms the timer to fire d after the clock's current Now, whether
// or not it already fired or was stopped. It returns true if the timer was
// armed before the call.
func (t *fakeTimer) Reset(d time.Duration) bool {
	c := t.c
	c.mu.Lock()
	defer c.mu.Unlock()
	wasArmed := t.index >= 0
	c.armLocked(t, d)
	return wasArmed
}

// timerHeap is a container/heap of armed timers ordered by (when, id).
type timerHeap []*fakeTimer

func (h timerHeap) Len() int { return len(h) }

func (h timerHeap) Less(i, j int) bool {
	if !h[i].when.Equal(h[j].when) {
		return h[i].when.Before(h[j].when)
	}
	return h[i].id < h[j].id
}

func (h timerHeap) Swap(i, j int) {
	h[i], h[j] = h[j], h[i]
	h[i].index = i
	h[j].index = j
}

func (h *timerHeap) Push(x any) {
	t := x.(*fakeTimer)
	t.index = len(*h)
	*h = append(*h, t)
}

func (h *timerHeap) Pop() any {
	old := *h
	n := len(old)
	t := old[n-1]
	old[n-1] = nil
	t.index = -1
	*h = old[:n-1]
	return t
}
