package bench

import (
	"cmp"
	"context"
	"fmt"
	"os"
	"slices"
	"strings"
	"sync"
	"sync/atomic"
	"time"

	"github.com/beaconplane/beacon"
	"github.com/beaconplane/beacon/internal/lab/etcdproc"
	"github.com/beaconplane/beacon/registry"
	clientv3 "go.etcd.io/etcd/client/v3"
)

// clusterWatcher is one watcher of a service: which of the service's
// instances it has had (a bit per instance: instance Service + j×Services
// is bit j), and the delay from each registration's start to its arrival.
type clusterWatcher struct {
	service int
	seen    []atomic.Uint64
	count   atomic.Int64
	// lat (by load round) and latKill are the delays of the load's and
	// of the kill phase's instances: written by the watcher's goroutine
	// only, read once it ended.
	lat                    [][]time.Duration
	latKill                []time.Duration
	removed, stale, resync atomic.Int64
	settled                atomic.Int64 // the last settle whose sentinel it had (cluster_settle.go)
}

// watch opens the watchers, each past its (empty) snapshot: watcher w
// follows service w % Services through member (w / Services) % Members.
func (cb *clusterBench) watch(ctx context.Context) error {
	cfg := cb.cfg
	wctx, stop := context.WithCancel(ctx)
	cb.stop = stop
	per := (len(cb.starts) + cfg.Services - 1) / cfg.Services
	start := time.Now()
	for w := range cfg.Watchers {
		s := w % cfg.Services
		rw, err := cb.fronts[(w/cfg.Services)%len(cb.fronts)].Watch(wctx, beacon.Query{Namespace: clusterNamespace, Component: serviceName(s)})
		if err != nil {
			return fmt.Errorf("bench: watch %s: %w", serviceName(s), err)
		}
		if _, err := rw.Next(ctx); err != nil { // the (empty) snapshot
			_ = rw.Close()
			return fmt.Errorf("bench: watch %s: %w", serviceName(s), err)
		}
		cw := &clusterWatcher{service: s, seen: make([]atomic.Uint64, (per+63)/64)}
		cb.watchers = append(cb.watchers, cw)
		cb.follow.Go(func() {
			defer rw.Close()
			cw.follow(wctx, rw, cb)
		})
	}
	cb.log.Info("cluster: watchers open", "watchers", cfg.Watchers, "took", time.Since(start).Round(time.Millisecond))
	return nil
}

// follow records what rw delivers until ctx ends.
func (w *clusterWatcher) follow(ctx context.Context, rw registry.Watcher, cb *clusterBench) {
	for {
		b, err := rw.Next(ctx)
		if err != nil {
			return
		}
		now := time.Now().UnixNano()
		switch b.Kind {
		case registry.Stale:
			w.stale.Add(1)
		case registry.Resync:
			w.resync.Add(1)
		}
		for _, e := range b.Events {
			switch e.Type {
			case beacon.Added:
				i := sampleOf(e.Instance.ID)
				if gen, ok := cb.sentinel(i); ok {
					w.settled.Store(max(w.settled.Load(), int64(gen)))
					continue
				}
				w.added(i, now, cb)
			case beacon.Removed:
				if i := sampleOf(e.Instance.ID); i >= 0 && i < len(cb.starts) {
					w.removed.Add(1) // the ceiling's keys go when their lease is revoked
				}
			}
		}
		select {
		case cb.changed <- struct{}{}:
		default:
		}
	}
}

// added records instance i's arrival at now.
func (w *clusterWatcher) added(i int, now int64, cb *clusterBench) {
	if i < 0 || i >= len(cb.starts) || i%cb.cfg.Services != w.service {
		return // not the run's: never happens, and would count as nothing
	}
	j := i / cb.cfg.Services
	bit := uint64(1) << (j % 64)
	if w.seen[j/64].Or(bit)&bit != 0 {
		return // had it already (a resync after an outage lists it again)
	}
	w.count.Add(1)
	d := time.Duration(now - cb.starts[i].Load())
	if i < cb.cfg.Instances {
		r := cb.roundOf(i)
		if len(w.lat) <= r {
			w.lat = append(w.lat, make([][]time.Duration, r+1-len(w.lat))...)
		}
		w.lat[r] = append(w.lat[r], d)
	} else {
		w.latKill = append(w.latKill, d)
	}
}

