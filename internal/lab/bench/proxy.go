package bench

import (
	"cmp"
	"context"
	"errors"
	"fmt"
	"log/slog"
	"os"
	"runtime"
	"slices"
	"strconv"
	"strings"
	"sync"
	"sync/atomic"
	"time"

	"github.com/beaconplane/beacon/internal/lab/freeport"
	clientv3 "go.etcd.io/etcd/client/v3"
	"go.uber.org/zap"
)

// ProxyConfig configures the proxy scenario. Zero values take the
// defaults in brackets.
type ProxyConfig struct {
	// Endpoints of an etcd cluster to use; empty starts a cluster of
	// Members members [3] on loopback in this process (the server package,
	// as `beacon serve` runs it).
	Endpoints []string
	Members   int
	// Fsync makes the members sync their WAL like production etcd does.
	Fsync bool
	// Duration of each load phase, per side and round [2s].
	Duration time.Duration
	// Rounds: every measurement is made Rounds times [3], the sides in a
	// different order each round; the median is shown with the spread.
	Rounds int
	// Clients is the number of concurrent workers [16], spread over Conns
	// client connections [4].
	Clients, Conns int
	// Watches identical watches on one key [1000], spread over Streams
	// client connections [10] (one watch stream each), as etcd's
	// `benchmark watch` does.
	Watches, Streams int
	// Proxies: each proxy side is a tier of this many proxy processes [1],
	// each with its own upstream etcd watch, the streams spread evenly over
	// them (Streams must be a multiple); CPU and memory are the tier's sum.
	Proxies int
	// BurstPuts are written as fast as 4 writers can, straight to etcd,
	// for the fan-out measurement [400].
	BurstPuts int
	// LatencyPuts are written at LatencyRate per second for the delivery
	// latency measurement [100 at 50/s].
	LatencyPuts, LatencyRate int
	// ValueSize of the values put [256].
	ValueSize int
	// BeaconCommand runs Beacon's proxy in its own process: the beacon
	// binary and "proxy"; --endpoints, --listen-addr and --log-level are
	// appended. Required.
	BeaconCommand []string
	// ProxyPprof runs Beacon's proxies with --pprof (profiles under
	// /debug/pprof/ on the address each is logged as started on).
	ProxyPprof bool
	// EtcdBin is an etcd 3.7 binary for etcd's grpc-proxy (`etcd
	// grpc-proxy start`); found in PeersDir()/bin or PATH when empty.
	// NoGRPCProxy leaves that side out.
	EtcdBin     string
	NoGRPCProxy bool
	// Logger for progress; nil discards.
	Logger *slog.Logger
}

func (c *ProxyConfig) defaults() {
	setDefault(&c.Members, 3)
	setDefault(&c.Duration, 2*time.Second)
	setDefault(&c.Rounds, 3)
	setDefault(&c.Clients, 16)
	setDefault(&c.Conns, 4)
	setDefault(&c.Watches, 1000)
	setDefault(&c.Streams, 10)
	setDefault(&c.Proxies, 1)
	setDefault(&c.BurstPuts, 400)
	setDefault(&c.LatencyPuts, 100)
	setDefault(&c.LatencyRate, 50)
	setDefault(&c.ValueSize, 256)
	setDefault(&c.Logger, discardLogger())
}

