package bench

import (
	"context"
	"fmt"
	"sync"
	"sync/atomic"
	"time"

	"github.com/beaconplane/beacon"
	"github.com/beaconplane/beacon/registry"
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

// RunWatch measures the time from a registration until every watcher has
// it, with 1, 100 and 1000 watchers in one process: Beacon's watchers share
// one etcd watch; the raw baseline opens one etcd watch per watcher (one
// client, as a process would).
func RunWatch(ctx context.Context, cfg RegistryConfig) (*Report, error) {
	cfg.defaults()
	if err := cfg.Validate(); err != nil {
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
	ks, err := beacon.NewKeyspace("/bench-beacon")
	if err != nil {
		return nil, nil, 0, 0, err
	}
	rawW, err := rawClient(tgt.endpoints)
	if err != nil {
		return nil, nil, 0, 0, err
	}
	defer rawW.Close()
	lease, err := rawW.Grant(ctx, 60)
	if err != nil {
		return nil, nil, 0, 0, err
	}
	defer func() { _, _ = rawW.Revoke(context.WithoutCancel(ctx), lease.ID) }()
	// Kept alive for as long as the round runs (5k watchers with many
	// samples take minutes).
	kctx, stopKeepAlive := context.WithCancel(ctx)
	defer stopKeepAlive()
	ka, err := rawW.KeepAlive(kctx, lease.ID)
	if err != nil {
		return nil, nil, 0, 0, err
	}
	go func() {
		for range ka { //nolint:revive // drains the keep-alive responses until the round ends
		}
	}()

	// Readers: one process's worth of each.
	rst, err := beaconStore(ctx, tgt.endpoints)
	if err != nil {
		return nil, nil, 0, 0, err
	}
	defer rst.Close()
	reader, err := registry.New(rst, registry.Config{Root: "/bench-beacon", WatchLinger: -1})
	if err != nil {
		return nil, nil, 0, 0, err
	}
	defer reader.Close()
	rawR, err := rawClient(tgt.endpoints)
	if err != nil {
		return nil, nil, 0, 0, err
	}
	defer rawR.Close()

	samples := cfg.Samples
	bLat, rLat := newLatencies(samples, n), newLatencies(samples, n)
	sampleOf := func(id string) int {
		var v uint64
		if _, err := fmt.Sscanf(id, "%x", &v); err != nil {
			return -1
		}
		return int(v) - 1
	}
	var wg sync.WaitGroup
	defer wg.Wait()
	defer cancel()

	// Beacon watchers.
	before, err := etcdMetric(ctx, ep, watchMetric)
	if err != nil {
		return nil, nil, 0, 0, err
	}
	q := beacon.Query{Namespace: ns, Component: "w"}
	for r := range n {
		w, err := reader.Watch(ctx, q)
		if err != nil {
			return nil, nil, 0, 0, err
		}
		if _, err := w.Next(ctx); err != nil { // the (empty) snapshot
			return nil, nil, 0, 0, err
		}
		wg.Add(1)
		go func() {
			defer wg.Done()
			defer w.Close()
			for {
				b, err := w.Next(ctx)
				if err != nil {
					return
				}
				for _, e := range b.Events {
					if e.Type == beacon.Added {
						bLat.got(sampleOf(e.Instance.ID), r)
					}
				}
			}
		}()
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
	beaconUp = mid - before

	// Raw watchers: one etcd watch each, on one client.
	prefix := "/bench-raw" + beacon.ServicesDir + ns + "/w/"
	for r := range n {
		wch := rawR.Watch(ctx, prefix, clientv3.WithPrefix(), clientv3.WithCreatedNotify())
		select {
		case resp := <-wch:
			if !resp.Created {
				return nil, nil, 0, 0, fmt.Errorf("raw watch: unexpected first response %+v", resp)
			}
		case <-ctx.Done():
			return nil, nil, 0, 0, ctx.Err()
		}
		wg.Add(1)
		go func() {
			defer wg.Done()
			for resp := range wch {
				for _, e := range resp.Events {
					if e.Type == clientv3.EventTypePut && e.IsCreate() {
						k := string(e.Kv.Key)
						rLat.got(sampleOf(k[len(k)-beacon.IDLength:]), r)
					}
				}
			}
		}()
	}
	after, err := etcdMetric(ctx, ep, watchMetric)
	if err != nil {
		return nil, nil, 0, 0, err
	}
	rawUp = after - mid

	wait := func(l *latencies, s int) error {
		select {
		case <-l.done[s]:
			return nil
		case <-time.After(30 * time.Second):
			return fmt.Errorf("bench: sample %d not received by every watcher within 30 s", s)
		case <-ctx.Done():
			return ctx.Err()
		}
	}
	for s := range samples {
		in := benchInstance(ns, "w", s)
		bLat.t0[s].Store(time.Now().UnixNano())
		if _, err := rawW.Put(ctx, ks.Key(in.Ref()), rawValue(in), clientv3.WithLease(lease.ID)); err != nil {
			return nil, nil, 0, 0, err
		}
		if err := wait(bLat, s); err != nil {
			return nil, nil, 0, 0, err
		}
		rLat.t0[s].Store(time.Now().UnixNano())
		if _, err := rawW.Put(ctx, rawKey(in), rawValue(in), clientv3.WithLease(lease.ID)); err != nil {
			return nil, nil, 0, 0, err
		}
		if err := wait(rLat, s); err != nil {
			return nil, nil, 0, 0, err
		}
	}
	return bLat.all(), rLat.all(), beaconUp, rawUp, nil
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
