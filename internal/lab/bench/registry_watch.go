package bench

import (
	"context"
	"fmt"
	"log/slog"
	"slices"
	"strconv"
	"sync"
	"sync/atomic"
	"time"

	"github.com/beaconplane/beacon"
	"github.com/beaconplane/beacon/registry"
	etcdstore "github.com/beaconplane/beacon/store/etcd"
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
// it, with 1, 100 and 1000 watchers in one process: Beacon's watchers share
// one etcd watch; the raw baseline opens one etcd watch per watcher (one
// client, as a process would).
func RunWatch(ctx context.Context, cfg RegistryConfig) (*Report, error) {
	cfg.defaults()
	if err := cfg.Validate(); err != nil {
		return nil, err
	}
	perPair := costFollowerPair + int64(cfg.Samples)*costSamplePair
	if err := fits(memNeed{"--watchers", slices.Max(cfg.Watchers), perPair, "watchers on each side, with their samples"}); err != nil {
		return nil, err
	}
	tgt, err := startTarget(ctx, cfg)
	if err != nil {
		return nil, err
	}
	defer tgt.stop()
	rep := &Report{
		Scenario: "watch",
		Setup: fmt.Sprintf("%s; per watcher count, %d instances written one at a time (the same raw put of the same JSON for both sides), Beacon and raw alternating; latency from the write until every watcher has the event",
			tgt.setup, cfg.Samples),
	}
	for _, n := range cfg.Watchers {
		cfg.Logger.Info("watch: measuring", "watchers", n)
		bl, rl, bUp, rUp, err := watchRound(ctx, cfg, tgt, n)
		if err != nil {
			return nil, err
		}
		rep.Add(Row{Metric: fmt.Sprintf("register→watcher p50, %d watchers", n), Unit: "ms",
			Beacon: Ms(Percentile(bl, 50)), Baseline: Ms(Percentile(rl, 50)), Goal: 1})
		rep.Add(Row{Metric: fmt.Sprintf("register→watcher p99, %d watchers", n), Unit: "ms",
			Beacon: Ms(Percentile(bl, 99)), Baseline: Ms(Percentile(rl, 99)), Goal: 1})
		rep.Add(Row{Metric: fmt.Sprintf("etcd server watches, %d watchers", n), Unit: "watches", Beacon: bUp, Baseline: rUp})
	}
	rep.Note("etcd server watches: the change of %s when the watchers opened (Beacon's goal: exactly 1)", watchMetric)
	return rep, nil
}

// watchRound measures one watcher count, n: it opens n Beacon watchers
// and n raw etcd watches and writes cfg.Samples instances, one at a time,
// for each side in turn.
func watchRound(ctx context.Context, cfg RegistryConfig, tgt *etcdTarget, n int) (beaconLat, rawLat []time.Duration, beaconUp, rawUp float64, err error) {
	ctx, cancel := context.WithCancel(ctx)
	defer cancel()
	ep := tgt.endpoints[0]
	ns := fmt.Sprintf("watch%d", n)

	// The gauge must be back to where it was before the next round opens
	// its watches, or the counts would mix.
	start, err := etcdMetric(ctx, ep, watchMetric)
	if err != nil {
		return nil, nil, 0, 0, err
	}
	defer settleWatchers(context.WithoutCancel(ctx), ep, start)

	// One writer for both sides: a raw client putting the same JSON under
	// one lease, so that only the watch paths differ. (Registration cost
	// is the register scenario's.)
	w, err := openSampleWriter(ctx, tgt.endpoints)
	if err != nil {
		return nil, nil, 0, 0, err
	}
	defer w.close(ctx, cfg.Logger)

	// Readers: one process's worth of each.
	rd, err := openWatchReaders(ctx, tgt.endpoints)
	if err != nil {
		return nil, nil, 0, 0, err
	}
	bLat, rLat := newLatencies(cfg.Samples, n), newLatencies(cfg.Samples, n)
	var wg sync.WaitGroup
	defer func() {
		// Close the clients before waiting for the readers: a cancelled
		// context alone left 52,000 of 100,000 raw watch channels open
		// for over ten minutes (clientv3 ends a stream's watches one at a
		// time); closing the client ends them all.
		cancel()
		rd.close()
		wg.Wait()
	}()

	before, err := etcdMetric(ctx, ep, watchMetric)
	if err != nil {
		return nil, nil, 0, 0, err
	}
	if err := rd.watchBeacon(ctx, &wg, beacon.Query{Namespace: ns, Component: "w"}, n, bLat); err != nil {
		return nil, nil, 0, 0, err
	}
	// The shared watch is opened from the snapshot's revision, right
	// after the snapshot: give the server a moment to count it.
	mid := before
	for deadline := time.Now().Add(5 * time.Second); time.Now().Before(deadline); time.Sleep(10 * time.Millisecond) {
		if mid, err = etcdMetric(ctx, ep, watchMetric); err != nil {
			return nil, nil, 0, 0, err
		}
		if mid > before {
			break
		}
	}
	if err := rd.watchRaw(ctx, &wg, "/bench-raw"+beacon.ServicesDir+ns+"/w/", n, rLat); err != nil {
		return nil, nil, 0, 0, err
	}
	after, err := etcdMetric(ctx, ep, watchMetric)
	if err != nil {
		return nil, nil, 0, 0, err
	}
	if err := w.writeSamples(ctx, ns, cfg.Samples, bLat, rLat); err != nil {
		return nil, nil, 0, 0, err
	}
	return bLat.all(), rLat.all(), mid - before, after - mid, nil
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

// writeSamples writes each sample through Beacon's key layout, waits
// until every Beacon watcher has it, then writes it under the raw prefix
// and waits for every raw watch.
func (w *sampleWriter) writeSamples(ctx context.Context, ns string, samples int, bLat, rLat *latencies) error {
	for s := range samples {
		in := benchInstance(ns, "w", s)
		for _, side := range []struct {
			key string
			lat *latencies
		}{{w.ks.Key(in.Ref()), bLat}, {rawKey(in), rLat}} {
			side.lat.t0[s].Store(time.Now().UnixNano())
			if _, err := w.cli.Put(ctx, side.key, rawValue(in), clientv3.WithLease(w.lease)); err != nil {
				return err
			}
			late, err := side.lat.wait(ctx, s)
			if err != nil {
				return err
			}
			if late {
				return fmt.Errorf("bench: sample %d not received by every watcher within 30 s", s)
			}
		}
	}
	return nil
}

// watchReaders are one process's worth of readers of each side: a Beacon
// registry (its watchers share one etcd watch) and one raw etcd client.
type watchReaders struct {
	st     *etcdstore.Store
	reader registry.Registry
	raw    *clientv3.Client
}

func openWatchReaders(ctx context.Context, eps []string) (*watchReaders, error) {
	st, err := beaconStore(ctx, eps)
	if err != nil {
		return nil, err
	}
	rd := &watchReaders{st: st}
	if rd.reader, err = registry.New(st, registry.Config{Root: "/bench-beacon", WatchLinger: -1}); err != nil {
		rd.close()
		return nil, err
	}
	if rd.raw, err = rawClient(eps); err != nil {
		rd.close()
		return nil, err
	}
	return rd, nil
}

func (rd *watchReaders) close() {
	if rd.raw != nil {
		_ = rd.raw.Close()
	}
	if rd.reader != nil {
		_ = rd.reader.Close()
	}
	_ = rd.st.Close()
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

// watchBeacon opens n Beacon watchers of q, each past its (empty)
// snapshot, recording in lat when each has each sample until ctx ends.
func (rd *watchReaders) watchBeacon(ctx context.Context, wg *sync.WaitGroup, q beacon.Query, n int, lat *latencies) error {
	for r := range n {
		w, err := rd.reader.Watch(ctx, q)
		if err != nil {
			return err
		}
		if _, err := w.Next(ctx); err != nil { // the (empty) snapshot
			return err
		}
		wg.Go(func() {
			defer w.Close()
			for {
				b, err := w.Next(ctx)
				if err != nil {
					return
				}
				for _, e := range b.Events {
					if e.Type == beacon.Added {
						lat.got(sampleOf(e.Instance.ID), r)
					}
				}
			}
		})
	}
	return nil
}

// watchRaw opens n etcd watches of prefix on the one raw client,
// recording in lat when each has each sample until ctx ends.
func (rd *watchReaders) watchRaw(ctx context.Context, wg *sync.WaitGroup, prefix string, n int, lat *latencies) error {
	for r := range n {
		wch := rd.raw.Watch(ctx, prefix, clientv3.WithPrefix(), clientv3.WithCreatedNotify())
		select {
		case resp := <-wch:
			if !resp.Created {
				return fmt.Errorf("raw watch: unexpected first response %+v", resp)
			}
		case <-ctx.Done():
			return ctx.Err()
		}
		wg.Go(func() {
			for resp := range wch {
				for _, e := range resp.Events {
					if e.Type == clientv3.EventTypePut && e.IsCreate() {
						k := string(e.Kv.Key)
						lat.got(sampleOf(k[len(k)-beacon.IDLength:]), r)
					}
				}
			}
		})
	}
	return nil
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
