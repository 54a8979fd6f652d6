package etcdtest

import (
	"context"
	"testing"
	"time"

	"github.com/prometheus/client_golang/prometheus"
)

// Watchers is the number of watchers of every embedded etcd server in this
// process (etcd_debugging_mvcc_watcher_total, a process-wide gauge): tests
// that read it must not run in parallel with others that watch, and other
// tests' cancellations reach it late. A test that can give its clients a
// dial option waits on a WatchTap instead.
func Watchers(tb testing.TB) float64 {
	tb.Helper()
	mfs, err := prometheus.DefaultGatherer.Gather()
	if err != nil {
		tb.Fatal(err)
	}
	for _, mf := range mfs {
		if mf.GetName() == "etcd_debugging_mvcc_watcher_total" {
			n := 0.0
			for _, m := range mf.GetMetric() {
				n += m.GetGauge().GetValue()
			}
			return n
		}
	}
	tb.Fatal("etcd_debugging_mvcc_watcher_total not found: is the etcd server embedded?")
	return 0
}

// WaitWatchers waits until the embedded etcd servers of this process count
// at least n watchers (Watchers): an etcd client's Watch returns, and a
// proxy confirms a watch, before etcd has created it, so a test that must
// act after the creation (a compaction) waits for it here. etcd exposes
// no event for it: the gauge is read every 5 ms until ctx is done.
func WaitWatchers(ctx context.Context, tb testing.TB, n float64) {
	tb.Helper()
	tick := time.NewTicker(5 * time.Millisecond)
	defer tick.Stop()
	for Watchers(tb) < n {
		select {
		case <-ctx.Done():
			tb.Fatalf("etcd never counted %v watchers (%v): %v", n, Watchers(tb), context.Cause(ctx))
		case <-tick.C:
		}
	}
}
