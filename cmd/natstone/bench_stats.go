package main

import (
	"context"
	"errors"
	"fmt"
	"io"
	"os"
	"slices"
	"sync"
	"sync/atomic"
	"syscall"
	"time"
)

// benchLatency is the p50/p99/p999 of a set of samples; zero when there were none.
type benchLatency struct {
	P50, P99, P999 time.Duration
	N              int
}

// benchLatencyOf sorts samples in place and returns their percentiles.
func benchLatencyOf(samples []time.Duration) benchLatency {
	if len(samples) == 0 {
		return benchLatency{}
	}
	slices.Sort(samples)
	at := func(q float64) time.Duration {
		i := int(q * float64(len(samples)))
		return samples[min(i, len(samples)-1)]
	}
	return benchLatency{P50: at(0.50), P99: at(0.99), P999: at(0.999), N: len(samples)}
}

// benchProcessCPU returns the CPU time (user + system) this process has used so far.
func benchProcessCPU() time.Duration {
	var ru syscall.Rusage
	if err := syscall.Getrusage(syscall.RUSAGE_SELF, &ru); err != nil {
		return 0
	}
	return time.Duration(ru.Utime.Nano() + ru.Stime.Nano())
}

// benchCPUMeter measures the process's CPU seconds per wall second over a phase. Server, broker and
// clients all run in this process, so it is the CPU of the whole system under test.
type benchCPUMeter struct {
	wall time.Time
	cpu  time.Duration
}

func benchStartCPU() benchCPUMeter { return benchCPUMeter{wall: time.Now(), cpu: benchProcessCPU()} }

// ratio returns the CPU seconds used per wall second since the meter started.
func (m benchCPUMeter) ratio() float64 {
	wall := time.Since(m.wall)
	if wall <= 0 {
		return 0
	}
	return (benchProcessCPU() - m.cpu).Seconds() / wall.Seconds()
}

// benchResult is what one measured phase produced.
type benchResult struct {
	ops     int64         // operations (cycles, messages, writes) done
	elapsed time.Duration // from the start to the end of the last operation
	lat     benchLatency
	cpu     float64 // CPU seconds per wall second

	uncollected int           // terminal messages left when the loop ended (retention 0), collected before the phase ended
	collectWait time.Duration // how long that took, included in elapsed
}

// cpuPerOp returns the process CPU time one operation took on average.
func (r benchResult) cpuPerOp() time.Duration {
	if r.ops <= 0 {
		return 0
	}
	return time.Duration(r.cpu * float64(r.elapsed) / float64(r.ops))
}

// rate returns ops per second.
func (r benchResult) rate() float64 {
	if r.elapsed <= 0 {
		return 0
	}
	return float64(r.ops) / r.elapsed.Seconds()
}

// errBenchDrained is returned by an operation of a closed loop when there is nothing left to do: the
// loop stops without an error.
var errBenchDrained = errors.New("drained")

// benchLoopOp is one operation of a closed loop run by worker w. It returns how many units it did
// (messages, cycles) and the latency sample to record (0: none).
type benchLoopOp func(ctx context.Context, w int) (n int, lat time.Duration, err error)

// benchClosedLoop runs op in workers goroutines, each starting its next operation when the last one
// ends, until maxOps units are done, d has elapsed, an operation returns errDrained, or one fails.
func benchClosedLoop(ctx context.Context, p *benchProgress, name string, workers int, d time.Duration, maxOps int64, op benchLoopOp) (benchResult, error) {
	ctx, cancel := context.WithCancelCause(ctx)
	defer cancel(nil)
	var ops atomic.Int64
	var lastEnd atomic.Int64 // UnixNano of the end of the latest operation
	samples := make([][]time.Duration, workers)
	p.begin(name, &ops)
	meter := benchStartCPU()
	start := time.Now()
	deadline := start.Add(d)
	var wg sync.WaitGroup
	for w := range workers {
		wg.Go(func() {
			for ctx.Err() == nil && ops.Load() < maxOps && time.Now().Before(deadline) {
				n, lat, err := op(ctx, w)
				if errors.Is(err, errBenchDrained) {
					return
				}
				if err != nil {
					cancel(fmt.Errorf("%s: %w", name, err))
					return
				}
				if n == 0 {
					continue
				}
				now := time.Now().UnixNano()
				for {
					last := lastEnd.Load()
					if now <= last || lastEnd.CompareAndSwap(last, now) {
						break
					}
				}
				ops.Add(int64(n))
				if lat > 0 {
					samples[w] = append(samples[w], lat)
				}
			}
		})
	}
	wg.Wait()
	r := benchResult{ops: ops.Load(), cpu: meter.ratio()}
	if end := lastEnd.Load(); end > 0 {
		r.elapsed = time.Unix(0, end).Sub(start)
	}
	p.end(r)
	if err := context.Cause(ctx); err != nil {
		return r, err
	}
	r.lat = benchLatencyOf(slices.Concat(samples...))
	return r, nil
}

