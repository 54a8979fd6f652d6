package bench

import (
	"context"
	"fmt"
	"log/slog"
	"slices"
	"strconv"
	"sync/atomic"
	"time"

	"github.com/beaconplane/beacon"
	clientv3 "go.etcd.io/etcd/client/v3"
)

// watchMetric is the etcd server's count of open watchers.
const watchMetric = "etcd_debugging_mvcc_watcher_total"

// latencies collects, for each sample, the delay until each of n
// receivers had it.
type latencies struct {
	n       int
	t0      []atomic.Int64 // write start, unix nanoseconds
	lat     [][]time.Duration
	recv    [][]bool // which receivers had each sample
	pending []atomic.Int64
	done    []chan struct{}
}

func newLatencies(samples, receivers int) *latencies {
	l := &latencies{n: receivers, t0: make([]atomic.Int64, samples), lat: make([][]time.Duration, samples), recv: make([][]bool, samples),
		pending: make([]atomic.Int64, samples), done: make([]chan struct{}, samples)}
	for i := range samples {
		l.lat[i] = make([]time.Duration, receivers)
		l.recv[i] = make([]bool, receivers)
		l.pending[i].Store(int64(receivers))
		l.done[i] = make(chan struct{})
	}
	return l
}

// expect sets how many receivers each sample waits for (fewer than at
// creation when some have gone); before any sample is sent.
func (l *latencies) expect(receivers int) {
	for i := range l.pending {
		l.pending[i].Store(int64(receivers))
	}
}

// got records that receiver r has sample s.
func (l *latencies) got(s, r int) {
	if s < 0 || s >= len(l.t0) {
		return
	}
	l.lat[s][r] = time.Duration(time.Now().UnixNano() - l.t0[s].Load())
	l.recv[s][r] = true
	if l.pending[s].Add(-1) == 0 {
		close(l.done[s])
	}
}

// all returns every receiver's delay for every sample it had.
func (l *latencies) all() []time.Duration {
	var out []time.Duration
	for i, s := range l.lat {
		for r, d := range s {
			if l.recv[i][r] {
				out = append(out, d)
			}
		}
	}
	return out
}

// wait waits until every receiver has sample s: late when that takes
// over 30 s.
func (l *latencies) wait(ctx context.Context, s int) (late bool, err error) {
	select {
	case <-l.done[s]:
		return false, nil
	case <-time.After(30 * time.Second):
		return true, nil
	case <-ctx.Done():
		return false, ctx.Err()
	}
}

// RunWatch measures the time from a registration until every watcher has
// it, for each watcher count: n Beacon watchers in one process (they share
// one etcd watch) and n raw etcd watches (one client, as a process would)
// in another. Each side runs in a child process of its own (`beacon bench
// watch-watchers`), so that neither side's figure carries the other's
// work (its garbage collection above all); this process only writes the
// samples and waits for each side to report every watcher had one.
func RunWatch(ctx context.Context, cfg RegistryConfig) (*Report, error) {
	cfg.defaults()
	if err := cfg.Validate(); err != nil {
		return nil, err
	}
	perPair := costFollowerPair + int64(cfg.Samples)*costSamplePair
	if err := fits(memNeed{"--watchers", slices.Max(cfg.Watchers), perPair, "watchers on each side, with their samples"},
		memNeed{"", 2, costWatchProcess, "watcher processes"}); err != nil {
		return nil, err
	}
	exe, err := cfg.executable()
	if err != nil {
		return nil, err
	}
	tgt, err := startTarget(ctx, cfg)
	if err != nil {
		return nil, err
	}
	defer tgt.stop()
	rep := &Report{
		Scenario: "watch",
		Setup: fmt.Sprintf("%s; per watcher count, each side's watchers in a process of their own (Beacon's sharing one etcd watch, "+
			"raw etcd's one watch each on one client); %d instances written one at a time by this process (the same raw put of the same JSON "+
			"for both sides), Beacon and raw alternating; latency from the write until every watcher has the event",
			tgt.setup, cfg.Samples),
	}
	for _, n := range cfg.Watchers {
		cfg.Logger.Info("watch: measuring", "watchers", n)
		res, err := watchRound(ctx, cfg, exe, tgt, n)
		if err != nil {
			return nil, err
		}
		res.addRows(rep, n, cfg.Samples)
	}
	rep.Note("etcd server watches: the change of %s when the watchers opened (Beacon's goal: exactly 1)", watchMetric)
	rep.Note("CPU per change: the watcher process's CPU time while the samples were written, divided by the samples; " +
		"resident memory: the watcher process's, after the samples")
	return rep, nil
}

// watchResult is what one round measured of each side.
type watchResult struct {
	beacon, raw watchSide
}