// roundOf is the load round that registers instance i (of the first
// Instances).
func (cb *clusterBench) roundOf(i int) int {
	r := i * cb.cfg.Rounds / cb.cfg.Instances
	for r > 0 && i < r*cb.cfg.Instances/cb.cfg.Rounds {
		r--
	}
	for r+1 < cb.cfg.Rounds && i >= (r+1)*cb.cfg.Instances/cb.cfg.Rounds {
		r++
	}
	return r
}

// has reports whether w had instance i.
func (w *clusterWatcher) has(i int, services int) bool {
	j := i / services
	return w.seen[j/64].Load()&(uint64(1)<<(j%64)) != 0
}

// register registers instances [lo, hi) from the workers, instance i
// through session i % Sessions, and returns the time it took and the
// latencies of the registrations that succeeded. before, when set, runs
// before each registration; with tolerate a failed registration is marked
// (its instance is not expected by the watchers) and the others go on,
// else the first failure ends the run.
func (cb *clusterBench) register(ctx context.Context, lo, hi int, before func(i int), tolerate bool) (time.Duration, []time.Duration, error) {
	insts := make([]beacon.Instance, hi-lo)
	for k := range insts {
		insts[k] = cb.instance(lo + k) // before the clock starts
	}
	took, lat, err := run(ctx, hi-lo, cb.cfg.Workers, func(ctx context.Context, k int) error {
		i := lo + k
		if before != nil {
			before(i)
		}
		cb.starts[i].Store(time.Now().UnixNano())
		if _, err := cb.sessions[i%len(cb.sessions)].Register(ctx, insts[k]); err != nil {
			cb.failed[i].Store(true)
			if tolerate && ctx.Err() == nil {
				cb.log.Warn("cluster: registration failed", "instance", i, "err", err)
				return nil
			}
			return fmt.Errorf("bench: register instance %d: %w", i, err)
		}
		return nil
	})
	return took, slices.DeleteFunc(lat, func(d time.Duration) bool { return d == 0 }), err
}

// load registers the resident instances in rounds, each beside a round of
// etcd's ceiling for the same operation on the same cluster (sides
// alternating which goes first), and adds the rows.
func (cb *clusterBench) load(ctx context.Context, rep *Report) error {
	cfg := cb.cfg
	cli, err := rawClient(cb.eps)
	if err != nil {
		return err
	}
	defer cli.Close()
	rb := &registerBench{cfg: RegistryConfig{Logger: cfg.Logger}, tgt: &etcdTarget{endpoints: cb.eps}, raw: &rawRegistrar{cli: cli},
		ceilingKeys: cb.ceilingKeys}
	width, tried, err := rb.pickWidth(ctx, ceilingSameOp, cfg.Workers, func(ctx context.Context, width int) (float64, error) {
		r, err := rb.sameOpSide(ctx, "pick", cfg.Ceiling, cfg.Workers, width)
		return float64(cfg.Ceiling) / r.total.Seconds(), err
	})
	if err != nil {
		return err
	}
	var b, s registerFigures
	var cpu, settled time.Duration
	settle := func() error { // cluster_settle.go
		took, err := cb.settle(ctx, cli, 2*time.Minute)
		settled = max(settled, took)
		return err
	}
	ceiling := func(r int) error {
		res, err := rb.sameOpSide(ctx, fmt.Sprint("c", r), cfg.Ceiling, cfg.Workers, width)
		s.rate = append(s.rate, float64(cfg.Ceiling)/res.total.Seconds())
		s.p99 = append(s.p99, Ms(Percentile(res.lat, 99)))
		if err != nil {
			return err
		}
		return settle()
	}
	if err := settle(); err != nil {
		return err
	}
	for r := range cfg.Rounds {
		if r%2 == 1 {
			if err := ceiling(r); err != nil {
				return err
			}
		}
		lo, hi := r*cfg.Instances/cfg.Rounds, (r+1)*cfg.Instances/cfg.Rounds
		cb.log.Info("cluster: registering", "round", r, "from", lo, "to", hi)
		cpu0 := cb.membersCPU()
		took, lat, err := cb.register(ctx, lo, hi, nil, false)
		if err != nil {
			return err
		}
		cpu += cb.membersCPU() - cpu0
		if err := settle(); err != nil {
			return err
		}
		b.rate = append(b.rate, float64(hi-lo)/took.Seconds())
		b.p50 = append(b.p50, Ms(Percentile(lat, 50)))
		b.p99 = append(b.p99, Ms(Percentile(lat, 99)))
		if r%2 == 0 {
			if err := ceiling(r); err != nil {
				return err
			}
		}
	}
	cb.loadRows(rep, b, s, width, tried, cpu)
	rep.Note("each phase started once every watcher had had a sentinel written after the last phase (one instance per service, then revoked; the watchers took at most %v)", settled.Round(time.Millisecond))
	return nil
}

