package bench

import (
	"context"
	"crypto/rand"
	"encoding/hex"
	"errors"
	"fmt"
	"log/slog"
	"sync"
	"sync/atomic"
	"time"

	"github.com/beaconplane/beacon"
	"github.com/beaconplane/beacon/naming"
	"github.com/beaconplane/beacon/naming/namingtest"
	"github.com/beaconplane/beacon/registry"
	"github.com/beaconplane/beacon/store/etcd"
	clientv3 "go.etcd.io/etcd/client/v3"
	etcdendpoints "go.etcd.io/etcd/client/v3/naming/endpoints"
	etcdresolver "go.etcd.io/etcd/client/v3/naming/resolver"
	"go.uber.org/zap"
	"google.golang.org/grpc"
	"google.golang.org/grpc/credentials/insecure"
)

// NamingConfig configures the naming scenario. Zero values take the
// defaults in brackets.
type NamingConfig struct {
	// Endpoints of an etcd (e.g. a running beacon serve); empty starts an
	// embedded single-member etcd.
	Endpoints []string
	// Backends is the number of gRPC backends [3].
	Backends int
	// Trials is the number of lease revokes, and of drains [100].
	Trials int
	// Callers is the number of goroutines calling through each channel
	// [8]; each waits Pace between calls [1ms].
	Callers int
	Pace    time.Duration
	// Quiet is how long a removed backend must receive no call from a
	// channel before its last call counts as the last [100ms].
	Quiet time.Duration
	// DrainGrace is how long a drained instance stays registered before it
	// is removed and its server stopped, in the rolling restart [250ms].
	DrainGrace time.Duration
	// Logger for progress; nil discards.
	Logger *slog.Logger
}

// Validate checks the configuration: counts and durations must not be
// negative (zero takes the default), and a restart needs another backend
// to carry the load, so Backends must be at least 2 when set.
func (c NamingConfig) Validate() error {
	if err := checkNotNegative(map[string]int{"backends": c.Backends, "trials": c.Trials, "callers": c.Callers},
		map[string]time.Duration{"pace": c.Pace, "quiet": c.Quiet, "drain-grace": c.DrainGrace}); err != nil {
		return err
	}
	if c.Backends == 1 {
		return fmt.Errorf("bench: --backends 1: the scenarios take a backend out under load, so at least 2 are needed")
	}
	return nil
}

// checkNotNegative refuses a negative size or duration (0 is the
// default), naming its flag.
func checkNotNegative(sizes map[string]int, durations map[string]time.Duration) error {
	for name, v := range sizes {
		if v < 0 {
			return fmt.Errorf("bench: --%s %d: must be positive (0 for the default)", name, v)
		}
	}
	for name, d := range durations {
		if d < 0 {
			return fmt.Errorf("bench: --%s %v: must not be negative (0 for the default)", name, d)
		}
	}
	return nil
}

func (c *NamingConfig) defaults() {
	setPositive(&c.Backends, 3)
	setPositive(&c.Trials, 100)
	setPositive(&c.Callers, 8)
	setPositive(&c.Pace, time.Millisecond)
	setPositive(&c.Quiet, 100*time.Millisecond)
	setPositive(&c.DrainGrace, 250*time.Millisecond)
	setDefault(&c.Logger, discardLogger())
}

// The two sides, as backends count their calls.
const (
	sideBeacon = "beacon"
	sideEtcd   = "etcd"
)

