package clock_test

import (
	"context"
	"errors"
	"reflect"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/natstone/natstone/broker/clock"
)

var t0 = time.Date(2025, 1, 2, 3, 4, 5, 0, time.UTC)

func TestRealNow(t *testing.T) {
	before := time.Now()
	got := clock.Real().Now()
	after := time.Now()
	if got.Before(before) || got.After(after) {
		t.Fatalf("Real().Now() = %v, want within [%v, %v]", got, before, after)
	}
}

func TestRealAfterFunc(t *testing.T) {
	c := clock.Real()
	fired := make(chan struct{})
	c.AfterFunc(time.Millisecond, func() { close(fired) })
	select {
	case <-fired:
	case <-time.After(10 * time.Second):
		t.Fatal("Real AfterFunc callback did not run")
	}

	tm := c.AfterFunc(time.Hour, func() { t.Error("stopped timer fired") })
	if !tm.Stop() {
		t.Fatal("Stop of armed real timer = false, want true")
	}
	if tm.Stop() {
		t.Fatal("second Stop of real timer = true, want false")
	}
}

func TestFakeNowAdvanceSet(t *testing.T) {
	c := clock.NewFake(t0)
	if got := c.Now(); !got.Equal(t0) {
		t.Fatalf("Now() = %v, want %v", got, t0)
	}
	c.Advance(90 * time.Second)
	if got, want := c.Now(), t0.Add(90*time.Second); !got.Equal(want) {
		t.Fatalf("after Advance Now() = %v, want %v", got, want)
	}
	c.Advance(-time.Hour) // never goes backwards
	if got, want := c.Now(), t0.Add(90*time.Second); !got.Equal(want) {
		t.Fatalf("after negative Advance Now() = %v, want %v", got, want)
	}
	c.Set(t0) // in the past: no-op
	if got, want := c.Now(), t0.Add(90*time.Second); !got.Equal(want) {
		t.Fatalf("after Set(past) Now() = %v, want %v", got, want)
	}
	c.Set(t0.Add(time.Hour))
	if got, want := c.Now(), t0.Add(time.Hour); !got.Equal(want) {
		t.Fatalf("after Set Now() = %v, want %v", got, want)
	}
}

func TestFakeZeroValue(t *testing.T) {
	var c clock.Fake
	ran := false
	c.AfterFunc(time.Second, func() { ran = true })
	c.Advance(time.Second)
	if !ran {
		t.Fatal("timer on zero-value Fake did not run")
	}
	if got, want := c.Now(), (time.Time{}).Add(time.Second); !got.Equal(want) {
		t.Fatalf("Now() = %v, want %v", got, want)
	}
}

func TestFakeOrdering(t *testing.T) {
	c := clock.NewFake(t0)
	var order []string
	var nows []time.Duration
	add := func(name string, d time.Duration) {
		c.AfterFunc(d, func() {
			order = append(order, name)
			nows = append(nows, c.Now().Sub(t0))
		})
	}
	add("c3", 3*time.Second)
	add("a1", 1*time.Second)
	add("b2", 2*time.Second)
	add("a1-tie", 1*time.Second) // same deadline as a1, created later
	add("d10", 10*time.Second)

	if got := c.Pending(); got != 5 {
		t.Fatalf("Pending() = %d, want 5", got)
	}
	c.Advance(5 * time.Second)

	wantOrder := []string{"a1", "a1-tie", "b2", "c3"}
	if !reflect.DeepEqual(order, wantOrder) {
		t.Fatalf("order = %v, want %v", order, wantOrder)
	}
	wantNows := []time.Duration{time.Second, time.Second, 2 * time.Second, 3 * time.Second}
	if !reflect.DeepEqual(nows, wantNows) {
		t.Fatalf("Now() inside callbacks = %v, want %v", nows, wantNows)
	}
	if got, want := c.Now(), t0.Add(5*time.Second); !got.Equal(want) {
		t.Fatalf("Now() after Advance = %v, want %v", got, want)
	}
	if got := c.Pending(); got != 1 {
		t.Fatalf("Pending() = %d, want 1", got)
	}

	c.Advance(4*time.Second + 999*time.Millisecond)
	if len(order) != 4 {
		t.Fatalf("d10 ran early: %v", order)
	}
	c.Advance(time.Millisecond) // exactly at the deadline
	if len(order) != 5 || order[4] != "d10" {
		t.Fatalf("order = %v, want d10 last", order)
	}
	if got := c.Pending(); got != 0 {
		t.Fatalf("Pending() = %d, want 0", got)
	}
}