// loadRows adds the registration rows.
func (cb *clusterBench) loadRows(rep *Report, b, s registerFigures, width int, tried string, cpu time.Duration) {
	cfg := cb.cfg
	m := fmt.Sprintf("registrations/s, %d workers", cfg.Workers)
	rep.Add(Spread(Row{Metric: m, Unit: "ops/s", HigherIsBetter: true, Goal: 0.8, Against: ceilingSameOp}, b.rate, s.rate))
	rep.Add(Spread(Row{Metric: m, Unit: "ops/s", HigherIsBetter: true, Goal: 1, Against: nacosName}, b.rate, []float64{nacosRegistrations}))
	rep.Add(Spread(Row{Metric: "register p50", Unit: "ms", NoBaseline: true}, b.p50, nil))
	rep.Add(Spread(Row{Metric: "register p99", Unit: "ms", Goal: 1, Against: nacosName}, b.p99, []float64{nacosRegisterP99ms}))
	rep.Add(Spread(Row{Metric: fmt.Sprintf("register p99 vs %d-key same-op txn p99", width), Unit: "ms", Against: ceilingSameOp}, b.p99, s.p99))
	rep.Add(Row{Metric: "members' CPU per registration (all members)", Unit: "µs", Beacon: float64(cpu) / float64(time.Microsecond) / float64(cfg.Instances), NoBaseline: true})
	rep.Note("same-op ceiling: a compare-on-create and a put under one lease per key, from a raw client, %d keys per transaction (tried: %s); its rounds' keys are revoked after each, Beacon's stay resident", width, tried)
	rep.Note("the Nacos row compares with a published figure from other hardware (3 × 8 cores, 16 GB each); this run has all members, clients and watchers on one machine")
}

// ceilingKeys are the keys and values a same-op ceiling round writes:
// instances of the run's services, where Beacon's go (so that the members'
// watchers, the serve nodes' and this process's, deliver them as they do
// Beacon's), with IDs after every instance of the run, each round its own.
func (cb *clusterBench) ceilingKeys(round string, n int) (keys, vals []string) {
	cb.ceilingRounds++
	base := len(cb.starts) + cb.ceilingRounds*cb.cfg.Ceiling
	keys, vals = make([]string, n), make([]string, n)
	for k := range n {
		in := cb.instance(base + k)
		keys[k], vals[k] = beacon.ServicesDir+in.Ref().String(), rawValue(in)
	}
	return keys, vals
}

// membersCPU is the CPU time the running members have used.
func (cb *clusterBench) membersCPU() time.Duration {
	var d time.Duration
	for _, m := range cb.c.Members() {
		if pid := m.Pid(); pid != 0 {
			d += processCPU(pid)
		}
	}
	return d
}

