package bench

import (
	"context"
	"fmt"
	"io"
	"log/slog"
	"strings"
	"sync"
	"time"

	"github.com/beaconplane/beacon/bootstrap"
	"go.etcd.io/etcd/client/pkg/v3/types"
	clientv3 "go.etcd.io/etcd/client/v3"
	"go.etcd.io/etcd/server/v3/etcdserver/api/v3discovery"
	"go.uber.org/zap"
	"go.uber.org/zap/zapcore"
)

// BootstrapConfig configures the bootstrap scenario. Zero values take the
// defaults in brackets.
type BootstrapConfig struct {
	// Endpoints of the discovery registry (an etcd, e.g. a running beacon
	// serve); empty starts an embedded single-member etcd.
	Endpoints []string
	// Sizes are the cluster sizes to bootstrap [3, 5, 7].
	Sizes []int
	// Rounds is how many clusters of each size each side bootstraps [15].
	Rounds int
	// Logger for progress; nil discards.
	Logger *slog.Logger
}

func (c *BootstrapConfig) defaults() {
	if len(c.Sizes) == 0 {
		c.Sizes = []int{3, 5, 7}
	}
	setPositive(&c.Rounds, 15)
	setDefault(&c.Logger, discardLogger())
}

// settle lets the waiting members' watches open and catch up before the
// last member starts: etcd serves a watch that starts at a past revision
// (a member that listed before another registered) from a loop that runs
// every 100 ms. Both sides get the same.
const settle = 150 * time.Millisecond

// RunBootstrap measures cluster discovery: for each size N, N-1 members
// register and wait, then the last one starts, and the figure is the time
// from its start until every member has its initial cluster. Beacon's side
// creates the token with bootstrap.CreateToken and its members run
// bootstrap.Join; the baseline writes the size key with a plain etcd put
// and its members run etcd's own v3discovery.JoinCluster. Both use the same
// registry, alternate round by round, and each member dials its own
// connection as a real member does.
func RunBootstrap(ctx context.Context, cfg BootstrapConfig) (*Report, error) {
	cfg.defaults()
	for _, n := range cfg.Sizes {
		if err := bootstrap.ValidateSize(n); err != nil || n < 2 {
			return nil, fmt.Errorf("size %d: measure clusters of 2 to %d members", n, bootstrap.MaxSize)
		}
	}
	eps, setup, stop, err := givenOrLocalEtcd(ctx, cfg.Endpoints, 1, false,
		"registry: external etcd ", "registry: embedded etcd 3.7 (1 member, no fsync)")
	if err != nil {
		return nil, err
	}
	defer stop()
	admin, err := clientv3.New(clientv3.Config{Endpoints: eps, DialTimeout: 5 * time.Second, Logger: zap.NewNop()})
	if err != nil {
		return nil, err
	}
	defer admin.Close()

	r := &Report{
		Scenario: "bootstrap",
		Setup: fmt.Sprintf("%s; %d rounds per size and side; members are in-process discovery clients (no etcd started), each with its own connection",
			setup, cfg.Rounds),
	}
	seq := 0
	for _, n := range cfg.Sizes {
		var beacon, etcd []time.Duration
		for round := range cfg.Rounds {
			for _, side := range []bool{round%2 == 0, round%2 != 0} { // alternate who goes first
				seq++
				token := fmt.Sprintf("bench-%d-%d", time.Now().UnixNano(), seq)
				var d time.Duration
				var err error
				if side {
					d, err = beaconRound(ctx, admin, eps, token, n)
					beacon = append(beacon, d)
				} else {
					d, err = etcdRound(ctx, admin, eps, token, n)
					etcd = append(etcd, d)
				}
				if err != nil {
					return nil, err
				}
				_, _ = admin.Delete(ctx, bootstrap.TokenPrefix(token), clientv3.WithPrefix())
			}
		}
		cfg.Logger.Info("bootstrap size measured", "size", n, "beacon_p50", Percentile(beacon, 50), "etcd_p50", Percentile(etcd, 50))
		r.Add(Row{Metric: fmt.Sprintf("%d members: discovery done after last start, p50", n), Unit: "ms",
			Beacon: Ms(Percentile(beacon, 50)), Baseline: Ms(Percentile(etcd, 50)), Goal: 1.1})
		r.Add(Row{Metric: fmt.Sprintf("%d members: discovery done after last start, p90", n), Unit: "ms",
			Beacon: Ms(Percentile(beacon, 90)), Baseline: Ms(Percentile(etcd, 90))})
	}
	r.Note("baseline: size key written with a plain etcd put, members run etcd 3.7.3's v3discovery.JoinCluster")
	r.Note("beacon: token created with bootstrap.CreateToken, members run bootstrap.Join")
	r.Note("the time runs from the moment the last member starts until every member has its --initial-cluster; the first N-1 are registered and watching (settled %v) before it starts", settle)
	return r, nil
}