// benchMaxInFlight bounds the requests an open loop has outstanding; past it the loop falls behind its
// schedule, and the latencies (measured from each request's scheduled time) show it.
const benchMaxInFlight = 4096

// benchOpenLoop issues op at rate per second for d (at most maxOps times), whether or not earlier
// operations have ended, and records each operation's latency from its scheduled start to the time
// op returns as its end, so a stall delays the schedule's next requests and shows in their
// latencies (no coordinated omission).
func benchOpenLoop(ctx context.Context, p *benchProgress, name string, rate float64, d time.Duration, maxOps int64, op func(ctx context.Context) (time.Time, error)) (benchResult, error) {
	ctx, cancel := context.WithCancelCause(ctx)
	defer cancel(nil)
	total := min(maxOps, int64(rate*d.Seconds()))
	var ops atomic.Int64
	var mu sync.Mutex // guards samples and lastEnd
	samples := make([]time.Duration, 0, total)
	var lastEnd time.Time
	sem := make(chan struct{}, benchMaxInFlight)
	var wg sync.WaitGroup
	p.begin(name, &ops)
	meter := benchStartCPU()
	start := time.Now()
	for i := int64(0); i < total && ctx.Err() == nil; {
		due := min(total, int64(time.Since(start).Seconds()*rate)+1)
		for ; i < due && ctx.Err() == nil; i++ {
			scheduled := start.Add(time.Duration(float64(i) / rate * float64(time.Second)))
			select {
			case sem <- struct{}{}:
			case <-ctx.Done():
				continue
			}
			wg.Go(func() {
				defer func() { <-sem }()
				end, err := op(ctx)
				if err != nil {
					cancel(fmt.Errorf("%s: %w", name, err))
					return
				}
				ops.Add(1)
				mu.Lock()
				samples = append(samples, end.Sub(scheduled))
				if end.After(lastEnd) {
					lastEnd = end
				}
				mu.Unlock()
			})
		}
		time.Sleep(200 * time.Microsecond)
	}
	wg.Wait()
	r := benchResult{ops: ops.Load(), cpu: meter.ratio()}
	if !lastEnd.IsZero() {
		r.elapsed = lastEnd.Sub(start)
	}
	p.end(r)
	if err := context.Cause(ctx); err != nil {
		return r, err
	}
	r.lat = benchLatencyOf(samples)
	return r, nil
}

// benchProgress reports the phase in progress on stderr: a line rewritten in place every half second
// when stderr is a terminal, and a summary line at the end of every phase either way.
type benchProgress struct {
	w   io.Writer
	tty bool

	// mu guards the fields below and serialises writes to w.
	mu    sync.Mutex
	name  string
	start time.Time
	ops   *atomic.Int64
	stop  chan struct{}
	done  chan struct{}
}

func newBenchProgress(w io.Writer) *benchProgress {
	p := &benchProgress{w: w}
	if f, ok := w.(*os.File); ok {
		if fi, err := f.Stat(); err == nil && fi.Mode()&os.ModeCharDevice != 0 {
			p.tty = true
		}
	}
	return p
}

// begin starts reporting phase name, whose operations are counted in ops.
func (p *benchProgress) begin(name string, ops *atomic.Int64) {
	p.mu.Lock()
	defer p.mu.Unlock()
	p.name, p.start, p.ops = name, time.Now(), ops
	if !p.tty {
		return
	}
	p.stop, p.done = make(chan struct{}), make(chan struct{})
	go p.tick(p.stop, p.done)
}

func (p *benchProgress) tick(stop, done chan struct{}) {
	defer close(done)
	t := time.NewTicker(500 * time.Millisecond)
	defer t.Stop()
	for {
		select {
		case <-stop:
			return
		case <-t.C:
			p.mu.Lock()
			el := time.Since(p.start)
			n := p.ops.Load()
			fmt.Fprintf(p.w, "\r\033[K%-22s %6.1fs %10d ops %10.0f/s", p.name, el.Seconds(), n, float64(n)/el.Seconds())
			p.mu.Unlock()
		}
	}
}

// end stops the live line and prints the phase's summary.
func (p *benchProgress) end(r benchResult) {
	p.mu.Lock()
	stop, done := p.stop, p.done
	p.stop, p.done = nil, nil
	p.mu.Unlock()
	if stop != nil {
		close(stop)
		<-done
	}
	p.mu.Lock()
	defer p.mu.Unlock()
	prefix := ""
	if p.tty {
		prefix = "\r\033[K"
	}
	fmt.Fprintf(p.w, "%s%-22s %6.1fs %10d ops %10.0f/s  cpu %.2f\n", prefix, p.name, time.Since(p.start).Seconds(), r.ops, r.rate(), r.cpu)
}

// note prints a line of its own.
func (p *benchProgress) note(format string, args ...any) {
	p.mu.Lock()
	defer p.mu.Unlock()
	fmt.Fprintf(p.w, format+"\n", args...)
}
