package bench

import (
	"context"
	"errors"
	"fmt"
	"log/slog"
	"net"
	"net/http"
	"os"
	"path/filepath"
	"slices"
	"strconv"
	"strings"
	"sync"
	"syscall"
	"time"

	"github.com/beaconplane/beacon"
	"github.com/beaconplane/beacon/internal/lab/freeport"
	"github.com/beaconplane/beacon/registry"
	"github.com/beaconplane/beacon/store/etcd"
	"google.golang.org/grpc"
	"google.golang.org/grpc/health"
	healthpb "google.golang.org/grpc/health/grpc_health_v1"
)

// HealthConfig configures the health scenario. Zero values take the
// defaults in brackets.
type HealthConfig struct {
	// BeaconCommand runs `beacon serve` in processes of their own: the
	// beacon binary (with "serve" and flags appended). Required.
	BeaconCommand []string
	// Nodes is the number of beacon serve processes sharing the checks [3].
	Nodes int
	// Instances is the number of checked instances [1,000].
	Instances int
	// Interval, Fall and Rise are every instance's check settings [1s, 3, 2].
	Interval   time.Duration
	Fall, Rise int
	// Trials is the number of instances turned NOT_SERVING and back, one
	// at a time, timed [20].
	Trials int
	// Window is the number of intervals over which probes are counted [5].
	Window int
	// Logger for progress; nil discards.
	Logger *slog.Logger
}

// MaxHealthInstances bounds Instances: each is a listener in this process.
const MaxHealthInstances = 20_000

// Validate checks the configuration.
func (c HealthConfig) Validate() error {
	if len(c.BeaconCommand) == 0 {
		return errors.New("bench: the health scenario needs the beacon binary (BeaconCommand) to run beacon serve")
	}
	if err := checkNotNegative(map[string]int{"nodes": c.Nodes, "instances": c.Instances, "fall": c.Fall, "rise": c.Rise, "trials": c.Trials, "window": c.Window},
		map[string]time.Duration{"interval": c.Interval}); err != nil {
		return err
	}
	if c.Instances > MaxHealthInstances {
		return fmt.Errorf("bench: --instances %d: at most %d (each is a listener of this process)", c.Instances, MaxHealthInstances)
	}
	if c.Instances > 0 && c.Trials+killedFailing > c.Instances {
		return fmt.Errorf("bench: --trials %d: at most --instances - %d (%d): each trial uses an instance of its own, and %d more fail while a checker is killed",
			c.Trials, killedFailing, c.Instances-killedFailing, killedFailing)
	}
	if c.Interval != 0 && (c.Interval < beacon.MinCheckInterval || c.Interval > beacon.MaxCheckInterval) {
		return fmt.Errorf("bench: --interval %v: must be %v..%v", c.Interval, beacon.MinCheckInterval, beacon.MaxCheckInterval)
	}
	return nil
}

func (c *HealthConfig) defaults() {
	setPositive(&c.Nodes, 3)
	setPositive(&c.Instances, 1000)
	setPositive(&c.Interval, time.Second)
	setPositive(&c.Fall, 3)
	setPositive(&c.Rise, 2)
	setPositive(&c.Trials, 20)
	setPositive(&c.Window, 5)
	setDefault(&c.Logger, discardLogger())
}

