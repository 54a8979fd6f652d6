package bench

import (
	"context"
	"encoding/json"
	"flag"
	"fmt"
	"os"
	"os/signal"
	"slices"
	"strconv"
	"strings"
	"syscall"
	"testing"
	"time"

	"github.com/beaconplane/beacon"
	"github.com/beaconplane/beacon/internal/testkit/etcdtest"
	"github.com/beaconplane/beacon/internal/testkit/machine"
	"github.com/beaconplane/beacon/internal/testkit/testpeer"
	"github.com/beaconplane/beacon/registry"
	etcdstore "github.com/beaconplane/beacon/store/etcd"
)

// childCommand makes the scenarios' child processes this test binary,
// running TestRegistryBenchChild with the child's arguments after "--".
func childCommand() []string {
	return []string{os.Args[0], "-test.run=^TestRegistryBenchChild$", "--"}
}

// TestRegistryBenchChild stands in for the beacon binary in child
// processes: `register` (the flags the failover scenario passes), `bench
// raw-registrant` and `bench etcd-server`. Without arguments it does
// nothing.
func TestRegistryBenchChild(t *testing.T) {
	args := flag.Args()
	if len(args) == 0 {
		t.Skip("only runs as a child process of the registry scenarios")
	}
	ctx, stop := signal.NotifyContext(context.Background(), os.Interrupt, syscall.SIGTERM)
	defer stop()
	opt := func(name string) string {
		for i, a := range args {
			if a == name && i+1 < len(args) {
				return args[i+1]
			}
		}
		return ""
	}
	ttl, _ := time.ParseDuration(opt("--ttl"))
	var err error
	switch {
	case args[0] == "register":
		err = childRegister(ctx, args[1], opt("--id"), opt("--addr"), opt("--endpoints"), ttl)
	case len(args) > 1 && args[1] == "raw-registrant":
		err = RunRawRegistrant(ctx, strings.Split(opt("--endpoints"), ","), opt("--key"), opt("--value"), ttl, os.Stdin, os.Stdout)
	case len(args) > 1 && args[1] == "watch-watchers":
		n, _ := strconv.Atoi(opt("--watchers"))
		samples, _ := strconv.Atoi(opt("--samples"))
		err = RunWatchChild(ctx, WatchChildConfig{Side: opt("--side"), Endpoints: strings.Split(opt("--endpoints"), ","),
			Namespace: opt("--namespace"), Watchers: n, Samples: samples, ProfileDir: opt("--profile-dir")}, os.Stdin, os.Stdout)
	case len(args) > 1 && args[1] == "etcd-server":
		err = RunEtcdServerChild(ctx, strings.Contains(strings.Join(args, " "), "--no-fsync"), os.Stdin, os.Stdout)
	default:
		err = fmt.Errorf("unknown child command %q", args)
	}
	if err != nil {
		fmt.Fprintln(os.Stderr, "child:", err)
		os.Exit(1)
	}
	os.Exit(0)
}

func childRegister(ctx context.Context, endpoint, id, addr, endpoints string, ttl time.Duration) error {
	q, err := beacon.ParseQuery(endpoint)
	if err != nil {
		return err
	}
	st, err := etcdstore.Open(ctx, etcdstore.Config{Endpoints: strings.Split(endpoints, ",")})
	if err != nil {
		return err
	}
	r, err := registry.New(st, registry.Config{LeaseTTL: ttl})
	if err != nil {
		return err
	}
	if _, err := r.Register(ctx, beacon.Instance{Namespace: q.Namespace, Component: q.Component, Endpoint: q.Endpoint, ID: id, Address: addr}); err != nil {
		return err
	}
	fmt.Println(`{"event":"registered"}`)
	_, _ = os.Stdin.Read(make([]byte, 1)) // until the parent goes
	return nil
}

func checkReport(t *testing.T, rep *Report, rows int) {
	t.Helper()
	if len(rep.Rows) != rows {
		t.Fatalf("%s: %d rows, want %d", rep.Scenario, len(rep.Rows), rows)
	}
	for _, r := range rep.Rows {
		if r.Beacon < 0 || r.Baseline < 0 {
			t.Fatalf("%s: row %+v", rep.Scenario, r)
		}
	}
	var b strings.Builder
	if err := rep.WriteTable(&b); err != nil {
		t.Fatal(err)
	}
	if err := json.NewEncoder(&b).Encode(rep); err != nil {
		t.Fatal(err)
	}
	t.Log("\n" + b.String())
}

