package health

import (
	"cmp"
	"context"
	"errors"
	"fmt"
	"log/slog"
	"sync"
	"sync/atomic"
	"time"
	"unicode/utf8"

	"github.com/beaconplane/beacon"
	"github.com/beaconplane/beacon/internal/wait"
	"github.com/beaconplane/beacon/registry"
	"github.com/beaconplane/beacon/store"
	"github.com/prometheus/client_golang/prometheus"
)

// DefaultPeerInterval is how often a checker assesses whether it is cut
// off, when Config.PeerInterval is zero.
const DefaultPeerInterval = 10 * time.Second

// MaxCheckerIDLength bounds a checker's ID.
const MaxCheckerIDLength = 253

// ErrInvalidConfig matches every refused Config.
var ErrInvalidConfig = errors.New("health: invalid checker configuration")

// Config configures a Checker.
type Config struct {
	// ID names the checker in its verdicts (beacon.Health.Checker) and in
	// the sharing of instances: 1 to MaxCheckerIDLength letters, digits,
	// '.', '-' or '_' (a host name fits). One live checker per ID.
	// Required.
	ID string
	// Addr is where the other checkers reach this one (host:port, the
	// server's HTTP address): its registration's address, to which peers
	// connect to tell their own outage from the instances'. Required.
	Addr string
	// Registry is what the checker registers itself through (its
	// session), and whose instances it checks. Required. Its key layout
	// is the one of its Keyspace method (registry.StoreRegistry has it),
	// else the default one.
	Registry registry.Registry
	// Store is the store behind Registry: verdicts are written to it, TTL
	// reports read from it. Required, unless Registry keeps verdicts
	// itself (registry.VerdictKeeper: the Kubernetes registry), whose
	// VerdictSink then holds them; there, TTL checks have no reports to
	// read: they are not run (unknown, served), with a warning.
	Store store.Store
	// LeaseTTL is the TTL of the lease the checker's verdicts are bound
	// to. Zero means the registry's session TTL (its LeaseTTL method),
	// else registry.DefaultLeaseTTL; otherwise within [1 s, 1 h].
	LeaseTTL time.Duration
	// PeerInterval is how often the checker assesses whether it is cut
	// off: a TCP connect to its peers, and, while more than half of its
	// instances fail, a comparison with its peers' failing shares. Zero
	// means DefaultPeerInterval.
	PeerInterval time.Duration
	// Prober probes the instances; nil uses a zero Prober.
	Prober *Prober
	// Jitter is every Runner's Jitter; nil uses math/rand/v2.
	Jitter func() float64
	// Logger receives the checker's logs; nil discards them.
	Logger *slog.Logger
	// Metrics registers the checker's Prometheus collectors; nil means no
	// metrics.
	Metrics prometheus.Registerer
}

// Validate reports what is wrong with c, naming the field.
func (c Config) Validate() error {
	var errs []error
	if err := ValidateCheckerID(c.ID); err != nil {
		errs = append(errs, fmt.Errorf("%w: Config.ID: %w", ErrInvalidConfig, err))
	}
	if err := beacon.ValidateAddress(c.Addr); err != nil {
		errs = append(errs, fmt.Errorf("%w: Config.Addr: %w", ErrInvalidConfig, err))
	}
	_, keeps := c.Registry.(registry.VerdictKeeper)
	switch {
	case c.Registry == nil:
		errs = append(errs, fmt.Errorf("%w: Config.Registry is required", ErrInvalidConfig))
	case c.Store == nil && !keeps:
		errs = append(errs, fmt.Errorf("%w: Config.Store is required: the registry (%T) does not keep verdicts itself "+
			"(registry.VerdictKeeper), so they are written to the store behind it", ErrInvalidConfig, c.Registry))
	}
	if c.LeaseTTL != 0 {
		if err := registry.ValidateTTL(c.LeaseTTL); err != nil {
			errs = append(errs, fmt.Errorf("%w: Config.LeaseTTL: %w", ErrInvalidConfig, err))
		}
	}
	if c.PeerInterval < 0 {
		errs = append(errs, fmt.Errorf("%w: Config.PeerInterval %v: must not be negative (0 for %v)", ErrInvalidConfig, c.PeerInterval, DefaultPeerInterval))
	}
	return errors.Join(errs...)
}

