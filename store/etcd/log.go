package etcd

import (
	"log/slog"

	"github.com/beaconplane/beacon/internal/zapslog"
	"go.uber.org/zap"
	"go.uber.org/zap/zapcore"
)

// zapLogger returns a zap logger (what the etcd client logs to) that writes
// to l through internal/zapslog, or a no-op logger for nil.
func zapLogger(l *slog.Logger) *zap.Logger {
	return zap.New(&retryCore{Core: zapslog.New(l, zapcore.DebugLevel).Core()})
}

// perAttempt are the etcd client's warnings about each failed attempt of a
// call it retries (one per attempt, every few hundred milliseconds while
// etcd is unreachable); the call's own error, which the Store returns with
// the endpoints and what they answered, says it once. They go to debug.
var perAttempt = map[string]bool{"retrying of unary invoker failed": true}

// retryCore lowers the perAttempt warnings to debug.
type retryCore struct{ zapcore.Core }

func (c *retryCore) With(fields []zapcore.Field) zapcore.Core {
	return &retryCore{Core: c.Core.With(fields)}
}

func (c *retryCore) Check(e zapcore.Entry, ce *zapcore.CheckedEntry) *zapcore.CheckedEntry {
	if e.Level == zapcore.WarnLevel && perAttempt[e.Message] {
		e.Level = zapcore.DebugLevel
	}
	return c.Core.Check(e, ce)
}
