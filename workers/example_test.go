package workers_test

import (
	"context"
	"errors"
	"fmt"
	"io"
	"log/slog"
	"os"
	"time"

	"github.com/nats-io/nats-server/v2/server" // examples embed a server; package workers never imports it
	"github.com/nats-io/nats.go"

	"github.com/natstone/natstone/broker"
	"github.com/natstone/natstone/embedded"
	"github.com/natstone/natstone/subjects"
	"github.com/natstone/natstone/workers"
)

// Example_embedded runs natstone inside a Go program (package embedded: a NATS server with
// JetStream and a broker) and talks to it through a client.
func Example_embedded() {
	ctx := context.Background()
	dir, _ := os.MkdirTemp("", "natstone-example")
	defer os.RemoveAll(dir)
	ns, err := embedded.Start(ctx, &embedded.Config{DataDir: dir, NoListen: true})
	if err != nil {
		panic(err)
	}
	defer ns.Stop(ctx)
	nc, _ := ns.Connect()
	defer nc.Close()

	c, _ := workers.NewClient(nc, nil)
	r, err := c.Enqueue(ctx, "emails", []byte("hello"), &workers.EnqueueOpts{ID: "welcome-42"})
	if err != nil {
		panic(err)
	}
	fmt.Println(r.ID, r.State)
	// Output: welcome-42 pending
}

// ExampleClient enqueues to an exclusive queue, dequeues in earliest-deadline-first order and
// completes what it leased.
func ExampleClient() {
	nc, stop := startNatstone() // in a real program: nats.Connect(nats.DefaultURL)
	defer stop()
	ctx := context.Background()

	c, _ := workers.NewClient(nc, nil)
	if _, err := c.CreateQueue(ctx, "encode", &workers.QueueOpts{Type: subjects.Exclusive, ExclusivityKey: "project"}); err != nil {
		panic(err)
	}
	now := time.Now()
	for _, j := range []struct {
		id, project string
		deadline    time.Duration
	}{{"job-1", "foo", time.Hour}, {"job-2", "foo", time.Minute}, {"job-3", "bar", 30 * time.Minute}} {
		opts := &workers.EnqueueOpts{ID: j.id, Deadline: now.Add(j.deadline), Metadata: map[string]string{"project": j.project}}
		if _, err := c.Enqueue(ctx, "encode", []byte("encode "+j.id), opts); err != nil {
			panic(err)
		}
	}

	// The earliest deadline of each project: one running message per project at a time.
	msgs, err := c.Dequeue(ctx, "encode", &workers.DequeueOpts{Batch: 10, Wait: time.Second})
	if err != nil {
		panic(err)
	}
	for _, m := range msgs {
		fmt.Printf("%s %q\n", m.ID, m.Payload)
		if _, err := c.Complete(ctx, "encode", m.ID, m.LeaseID); err != nil {
			panic(err)
		}
	}
	counts, _ := c.Depth(ctx, "encode", nil)
	fmt.Printf("completed %d, pending %d\n", counts.Completed, counts.Pending)
	// Output:
	// job-2 "encode job-2"
	// job-3 "encode job-3"
	// completed 2, pending 1
}

// ExampleAPIError shows the error of a stale lease holder.
func ExampleAPIError() {
	nc, stop := startNatstone()
	defer stop()
	ctx := context.Background()

	c, _ := workers.NewClient(nc, nil)
	if _, err := c.Enqueue(ctx, "emails", []byte("hi"), &workers.EnqueueOpts{ID: "m1"}); err != nil {
		panic(err)
	}
	msgs, _ := c.Dequeue(ctx, "emails", nil)
	if _, err := c.Release(ctx, "emails", "m1", msgs[0].LeaseID, nil); err != nil {
		panic(err)
	}

	_, err := c.Complete(ctx, "emails", "m1", msgs[0].LeaseID)
	fmt.Println(errors.Is(err, workers.ErrInvalidState))
	var apiErr *workers.APIError
	if errors.As(err, &apiErr) {
		fmt.Println(apiErr.Code, apiErr.Status)
	}
	// Output:
	// true
	// invalid_state 409
}