// Validate checks the sizes (zero means the default).
func (c ProxyConfig) Validate() error {
	for _, v := range []struct {
		name       string
		val, limit int
	}{
		{"members", c.Members, 9}, {"rounds", c.Rounds, maxRounds}, {"clients", c.Clients, maxConcurrency},
		{"conns", c.Conns, 1000}, {"watches", c.Watches, maxWatchers}, {"streams", c.Streams, 10_000}, {"proxies", c.Proxies, maxProxies},
		{"burst-puts", c.BurstPuts, maxInstances}, {"latency-puts", c.LatencyPuts, maxInstances},
		{"latency-rate", c.LatencyRate, 100_000}, {"value-size", c.ValueSize, 1 << 20},
	} {
		if v.val < 0 {
			return fmt.Errorf("bench: --%s %d: must be positive", v.name, v.val)
		}
		if v.val > v.limit {
			return fmt.Errorf("bench: --%s %d: at most %d", v.name, v.val, v.limit)
		}
	}
	if c.Duration < 0 || c.Duration > time.Hour {
		return fmt.Errorf("bench: --duration %v: must be between 0 (default) and 1h", c.Duration)
	}
	if c.Streams > 0 && c.Watches > 0 && c.Streams > c.Watches {
		return fmt.Errorf("bench: --streams %d: at most --watches (%d)", c.Streams, c.Watches)
	}
	if p, st := cmp.Or(c.Proxies, 1), cmp.Or(c.Streams, 10); st%p != 0 {
		return fmt.Errorf("bench: --streams %d over --proxies %d: the streams must be a multiple of the proxies, to spread the watches evenly", st, p)
	}
	if len(c.BeaconCommand) == 0 {
		return errors.New("bench: no command to run beacon proxy")
	}
	return nil
}

// maxProxies bounds --proxies.
const maxProxies = 64

// The proxy scenario's memory plan (see memplan.go), measured at 100,000
// watchers through one proxy (2026-12-02): Beacon's proxy 273 MiB and
// etcd's grpc-proxy 281 MiB resident after the burst, both held while the
// other side runs, about 600 B per watch in etcd (direct), and the
// benchmark's raw watchers well under 1 kB each; a proxy process's own
// baseline is about 45 MiB. Each latency sample costs 9 B per watcher
// (the delay and a received mark).
const (
	costProxyWatcher = 8 << 10
	costProxySample  = 9
	costProxyProcess = 64 << 20
)

// side is one way to reach etcd: straight, or through a tier of proxy
// processes.
type side struct {
	name  string
	eps   []string // etcd's, or one per proxy
	procs []*proc  // none for direct
	clis  []*clientv3.Client
}

// proxied says whether the side goes through proxies.
func (s *side) proxied() bool { return len(s.procs) > 0 }

// cpu is the CPU time the side's proxy processes have used (0 for direct).
func (s *side) cpu() time.Duration {
	var sum time.Duration
	for _, p := range s.procs {
		sum += p.cpu()
	}
	return sum
}

// rss is the side's proxy processes' resident memory, in bytes.
func (s *side) rss() float64 {
	var sum float64
	for _, p := range s.procs {
		sum += p.rss()
	}
	return sum
}

// Names of the sides in the report (and sideBeacon, naming.go's "beacon").
const (
	sideDirect = "direct"
	sideGP     = "etcd grpc-proxy"
)

