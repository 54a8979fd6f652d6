package bench

import (
	"context"
	"slices"
	"strings"
	"testing"
	"time"

	"github.com/beaconplane/beacon/internal/testkit/machine"
	"github.com/beaconplane/beacon/internal/testkit/testpeer"
	pb "go.etcd.io/etcd/api/v3/etcdserverpb"
	"go.etcd.io/etcd/api/v3/mvccpb"
	"google.golang.org/protobuf/proto"
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
	machine.Exclusive(t)
	r, b := runProxySmall(t, ProxyConfig{Rounds: 2, Duration: 300 * time.Millisecond, Clients: 4})
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
			t.Errorf("report lacks %q:\n%s", want, b)
		}
	}
	if !strings.Contains(b, "held 2 etcd watch(es) for the 40 identical client watches") {
		t.Errorf("upstream watches:\n%s", b)
	}
}

// runProxySmall runs the proxy scenario with cfg's rounds, duration,
// clients and proxies, at the small size of the tests (one member, 40
// watches over 4 streams), both proxies in their own processes built from
// this module; it returns the report and its table.
func runProxySmall(t *testing.T, cfg ProxyConfig) (*Report, string) {
	t.Helper()
	cfg.BeaconCommand = []string{testpeer.GoBuild(t, "github.com/beaconplane/beacon/cmd/beacon"), "proxy"}
	cfg.EtcdBin = testpeer.GoBuild(t, "github.com/beaconplane/beacon/internal/lab/etcd")
	cfg.Members, cfg.Conns, cfg.Watches, cfg.Streams = 1, 2, 40, 4
	cfg.BurstPuts, cfg.LatencyPuts, cfg.LatencyRate = 20, 10, 100
	ctx, cancel := context.WithTimeout(context.Background(), 3*time.Minute)
	defer cancel()
	r, err := RunProxy(ctx, cfg)
	if err != nil {
		t.Fatal(err)
	}
	var b strings.Builder
	if err := r.WriteTable(&b); err != nil {
		t.Fatal(err)
	}
	t.Log("\n" + b.String())
	return r, b.String()
}

func TestProxyConfigValidate(t *testing.T) {
	cmd := []string{"beacon", "proxy"}
	for _, c := range []ProxyConfig{
		{}, // no command
		{BeaconCommand: cmd, Watches: -1}, {BeaconCommand: cmd, Clients: 1 << 30}, {BeaconCommand: cmd, Duration: -time.Second},
		{BeaconCommand: cmd, Duration: 48 * time.Hour}, {BeaconCommand: cmd, Watches: 5, Streams: 10},
		{BeaconCommand: cmd, ValueSize: 1 << 30}, {BeaconCommand: cmd, Rounds: -2}, {BeaconCommand: cmd, Members: 20},
		{BeaconCommand: cmd, Proxies: 3}, {BeaconCommand: cmd, Proxies: 2, Streams: 5}, {BeaconCommand: cmd, Proxies: maxProxies + 1, Streams: 10 * (maxProxies + 1)},
		{BeaconCommand: cmd, Proxies: -1},
	} {
		if err := c.Validate(); err == nil {
			t.Errorf("%+v: no error", c)
		}
	}
	for _, c := range []ProxyConfig{{BeaconCommand: cmd}, {BeaconCommand: cmd, Proxies: 2}, {BeaconCommand: cmd, Proxies: 4, Streams: 4}} {
		if err := c.Validate(); err != nil {
			t.Errorf("%+v: %v", c, err)
		}
	}
}