// victim is the member --kill names.
func (cb *clusterBench) victim(ctx context.Context) (*etcdproc.Member, error) {
	lctx, cancel := context.WithTimeout(ctx, 30*time.Second)
	defer cancel()
	leader, err := cb.c.WaitLeader(lctx)
	if err != nil {
		return nil, err
	}
	if cb.cfg.Kill == KillLeader {
		return leader, nil
	}
	for _, m := range cb.c.Members() {
		if m != leader {
			return m, nil
		}
	}
	return nil, fmt.Errorf("bench: --kill follower: a 1-member cluster has no follower")
}

// killPhase registers KillInstances more instances and SIGKILLs the victim
// once a third of them have started; then waits for every watcher to have
// every instance that registered, and adds the rows.
func (cb *clusterBench) killPhase(ctx context.Context, rep *Report) error {
	cfg := cb.cfg
	victim, err := cb.victim(ctx)
	if err != nil {
		return err
	}
	lo, hi := cfg.Instances, cfg.Instances+cfg.KillInstances
	at := lo + cfg.KillInstances/3
	var kill sync.WaitGroup
	var killErr error
	cb.log.Info("cluster: registering while a member is killed", "member", victim.Name, "role", cfg.Kill, "instances", cfg.KillInstances)
	took, lat, err := cb.register(ctx, lo, hi, func(i int) {
		if i == at {
			kill.Go(func() { killErr = victim.Kill() })
		}
	}, true)
	kill.Wait()
	if err = cmp.Or(err, killErr); err != nil {
		return err
	}
	failed := 0
	for i := lo; i < hi; i++ {
		if cb.failed[i].Load() {
			failed++
		}
	}
	conv, missing := cb.converge(ctx, time.Minute)
	role := cfg.Kill
	rep.Add(Row{Metric: fmt.Sprintf("registrations/s while a %s is SIGKILLed", role), Unit: "ops/s", Beacon: float64(hi-lo) / took.Seconds(), NoBaseline: true})
	rep.Add(Row{Metric: fmt.Sprintf("register p99 while a %s is SIGKILLed", role), Unit: "ms", Beacon: Ms(Percentile(lat, 99)), NoBaseline: true})
	rep.Add(Row{Metric: fmt.Sprintf("registrations refused while a %s is SIGKILLed", role), Unit: "count", Beacon: float64(failed), NoBaseline: true})
	rep.Add(Row{Metric: "instances a watcher never had (goal 0)", Unit: "count", Beacon: float64(missing), NoBaseline: true})
	rep.Add(Row{Metric: "every watcher complete, after the last registration", Unit: "ms", Beacon: Ms(conv), NoBaseline: true})
	if missing > 0 {
		return fmt.Errorf("bench: after a %s was killed, watchers never had %d instances that registered (waited %v)", role, missing, conv.Round(time.Millisecond))
	}
	return nil
}

// converge waits (at most limit) until every watcher has every instance of
// its service that registered, and returns how long it waited and how
// many (watcher, instance) pairs are still missing.
func (cb *clusterBench) converge(ctx context.Context, limit time.Duration) (time.Duration, int) {
	start := time.Now()
	want := make([]int64, cb.cfg.Services)
	for i := range cb.starts {
		if cb.starts[i].Load() != 0 && !cb.failed[i].Load() {
			want[i%cb.cfg.Services]++
		}
	}
	deadline := time.NewTimer(limit)
	defer deadline.Stop()
	for {
		if cb.countsReached(want) {
			if missing := cb.missing(); missing == 0 {
				return time.Since(start), 0
			}
		}
		select {
		case <-cb.changed:
		case <-deadline.C:
			return time.Since(start), cb.missing()
		case <-ctx.Done():
			return time.Since(start), cb.missing()
		}
	}
}

