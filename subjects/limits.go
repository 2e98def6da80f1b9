package subjects

import "time"

// Limits of the protocol. A queue's own limits (payload size, metadata pairs) are configured within
// these bounds; everything else is fixed. docs/limits.md lists them with the error each one gives.
const (
	MaxIDLen            = 256       // bytes of a message id
	MaxRequestIDLen     = 256       // bytes of a dequeue request id
	MaxMetadataKeyLen   = 128       // bytes of a metadata key
	MaxMetadataValueLen = 1024      // bytes of a metadata value
	MaxMetadataPairs    = 32        // the highest max_metadata_pairs a queue may set
	MaxPayloadBytes     = 512 << 10 // the highest max_payload_bytes a queue may set
	MaxEnqueueBatch     = 1000      // messages in one enqueue_batch
	MaxDequeueBatch     = 256       // messages one dequeue may lease
	MaxAttemptsLimit    = 1000      // the highest max_attempts a queue may set
	MaxWorkerLen        = 128       // bytes of a dequeue's worker name
	MaxErrorLen         = 1024      // bytes of a release's or a cancel's error
	MaxBrowseLimit      = 1000      // messages one browse returns
	MaxExpiringLimit    = 1000      // expiring leases one stats reply lists
	MaxHistoryLimit     = 10000     // events one history reply returns
	MaxListLimit        = 10000     // queues one list reply returns
	MaxSchedules        = 100       // schedules (recurring enqueues) of one queue
	MaxScheduleNameLen  = 128       // bytes of a schedule's name
	MaxNoteLen          = 1024      // bytes of the note of a schedule's pause or resume
	MaxRunningLimit     = 1_000_000 // the highest max_running a queue may set
	MaxPerValueLimit    = 1000      // the highest max_running_per_value an exclusive queue may set

	MinLease            = 100 * time.Millisecond
	MaxLease            = 24 * time.Hour
	MaxWait             = 5 * time.Minute      // longest long-poll of a dequeue
	MaxInvisible        = 366 * 24 * time.Hour // longest invisibility window or release delay
	MaxRetention        = 90 * 24 * time.Hour  // longest retention of terminal messages
	MaxExpiringWithin   = 24 * time.Hour       // longest look-ahead of stats' expiring leases
	MinScheduleEvery    = time.Second          // shortest interval of a schedule's "@every"
	MaxScheduleDeadline = 366 * 24 * time.Hour // longest deadline_ms of a schedule
)

// Defaults for a queue created without them (and for auto-created queues).
const (
	DefaultLease            = 30 * time.Second
	DefaultMaxAttempts      = 5
	DefaultRetention        = 24 * time.Hour
	DefaultMaxPayloadBytes  = 32 << 10
	DefaultMaxMetadataPairs = 8
	DefaultBrowseLimit      = 50
	DefaultExpiringWithin   = 30 * time.Second
	DefaultExpiringLimit    = 20
	DefaultHistoryLimit     = 1000
)
