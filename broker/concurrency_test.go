package broker_test

import (
	"fmt"
	"sync"
	"testing"
	"time"

	"github.com/natstone/natstone/subjects"
)

// TestConcurrentWorkers runs many workers against one queue and checks that every message is
// completed exactly once, no message is held by two workers at once, in an exclusive queue no two
// workers hold the same value at once, and with max_running no more than that many are held.
func TestConcurrentWorkers(t *testing.T) {
	t.Parallel()
	for _, c := range []struct {
		exclusive  bool
		maxRunning int
		perValue   int // max_running_per_value (exclusive: 0 is 1)
	}{{false, 0, 0}, {true, 0, 0}, {false, 3, 0}, {true, 3, 0}, {true, 0, 3}} {
		exclusive, perValue := c.exclusive, max(c.perValue, 1)
		t.Run(fmt.Sprintf("exclusive=%v,max_running=%d,per_value=%d", exclusive, c.maxRunning, c.perValue), func(t *testing.T) {
			t.Parallel()
			e := setup(t)
			cfg := subjects.CreateQueueRequest{LeaseMS: 60_000, MaxRunning: c.maxRunning}
			if exclusive {
				cfg.Type, cfg.ExclusivityKey, cfg.MaxRunningPerValue = subjects.Exclusive, "p", c.perValue
			}
			e.create("q", cfg)
			const n, workers = 400, 8
			var batch subjects.EnqueueBatchRequest
			for i := range n {
				batch.Messages = append(batch.Messages, subjects.EnqueueRequest{
					ID:       fmt.Sprintf("m%03d", i),
					Priority: ptr(int64(i % 37)),
					Metadata: map[string]string{"p": fmt.Sprintf("v%d", i%10)},
				})
			}
			must[subjects.EnqueueBatchReply](e, subjects.OpEnqueueBatch, "q", batch)

			// Under max_running, the workers without room long-poll for it (parked polls served
			// as room is made) rather than spin; the polls left parked at the end are released by
			// moving the broker's (fake) clock past their wait.
			var wait int64
			if c.maxRunning > 0 {
				wait = 100
			}
			finished, released := make(chan struct{}), make(chan struct{})
			go func() {
				<-finished
				for {
					e.advance(time.Second)
					select {
					case <-released:
						return
					case <-time.After(10 * time.Millisecond):
					}
				}
			}()
			var mu sync.Mutex
			heldMsg := map[string]string{}          // message id → worker
			heldVal := map[string]map[string]bool{} // value → message ids
			completed := map[string]int{}
			var wg sync.WaitGroup
			errs := make(chan error, workers)
			for w := range workers {
				wg.Add(1)
				go func() {
					defer wg.Done()
					nc := e.srv.Connect(t)
					for {
						msg, err := nc.Request(e.space.Subject(subjects.OpDequeue, "q"), mustJSON(t, subjects.DequeueRequest{Batch: 1 + w%3, WaitMS: wait}), 10e9)
						if err != nil {
							errs <- err
							return
						}
						rep, rerr := decodeReply[subjects.DequeueReply](t, msg)
						if rerr != nil {
							errs <- rerr
							return
						}
						if len(rep.Messages) == 0 {
							mu.Lock()
							done := len(completed) == n
							mu.Unlock()
							if done {
								return
							}
							continue
						}
						for _, m := range rep.Messages {
							mu.Lock()
							if other, ok := heldMsg[m.ID]; ok {
								errs <- fmt.Errorf("message %s leased to worker %d while worker %s holds it", m.ID, w, other)
							}
							heldMsg[m.ID] = fmt.Sprint(w)
							if c.maxRunning > 0 && len(heldMsg) > c.maxRunning {
								select { // once is enough: errs holds one error per worker
								case errs <- fmt.Errorf("%d messages held at once, max_running %d", len(heldMsg), c.maxRunning):
								default:
								}
							}
							if exclusive {
								v := m.Metadata["p"]
								if heldVal[v] == nil {
									heldVal[v] = map[string]bool{}
								}
								if heldVal[v][m.ID] = true; len(heldVal[v]) > perValue {
									select { // once is enough: errs holds one error per worker
									case errs <- fmt.Errorf("value %s leased with %s while %d others hold it (max_running_per_value %d)", v, m.ID, len(heldVal[v])-1, perValue):
									default:
									}
								}
							}
							mu.Unlock()
						}
						for _, m := range rep.Messages {
							// Release the test's own bookkeeping first: the broker only frees the
							// value after the complete is stored, so a correct broker never overlaps.
							mu.Lock()
							delete(heldMsg, m.ID)
							delete(heldVal[m.Metadata["p"]], m.ID)
							mu.Unlock()
							reply, err := nc.Request(e.space.Subject(subjects.OpComplete, "q"), mustJSON(t, subjects.LeaseRequest{ID: m.ID, LeaseID: m.LeaseID}), 10e9)
							if err != nil {
								errs <- err
								return
							}
							if _, rerr := decodeReply[subjects.Message](t, reply); rerr != nil {
								errs <- fmt.Errorf("complete %s: %w", m.ID, rerr)
								return
							}
							mu.Lock()
							completed[m.ID]++
							if len(completed) == n && completed[m.ID] == 1 {
								close(finished)
							}
							mu.Unlock()
						}
					}
				}()
			}
			wg.Wait()
			close(released)
			close(errs)
			for err := range errs {
				t.Error(err)
			}
			for id, c := range completed {
				if c != 1 {
					t.Errorf("message %s completed %d times", id, c)
				}
			}
			if len(completed) != n {
				t.Errorf("completed %d of %d", len(completed), n)
			}
			if c := e.depth("q", nil); c.Completed != n || c.Pending+c.Running+c.Invisible != 0 {
				t.Errorf("final depth %+v", c)
			}
		})
	}
}