// RunHealth runs the health scenario: Nodes beacon serve processes over
// one etcd share the checks of Instances gRPC health services (one
// listener each, in this process); it counts the probes each instance
// receives per interval (goal: exactly one for the whole cluster), the
// checking nodes' CPU per 1,000 checks/s, and the time from a service
// turning NOT_SERVING to its instance leaving the registry's view (and
// back), against the bound fall × interval + 0.5 s.
func RunHealth(ctx context.Context, cfg HealthConfig) (*Report, error) {
	if err := cfg.Validate(); err != nil {
		return nil, err
	}
	cfg.defaults()
	etcdc, err := startLocalEtcd(ctx, 1, false)
	if err != nil {
		return nil, err
	}
	defer etcdc.Close()
	targets, err := startHealthTargets(cfg.Instances)
	if err != nil {
		return nil, err
	}
	defer targets.stop()
	nodes, err := startCheckers(ctx, cfg, etcdc.Endpoints())
	if err != nil {
		return nil, err
	}
	defer func() {
		for _, n := range nodes {
			n.stop()
		}
	}()
	hb, err := newHealthBench(ctx, cfg, etcdc.Endpoints(), targets)
	if err != nil {
		return nil, err
	}
	defer hb.close()
	if err := hb.registerAll(ctx); err != nil {
		return nil, err
	}
	r := &Report{
		Scenario:     "health",
		BaselineName: "goal",
		Setup: fmt.Sprintf("%d beacon serve processes over one etcd (in this process, no fsync); %d instances, each a gRPC health service on a listener of its own in this process, "+
			"checked every %v (fall %d, rise %d); %d trials", cfg.Nodes, cfg.Instances, cfg.Interval, cfg.Fall, cfg.Rise, cfg.Trials),
	}
	if err := hb.probeRate(ctx, r, nodes); err != nil {
		return nil, err
	}
	if err := hb.detection(ctx, r); err != nil {
		return nil, err
	}
	if cfg.Nodes > 1 {
		if err := hb.killChecker(ctx, r, nodes); err != nil {
			return nil, err
		}
	}
	return r, nil
}

// healthTargets is one gRPC server with the standard health service,
// listening on one port per instance; instance i is health service
// "i<i>", so that each instance has an address and a status of its own.
type healthTargets struct {
	srv    *grpc.Server
	hs     *health.Server
	addrs  []string
	mu     sync.Mutex
	checks map[string]int // Check calls per service
	wg     sync.WaitGroup
}

func targetService(i int) string { return "i" + strconv.Itoa(i) }

func startHealthTargets(n int) (*healthTargets, error) {
	t := &healthTargets{hs: health.NewServer(), checks: make(map[string]int, n)}
	t.srv = grpc.NewServer(grpc.UnaryInterceptor(t.count))
	healthpb.RegisterHealthServer(t.srv, t.hs)
	for i := range n {
		lis, err := net.Listen("tcp", "127.0.0.1:0")
		if err != nil {
			t.stop()
			return nil, fmt.Errorf("bench: listener %d of %d: %w", i+1, n, err)
		}
		t.addrs = append(t.addrs, lis.Addr().String())
		t.hs.SetServingStatus(targetService(i), healthpb.HealthCheckResponse_SERVING)
		t.wg.Go(func() { _ = t.srv.Serve(lis) })
	}
	return t, nil
}

func (t *healthTargets) count(ctx context.Context, req any, info *grpc.UnaryServerInfo, h grpc.UnaryHandler) (any, error) {
	if r, ok := req.(*healthpb.HealthCheckRequest); ok {
		t.mu.Lock()
		t.checks[r.GetService()]++
		t.mu.Unlock()
	}
	return h(ctx, req)
}

// snapshot returns the Check calls per service so far.
func (t *healthTargets) snapshot() map[string]int {
	t.mu.Lock()
	defer t.mu.Unlock()
	out := make(map[string]int, len(t.checks))
	for k, v := range t.checks {
		out[k] = v
	}
	return out
}

func (t *healthTargets) stop() {
	t.srv.Stop()
	t.wg.Wait()
}

// checkerNode is one beacon serve process checking its share.
type checkerNode struct {
	*proc
	id   string // its checker's ID
	http string
}