// member is one in-process discovery client.
type member struct {
	name, url string
	waiting   chan struct{} // closed when registered and watching
	done      chan struct{}
	at        time.Time // when it returned
	cluster   string
	err       error
}

func newMembers(token string, n int) []*member {
	ms := make([]*member, n)
	for i := range ms {
		ms[i] = &member{
			name:    fmt.Sprintf("m%d", i+1),
			url:     fmt.Sprintf("http://127.0.0.1:%d", 20000+i),
			waiting: make(chan struct{}),
			done:    make(chan struct{}),
		}
	}
	return ms
}

// runRound starts n-1 members, waits until they wait, starts the last one
// and returns the time until all have their cluster.
func runRound(ctx context.Context, ms []*member, start func(*member)) (time.Duration, error) {
	var wg sync.WaitGroup
	defer wg.Wait()
	launch := func(m *member) {
		wg.Add(1)
		go func() {
			defer wg.Done()
			defer close(m.done)
			start(m)
			m.at = time.Now()
		}()
	}
	n := len(ms)
	for _, m := range ms[:n-1] {
		launch(m)
	}
	for _, m := range ms[:n-1] {
		select {
		case <-m.waiting:
		case <-m.done:
			return 0, fmt.Errorf("member %s returned before the cluster was full: %v", m.name, m.err)
		case <-ctx.Done():
			return 0, ctx.Err()
		}
	}
	select {
	case <-time.After(settle):
	case <-ctx.Done():
		return 0, ctx.Err()
	}
	t0 := time.Now()
	launch(ms[n-1])
	var last time.Time
	for _, m := range ms {
		select {
		case <-m.done:
		case <-ctx.Done():
			return 0, ctx.Err()
		}
		if m.err != nil {
			return 0, fmt.Errorf("member %s: %w", m.name, m.err)
		}
		if m.cluster != ms[0].cluster || strings.Count(m.cluster, ",") != n-1 {
			return 0, fmt.Errorf("members disagree or the cluster is incomplete: %q vs %q", m.cluster, ms[0].cluster)
		}
		if m.at.After(last) {
			last = m.at
		}
	}
	return last.Sub(t0), nil
}

func beaconRound(ctx context.Context, admin *clientv3.Client, eps []string, token string, n int) (time.Duration, error) {
	if _, err := bootstrap.CreateToken(ctx, admin, token, n); err != nil {
		return 0, err
	}
	ms := newMembers(token, n)
	return runRound(ctx, ms, func(m *member) {
		var once sync.Once
		c, err := bootstrap.Join(ctx, bootstrap.Config{Token: token, Endpoints: eps}, m.name, []string{m.url},
			bootstrap.WithProgress(func(bootstrap.Progress) { once.Do(func() { close(m.waiting) }) }))
		m.cluster, m.err = c.InitialCluster, err
	})
}

func etcdRound(ctx context.Context, admin *clientv3.Client, eps []string, token string, n int) (time.Duration, error) {
	if _, err := admin.Put(ctx, bootstrap.SizeKey(token), fmt.Sprint(n)); err != nil {
		return 0, err
	}
	ms := newMembers(token, n)
	return runRound(ctx, ms, func(m *member) {
		urls, err := types.NewURLs([]string{m.url})
		if err != nil {
			m.err = err
			return
		}
		id, err := bootstrap.MemberID([]string{m.url}, token)
		if err != nil {
			m.err = err
			return
		}
		dcfg := &v3discovery.DiscoveryConfig{Token: token}
		dcfg.Endpoints = eps
		dcfg.DialTimeout, dcfg.RequestTimeout = bootstrap.DefaultDialTimeout, bootstrap.DefaultRequestTimeout
		dcfg.KeepAliveTime, dcfg.KeepAliveTimeout = bootstrap.DefaultKeepAliveTime, bootstrap.DefaultKeepAliveTimeout
		m.cluster, m.err = v3discovery.JoinCluster(waitingLogger(m.waiting), dcfg, types.ID(id), types.URLsMap{m.name: urls}.String())
	})
}

// waitingLogger is a zap logger that discards everything and closes
// waiting when etcd's discovery logs that it waits for peers (right after
// it opened its watch); etcd's client offers no other signal.
func waitingLogger(waiting chan struct{}) *zap.Logger {
	var once sync.Once
	core := zapcore.NewCore(zapcore.NewJSONEncoder(zap.NewProductionEncoderConfig()), zapcore.AddSync(io.Discard), zapcore.InfoLevel)
	return zap.New(core, zap.Hooks(func(e zapcore.Entry) error {
		if e.Message == "waiting for peers from discovery service" {
			once.Do(func() { close(waiting) })
		}
		return nil
	}))
}
