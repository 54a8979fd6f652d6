package server

import (
	"bytes"
	"log/slog"
	"strings"
	"sync/atomic"
	"testing"

	"go.uber.org/zap"
	"go.uber.org/zap/zapcore"
)

// TestEtcdLogQuietsOnlyItsKnownNoise: exactly the known benign messages
// go one level lower, the shutdown ones only while closing; everything
// else keeps its level.
func TestEtcdLogQuietsOnlyItsKnownNoise(t *testing.T) {
	var buf bytes.Buffer
	var closing atomic.Bool
	lg := etcdLogger(slog.New(slog.NewTextHandler(&buf, &slog.HandlerOptions{Level: slog.LevelDebug})), zapcore.DebugLevel, &closing)
	lg = lg.With(zap.String("member", "m1"))
	lg.Warn("simple token is not cryptographically signed")
	lg.Error("setting up serving from embedded etcd failed.", zap.String("error", "mux: server closed")) // not closing: an error
	lg.Warn("some other warning")
	closing.Store(true)
	lg.Error("setting up serving from embedded etcd failed.", zap.String("error", "mux: server closed"))
	lg.Warn("failed to update cluster version", zap.String("error", "etcdserver: request cancelled"))
	lg.Warn("lost TCP streaming connection with remote peer", zap.String("error", "context canceled"))
	lg.Error("a real error while closing")
	lines := strings.Split(strings.TrimSpace(buf.String()), "\n")
	want := []string{"level=INFO msg=\"simple token", "level=ERROR msg=\"setting up", "level=WARN msg=\"some other",
		"level=DEBUG msg=\"setting up", "level=DEBUG msg=\"failed to update", "level=DEBUG msg=\"lost TCP", "level=ERROR msg=\"a real error"}
	if len(lines) != len(want) {
		t.Fatalf("%d lines, want %d:\n%s", len(lines), len(want), buf.String())
	}
	for i, w := range want {
		if !strings.Contains(lines[i], w) || !strings.Contains(lines[i], "member=m1") {
			t.Errorf("line %d = %q, want %q (and the logger's fields)", i, lines[i], w)
		}
	}
}