func TestFakeSetRunsTimers(t *testing.T) {
	c := clock.NewFake(t0)
	var ran []int
	c.AfterFunc(2*time.Second, func() { ran = append(ran, 2) })
	c.AfterFunc(time.Second, func() { ran = append(ran, 1) })
	c.Set(t0.Add(2 * time.Second))
	if !reflect.DeepEqual(ran, []int{1, 2}) {
		t.Fatalf("ran = %v, want [1 2]", ran)
	}
}

func TestFakeZeroDuration(t *testing.T) {
	c := clock.NewFake(t0)
	ran := 0
	c.AfterFunc(0, func() { ran++ })
	c.AfterFunc(-time.Second, func() { ran++ })
	if ran != 0 {
		t.Fatal("Fake callback ran before Advance")
	}
	c.Advance(0)
	if ran != 2 {
		t.Fatalf("ran = %d after Advance(0), want 2", ran)
	}
	if got := c.Now(); !got.Equal(t0) {
		t.Fatalf("Now() = %v, want %v", got, t0)
	}
}

func TestFakeStop(t *testing.T) {
	c := clock.NewFake(t0)
	ran := false
	tm := c.AfterFunc(time.Second, func() { ran = true })
	if !tm.Stop() {
		t.Fatal("Stop of armed timer = false, want true")
	}
	if tm.Stop() {
		t.Fatal("second Stop = true, want false")
	}
	if got := c.Pending(); got != 0 {
		t.Fatalf("Pending() = %d, want 0", got)
	}
	c.Advance(time.Hour)
	if ran {
		t.Fatal("stopped timer ran")
	}

	fired := c.AfterFunc(time.Second, func() {})
	c.Advance(time.Second)
	if fired.Stop() {
		t.Fatal("Stop of fired timer = true, want false")
	}
}

func TestFakeStopFromCallback(t *testing.T) {
	c := clock.NewFake(t0)
	var ran []string
	var second clock.Timer
	c.AfterFunc(time.Second, func() {
		ran = append(ran, "first")
		if !second.Stop() {
			t.Error("Stop of due-but-not-run timer = false, want true")
		}
	})
	second = c.AfterFunc(2*time.Second, func() { ran = append(ran, "second") })
	c.Advance(3 * time.Second)
	if !reflect.DeepEqual(ran, []string{"first"}) {
		t.Fatalf("ran = %v, want [first]", ran)
	}
}