// ExampleWorker processes a message with a Worker: returning nil completes it.
func ExampleWorker() {
	nc, stop := startNatstone()
	defer stop()
	ctx := context.Background()

	c, _ := workers.NewClient(nc, nil)
	if _, err := c.Enqueue(ctx, "emails", []byte("welcome, Ada"), nil); err != nil {
		panic(err)
	}

	handled := make(chan struct{})
	w, err := workers.NewWorker(c, &workers.WorkerConfig{Queue: "emails", Concurrency: 4, Logger: quietLogger()},
		workers.HandlerFunc(func(ctx context.Context, job *workers.Job) error {
			fmt.Printf("sending %q, attempt %d\n", job.Payload, job.Attempts)
			close(handled)
			return nil // completed; an error would retry it later, workers.Discard(err) cancel it
		}))
	if err != nil {
		panic(err)
	}
	if err := w.Start(ctx); err != nil {
		panic(err)
	}
	<-handled
	stopCtx, cancel := context.WithTimeout(ctx, 10*time.Second)
	defer cancel()
	if err := w.Stop(stopCtx); err != nil { // waits for the handled message to be completed
		panic(err)
	}

	counts, _ := c.Depth(ctx, "emails", nil)
	fmt.Println("completed:", counts.Completed)
	// Output:
	// sending "welcome, Ada", attempt 1
	// completed: 1
}

// startNatstone starts an in-process NATS server and a broker, as in Example_embedded, and returns a
// connection to them and a function that stops everything.
func startNatstone() (*nats.Conn, func()) {
	dir, err := os.MkdirTemp("", "natstone-example")
	if err != nil {
		panic(err)
	}
	ns, err := server.NewServer(&server.Options{JetStream: true, StoreDir: dir, DontListen: true, NoLog: true, NoSigs: true})
	if err != nil {
		panic(err)
	}
	ns.Start()
	if !ns.ReadyForConnections(10 * time.Second) {
		panic("nats-server not ready")
	}
	nc, err := nats.Connect("", nats.InProcessServer(ns))
	if err != nil {
		panic(err)
	}
	b, err := broker.New(&broker.Config{Conn: nc, MemoryStorage: true, Logger: quietLogger()})
	if err != nil {
		panic(err)
	}
	if err := b.Start(context.Background()); err != nil {
		panic(err)
	}
	return nc, func() {
		_ = b.Stop(context.Background())
		nc.Close()
		ns.Shutdown()
		ns.WaitForShutdown()
		_ = os.RemoveAll(dir)
	}
}

func quietLogger() *slog.Logger { return slog.New(slog.NewTextHandler(io.Discard, nil)) }

// ExampleClient_Schedule sets a nightly report: at 02:00 in Paris every day, a message due within
// the hour (its priority the fire time plus an hour) lands in the reports queue.
func ExampleClient_Schedule() {
	nc, stop := startNatstone() // in a real program: nats.Connect(nats.DefaultURL)
	defer stop()
	ctx := context.Background()

	c, _ := workers.NewClient(nc, nil)
	s, err := c.Schedule(ctx, "reports", "nightly", workers.ScheduleOpts{
		Cron:     "CRON_TZ=Europe/Paris 0 2 * * *",
		Payload:  []byte(`{"report": "daily"}`),
		Metadata: map[string]string{"kind": "report"},
		Deadline: time.Hour,
	})
	if err != nil {
		panic(err)
	}
	paris, _ := time.LoadLocation("Europe/Paris")
	next := s.NextAt.In(paris)
	fmt.Println(s.Name, s.NextAt.After(time.Now()), next.Format("15:04:05"))
	// Output: nightly true 02:00:00
}
