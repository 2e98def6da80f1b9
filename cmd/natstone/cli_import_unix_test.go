//go:build unix

package main

import (
	"os"
	"path/filepath"
	"syscall"
	"testing"
)

// TestRereadable: the progress bar counts the lines of a regular file only. Counting those of a FIFO
// (or a pipe, or a process substitution) once drained it, and the import then read nothing.
func TestRereadable(t *testing.T) {
	t.Parallel()
	dir := t.TempDir()
	file := filepath.Join(dir, "lines.jsonl")
	if err := os.WriteFile(file, []byte("{}\n"), 0o600); err != nil {
		t.Fatal(err)
	}
	fifo := filepath.Join(dir, "fifo")
	if err := syscall.Mkfifo(fifo, 0o600); err != nil {
		t.Fatal(err)
	}
	for path, want := range map[string]bool{file: true, fifo: false} {
		f, err := os.OpenFile(path, os.O_RDWR, 0) // read-write: opening a FIFO does not wait for a writer
		if err != nil {
			t.Fatal(err)
		}
		if got := rereadable(f); got != want {
			t.Errorf("rereadable(%s) = %v, want %v", filepath.Base(path), got, want)
		}
		f.Close()
	}
	r, w, err := os.Pipe()
	if err != nil {
		t.Fatal(err)
	}
	defer r.Close()
	defer w.Close()
	if rereadable(r) {
		t.Error("rereadable(a pipe) = true")
	}
}