// ValidateCheckerID reports what is wrong with a checker's ID: 1 to
// MaxCheckerIDLength letters, digits, '-', '_' or '.'.
func ValidateCheckerID(id string) error {
	if id == "" || len(id) > MaxCheckerIDLength {
		return fmt.Errorf("checker ID %q: must be 1 to %d characters (the host name is a good one)", id, MaxCheckerIDLength)
	}
	for _, r := range id {
		if !(r >= 'a' && r <= 'z' || r >= 'A' && r <= 'Z' || r >= '0' && r <= '9' || r == '-' || r == '_' || r == '.') {
			return fmt.Errorf("checker ID %q: use letters, digits, '-', '_' or '.'", id)
		}
	}
	return nil
}

// withDefaults fills the zero fields.
func (c Config) withDefaults() Config {
	if c.LeaseTTL == 0 {
		c.LeaseTTL = registry.DefaultLeaseTTL
		if r, ok := c.Registry.(interface{ LeaseTTL() time.Duration }); ok && r.LeaseTTL() > 0 {
			c.LeaseTTL = r.LeaseTTL()
		}
	}
	c.PeerInterval = cmp.Or(c.PeerInterval, DefaultPeerInterval)
	if c.Prober == nil {
		c.Prober = &Prober{}
	}
	c.Logger = cmp.Or(c.Logger, slog.New(slog.DiscardHandler))
	return c
}

// Checker checks the instances that declare a Check, sharing them with
// the other checkers of the cluster: see the package documentation.
// Create it with New, run it with Start, stop it with Close.
//
// Its goroutines, each owned by the Checker (Close ends and waits for
// them): the watch of the registry (follow), the registration of the
// checker (registerSelf), one per owned instance (its Runner), the
// assessment of its own standing (cutoff.go), and the verdict writer's
// keeper and workers (writer.go).
type Checker struct {
	cfg    Config
	log    *slog.Logger
	m      *metrics
	ks     beacon.Keyspace
	writer *verdictWriter
	cut    *cutoffDetector // used by the assessment goroutine only
	// assessed, when set (tests), is called after each assessment.
	assessed func(assessment, linkState)

	ctx       context.Context // ended by Close
	cancel    context.CancelFunc
	wg        sync.WaitGroup
	started   atomic.Bool
	closeOnce sync.Once

	// The standing (cutoff.go): how many owned instances' latest result or
	// verdict is a failure, how many are owned, whether a Runner turned
	// Failing since the last assessment, and the wake-up of the
	// assessment goroutine.
	doubtful, owned atomic.Int64
	turnedFailing   atomic.Bool
	kick            chan struct{}
	suspect         bool // published in its registration (assessment goroutine only)

	// Lock order: Checker.mu before running.mu before verdictWriter.mu.
	mu      sync.Mutex
	fleet   *fleet
	runners map[beacon.Ref]*running
	reg     registry.Registration // nil until registered
}

// running is the Runner of one owned instance.
type running struct {
	target  target
	cancel  context.CancelFunc
	failing atomic.Bool // its latest verdict is Failing

	mu      sync.Mutex
	doubt   bool // counted in Checker.doubtful: its latest result or verdict is a failure
	stopped bool // no longer counted
}

// New checks cfg and returns a Checker that is not yet running.
func New(cfg Config) (*Checker, error) {
	if err := cfg.Validate(); err != nil {
		return nil, err
	}
	cfg = cfg.withDefaults()
	m, err := newMetrics(cfg.Metrics)
	if err != nil {
		return nil, fmt.Errorf("%w: metrics: %w", ErrInvalidConfig, err)
	}
	var ks beacon.Keyspace
	if r, ok := cfg.Registry.(interface{ Keyspace() beacon.Keyspace }); ok {
		ks = r.Keyspace()
	}
	log := cfg.Logger.With("component", "health-checker", "checker", cfg.ID)
	back, err := verdictsOf(cfg, ks)
	if err != nil {
		return nil, err
	}
	c := &Checker{cfg: cfg, log: log, m: m, ks: ks, fleet: newFleet(cfg.ID), runners: map[beacon.Ref]*running{},
		kick: make(chan struct{}, 1)}
	c.writer = newVerdictWriter(back, cfg.LeaseTTL, log)
	c.cut = &cutoffDetector{w: c.writer, gauge: m.cutOff, log: log}
	c.ctx, c.cancel = context.WithCancel(context.Background())
	return c, nil
}

// verdictsOf chooses where the checker keeps its verdicts: the sink of a
// registry that keeps them itself, else the store.
func verdictsOf(cfg Config, ks beacon.Keyspace) (verdictBackend, error) {
	if k, ok := cfg.Registry.(registry.VerdictKeeper); ok {
		sink, err := k.VerdictSink(cfg.ID)
		if err != nil {
			return nil, fmt.Errorf("%w: Config.Registry: %w", ErrInvalidConfig, err)
		}
		return &sinkVerdicts{sink: sink}, nil
	}
	return &storeVerdicts{st: cfg.Store, ks: ks, id: cfg.ID}, nil
}

