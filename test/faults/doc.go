// Package faults proves natstone under faults: a harness runs natstone as a child process, drives it
// with concurrent producers and workers over real NATS connections, kills it with SIGKILL at random
// moments and restarts it on the same data, and records every operation with its outcome in a
// History. Check then judges the whole history — the way Jepsen judges queues — for lost
// acknowledged messages, double leases, exclusivity overlaps, attempts, EDF order and idempotent
// dequeues. Operations whose outcome is unknown (a timeout during a kill) are treated as possibly
// having taken effect, never ignored.
package faults
