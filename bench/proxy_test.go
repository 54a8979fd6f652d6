package bench

import (
	"context"
	"strings"
	"testing"
	"time"
)

// TestRunProxySmall runs the proxy scenario at a tiny size: every row is
// there, and the watches share one etcd watch through the proxy.
func TestRunProxySmall(t *testing.T) {
	ctx, cancel := context.WithTimeout(context.Background(), time.Minute)
	defer cancel()
	r, err := RunProxy(ctx, ProxyConfig{Members: 1, Duration: 400 * time.Millisecond, Clients: 4, Conns: 2, Watches: 30})
	if err != nil {
		t.Fatal(err)
	}
	var b strings.Builder
	if err := r.WriteTable(&b); err != nil {
		t.Fatal(err)
	}
	for _, want := range []string{"range throughput", "put p50", "range p50, 1 client", "etcd watches for 30 client watches"} {
		if !strings.Contains(b.String(), want) {
			t.Errorf("report lacks %q:\n%s", want, b.String())
		}
	}
	for _, row := range r.Rows {
		if strings.HasPrefix(row.Metric, "etcd watches") && (row.Beacon != 1 || row.Baseline != 30) {
			t.Errorf("%s: proxy %v, direct %v; want 1 and 30", row.Metric, row.Beacon, row.Baseline)
		}
	}
}