// RunProxy measures, in one run, etcd traffic straight to etcd, through
// Beacon's proxy and through etcd's own grpc-proxy, each proxy in its own
// process, the sides in turn: range (linearizable and serializable) and
// put throughput and latency with the proxies' CPU per request, then
// identical watches: events per second under a burst, CPU per event,
// events lost, memory, and delivery latency at a steady rate.
func RunProxy(ctx context.Context, cfg ProxyConfig) (*Report, error) {
	cfg.defaults()
	if err := cfg.Validate(); err != nil {
		return nil, err
	}
	if err := fits(memNeed{"--watches", cfg.Watches, costProxyWatcher + int64(cfg.LatencyPuts)*costProxySample, "watchers, with their latency samples"},
		memNeed{"--proxies", 2 * cfg.Proxies, costProxyProcess, "proxy processes"}); err != nil {
		return nil, err
	}
	etcdBin := ""
	if !cfg.NoGRPCProxy {
		var err error
		if etcdBin, err = EtcdPeer.Find(cfg.EtcdBin); err != nil {
			return nil, fmt.Errorf("%w (or leave etcd's grpc-proxy out with --no-grpc-proxy)", err)
		}
	}
	fsync := "no fsync"
	if cfg.Fsync {
		fsync = "fsync"
	}
	eps, setup, stopEtcd, err := givenOrLocalEtcd(ctx, cfg.Endpoints, cfg.Members, cfg.Fsync, "external etcd ",
		fmt.Sprintf("etcd 3.7, %d member(s) on loopback in the benchmark's process, %s", cfg.Members, fsync))
	if err != nil {
		return nil, err
	}
	defer stopEtcd()
	direct, err := clients(eps, 1)
	if err != nil {
		return nil, err
	}
	defer closeAll(direct)
	// Whatever happens, the keys the scenario wrote go.
	defer func() {
		cctx, cancel := context.WithTimeout(context.WithoutCancel(ctx), 10*time.Second)
		defer cancel()
		_, _ = direct[0].Delete(cctx, "bench/", clientv3.WithPrefix())
	}()
	sides, stopSides, err := startSides(ctx, cfg, etcdBin, eps)
	defer stopSides()
	if err != nil {
		return nil, err
	}
	r := &Report{
		Scenario: "proxy",
		Setup: fmt.Sprintf("%s; %d process(es) per proxy side, each its own; %d workers over %d connections, %v per phase, %d-byte values; %d watches over %d raw watch streams (spread evenly over a side's proxies); %d rounds, sides in turn; GOMAXPROCS=%d",
			setup, cfg.Proxies, cfg.Clients, cfg.Conns, cfg.Duration, cfg.ValueSize, cfg.Watches, cfg.Streams, cfg.Rounds, runtime.GOMAXPROCS(0)),
	}
	if b, err := os.ReadFile("/proc/loadavg"); err == nil {
		r.Setup += "; load average at start " + strings.Join(strings.Fields(string(b))[:3], " ")
	}
	if err := measureOps(ctx, cfg, sides, direct[0], r); err != nil {
		return nil, err
	}
	if err := measureWatches(ctx, cfg, sides, direct[0], r); err != nil {
		return nil, err
	}
	r.Note("ratio: Beacon's proxy over the baseline named in 'vs', each measured in the same round (median of the per-round ratios' spread in brackets); CPU: the proxy processes' threads' run time (/proc/<pid>/task/*/schedstat), summed over a tier")
	return r, nil
}

// startSides starts the proxies in front of eps and connects cfg.Conns
// clients to each side: direct, Beacon's proxy and, with etcdBin, etcd's
// grpc-proxy. stop (also after an error) stops what was started.
func startSides(ctx context.Context, cfg ProxyConfig, etcdBin string, eps []string) (sides []*side, stop func(), err error) {
	var stops []func()
	stop = func() {
		for i := len(stops) - 1; i >= 0; i-- {
			stops[i]()
		}
	}
	sides = []*side{{name: sideDirect, eps: eps}}
	tier := func(name string, start func() (*proc, error)) error {
		s := &side{name: name}
		for range cfg.Proxies {
			p, err := start()
			if err != nil {
				return err
			}
			stops = append(stops, p.stop)
			s.procs = append(s.procs, p)
			s.eps = append(s.eps, "http://"+p.addr)
		}
		sides = append(sides, s)
		return nil
	}
	command := cfg.BeaconCommand
	if cfg.ProxyPprof {
		command = append(slices.Clip(command), "--pprof")
	}
	if err := tier(sideBeacon, func() (*proc, error) { return startBeaconProxy(ctx, cfg.Logger, command, eps) }); err != nil {
		return nil, stop, err
	}
	if etcdBin != "" {
		if err := tier(sideGP, func() (*proc, error) { return startGRPCProxy(ctx, cfg.Logger, etcdBin, eps) }); err != nil {
			return nil, stop, err
		}
	}
	for _, s := range sides {
		if s.clis, err = clients(s.eps, cfg.Conns); err != nil {
			return nil, stop, err
		}
		stops = append(stops, func() { closeAll(s.clis) })
	}
	return sides, stop, nil
}