// ID returns the checker's ID.
func (c *Checker) ID() string { return c.cfg.ID }

// Start starts the checker's goroutines and returns at once: it
// registers itself, follows the registry, and checks its share of the
// instances, retrying what fails (the store may be down) until Close.
func (c *Checker) Start() error {
	if !c.started.CompareAndSwap(false, true) {
		return errors.New("health: checker already started")
	}
	if c.ctx.Err() != nil {
		return errors.New("health: checker closed")
	}
	w, err := c.cfg.Registry.Watch(c.ctx, beacon.Query{})
	if err != nil {
		return fmt.Errorf("health: watch the registry: %w", err)
	}
	c.spawn(func() { c.follow(w) })
	c.spawn(c.registerSelf)
	c.spawn(func() { c.writer.keep(c.ctx) })
	for range writeWorkers {
		c.spawn(func() { c.writer.work(c.ctx) })
	}
	c.spawn(c.stand)
	return nil
}

func (c *Checker) spawn(fn func()) {
	c.wg.Add(1)
	go func() {
		defer c.wg.Done()
		fn()
	}()
}

// Close stops every Runner, deregisters the checker (its peers take its
// instances over at once) and revokes its verdict lease (its verdicts go:
// fail-open). It is idempotent, and bounded by twice the lease TTL (the
// deregistration, then the revocation).
func (c *Checker) Close() error {
	c.closeOnce.Do(func() {
		c.cancel()
		c.wg.Wait()
		c.m.owned.Set(0)
		c.mu.Lock()
		reg := c.reg
		c.mu.Unlock()
		if reg != nil {
			_ = reg.Close()
		}
		c.writer.revoke()
	})
	return nil
}

// follow applies the registry's watch until the checker closes.
func (c *Checker) follow(w registry.Watcher) {
	defer func() { _ = w.Close() }()
	for {
		b, err := w.Next(c.ctx)
		if err != nil {
			if c.ctx.Err() == nil {
				c.log.Error("the registry watch ended: the checker keeps its last view of the instances", "err", err)
			}
			return
		}
		if b.Kind == registry.Stale {
			continue
		}
		c.mu.Lock()
		touched, membersChanged := c.fleet.apply(b)
		if membersChanged {
			c.reshareAllLocked()
		} else {
			c.reshareLocked(touched)
		}
		suspects := c.fleet.suspectsChanged
		c.fleet.suspectsChanged = false
		c.mu.Unlock()
		if suspects {
			c.wake()
		}
	}
}

// registerSelf registers the checker, retrying until it succeeds or the
// checker closes.
func (c *Checker) registerSelf() {
	ref := c.fleet.selfRef
	in := beacon.Instance{Namespace: ref.Namespace, Component: ref.Component, Endpoint: ref.Endpoint, ID: ref.ID,
		Address: c.cfg.Addr, Transport: "http", Metadata: map[string]string{CheckerIDMetadata: c.cfg.ID}}
	warned := false
	for {
		reg, err := c.cfg.Registry.Register(c.ctx, in)
		if err == nil {
			c.mu.Lock()
			c.reg, c.fleet.registered = reg, true
			c.reshareAllLocked()
			c.mu.Unlock()
			return
		}
		if c.ctx.Err() != nil {
			return
		}
		switch {
		case warned:
		case errors.Is(err, beacon.ErrAlreadyRegistered):
			c.log.Warn("another live health checker has this checker's ID (or this one's previous run, until its lease ends); "+
				"retrying (it checks nothing until it is registered): give each checker its own ID", "instance", ref.String(), "err", err)
		default:
			c.log.Warn("cannot register the health checker; retrying (it checks nothing until it is registered)", "instance", ref.String(), "err", err)
		}
		warned = true
		if !wait.Sleep(c.ctx, c.cfg.LeaseTTL/3) {
			return
		}
	}
}

// reshareAllLocked re-decides the owner of every instance, after the
// checkers changed.
func (c *Checker) reshareAllLocked() {
	refs := make([]beacon.Ref, 0, len(c.fleet.checked)+len(c.runners))
	for ref := range c.fleet.checked {
		refs = append(refs, ref)
	}
	for ref := range c.runners {
		refs = append(refs, ref)
	}
	c.reshareLocked(refs)
}

