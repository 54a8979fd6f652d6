package bench

import (
	"bufio"
	"cmp"
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"log/slog"
	"net/http"
	"os"
	"slices"
	"strconv"
	"strings"
	"sync"
	"sync/atomic"
	"time"

	"github.com/beaconplane/beacon"
	"github.com/beaconplane/beacon/internal/etcdtest"
	"github.com/beaconplane/beacon/registry"
	etcdstore "github.com/beaconplane/beacon/store/etcd"
	clientv3 "go.etcd.io/etcd/client/v3"
	"go.etcd.io/etcd/server/v3/embed"
	"go.uber.org/zap"
)

// RegistryConfig configures the registry scenarios (`beacon bench register
// | watch | failover | memory`). The zero value is the default run.
type RegistryConfig struct {
	// Endpoints are the etcd client URLs to measure against; empty starts
	// an embedded single-node etcd in a temporary directory.
	Endpoints []string
	// NoFsync runs the embedded etcd without fsync (faster, unlike
	// production).
	NoFsync bool
	// Logger receives progress; nil discards.
	Logger *slog.Logger

	// Register: Instances registered by Concurrency workers (defaults
	// 3000 and 64); Sequential instances by one worker (default 300).
	Instances   int
	Concurrency int
	Sequential  int
	// Rounds alternate raw and Beacon (default 3); the median is shown.
	Rounds int

	// Watch: watcher counts (default 1, 100, 1000) and registrations
	// measured for each (default 300: with one watcher, p99 is then the
	// third-slowest sample rather than the slowest).
	Watchers []int
	Samples  int

	// Failover: registrant processes killed per side (default 10) and
	// their lease TTL (default 2 s, etcd's minimum). Command runs the
	// beacon binary (default: this executable).
	Children int
	TTL      time.Duration
	Command  []string

	// Memory: registered instances (default 10,000) and watchers
	// (default 10,000).
	MemInstances int
	MemWatchers  int
}

func (c *RegistryConfig) defaults() {
	if c.Instances == 0 {
		c.Instances = 3000
	}
	if c.Concurrency == 0 {
		c.Concurrency = 64
	}
	if c.Sequential == 0 {
		c.Sequential = 300
	}
	if c.Rounds == 0 {
		c.Rounds = 3
	}
	if len(c.Watchers) == 0 {
		c.Watchers = []int{1, 100, 1000}
	}
	if c.Samples == 0 {
		c.Samples = 300
	}
	if c.Children == 0 {
		c.Children = 10
	}
	if c.TTL == 0 {
		c.TTL = 2 * time.Second
	}
	if c.MemInstances == 0 {
		c.MemInstances = 10_000
	}
	if c.MemWatchers == 0 {
		c.MemWatchers = 10_000
	}
	if c.Logger == nil {
		c.Logger = slog.New(slog.DiscardHandler)
	}
}

// Validate checks the sizes.
func (c RegistryConfig) Validate() error {
	for name, v := range map[string]int{"instances": c.Instances, "concurrency": c.Concurrency, "sequential": c.Sequential,
		"samples": c.Samples, "rounds": c.Rounds, "children": c.Children, "mem-instances": c.MemInstances, "mem-watchers": c.MemWatchers} {
		if v < 0 {
			return fmt.Errorf("bench: --%s %d: must be positive", name, v)
		}
	}
	for _, w := range c.Watchers {
		if w <= 0 {
			return fmt.Errorf("bench: --watchers %d: must be positive", w)
		}
	}
	if c.TTL != 0 {
		if err := registry.ValidateTTL(c.TTL); err != nil {
			return fmt.Errorf("bench: --ttl: %w", err)
		}
	}
	return nil
}

// etcdTarget is the etcd a scenario measures.
type etcdTarget struct {
	endpoints []string
	embedded  bool
	setup     string
	stop      func()
}

// startTarget returns cfg's etcd: the given endpoints, or a new embedded
// server.
func startTarget(cfg RegistryConfig) (*etcdTarget, error) {
	if len(cfg.Endpoints) > 0 {
		return &etcdTarget{endpoints: cfg.Endpoints, setup: "etcd at " + strings.Join(cfg.Endpoints, ","), stop: func() {}}, nil
	}
	fsync := !cfg.NoFsync
	srv, err := etcdtest.New(etcdtest.Options{Name: "bench-registry", Configure: func(c *embed.Config) {
		c.UnsafeNoFsync = !fsync
	}})
	if err != nil {
		return nil, fmt.Errorf("bench: start embedded etcd: %w", err)
	}
	setup := "embedded single-node etcd 3.7 (fsync)"
	if !fsync {
		setup = "embedded single-node etcd 3.7 (no fsync)"
	}
	return &etcdTarget{endpoints: srv.Endpoints(), embedded: true, setup: setup, stop: srv.Close}, nil
}

func rawClient(eps []string) (*clientv3.Client, error) {
	return clientv3.New(clientv3.Config{Endpoints: eps, DialTimeout: 10 * time.Second, Logger: zap.NewNop()})
}