// measureOps measures ranges and puts on every side, the sides in turn
// for cfg.Rounds rounds, and adds the rows.
func measureOps(ctx context.Context, cfg ProxyConfig, sides []*side, direct *clientv3.Client, r *Report) error {
	value := strings.Repeat("v", cfg.ValueSize)
	for i := range 1000 {
		if _, err := direct.Put(ctx, fmt.Sprintf("bench/k%d", i), value); err != nil {
			return err
		}
	}
	ops := []struct {
		name, metric string
		op           func(ctx context.Context, c *clientv3.Client, i int) error
		goalGP       float64
	}{
		{"range-l", "range (linearizable)", func(ctx context.Context, c *clientv3.Client, i int) error {
			_, err := c.Get(ctx, fmt.Sprintf("bench/k%d", i%1000))
			return err
		}, 0},
		{"range-s", "range (serializable)", func(ctx context.Context, c *clientv3.Client, i int) error {
			_, err := c.Get(ctx, fmt.Sprintf("bench/k%d", i%1000), clientv3.WithSerializable())
			return err
		}, 1},
		{"put", "put", func(ctx context.Context, c *clientv3.Client, i int) error {
			_, err := c.Put(ctx, fmt.Sprintf("bench/k%d", i%1000), value)
			return err
		}, 0},
	}
	for _, op := range ops {
		m := newSamples()
		for round := range cfg.Rounds {
			for _, s := range rotate(sides, round) {
				cfg.Logger.Info("proxy: load", "op", op.name, "side", s.name, "round", round)
				cpu0 := s.cpu()
				res, err := load(ctx, s.clis, cfg.Duration, cfg.Clients, op.op)
				if err != nil {
					return fmt.Errorf("%s through %s: %w", op.name, s.name, err)
				}
				m.add(s.name, "rate", res.rate())
				m.add(s.name, "p50", Ms(Percentile(res.lat, 50)))
				m.add(s.name, "p99", Ms(Percentile(res.lat, 99)))
				if s.proxied() {
					m.add(s.name, "cpu", float64(s.cpu()-cpu0)/float64(time.Microsecond)/float64(res.ops))
				}
				if res.errors > 0 {
					r.Note("%s through %s, round %d: %d errors", op.name, s.name, round, res.errors)
				}
			}
		}
		m.rows(r, op.metric+" throughput", "ops/s", "rate", true, 0, op.goalGP)
		m.rows(r, op.metric+" p50", "ms", "p50", false, 0, 0)
		m.rows(r, op.metric+" p99", "ms", "p99", false, 0, 0)
		m.gpRow(r, "proxy CPU per "+op.metric, "µs", "cpu", 0)
	}
	return nil
}

// measureWatches measures identical watches on every side, the sides in
// turn for cfg.Rounds rounds, and adds the rows.
func measureWatches(ctx context.Context, cfg ProxyConfig, sides []*side, direct *clientv3.Client, r *Report) error {
	wm := newSamples()
	for round := range cfg.Rounds {
		for _, s := range rotate(sides, round) {
			cfg.Logger.Info("proxy: watches", "side", s.name, "round", round, "watches", cfg.Watches)
			if err := watchRoundProxy(ctx, cfg, s, direct, round, wm, r); err != nil {
				return fmt.Errorf("watches through %s: %w", s.name, err)
			}
		}
	}
	tier, proxy := "", "proxy"
	if cfg.Proxies > 1 {
		tier, proxy = fmt.Sprintf(", tiers of %d proxies", cfg.Proxies), "tier's"
	}
	burst := fmt.Sprintf("%d watchers, burst of %d puts%s", cfg.Watches, cfg.BurstPuts, tier)
	wm.rows(r, fmt.Sprintf("time to open %d watches over %d streams at once%s", cfg.Watches, cfg.Streams, tier), "s", "open", false, 0, 0)
	wm.rows(r, "watch fan-out events/s, "+burst, "events/s", "events", true, 0, 1)
	wm.gpRow(r, proxy+" CPU per event delivered, "+burst, "µs", "cpu", 1)
	wm.rows(r, "events lost, "+burst, "events", "lost", false, 0, 0)
	wm.gpRow(r, fmt.Sprintf("%s RSS with %d watchers open, idle", proxy, cfg.Watches), "MiB", "idle", 0)
	wm.gpRow(r, proxy+" RSS 2 s after the burst", "MiB", "after", 0)
	lat := fmt.Sprintf("%d watchers, %d puts/s%s", cfg.Watches, cfg.LatencyRate, tier)
	wm.rows(r, "watch delivery p50, "+lat, "ms", "lat50", false, 0, 0)
	wm.rows(r, "watch delivery p99, "+lat, "ms", "lat99", false, 0, 1)
	wm.gpRow(r, proxy+" CPU per event delivered, "+lat, "µs", "cpuSteady", 1)
	if up := wm.get(sideBeacon, "upstream"); len(up) > 0 {
		r.Note("Beacon's %s held %v etcd watch(es) for the %d identical client watches", strings.TrimSuffix(proxy, "'s"), up[0], cfg.Watches)
	}
	return nil
}