// RunNaming measures how fast a gRPC channel stops sending to a backend
// that goes away, with Beacon's beacon:/// resolver (registry over etcd)
// and with etcd's own naming resolver (go.etcd.io/etcd/client/v3/naming),
// both under load, in the same run, against the same backends:
//
//   - revoke: a backend's process ends (its registry closes, revoking the
//     lease that holds both its Beacon instance and its etcd endpoint, so
//     both resolvers see the same revision);
//   - drain: Beacon marks the instance draining (Registration.Drain); the
//     baseline deletes its endpoint (etcd naming has no draining state);
//   - rolling restart: each backend in turn is taken out (drained, or its
//     endpoint deleted), stopped hard after DrainGrace, and replaced by a
//     new one, under continuous load: the goal is zero failed calls. The
//     same restart without draining first is the reference.
func RunNaming(ctx context.Context, cfg NamingConfig) (*Report, error) {
	if err := cfg.Validate(); err != nil {
		return nil, err
	}
	cfg.defaults()
	eps, setup, stop, err := givenOrLocalEtcd(ctx, cfg.Endpoints, 1, false, "etcd: external ", "etcd: embedded 3.7 (1 member, no fsync)")
	if err != nil {
		return nil, err
	}
	defer stop()
	nb, err := newNamingBench(ctx, cfg, eps)
	if err != nil {
		return nil, err
	}
	defer nb.close()

	r := &Report{
		Scenario: "naming",
		Setup: fmt.Sprintf("%s; %d gRPC backends on loopback; round_robin; each channel %d callers (one call, then %v pause); %d trials per scenario",
			setup, cfg.Backends, cfg.Callers, cfg.Pace, cfg.Trials),
	}
	for _, sc := range []struct {
		name, metric string
		trial        func(context.Context, *slot) error
	}{
		{"revoke", "lease revoke → last call to the backend", nb.revoke},
		{"drain", "drain (etcd: delete) → last call to the backend", nb.drain},
	} {
		lat, err := nb.trials(ctx, sc.trial)
		if err != nil {
			return nil, fmt.Errorf("%s: %w", sc.name, err)
		}
		cfg.Logger.Info("naming scenario measured", "scenario", sc.name,
			"beacon_p50", Percentile(lat[sideBeacon], 50), "etcd_p50", Percentile(lat[sideEtcd], 50))
		r.Add(Row{Metric: sc.metric + ", p50", Unit: "ms",
			Beacon: Ms(Percentile(lat[sideBeacon], 50)), Baseline: Ms(Percentile(lat[sideEtcd], 50)), Goal: 1.0})
		r.Add(Row{Metric: sc.metric + ", p99", Unit: "ms",
			Beacon: Ms(Percentile(lat[sideBeacon], 99)), Baseline: Ms(Percentile(lat[sideEtcd], 99)), Goal: 1.0})
		diffs := make([]time.Duration, len(lat[sideBeacon]))
		faster := 0
		for i := range diffs {
			diffs[i] = lat[sideBeacon][i] - lat[sideEtcd][i]
			if diffs[i] <= 0 {
				faster++
			}
		}
		r.Note("%s: means Beacon %.2f ms, etcd %.2f ms; per trial, Beacon minus etcd: median %+.2f ms (middle half %+.2f to %+.2f); Beacon as fast or faster in %d of %d trials",
			sc.name, Ms(mean(lat[sideBeacon])), Ms(mean(lat[sideEtcd])), Ms(Percentile(diffs, 50)),
			Ms(Percentile(diffs, 25)), Ms(Percentile(diffs, 75)), faster, len(diffs))
	}
	for _, drainFirst := range []bool{true, false} {
		var res [2]restartResult
		for i, side := range []string{sideBeacon, sideEtcd} {
			if res[i], err = nb.rollingRestart(ctx, side, drainFirst); err != nil {
				return nil, fmt.Errorf("rolling restart (%s): %w", side, err)
			}
		}
		label := "rolling restart, drain first"
		if !drainFirst {
			label = "rolling restart, no drain (reference)"
		}
		cfg.Logger.Info("rolling restart measured", "drain_first", drainFirst, "beacon", res[0], "etcd", res[1])
		r.Add(Row{Metric: label + ": failed calls", Unit: "calls", Beacon: float64(res[0].failed), Baseline: float64(res[1].failed)})
		r.Add(Row{Metric: label + ": calls made", Unit: "calls", Beacon: float64(res[0].calls), Baseline: float64(res[1].calls), HigherIsBetter: true})
	}
	r.Note("revoke: closing a backend's registry revokes its lease, which holds its Beacon instance and its etcd endpoint: both resolvers see one revision")
	r.Note("drain: Beacon's Registration.Drain marks the instance draining; the baseline deletes the endpoint with etcd's endpoints.Manager (it has no draining state)")
	r.Note("latency runs from the revoke/drain call to the last call the backend received from that channel, once %v passed without one (p50 and p99 of %d trials)", cfg.Quiet, cfg.Trials)
	r.Note("rolling restart: each of the %d backends in turn is taken out (drain first: Drain with %v grace / DeleteEndpoint then %v), stopped hard (grpc.Server.Stop) and replaced; goal: 0 failed calls with drain first",
		cfg.Backends, cfg.DrainGrace, cfg.DrainGrace)
	r.Note("baseline: etcd 3.7.3's naming/endpoints.Manager and naming/resolver on a plain clientv3 client; Beacon: registry.StoreRegistry over store/etcd and naming.NewBuilder")
	return r, nil
}