// TestRunProxyTier runs the proxy scenario with each proxy side a tier of
// two processes: the watch rows name the tier, nothing is lost, the
// tier's CPU is measured, and Beacon's tier holds two etcd watches per
// proxy (the watches' and the serializable cache's), one per process.
func TestRunProxyTier(t *testing.T) {
	if testing.Short() {
		t.Skip("builds beacon and etcd, starts etcd and four proxies")
	}
	machine.Exclusive(t)
	r, b := runProxySmall(t, ProxyConfig{Rounds: 1, Duration: 200 * time.Millisecond, Clients: 2, Proxies: 2})
	seen := map[string]Row{}
	for _, row := range r.Rows {
		seen[row.Metric+" vs "+row.Against] = row
	}
	for _, want := range []string{
		"time to open 40 watches over 4 streams at once, tiers of 2 proxies vs etcd grpc-proxy",
		"time to open 40 watches over 4 streams at once, tiers of 2 proxies vs direct",
		"watch delivery p99, 40 watchers, 100 puts/s, tiers of 2 proxies vs etcd grpc-proxy",
		"watch delivery p50, 40 watchers, 100 puts/s, tiers of 2 proxies vs direct",
	} {
		if row, ok := seen[want]; !ok || row.Beacon <= 0 || row.Baseline <= 0 {
			t.Errorf("report lacks %q (or it is not measured):\n%s", want, b)
		}
	}
	cpu, ok := seen["tier's CPU per event delivered, 40 watchers, burst of 20 puts, tiers of 2 proxies vs etcd grpc-proxy"]
	if !ok || cpu.Beacon <= 0 || cpu.Baseline <= 0 {
		t.Errorf("the tiers' CPU per event is not measured:\n%s", b)
	}
	for _, against := range []string{sideDirect, sideGP} {
		if lost := seen["events lost, 40 watchers, burst of 20 puts, tiers of 2 proxies vs "+against]; lost.Beacon != 0 || lost.Baseline != 0 {
			t.Errorf("events lost: %+v", lost)
		}
	}
	if !strings.Contains(b, "Beacon's tier held 4 etcd watch(es) for the 40 identical client watches") {
		t.Errorf("upstream watches:\n%s", b)
	}
}

// TestWatchMsgParse: the benchmark's watchers read, of an etcd
// WatchResponse as etcd encodes it, the watch ID, created and canceled
// with the reason, the number of plain events and the latency samples'
// numbers, and the same message reused forgets the last response.
func TestWatchMsgParse(t *testing.T) {
	kv := func(v string) *mvccpb.Event {
		return &mvccpb.Event{Kv: &mvccpb.KeyValue{Key: []byte("bench/watch/k"), Value: []byte(v), ModRevision: 9, Version: 2}}
	}
	var m watchMsg
	for _, c := range []struct {
		resp    *pb.WatchResponse
		want    watchMsg
		samples []int
	}{
		{&pb.WatchResponse{Header: &pb.ResponseHeader{Revision: 9}, WatchId: 7, Events: []*mvccpb.Event{kv("b"), kv("l12"), kv("l"), kv("lx1"), kv("l3")}},
			watchMsg{id: 7, events: 3}, []int{12, 3}},
		{&pb.WatchResponse{WatchId: 0, Created: true}, watchMsg{created: true}, nil},
		{&pb.WatchResponse{WatchId: 3, Canceled: true, CancelReason: "no room"}, watchMsg{id: 3, canceled: true, reason: "no room"}, nil},
		{&pb.WatchResponse{WatchId: 1 << 40, CompactRevision: 5, Events: []*mvccpb.Event{{Type: mvccpb.DELETE, Kv: &mvccpb.KeyValue{Key: []byte("k")}}}},
			watchMsg{id: 1 << 40, events: 1}, nil},
	} {
		b, err := proto.Marshal(c.resp)
		if err != nil {
			t.Fatal(err)
		}
		if err := m.parse(b); err != nil {
			t.Fatalf("%v: %v", c.resp, err)
		}
		got := m
		got.samples = nil
		if got.id != c.want.id || got.created != c.want.created || got.canceled != c.want.canceled || got.reason != c.want.reason || got.events != c.want.events {
			t.Errorf("%v: read %+v, want %+v", c.resp, got, c.want)
		}
		if !slices.Equal(m.samples, c.samples) {
			t.Errorf("%v: samples %v, want %v", c.resp, m.samples, c.samples)
		}
	}
	if err := m.parse([]byte{0x5a, 0x05, 0x12}); err == nil {
		t.Error("a truncated event: no error")
	}
}
