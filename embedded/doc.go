// Package embedded runs natstone inside a Go program: a nats-server with JetStream on a local data
// directory and a broker on it, started and stopped in order. `natstone serve` is this package
// plus flags and signals.
//
//	ns, err := embedded.Start(ctx, &embedded.Config{DataDir: "natstone-data"})
//	...
//	defer ns.Stop(context.Background())
//	nc, err := ns.Connect() // an in-process client connection; or nats.Connect(ns.ClientURL())
package embedded