// slot is one backend "process": its gRPC server, its own etcd client,
// and its current registration in both formats.
type slot struct {
	i       int
	backend *namingtest.Backend
	st      *etcd.Store
	reg     *registry.StoreRegistry
	inst    registry.Registration
	key     string // its etcd naming key
}

type namingBench struct {
	cfg    NamingConfig
	eps    []string
	q      beacon.Query
	target string // etcd naming target

	admin  *clientv3.Client
	mgr    etcdendpoints.Manager
	slots  []*slot
	closes []func()

	channels map[string]*grpc.ClientConn
	calls    map[string]*atomic.Int64
	failures map[string]*atomic.Int64
}

func newNamingBench(ctx context.Context, cfg NamingConfig, eps []string) (_ *namingBench, err error) {
	var rnd [4]byte
	_, _ = rand.Read(rnd[:])
	id := hex.EncodeToString(rnd[:])
	nb := &namingBench{
		cfg:      cfg,
		eps:      eps,
		q:        beacon.Query{Namespace: "bench", Component: "naming-" + id, Endpoint: "grpc"},
		target:   "bench/naming-" + id,
		channels: map[string]*grpc.ClientConn{},
		calls:    map[string]*atomic.Int64{sideBeacon: {}, sideEtcd: {}},
		failures: map[string]*atomic.Int64{sideBeacon: {}, sideEtcd: {}},
	}
	defer func() {
		if err != nil {
			nb.close()
		}
	}()
	if nb.admin, err = nb.etcdClient(); err != nil {
		return nil, err
	}
	if nb.mgr, err = etcdendpoints.NewManager(nb.admin, nb.target); err != nil {
		return nil, err
	}
	for i := range cfg.Backends {
		s := &slot{i: i}
		nb.slots = append(nb.slots, s)
		if s.st, err = etcd.Open(ctx, etcd.Config{Endpoints: eps}); err != nil {
			return nil, err
		}
		if err := nb.startBackend(ctx, s); err != nil {
			return nil, err
		}
	}

	// Beacon's channel: a registry over its own etcd client.
	st, err := etcd.Open(ctx, etcd.Config{Endpoints: eps})
	if err != nil {
		return nil, err
	}
	nb.closes = append(nb.closes, func() { _ = st.Close() })
	reg, err := registry.New(st, registry.Config{})
	if err != nil {
		return nil, err
	}
	nb.closes = append(nb.closes, func() { _ = reg.Close() })
	b, err := naming.NewBuilder(reg)
	if err != nil {
		return nil, err
	}
	if err := nb.dial(sideBeacon, naming.Target(nb.q), b.DialOption()); err != nil {
		return nil, err
	}
	// etcd's channel: its own resolver on its own client.
	cli, err := nb.etcdClient()
	if err != nil {
		return nil, err
	}
	eb, err := etcdresolver.NewBuilder(cli)
	if err != nil {
		return nil, err
	}
	if err := nb.dial(sideEtcd, "etcd:///"+nb.target, grpc.WithResolvers(eb)); err != nil {
		return nil, err
	}
	return nb, nil
}

func (nb *namingBench) etcdClient() (*clientv3.Client, error) {
	cli, err := clientv3.New(clientv3.Config{Endpoints: nb.eps, DialTimeout: 5 * time.Second, Logger: zap.NewNop()})
	if err != nil {
		return nil, err
	}
	nb.closes = append(nb.closes, func() { _ = cli.Close() })
	return cli, nil
}

