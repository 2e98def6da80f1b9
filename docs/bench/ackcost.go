//go:build ignore

// ackcost measures what a JetStream acknowledgement per message costs: 2 KiB messages published
// into a file stream on an embedded nats-server, each with its own acknowledgement (as the
// payloads of an enqueue are) or in groups of 100 with only the last acknowledged (as the events
// are). Run from the repository root: go run docs/bench/ackcost.go (docs/performance.md).
package main

import (
	"context"
	"fmt"
	"os"
	"syscall"
	"time"

	"github.com/nats-io/nats-server/v2/server"
	"github.com/nats-io/nats.go"
	"github.com/nats-io/nats.go/jetstream"
)

func cpu() time.Duration {
	var ru syscall.Rusage
	syscall.Getrusage(syscall.RUSAGE_SELF, &ru)
	return time.Duration(ru.Utime.Nano() + ru.Stime.Nano())
}

func main() {
	dir, _ := os.MkdirTemp("", "exp")
	defer os.RemoveAll(dir)
	opts := &server.Options{JetStream: true, StoreDir: dir, Port: -1, Host: "127.0.0.1", NoSigs: true}
	s, err := server.NewServer(opts)
	if err != nil {
		panic(err)
	}
	go s.Start()
	if !s.ReadyForConnections(10 * time.Second) {
		panic("not ready")
	}
	defer s.Shutdown()
	nc, err := nats.Connect("", nats.InProcessServer(s))
	if err != nil {
		panic(err)
	}
	js, _ := jetstream.New(nc, jetstream.WithPublishAsyncMaxPending(1<<16))
	ctx := context.Background()
	payload := make([]byte, 2048)
	const N = 200000
	const batch = 100
	for round := 0; round < 3; round++ {
		for _, mode := range []string{"acks", "lastack"} {
			name := fmt.Sprintf("S%d%s", round, mode)
			st, err := js.CreateStream(ctx, jetstream.StreamConfig{Name: name, Subjects: []string{name + ".>"}})
			if err != nil {
				panic(err)
			}
			subj := name + ".q"
			c0, t0 := cpu(), time.Now()
			var last jetstream.PubAckFuture
			for i := 0; i < N; i += batch {
				var fs []jetstream.PubAckFuture
				for j := 0; j < batch; j++ {
					if mode == "acks" || j == batch-1 {
						f, err := js.PublishMsgAsync(&nats.Msg{Subject: subj, Data: payload, Header: nats.Header{"Natstone-Message-Id": {"abcdefgh"}}})
						if err != nil {
							panic(err)
						}
						fs = append(fs, f)
					} else {
						if err := nc.PublishMsg(&nats.Msg{Subject: subj, Data: payload, Header: nats.Header{"Natstone-Message-Id": {"abcdefgh"}}}); err != nil {
							panic(err)
						}
					}
				}
				last = fs[len(fs)-1]
				if i/batch%64 == 63 { // 64 requests in flight
					select {
					case <-last.Ok():
					case err := <-last.Err():
						panic(err)
					}
				}
			}
			select {
			case <-last.Ok():
			case err := <-last.Err():
				panic(err)
			}
			el, c := time.Since(t0), cpu()-c0
			info, _ := st.Info(ctx)
			fmt.Printf("%-8s %8.0f msgs/s  %5.2f µs CPU/msg  stored %d\n", mode, N/el.Seconds(), float64(c.Microseconds())/N, info.State.Msgs)
			js.DeleteStream(ctx, name)
		}
	}
}
