// Package kv keeps natstone's records in JetStream: queue configs, message records, exclusivity
// locks, schedules and the store's claim in KV buckets, and message payloads in a plain stream addressed by
// sequence.
//
// Layout (with the default prefix "natstone"):
//
//	KV   natstone-queues    <queue>                 → QueueRecord (JSON)
//	KV   natstone-messages  <queue>.<b64url(id)>    → Record (binary, see codec.go): the whole message but its payload
//	KV   natstone-locks     <queue>.<b64url(value)> → Lock (JSON): who holds an exclusivity value
//	KV   natstone-schedules <queue>.<name>          → ScheduleRecord (JSON): a recurring enqueue and its last fire
//	KV   natstone-claims    broker                  → Claim (JSON): the broker serving the store (Claims)
//	Stream natstone-bodies  natstone.body.<queue>   → the payload; its sequence is in Record.BodySeq,
//	                                                  its header Natstone-Message-Id is b64url(id)
//
// A payload is immutable, so it is written once and read by sequence with a direct get; keeping it out
// of the KV record keeps state writes small and gives the server one index entry per message (the
// record key), not two. The payload's stream sequence is also the message's FIFO tie-breaker.
//
// Every record write is a compare-and-swap on the key's revision (its last stream sequence), issued as
// an asynchronous publish so that many writes are in flight at once: see [Store.WriteMessage].
// This package holds no queue logic; the broker decides what to write.
package kv