func (nb *namingBench) dial(side, target string, resolver grpc.DialOption) error {
	cc, err := grpc.NewClient(target, resolver,
		grpc.WithTransportCredentials(insecure.NewCredentials()),
		grpc.WithDefaultServiceConfig(`{"loadBalancingConfig":[{"round_robin":{}}]}`))
	if err != nil {
		return err
	}
	nb.closes = append(nb.closes, func() { _ = cc.Close() })
	nb.channels[side] = cc
	return nil
}

func (nb *namingBench) close() {
	for _, s := range nb.slots {
		if s.reg != nil {
			_ = s.reg.Close()
		}
		if s.backend != nil {
			s.backend.Stop()
		}
		if s.st != nil {
			_ = s.st.Close()
		}
	}
	for i := len(nb.closes) - 1; i >= 0; i-- {
		nb.closes[i]()
	}
	if nb.admin != nil {
		ctx, cancel := context.WithTimeout(context.Background(), 5*time.Second)
		defer cancel()
		_, _ = nb.admin.Delete(ctx, nb.target+"/", clientv3.WithPrefix())
	}
}

// startBackend starts a new server in s and registers it.
func (nb *namingBench) startBackend(ctx context.Context, s *slot) error {
	be, err := namingtest.NewBackend(fmt.Sprintf("b%d", s.i))
	if err != nil {
		return err
	}
	s.backend = be
	return nb.register(ctx, s)
}

// register registers s's backend in both formats under one lease: a new
// registry (a new process's session) and, on its lease, the etcd endpoint.
func (nb *namingBench) register(ctx context.Context, s *slot) error {
	reg, err := registry.New(s.st, registry.Config{})
	if err != nil {
		return err
	}
	inst, err := reg.Register(ctx, beacon.Instance{
		Namespace: nb.q.Namespace, Component: nb.q.Component, Endpoint: nb.q.Endpoint,
		Address: s.backend.Addr(), Transport: "grpc",
	})
	if err != nil {
		_ = reg.Close()
		return err
	}
	s.reg, s.inst = reg, inst
	s.key = nb.target + "/" + s.backend.Addr()
	return nb.mgr.AddEndpoint(ctx, s.key, etcdendpoints.Endpoint{Addr: s.backend.Addr()},
		clientv3.WithLease(clientv3.LeaseID(reg.Lease())))
}

// load runs the callers of one side until stop is called.
func (nb *namingBench) load(side string) (stop func()) {
	ctx, cancel := context.WithCancel(context.Background())
	var wg sync.WaitGroup
	cc := nb.channels[side]
	tagged := namingtest.Tag(ctx, side)
	for range nb.cfg.Callers {
		wg.Go(func() {
			t := time.NewTicker(nb.cfg.Pace)
			defer t.Stop()
			for ctx.Err() == nil {
				cctx, ccancel := context.WithTimeout(tagged, 2*time.Second)
				_, err := namingtest.Call(cctx, cc)
				ccancel()
				if ctx.Err() != nil {
					return
				}
				nb.calls[side].Add(1)
				if err != nil {
					nb.failures[side].Add(1)
				}
				select {
				case <-t.C:
				case <-ctx.Done():
				}
			}
		})
	}
	return func() {
		cancel()
		wg.Wait()
	}
}

// poll checks cond every few milliseconds until it holds, or fails after
// limit. (A benchmark watching call counters has no event to wait on.)
func poll(ctx context.Context, limit time.Duration, what string, cond func() bool) error {
	deadline := time.Now().Add(limit)
	t := time.NewTicker(2 * time.Millisecond)
	defer t.Stop()
	for !cond() {
		if time.Now().After(deadline) {
			return fmt.Errorf("%s: not after %v", what, limit)
		}
		select {
		case <-t.C:
		case <-ctx.Done():
			return ctx.Err()
		}
	}
	return nil
}

// warm waits until every backend receives calls from every side given.
func (nb *namingBench) warm(ctx context.Context, sides ...string) error {
	for _, s := range nb.slots {
		for _, side := range sides {
			base := s.backend.CallsFrom(side)
			if err := poll(ctx, 10*time.Second, fmt.Sprintf("backend %s reached by %s", s.backend.Name(), side),
				func() bool { return s.backend.CallsFrom(side) > base+2 }); err != nil {
				return err
			}
		}
	}
	return nil
}