// startCheckers runs cfg.Nodes beacon serve processes in front of the etcd
// at eps, each with a checker of its own.
func startCheckers(ctx context.Context, cfg HealthConfig, eps []string) ([]*checkerNode, error) {
	var nodes []*checkerNode
	for i := range cfg.Nodes {
		port, err := freeport.Port()
		if err != nil {
			return nodes, err
		}
		dir, err := os.MkdirTemp("", "beacon-bench-health-")
		if err != nil {
			return nodes, err
		}
		addr := "127.0.0.1:" + strconv.Itoa(port)
		argv := append(append([]string{}, cfg.BeaconCommand...), "serve", "--data-dir", filepath.Join(dir, "data"),
			"--etcd-endpoints", eps[0], "--http-addr", addr, "--dns-addr=", "--xds-addr=",
			"--health-checker-id", "node"+strconv.Itoa(i+1), "--log-level", "warn")
		p, err := startProcReady(ctx, cfg.Logger, "beacon serve "+strconv.Itoa(i+1), addr, argv, dir, httpReady("http://"+addr+"/readyz"))
		if err != nil {
			_ = os.RemoveAll(dir)
			for _, n := range nodes {
				n.stop()
			}
			return nil, err
		}
		nodes = append(nodes, &checkerNode{proc: p, id: "node" + strconv.Itoa(i+1), http: "http://" + addr})
	}
	return nodes, nil
}

// healthBench registers the instances and watches them.
type healthBench struct {
	cfg     HealthConfig
	targets *healthTargets
	st      *etcd.Store
	reg     *registry.StoreRegistry
	w       registry.Watcher
	cancel  context.CancelFunc

	mu      sync.Mutex
	state   map[string]beacon.Instance // by service name (targetService)
	changed chan struct{}              // closed at the next change of state
}

func newHealthBench(ctx context.Context, cfg HealthConfig, eps []string, targets *healthTargets) (*healthBench, error) {
	st, err := etcd.Open(ctx, etcd.Config{Endpoints: eps})
	if err != nil {
		return nil, err
	}
	reg, err := registry.New(st, registry.Config{})
	if err != nil {
		_ = st.Close()
		return nil, err
	}
	return &healthBench{cfg: cfg, targets: targets, st: st, reg: reg, state: map[string]beacon.Instance{}, changed: make(chan struct{})}, nil
}

func (hb *healthBench) close() {
	if hb.cancel != nil {
		hb.cancel()
	}
	if hb.w != nil {
		_ = hb.w.Close()
	}
	_ = hb.reg.Close()
	_ = hb.st.Close()
}

// healthNS is the namespace the scenario registers in.
const healthNS = "bench-health"

// registerAll registers every instance with its check and follows them
// until each has a passing verdict.
func (hb *healthBench) registerAll(ctx context.Context) error {
	wctx, cancel := context.WithCancel(ctx)
	hb.cancel = cancel
	w, err := hb.reg.Watch(wctx, beacon.Query{Namespace: healthNS})
	if err != nil {
		return err
	}
	hb.w = w
	go hb.follow(wctx)
	for i, addr := range hb.targets.addrs {
		in := beacon.Instance{Namespace: healthNS, Component: "target", Endpoint: "grpc", Address: addr, Transport: "grpc",
			Metadata: map[string]string{"service": targetService(i)},
			Check:    &beacon.Check{Kind: beacon.CheckGRPC, Service: targetService(i), Interval: hb.cfg.Interval, Fall: hb.cfg.Fall, Rise: hb.cfg.Rise}}
		if _, err := hb.reg.Register(ctx, in); err != nil {
			return fmt.Errorf("bench: register instance %d: %w", i, err)
		}
	}
	hb.cfg.Logger.Info("health: registered; waiting for every verdict", "instances", len(hb.targets.addrs))
	limit := 30*time.Second + 3*hb.cfg.Interval
	return hb.waitFor(ctx, limit, "every instance passing", func(st map[string]beacon.Instance) bool {
		if len(st) < len(hb.targets.addrs) {
			return false
		}
		for _, in := range st {
			if in.Health == nil || in.Health.Status != beacon.HealthPassing {
				return false
			}
		}
		return true
	})
}

