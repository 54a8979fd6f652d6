package bench

import (
	"context"
	"errors"
	"fmt"
	"log/slog"
	"os"
	"runtime"
	"strings"
	"sync"
	"time"

	clientv3 "go.etcd.io/etcd/client/v3"
	"go.uber.org/zap"
)

// ProxyConfig configures the proxy scenario. Zero values take the
// defaults in brackets.
type ProxyConfig struct {
	// Endpoints of an etcd cluster to use; empty starts an embedded
	// cluster of Members members [3] on loopback.
	Endpoints []string
	Members   int
	// Fsync makes the embedded members sync their WAL like production
	// etcd does [off: in-memory speed, the proxy's worst case].
	Fsync bool
	// Duration of each load phase [4s]; there are four (range and put,
	// direct and through the proxy).
	Duration time.Duration
	// Clients is the number of concurrent workers [16], spread over
	// Conns client connections [4].
	Clients, Conns int
	// Watches is the number of identical client watches [1000].
	Watches int
	// ProxyCommand, when set, runs the proxy in its own process, as it is
	// deployed: the command and its first arguments (the beacon binary and
	// "proxy"), to which --endpoints, --listen-addr and --log-level are
	// appended. Empty runs the proxy in this process.
	ProxyCommand []string
	// ValueSize of the values put [256].
	ValueSize int
	// Logger for progress; nil discards.
	Logger *slog.Logger
}

func (c *ProxyConfig) defaults() {
	if c.Duration <= 0 {
		c.Duration = 4 * time.Second
	}
	if c.Clients <= 0 {
		c.Clients = 16
	}
	if c.Conns <= 0 {
		c.Conns = 4
	}
	if c.Watches <= 0 {
		c.Watches = 1000
	}
	if c.Members <= 0 {
		c.Members = 3
	}
	if c.ValueSize <= 0 {
		c.ValueSize = 256
	}
	if c.Logger == nil {
		c.Logger = slog.New(slog.DiscardHandler)
	}
}

// RunProxy measures etcd traffic through a readwrite proxy against the same
// traffic sent straight to etcd, in one run: range and put throughput and
// latency, and what 1,000 identical watches cost upstream.
func RunProxy(ctx context.Context, cfg ProxyConfig) (*Report, error) {
	cfg.defaults()
	eps := cfg.Endpoints
	setup := "external etcd " + strings.Join(eps, ",")
	var err error
	if len(eps) == 0 {
		c, err := startLocalEtcd(ctx, cfg.Members, cfg.Fsync)
		if err != nil {
			return nil, err
		}
		defer c.Close()
		eps = c.Endpoints()
		fsync := "no fsync"
		if cfg.Fsync {
			fsync = "fsync"
		}
		setup = fmt.Sprintf("embedded etcd 3.7, %d member(s) on loopback, %s", cfg.Members, fsync)
	}
	var px proxyUnderTest
	where := "in this process"
	if len(cfg.ProxyCommand) > 0 {
		px, err = startProxyProcess(ctx, cfg.ProxyCommand, eps)
		where = "in its own process"
	} else {
		px, err = startProxyInProcess(ctx, eps)
	}
	if err != nil {
		return nil, fmt.Errorf("start the proxy: %w", err)
	}
	defer px.stop()
	proxyEps := []string{"http://" + px.addr()}
	setup += "; proxy " + where
	if b, err := os.ReadFile("/proc/loadavg"); err == nil {
		setup += "; load average at start " + strings.Join(strings.Fields(string(b))[:3], " ")
	}

	r := &Report{
		Scenario: "proxy",
		Setup: fmt.Sprintf("%s; %d workers over %d connections, %s per phase, %d-byte values, %d watches; GOMAXPROCS=%d",
			setup, cfg.Clients, cfg.Conns, cfg.Duration, cfg.ValueSize, cfg.Watches, runtime.GOMAXPROCS(0)),
	}
	value := strings.Repeat("v", cfg.ValueSize)
	ops := []struct {
		name string
		op   func(ctx context.Context, c *clientv3.Client, i int) error
	}{
		{"range", func(ctx context.Context, c *clientv3.Client, i int) error {
			_, err := c.Get(ctx, fmt.Sprintf("bench/k%d", i%1000))
			return err
		}},
		{"put", func(ctx context.Context, c *clientv3.Client, i int) error {
			_, err := c.Put(ctx, fmt.Sprintf("bench/k%d", i%1000), value)
			return err
		}},
	}
	directClis, err := clients(eps, cfg.Conns)
	if err != nil {
		return nil, err
	}
	defer closeAll(directClis)
	proxyClis, err := clients(proxyEps, cfg.Conns)
	if err != nil {
		return nil, err
	}
	defer closeAll(proxyClis)
	for _, op := range ops {
		cfg.Logger.Info("measuring", "op", op.name)
		// Alternate short slices of direct and proxied load so that other
		// work on the machine weighs on both sides alike.
		var direct, via loadResult
		const rounds = 4
		for i := range rounds {
			first, second := directClis, proxyClis
			if i%2 == 1 {
				first, second = proxyClis, directClis
			}
			a, err := load(ctx, first, cfg.Duration/rounds, cfg.Clients, op.op)
			if err != nil {
				return nil, fmt.Errorf("%s: %w", op.name, err)
			}
			b, err := load(ctx, second, cfg.Duration/rounds, cfg.Clients, op.op)
			if err != nil {
				return nil, fmt.Errorf("%s: %w", op.name, err)
			}
			if i%2 == 1 {
				a, b = b, a
			}
			direct.add(a)
			via.add(b)
		}
		r.Add(Row{Metric: op.name + " throughput", Unit: "ops/s", Beacon: via.rate(), Baseline: direct.rate(), HigherIsBetter: true, Goal: 0.8})
		r.Add(Row{Metric: op.name + " p50", Unit: "ms", Beacon: Ms(Percentile(via.lat, 50)), Baseline: Ms(Percentile(direct.lat, 50)), Goal: 1.3})
		r.Add(Row{Metric: op.name + " p99", Unit: "ms", Beacon: Ms(Percentile(via.lat, 99)), Baseline: Ms(Percentile(direct.lat, 99))})
		if via.errors+direct.errors > 0 {
			r.Note("%s: %d errors direct, %d through the proxy", op.name, direct.errors, via.errors)
		}
	}

	// One client alone: the latency the extra hop adds, without queueing.
	var seqDirect, seqVia loadResult
	for range 2 {
		a, err := load(ctx, directClis[:1], cfg.Duration/4, 1, ops[0].op)
		if err != nil {
			return nil, err
		}
		b, err := load(ctx, proxyClis[:1], cfg.Duration/4, 1, ops[0].op)
		if err != nil {
			return nil, err
		}
		seqDirect.add(a)
		seqVia.add(b)
	}
	r.Add(Row{Metric: "range p50, 1 client", Unit: "ms", Beacon: Ms(Percentile(seqVia.lat, 50)), Baseline: Ms(Percentile(seqDirect.lat, 50))})
	r.Note("the proxy adds %.0f µs to a range from a lone client (one more gRPC hop on loopback)",
		float64(Percentile(seqVia.lat, 50)-Percentile(seqDirect.lat, 50))/float64(time.Microsecond))

	cfg.Logger.Info("measuring watches", "watches", cfg.Watches)
	direct, err := watchFanout(ctx, eps, cfg, nil)
	if err != nil {
		return nil, fmt.Errorf("watches direct: %w", err)
	}
	via, err := watchFanout(ctx, proxyEps, cfg, px)
	if err != nil {
		return nil, fmt.Errorf("watches through the proxy: %w", err)
	}
	r.Add(Row{Metric: fmt.Sprintf("etcd watches for %d client watches", cfg.Watches), Unit: "watches",
		Beacon: float64(via.upstream), Baseline: float64(direct.upstream)})
	r.Add(Row{Metric: fmt.Sprintf("heap for %d watches", cfg.Watches), Unit: "MiB",
		Beacon: via.heapMiB, Baseline: direct.heapMiB})
	r.Add(Row{Metric: fmt.Sprintf("one event to all %d watchers", cfg.Watches), Unit: "ms",
		Beacon: Ms(via.fanout), Baseline: Ms(direct.fanout)})
	r.Note("heap is the growth of the live heap of the clients, etcd and the proxy while the watches are open")
	r.Note("direct: %d watches on etcd; through the proxy: %d client watchers on the proxy share %d etcd watch(es)",
		direct.upstream, via.clientWatchers, via.upstream)
	return r, nil
}

