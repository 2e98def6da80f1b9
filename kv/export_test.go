package kv

import (
	"io"
	"time"
)

// SetSnapshotStall replaces how long a snapshot's read waits for a chunk.
func (s *Store) SetSnapshotStall(d time.Duration) { s.snapshotStall = d }

// SetScanStarted makes scan call f once its consumer exists, before it reads anything.
func (s *Store) SetScanStarted(f func()) { s.scanStarted = f }

// SetScanBytes bounds the bytes of a batch of scan to n (after the first batch).
func (s *Store) SetScanBytes(n uint64) { s.scanBytes = n }

// SetScanFetching makes scan call f with the size of each batch it asks for.
func (s *Store) SetScanFetching(f func(batch uint64)) { s.scanFetching = f }

// SetScanLeaderLast makes scan check its replica against its leader, as on a replicated stream,
// with the leader's last sequence replaced by f's result.
func (s *Store) SetScanLeaderLast(f func(last uint64) uint64) { s.scanLeaderLast = f }

// SetScanRead makes scan call f once it has read everything, before it checks with the leader.
func (s *Store) SetScanRead(f func()) { s.scanRead = f }

// SetMarkerGrace replaces how long past its TTL a collection's marker may stay before a scan writes
// it again.
func (s *Store) SetMarkerGrace(d time.Duration) { s.markerGrace = d }

// SetBehind makes the next n reads of Read find nothing, as through a consumer on a server behind
// the stream's leader.
func (ev *Events) SetBehind(n int) { ev.behind = n }

// SetMaxDeleted replaces how many deleted sequences of the bodies stream ReadBodies lists.
func (s *Store) SetMaxDeleted(n uint64) { s.maxDeleted = n }

// PurgeEach is purgeEach: how many subjects a purge left that it purges one by one.
const PurgeEach = purgeEach

// SetPurged makes every subject purge call f after the purge, before it checks what is left.
func (s *Store) SetPurged(f func(subject string)) { s.purged = f }

// EncodeSnapshot writes a snapshot of records records, which fill writes, to out.
func EncodeSnapshot(out io.Writer, records uint64, fill func(w *SnapshotWriter) error) error {
	return encodeSnapshot(out, records, fill)
}