// follow keeps state current from the watch until ctx ends.
func (hb *healthBench) follow(ctx context.Context) {
	for {
		if _, err := hb.w.Next(ctx); err != nil {
			return
		}
		st := make(map[string]beacon.Instance)
		for _, in := range hb.w.Instances() {
			st[in.Metadata["service"]] = in
		}
		hb.mu.Lock()
		hb.state = st
		close(hb.changed)
		hb.changed = make(chan struct{})
		hb.mu.Unlock()
	}
}

// waitFor waits until cond holds for the current state, at most limit.
func (hb *healthBench) waitFor(ctx context.Context, limit time.Duration, what string, cond func(map[string]beacon.Instance) bool) error {
	deadline := time.NewTimer(limit)
	defer deadline.Stop()
	for {
		hb.mu.Lock()
		st, changed := hb.state, hb.changed
		hb.mu.Unlock()
		if cond(st) {
			return nil
		}
		select {
		case <-changed:
		case <-deadline.C:
			return fmt.Errorf("bench: health: %s not seen within %v", what, limit)
		case <-ctx.Done():
			return ctx.Err()
		}
	}
}

// probeRate counts the Check calls every instance receives over Window
// intervals, and the checking processes' CPU meanwhile.
func (hb *healthBench) probeRate(ctx context.Context, r *Report, nodes []*checkerNode) error {
	before, cpu0 := hb.targets.snapshot(), nodesCPU(nodes)
	span := time.Duration(hb.cfg.Window) * hb.cfg.Interval
	t0 := time.Now()
	select {
	case <-time.After(span):
	case <-ctx.Done():
		return ctx.Err()
	}
	elapsed, cpu := time.Since(t0), nodesCPU(nodes)-cpu0
	after := hb.targets.snapshot()
	total, lo, hi := 0, -1, 0
	for i := range hb.targets.addrs {
		n := after[targetService(i)] - before[targetService(i)]
		total += n
		if lo < 0 || n < lo {
			lo = n
		}
		hi = max(hi, n)
	}
	intervals := elapsed.Seconds() / hb.cfg.Interval.Seconds()
	perInstance := float64(total) / float64(len(hb.targets.addrs)) / intervals
	r.Add(Row{Metric: fmt.Sprintf("probes per instance per interval, %d nodes", len(nodes)), Unit: "probes",
		Beacon: perInstance, Baseline: 1, Against: "goal (1; intervals are jittered ±10 %)", Goal: 1.1})
	checksPerSec := float64(total) / elapsed.Seconds()
	if checksPerSec > 0 {
		r.Add(Row{Metric: "checking nodes' CPU per 1,000 checks/s (all nodes)", Unit: "cores",
			Beacon: cpu.Seconds() / elapsed.Seconds() / (checksPerSec / 1000), NoBaseline: true})
	}
	r.Note("probes: gRPC Check calls counted at the instances over %v (%.1f intervals): %d in all, per instance %d..%d; "+
		"each checker also holds one Watch stream per instance it owns (pushed changes, not counted)", elapsed.Round(time.Millisecond), intervals, total, lo, hi)
	return nil
}

// nodesCPU sums the CPU time the nodes have used.
func nodesCPU(nodes []*checkerNode) time.Duration {
	var d time.Duration
	for _, n := range nodes {
		d += n.cpu()
	}
	return d
}

