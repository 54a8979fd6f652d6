package file_test

import (
	"context"
	"testing"
	"time"

	"github.com/beaconplane/beacon/store"
	"github.com/beaconplane/beacon/store/file"
	"github.com/beaconplane/beacon/store/storetest"
	"go.uber.org/goleak"
)

func TestMain(m *testing.M) {
	if runChild() {
		return
	}
	goleak.VerifyTestMain(m)
}

func open(tb testing.TB, cfg file.Config) *file.Store {
	tb.Helper()
	ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
	defer cancel()
	s, err := file.Open(ctx, cfg)
	if err != nil {
		tb.Fatalf("Open(%s): %v", cfg.Dir, err)
	}
	return s
}

// Every check opens its own Store on one shared directory, so the checks
// also exercise many stores (as separate processes would) sharing a log.
func TestConformance(t *testing.T) {
	dir := t.TempDir()
	storetest.Run(t, func(tb testing.TB) store.Store {
		return open(tb, file.Config{Dir: dir})
	}, storetest.Options{})
}

// The same suite with notifications off: the polling fallback.
func TestConformancePolling(t *testing.T) {
	if testing.Short() {
		t.Skip("short mode")
	}
	storetest.Run(t, func(tb testing.TB) store.Store {
		return open(tb, file.Config{Dir: tb.TempDir(), DisableNotify: true})
	}, storetest.Options{})
}

func BenchmarkFile(b *testing.B) {
	dir := b.TempDir()
	storetest.Benchmark(b, func(tb testing.TB) store.Store { return open(tb, file.Config{Dir: dir}) })
}
