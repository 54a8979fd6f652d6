package zapslog

import (
	"bytes"
	"log/slog"
	"strings"
	"testing"

	"go.uber.org/zap"
	"go.uber.org/zap/zapcore"
)

func TestRoutesToSlog(t *testing.T) {
	var buf bytes.Buffer
	l := slog.New(slog.NewTextHandler(&buf, &slog.HandlerOptions{Level: slog.LevelDebug}))
	z := New(l, zapcore.WarnLevel).Named("etcd").With(zap.String("member", "m1"))
	z.Info("dropped")
	z.Warn("kept", zap.Int("n", 3), zap.Strings("urls", []string{"a", "b"}))
	out := buf.String()
	if strings.Contains(out, "dropped") {
		t.Errorf("info below the minimum was written: %s", out)
	}
	for _, want := range []string{"level=WARN", "msg=kept", "logger=etcd", "member=m1", "n=3", "urls=\"[a b]\""} {
		if !strings.Contains(out, want) {
			t.Errorf("output lacks %s: %s", want, out)
		}
	}
	New(nil, zapcore.DebugLevel).Error("no-op")
}
