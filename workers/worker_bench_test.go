package workers_test

import (
	"context"
	"encoding/json"
	"strings"
	"sync/atomic"
	"testing"
	"time"

	"github.com/nats-io/nats.go"

	"github.com/natstone/natstone/subjects"
	"github.com/natstone/natstone/workers"
)

// BenchmarkWorkerOverNetwork: a worker of 4 slots with 1 ms handlers, talking to the broker through
// a relay that delays each request and each reply by half a millisecond (a 1 ms round trip, as
// between two zones). "next" is the worker as it is: each complete carries the dequeue of the
// slot's next message. "no-next" has the relay strip that dequeue, so each message costs the slot a
// dequeue of its own, as with a worker that dequeues and completes apart. Reports messages/s.
func BenchmarkWorkerOverNetwork(b *testing.B) {
	for _, strip := range []bool{false, true} {
		name := "next"
		if strip {
			name = "no-next"
		}
		b.Run(name, func(b *testing.B) { benchWorkerOverNetwork(b, strip) })
	}
}

func benchWorkerOverNetwork(b *testing.B, stripNext bool) {
	const oneWay = 500 * time.Microsecond
	e := setupB(b)
	e.createQueue("q", nil)
	for sent := 0; sent < b.N; {
		batch := make([]workers.BatchMessage, min(b.N-sent, subjects.MaxEnqueueBatch))
		for i := range batch {
			batch[i] = workers.BatchMessage{Payload: []byte("x")}
		}
		if _, err := e.c.EnqueueBatch(context.Background(), "q", batch); err != nil {
			b.Fatal(err)
		}
		sent += len(batch)
	}
	relay := e.srv.Connect(e.t)
	var stopping atomic.Bool // then the relay's last requests (the worker's abandoned poll) may fail
	sub, err := relay.Subscribe("relay.>", func(m *nats.Msg) {
		go func() {
			time.Sleep(oneWay)
			data := m.Data
			if stripNext && strings.HasPrefix(m.Subject, "relay.complete.") {
				var r subjects.LeaseRequest
				if err := json.Unmarshal(data, &r); err != nil {
					b.Error(err)
					return
				}
				r.Next = nil
				data, _ = json.Marshal(r)
			}
			reply, err := relay.Request("natstone.v1."+strings.TrimPrefix(m.Subject, "relay."), data, waitTimeout)
			if err != nil {
				if !stopping.Load() {
					b.Error(err)
				}
				return
			}
			time.Sleep(oneWay)
			_ = m.RespondMsg(&nats.Msg{Data: reply.Data, Header: reply.Header})
		}()
	})
	if err != nil {
		b.Fatal(err)
	}
	defer func() { _ = sub.Unsubscribe() }()
	c := e.client(&workers.Config{Prefix: "relay"})
	var handled atomic.Int64
	all := make(chan struct{})
	w, err := workers.NewWorker(c, &workers.WorkerConfig{Queue: "q", Concurrency: 4, Logger: discard()},
		workers.HandlerFunc(func(context.Context, *workers.Job) error {
			time.Sleep(time.Millisecond) // the job's work
			if handled.Add(1) == int64(b.N) {
				close(all)
			}
			return nil
		}))
	if err != nil {
		b.Fatal(err)
	}
	b.ResetTimer()
	if err := w.Start(context.Background()); err != nil {
		b.Fatal(err)
	}
	select {
	case <-all:
	case <-time.After(5 * time.Minute):
		b.Fatalf("%d of %d messages handled in 5 minutes", handled.Load(), b.N)
	}
	b.StopTimer()
	b.ReportMetric(float64(b.N)/b.Elapsed().Seconds(), "msgs/s")
	stopping.Store(true)
	ctx, cancel := context.WithTimeout(context.Background(), waitTimeout)
	defer cancel()
	if err := w.Stop(ctx); err != nil {
		b.Fatal(err)
	}
}
