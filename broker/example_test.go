package broker_test

import (
	"context"
	"encoding/json"
	"fmt"
	"io"
	"log/slog"
	"os"
	"time"

	"github.com/nats-io/nats-server/v2/server"
	"github.com/nats-io/nats.go"

	"github.com/natstone/natstone/broker"
	"github.com/natstone/natstone/subjects"
)

// Example embeds natstone in a Go program: an in-process NATS server with JetStream, a broker on it,
// and plain NATS requests to enqueue, dequeue and complete.
func Example() {
	dir, _ := os.MkdirTemp("", "natstone-example")
	defer os.RemoveAll(dir)
	ns, _ := server.NewServer(&server.Options{JetStream: true, StoreDir: dir, DontListen: true, NoLog: true, NoSigs: true})
	ns.Start()
	defer ns.WaitForShutdown()
	defer ns.Shutdown()
	if !ns.ReadyForConnections(10 * time.Second) {
		panic("nats-server not ready")
	}
	nc, _ := nats.Connect("", nats.InProcessServer(ns))
	defer nc.Close()

	b, _ := broker.New(&broker.Config{Conn: nc, Logger: slog.New(slog.NewTextHandler(io.Discard, nil))})
	if err := b.Start(context.Background()); err != nil {
		panic(err)
	}
	defer b.Stop(context.Background())

	// Plain NATS requests with the wire types of package subjects.
	space, _ := subjects.NewSpace("")
	call := func(op subjects.Op, body, reply any) {
		data, _ := json.Marshal(body)
		msg, err := nc.Request(space.Subject(op, "emails"), data, 5*time.Second)
		if err != nil {
			panic(err)
		}
		if err := json.Unmarshal(msg.Data, reply); err != nil {
			panic(err)
		}
	}
	var enq subjects.EnqueueReply
	call(subjects.OpEnqueue, subjects.EnqueueRequest{ID: "welcome-42", Payload: "hi", Priority: ptr[int64](2)}, &enq)
	call(subjects.OpEnqueue, subjects.EnqueueRequest{ID: "reset-7", Payload: "urgent", Priority: ptr[int64](1)}, &enq)

	var dq subjects.DequeueReply
	call(subjects.OpDequeue, subjects.DequeueRequest{Batch: 1}, &dq)
	m := dq.Messages[0]
	fmt.Println("leased", m.ID, *m.Payload)

	var done subjects.Message
	call(subjects.OpComplete, subjects.LeaseRequest{ID: m.ID, LeaseID: m.LeaseID}, &done)
	fmt.Println(done.ID, done.State)
	// Output:
	// leased reset-7 urgent
	// reset-7 completed
}
