package bench

import (
	"bufio"
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"log/slog"
	"net/http"
	"os"
	"os/exec"
	"slices"
	"strconv"
	"strings"
	"sync"
	"sync/atomic"
	"time"

	"github.com/beaconplane/beacon"
	"github.com/beaconplane/beacon/registry"
	etcdstore "github.com/beaconplane/beacon/store/etcd"
	"go.etcd.io/etcd/api/v3/v3rpc/rpctypes"
	clientv3 "go.etcd.io/etcd/client/v3"
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

	// Register: Instances registered by each number of concurrent
	// workers in Concurrency (defaults 6000, and 64 and 256); Sequential
	// instances by one worker (default 300).
	Instances   int
	Concurrency []int
	Sequential  int
	// Rounds alternate the sides (default 3); the median is shown with
	// the spread.
	Rounds int
	// Batch is the transaction size of the batched-write ceiling: etcd's
	// benchmark tool runs txn-put with Batch puts per transaction and
	// workers/Batch clients, the same keys in flight as Beacon's workers
	// (default: the fastest of the widths ceilingBatches lists, each tried
	// once before the rounds). BenchmarkBin is the tool's path (default:
	// found in PeersDir()/bin or PATH); NoCeiling skips that side.
	Batch        int
	BenchmarkBin string
	NoCeiling    bool

	// Watch: watcher counts (default 1, 100, 1000) and registrations
	// measured for each (default 300: with one watcher, p99 is then the
	// third-slowest sample rather than the slowest).
	// WatchProfileDir, when set, receives CPU and allocation profiles of
	// each side's watcher process (see WatchChildConfig.ProfileDir).
	Watchers        []int
	Samples         int
	WatchProfileDir string

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
	setDefault(&c.Instances, 20000)
	if len(c.Concurrency) == 0 {
		c.Concurrency = []int{64, 256}
	}
	setDefault(&c.Sequential, 300)
	setDefault(&c.Rounds, 3)
	if len(c.Watchers) == 0 {
		c.Watchers = []int{1, 100, 1000}
	}
	setDefault(&c.Samples, 300)
	setDefault(&c.Children, 10)
	setDefault(&c.TTL, 2*time.Second)
	setDefault(&c.MemInstances, 10_000)
	setDefault(&c.MemWatchers, 10_000)
	setDefault(&c.Logger, discardLogger())
}

// Limits of the sizes a scenario accepts: beyond them a run would take
// hours or exhaust memory, which is a typing mistake rather than a plan.
const (
	maxInstances   = 10_000_000
	maxConcurrency = 100_000
	maxWatchers    = 1_000_000
	maxRounds      = 100
	maxChildren    = 1000
)