// TestRegistryScenariosSmall runs every registry scenario with tiny sizes
// on an embedded etcd without fsync.
func TestRegistryScenariosSmall(t *testing.T) {
	if testing.Short() {
		t.Skip("starts etcd servers and child processes")
	}
	machine.Exclusive(t)
	ctx, cancel := context.WithTimeout(context.Background(), 2*time.Minute)
	defer cancel()
	cfg := RegistryConfig{NoFsync: true, Instances: 200, Concurrency: []int{8}, Sequential: 20, Watchers: []int{1, 20}, Samples: 5,
		Children: 2, MemInstances: 200, MemWatchers: 100, Command: childCommand(), NoCeiling: true, Rounds: 1}
	rep, err := RunRegister(ctx, cfg)
	if err != nil {
		t.Fatal(err)
	}
	checkReport(t, rep, 12) // rate (same-op, raw), p50, p99, p99 vs same-op, client CPU (same-op, from an instance, raw), etcd CPU (same-op, raw); 1 worker: rate, p50
	for _, r := range rep.Rows {
		if strings.HasPrefix(r.Metric, "client CPU per registration") && (r.Beacon <= 0 || r.Baseline <= 0) {
			t.Errorf("%s against %s: %v and %v µs, want both measured", r.Metric, r.Against, r.Beacon, r.Baseline)
		}
	}
	if rep, err = RunWatch(ctx, cfg); err != nil {
		t.Fatal(err)
	}
	checkReport(t, rep, 10) // per watcher count: p50, p99, etcd server watches, CPU per change, resident memory
	for _, r := range rep.Rows {
		if strings.HasPrefix(r.Metric, "etcd server watches") && r.Beacon != 1 {
			t.Fatalf("Beacon opened %v etcd watches for %q, want 1", r.Beacon, r.Metric)
		}
	}
	if rep, err = RunFailover(ctx, cfg); err != nil {
		t.Fatal(err)
	}
	checkReport(t, rep, 4)
	if rep, err = RunMemory(ctx, cfg); err != nil {
		t.Fatal(err)
	}
	checkReport(t, rep, 4) // server heap per instance, client heap and resident memory per registration, client heap per watcher
}

// TestRegisterCeiling runs the register scenario at a small size with
// etcd's benchmark tool beside it: the ceiling rows are there, with a
// positive rate, for both worker counts, and three rounds give a spread.
func TestRegisterCeiling(t *testing.T) {
	if testing.Short() {
		t.Skip("starts etcd and etcd's benchmark tool")
	}
	machine.Exclusive(t)
	bin := testpeer.Built(t, "benchmark")
	ctx, cancel := context.WithTimeout(context.Background(), 2*time.Minute)
	defer cancel()
	rep, err := RunRegister(ctx, RegistryConfig{NoFsync: true, Instances: 320, Concurrency: []int{16, 32}, Sequential: 10,
		Rounds: 3, BenchmarkBin: bin, Command: childCommand()})
	if err != nil {
		t.Fatal(err)
	}
	checkReport(t, rep, 2*13+2) // per worker count: rate (same-op, txn-put, raw), p50, p99, p99 vs each ceiling, client CPU (same-op, from an instance, raw), etcd CPU (same-op, txn-put, raw)
	ceilings := 0
	for _, r := range rep.Rows {
		if r.Against == "txn-put ceiling" && strings.HasPrefix(r.Metric, "registrations/s") {
			ceilings++
			if r.Baseline <= 0 || r.Beacon <= 0 || r.Runs != 3 || r.BaselineLo > r.Baseline || r.Baseline > r.BaselineHi {
				t.Errorf("ceiling row %+v", r)
			}
		}
	}
	if ceilings != 2 {
		t.Errorf("%d ceiling rows, want 2", ceilings)
	}
}

func TestParseBenchmarkOutput(t *testing.T) {
	out := "Summary:\n  Total:\t0.3084 secs.\n  Requests/sec:\t1621.1634\n\nLatency distribution:\n  50% in 0.0018 secs.\n  99% in 0.0108 secs.\n"
	res, err := parseBenchmarkOutput(out)
	if err != nil || res.keysPerSec != 1621.1634 || res.p50ms != 1.8 || res.p99ms != 10.8 {
		t.Fatalf("%+v %v", res, err)
	}
	for _, bad := range []string{"", "Summary:\n", "Requests/sec:\t1\nError distribution:\n  [10] etcdserver: too many operations in txn request\n"} {
		if _, err := parseBenchmarkOutput(bad); err == nil {
			t.Errorf("%q: no error", bad)
		}
	}
}

