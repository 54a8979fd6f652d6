package memory

import (
	"context"
	"fmt"
	"runtime"
	"testing"
	"time"

	"github.com/beaconplane/beacon/store"
)

// TestZeroConfigBoundsHistoryBytes: the zero Config bounds the history at
// DefaultHistoryBytes, far below DefaultHistory revisions of batched writes.
func TestZeroConfigBoundsHistoryBytes(t *testing.T) {
	s := New(Config{})
	defer s.Close()
	value := make([]byte, store.MaxValueSize)
	for i := range DefaultHistoryBytes/store.MaxValueSize + 64 {
		ops := []store.Op{
			{Kind: store.OpPut, Key: fmt.Sprintf("/a/%d", i%10), Value: value},
			{Kind: store.OpPut, Key: fmt.Sprintf("/b/%d", i%10), Value: value},
		}
		if _, err := s.Txn(context.Background(), ops...); err != nil {
			t.Fatal(err)
		}
	}
	if revs, bytes := s.core.HistorySize(); bytes > DefaultHistoryBytes || revs >= DefaultHistory {
		t.Fatalf("the history holds %d revisions weighing %d bytes; the default bound is %d bytes", revs, bytes, DefaultHistoryBytes)
	}
}

// BenchmarkBatchedHistory re-registers 125,000 instances per iteration in
// transactions of 125 (as the registry's group commit writes them), and
// reports what the history and the heap hold at the end, with the default
// bound in bytes and without one (the bound in revisions alone).
func BenchmarkBatchedHistory(b *testing.B) {
	for _, tc := range []struct {
		name  string
		bytes int64
	}{{"default", 0}, {"revisions-only", -1}} {
		b.Run(tc.name, func(b *testing.B) {
			s := New(Config{HistoryBytes: tc.bytes})
			defer s.Close()
			l, err := s.Grant(context.Background(), time.Hour)
			if err != nil {
				b.Fatal(err)
			}
			value := make([]byte, 227) // a registration's encoded value
			ops := make([]store.Op, 125)
			for b.Loop() {
				for batch := range 1000 {
					for i := range ops {
						ops[i] = store.Op{Kind: store.OpPut, Key: fmt.Sprintf("/beacon/ns/comp/ep/%08d", batch*125+i), Value: value, Lease: l.ID}
					}
					if _, err := s.Txn(context.Background(), ops...); err != nil {
						b.Fatal(err)
					}
				}
			}
			runtime.GC()
			var ms runtime.MemStats
			runtime.ReadMemStats(&ms)
			_, bytes := s.core.HistorySize()
			b.ReportMetric(float64(bytes)/(1<<20), "history-MiB")
			b.ReportMetric(float64(ms.HeapInuse)/(1<<20), "heap-MiB")
			b.ReportMetric(float64(b.Elapsed().Nanoseconds())/float64(b.N*125_000), "ns/put")
		})
	}
}
