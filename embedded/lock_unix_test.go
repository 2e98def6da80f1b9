//go:build unix

package embedded

import (
	"errors"
	"os"
	"path/filepath"
	"runtime"
	"testing"

	"golang.org/x/sys/unix"
)

// TestReleaseWhileACopyOfTheDescriptorLives: a child process forked by os/exec elsewhere in the
// program holds a copy of the lock file's descriptor until it execs. Releasing the lock must free
// the directory all the same: the copy (a dup here) shares the lock, which closing alone would
// leave held (a bench's restart once failed so: "the data directory is in use").
func TestReleaseWhileACopyOfTheDescriptorLives(t *testing.T) {
	dir := t.TempDir()
	f, err := os.OpenFile(filepath.Join(dir, lockName), os.O_RDWR|os.O_CREATE, 0o600)
	if err != nil {
		t.Fatal(err)
	}
	if err := lockFile(f); err != nil {
		t.Fatal(err)
	}
	child, err := unix.Dup(int(f.Fd())) // the same open file description, as after a fork
	if err != nil {
		t.Fatal(err)
	}
	defer unix.Close(child)
	release(f)
	unlock, err := lockDir(dir)
	if err != nil {
		t.Fatalf("lock after release, a copy of the descriptor open: %v", err)
	}
	unlock()
}

// TestLockHeldWhileUnreachable: a program that starts natstone and keeps no reference to it (it
// never stops it) still holds its data directory: the lock file is not left to the collector,
// whose finalizer would close it and so release the lock while the server runs on.
func TestLockHeldWhileUnreachable(t *testing.T) {
	dir := t.TempDir()
	if _, err := lockDir(dir); err != nil { // its unlock dropped at once
		t.Fatal(err)
	}
	for range 5 {
		runtime.GC()
		runtime.Gosched() // the finalizers' goroutine runs what a collection queued
	}
	unlock, err := lockDir(dir)
	if err == nil {
		unlock()
		t.Fatal("a second lock of the directory was taken once the first was unreachable")
	}
	if !errors.Is(err, ErrDataDirInUse) {
		t.Fatalf("second lock: %v, want ErrDataDirInUse", err)
	}
	held.Lock()
	for f := range held.files {
		if filepath.Dir(f.Name()) == dir {
			delete(held.files, f)
			release(f)
		}
	}
	held.Unlock()
}
