package clock

import "time"

// Clock tells time and schedules callbacks.
type Clock interface {
	// Now returns the current time on this clock.
	Now() time.Time
	// AfterFunc calls f in its own goroutine once d has elapsed on this clock.
	// For a [Fake] clock, f is instead called synchronously by the goroutine
	// that advances the clock; see [Fake.Advance].
	AfterFunc(d time.Duration, f func()) Timer
}

// Timer is a handle to a callback scheduled with [Clock.AfterFunc].
type Timer interface {
	// Stop prevents the timer from firing. It returns true if the call
	// stopped the timer, false if the timer had already fired or been
	// stopped, like [time.Timer.Stop].
	Stop() bool
	// Reset re-arms the timer to fire after d, measured from the clock's
	// current Now, even if it already fired or was stopped. It returns true
	// if the timer had been armed, like [time.Timer.Reset].
	Reset(d time.Duration) bool
}

// Real returns a Clock backed by package time: Now is time.Now and AfterFunc
// is time.AfterFunc (its callbacks run in their own goroutines).
func Real() Clock { return realClock{} }

type realClock struct{}

func (realClock) Now() time.Time { return time.Now() }

func (realClock) AfterFunc(d time.Duration, f func()) Timer {
	return time.AfterFunc(d, f)
}