func rotate(s []*side, n int) []*side {
	n %= len(s)
	return append(append([]*side{}, s[n:]...), s[:n]...)
}

// samples collects one figure per side and round.
type samples struct {
	v map[string]map[string][]float64
}

func newSamples() *samples { return &samples{v: map[string]map[string][]float64{}} }

func (m *samples) add(side, what string, v float64) {
	if m.v[side] == nil {
		m.v[side] = map[string][]float64{}
	}
	m.v[side][what] = append(m.v[side][what], v)
}

func (m *samples) get(side, what string) []float64 { return m.v[side][what] }

// rows adds Beacon's figure against direct and against etcd's
// grpc-proxy, with the goals given (0: none).
func (m *samples) rows(r *Report, metric, unit, what string, higher bool, goalDirect, goalGP float64) {
	b := m.get(sideBeacon, what)
	if len(b) == 0 {
		return
	}
	r.Add(Spread(Row{Metric: metric, Unit: unit, HigherIsBetter: higher, Goal: goalDirect, Against: sideDirect}, b, m.get(sideDirect, what)))
	if gp := m.get(sideGP, what); len(gp) > 0 {
		r.Add(Spread(Row{Metric: metric, Unit: unit, HigherIsBetter: higher, Goal: goalGP, Against: sideGP}, b, gp))
	}
}

// gpRow adds Beacon's figure against etcd's grpc-proxy only (the proxies'
// own costs).
func (m *samples) gpRow(r *Report, metric, unit, what string, goal float64) {
	b := m.get(sideBeacon, what)
	if len(b) == 0 {
		return
	}
	r.Add(Spread(Row{Metric: metric, Unit: unit, Goal: goal, Against: sideGP}, b, m.get(sideGP, what)))
}

// startBeaconProxy runs `beacon proxy` in front of eps.
func startBeaconProxy(ctx context.Context, log *slog.Logger, command []string, eps []string) (*proc, error) {
	port, err := freeport.Port()
	if err != nil {
		return nil, err
	}
	addr := "127.0.0.1:" + strconv.Itoa(port)
	argv := append(append([]string{}, command...), "--endpoints", strings.Join(eps, ","), "--listen-addr", addr, "--log-level", "warn")
	return startProc(ctx, log, sideBeacon, addr, argv, "")
}

// startGRPCProxy runs `etcd grpc-proxy start` in front of eps.
func startGRPCProxy(ctx context.Context, log *slog.Logger, etcdBin string, eps []string) (*proc, error) {
	port, err := freeport.Port()
	if err != nil {
		return nil, err
	}
	dir, err := os.MkdirTemp("", "beacon-bench-grpc-proxy-")
	if err != nil {
		return nil, err
	}
	addr := "127.0.0.1:" + strconv.Itoa(port)
	var hosts []string
	for _, ep := range eps {
		hosts = append(hosts, strings.TrimPrefix(strings.TrimPrefix(ep, "http://"), "https://"))
	}
	argv := []string{etcdBin, "grpc-proxy", "start", "--endpoints", strings.Join(hosts, ","), "--listen-addr", addr,
		"--advertise-client-url", addr, "--data-dir", dir}
	p, err := startProc(ctx, log, sideGP, addr, argv, dir)
	if err != nil {
		_ = os.RemoveAll(dir)
	}
	return p, err
}

