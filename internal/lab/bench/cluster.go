package bench

import (
	"context"
	"errors"
	"fmt"
	"log/slog"
	"os"
	"os/exec"
	"slices"
	"strings"
	"sync"
	"sync/atomic"

	"github.com/beaconplane/beacon"
	"github.com/beaconplane/beacon/internal/lab/drill"
	"github.com/beaconplane/beacon/internal/lab/etcdproc"
	"github.com/beaconplane/beacon/registry"
	etcdstore "github.com/beaconplane/beacon/store/etcd"
)

// The cluster scenario: the registry at size on a cluster users would run —
// Members `beacon serve` processes (embedded etcd, fsync) in network
// namespaces of their own, joined by a discovery token — holding Instances
// resident instances registered by Sessions clients, followed by Watchers
// spread over every member (the fronts), while a member is SIGKILLed under
// load. Its peer in the same run is etcd's ceiling for the same operation
// on the same cluster (registry_sameop.go), measured between Beacon's
// rounds; its published reference is Nacos 2.0's registration figure
// (26,784/s, p99 30.62 ms, 3 × 8 cores, 1M instances).

// Kill choices of ClusterConfig.Kill.
const (
	KillFollower = "follower"
	KillLeader   = "leader"
	KillNone     = "none"
)

// Nacos 2.0.0's published registration figure (nacos.io, "Nacos 2.0 naming
// benchmark": 3 nodes × 8 cores, 16 GB; 5 load machines × 20 threads; 1M
// instances).
const (
	nacosRegistrations = 26_784.84
	nacosRegisterP99ms = 30.62
	nacosName          = "Nacos 2.0 published (3 × 8 cores)"
	clusterWatchGoalMs = 100
)

// ClusterConfig configures the cluster scenario. Zero values take the
// defaults in brackets.
type ClusterConfig struct {
	// Members is the cluster's size [3].
	Members int
	// Instances stay registered once the load is over [30,000]; Services
	// is the number of components they are spread over [Instances / 100].
	Instances, Services int
	// Sessions register them, each a client (its own etcd connection) and
	// a lease of its own, from Workers concurrent registrations in all
	// [10 sessions, 100 workers: Nacos's 5 machines × 20 threads].
	Sessions, Workers int
	// Watchers follow the services, spread evenly over the services and
	// the members [3 per service].
	Watchers int
	// Rounds splits the registrations, each round followed by a round of
	// the same-operation ceiling [4].
	Rounds int
	// Ceiling is the number of keys each ceiling round writes (and
	// revokes) [Instances / Rounds, at most 100,000].
	Ceiling int
	// Kill is the member SIGKILLed while KillInstances more registrations
	// run: KillFollower, KillLeader or KillNone [follower; Instances / 10].
	Kill          string
	KillInstances int
	// Network is DrillNetAuto, DrillNetNetns or DrillNetLoopback [auto].
	Network string
	// Dir keeps the members' data and logs ("": a temporary directory,
	// removed).
	Dir string
	// Self returns the command that runs this beacon binary with args (the
	// serve nodes). Required.
	Self func(args ...string) *exec.Cmd
	// Logger receives progress; nil discards.
	Logger *slog.Logger
}

// Largest sizes the scenario takes (before the memory plan, which is the
// real bound on a given machine).
const (
	maxClusterInstances = 10_000_000
	maxClusterSessions  = 1000
	maxClusterWorkers   = 10_000
	maxClusterMembers   = 7
)

// Validate checks the flags' values (sizes that fit the machine are
// checked when the run starts: see clusterPlan).
func (c ClusterConfig) Validate() error {
	if c.Self == nil {
		return errors.New("bench: the cluster scenario needs the beacon binary (Self) to run beacon serve")
	}
	if err := checkNotNegative(map[string]int{"members": c.Members, "instances": c.Instances, "services": c.Services, "sessions": c.Sessions,
		"workers": c.Workers, "watchers": c.Watchers, "rounds": c.Rounds, "ceiling": c.Ceiling, "kill-instances": c.KillInstances}, nil); err != nil {
		return err
	}
	d := c
	d.defaults()
	var errs []error
	if d.Members > maxClusterMembers || d.Members%2 == 0 {
		errs = append(errs, fmt.Errorf("--members %d: want an odd number up to %d (an even one adds a member and no fault tolerance)", d.Members, maxClusterMembers))
	}
	if d.Instances > maxClusterInstances {
		errs = append(errs, fmt.Errorf("--instances %d: at most %d", d.Instances, maxClusterInstances))
	}
	if d.Services > d.Instances {
		errs = append(errs, fmt.Errorf("--services %d: at most --instances (%d): a service without instances measures nothing", d.Services, d.Instances))
	}
	if d.Sessions > maxClusterSessions || d.Workers > maxClusterWorkers {
		errs = append(errs, fmt.Errorf("--sessions %d, --workers %d: at most %d and %d", d.Sessions, d.Workers, maxClusterSessions, maxClusterWorkers))
	}
	if d.Rounds > d.Instances {
		errs = append(errs, fmt.Errorf("--rounds %d: at most --instances (%d)", d.Rounds, d.Instances))
	}
	if d.Watchers > 100*d.Services {
		errs = append(errs, fmt.Errorf("--watchers %d: at most 100 per service (--services %d)", d.Watchers, d.Services))
	}
	switch d.Kill {
	case KillFollower, KillLeader, KillNone:
	default:
		errs = append(errs, fmt.Errorf("--kill %q: want follower, leader or none", d.Kill))
	}
	switch d.Network {
	case DrillNetAuto, DrillNetNetns, DrillNetLoopback:
	default:
		errs = append(errs, fmt.Errorf("--net %q: want auto, netns or loopback", d.Network))
	}
	if c.Dir != "" {
		if err := dirUsable(c.Dir); err != nil {
			errs = append(errs, fmt.Errorf("--dir %q: %w", c.Dir, err))
		}
	}
	return errors.Join(errs...)
}