// trials runs one kind of trial on each backend in turn, under load on
// both channels, and returns the latencies by side.
func (nb *namingBench) trials(ctx context.Context, trial func(context.Context, *slot) error) (map[string][]time.Duration, error) {
	stopB, stopE := nb.load(sideBeacon), nb.load(sideEtcd)
	defer stopE()
	defer stopB()
	lat := map[string][]time.Duration{}
	for k := range nb.cfg.Trials {
		if err := nb.warm(ctx, sideBeacon, sideEtcd); err != nil {
			return nil, err
		}
		s := nb.slots[k%len(nb.slots)]
		t0 := time.Now()
		if err := trial(ctx, s); err != nil {
			return nil, err
		}
		for _, side := range []string{sideBeacon, sideEtcd} {
			if err := poll(ctx, 10*time.Second, side+" channel stops calling "+s.backend.Name(), func() bool {
				return time.Since(s.backend.LastCall(side)) >= nb.cfg.Quiet && time.Since(t0) >= nb.cfg.Quiet
			}); err != nil {
				return nil, err
			}
			lat[side] = append(lat[side], max(0, s.backend.LastCall(side).Sub(t0)))
		}
		nb.cfg.Logger.Debug("naming trial", "trial", k, "backend", s.backend.Name(),
			"beacon", lat[sideBeacon][k], "etcd", lat[sideEtcd][k])
		// The backend process comes back.
		if err := nb.register(ctx, s); err != nil {
			return nil, err
		}
	}
	return lat, nil
}

// revoke ends s's process: closing its registry revokes the lease of both
// its registrations at once.
func (nb *namingBench) revoke(_ context.Context, s *slot) error {
	return s.reg.Close()
}

// drain drains s's Beacon instance and, at the same moment, deletes its
// etcd endpoint. The instance is removed after the quiet period (the
// resolvers have long stopped calling it by then).
func (nb *namingBench) drain(ctx context.Context, s *slot) error {
	errs := make(chan error, 2)
	reg, inst, key := s.reg, s.inst, s.key
	go func() { errs <- nb.mgr.DeleteEndpoint(ctx, key) }()
	go func() {
		err := inst.Drain(ctx, registry.DrainGrace(nb.cfg.Quiet))
		errs <- errors.Join(err, reg.Close())
	}()
	return errors.Join(<-errs, <-errs)
}

type restartResult struct{ calls, failed int64 }

// rollingRestart restarts every backend in turn under load on one side.
func (nb *namingBench) rollingRestart(ctx context.Context, side string, drainFirst bool) (restartResult, error) {
	stop := nb.load(side)
	if err := nb.warm(ctx, side); err != nil {
		stop()
		return restartResult{}, err
	}
	calls0, failed0 := nb.calls[side].Load(), nb.failures[side].Load()
	var err error
	for _, s := range nb.slots {
		if err = nb.restart(ctx, side, s, drainFirst); err != nil {
			break
		}
		base := s.backend.CallsFrom(side)
		if err = poll(ctx, 10*time.Second, "new backend reached", func() bool { return s.backend.CallsFrom(side) > base }); err != nil {
			break
		}
	}
	stop()
	return restartResult{nb.calls[side].Load() - calls0, nb.failures[side].Load() - failed0}, err
}

// restart takes s out, stops its server hard and starts a new one.
func (nb *namingBench) restart(ctx context.Context, side string, s *slot, drainFirst bool) error {
	var err error
	switch {
	case drainFirst && side == sideBeacon:
		err = s.inst.Drain(ctx, registry.DrainGrace(nb.cfg.DrainGrace))
	case drainFirst:
		if err = nb.mgr.DeleteEndpoint(ctx, s.key); err == nil {
			select {
			case <-time.After(nb.cfg.DrainGrace):
			case <-ctx.Done():
				err = ctx.Err()
			}
		}
	}
	if err != nil {
		return err
	}
	s.backend.Stop()
	if err := s.reg.Close(); err != nil { // revokes the lease: gone from both formats
		return err
	}
	return nb.startBackend(ctx, s)
}

func mean(ds []time.Duration) time.Duration {
	if len(ds) == 0 {
		return 0
	}
	var sum time.Duration
	for _, d := range ds {
		sum += d
	}
	return sum / time.Duration(len(ds))
}
