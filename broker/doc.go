// Package broker is natstone's engine: it answers the request/reply API of package subjects over
// NATS, keeps an earliest-deadline-first index of every queue in memory, and stores every message in
// JetStream through package kv.
//
// A Broker owns a set of queues. Each queue serialises its decisions behind one mutex and pipelines
// the compare-and-swap writes they produce, so throughput is bounded by JetStream's write rate rather
// than by round trips. Time-driven transitions (invisibility ending, lease expiry, garbage
// collection) run from one timer per kind of deadline per queue, on an injected clock.
//
// On Start the broker rebuilds every index from storage and reconciles exclusivity locks before it
// answers any request; a broker can therefore be killed at any moment and restarted on the same
// storage. docs/design.md explains the storage layout and the write order that makes that safe.
package broker
