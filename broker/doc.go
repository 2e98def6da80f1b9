// Package broker is natstone's engine: it answers the request/reply API of package subjects over
// NATS, keeps an earliest-deadline-first index of every queue in memory, and stores every message in
// JetStream through package kv.
//
// A Broker owns a set of queues. Each queue serialises its decisions behind one mutex and pipelines
// the compare-and-swap writes they produce, so throughput is bounded by JetStream's write rate rather
// than by round trips. Time-driven transitions (invisibility ending, lease expiry, garbage
// collection) run from one timer per kind of deadline per queue, on an injected clock.
//
// On Start the broker takes the store's claim, waiting as a standby while another broker serves
// it, then rebuilds every index from storage and reconciles exclusivity locks before it answers any
// request; a broker can therefore be killed at any moment and restarted on the same storage, or
// replaced by its standby. docs/design.md explains the storage layout, the claim and the write order
// that make that safe.
package broker
