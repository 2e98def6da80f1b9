// Package embedded runs natstone inside a Go program: a nats-server with JetStream on a local data
// directory and a broker on it, started and stopped in order. `natstone serve` is this package
// plus flags and signals.
//
//	ns, err := embedded.Start(ctx, &embedded.Config{DataDir: "natstone-data"})
//	...
//	defer ns.Stop(context.Background())
//	nc, err := ns.Connect() // an in-process client connection; or nats.Connect(ns.ClientURL())
//
// Things to know:
//   - By default the server listens on 127.0.0.1:4222, the port a `natstone serve` also takes; set
//     Listen ("127.0.0.1:0" for any free port) or NoListen. It has no authentication: keep it on
//     loopback, or run natstone against a NATS server of your own (broker.Config) to control access.
//   - Stop may be called from several goroutines (a signal handler's and a deferred one) and more
//     than once: every call returns when the one stop has ended. It closes the connections from
//     Connect once the server is down.
//   - The broker can stop on its own, when it loses its claim on the store to another broker on the
//     same store (a cluster, see broker.ErrClaimLost): ns.Broker().Done() is then closed, and a
//     program that serves on must watch it, as `natstone serve` does.
//   - Start's ctx bounds the broker's start (its claim and recovery); the nats-server's own start,
//     which recovers the JetStream store, runs to its end once begun.
//   - nats-server links the Antithesis SDK (test-harness instrumentation that does nothing outside
//     Antithesis). natstone's own binary builds against its no-op variant through a replace in
//     natstone's go.mod, which does not apply to a program that imports natstone: build that with
//     `-tags no_antithesis_sdk`, or add the same replace to its go.mod, to leave the SDK out.
package embedded
