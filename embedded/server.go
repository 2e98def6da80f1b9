package embedded

import (
	"context"
	"errors"
	"fmt"
	"log/slog"
	"sync"
	"time"

	"github.com/nats-io/nats-server/v2/server"
)

// ServerReadyTimeout bounds how long Start waits for the server to accept connections.
const ServerReadyTimeout = 10 * time.Second

// startServer starts a nats-server and waits until it accepts connections. The caller shuts it down.
func startServer(opts *server.Options, log *slog.Logger) (*server.Server, error) {
	ns, err := server.NewServer(opts)
	if err != nil {
		return nil, fmt.Errorf("embedded nats-server: %w", err)
	}
	sl := &serverLogger{log: log}
	ns.SetLogger(sl, log.Enabled(context.Background(), slog.LevelDebug), false)

	// Start returns once the client listener is up or has failed, and JetStream is enabled or has
	// failed: either failure is reported through Fatalf, which with our logger does not exit.
	ns.Start()
	if err := sl.fatal(); err != nil {
		ns.Shutdown()
		ns.WaitForShutdown()
		return nil, fmt.Errorf("embedded nats-server: %w", err)
	}
	if !ns.ReadyForConnections(ServerReadyTimeout) {
		ns.Shutdown()
		ns.WaitForShutdown()
		return nil, fmt.Errorf("embedded nats-server: not ready for connections after %v", ServerReadyTimeout)
	}
	return ns, nil
}

// serverLogger routes nats-server's log through slog. Its notices (a banner of some twenty lines
// at start, and every client connection) are logged at debug level, so the default info level
// shows natstone's own lines and the server's warnings and errors only. Traces are never enabled.
type serverLogger struct {
	log *slog.Logger

	// mu guards fatalErr.
	mu       sync.Mutex
	fatalErr error // the first fatal error
}

func (l *serverLogger) Noticef(format string, v ...any) { l.logf(slog.LevelDebug, format, v) }
func (l *serverLogger) Warnf(format string, v ...any)   { l.logf(slog.LevelWarn, format, v) }
func (l *serverLogger) Errorf(format string, v ...any)  { l.logf(slog.LevelError, format, v) }
func (l *serverLogger) Debugf(format string, v ...any)  { l.logf(slog.LevelDebug, format, v) }
func (l *serverLogger) Tracef(format string, v ...any)  { l.logf(slog.LevelDebug, format, v) }

// Fatalf records the error for startServer instead of exiting, as nats-server's own logger does:
// the process shuts down in order, and an in-process test survives.
func (l *serverLogger) Fatalf(format string, v ...any) {
	msg := fmt.Sprintf(format, v...)
	l.log.Error(msg)
	l.mu.Lock()
	defer l.mu.Unlock()
	if l.fatalErr == nil {
		l.fatalErr = errors.New(msg)
	}
}

func (l *serverLogger) logf(level slog.Level, format string, v []any) {
	ctx := context.Background()
	if l.log.Enabled(ctx, level) {
		l.log.Log(ctx, level, fmt.Sprintf(format, v...))
	}
}

// fatal returns the first fatal error the server logged, or nil.
func (l *serverLogger) fatal() error {
	l.mu.Lock()
	defer l.mu.Unlock()
	return l.fatalErr
}