// detection turns Trials instances NOT_SERVING one at a time and times
// how long until the registry's view takes each out, then SERVING until
// it is back.
func (hb *healthBench) detection(ctx context.Context, r *Report) error {
	var out, back []time.Duration
	limit := 10*time.Second + time.Duration(hb.cfg.Fall+hb.cfg.Rise)*hb.cfg.Interval
	for i := range hb.cfg.Trials {
		svc := targetService(i)
		t0 := time.Now()
		hb.targets.hs.SetServingStatus(svc, healthpb.HealthCheckResponse_NOT_SERVING)
		if err := hb.waitFor(ctx, limit, svc+" failing", func(st map[string]beacon.Instance) bool { return !st[svc].Serving() }); err != nil {
			return err
		}
		out = append(out, time.Since(t0))
		t1 := time.Now()
		hb.targets.hs.SetServingStatus(svc, healthpb.HealthCheckResponse_SERVING)
		if err := hb.waitFor(ctx, limit, svc+" passing again", func(st map[string]beacon.Instance) bool { return st[svc].Serving() }); err != nil {
			return err
		}
		back = append(back, time.Since(t1))
	}
	outBound := time.Duration(hb.cfg.Fall)*hb.cfg.Interval + 500*time.Millisecond
	backBound := time.Duration(hb.cfg.Rise)*hb.cfg.Interval + 500*time.Millisecond
	for _, p := range []float64{50, 99} {
		r.Add(Row{Metric: fmt.Sprintf("NOT_SERVING → out of the registry's view, p%.0f", p), Unit: "ms", Beacon: Ms(Percentile(out, p)),
			Baseline: Ms(outBound), Against: "bound (fall × interval + 0.5 s)", Goal: 1.0})
	}
	for _, p := range []float64{50, 99} {
		r.Add(Row{Metric: fmt.Sprintf("SERVING again → back in the view, p%.0f", p), Unit: "ms", Beacon: Ms(Percentile(back, p)),
			Baseline: Ms(backBound), Against: "bound (rise × interval + 0.5 s)", Goal: 1.0})
	}
	return nil
}

// serving describes which of svcs the view still has serving, and why.
func (hb *healthBench) serving(svcs []string) string {
	hb.mu.Lock()
	defer hb.mu.Unlock()
	var out []string
	for _, svc := range svcs {
		in, ok := hb.state[svc]
		switch {
		case !ok:
			out = append(out, svc+" (not in the view)")
		case in.Serving():
			h := "no verdict"
			if in.Health != nil {
				h = fmt.Sprintf("%s by %q", in.Health.Status, in.Health.Checker)
			}
			out = append(out, svc+" ("+h+")")
		}
	}
	if len(out) == 0 {
		return "none"
	}
	return strings.Join(out, ", ")
}

// nodesOutput is the last lines each node printed, for an error.
func nodesOutput(nodes []*checkerNode) string {
	var b strings.Builder
	for _, n := range nodes {
		fmt.Fprintf(&b, "; %s printed: %s", n.name, lastLines(n.out.String(), 20))
	}
	return b.String()
}

// httpReady returns a readiness test that GETs url and wants 200.
func httpReady(url string) func(context.Context) error {
	return func(ctx context.Context) error {
		req, err := http.NewRequestWithContext(ctx, http.MethodGet, url, nil)
		if err != nil {
			return err
		}
		resp, err := http.DefaultClient.Do(req)
		if err != nil {
			return err
		}
		_ = resp.Body.Close()
		if resp.StatusCode != http.StatusOK {
			return fmt.Errorf("GET %s: %s", url, resp.Status)
		}
		return nil
	}
}

// killedFailing is how many instances fail while a checker is killed, at
// most (see pickFailing).
const killedFailing = 10

// pickFailing chooses up to killedFailing of the instances not used by the
// detection trials to fail, taking from each checker's share (by the
// verdicts in st) fewer than half: a checker that sees more than half of
// its instances fail while its peers see few concludes that it, not they,
// is cut off (health/cutoff.go) and withholds its failing verdicts — the
// scenario measures a checker's death, not that. With 30 instances on two
// checkers, ten taken in order crossed that line on one checker about one
// run in ten, and the run timed out waiting for verdicts held back by
// design. Shares are taken in turn, so that every checker has some.
func pickFailing(st map[string]beacon.Instance, trials int) []string {
	owned := map[string]int{}
	candidates := map[string][]string{}
	var checkers []string
	for i := range len(st) {
		in, ok := st[targetService(i)]
		if !ok || in.Health == nil {
			continue
		}
		c := in.Health.Checker
		if owned[c] == 0 {
			checkers = append(checkers, c)
		}
		owned[c]++
		if i >= trials {
			candidates[c] = append(candidates[c], targetService(i))
		}
	}
	slices.Sort(checkers)
	var out []string
	taken := map[string]int{}
	for len(out) < killedFailing {
		before := len(out)
		for _, c := range checkers {
			if len(out) < killedFailing && 2*(taken[c]+1) < owned[c] && taken[c] < len(candidates[c]) {
				out = append(out, candidates[c][taken[c]])
				taken[c]++
			}
		}
		if len(out) == before {
			break
		}
	}
	return out
}