// watchSide is one side's figures in a round.
type watchSide struct {
	lat     []time.Duration // every watcher's delay for every sample
	watches float64         // etcd server watches its watchers added
	cpu     time.Duration   // its process's CPU time while the samples were written
	rss     float64         // its process's resident memory after them, bytes
}

func (res watchResult) addRows(rep *Report, n, samples int) {
	b, r := res.beacon, res.raw
	rep.Add(Row{Metric: fmt.Sprintf("register→watcher p50, %d watchers", n), Unit: "ms",
		Beacon: Ms(Percentile(b.lat, 50)), Baseline: Ms(Percentile(r.lat, 50)), Goal: 1})
	rep.Add(Row{Metric: fmt.Sprintf("register→watcher p99, %d watchers", n), Unit: "ms",
		Beacon: Ms(Percentile(b.lat, 99)), Baseline: Ms(Percentile(r.lat, 99)), Goal: 1})
	rep.Add(Row{Metric: fmt.Sprintf("etcd server watches, %d watchers", n), Unit: "watches", Beacon: b.watches, Baseline: r.watches})
	rep.Add(Row{Metric: fmt.Sprintf("CPU per change, %d watchers", n), Unit: "ms",
		Beacon: Ms(b.cpu / time.Duration(samples)), Baseline: Ms(r.cpu / time.Duration(samples))})
	rep.Add(Row{Metric: fmt.Sprintf("watcher process resident memory, %d watchers", n), Unit: "MB",
		Beacon: b.rss / 1e6, Baseline: r.rss / 1e6})
}

// watchRound measures one watcher count, n: it starts the process of n
// Beacon watchers, then that of n raw etcd watches, and writes cfg.Samples
// instances, one at a time, for each side in turn.
func watchRound(ctx context.Context, cfg RegistryConfig, exe []string, tgt *etcdTarget, n int) (watchResult, error) {
	var res watchResult
	ctx, cancel := context.WithCancel(ctx)
	defer cancel()
	ep := tgt.endpoints[0]
	ns := fmt.Sprintf("watch%d", n)

	// The gauge must be back to where it was before the next round opens
	// its watches, or the counts would mix.
	start, err := etcdMetric(ctx, ep, watchMetric)
	if err != nil {
		return res, err
	}
	defer settleWatchers(context.WithoutCancel(ctx), ep, start)

	// One writer for both sides: a raw client putting the same JSON under
	// one lease, so that only the watch paths differ. (Registration cost
	// is the register scenario's.)
	w, err := openSampleWriter(ctx, tgt.endpoints)
	if err != nil {
		return res, err
	}
	defer w.close(ctx, cfg.Logger)

	args := watchChildArgs{endpoints: tgt.endpoints, namespace: ns, watchers: n, samples: cfg.Samples, profileDir: cfg.WatchProfileDir}
	before, err := etcdMetric(ctx, ep, watchMetric)
	if err != nil {
		return res, err
	}
	bk, err := startWatchChild(ctx, cfg.Logger, exe, sideBeacon, args)
	if err != nil {
		return res, err
	}
	defer bk.stop()
	// The shared watch is opened from the snapshot's revision, right
	// after the snapshot: give the server a moment to count it.
	mid := before
	for deadline := time.Now().Add(5 * time.Second); time.Now().Before(deadline); time.Sleep(10 * time.Millisecond) {
		if mid, err = etcdMetric(ctx, ep, watchMetric); err != nil {
			return res, err
		}
		if mid > before {
			break
		}
	}
	raw, err := startWatchChild(ctx, cfg.Logger, exe, sideRaw, args)
	if err != nil {
		return res, err
	}
	defer raw.stop()
	after, err := etcdMetric(ctx, ep, watchMetric)
	if err != nil {
		return res, err
	}
	res.beacon.watches, res.raw.watches = mid-before, after-mid
	cfg.Logger.Info("watch: writing samples", "watchers", n, "samples", cfg.Samples)
	if err := res.measure(ctx, cfg.Logger, w, ns, cfg.Samples, bk, raw); err != nil {
		return res, err
	}
	return res, nil
}

// measure writes the samples, reads each watcher process's CPU time over
// that span and its memory after it, and ends both processes, which then
// report when each watcher had each sample.
func (res *watchResult) measure(ctx context.Context, log *slog.Logger, w *sampleWriter, ns string, samples int, bk, raw *watchChild) error {
	bCPU, rCPU := bk.cpu(), raw.cpu()
	t0, err := w.writeSamples(ctx, ns, samples, bk, raw)
	if err != nil {
		return err
	}
	res.beacon.cpu, res.raw.cpu = bk.cpu()-bCPU, raw.cpu()-rCPU
	res.beacon.rss, res.raw.rss = bk.rss(), raw.rss()
	for _, s := range []struct {
		c    *watchChild
		t0   []int64
		side *watchSide
	}{{bk, t0.beacon, &res.beacon}, {raw, t0.raw, &res.raw}} {
		at, err := s.c.finish(ctx)
		if err != nil {
			return err
		}
		s.side.lat = delays(at, s.t0)
		log.Info("watch: watcher process", "side", s.c.side, "stats", s.c.stats)
	}
	return nil
}