type loadResult struct {
	ops     int
	elapsed time.Duration
	lat     []time.Duration
	errors  int
}

func (a *loadResult) add(b loadResult) {
	a.ops += b.ops
	a.elapsed += b.elapsed
	a.lat = append(a.lat, b.lat...)
	a.errors += b.errors
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

type watchResult struct {
	upstream, clientWatchers int
	heapMiB                  float64
	fanout                   time.Duration
}

// watchFanout opens cfg.Watches identical watches, measures the heap they
// hold and how long one event takes to reach all of them.
func watchFanout(ctx context.Context, eps []string, cfg ProxyConfig, px proxyUnderTest) (watchResult, error) {
	const perConn = 100
	conns := (cfg.Watches + perConn - 1) / perConn
	before := liveHeap()
	var pxBefore float64
	if px != nil {
		pxBefore = px.heap(ctx)
	}
	clis, err := clients(eps, conns)
	if err != nil {
		return watchResult{}, err
	}
	defer closeAll(clis)
	wctx, cancel := context.WithCancel(ctx)
	defer cancel()
	key := fmt.Sprintf("bench/watch/%d", time.Now().UnixNano())
	chans := make([]clientv3.WatchChan, 0, cfg.Watches)
	for i := range cfg.Watches {
		wch := clis[i%len(clis)].Watch(wctx, key, clientv3.WithCreatedNotify())
		if wr := <-wch; !wr.Created || wr.Err() != nil {
			return watchResult{}, fmt.Errorf("watch %d not created: %v", i, wr.Err())
		}
		chans = append(chans, wch)
	}
	res := watchResult{upstream: cfg.Watches, clientWatchers: cfg.Watches}
	res.heapMiB = (float64(liveHeap()) - float64(before)) / (1 << 20)
	if px != nil {
		st, err := px.stats(ctx)
		if err != nil {
			return watchResult{}, err
		}
		res.upstream, res.clientWatchers = st.UpstreamWatches, st.ClientWatchers
		res.heapMiB += (px.heap(ctx) - pxBefore) / (1 << 20)
	}
	t0 := time.Now()
	if _, err := clis[0].Put(ctx, key, "x"); err != nil {
		return watchResult{}, err
	}
	for i, wch := range chans {
		select {
		case wr := <-wch:
			if len(wr.Events) != 1 {
				return watchResult{}, fmt.Errorf("watch %d: %d events, err %v", i, len(wr.Events), wr.Err())
			}
		case <-time.After(30 * time.Second):
			return watchResult{}, fmt.Errorf("watch %d got no event", i)
		}
	}
	res.fanout = time.Since(t0)
	return res, nil
}

func liveHeap() uint64 {
	runtime.GC()
	var m runtime.MemStats
	runtime.ReadMemStats(&m)
	return m.HeapAlloc
}