// killChecker turns up to killedFailing instances NOT_SERVING (pickFailing),
// kills (SIGKILL) the checker that marked the first of them, and times how
// long until its verdicts are gone with its lease (fail-open: those
// instances served again) and until the surviving checkers have marked
// them failing again; then it counts the probes per instance per interval
// again, with one node fewer.
func (hb *healthBench) killChecker(ctx context.Context, r *Report, nodes []*checkerNode) error {
	hb.mu.Lock()
	svcs := pickFailing(hb.state, hb.cfg.Trials)
	hb.mu.Unlock()
	if len(svcs) == 0 {
		return fmt.Errorf("bench: health: no checker owns enough instances to fail fewer than half of its share; run more --instances")
	}
	for _, svc := range svcs {
		hb.targets.hs.SetServingStatus(svc, healthpb.HealthCheckResponse_NOT_SERVING)
	}
	allFailing := func(st map[string]beacon.Instance) bool {
		for _, svc := range svcs {
			if st[svc].Serving() {
				return false
			}
		}
		return true
	}
	limit := 30*time.Second + time.Duration(hb.cfg.Fall)*hb.cfg.Interval
	if err := hb.waitFor(ctx, limit, "the instances failing", allFailing); err != nil {
		return fmt.Errorf("%w (still serving: %s)%s", err, hb.serving(svcs), nodesOutput(nodes))
	}
	hb.mu.Lock()
	victim := hb.state[svcs[0]].Health.Checker
	var marked []string // the victim's failing verdicts
	for _, svc := range svcs {
		if hb.state[svc].Health.Checker == victim {
			marked = append(marked, svc)
		}
	}
	hb.mu.Unlock()
	n := slices.IndexFunc(nodes, func(n *checkerNode) bool { return n.id == victim })
	if n < 0 {
		return fmt.Errorf("bench: health: the verdict names checker %q, not one of the nodes", victim)
	}
	t0 := time.Now()
	_ = nodes[n].cmd.Process.Signal(syscall.SIGKILL)
	gone := func(st map[string]beacon.Instance) bool {
		for _, svc := range marked {
			if h := st[svc].Health; h != nil && h.Checker == victim {
				return false
			}
		}
		return true
	}
	if err := hb.waitFor(ctx, limit+registry.DefaultLeaseTTL, "the killed checker's verdicts gone", gone); err != nil {
		return err
	}
	goneAfter := time.Since(t0)
	if err := hb.waitFor(ctx, limit+registry.DefaultLeaseTTL, "the instances failing again", allFailing); err != nil {
		return err
	}
	remarked := time.Since(t0)
	r.Add(Row{Metric: fmt.Sprintf("checker killed → its %d failing verdicts gone (fail-open)", len(marked)), Unit: "ms", Beacon: Ms(goneAfter),
		Baseline: Ms(registry.DefaultLeaseTTL + time.Second), Against: "bound (its lease TTL + 1 s)", Goal: 1.0})
	r.Add(Row{Metric: "checker killed → those instances marked failing again by the others", Unit: "ms", Beacon: Ms(remarked), NoBaseline: true})
	for _, svc := range svcs {
		hb.targets.hs.SetServingStatus(svc, healthpb.HealthCheckResponse_SERVING)
	}
	alive := slices.Delete(slices.Clone(nodes), n, n+1)
	return hb.probeRate(ctx, r, alive)
}