// reshareLocked re-decides the owner of the instances at refs: a Runner
// for each this checker owns (a new one when its check or address
// changed), none for the others. An instance another checker owns keeps
// the verdict this one wrote until the new owner writes its own; the
// verdict of an instance gone or no longer checked is deleted.
func (c *Checker) reshareLocked(refs []beacon.Ref) {
	for _, ref := range refs {
		t, own := c.fleet.owned(ref)
		rn := c.runners[ref]
		if rn != nil && (!own || rn.target != t) {
			rn.cancel()
			c.uncount(rn)
			delete(c.runners, ref)
			rn = nil
		}
		_, checked := c.fleet.checked[ref]
		switch {
		case own && rn == nil:
			c.startLocked(ref, t)
		case !checked:
			c.writer.gone(ref)
		case !own && c.writer.back.perChecker() && c.superseded(ref):
			c.writer.drop(ref)
		case !own:
			c.writer.disown(ref)
		}
	}
	c.m.owned.Set(float64(len(c.runners)))
	c.owned.Store(int64(len(c.runners)))
}

// superseded reports whether the registry's view shows another checker's
// verdict on the instance at ref (its new owner's).
func (c *Checker) superseded(ref beacon.Ref) bool {
	h, ok := c.fleet.verdicts[ref]
	return ok && h.Checker != "" && h.Checker != c.cfg.ID
}

// startLocked starts the Runner of an instance this checker now owns.
func (c *Checker) startLocked(ref beacon.Ref, t target) {
	ctx, cancel := context.WithCancel(c.ctx)
	rn := &running{target: t, cancel: cancel}
	c.runners[ref] = rn
	token := c.writer.own(ref)
	kind := t.check.Kind
	r := &Runner{Check: t.check, Addr: t.addr, Prober: c.cfg.Prober, Jitter: c.cfg.Jitter,
		OnProbe: func(result error, took time.Duration) { c.m.probe(kind, result, took) }}
	r.OnResult = func(result error) { c.count(rn, result != nil) }
	r.OnChange = func(s Status, reason error) {
		rn.failing.Store(s == Failing)
		if s == Failing {
			c.turnedFailing.Store(true)
			c.wake()
		}
		c.m.changes.WithLabelValues(string(s)).Inc()
		h := beacon.Health{Status: beacon.HealthStatus(s), Since: time.Now().UTC(), Checker: c.cfg.ID}
		if reason != nil && s == Failing {
			h.Reason = shortReason(reason.Error())
		}
		c.writer.set(ref, token, h)
	}
	if kind == beacon.CheckTTL {
		r.Refresh = c.reportReader(ref, r)
	}
	c.spawn(func() { _ = r.Run(ctx) })
}

// MaxReasonBytes bounds the reason of a verdict: a probe's error may
// carry what the probed server said, of any length.
const MaxReasonBytes = 1 << 10

// shortReason is reason cut to MaxReasonBytes (at a character boundary,
// ending with "…").
func shortReason(reason string) string {
	if len(reason) <= MaxReasonBytes {
		return reason
	}
	cut := MaxReasonBytes - len("…")
	for cut > 0 && !utf8.RuneStart(reason[cut]) {
		cut--
	}
	return reason[:cut] + "…"
}

// errNoReports is why a TTL check over a registry without a store is not
// run (its interval skipped, so it stays unknown): there is nowhere its
// service could report (registry/kube refuses TTL checks; one that
// reaches a checker anyway was written by hand).
var errNoReports = errors.New("a TTL check needs a store to report to, and this registry has none: " +
	"declare a grpc, http or tcp check instead (on Kubernetes, an exec readinessProbe does what a TTL check does)")

// reportReader is a TTL check's Refresh: it reads the instance's report
// key and calls r.Report when it was written since the last read.
func (c *Checker) reportReader(ref beacon.Ref, r *Runner) func(context.Context) error {
	key := registry.ReportKey(c.ks, ref)
	var last int64
	warned := false
	return func(ctx context.Context) error {
		if c.cfg.Store == nil {
			if !warned {
				warned = true
				c.log.Warn("cannot run a TTL check: its instance stays unknown (served)", "instance", ref.String(), "err", errNoReports)
			}
			return errNoReports
		}
		ctx, cancel := context.WithTimeout(ctx, c.writer.callTimeout())
		defer cancel()
		kv, err := c.cfg.Store.Get(ctx, key)
		switch {
		case errors.Is(err, store.ErrNotFound):
			return nil
		case err != nil:
			return err
		case kv.ModRevision > last:
			last = kv.ModRevision
			r.Report()
		}
		return nil
	}
}