// watchRoundProxy opens cfg.Watches watchers through s, then measures a
// burst (events/s, CPU per event, events lost, memory) and a steady rate
// (delivery latency), and closes them.
func watchRoundProxy(ctx context.Context, cfg ProxyConfig, s *side, writer *clientv3.Client, round int, m *samples, r *Report) error {
	ctx, cancel := context.WithCancel(ctx)
	defer cancel()
	w := &proxyWatchRound{cfg: cfg, s: s, writer: writer, round: round, m: m, r: r,
		key: fmt.Sprintf("bench/watch/%s/%d/%d", strings.ReplaceAll(s.name, " ", "-"), round, time.Now().UnixNano()),
		lat: newLatencies(cfg.LatencyPuts, cfg.Watches)}
	var wg sync.WaitGroup
	start := time.Now()
	closeConns, err := openRawWatchers(ctx, w, &wg, s.eps)
	defer closeConns()
	defer wg.Wait()
	defer cancel()
	if err != nil {
		return err
	}
	m.add(s.name, "open", time.Since(start).Seconds())
	if s.name == sideBeacon {
		if up, err := proxyUpstreamWatches(ctx, s.procs); err == nil {
			m.add(s.name, "upstream", up)
		}
	}
	if s.proxied() {
		m.add(s.name, "idle", s.rss()/(1<<20))
	}
	if err := w.burst(ctx); err != nil {
		return err
	}
	return w.steady(ctx)
}

// proxyWatchRound is one side's round of the proxy scenario's watches:
// cfg.Watches identical watches of key, and what they received.
type proxyWatchRound struct {
	cfg    ProxyConfig
	s      *side
	writer *clientv3.Client
	key    string
	round  int
	m      *samples
	r      *Report

	got, ended, lastNanos atomic.Int64 // burst events received, watches ended, time of the last event
	lat                   *latencies   // the steady rate's samples
}

// burst writes cfg.BurstPuts puts from 4 writers, as fast as they can:
// every watcher must get every event.
func (w *proxyWatchRound) burst(ctx context.Context) error {
	s, n, m := w.s, w.cfg.Watches, w.m
	want := int64(n) * int64(w.cfg.BurstPuts)
	cpu0 := s.cpu()
	start := time.Now()
	var next atomic.Int64
	var pw sync.WaitGroup
	var putErr atomic.Pointer[error]
	for range 4 {
		pw.Go(func() {
			for next.Add(1) <= int64(w.cfg.BurstPuts) {
				if _, err := w.writer.Put(ctx, w.key, "b"); err != nil {
					putErr.Store(&err)
					return
				}
			}
		})
	}
	pw.Wait()
	if err := putErr.Load(); err != nil {
		return *err
	}
	// Until every event is in, every watcher ended, or nothing arrived for
	// 5 s (a proxy that dropped events: they are counted as lost).
	seen, progress := w.got.Load(), time.Now()
	for w.got.Load() < want && w.ended.Load() < int64(n) && time.Since(progress) < 5*time.Second && ctx.Err() == nil {
		time.Sleep(5 * time.Millisecond) // the watchers' goroutines count; nothing to wait on
		if g := w.got.Load(); g != seen {
			seen, progress = g, time.Now()
		}
	}
	if err := ctx.Err(); err != nil {
		return err
	}
	received := w.got.Load()
	elapsed := time.Duration(w.lastNanos.Load() - start.UnixNano())
	if elapsed <= 0 {
		elapsed = time.Since(start)
	}
	m.add(s.name, "events", float64(received)/elapsed.Seconds())
	m.add(s.name, "lost", float64(want-received))
	if s.proxied() {
		m.add(s.name, "cpu", float64(s.cpu()-cpu0)/float64(time.Microsecond)/float64(max(received, 1)))
	}
	if received < want {
		w.r.Note("%s, round %d: %d of %d events delivered (%d of %d watchers ended)", s.name, w.round, received, want, w.ended.Load(), n)
	}
	if s.proxied() {
		select {
		case <-time.After(2 * time.Second):
		case <-ctx.Done():
			return ctx.Err()
		}
		m.add(s.name, "after", s.rss()/(1<<20))
	}
	return nil
}

