package server

import (
	"context"
	"errors"
	"log/slog"
	"strings"
	"testing"
	"time"

	"go.etcd.io/etcd/api/v3/v3rpc/rpctypes"
	clientv3 "go.etcd.io/etcd/client/v3"
	"go.uber.org/zap/zapcore"
)

// compactions is a log handler that passes on the revision of every
// periodic compaction the embedded etcd reports done.
type compactions struct {
	slog.Handler
	revs chan int64
}

func (h compactions) Enabled(context.Context, slog.Level) bool { return true }

func (h compactions) Handle(_ context.Context, r slog.Record) error {
	if r.Message != "completed auto periodic compaction" {
		return nil
	}
	r.Attrs(func(a slog.Attr) bool {
		if a.Key == "revision" {
			select {
			case h.revs <- a.Value.Int64():
			default:
			}
		}
		return true
	})
	return nil
}

func (h compactions) WithAttrs([]slog.Attr) slog.Handler { return h }
func (h compactions) WithGroup(string) slog.Handler      { return h }

// TestEmbeddedEtcdCompactsItsHistory: the embedded etcd compacts the
// revisions older than AutoCompactionRetention, so that its backend does
// not grow with every change until etcd's quota refuses writes.
func TestEmbeddedEtcdCompactsItsHistory(t *testing.T) {
	h := compactions{revs: make(chan int64, 16)}
	cfg := testConfig(t)
	cfg.AutoCompactionRetention = time.Second
	info := zapcore.InfoLevel
	cfg.Logger, cfg.EtcdLogLevel = slog.New(h), &info
	s := startServer(t, cfg)
	cli := s.EtcdClient()
	ctx, cancel := context.WithTimeout(context.Background(), time.Minute)
	defer cancel()
	first, err := cli.Put(ctx, "/history", "1")
	if err != nil {
		t.Fatal(err)
	}
	last, err := cli.Put(ctx, "/history", "2")
	if err != nil {
		t.Fatal(err)
	}
	for {
		select {
		case rev := <-h.revs:
			if rev < last.Header.Revision {
				continue // an earlier revision: the next compaction takes the writes
			}
			_, err := cli.Get(ctx, "/history", clientv3.WithRev(first.Header.Revision))
			if !errors.Is(err, rpctypes.ErrCompacted) {
				t.Fatalf("read at revision %d after a compaction to %d: %v, want %v", first.Header.Revision, rev, err, rpctypes.ErrCompacted)
			}
			return
		case <-ctx.Done():
			t.Fatalf("no compaction past revision %d within a minute (AutoCompactionRetention 1s)", last.Header.Revision)
		}
	}
}

// TestAutoCompactionRetentionConfiguresEmbeddedEtcd: the default keeps
// five minutes, a negative retention turns etcd's compactor off, and the
// setting is refused where it cannot apply.
func TestAutoCompactionRetentionConfiguresEmbeddedEtcd(t *testing.T) {
	for _, tc := range []struct {
		set       time.Duration
		mode, ret string
	}{
		{0, "periodic", "5m0s"},
		{time.Hour, "periodic", "1h0m0s"},
		{-1, "periodic", "0"}, // etcd's defaults: no compaction
	} {
		s := &Server{cfg: Config{DataDir: t.TempDir(), AutoCompactionRetention: tc.set}.withDefaults(), log: slog.New(slog.DiscardHandler)}
		ec, err := s.etcdConfig()
		if err != nil {
			t.Fatal(err)
		}
		if ec.AutoCompactionMode != tc.mode || ec.AutoCompactionRetention != tc.ret {
			t.Errorf("AutoCompactionRetention %v: etcd mode %q retention %q, want %q %q", tc.set, ec.AutoCompactionMode, ec.AutoCompactionRetention, tc.mode, tc.ret)
		}
	}
	for _, tc := range []struct {
		cfg  Config
		want string
	}{
		{Config{AutoCompactionRetention: time.Millisecond}, "keep at least 1s"},
		{Config{AutoCompactionRetention: time.Hour, EtcdEndpoints: []string{"http://127.0.0.1:2379"}}, "applies to the embedded etcd only"},
	} {
		err := tc.cfg.Validate()
		if err == nil || !strings.Contains(err.Error(), tc.want) {
			t.Errorf("Validate(%v) = %v, want %q", tc.cfg.AutoCompactionRetention, err, tc.want)
		}
	}
}
