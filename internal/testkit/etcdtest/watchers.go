package etcdtest

import (
	"testing"

	"github.com/prometheus/client_golang/prometheus"
)

// Watchers is the number of watchers of every embedded etcd server in this
// process (etcd_debugging_mvcc_watcher_total, a process-wide gauge): tests
// that read it must not run in parallel with others that watch, and other
// tests' cancellations reach it late. A test that can give its clients a
// dial option waits on a WatchTap instead; the proxy's tests wait for
// its upstream watches' own created responses.
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
