// Package zapslog routes zap logs (from embedded etcd and the etcd client)
// into a *slog.Logger, so a Beacon process writes one log stream in one
// format.
package zapslog

import (
	"context"
	"log/slog"

	"go.uber.org/zap"
	"go.uber.org/zap/zapcore"
)

// New returns a zap logger that writes entries at min or above to l. A nil
// l gives a no-op logger.
func New(l *slog.Logger, min zapcore.Level) *zap.Logger {
	if l == nil {
		return zap.NewNop()
	}
	return zap.New(&core{h: l.Handler(), min: min})
}

type core struct {
	h     slog.Handler
	min   zapcore.Level
	attrs []slog.Attr
}

func level(l zapcore.Level) slog.Level {
	switch {
	case l >= zapcore.ErrorLevel:
		return slog.LevelError
	case l == zapcore.WarnLevel:
		return slog.LevelWarn
	case l == zapcore.InfoLevel:
		return slog.LevelInfo
	default:
		return slog.LevelDebug
	}
}

func (c *core) Enabled(l zapcore.Level) bool {
	return l >= c.min && c.h.Enabled(context.Background(), level(l))
}

func (c *core) With(fields []zapcore.Field) zapcore.Core {
	clone := *c
	clone.attrs = append(append([]slog.Attr(nil), c.attrs...), attrs(fields)...)
	return &clone
}

func (c *core) Check(e zapcore.Entry, ce *zapcore.CheckedEntry) *zapcore.CheckedEntry {
	if c.Enabled(e.Level) {
		return ce.AddCore(e, c)
	}
	return ce
}

func (c *core) Write(e zapcore.Entry, fields []zapcore.Field) error {
	r := slog.NewRecord(e.Time, level(e.Level), e.Message, 0)
	if e.LoggerName != "" {
		r.AddAttrs(slog.String("logger", e.LoggerName))
	}
	r.AddAttrs(c.attrs...)
	r.AddAttrs(attrs(fields)...)
	return c.h.Handle(context.Background(), r)
}

func (c *core) Sync() error { return nil }

func attrs(fields []zapcore.Field) []slog.Attr {
	if len(fields) == 0 {
		return nil
	}
	enc := zapcore.NewMapObjectEncoder()
	for _, f := range fields {
		f.AddTo(enc)
	}
	out := make([]slog.Attr, 0, len(enc.Fields))
	for _, f := range fields {
		if v, ok := enc.Fields[f.Key]; ok {
			out = append(out, slog.Any(f.Key, v))
		}
	}
	return out
}