func beaconStore(ctx context.Context, eps []string) (*etcdstore.Store, error) {
	return etcdstore.New(ctx, etcdstore.Config{Endpoints: eps})
}

// etcdMetric reads one metric (summed over its series) from an etcd
// server's /metrics.
func etcdMetric(ctx context.Context, endpoint, name string) (float64, error) {
	req, err := http.NewRequestWithContext(ctx, http.MethodGet, strings.TrimSuffix(endpoint, "/")+"/metrics", nil)
	if err != nil {
		return 0, err
	}
	resp, err := http.DefaultClient.Do(req)
	if err != nil {
		return 0, err
	}
	defer resp.Body.Close()
	if resp.StatusCode != http.StatusOK {
		return 0, fmt.Errorf("GET %s/metrics: %s", endpoint, resp.Status)
	}
	sum, found := 0.0, false
	sc := bufio.NewScanner(resp.Body)
	sc.Buffer(make([]byte, 64<<10), 1<<20)
	for sc.Scan() {
		line := sc.Text()
		if !strings.HasPrefix(line, name) || (len(line) > len(name) && line[len(name)] != ' ' && line[len(name)] != '{') {
			continue
		}
		f := strings.Fields(line)
		v, err := strconv.ParseFloat(f[len(f)-1], 64)
		if err != nil {
			return 0, fmt.Errorf("metric %s: %q: %w", name, line, err)
		}
		sum, found = sum+v, true
	}
	if !found {
		return 0, fmt.Errorf("metric %s not served by %s", name, endpoint)
	}
	return sum, sc.Err()
}

// benchInstance is the instance the scenarios register, and rawValue its
// stored form (the raw baseline writes the same bytes).
func benchInstance(ns, component string, i int) beacon.Instance {
	return beacon.Instance{
		Namespace: ns, Component: component, Endpoint: "generate",
		ID:        beacon.FormatID(uint64(i + 1)),
		Address:   fmt.Sprintf("10.%d.%d.%d:9000", (i>>16)&255, (i>>8)&255, i&255),
		Transport: "tcp", Metadata: map[string]string{"zone": "a", "weight": "10"},
		Status: beacon.StatusServing, RegisteredAt: time.Now().UTC().Truncate(time.Millisecond),
	}
}

func rawValue(in beacon.Instance) string {
	b, _ := json.Marshal(in)
	return string(b)
}

// rawKey is where the raw baseline writes an instance (the Beacon layout
// under another root, so that the two never collide).
func rawKey(in beacon.Instance) string {
	return "/bench-raw" + beacon.ServicesDir + in.Ref().String()
}

// run runs op(i) for i in [0, n) on workers goroutines and returns the
// total time and each op's latency.
func run(ctx context.Context, n, workers int, op func(ctx context.Context, i int) error) (time.Duration, []time.Duration, error) {
	lat := make([]time.Duration, n)
	var next atomic.Int64
	var wg sync.WaitGroup
	var errOnce sync.Once
	var firstErr error
	ctx, cancel := context.WithCancel(ctx)
	defer cancel()
	start := time.Now()
	for range min(workers, n) {
		wg.Add(1)
		go func() {
			defer wg.Done()
			for {
				i := int(next.Add(1) - 1)
				if i >= n || ctx.Err() != nil {
					return
				}
				t := time.Now()
				if err := op(ctx, i); err != nil {
					errOnce.Do(func() { firstErr = err; cancel() })
					return
				}
				lat[i] = time.Since(t)
			}
		}()
	}
	wg.Wait()
	return time.Since(start), lat, firstErr
}