func (c *ClusterConfig) defaults() {
	setPositive(&c.Members, 3)
	setPositive(&c.Instances, 30_000)
	setPositive(&c.Services, max(1, c.Instances/100))
	setPositive(&c.Sessions, 10)
	setPositive(&c.Workers, 100)
	setPositive(&c.Watchers, 3*c.Services)
	setPositive(&c.Rounds, 4)
	setPositive(&c.Ceiling, min(100_000, max(1, c.Instances/c.Rounds)))
	setDefault(&c.Kill, KillFollower)
	if c.KillInstances <= 0 && c.Kill != KillNone {
		c.KillInstances = max(1, c.Instances/10)
	}
	setDefault(&c.Network, DrillNetAuto)
	setDefault(&c.Logger, discardLogger())
}

// The memory a cluster run takes per instance, every process of the run on
// this machine included, from the resident memory the run reports
// (2026-12-03, `beacon bench cluster --instances 200000 --watchers 6000`:
// members 1,408–1,424 MiB and this process 4,066 MiB for 220,000
// instances, three watchers per service). Per member: etcd's copy, its
// indexes and WAL, and each serve node's registry view (its health checker
// and dashboard follow every instance). In this process: the session's
// registration, and a view of the instance in each front's client and
// each watcher of its service, with the watch streams' buffers and the
// collector's headroom shared out over them. A start of 1,000,000
// instances with 30,000 watchers on an earlier, lower plan grew this
// process to 7.8 GB before the first registration.
const (
	costClusterMemberInstance = 6656
	costClusterInstance       = 4 << 10
	costClusterWatcherCopy    = 2560
)

// clusterPlan refuses sizes that do not fit this machine's memory.
func (c ClusterConfig) clusterPlan() error {
	perWatcher := (c.Watchers + c.Services - 1) / c.Services
	per := int64(c.Members*costClusterMemberInstance+costClusterInstance) + int64(c.Members+perWatcher)*costClusterWatcherCopy
	return fits(
		memNeed{"--instances", c.Instances, per, "instances resident in every member and followed by the watchers"},
		memNeed{"--kill-instances", c.KillInstances, per, "instances registered while a member is killed"},
		memNeed{"--ceiling", c.Ceiling, int64(c.Members) * costEtcdInstance, "keys of a same-op ceiling round in every member"})
}

// RunCluster runs the cluster scenario. Every process, namespace and
// directory it made is removed when it returns, also after an error or an
// interrupt.
func RunCluster(ctx context.Context, cfg ClusterConfig) (*Report, error) {
	if err := cfg.Validate(); err != nil {
		return nil, err
	}
	cfg.defaults()
	if err := cfg.clusterPlan(); err != nil {
		return nil, err
	}
	cb := &clusterBench{cfg: cfg, log: cfg.Logger}
	defer cb.close()
	if err := cb.start(ctx); err != nil {
		return nil, err
	}
	rep := &Report{Scenario: "cluster", Setup: cb.setup()}
	if err := cb.load(ctx, rep); err != nil {
		return rep, err
	}
	if cfg.Kill != KillNone {
		if err := cb.killPhase(ctx, rep); err != nil {
			return rep, err
		}
	}
	cb.resources(ctx, rep)
	return rep, nil
}

// clusterBench is one run of the cluster scenario.
type clusterBench struct {
	cfg     ClusterConfig
	log     *slog.Logger
	dir     string // removed at close unless cfg.Dir
	c       *etcdproc.Cluster
	network string
	eps     []string

	stores   []*etcdstore.Store
	sessions []registry.Registry
	fronts   []registry.Registry
	watchers []*clusterWatcher
	follow   sync.WaitGroup // the watchers' goroutines
	stop     context.CancelFunc
	changed  chan struct{} // a watcher saw something (buffer 1)

	// starts holds, per instance, when its registration was asked for
	// (unix nanoseconds; 0: not yet); failed marks those whose Register
	// returned an error.
	starts []atomic.Int64
	failed []atomic.Bool
	// ceilingRounds counts the same-op ceiling's rounds (their keys),
	// settles the sentinels written between phases (cluster_settle.go).
	ceilingRounds, settles int
}

