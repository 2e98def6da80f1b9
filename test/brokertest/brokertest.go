// Package brokertest starts a natstone broker for tests, on a test NATS server.
package brokertest

import (
	"context"
	"io"
	"log/slog"
	"testing"

	"github.com/natstone/natstone/broker"
	"github.com/natstone/natstone/test/natstest"
)

// Start starts a broker on srv the way `natstone serve` does — one connection for requests, one
// for storage — with its logs discarded, and stops it at the test's cleanup. mod may adjust the
// config before it starts.
func Start(t testing.TB, srv *natstest.Server, mod ...func(*broker.Config)) *broker.Broker {
	t.Helper()
	cfg := broker.Config{
		Conn:      srv.Connect(t),
		StoreConn: srv.Connect(t),
		Logger:    slog.New(slog.NewTextHandler(io.Discard, nil)),
	}
	for _, m := range mod {
		m(&cfg)
	}
	b, err := broker.New(&cfg)
	if err != nil {
		t.Fatal(err)
	}
	if err := b.Start(context.Background()); err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() {
		if err := b.Stop(context.Background()); err != nil {
			t.Error(err)
		}
	})
	return b
}
