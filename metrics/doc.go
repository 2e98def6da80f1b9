// Package metrics exposes natstone's Prometheus metrics and an HTTP health check.
//
// [New] returns a [Metrics] with its own registry (plus the Go and process collectors). It is a
// [broker.Observer]: set it as broker.Config.Observer and the broker counts every request, record
// write and transition through it. [Metrics.Watch] hands it the broker's Snapshot method, which
// each scrape calls once for the gauges of queue depths, ages and the events publisher.
// [Metrics.Handler] serves the registry in the Prometheus exposition format; mount it at /metrics.
//
//	m := metrics.New()
//	b, _ := broker.New(&broker.Config{Conn: nc, Observer: m})
//	m.Watch(b.Snapshot)
//	http.Handle("/metrics", m.Handler())
//	http.Handle("/healthz", metrics.Health(metrics.HealthConfig{Conn: nc, Events: true}))
//
// # Metrics
//
// Durations are in seconds. The op label is a protocol operation (subjects.Ops: create, enqueue,
// dequeue, …), code is "ok" or an error code (subjects.Code), kind is an event kind
// (subjects.EventKinds), state a message state (subjects.States).
//
//	| name                                  | type      | labels           | meaning                                                                  |
//	|---------------------------------------|-----------|------------------|--------------------------------------------------------------------------|
//	| natstone_requests_total               | counter   | op, code         | requests taken (answered, or refused for their reply subject)            |
//	| natstone_request_duration_seconds     | histogram | op               | time from a request's arrival to its reply; dequeue includes long polls  |
//	| natstone_kv_write_duration_seconds    | histogram |                  | message record writes, from publish to acknowledgement or failure        |
//	| natstone_kv_write_errors_total        | counter   |                  | message record writes that failed                                        |
//	| natstone_payload_write_errors_total   | counter   |                  | enqueues whose payloads storage did not take (answered unavailable)      |
//	| natstone_transitions_total            | counter   | queue, kind      | stored transitions of messages                                           |
//	| natstone_lease_expiries_total         | counter   | queue            | leases that ran out (kind expired, or errored with reason lease_expired) |
//	| natstone_queue_wait_seconds           | histogram | queue            | how long each message leased had waited pending (from its visible_at)    |
//	| natstone_queue_messages               | gauge     | queue, state     | messages in each of the six states                                       |
//	| natstone_queue_oldest_pending_seconds | gauge     | queue            | how long the longest-waiting pending message has waited (0: none), from the start of its second |
//	| natstone_queue_blocked                | gauge     | queue, direction | 1 if enqueue (direction enqueue) or dequeue (dequeue) is blocked, else 0 |
//	| natstone_queue_exclusivity_values     | gauge     | queue            | an exclusive queue's exclusivity values the broker keeps (none: simple) |
//	| natstone_schedule_next_fire_timestamp_seconds | gauge | queue, schedule | when a schedule fires next (Unix seconds; 0: never)             |
//	| natstone_schedule_last_fire_timestamp_seconds | gauge | queue, schedule | when it last fired (0: never)                                   |
//	| natstone_schedule_failing             | gauge     | queue, schedule  | 1 if its last fire enqueued nothing (the queue refused it), or it cannot fire (invalid), else 0 |
//	| natstone_schedule_skipped_total       | counter   | queue, schedule  | its fire times with no message enqueued (stored: kept across restarts)   |
//	| natstone_schedule_overlap_skipped_total | counter | queue, schedule | its fire times left out by overlap skip (its last message unfinished) |
//	| natstone_schedule_paused              | gauge     | queue, schedule  | 1 while it is paused (it fires at none of its times), else 0             |
//	| natstone_events_published_total       | counter   |                  | events stored in the events stream                                       |
//	| natstone_events_dropped_total         | counter   |                  | events given up on (buffer full, or the stream refused them)             |
//	| natstone_events_buffered              | gauge     |                  | events waiting to be published                                           |
//	| natstone_events_enabled               | gauge     |                  | 1 if the events stream is on, else 0                                     |
//	| natstone_broker_serving               | gauge     |                  | 1 while the broker answers requests (holds the store's claim), else 0    |
//
// The first eight are counted as they happen (the wait histogram at each lease). Every op's success
// counter and histogram exist at 0 from New, and a queue's transition counters of every kind and its
// expiry counter from its first transition, so that rate() sees their first increment; an error
// code's series appears when first counted. The others, from natstone_queue_messages on, are read
// from the broker's snapshot at each scrape and are absent until Watch is called; the events
// counters among them restart from 0 with the broker. A deleted queue's
// series go with it: its gauges from the next scrape, and its transition and expiry counters when
// the broker reports the deletion (QueueDeleted).
//
// # Health
//
// [Health] returns a handler, to mount at /healthz, that answers 200 when the NATS connection is
// up, JetStream answers and natstone's buckets and streams exist with a leader, and 503 otherwise,
// with a JSON [HealthReport] of every check. It answers within [HealthConfig].Timeout whatever
// NATS does. [Ready] returns a handler, to mount at /readyz, that answers 200 while the broker
// serves (broker.Broker.Serving) and 503 otherwise: the readiness probe of a broker that may stand
// by.
package metrics