// RunRegister measures registrations per second: Beacon's Register through
// one session (one shared lease, concurrent registrations batched into
// transactions) against the raw etcd client's "grant a lease + put" per
// instance, with the same concurrency and the same values.
func RunRegister(ctx context.Context, cfg RegistryConfig) (*Report, error) {
	cfg.defaults()
	if err := cfg.Validate(); err != nil {
		return nil, err
	}
	tgt, err := startTarget(cfg)
	if err != nil {
		return nil, err
	}
	defer tgt.stop()
	cli, err := rawClient(tgt.endpoints)
	if err != nil {
		return nil, err
	}
	defer cli.Close()
	st, err := beaconStore(ctx, tgt.endpoints)
	if err != nil {
		return nil, err
	}
	defer st.Close()
	const ttl = 30 * time.Second
	ttlSecs := int64(ttl / time.Second)

	var leases []clientv3.LeaseID
	var leasesMu sync.Mutex
	rawOp := func(ns string) func(ctx context.Context, i int) error {
		return func(ctx context.Context, i int) error {
			in := benchInstance(ns, "reg", i)
			l, err := cli.Grant(ctx, ttlSecs)
			if err != nil {
				return fmt.Errorf("raw grant: %w", err)
			}
			if _, err := cli.Put(ctx, rawKey(in), rawValue(in), clientv3.WithLease(l.ID)); err != nil {
				return fmt.Errorf("raw put: %w", err)
			}
			leasesMu.Lock()
			leases = append(leases, l.ID)
			leasesMu.Unlock()
			return nil
		}
	}
	// revokeRaw ends the raw leases (untimed), so that their expiry does
	// not load etcd during later measurements.
	revokeRaw := func() error {
		ls := leases
		leases = nil
		_, _, err := run(ctx, len(ls), 32, func(ctx context.Context, i int) error {
			_, err := cli.Revoke(ctx, ls[i])
			return err
		})
		return err
	}
	type result struct {
		total time.Duration
		lat   []time.Duration
	}
	measure := func(round string, n, workers int) (raw, bcn result, err error) {
		cfg.Logger.Info("register: raw etcd", "round", round, "instances", n, "workers", workers)
		raw.total, raw.lat, err = run(ctx, n, workers, rawOp("raw-"+round))
		if err != nil {
			return raw, bcn, err
		}
		if err := revokeRaw(); err != nil {
			return raw, bcn, err
		}
		r, err := registry.New(st, registry.Config{Root: "/bench-beacon", LeaseTTL: ttl})
		if err != nil {
			return raw, bcn, err
		}
		defer r.Close()
		cfg.Logger.Info("register: beacon", "round", round, "instances", n, "workers", workers)
		bcn.total, bcn.lat, err = run(ctx, n, workers, func(ctx context.Context, i int) error {
			_, err := r.Register(ctx, benchInstance("beacon-"+round, "reg", i))
			return err
		})
		return raw, bcn, err
	}
	// Warm both paths up (connections, the session lease), then alternate
	// the two sides for several rounds and keep each side's median round,
	// so that other load on the machine (disk syncs above all) hits both.
	if _, _, err := measure("warmup", 200, cfg.Concurrency); err != nil {
		return nil, err
	}
	median := func(rs []result) result {
		slices.SortFunc(rs, func(a, b result) int { return cmp.Compare(a.total, b.total) })
		return rs[len(rs)/2]
	}
	var conRaws, conBcns, seqRaws, seqBcns []result
	for round := range cfg.Rounds {
		raw, bcn, err := measure(fmt.Sprintf("c%d", round), cfg.Instances, cfg.Concurrency)
		if err != nil {
			return nil, err
		}
		conRaws, conBcns = append(conRaws, raw), append(conBcns, bcn)
		if raw, bcn, err = measure(fmt.Sprintf("s%d", round), cfg.Sequential, 1); err != nil {
			return nil, err
		}
		seqRaws, seqBcns = append(seqRaws, raw), append(seqBcns, bcn)
	}
	conRaw, conBcn, seqRaw, seqBcn := median(conRaws), median(conBcns), median(seqRaws), median(seqBcns)
	rate := func(n int, d time.Duration) float64 { return float64(n) / d.Seconds() }
	rep := &Report{
		Scenario: "register",
		Setup: fmt.Sprintf("%s; Beacon: one registry session (one lease, concurrent registrations batched into transactions) vs raw clientv3 Grant + Put per instance; same JSON values",
			tgt.setup),
	}
	rep.Add(Row{Metric: fmt.Sprintf("registrations/s, %d workers", cfg.Concurrency), Unit: "ops/s",
		Beacon: rate(cfg.Instances, conBcn.total), Baseline: rate(cfg.Instances, conRaw.total), HigherIsBetter: true, Goal: 3})
	rep.Add(Row{Metric: fmt.Sprintf("register latency p50, %d workers", cfg.Concurrency), Unit: "ms",
		Beacon: Ms(Percentile(conBcn.lat, 50)), Baseline: Ms(Percentile(conRaw.lat, 50))})
	rep.Add(Row{Metric: fmt.Sprintf("register latency p99, %d workers", cfg.Concurrency), Unit: "ms",
		Beacon: Ms(Percentile(conBcn.lat, 99)), Baseline: Ms(Percentile(conRaw.lat, 99))})
	rep.Add(Row{Metric: "registrations/s, 1 worker", Unit: "ops/s",
		Beacon: rate(cfg.Sequential, seqBcn.total), Baseline: rate(cfg.Sequential, seqRaw.total), HigherIsBetter: true})
	rep.Add(Row{Metric: "register latency p50, 1 worker", Unit: "ms",
		Beacon: Ms(Percentile(seqBcn.lat, 50)), Baseline: Ms(Percentile(seqRaw.lat, 50))})
	rep.Note("%d instances by %d workers, then %d by one worker, %d rounds alternating raw and Beacon (median round shown); each raw registration is 2 round trips (grant, put), each Beacon one (a transaction shared with concurrent registrations)",
		cfg.Instances, cfg.Concurrency, cfg.Sequential, cfg.Rounds)
	rep.Note("with fsync, each worker completes about one etcd request per disk sync, so with equal concurrency Beacon's lead approaches 2x when syncs dominate, and grows when etcd's per-request CPU does (see --no-fsync)")
	return rep, nil
}

// errChildExited reports a child process that ended before it was ready.
var errChildExited = errors.New("bench: child process exited early")

// executable returns the command that runs the beacon binary.
func (c RegistryConfig) executable() ([]string, error) {
	if len(c.Command) > 0 {
		return c.Command, nil
	}
	exe, err := os.Executable()
	if err != nil {
		return nil, err
	}
	return []string{exe}, nil
}