func TestRegistryConfigValidate(t *testing.T) {
	for _, c := range []RegistryConfig{{Instances: -1}, {Watchers: []int{0}}, {TTL: time.Millisecond}, {Instances: 1 << 40},
		{Concurrency: []int{0}}, {Concurrency: []int{-3}}, {Rounds: 1000}, {Batch: 129}, {Batch: -1}, {Watchers: []int{1 << 30}}} {
		if err := c.Validate(); err == nil {
			t.Errorf("%+v: no error", c)
		}
	}
}

// TestWatchAgainstHostPortEndpoint: --endpoints host:port, as every other
// command takes it, works for the registry scenarios (the watch scenario
// reads etcd's /metrics at the first endpoint, which failed with "first
// path segment in URL cannot contain colon"); a bad endpoint is refused
// naming the flag.
func TestWatchAgainstHostPortEndpoint(t *testing.T) {
	if testing.Short() {
		t.Skip("starts an etcd server")
	}
	srv := etcdtest.Start(t, etcdtest.Options{})
	ctx, cancel := context.WithTimeout(context.Background(), time.Minute)
	defer cancel()
	hostport := strings.TrimPrefix(srv.Endpoint(), "http://")
	cfg := RegistryConfig{Endpoints: []string{hostport}, Watchers: []int{1}, Samples: 5, Rounds: 1, Command: childCommand()}
	rep, err := RunWatch(ctx, cfg)
	if err != nil {
		t.Fatalf("bench watch --endpoints %s: %v", hostport, err)
	}
	checkReport(t, rep, 5)
	cfg.Endpoints = []string{"tcp://" + hostport}
	if _, err := RunWatch(ctx, cfg); err == nil || !strings.Contains(err.Error(), "--endpoints") {
		t.Fatalf("bench watch --endpoints tcp://...: %v, want an error naming --endpoints", err)
	}
}

// TestServerChildOwnGroup: the scenarios' etcd server runs in a process
// group of its own, so that a terminal's Ctrl-C (SIGINT to the foreground
// group) reaches only the benchmark, which revokes its leases while that
// etcd still answers and then stops it.
func TestServerChildOwnGroup(t *testing.T) {
	if testing.Short() {
		t.Skip("starts etcd in a child process")
	}
	ctx, cancel := context.WithTimeout(context.Background(), time.Minute)
	defer cancel()
	srv, err := startServerChild(ctx, childCommand(), true)
	if err != nil {
		t.Fatal(err)
	}
	defer srv.stop()
	child, err := syscall.Getpgid(srv.cmd.Process.Pid)
	if err != nil {
		t.Fatal(err)
	}
	if child == syscall.Getpgrp() {
		t.Fatalf("the etcd server child is in the benchmark's process group (%d): a Ctrl-C stops it with the benchmark", child)
	}
}

// TestCeilingBatches: the ceiling tries Beacon's own width first, then the
// wider ones up to one put per key in flight, each once.
func TestCeilingBatches(t *testing.T) {
	for _, tc := range []struct {
		workers int
		want    []int
	}{
		{1, []int{1}},
		{16, []int{8, 16}},
		{64, []int{32, 16, 48, 64}},
		{256, []int{128, 16, 32, 48, 64}},
		{1024, []int{128, 16, 32, 48, 64}},
	} {
		if got := ceilingBatches(tc.workers); !slices.Equal(got, tc.want) {
			t.Errorf("ceilingBatches(%d) = %v, want %v", tc.workers, got, tc.want)
		}
	}
}

// TestSampleOf: a watcher finds the sample in the ID the bench gave it
// (both sides read it so), and anything else is no sample.
func TestSampleOf(t *testing.T) {
	for _, i := range []int{0, 1, 299, 1 << 20} {
		if got := sampleOf(benchInstance("ns", "c", i).ID); got != i {
			t.Errorf("sampleOf(ID of sample %d) = %d", i, got)
		}
	}
	for _, id := range []string{"", "not-hex", "zz00000000000000"} {
		if got := sampleOf(id); got != -1 {
			t.Errorf("sampleOf(%q) = %d, want -1", id, got)
		}
	}
}