// start starts the cluster, the sessions and the watchers.
func (cb *clusterBench) start(ctx context.Context) error {
	cfg := cb.cfg
	nw, err := clusterNetwork(cfg.Network)
	if err != nil {
		return err
	}
	cb.network = "loopback"
	if nw.IsNetns() {
		cb.network = "network namespaces"
	}
	cb.dir = cfg.Dir
	if cb.dir == "" {
		if cb.dir, err = os.MkdirTemp("", "beacon-cluster-"); err != nil {
			nw.Close()
			return err
		}
	}
	cb.log.Info("cluster: starting members", "members", cfg.Members, "network", cb.network)
	if cb.c, err = etcdproc.StartCluster(ctx, &drill.ServeNodes{Beacon: cfg.Self}, nw, cfg.Members, cb.dir); err != nil {
		nw.Close()
		return fmt.Errorf("bench: start the cluster: %w", err)
	}
	cb.eps = cb.c.Endpoints()
	for _, m := range cb.c.Members() {
		cb.log.Info("started", "process", m.Name, "pid", m.Pid())
	}
	cb.log.Info("cluster: members started", "namespaces", strings.Join(nw.Namespaces(), ","))
	total := cfg.Instances + cfg.KillInstances
	cb.starts, cb.failed = make([]atomic.Int64, total), make([]atomic.Bool, total)
	cb.changed = make(chan struct{}, 1)
	for s := range cfg.Sessions {
		reg, err := cb.registry(ctx, s)
		if err != nil {
			return err
		}
		cb.sessions = append(cb.sessions, reg)
	}
	for f := range cfg.Members {
		reg, err := cb.registry(ctx, f)
		if err != nil {
			return err
		}
		cb.fronts = append(cb.fronts, reg)
	}
	return cb.watch(ctx)
}

// clusterNetwork is the network of --net.
func clusterNetwork(choice string) (*etcdproc.Network, error) {
	switch choice {
	case DrillNetLoopback:
		return etcdproc.Loopback(), nil
	case DrillNetNetns:
		return etcdproc.Netns()
	}
	if nw, err := etcdproc.Netns(); err == nil {
		return nw, nil
	}
	return etcdproc.Loopback(), nil
}

// registry opens a client of its own, member i's endpoint first (the
// others for failover), and a registry on it.
func (cb *clusterBench) registry(ctx context.Context, i int) (registry.Registry, error) {
	eps := slices.Concat(cb.eps[i%len(cb.eps):], cb.eps[:i%len(cb.eps)])
	st, err := etcdstore.Open(ctx, etcdstore.Config{Endpoints: eps})
	if err != nil {
		return nil, fmt.Errorf("bench: open a client of the cluster: %w", err)
	}
	cb.stores = append(cb.stores, st)
	return registry.New(st, registry.Config{Logger: cb.log})
}

func (cb *clusterBench) setup() string {
	cfg := cb.cfg
	return fmt.Sprintf("%d beacon serve members (embedded etcd 3.7, fsync) on %s, joined by a discovery token; %d instances over %d services "+
		"registered by %d sessions (a client and a lease each) from %d workers in %d rounds; %d watchers, one per service and member "+
		"in turn, in this process; same-op ceiling rounds of %d keys between Beacon's; SIGKILL: %s during %d more registrations",
		cfg.Members, cb.network, cfg.Instances, cfg.Services, cfg.Sessions, cfg.Workers, cfg.Rounds, cfg.Watchers, cfg.Ceiling, cfg.Kill, cfg.KillInstances)
}

// close stops the watchers, closes the sessions (revoking their leases)
// and the clients, and removes the cluster and its data.
func (cb *clusterBench) close() {
	if cb.stop != nil {
		cb.stop()
	}
	cb.follow.Wait()
	for _, r := range slices.Concat(cb.sessions, cb.fronts) {
		_ = r.Close()
	}
	for _, st := range cb.stores {
		_ = st.Close()
	}
	if cb.c != nil {
		cb.c.Close()
	}
	if cb.cfg.Dir == "" && cb.dir != "" {
		_ = os.RemoveAll(cb.dir)
	}
}

// serviceName is the component of service s.
func serviceName(s int) string { return fmt.Sprintf("svc%05d", s) }

// clusterNamespace is where the scenario registers.
const clusterNamespace = "bench"

// instance is instance i of the run: in service i % Services.
func (cb *clusterBench) instance(i int) beacon.Instance {
	return benchInstance(clusterNamespace, serviceName(i%cb.cfg.Services), i)
}
