// Package natbin builds the natstone binary for tests that run it as a process.
package natbin

import (
	"fmt"
	"os"
	"os/exec"
	"path/filepath"
)

// Build compiles the natstone command in pkgDir (a path to cmd/natstone relative to the calling
// test's package) into a new temporary directory, with the race detector if race is set. It returns
// the binary's path and a function that removes it; call it from TestMain, before m.Run.
func Build(pkgDir string, race bool) (path string, remove func(), err error) {
	dir, err := os.MkdirTemp("", "natstone-bin-")
	if err != nil {
		return "", nil, err
	}
	path = filepath.Join(dir, "natstone")
	args := []string{"build", "-o", path}
	if race {
		args = append(args, "-race")
	}
	cmd := exec.Command("go", append(args, pkgDir)...)
	if out, err := cmd.CombinedOutput(); err != nil {
		os.RemoveAll(dir)
		return "", nil, fmt.Errorf("build natstone: %w\n%s", err, out)
	}
	return path, func() { os.RemoveAll(dir) }, nil
}
