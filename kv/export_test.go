package kv

// SetScanStarted makes scan call f once its consumer exists, before it reads anything.
func (s *Store) SetScanStarted(f func()) { s.scanStarted = f }
