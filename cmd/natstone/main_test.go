package main

import (
	"bufio"
	"context"
	"fmt"
	"io"
	"net"
	"os"
	"os/exec"
	"strings"
	"sync"
	"syscall"
	"testing"
	"time"

	"go.uber.org/goleak"

	"github.com/natstone/natstone/test/natbin"
)

// deadline bounds every wait in these tests.
const deadline = 30 * time.Second

// bin is the natstone binary built by TestMain.
var bin string

func TestMain(m *testing.M) {
	path, remove, err := natbin.Build(".", false)
	if err != nil {
		fmt.Fprintln(os.Stderr, err)
		os.Exit(1)
	}
	bin = path
	code := m.Run()
	remove()
	if code == 0 {
		// The in-process tests run serve with its embedded server: nothing may outlive them.
		if err := goleak.Find(); err != nil {
			fmt.Fprintln(os.Stderr, "goleak:", err)
			code = 1
		}
	}
	os.Exit(code)
}

// freePort returns a TCP port on 127.0.0.1 that was free a moment ago.
func freePort(t *testing.T) int {
	t.Helper()
	l, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatalf("finding a free port: %v", err)
	}
	defer l.Close()
	return l.Addr().(*net.TCPAddr).Port
}

// logWatch reads a log line by line, keeping it for failure messages, and reports the line
// "natstone ready".
type logWatch struct {
	ready     chan struct{} // closed at the first "natstone ready" line
	readyText string        // that line, set before ready is closed
	eof       chan struct{} // closed when the log ends

	// mu guards the fields below.
	mu    sync.Mutex
	lines []string
	more  chan struct{} // closed, and replaced, at each line
}

func watchLog(r io.Reader) *logWatch {
	w := &logWatch{ready: make(chan struct{}), eof: make(chan struct{}), more: make(chan struct{})}
	go func() {
		defer close(w.eof)
		sc := bufio.NewScanner(r)
		for sc.Scan() {
			w.mu.Lock()
			w.lines = append(w.lines, sc.Text())
			close(w.more)
			w.more = make(chan struct{})
			w.mu.Unlock()
			if w.readyText == "" && strings.Contains(sc.Text(), "natstone ready") {
				w.readyText = sc.Text()
				close(w.ready)
			}
		}
		// Keep reading after a scanner error so that the writer never blocks.
		_, _ = io.Copy(io.Discard, r)
	}()
	return w
}

// String returns the log so far.
func (w *logWatch) String() string {
	w.mu.Lock()
	defer w.mu.Unlock()
	return strings.Join(w.lines, "\n")
}

// waitLine waits for a line that contains text and returns it. It fails the test if the log ends
// first or the deadline passes.
func (w *logWatch) waitLine(t *testing.T, text string) string {
	t.Helper()
	timer := time.NewTimer(deadline)
	defer timer.Stop()
	for {
		w.mu.Lock()
		more := w.more // taken before the search: a line that comes after it closes more
		w.mu.Unlock()
		if l := w.find(text); l != "" {
			return l
		}
		select {
		case <-more:
		case <-w.eof:
			if l := w.find(text); l != "" {
				return l
			}
			t.Fatalf("log ended before a line with %q:\n%s", text, w)
		case <-timer.C:
			t.Fatalf("no line with %q within %v:\n%s", text, deadline, w)
		}
	}
}

// find returns the first line so far that contains text, or "".
func (w *logWatch) find(text string) string {
	w.mu.Lock()
	defer w.mu.Unlock()
	for _, l := range w.lines {
		if strings.Contains(l, text) {
			return l
		}
	}
	return ""
}

// readyLine waits for "natstone ready" and returns that line. It fails the test if the log ends
// first or the deadline passes.
func (w *logWatch) readyLine(t *testing.T) string {
	t.Helper()
	timer := time.NewTimer(deadline)
	defer timer.Stop()
	select {
	case <-w.ready:
	case <-w.eof:
		select {
		case <-w.ready: // it was ready, then ended
			return w.readyText
		default:
		}
		t.Fatalf("log ended before \"natstone ready\":\n%s", w)
	case <-timer.C:
		t.Fatalf("no \"natstone ready\" within %v:\n%s", deadline, w)
	}
	return w.readyText
}

// proc is a natstone child process.
type proc struct {
	cmd  *exec.Cmd
	log  *logWatch     // its stderr
	done chan struct{} // closed when it has exited and been waited for
}

// startProc starts the natstone binary with args, in a temporary working directory. A t.Cleanup
// kills it if it is still running.
func startProc(t *testing.T, args ...string) *proc {
	t.Helper()
	cmd := exec.Command(bin, args...)
	cmd.Dir = t.TempDir()
	stderr, err := cmd.StderrPipe()
	if err != nil {
		t.Fatal(err)
	}
	if err := cmd.Start(); err != nil {
		t.Fatalf("starting natstone: %v", err)
	}
	p := &proc{cmd: cmd, log: watchLog(stderr), done: make(chan struct{})}
	go func() {
		<-p.log.eof // Wait must not run before every read of the pipe has ended.
		_ = cmd.Wait()
		close(p.done)
	}()
	t.Cleanup(func() {
		select {
		case <-p.done:
		default:
			_ = cmd.Process.Kill()
			<-p.done
		}
	})
	return p
}

// startServe starts "natstone serve" with args and waits until it is ready.
func startServe(t *testing.T, args ...string) *proc {
	t.Helper()
	p := startProc(t, append([]string{"serve"}, args...)...)
	p.log.readyLine(t)
	return p
}

// wait waits for the process to exit and returns its exit code.
func (p *proc) wait(t *testing.T) int {
	t.Helper()
	timer := time.NewTimer(deadline)
	defer timer.Stop()
	select {
	case <-p.done:
		return p.cmd.ProcessState.ExitCode()
	case <-timer.C:
		t.Fatalf("natstone did not exit within %v:\n%s", deadline, p.log)
		return -1
	}
}

// stop sends SIGTERM and checks that the process exits with code 0.
func (p *proc) stop(t *testing.T) {
	t.Helper()
	if err := p.cmd.Process.Signal(syscall.SIGTERM); err != nil {
		t.Fatalf("SIGTERM: %v", err)
	}
	if code := p.wait(t); code != exitOK {
		t.Fatalf("exit code after SIGTERM = %d, want 0:\n%s", code, p.log)
	}
}

// inProcess runs runServe with args in this process, as main would, and waits until it is ready.
// Cancelling ctx shuts it down; the returned channel then yields its exit code. A t.Cleanup stops
// it and waits for it.
func inProcess(t *testing.T, args ...string) (ready string, cancel context.CancelFunc, code <-chan int) {
	t.Helper()
	ctx, cancel := context.WithCancel(context.Background())
	pr, pw := io.Pipe()
	log := watchLog(pr)
	c := make(chan int, 1)
	go func() {
		c <- runServe(ctx, args, io.Discard, pw)
		pw.Close()
	}()
	t.Cleanup(func() {
		cancel()
		<-log.eof
	})
	return log.readyLine(t), cancel, c
}

// exitCode waits for an exit code from code.
func exitCode(t *testing.T, code <-chan int) int {
	t.Helper()
	timer := time.NewTimer(deadline)
	defer timer.Stop()
	select {
	case c := <-code:
		return c
	case <-timer.C:
		t.Fatalf("serve did not return within %v", deadline)
		return -1
	}
}
