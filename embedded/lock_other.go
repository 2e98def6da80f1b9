//go:build !unix && !windows

package embedded

import "os"

// lockFile does nothing where the platform has no file locks that Go reaches: there, keeping two
// natstones off one data directory is the operator's task.
func lockFile(*os.File) error { return nil }

// unlockFile does nothing, as lockFile.
func unlockFile(*os.File) {}
