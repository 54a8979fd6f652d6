package bench

import (
	"context"
	"strings"
	"testing"
	"time"

	"github.com/beaconplane/beacon/internal/testkit/testpeer"
)

// TestRunProxySmall runs the proxy scenario at a small size with both
// proxies in their own processes (the beacon binary and the etcd 3.7
// binary, built from this module): every row is there for both baselines,
// CPU is measured, and Beacon's proxy loses no event and holds one etcd
// watch for the identical client watches (beside the serializable
// cache's).
func TestRunProxySmall(t *testing.T) {
	if testing.Short() {
		t.Skip("builds beacon and etcd, starts etcd and two proxies")
	}
	beaconBin := testpeer.GoBuild(t, "github.com/beaconplane/beacon/cmd/beacon")
	etcdBin := testpeer.GoBuild(t, "github.com/beaconplane/beacon/internal/lab/etcd")
	ctx, cancel := context.WithTimeout(context.Background(), 3*time.Minute)
	defer cancel()
	r, err := RunProxy(ctx, ProxyConfig{Members: 1, Rounds: 2, Duration: 300 * time.Millisecond, Clients: 4, Conns: 2,
		Watches: 40, Streams: 4, BurstPuts: 20, LatencyPuts: 10, LatencyRate: 100,
		BeaconCommand: []string{beaconBin, "proxy"}, EtcdBin: etcdBin})
	if err != nil {
		t.Fatal(err)
	}
	var b strings.Builder
	if err := r.WriteTable(&b); err != nil {
		t.Fatal(err)
	}
	t.Log("\n" + b.String())
	seen := map[string]bool{}
	for _, row := range r.Rows {
		seen[row.Metric+" vs "+row.Against] = true
		if row.Runs != 2 {
			t.Errorf("%s vs %s: %d runs, want 2", row.Metric, row.Against, row.Runs)
		}
		if strings.HasPrefix(row.Metric, "events lost") && row.Beacon != 0 {
			t.Errorf("Beacon's proxy lost %v events", row.Beacon)
		}
		if strings.HasPrefix(row.Metric, "proxy CPU per") && (row.Beacon <= 0 || row.Baseline <= 0) {
			t.Errorf("%s: CPU not measured: %+v", row.Metric, row)
		}
	}
	for _, want := range []string{
		"range (linearizable) throughput vs direct", "range (linearizable) throughput vs etcd grpc-proxy",
		"range (serializable) throughput vs etcd grpc-proxy", "put p99 vs etcd grpc-proxy",
		"proxy CPU per range (serializable) vs etcd grpc-proxy",
		"time to open 40 watches over 4 streams at once vs etcd grpc-proxy", "time to open 40 watches over 4 streams at once vs direct",
		"watch fan-out events/s, 40 watchers, burst of 20 puts vs etcd grpc-proxy",
		"proxy CPU per event delivered, 40 watchers, burst of 20 puts vs etcd grpc-proxy",
		"watch delivery p99, 40 watchers, 100 puts/s vs etcd grpc-proxy",
		"proxy RSS 2 s after the burst vs etcd grpc-proxy",
	} {
		if !seen[want] {
			t.Errorf("report lacks %q:\n%s", want, b.String())
		}
	}
	if !strings.Contains(b.String(), "held 2 etcd watch(es) for the 40 identical client watches") {
		t.Errorf("upstream watches:\n%s", b.String())
	}
}

func TestProxyConfigValidate(t *testing.T) {
	cmd := []string{"beacon", "proxy"}
	for _, c := range []ProxyConfig{
		{}, // no command
		{BeaconCommand: cmd, Watches: -1}, {BeaconCommand: cmd, Clients: 1 << 30}, {BeaconCommand: cmd, Duration: -time.Second},
		{BeaconCommand: cmd, Duration: 48 * time.Hour}, {BeaconCommand: cmd, Watches: 5, Streams: 10},
		{BeaconCommand: cmd, ValueSize: 1 << 30}, {BeaconCommand: cmd, Rounds: -2}, {BeaconCommand: cmd, Members: 20},
	} {
		if err := c.Validate(); err == nil {
			t.Errorf("%+v: no error", c)
		}
	}
	if err := (ProxyConfig{BeaconCommand: cmd}).Validate(); err != nil {
		t.Errorf("defaults: %v", err)
	}
}