// Validate checks the sizes (zero means the default).
func (c RegistryConfig) Validate() error {
	for _, v := range []struct {
		name  string
		val   int
		limit int
	}{
		{"instances", c.Instances, maxInstances}, {"sequential", c.Sequential, maxInstances},
		{"samples", c.Samples, maxInstances}, {"rounds", c.Rounds, maxRounds},
		{"children", c.Children, maxChildren}, {"mem-instances", c.MemInstances, maxInstances},
		{"mem-watchers", c.MemWatchers, maxWatchers}, {"batch", c.Batch, 128},
	} {
		if v.val < 0 {
			return fmt.Errorf("bench: --%s %d: must be positive", v.name, v.val)
		}
		if v.val > v.limit {
			return fmt.Errorf("bench: --%s %d: at most %d", v.name, v.val, v.limit)
		}
	}
	for _, w := range c.Concurrency {
		if w <= 0 || w > maxConcurrency {
			return fmt.Errorf("bench: --concurrency %d: must be between 1 and %d", w, maxConcurrency)
		}
	}
	for _, w := range c.Watchers {
		if w <= 0 || w > maxWatchers {
			return fmt.Errorf("bench: --watchers %d: must be between 1 and %d", w, maxWatchers)
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
	embedded  bool // started by the scenario (its data goes with it)
	setup     string
	stop      func()
	pid       int // etcd's process, when the scenario runs it (0: unknown)
}

// cpu is the CPU time etcd's process has used (0 when not known).
func (t *etcdTarget) cpu() time.Duration {
	if t.pid == 0 {
		return 0
	}
	return processCPU(t.pid)
}

// startTarget returns cfg's etcd: the given endpoints, or a new
// single-node etcd in a child process (`beacon bench etcd-server`, the
// server package's embedded etcd), so that the load generator never
// shares a Go runtime with etcd, as etcd's own benchmark tool does not.
func startTarget(ctx context.Context, cfg RegistryConfig) (*etcdTarget, error) {
	if len(cfg.Endpoints) > 0 {
		eps, err := endpointURLs(cfg.Endpoints)
		if err != nil {
			return nil, err
		}
		return &etcdTarget{endpoints: eps, setup: "etcd at " + strings.Join(eps, ","), stop: func() {}}, nil
	}
	exe, err := cfg.executable()
	if err != nil {
		return nil, err
	}
	srv, err := startServerChild(ctx, exe, cfg.NoFsync)
	if err != nil {
		return nil, fmt.Errorf("bench: start etcd: %w", err)
	}
	cfg.Logger.Info("started", "process", "etcd-server", "pid", srv.cmd.Process.Pid, "addr", srv.endpoint)
	setup := "single-node etcd 3.7 in its own process (fsync)"
	if cfg.NoFsync {
		setup = "single-node etcd 3.7 in its own process (no fsync)"
	}
	return &etcdTarget{endpoints: []string{srv.endpoint}, embedded: true, setup: setup, stop: srv.stop, pid: srv.cmd.Process.Pid}, nil
}

// endpointURLs checks --endpoints as the other commands do and writes
// host:port as http://host:port: the scenarios also read etcd's /metrics
// at the first endpoint, which needs a URL.
func endpointURLs(eps []string) ([]string, error) {
	out := make([]string, 0, len(eps))
	for _, ep := range eps {
		if err := etcdstore.CheckEndpoint(ep); err != nil {
			return nil, fmt.Errorf("--endpoints: %w", err)
		}
		if !strings.Contains(ep, "://") {
			ep = "http://" + ep
		}
		out = append(out, ep)
	}
	return out, nil
}

func rawClient(eps []string) (*clientv3.Client, error) {
	return clientv3.New(clientv3.Config{Endpoints: eps, DialTimeout: 10 * time.Second, Logger: zap.NewNop()})
}

func beaconStore(ctx context.Context, eps []string) (*etcdstore.Store, error) {
	return etcdstore.Open(ctx, etcdstore.Config{Endpoints: eps})
}

// etcdMetric reads one metric (summed over its series) from an etcd
// server's /metrics.
func etcdMetric(ctx context.Context, endpoint, name string) (float64, error) {
	sum, found := 0.0, false
	var perr error
	err := readMetrics(ctx, strings.TrimSuffix(endpoint, "/"), func(line string) bool {
		if !strings.HasPrefix(line, name) || (len(line) > len(name) && line[len(name)] != ' ' && line[len(name)] != '{') {
			return true
		}
		f := strings.Fields(line)
		v, err := strconv.ParseFloat(f[len(f)-1], 64)
		if err != nil {
			perr = fmt.Errorf("metric %s: %q: %w", name, line, err)
			return false
		}
		sum, found = sum+v, true
		return true
	})
	if err := errors.Join(err, perr); err != nil {
		return 0, err
	}
	if !found {
		return 0, fmt.Errorf("metric %s not served by %s", name, endpoint)
	}
	return sum, nil
}

// readMetrics reads base's /metrics page and calls line with each of its
// lines until line returns false.
func readMetrics(ctx context.Context, base string, line func(string) bool) error {
	req, err := http.NewRequestWithContext(ctx, http.MethodGet, base+"/metrics", nil)
	if err != nil {
		return err
	}
	resp, err := http.DefaultClient.Do(req)
	if err != nil {
		return err
	}
	defer resp.Body.Close()
	if resp.StatusCode != http.StatusOK {
		return fmt.Errorf("GET %s/metrics: %s", base, resp.Status)
	}
	sc := bufio.NewScanner(resp.Body)
	sc.Buffer(make([]byte, 64<<10), 1<<20)
	for sc.Scan() {
		if !line(sc.Text()) {
			return nil
		}
	}
	return sc.Err()
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

// benchInstances are the n instances a side of the register scenario
// registers, made before the clock starts: building them (formatting the
// address and ID, the metadata map) is the harness's work, which etcd's
// benchmark tool, on the ceiling side, does not have.
func benchInstances(ns string, n int) []beacon.Instance {
	insts := make([]beacon.Instance, n)
	for i := range insts {
		insts[i] = benchInstance(ns, "reg", i)
	}
	return insts
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
// total time and each op's latency. An interrupt (ctx) stops new
// operations but lets those in flight finish (for at most 10 s), so that
// what they created (a lease, a key) is known and can be removed; the
// first error stops everything.
func run(ctx context.Context, n, workers int, op func(ctx context.Context, i int) error) (time.Duration, []time.Duration, error) {
	lat := make([]time.Duration, n)
	var next atomic.Int64
	var wg sync.WaitGroup
	var errOnce sync.Once
	var firstErr error
	opCtx, cancel := cleanupContext(ctx, 10*time.Second)
	defer cancel()
	start := time.Now()
	for range min(workers, n) {
		wg.Add(1)
		go func() {
			defer wg.Done()
			for {
				i := int(next.Add(1) - 1)
				if i >= n || ctx.Err() != nil || opCtx.Err() != nil {
					return
				}
				t := time.Now()
				if err := op(opCtx, i); err != nil {
					errOnce.Do(func() { firstErr = err; cancel() })
					return
				}
				lat[i] = time.Since(t)
			}
		}()
	}
	wg.Wait()
	if firstErr == nil && ctx.Err() != nil {
		firstErr = ctx.Err()
	}
	return time.Since(start), lat, firstErr
}

// CeilingBatch is the transaction size Beacon's group commit reaches with
// workers concurrent registrations (half of them, at most 128, a
// transaction's most; see registry's batcher), which the ceiling uses
// unless told otherwise.
func CeilingBatch(workers int) int { return max(1, min(128, (workers+1)/2)) }

// RunRegister measures registrations per second for each number of
// concurrent workers: Beacon's Register through one session (one shared
// lease, concurrent registrations batched into transactions) against the
// batched-write ceiling of the same etcd member (etcd's benchmark tool,
// txn-put with the same keys in flight, in transactions of cfg.Batch
// puts of the same sizes) and against the raw etcd client's "grant a lease
// + put" per instance. Rounds alternate the sides in turn.
func RunRegister(ctx context.Context, cfg RegistryConfig) (*Report, error) {
	cfg.defaults()
	if err := cfg.Validate(); err != nil {
		return nil, err
	}
	if err := fits(memNeed{"--instances", cfg.Instances, costEtcdInstance + costRegistration, "instances registered at once"}); err != nil {
		return nil, err
	}
	rb := &registerBench{cfg: cfg, batches: map[int]int{}, tried: map[int]string{}, sameWidth: map[int]int{}, sameTried: map[int]string{}}
	if !cfg.NoCeiling && len(cfg.Endpoints) == 0 {
		var err error
		if rb.benchBin, err = BenchmarkPeer.Find(cfg.BenchmarkBin); err != nil {
			return nil, fmt.Errorf("%w (or skip the ceiling with --no-ceiling)", err)
		}
	}
	tgt, err := startTarget(ctx, cfg)
	if err != nil {
		return nil, err
	}
	defer tgt.stop()
	rb.tgt = tgt
	cli, err := rawClient(tgt.endpoints)
	if err != nil {
		return nil, err
	}
	defer cli.Close()
	if rb.st, err = beaconStore(ctx, tgt.endpoints); err != nil {
		return nil, err
	}
	defer rb.st.Close()

	rb.raw = &rawRegistrar{cli: cli}
	// Whatever happens (an error, an interrupt), no raw lease outlives the
	// run; Beacon's sessions revoke their own lease when closed.
	defer func() { _ = rb.raw.revokeAll(ctx) }() // best effort: the run's error matters more

	// The ceiling writes keys of Beacon's key and value sizes, over a key
	// space of n keys (later rounds overwrite the same keys).
	sample := benchInstance("beacon-c0-0", "reg", 0)
	rb.keySize = len("/bench-beacon" + beacon.ServicesDir + sample.Ref().String())
	rb.valSize = len(rawValue(sample))

	// Warm every path up (connections, the session lease).
	cfg.Logger.Info("register: warming up")
	if _, err := rb.rawSide(ctx, "warmup", 200, cfg.Concurrency[0]); err != nil {
		return nil, err
	}
	if _, err := rb.beaconSide(ctx, "warmup", 200, cfg.Concurrency[0]); err != nil {
		return nil, err
	}
	rep := &Report{
		Scenario: "register",
		Setup: fmt.Sprintf("%s; Beacon: one registry session (one lease, concurrent registrations batched into transactions); "+
			"ceilings: Beacon's operation from a raw client (same-op) and etcd's benchmark txn-put, the same keys in flight as workers, in transactions of the width etcd commits fastest, %d-byte keys, %d-byte values; "+
			"raw: clientv3 Grant + Put per instance, same values",
			tgt.setup, rb.keySize, rb.valSize),
	}
	for wi, workers := range cfg.Concurrency {
		if err := rb.concurrent(ctx, rep, wi, workers); err != nil {
			return nil, err
		}
	}
	if err := rb.sequential(ctx, rep); err != nil {
		return nil, err
	}
	rb.notes(rep)
	return rep, nil
}

// registerBench is one run of the register scenario: its sides against
// one etcd.
type registerBench struct {
	cfg      RegistryConfig
	tgt      *etcdTarget
	st       *etcdstore.Store
	raw      *rawRegistrar
	benchBin string // etcd's benchmark tool; "": no ceiling
	// keySize and valSize are Beacon's, which the ceiling writes.
	keySize, valSize int
	// batches is the ceiling's transaction width chosen for each number
	// of workers (pickBatch), tried what it measured of each width.
	batches map[int]int
	tried   map[int]string
	// sameWidth and sameTried are the same for the same-operation
	// ceiling (registry_sameop.go).
	sameWidth map[int]int
	sameTried map[int]string
	// ceilingKeys, when set, makes the keys and values the same-op
	// ceiling writes in a round (default sameOpKeys under /bench-txn).
	ceilingKeys func(round string, n int) (keys, vals []string)
}

// registerResult is one side's registrations in one round.
type registerResult struct {
	total  time.Duration
	lat    []time.Duration
	cpu    time.Duration // etcd's, while registering (not cleaning up)
	client time.Duration // the bench process's: the side's client and its workers
	// build is the bench process's CPU building the keys and values a
	// same-op ceiling round writes from its instances (before the clock).
	build time.Duration
}

// measureCPU runs f, adding to r the CPU time etcd's process and this one
// (which runs only the side being measured: etcd is a child process) used
// meanwhile.
func (rb *registerBench) measureCPU(r *registerResult, f func()) {
	self := os.Getpid()
	etcd0, client0 := rb.tgt.cpu(), processCPU(self)
	f()
	r.cpu += rb.tgt.cpu() - etcd0
	r.client += processCPU(self) - client0
}

// settle lets etcd finish committing a side's cleanup (thousands of
// deletions) before the next side is measured, and on the bench's own
// etcd compacts the history: every side writes its keys and deletes them
// again, and 100,000 instances a round filled etcd's 2 GiB quota before
// the run ended ("database space exceeded"). The compaction is physical
// (it returns once applied), so that no side pays for it. A user's etcd
// (--endpoints) is never compacted: its history is its operator's.
func (rb *registerBench) settle(ctx context.Context) {
	if rb.tgt.embedded && rb.raw != nil {
		if err := rb.raw.compact(ctx); err != nil && ctx.Err() == nil {
			rb.cfg.Logger.Warn("register: compacting the bench's etcd between sides failed", "err", err)
		}
	}
	select {
	case <-time.After(300 * time.Millisecond):
	case <-ctx.Done():
	}
}

// rawSide registers n instances with the raw client from workers, then
// revokes their leases.
func (rb *registerBench) rawSide(ctx context.Context, round string, n, workers int) (registerResult, error) {
	var r registerResult
	var err error
	op := rb.raw.op(benchInstances("raw-"+round, n))
	rb.measureCPU(&r, func() { r.total, r.lat, err = run(ctx, n, workers, op) })
	if rerr := rb.raw.revokeAll(ctx); err == nil {
		err = rerr
	}
	rb.settle(ctx)
	return r, err
}

// beaconSide registers n instances through one Beacon session from
// workers, then closes it (its lease, and so its keys, go).
func (rb *registerBench) beaconSide(ctx context.Context, round string, n, workers int) (registerResult, error) {
	var r registerResult
	reg, err := registry.New(rb.st, registry.Config{Root: "/bench-beacon", LeaseTTL: 30 * time.Second})
	if err != nil {
		return r, err
	}
	defer rb.settle(ctx)
	defer reg.Close() // revokes the session lease: its keys go with it
	insts := benchInstances("beacon-"+round, n)
	rb.measureCPU(&r, func() {
		r.total, r.lat, err = run(ctx, n, workers, func(ctx context.Context, i int) error {
			_, err := reg.Register(ctx, insts[i])
			return err
		})
	})
	return r, err
}

// batchOf is the txn-put ceiling's transaction width for workers.
func (rb *registerBench) batchOf(workers int) int { return rb.width(rb.batches, workers) }

// sameOpWidth is the same-operation ceiling's width for workers.
func (rb *registerBench) sameOpWidth(workers int) int { return rb.width(rb.sameWidth, workers) }

// width is a ceiling's transaction width for workers: --batch, else the
// one pickBatch chose (Beacon's own before it ran).
func (rb *registerBench) width(chosen map[int]int, workers int) int {
	if rb.cfg.Batch > 0 {
		return rb.cfg.Batch
	}
	if b, ok := chosen[workers]; ok {
		return b
	}
	return CeilingBatch(workers)
}

// ceilingBatches are the transaction sizes tried for the ceiling with
// workers keys in flight: Beacon's own and the widths etcd may take
// better, up to as many as keys in flight (each with workers/size
// clients). At a fixed number of keys in flight, etcd with fsync commits
// more in fewer, wider transactions (one member, 2026-12-02: 256 keys in
// flight as 256×1, 64×4, 32×8, 16×16, 8×32, 5×48 gave 9.7k, 28.7k, 41.3k,
// 52.3k, 59.6k, 66.5k keys/s; 64 as 4×16 and 1×64 gave 34.6k and 45.4k):
// a ceiling of Beacon's width alone understates it.
func ceilingBatches(workers int) []int {
	out := []int{CeilingBatch(workers)}
	for _, b := range []int{16, 32, 48, 64, 128} {
		if b <= workers && !slices.Contains(out, b) {
			out = append(out, b)
		}
	}
	return out
}

// pickBatch chooses each ceiling's transaction width for workers (unless
// --batch fixes it): the fastest of ceilingBatches(workers), each tried
// once before the rounds.
func (rb *registerBench) pickBatch(ctx context.Context, workers int) error {
	if rb.cfg.Batch > 0 {
		return nil
	}
	n := rb.cfg.Instances
	b, tried, err := rb.pickWidth(ctx, ceilingSameOp, workers, func(ctx context.Context, width int) (float64, error) {
		r, err := rb.sameOpSide(ctx, "pick", n, workers, width)
		return float64(n) / r.total.Seconds(), err
	})
	if err != nil {
		return err
	}
	rb.sameWidth[workers], rb.sameTried[workers] = b, tried
	if rb.benchBin == "" {
		return nil
	}
	b, tried, err = rb.pickWidth(ctx, "txn-put", workers, func(ctx context.Context, width int) (float64, error) {
		res, err := runTxnPut(ctx, rb.benchBin, rb.tgt.endpoints, n, workers, width, rb.keySize, rb.valSize)
		rb.settle(ctx)
		return res.keysPerSec, err
	})
	rb.batches[workers], rb.tried[workers] = b, tried
	return err
}

// registerFigures are one side's figures over the rounds.
type registerFigures struct {
	rate, p50, p99, cpu, client []float64
	built                       []float64 // client CPU with building the keys and values (same-op ceiling)
}

// add adds a round of n registrations.
func (f *registerFigures) add(rb *registerBench, n int, r registerResult) {
	f.cpu = append(f.cpu, rb.cpuPer(r.cpu))
	f.client = append(f.client, rb.cpuPer(r.client))
	f.built = append(f.built, rb.cpuPer(r.client+r.build))
	f.rate = append(f.rate, float64(n)/r.total.Seconds())
	f.p50 = append(f.p50, Ms(Percentile(r.lat, 50)))
	f.p99 = append(f.p99, Ms(Percentile(r.lat, 99)))
}

// cpuPer is CPU time d per registration of a round, in µs.
func (rb *registerBench) cpuPer(d time.Duration) float64 {
	return float64(d) / float64(time.Microsecond) / float64(rb.cfg.Instances)
}

// concurrent measures cfg.Instances registrations from workers, the
// sides in turn for cfg.Rounds rounds, and adds the rows.
func (rb *registerBench) concurrent(ctx context.Context, rep *Report, wi, workers int) error {
	cfg := rb.cfg
	if err := rb.pickBatch(ctx, workers); err != nil {
		return err
	}
	var b, r, s, c registerFigures
	sameOp := func(ctx context.Context, round string, n, workers int) (registerResult, error) {
		return rb.sameOpSide(ctx, round, n, workers, rb.sameOpWidth(workers))
	}
	sides := []struct {
		name    string
		measure func(ctx context.Context, round string, n, workers int) (registerResult, error)
		figs    *registerFigures
	}{{"beacon", rb.beaconSide, &b}, {"raw etcd", rb.rawSide, &r}, {ceilingSameOp, sameOp, &s}, {"txn-put ceiling", nil, &c}}
	for round := range cfg.Rounds {
		name := fmt.Sprintf("c%d-%d", wi, round)
		for k := range sides {
			side := sides[(round+k)%len(sides)]
			if side.measure == nil { // etcd's benchmark tool
				if err := rb.txnPutRound(ctx, workers, &c); err != nil {
					return err
				}
				continue
			}
			cfg.Logger.Info("register: load", "side", side.name, "workers", workers, "round", round)
			res, err := side.measure(ctx, name, cfg.Instances, workers)
			if err != nil {
				return err
			}
			side.figs.add(rb, cfg.Instances, res)
		}
	}
	rb.concurrentRows(rep, workers, b, r, s, c)
	return nil
}

// txnPutRound runs one round of the txn-put ceiling (if etcd's benchmark
// tool is there) and adds its figures to c.
func (rb *registerBench) txnPutRound(ctx context.Context, workers int, c *registerFigures) error {
	if rb.benchBin == "" {
		return nil
	}
	rb.cfg.Logger.Info("register: batched-write ceiling", "workers", workers)
	cpu0 := rb.tgt.cpu()
	res, err := runTxnPut(ctx, rb.benchBin, rb.tgt.endpoints, rb.cfg.Instances, workers, rb.batchOf(workers), rb.keySize, rb.valSize)
	if err != nil {
		return err
	}
	c.cpu = append(c.cpu, rb.cpuPer(rb.tgt.cpu()-cpu0))
	rb.settle(ctx)
	c.rate = append(c.rate, res.keysPerSec)
	c.p99 = append(c.p99, res.p99ms)
	return nil
}

// concurrentRows adds the rows of one worker count: Beacon (b) against
// the same-operation ceiling (s, the goal's baseline), etcd's txn-put (c)
// and the raw client (r).
func (rb *registerBench) concurrentRows(rep *Report, workers int, b, r, s, c registerFigures) {
	m := fmt.Sprintf("registrations/s, %d workers", workers)
	rep.Add(Spread(Row{Metric: m, Unit: "ops/s", HigherIsBetter: true, Goal: 0.8, Against: ceilingSameOp}, b.rate, s.rate))
	if rb.benchBin != "" {
		rep.Add(Spread(Row{Metric: m, Unit: "ops/s", HigherIsBetter: true, Against: "txn-put ceiling"}, b.rate, c.rate))
	}
	rep.Add(Spread(Row{Metric: m, Unit: "ops/s", HigherIsBetter: true, Against: "raw grant+put"}, b.rate, r.rate))
	rep.Add(Spread(Row{Metric: fmt.Sprintf("register p50, %d workers", workers), Unit: "ms", Against: "raw grant+put"}, b.p50, r.p50))
	rep.Add(Spread(Row{Metric: fmt.Sprintf("register p99, %d workers", workers), Unit: "ms", Against: "raw grant+put"}, b.p99, r.p99))
	rep.Add(Spread(Row{Metric: fmt.Sprintf("register p99 vs %d-key same-op txn p99, %d workers", rb.sameOpWidth(workers), workers), Unit: "ms",
		Against: ceilingSameOp}, b.p99, s.p99))
	if rb.benchBin != "" {
		rep.Add(Spread(Row{Metric: fmt.Sprintf("register p99 vs %d-put txn p99, %d workers", rb.batchOf(workers), workers), Unit: "ms", Against: "txn-put ceiling"}, b.p99, c.p99))
	}
	m = fmt.Sprintf("client CPU per registration, %d workers", workers)
	rep.Add(Spread(Row{Metric: m, Unit: "µs", Goal: 1, Against: ceilingSameOp}, b.client, s.client))
	rep.Add(Spread(Row{Metric: fmt.Sprintf("client CPU per registration from an instance, %d workers", workers), Unit: "µs", Goal: 1,
		Against: ceilingSameOp + " building its keys and values"}, b.client, s.built))
	rep.Add(Spread(Row{Metric: m, Unit: "µs", Against: "raw grant+put"}, b.client, r.client))
	if rb.tgt.pid == 0 {
		return
	}
	m = fmt.Sprintf("etcd CPU per registration, %d workers", workers)
	rep.Add(Spread(Row{Metric: m, Unit: "µs", Against: ceilingSameOp}, b.cpu, s.cpu))
	if rb.benchBin != "" {
		rep.Add(Spread(Row{Metric: m, Unit: "µs", Against: "txn-put ceiling"}, b.cpu, c.cpu))
	}
	rep.Add(Spread(Row{Metric: m, Unit: "µs", Against: "raw grant+put"}, b.cpu, r.cpu))
}

// sequential measures cfg.Sequential registrations by one worker, raw
// then Beacon, for cfg.Rounds rounds, and adds the rows.
func (rb *registerBench) sequential(ctx context.Context, rep *Report) error {
	n := rb.cfg.Sequential
	var b, r registerFigures
	for round := range rb.cfg.Rounds {
		name := fmt.Sprintf("s%d", round)
		rr, err := rb.rawSide(ctx, name, n, 1)
		if err != nil {
			return err
		}
		br, err := rb.beaconSide(ctx, name, n, 1)
		if err != nil {
			return err
		}
		b.add(rb, n, br)
		r.add(rb, n, rr)
	}
	rep.Add(Spread(Row{Metric: "registrations/s, 1 worker", Unit: "ops/s", HigherIsBetter: true, Against: "raw grant+put"}, b.rate, r.rate))
	rep.Add(Spread(Row{Metric: "register p50, 1 worker", Unit: "ms", Against: "raw grant+put"}, b.p50, r.p50))
	return nil
}

// notes says what was measured and how the sides differ.
func (rb *registerBench) notes(rep *Report) {
	cfg := rb.cfg
	rep.Note("%d instances per round and worker count, %d rounds, sides in turn (median, with the spread in brackets); then %d instances by one worker",
		cfg.Instances, cfg.Rounds, cfg.Sequential)
	var widths []string
	for _, w := range cfg.Concurrency {
		size := fmt.Sprintf("%d workers: %d × %d keys", w, max(1, w/rb.sameOpWidth(w)), rb.sameOpWidth(w))
		if t := rb.sameTried[w]; t != "" {
			size += " (the fastest of " + t + ")"
		}
		widths = append(widths, size)
	}
	rep.Note("same-op ceiling (the goal's baseline): a raw clientv3 client writing Beacon's operation — per key, a compare that it does not exist and a put under one lease — "+
		"in transactions with as many keys in flight as Beacon's workers, of the width etcd commits fastest (%s)", strings.Join(widths, "; "))
	if rb.benchBin != "" {
		var sizes []string
		for _, w := range cfg.Concurrency {
			b := rb.batchOf(w)
			size := fmt.Sprintf("%d workers: --clients %d --txn-ops %d", w, max(1, w/b), b)
			if t := rb.tried[w]; t != "" {
				size += " (the fastest of " + t + ")"
			}
			sizes = append(sizes, size)
		}
		how := "in transactions of --batch puts"
		if cfg.Batch == 0 {
			how = "in transactions of the width etcd commits fastest (clients × puts, each tried once before the rounds)"
		}
		rep.Note("txn-put ceiling: %s txn-put (%s): plain puts (no compare, no lease), as many keys in flight as Beacon's workers, %s",
			rb.benchBin, strings.Join(sizes, "; "), how)
	} else if !cfg.NoCeiling {
		rep.Note("no ceiling against --endpoints: etcd's benchmark tool writes keys it cannot remove")
	}
	rep.Note("client CPU: this process's CPU time while a side registers, per registration (it runs that side's client and workers alone; etcd is a process of its own); the same-op ceiling builds each transaction's compares and puts inside the clock, the keys and values before it (so that its rate is etcd's); " +
		"\"from an instance\" adds to the ceiling's client the CPU it spent building each key and value from the same instances Beacon's side is given (encoding/json, as the raw grant+put client does), as a client registering instances must")
	rep.Note("each raw registration is 2 round trips (grant, put) and a lease of its own; each Beacon registration is part of a transaction shared with concurrent ones, under the session's one lease")
}

// rawRegistrar is the raw baseline: a lease and a put per instance. Its
// leases are long enough for any run (10 minutes), and revoked after each
// round and at the end, also after an error or interrupt.
type rawRegistrar struct {
	cli    *clientv3.Client
	mu     sync.Mutex
	leases []clientv3.LeaseID
}

const rawLeaseTTL = 600 // seconds

func (r *rawRegistrar) op(insts []beacon.Instance) func(ctx context.Context, i int) error {
	return func(ctx context.Context, i int) error {
		in := insts[i]
		l, err := r.cli.Grant(ctx, rawLeaseTTL)
		if err != nil {
			return fmt.Errorf("raw grant: %w", err)
		}
		r.track(l.ID)
		if _, err := r.cli.Put(ctx, rawKey(in), rawValue(in), clientv3.WithLease(l.ID)); err != nil {
			return fmt.Errorf("raw put: %w", err)
		}
		return nil
	}
}

// track adds a lease for revokeAll to revoke.
func (r *rawRegistrar) track(id clientv3.LeaseID) {
	r.mu.Lock()
	r.leases = append(r.leases, id)
	r.mu.Unlock()
}

// revokeAll revokes every lease granted so far: untimed (20,000 revokes
// with fsync take longer than any fixed bound on a slow or busy machine),
// and after an interrupt for at most 30 s more; a lease already gone is
// not an error.
func (r *rawRegistrar) revokeAll(ctx context.Context) error {
	r.mu.Lock()
	ls := r.leases
	r.leases = nil
	r.mu.Unlock()
	ctx, cancel := cleanupContext(ctx, 30*time.Second)
	defer cancel()
	_, _, err := run(ctx, len(ls), 32, func(ctx context.Context, i int) error {
		_, err := r.cli.Revoke(ctx, ls[i])
		if errors.Is(err, rpctypes.ErrLeaseNotFound) {
			return nil
		}
		return err
	})
	if err != nil {
		return fmt.Errorf("revoke the raw leases: %w", err)
	}
	return nil
}

// compact compacts etcd's history up to its current revision and waits
// until the compaction is applied.
func (r *rawRegistrar) compact(ctx context.Context) error {
	ctx, cancel := context.WithTimeout(ctx, time.Minute)
	defer cancel()
	resp, err := r.cli.Get(ctx, "/bench-compact", clientv3.WithCountOnly())
	if err != nil {
		return err
	}
	_, err = r.cli.Compact(ctx, resp.Header.Revision, clientv3.WithCompactPhysical())
	if errors.Is(err, rpctypes.ErrCompacted) {
		return nil // nothing written since the last compaction
	}
	return err
}

// ceilingResult is one run of etcd's benchmark txn-put.
type ceilingResult struct {
	keysPerSec float64
	p50ms      float64
	p99ms      float64
}

// runTxnPut runs etcd's benchmark tool: n keys in transactions of batch
// puts from workers/batch clients, and returns keys per second and the
// transactions' latency.
func runTxnPut(ctx context.Context, bin string, eps []string, n, workers, batch, keySize, valSize int) (ceilingResult, error) {
	clients := max(1, workers/batch)
	txns := max(1, n/batch)
	var hosts []string
	for _, ep := range eps {
		hosts = append(hosts, strings.TrimPrefix(strings.TrimPrefix(ep, "http://"), "https://"))
	}
	args := []string{"--endpoints", strings.Join(hosts, ","), "--clients", strconv.Itoa(clients), "--conns", strconv.Itoa(clients),
		"txn-put", "--txn-ops", strconv.Itoa(batch), "--total", strconv.Itoa(txns),
		"--key-size", strconv.Itoa(keySize), "--val-size", strconv.Itoa(valSize), "--key-space-size", strconv.Itoa(max(n, batch))}
	cmd := exec.CommandContext(ctx, bin, args...)
	cmd.SysProcAttr = childAttr()
	out, err := cmd.CombinedOutput()
	if err != nil {
		if ctx.Err() != nil {
			return ceilingResult{}, ctx.Err()
		}
		return ceilingResult{}, fmt.Errorf("bench: %s %s: %w: %s", bin, strings.Join(args, " "), err, lastLines(string(out), 5))
	}
	res, err := parseBenchmarkOutput(string(out))
	if err != nil {
		return ceilingResult{}, fmt.Errorf("bench: %s %s: %w", bin, strings.Join(args, " "), err)
	}
	res.keysPerSec *= float64(batch)
	return res, nil
}

// parseBenchmarkOutput reads the summary etcd's benchmark tool prints:
// requests per second and the latency distribution. A run with errors
// (an "Error distribution" section) is refused.
func parseBenchmarkOutput(out string) (ceilingResult, error) {
	var res ceilingResult
	if i := strings.Index(out, "Error distribution"); i >= 0 {
		return res, fmt.Errorf("requests failed: %s", lastLines(out[i:], 5))
	}
	found := false
	for _, line := range strings.Split(out, "\n") {
		f := strings.Fields(line)
		switch {
		case len(f) == 2 && f[0] == "Requests/sec:":
			v, err := strconv.ParseFloat(f[1], 64)
			if err != nil {
				return res, fmt.Errorf("summary line %q: %w", line, err)
			}
			res.keysPerSec, found = v, true
		case len(f) == 4 && f[1] == "in" && f[3] == "secs.":
			v, err := strconv.ParseFloat(f[2], 64)
			if err != nil {
				continue
			}
			switch f[0] {
			case "50%":
				res.p50ms = v * 1000
			case "99%":
				res.p99ms = v * 1000
			}
		}
	}
	if !found {
		return res, fmt.Errorf("no Requests/sec in its output: %s", lastLines(out, 5))
	}
	return res, nil
}

func lastLines(s string, n int) string {
	lines := strings.Split(strings.TrimSpace(s), "\n")
	if len(lines) > n {
		lines = lines[len(lines)-n:]
	}
	return strings.Join(lines, " / ")
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