func TestFakeReset(t *testing.T) {
	c := clock.NewFake(t0)
	var at []time.Duration
	tm := c.AfterFunc(time.Second, func() { at = append(at, c.Now().Sub(t0)) })

	// Reset an armed timer: returns true and moves the deadline (relative to Now).
	c.Advance(500 * time.Millisecond)
	if !tm.Reset(2 * time.Second) {
		t.Fatal("Reset of armed timer = false, want true")
	}
	c.Advance(time.Second) // t0+1.5s: original deadline passed, new one not
	if len(at) != 0 {
		t.Fatalf("timer fired at %v, before its reset deadline", at)
	}
	c.Advance(time.Second) // t0+2.5s
	if !reflect.DeepEqual(at, []time.Duration{2500 * time.Millisecond}) {
		t.Fatalf("fired at %v, want [2.5s]", at)
	}

	// Reset a fired timer: returns false and re-arms it.
	if tm.Reset(time.Second) {
		t.Fatal("Reset of fired timer = true, want false")
	}
	if got := c.Pending(); got != 1 {
		t.Fatalf("Pending() = %d after Reset, want 1", got)
	}
	c.Advance(time.Second)
	if !reflect.DeepEqual(at, []time.Duration{2500 * time.Millisecond, 3500 * time.Millisecond}) {
		t.Fatalf("fired at %v, want [2.5s 3.5s]", at)
	}

	// Reset a stopped timer: returns false and re-arms it.
	c.AfterFunc(0, func() {}).Stop()
	tm.Reset(time.Hour)
	tm.Stop()
	if tm.Reset(time.Second) {
		t.Fatal("Reset of stopped timer = true, want false")
	}
	c.Advance(time.Second)
	if len(at) != 3 {
		t.Fatalf("re-armed stopped timer did not fire: %v", at)
	}
}

func TestFakeCallbackSchedulesTimers(t *testing.T) {
	c := clock.NewFake(t0)
	var events []string
	var nows []time.Duration
	record := func(name string) {
		events = append(events, name)
		nows = append(nows, c.Now().Sub(t0))
	}
	c.AfterFunc(time.Second, func() {
		record("parent")
		// Due at 3s, within the window: runs in this same Advance, after
		// "sibling" (deadline 2.5s).
		c.AfterFunc(2*time.Second, func() { record("child-in-window") })
		// Due after the window: must not run yet.
		c.AfterFunc(10*time.Second, func() { record("child-later") })
	})
	c.AfterFunc(2500*time.Millisecond, func() { record("sibling") })

	c.Advance(5 * time.Second)
	wantEvents := []string{"parent", "sibling", "child-in-window"}
	if !reflect.DeepEqual(events, wantEvents) {
		t.Fatalf("events = %v, want %v", events, wantEvents)
	}
	wantNows := []time.Duration{time.Second, 2500 * time.Millisecond, 3 * time.Second}
	if !reflect.DeepEqual(nows, wantNows) {
		t.Fatalf("Now() in callbacks = %v, want %v", nows, wantNows)
	}
	if got := c.Pending(); got != 1 {
		t.Fatalf("Pending() = %d, want 1 (child-later)", got)
	}
	c.Advance(6 * time.Second)
	if events[len(events)-1] != "child-later" {
		t.Fatalf("events = %v, want child-later last", events)
	}
}

func TestFakePeriodicReset(t *testing.T) {
	// A callback that resets its own timer behaves like a ticker, and every
	// tick inside the window runs within one Advance.
	c := clock.NewFake(t0)
	var ticks []time.Duration
	var tm clock.Timer
	tm = c.AfterFunc(time.Second, func() {
		ticks = append(ticks, c.Now().Sub(t0))
		if tm.Reset(time.Second) {
			t.Error("Reset from own callback = true, want false (timer already fired)")
		}
	})
	c.Advance(5 * time.Second)
	want := []time.Duration{1 * time.Second, 2 * time.Second, 3 * time.Second, 4 * time.Second, 5 * time.Second}
	if !reflect.DeepEqual(ticks, want) {
		t.Fatalf("ticks = %v, want %v", ticks, want)
	}
	if got, want := c.Now(), t0.Add(5*time.Second); !got.Equal(want) {
		t.Fatalf("Now() = %v, want %v", got, want)
	}
	if !tm.Stop() {
		t.Fatal("Stop of re-armed ticker = false, want true")
	}
}

func TestFakeAdvanceWaitsForCallbacks(t *testing.T) {
	// Callbacks run synchronously, so their effects are visible as soon as
	// Advance returns, with no extra synchronisation.
	c := clock.NewFake(t0)
	done := false
	c.AfterFunc(time.Minute, func() { done = true })
	c.Advance(time.Minute)
	if !done {
		t.Fatal("callback had not completed when Advance returned")
	}
}