// sampleWriter writes the watch scenario's samples for both sides: a raw
// client putting the same JSON under one lease, kept alive while the
// round runs (5k watchers with many samples take minutes).
type sampleWriter struct {
	cli           *clientv3.Client
	lease         clientv3.LeaseID
	ks            beacon.Keyspace
	stopKeepAlive context.CancelFunc
}

func openSampleWriter(ctx context.Context, eps []string) (*sampleWriter, error) {
	ks, err := beacon.NewKeyspace("/bench-beacon")
	if err != nil {
		return nil, err
	}
	cli, err := rawClient(eps)
	if err != nil {
		return nil, err
	}
	lease, err := cli.Grant(ctx, 60)
	if err != nil {
		_ = cli.Close()
		return nil, err
	}
	w := &sampleWriter{cli: cli, lease: lease.ID, ks: ks}
	kctx, stop := context.WithCancel(ctx)
	w.stopKeepAlive = stop
	ka, err := cli.KeepAlive(kctx, lease.ID)
	if err != nil {
		w.close(ctx, slog.New(slog.DiscardHandler)) // the error says what went wrong
		return nil, err
	}
	go func() {
		for range ka { //nolint:revive // drains the keep-alive responses until the round ends
		}
	}()
	return w, nil
}

// close revokes the lease (the samples go with it) and closes the client;
// after an interrupt it waits at most 10 s for etcd. A revoke that fails
// is logged: the samples stay until the lease expires.
func (w *sampleWriter) close(ctx context.Context, log *slog.Logger) {
	w.stopKeepAlive()
	rctx, cancel := cleanupContext(ctx, 10*time.Second)
	defer cancel()
	if _, err := w.cli.Revoke(rctx, w.lease); err != nil {
		log.Warn("watch: could not revoke the samples' lease; they stay until it expires", "lease", int64(w.lease), "err", err)
	}
	_ = w.cli.Close()
}

// writeTimes are when each sample was written for each side: unix
// nanoseconds, read just before the put.
type writeTimes struct {
	beacon, raw []int64
}

// writeSamples writes each sample through Beacon's key layout, waits
// until every Beacon watcher has it, then writes it under the raw prefix
// and waits for every raw watch.
func (w *sampleWriter) writeSamples(ctx context.Context, ns string, samples int, bk, raw *watchChild) (writeTimes, error) {
	t0 := writeTimes{beacon: make([]int64, samples), raw: make([]int64, samples)}
	for s := range samples {
		in := benchInstance(ns, "w", s)
		for _, side := range []struct {
			key string
			t0  []int64
			c   *watchChild
		}{{w.ks.Key(in.Ref()), t0.beacon, bk}, {rawKey(in), t0.raw, raw}} {
			side.t0[s] = time.Now().UnixNano()
			if _, err := w.cli.Put(ctx, side.key, rawValue(in), clientv3.WithLease(w.lease)); err != nil {
				return t0, err
			}
			if err := side.c.wait(ctx, s); err != nil {
				return t0, err
			}
		}
	}
	return t0, nil
}

// delays are, for every sample and watcher that had it, the time from the
// write (t0, unix nanoseconds) to its arrival (at, the same clock: both
// processes read the system's wall clock, so a step of that clock during a
// run would show in the figures).
func delays(at [][]int64, t0 []int64) []time.Duration {
	var out []time.Duration
	for s, row := range at {
		for _, a := range row {
			if a != 0 && s < len(t0) {
				out = append(out, time.Duration(a-t0[s]))
			}
		}
	}
	return out
}

// sampleOf is the sample an instance ID stands for (-1: none). It runs
// once per watcher and event on both sides: fmt.Sscanf here took an eighth
// of the run's CPU at 10,000 watchers, time that delayed both sides'
// deliveries.
func sampleOf(id string) int {
	v, err := strconv.ParseUint(id, 16, 64)
	if err != nil {
		return -1
	}
	return int(v) - 1
}

// settleWatchers waits (at most 10 s) until the server's watcher gauge is back to
// want, once a round's watches are closed.
func settleWatchers(ctx context.Context, ep string, want float64) {
	deadline := time.Now().Add(10 * time.Second)
	for time.Now().Before(deadline) {
		if v, err := etcdMetric(ctx, ep, watchMetric); err != nil || v <= want {
			return
		}
		time.Sleep(20 * time.Millisecond)
	}
}