// countsReached reports whether every watcher has had at least as many
// instances as want says its service has.
func (cb *clusterBench) countsReached(want []int64) bool {
	for _, w := range cb.watchers {
		if w.count.Load() < want[w.service] {
			return false
		}
	}
	return true
}

// missing counts the (watcher, instance) pairs of instances that
// registered and that the watcher has not had.
func (cb *clusterBench) missing() int {
	n := 0
	for _, w := range cb.watchers {
		for i := w.service; i < len(cb.starts); i += cb.cfg.Services {
			if cb.starts[i].Load() != 0 && !cb.failed[i].Load() && !w.has(i, cb.cfg.Services) {
				n++
			}
		}
	}
	return n
}

// resources stops the watchers and adds the delivery and resource rows:
// register → watcher latency, what the watchers saw besides additions,
// the instances resident in etcd and each process's memory.
func (cb *clusterBench) resources(ctx context.Context, rep *Report) {
	cfg := cb.cfg
	resident := cb.resident(ctx)
	rssSelf := processRSS(os.Getpid())
	cb.stop()
	cb.follow.Wait()
	var lat, latKill []time.Duration
	byRound := make([][]time.Duration, cfg.Rounds)
	var removed, stale, resync int64
	for _, w := range cb.watchers {
		for r, l := range w.lat {
			lat, byRound[r] = append(lat, l...), append(byRound[r], l...)
		}
		latKill = append(latKill, w.latKill...)
		removed, stale, resync = removed+w.removed.Load(), stale+w.stale.Load(), resync+w.resync.Load()
	}
	goal := Row{Unit: "ms", Goal: 1, Against: "goal"}
	for _, p := range []float64{50, 99} {
		row := goal
		row.Metric, row.Beacon, row.Baseline = fmt.Sprintf("register → watcher p%.0f (%d watchers)", p, cfg.Watchers), Ms(Percentile(lat, p)), clusterWatchGoalMs
		rep.Add(row)
	}
	var rounds []string
	for r, l := range byRound {
		rounds = append(rounds, fmt.Sprintf("%d: %.1f ms", r, Ms(Percentile(l, 99))))
	}
	rep.Note("register → watcher p99 by round (%s; a same-op ceiling round runs before the odd ones, after the even ones)", strings.Join(rounds, ", "))
	if len(latKill) > 0 {
		rep.Add(Row{Metric: "register → watcher p99 while a member is SIGKILLed", Unit: "ms", Beacon: Ms(Percentile(latKill, 99)), NoBaseline: true})
	}
	rep.Add(Row{Metric: "removals of live instances seen by watchers (goal 0)", Unit: "count", Beacon: float64(removed), NoBaseline: true})
	rep.Note("watchers: %d stale and %d resync batches in all (a watch that lost its member reports stale, then resyncs from another)", stale, resync)
	rep.Add(Row{Metric: "instances resident in etcd at the end", Unit: "count", Beacon: float64(resident), NoBaseline: true})
	for _, m := range cb.c.Members() {
		if pid := m.Pid(); pid != 0 {
			rep.Add(Row{Metric: fmt.Sprintf("member %s resident memory", m.Name), Unit: "MiB", Beacon: processRSS(pid) / (1 << 20), NoBaseline: true})
		}
	}
	rep.Add(Row{Metric: "this process (sessions and watchers) resident memory", Unit: "MiB", Beacon: rssSelf / (1 << 20), NoBaseline: true})
}

// resident counts the run's instances in etcd (-1 when it cannot).
func (cb *clusterBench) resident(ctx context.Context) int64 {
	cli, err := rawClient(cb.eps)
	if err != nil {
		return -1
	}
	defer cli.Close()
	cctx, cancel := context.WithTimeout(ctx, 30*time.Second)
	defer cancel()
	resp, err := cli.Get(cctx, beacon.ServicesDir+clusterNamespace+"/", clientv3.WithPrefix(), clientv3.WithCountOnly())
	if err != nil {
		cb.log.Warn("cluster: count the resident instances", "err", err)
		return -1
	}
	return resp.Count
}