func TestWaitForTimers(t *testing.T) {
	c := clock.NewFake(t0)

	// Already satisfied: returns immediately even with a cancelled context.
	cancelled, cancel := context.WithCancel(context.Background())
	cancel()
	if err := c.WaitForTimers(cancelled, 0); err != nil {
		t.Fatalf("WaitForTimers(0) = %v, want nil", err)
	}

	// The code under test arms its timers in another goroutine.
	start := make(chan struct{})
	fired := make(chan struct{})
	var wg sync.WaitGroup
	wg.Add(1)
	go func() {
		defer wg.Done()
		<-start
		c.AfterFunc(time.Second, func() {})
		c.AfterFunc(time.Minute, func() { close(fired) })
	}()

	ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
	defer cancel()
	errc := make(chan error, 1)
	go func() { errc <- c.WaitForTimers(ctx, 2) }()
	close(start)
	if err := <-errc; err != nil {
		t.Fatalf("WaitForTimers(2) = %v, want nil", err)
	}
	wg.Wait()
	c.Advance(time.Minute)
	select {
	case <-fired:
	default:
		t.Fatal("timer armed by goroutine did not fire on Advance")
	}
}

func TestWaitForTimersDeadline(t *testing.T) {
	c := clock.NewFake(t0)
	c.AfterFunc(time.Second, func() {})
	ctx, cancel := context.WithTimeout(context.Background(), 20*time.Millisecond)
	defer cancel()
	err := c.WaitForTimers(ctx, 2)
	if !errors.Is(err, context.DeadlineExceeded) {
		t.Fatalf("WaitForTimers = %v, want %v", err, context.DeadlineExceeded)
	}
}

func TestWaitForTimersSeesReset(t *testing.T) {
	c := clock.NewFake(t0)
	tm := c.AfterFunc(time.Second, func() {})
	c.Advance(time.Second) // fired: nothing armed
	ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
	defer cancel()
	errc := make(chan error, 1)
	go func() { errc <- c.WaitForTimers(ctx, 1) }()
	tm.Reset(time.Second)
	if err := <-errc; err != nil {
		t.Fatalf("WaitForTimers after Reset = %v, want nil", err)
	}
}

func TestFakeConcurrent(t *testing.T) {
	c := clock.NewFake(t0)
	const workers = 8
	const perWorker = 200

	var ran, want atomic.Int64
	var wg sync.WaitGroup
	stopAdvancing := make(chan struct{})
	var advWG sync.WaitGroup
	advWG.Add(1)
	go func() { // keeps moving time while timers are created, stopped and reset
		defer advWG.Done()
		for {
			select {
			case <-stopAdvancing:
				return
			default:
				c.Advance(time.Millisecond)
				_ = c.Pending()
			}
		}
	}()
	for w := range workers {
		wg.Add(1)
		go func() {
			defer wg.Done()
			for i := range perWorker {
				d := time.Duration(1+(w*perWorker+i)%50) * time.Millisecond
				tm := c.AfterFunc(d, func() {
					_ = c.Now() // callbacks may use the clock
					ran.Add(1)
				})
				switch i % 3 {
				case 0: // runs once unless Stop prevented it
					if !tm.Stop() {
						want.Add(1)
					}
				case 1: // runs once, or twice if it had already fired before Reset
					if tm.Reset(d) {
						want.Add(1)
					} else {
						want.Add(2)
					}
				default:
					want.Add(1)
				}
				_ = c.Now()
			}
		}()
	}
	wg.Wait()
	close(stopAdvancing)
	advWG.Wait()

	c.Advance(time.Second) // everything still armed is due by now
	if got := c.Pending(); got != 0 {
		t.Fatalf("Pending() = %d, want 0", got)
	}
	if got, want := ran.Load(), want.Load(); got != want {
		t.Fatalf("callbacks ran %d times, want %d", got, want)
	}
}
