package embedded

import (
	"errors"
	"fmt"
	"os"
	"path/filepath"
	"sync"
)

// lockName is the file in a data directory that a running natstone holds locked.
const lockName = "natstone.lock"

// ErrDataDirInUse is the error of a Start on a data directory that another natstone (in this
// process or another) is using.
var ErrDataDirInUse = errors.New("natstone: the data directory is in use by another natstone")

// errLocked is what lockFile returns when another process holds the lock.
var errLocked = errors.New("locked by another process")

// held keeps the lock files this process holds reachable until they are unlocked. A file the
// program no longer reaches is closed by its finalizer, which releases its lock: a natstone that a
// program starts and then drops without a Stop, its server running on, would leave its directory
// free for a second natstone on the same store.
var held struct {
	sync.Mutex
	files map[*os.File]bool
}

// lockDir takes dir for this process: an exclusive lock on its lock file, held until unlock (or
// until the process ends, whatever way it ends). nats-server does not lock its store, and two servers
// on one store corrupt it; a broker started on it also takes over any claim it finds there.
func lockDir(dir string) (unlock func(), err error) {
	if err := os.MkdirAll(dir, 0o700); err != nil {
		return nil, fmt.Errorf("natstone: data directory: %w", err)
	}
	path := filepath.Join(dir, lockName)
	f, err := os.OpenFile(path, os.O_RDWR|os.O_CREATE, 0o600)
	if err != nil {
		return nil, fmt.Errorf("natstone: data directory lock: %w", err)
	}
	if err := lockFile(f); err != nil {
		f.Close()
		if errors.Is(err, errLocked) {
			return nil, fmt.Errorf("%w: %s (it holds %s locked)", ErrDataDirInUse, dir, path)
		}
		return nil, fmt.Errorf("natstone: lock %s: %w", path, err)
	}
	held.Lock()
	if held.files == nil {
		held.files = make(map[*os.File]bool)
	}
	held.files[f] = true
	held.Unlock()
	return func() {
		held.Lock()
		delete(held.files, f)
		held.Unlock()
		release(f)
	}, nil
}

// release unlocks the lock file f and closes it. Closing alone would not release the lock while a
// child process, forked but not yet exec'd (os/exec elsewhere in the program), holds a copy of the
// descriptor: a Start on the directory at once after would find it locked.
func release(f *os.File) {
	unlockFile(f)
	f.Close()
}