// steady writes cfg.LatencyPuts puts at cfg.LatencyRate per second and
// measures the time from each put until each watcher still open has it.
func (w *proxyWatchRound) steady(ctx context.Context) error {
	s, lat := w.s, w.lat
	live := w.cfg.Watches - int(w.ended.Load())
	if live == 0 {
		return nil // the proxy ended every watch (it dropped the burst)
	}
	lat.expect(live)
	cpu0 := s.cpu()
	tick := time.NewTicker(time.Second / time.Duration(w.cfg.LatencyRate))
	defer tick.Stop()
	for k := range w.cfg.LatencyPuts {
		select {
		case <-tick.C:
		case <-ctx.Done():
			return ctx.Err()
		}
		lat.t0[k].Store(time.Now().UnixNano())
		if _, err := w.writer.Put(ctx, w.key, "l"+strconv.Itoa(k)); err != nil {
			return err
		}
	}
	for k := range w.cfg.LatencyPuts {
		late, err := lat.wait(ctx, k)
		if err != nil {
			return err
		}
		if late {
			w.r.Note("%s, round %d: latency sample %d not received by every watcher within 30 s", s.name, w.round, k)
			return nil
		}
	}
	if w.cfg.Logger.Enabled(ctx, slog.LevelDebug) { // each sample's spread: a growing queue, or one slow delivery
		for k, d := range lat.lat {
			w.cfg.Logger.Debug("proxy: latency sample", "side", s.name, "k", k, "p50", Percentile(d, 50), "p99", Percentile(d, 99), "max", slices.Max(d))
		}
	}
	if s.proxied() { // each event a message of its own: the senders keep up
		w.m.add(s.name, "cpuSteady", float64(s.cpu()-cpu0)/float64(time.Microsecond)/float64(w.cfg.LatencyPuts*live))
	}
	all := lat.all()
	w.m.add(s.name, "lat50", Ms(Percentile(all, 50)))
	w.m.add(s.name, "lat99", Ms(Percentile(all, 99)))
	return nil
}

// proxyUpstreamWatches sums beacon_proxy_upstream_watches over Beacon
// proxies' /metrics.
func proxyUpstreamWatches(ctx context.Context, procs []*proc) (float64, error) {
	var sum float64
	for _, p := range procs {
		v, err := scrape(ctx, "http://"+p.addr, "beacon_proxy_upstream_watches")
		if err != nil {
			return 0, err
		}
		sum += v
	}
	return sum, nil
}

type loadResult struct {
	ops     int
	elapsed time.Duration
	lat     []time.Duration
	errors  int
}

func (a loadResult) rate() float64 {
	if a.elapsed <= 0 {
		return 0
	}
	return float64(a.ops) / a.elapsed.Seconds()
}

// load runs op from workers goroutines over clis for d.
func load(ctx context.Context, clis []*clientv3.Client, d time.Duration, workers int, op func(context.Context, *clientv3.Client, int) error) (loadResult, error) {
	// Warm up every connection.
	for _, c := range clis {
		if err := op(ctx, c, 0); err != nil {
			return loadResult{}, err
		}
	}
	var mu sync.Mutex
	var res loadResult
	deadline := time.Now().Add(d)
	start := time.Now()
	var wg sync.WaitGroup
	for w := range workers {
		wg.Go(func() {
			c := clis[w%len(clis)]
			var lat []time.Duration
			n := 0
			for i := w; time.Now().Before(deadline) && ctx.Err() == nil; i += workers {
				t0 := time.Now()
				if err := op(ctx, c, i); err != nil {
					n++
					continue
				}
				lat = append(lat, time.Since(t0))
			}
			mu.Lock()
			res.lat = append(res.lat, lat...)
			res.errors += n
			mu.Unlock()
		})
	}
	wg.Wait()
	res.elapsed = time.Since(start)
	res.ops = len(res.lat)
	if ctx.Err() != nil {
		return loadResult{}, ctx.Err()
	}
	if res.ops == 0 {
		return loadResult{}, errors.New("no operation succeeded")
	}
	return res, nil
}

func clients(eps []string, n int) ([]*clientv3.Client, error) {
	var out []*clientv3.Client
	for range n {
		c, err := clientv3.New(clientv3.Config{Endpoints: eps, DialTimeout: 5 * time.Second, Logger: zap.NewNop()})
		if err != nil {
			closeAll(out)
			return nil, err
		}
		out = append(out, c)
	}
	return out, nil
}

func closeAll(clis []*clientv3.Client) {
	for _, c := range clis {
		_ = c.Close()
	}
}
