package health

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"log/slog"
	"net"
	"net/http"
	"slices"
	"strings"
	"sync"
	"sync/atomic"
	"testing"
	"time"
	"unicode/utf8"

	"github.com/beaconplane/beacon"
	"github.com/beaconplane/beacon/internal/testkit/etcdtest"
	"github.com/beaconplane/beacon/registry"
	"github.com/beaconplane/beacon/store"
	"github.com/beaconplane/beacon/store/etcd"
	"github.com/prometheus/client_golang/prometheus"
	"github.com/prometheus/client_golang/prometheus/testutil"
	healthpb "google.golang.org/grpc/health/grpc_health_v1"
)

// The checker's tests run checkers, each with a registry of its own (a
// session: one process each) over one store, against real servers.

// interval is the checks' interval in these tests: the shortest allowed.
const interval = beacon.MinCheckInterval

// checkOf is a check of kind probed every interval, out after one
// failure and back after one pass.
func checkOf(kind beacon.CheckKind) *beacon.Check {
	c := &beacon.Check{Kind: kind, Interval: interval, Timeout: 400 * time.Millisecond, Rise: 1, Fall: 1}
	switch kind {
	case beacon.CheckHTTP:
		c.Path = "/healthz"
	case beacon.CheckTTL:
		*c = beacon.Check{Kind: kind} // a TTL check has no timing but its TTL (the caller's)
	}
	return c
}

// process is one simulated process: a store client (or the shared memory
// store) and a registry over it.
type process struct {
	st  store.Store
	reg *registry.StoreRegistry
}

// backend opens a store for each simulated process.
type backend struct {
	ttl  time.Duration
	open func(t *testing.T) store.Store
}

func memoryBackend(t *testing.T) backend {
	st := newMemoryStore(t)
	return backend{ttl: time.Second, open: func(*testing.T) store.Store { return st }}
}

// etcdBackend is a real etcd; each process has a client of its own.
func etcdBackend(t *testing.T) backend {
	srv := etcdtest.Start(t, etcdtest.Options{})
	return backend{ttl: 2 * time.Second, open: func(t *testing.T) store.Store {
		ctx, cancel := context.WithTimeout(context.Background(), waitFor)
		defer cancel()
		st, err := etcd.Open(ctx, etcd.Config{Endpoints: srv.Endpoints()})
		if err != nil {
			t.Fatal(err)
		}
		t.Cleanup(func() { _ = st.Close() })
		return st
	}}
}

func (b backend) process(t *testing.T) process {
	t.Helper()
	st := b.open(t)
	reg, err := registry.New(st, registry.Config{LeaseTTL: b.ttl})
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { _ = reg.Close() })
	return process{st: st, reg: reg}
}

// testChecker is a running Checker with what its test looks at.
type testChecker struct {
	*Checker
	p        process
	metrics  *prometheus.Registry
	assessed chan linkState // the state after each assessment
	warnings *warnings
}

// startChecker starts a checker in a process of its own, listening on a
// loopback port of its own (its address), until the test ends.
func startChecker(t *testing.T, b backend, id string, tweak func(*Config)) *testChecker {
	t.Helper()
	tc := &testChecker{p: b.process(t), metrics: prometheus.NewRegistry(), assessed: make(chan linkState, 1024), warnings: &warnings{warned: make(chan struct{}, 64)}}
	ln, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { _ = ln.Close() })
	cfg := Config{ID: id, Addr: ln.Addr().String(), Registry: tc.p.reg, Store: tc.p.st, PeerInterval: interval,
		Jitter: func() float64 { return 0.5 }, Metrics: tc.metrics, Logger: slog.New(tc.warnings)}
	if tweak != nil {
		tweak(&cfg)
	}
	c, err := New(cfg)
	if err != nil {
		t.Fatal(err)
	}
	c.assessed = func(_ assessment, s linkState) {
		select {
		case tc.assessed <- s:
		default:
		}
	}
	tc.Checker = c
	if err := c.Start(); err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { _ = c.Close() })
	return tc
}

// warnings is a slog handler that keeps the warnings' messages, and
// signals each on its channel.
type warnings struct {
	mu     sync.Mutex
	msgs   []string
	warned chan struct{}
}

func (h *warnings) Enabled(context.Context, slog.Level) bool { return true }
func (h *warnings) Handle(_ context.Context, r slog.Record) error {
	if r.Level == slog.LevelWarn {
		h.mu.Lock()
		h.msgs = append(h.msgs, r.Message)
		h.mu.Unlock()
		select {
		case h.warned <- struct{}{}:
		default:
		}
	}
	return nil
}
func (h *warnings) WithAttrs([]slog.Attr) slog.Handler { return h }
func (h *warnings) WithGroup(string) slog.Handler      { return h }

// await waits for a warning that says about.
func (h *warnings) await(t *testing.T, about string) {
	t.Helper()
	deadline := time.After(waitFor)
	for h.count(about) == 0 {
		select {
		case <-h.warned:
		case <-deadline:
			t.Fatalf("no warning %q within %v", about, waitFor)
		}
	}
}

// count returns how many warnings say about.
func (h *warnings) count(about string) int {
	h.mu.Lock()
	defer h.mu.Unlock()
	n := 0
	for _, m := range h.msgs {
		if strings.Contains(m, about) {
			n++
		}
	}
	return n
}

// awaitState waits for an assessment that leaves the checker in want.
func (tc *testChecker) awaitState(t *testing.T, want linkState) {
	t.Helper()
	deadline := time.After(waitFor)
	for {
		select {
		case s := <-tc.assessed:
			if s == want {
				return
			}
		case <-deadline:
			t.Fatalf("checker %s: not %s within %v", tc.ID(), want, waitFor)
		}
	}
}

// awaitFailingVerdicts waits until the checker's Runners have turned
// Failing n times in all (each such change wakes its assessment).
func (tc *testChecker) awaitFailingVerdicts(t *testing.T, n int) {
	t.Helper()
	deadline := time.After(waitFor)
	for testutil.ToFloat64(tc.m.changes.WithLabelValues(string(Failing))) < float64(n) {
		select {
		case <-tc.assessed:
		case <-deadline:
			t.Fatalf("checker %s: fewer than %d Failing verdicts within %v", tc.ID(), n, waitFor)
		}
	}
}

// register registers instance i (testRef(i)) at addr with check c.
func register(t *testing.T, p process, i int, addr string, c *beacon.Check) registry.Registration {
	t.Helper()
	in := checkedInstance(i, c)
	in.Address = addr
	reg, err := p.reg.Register(context.Background(), in)
	if err != nil {
		t.Fatal(err)
	}
	return reg
}

// awaitVerdict waits until instance i's verdict satisfies ok (nil:
// absent) and returns it.
func awaitVerdict(t *testing.T, st store.Store, i int, what string, ok func(*beacon.Health) bool) *beacon.Health {
	t.Helper()
	kv := awaitKey(t, st, beacon.Keyspace{}.HealthKey(testRef(i)), what, func(kv *store.KeyValue) bool { return ok(verdictOf(t, kv)) })
	return verdictOf(t, kv)
}

func verdictIs(status beacon.HealthStatus, checker string) func(*beacon.Health) bool {
	return func(h *beacon.Health) bool { return h != nil && h.Status == status && h.Checker == checker }
}

// target is an HTTP server checked at /healthz, counting its probes.
type httpTarget struct {
	addr   string
	probes atomic.Int64
	down   atomic.Bool // /healthz answers 503
	refuse atomic.Bool // connections from 127.0.0.2 are closed at once
}

// startTarget starts an HTTP target; every probe is also sent on hits
// (when not nil and not full).
func startTarget(t *testing.T, hits chan<- struct{}) *httpTarget {
	t.Helper()
	ln, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	tg := &httpTarget{addr: ln.Addr().String()}
	srv := &http.Server{Handler: http.HandlerFunc(func(w http.ResponseWriter, _ *http.Request) {
		tg.probes.Add(1)
		if hits != nil {
			select {
			case hits <- struct{}{}:
			default:
			}
		}
		if tg.down.Load() {
			w.WriteHeader(http.StatusServiceUnavailable)
		}
	})}
	go func() { _ = srv.Serve(refusing{ln, tg}) }()
	t.Cleanup(func() { _ = srv.Close() })
	return tg
}

// refusing closes connections from 127.0.0.2 while its target refuses
// them: the probes of a checker dialling from there all fail.
type refusing struct {
	net.Listener
	tg *httpTarget
}

func (l refusing) Accept() (net.Conn, error) {
	for {
		c, err := l.Listener.Accept()
		if err != nil {
			return nil, err
		}
		if l.tg.refuse.Load() && strings.HasPrefix(c.RemoteAddr().String(), "127.0.0.2:") {
			_ = c.Close()
			continue
		}
		return c, nil
	}
}

// fromLoopback2 is a Prober whose HTTP probes come from 127.0.0.2.
func fromLoopback2() *Prober {
	d := &net.Dialer{LocalAddr: &net.TCPAddr{IP: net.IPv4(127, 0, 0, 2)}}
	return &Prober{HTTP: &http.Client{Transport: &http.Transport{DialContext: d.DialContext, DisableKeepAlives: true}}}
}

// TestCheckerMarksFailingAndBack: one checker marks a gRPC server that
// reports NOT_SERVING failing, and passing again once it serves: the
// verdict key holds the status, the reason, since when and the checker.
func TestCheckerMarksFailingAndBack(t *testing.T) {
	for name, open := range map[string]func(*testing.T) backend{"memory": memoryBackend, "etcd": etcdBackend} {
		t.Run(name, func(t *testing.T) {
			b := open(t)
			a := startChecker(t, b, "a", nil)
			reader := b.process(t)
			hs, addr := grpcServer(t, false)
			register(t, reader, 0, addr, checkOf(beacon.CheckGRPC))
			awaitVerdict(t, reader.st, 0, "a passing verdict", verdictIs(beacon.HealthPassing, "a"))
			hs.SetServingStatus("", healthpb.HealthCheckResponse_NOT_SERVING)
			h := awaitVerdict(t, reader.st, 0, "a failing verdict", verdictIs(beacon.HealthFailing, "a"))
			if !strings.Contains(h.Reason, "NOT_SERVING") || time.Since(h.Since) > waitFor || h.Panic {
				t.Fatalf("verdict %+v: want the reason NOT_SERVING, a recent since, no panic", h)
			}
			hs.SetServingStatus("", healthpb.HealthCheckResponse_SERVING)
			h = awaitVerdict(t, reader.st, 0, "a passing verdict again", verdictIs(beacon.HealthPassing, "a"))
			if h.Reason != "" {
				t.Fatalf("a passing verdict with reason %q", h.Reason)
			}
			checkChangeMetrics(t, a)
		})
	}
}

// checkChangeMetrics: the checker counted the verdict changes of
// TestCheckerMarksFailingAndBack, and owns its one instance.
func checkChangeMetrics(t *testing.T, a *testChecker) {
	t.Helper()
	if n := testutil.ToFloat64(a.m.changes.WithLabelValues("passing")); n != 2 {
		t.Errorf("%v changes to passing, want 2", n)
	}
	if n := testutil.ToFloat64(a.m.changes.WithLabelValues("failing")); n != 1 {
		t.Errorf("%v changes to failing, want 1", n)
	}
	if n := testutil.ToFloat64(a.m.owned); n != 1 {
		t.Errorf("owns %v instances, want 1", n)
	}
}

// checkProbeMetrics: every metric is on the checker's registerer, and its
// HTTP probes were counted and timed.
func checkProbeMetrics(t *testing.T, a *testChecker) {
	t.Helper()
	if n := testutil.ToFloat64(a.m.probes.WithLabelValues("http", "pass")); n < 1 {
		t.Errorf("%v passed HTTP probes, want some", n)
	}
	families, err := a.metrics.Gather()
	if err != nil {
		t.Fatal(err)
	}
	var names []string
	for _, f := range families {
		names = append(names, f.GetName())
		if f.GetName() == "beacon_health_probe_duration_seconds" && f.GetMetric()[0].GetHistogram().GetSampleCount() < 1 {
			t.Error("no probe duration observed")
		}
	}
	for _, want := range []string{"beacon_health_probes_total", "beacon_health_probe_duration_seconds",
		"beacon_health_verdict_changes_total", "beacon_health_owned_instances", "beacon_health_checker_cut_off"} {
		if !slices.Contains(names, want) {
			t.Errorf("%s is not on the checker's registerer (%v)", want, names)
		}
	}
}

// probeCounter counts the probes all targets see.
type probeCounter struct {
	hits    chan struct{}
	targets []*httpTarget
}

// countIntervals waits for k probes per target in all, and checks that
// they took about k intervals and that each target had k ± 1: each
// instance probed once per interval, by one checker.
func (pc *probeCounter) countIntervals(t *testing.T, k int) {
	t.Helper()
	for len(pc.hits) > 0 {
		<-pc.hits
	}
	before := make([]int64, len(pc.targets))
	for i, tg := range pc.targets {
		before[i] = tg.probes.Load()
	}
	start, deadline := time.Now(), time.After(waitFor)
	for range k * len(pc.targets) {
		select {
		case <-pc.hits:
		case <-deadline:
			t.Fatalf("fewer than %d probes of %d instances within %v", k, len(pc.targets), waitFor)
		}
	}
	if took := time.Since(start); took < time.Duration(k-1)*interval {
		t.Errorf("%d probes of each of %d instances took %v, less than %d intervals: probed more than once per interval", k, len(pc.targets), took, k-1)
	}
	for i, tg := range pc.targets {
		if n := tg.probes.Load() - before[i]; n < int64(k-1) || n > int64(k+1) {
			t.Errorf("instance %d probed %d times while the others were probed %d times each", i, n, k)
		}
	}
}

// awaitOwners waits until every instance's verdict is passing and written
// by its owner among ids.
func awaitOwners(t *testing.T, st store.Store, n int, ids []string) {
	t.Helper()
	for i := range n {
		o := owner(testRef(i), ids)
		awaitVerdict(t, st, i, "a passing verdict by its owner "+o, verdictIs(beacon.HealthPassing, o))
	}
}

// TestCheckersShareTheProbes: two and three checkers over one store each
// probe their share: every instance once per interval; when one stops,
// its verdicts go with its lease (fail-open) and the others share its
// instances.
func TestCheckersShareTheProbes(t *testing.T) {
	for _, n := range []int{2, 3} {
		t.Run(fmt.Sprintf("%d checkers", n), func(t *testing.T) {
			b := memoryBackend(t)
			var checkers []*testChecker
			var ids []string
			for i := range n {
				id := fmt.Sprintf("node-%d", i)
				ids = append(ids, id)
				checkers = append(checkers, startChecker(t, b, id, nil))
			}
			reader := b.process(t)
			pc := &probeCounter{hits: make(chan struct{}, 4096)}
			const instances = 12
			for i := range instances {
				tg := startTarget(t, pc.hits)
				pc.targets = append(pc.targets, tg)
				register(t, reader, i, tg.addr, checkOf(beacon.CheckHTTP))
			}
			awaitOwners(t, reader.st, instances, ids)
			owned := 0.0
			for _, c := range checkers {
				owned += testutil.ToFloat64(c.m.owned)
			}
			if owned != instances {
				t.Fatalf("the checkers own %v instances in all, want %d", owned, instances)
			}
			pc.countIntervals(t, 4)
			checkProbeMetrics(t, checkers[0])

			gone := checkers[n-1]
			if err := gone.Close(); err != nil {
				t.Fatal(err)
			}
			for i := range instances {
				if owner(testRef(i), ids) == gone.ID() {
					awaitVerdict(t, reader.st, i, "its verdict gone with its checker", func(h *beacon.Health) bool { return h == nil || h.Checker != gone.ID() })
				}
			}
			awaitOwners(t, reader.st, instances, ids[:n-1])
			pc.countIntervals(t, 4)
			if err := gone.Close(); err != nil {
				t.Fatalf("a second Close: %v", err)
			}
		})
	}
}

// ownedBy returns the first instance (testRef) that id owns among ids.
func ownedBy(t *testing.T, ids []string, id string) int {
	t.Helper()
	for i := range 1000 {
		if owner(testRef(i), ids) == id {
			return i
		}
	}
	t.Fatalf("%s owns none of 1000 instances among %v", id, ids)
	return 0
}

// TestCheckerCrashedVerdictsExpire: a checker that dies (its store client
// gone: no keep-alive, no revoke) loses its verdicts with its lease: the
// instance is served again (no verdict) until the checker that takes it
// over reaches its own.
func TestCheckerCrashedVerdictsExpire(t *testing.T) {
	b := etcdBackend(t)
	a := startChecker(t, b, "a", nil)
	crashed := startChecker(t, b, "b", nil)
	reader := b.process(t)
	i := ownedBy(t, []string{"a", "b"}, "b")
	tg := startTarget(t, nil)
	tg.down.Store(true)
	c := checkOf(beacon.CheckHTTP)
	c.Interval, c.Fall = time.Second, 4 // the new owner takes 3.5 s: longer than the lease lives on
	register(t, reader, i, tg.addr, c)
	awaitVerdict(t, reader.st, i, "a failing verdict by b", verdictIs(beacon.HealthFailing, "b"))
	_ = crashed.p.st.Close()
	awaitVerdict(t, reader.st, i, "b's verdict gone with its lease", func(h *beacon.Health) bool { return h == nil })
	awaitVerdict(t, reader.st, i, "a failing verdict by a, the new owner", verdictIs(beacon.HealthFailing, a.ID()))
}

// watchKey records every change of key from now on.
func watchKey(t *testing.T, st store.Store, key string) <-chan store.Event {
	ctx, cancel := context.WithCancel(context.Background())
	t.Cleanup(cancel)
	out := make(chan store.Event, 256)
	wch := st.Watch(ctx, key, 0)
	go func() {
		defer close(out)
		for resp := range wch {
			for _, e := range resp.Events {
				out <- e
			}
		}
	}()
	return out
}

// TestCheckerHandover: a checker that joins takes over the instances it
// wins; the previous owner's verdict stays until the new owner writes its
// own (never deleted in between).
func TestCheckerHandover(t *testing.T) {
	b := memoryBackend(t)
	startChecker(t, b, "a", nil)
	reader := b.process(t)
	i := ownedBy(t, []string{"a", "b"}, "b")
	tg := startTarget(t, nil)
	tg.down.Store(true)
	c := checkOf(beacon.CheckHTTP)
	c.Fall = 3
	register(t, reader, i, tg.addr, c)
	awaitVerdict(t, reader.st, i, "a failing verdict by a", verdictIs(beacon.HealthFailing, "a"))
	changes := watchKey(t, reader.st, beacon.Keyspace{}.HealthKey(testRef(i)))
	startChecker(t, b, "b", nil)
	for {
		select {
		case e := <-changes:
			if e.Type == store.EventDelete {
				t.Fatal("the verdict was deleted at the handover")
			}
			if h := verdictOf(t, &e.KV); h.Checker == "b" && h.Status == beacon.HealthFailing {
				return
			}
		case <-time.After(waitFor):
			t.Fatalf("no failing verdict by b, the new owner, within %v", waitFor)
		}
	}
}

// TestCheckerDeletesVerdictOfGoneInstance: the owner deletes its verdict
// when the instance stops declaring a check, and when it is gone.
func TestCheckerDeletesVerdictOfGoneInstance(t *testing.T) {
	b := memoryBackend(t)
	startChecker(t, b, "a", nil)
	reader := b.process(t)
	tg := startTarget(t, nil)
	unchecked := register(t, reader, 0, tg.addr, checkOf(beacon.CheckHTTP))
	deregistered := register(t, reader, 1, tg.addr, checkOf(beacon.CheckHTTP))
	for i := range 2 {
		awaitVerdict(t, reader.st, i, "a passing verdict", verdictIs(beacon.HealthPassing, "a"))
	}
	if err := unchecked.Update(context.Background(), func(in *beacon.Instance) { in.Check = nil }); err != nil {
		t.Fatal(err)
	}
	awaitVerdict(t, reader.st, 0, "the verdict deleted once the check went", func(h *beacon.Health) bool { return h == nil })
	if err := deregistered.Close(); err != nil {
		t.Fatal(err)
	}
	awaitVerdict(t, reader.st, 1, "the verdict deleted once the instance went", func(h *beacon.Health) bool { return h == nil })
}

// TestCheckerFollowsAddressChange: an instance whose address changes is
// probed at its new address, and no longer at the old one.
func TestCheckerFollowsAddressChange(t *testing.T) {
	b := memoryBackend(t)
	startChecker(t, b, "a", nil)
	reader := b.process(t)
	hits := make(chan struct{}, 64)
	old, moved := startTarget(t, nil), startTarget(t, hits)
	reg := register(t, reader, 0, old.addr, checkOf(beacon.CheckHTTP))
	awaitVerdict(t, reader.st, 0, "a passing verdict", verdictIs(beacon.HealthPassing, "a"))
	if err := reg.Update(context.Background(), func(in *beacon.Instance) { in.Address = moved.addr }); err != nil {
		t.Fatal(err)
	}
	before := old.probes.Load()
	for range 3 {
		select {
		case <-hits:
		case <-time.After(waitFor):
			t.Fatalf("the new address was not probed within %v", waitFor)
		}
	}
	if n := old.probes.Load() - before; n > 1 {
		t.Fatalf("the old address was probed %d times after the move", n)
	}
}

// TestCheckerTTLReport: a TTL check passes while the registrant writes
// its report key, fails once the reports stop for longer than the TTL,
// and passes again at the next report.
func TestCheckerTTLReport(t *testing.T) {
	b := memoryBackend(t)
	startChecker(t, b, "a", nil)
	reader := b.process(t)
	c := checkOf(beacon.CheckTTL)
	c.TTL = beacon.MinCheckTTL
	reg := register(t, reader, 0, "10.0.0.1:80", c)
	report := func() { // through the registry's own API, as a registrant does
		t.Helper()
		if err := reader.reg.Report(context.Background(), reg.Instance().Ref()); err != nil {
			t.Fatal(err)
		}
	}
	report()
	awaitVerdict(t, reader.st, 0, "a passing verdict", verdictIs(beacon.HealthPassing, "a"))
	h := awaitVerdict(t, reader.st, 0, "a failing verdict once the reports stopped", verdictIs(beacon.HealthFailing, "a"))
	if !strings.Contains(h.Reason, "has not reported within its TTL") {
		t.Fatalf("failing because %q", h.Reason)
	}
	report()
	awaitVerdict(t, reader.st, 0, "a passing verdict after a report", verdictIs(beacon.HealthPassing, "a"))
}

// TestCheckerTTLNeverReported: an instance whose service never reports
// fails one TTL after its checker first sees its check — it is not served
// as unknown for the default interval times fall — and passes at its
// first report.
func TestCheckerTTLNeverReported(t *testing.T) {
	b := memoryBackend(t)
	startChecker(t, b, "a", nil)
	reader := b.process(t)
	c := checkOf(beacon.CheckTTL)
	c.TTL = beacon.MinCheckTTL
	reg := register(t, reader, 0, "10.0.0.1:80", c)
	h := awaitVerdict(t, reader.st, 0, "a failing verdict, never reported", verdictIs(beacon.HealthFailing, "a"))
	if !strings.Contains(h.Reason, "has not reported since its check was first seen") {
		t.Fatalf("failing because %q", h.Reason)
	}
	if err := reader.reg.Report(context.Background(), reg.Instance().Ref()); err != nil {
		t.Fatal(err)
	}
	awaitVerdict(t, reader.st, 0, "a passing verdict at the first report", verdictIs(beacon.HealthPassing, "a"))
}

// spread registers n HTTP targets, returning them and which checker of
// ids owns each.
func spread(t *testing.T, p process, n int, ids []string) ([]*httpTarget, []string) {
	t.Helper()
	return spreadWith(t, p, n, ids, checkOf(beacon.CheckHTTP))
}

// spreadWith is spread with the HTTP check c.
func spreadWith(t *testing.T, p process, n int, ids []string, c *beacon.Check) ([]*httpTarget, []string) {
	t.Helper()
	var tgs []*httpTarget
	var owners []string
	for i := range n {
		tg := startTarget(t, nil)
		tgs = append(tgs, tg)
		owners = append(owners, owner(testRef(i), ids))
		register(t, p, i, tg.addr, c)
	}
	return tgs, owners
}

// fallThree is an HTTP check out after three failures in a row: a
// checker's Runners all see failures before their verdicts turn.
func fallThree() *beacon.Check {
	c := checkOf(beacon.CheckHTTP)
	c.Fall = 3
	return c
}

// failingVerdicts collects the failing verdicts written to st from now
// on, as "instance by checker"; the function it returns reports those
// written until it is called (it writes a marker key and waits for the
// watch to reach it).
func failingVerdicts(t *testing.T, st store.Store) func() []string {
	t.Helper()
	var mu sync.Mutex
	var seen []string
	marker := "/services/~marker"
	reached := make(chan struct{}, 1)
	ch := watchKey(t, st, "/services/")
	go func() {
		for e := range ch {
			var h beacon.Health
			switch {
			case e.KV.Key == marker:
				reached <- struct{}{}
			case strings.HasSuffix(e.KV.Key, "/health") && json.Unmarshal(e.KV.Value, &h) == nil && h.Status == beacon.HealthFailing:
				mu.Lock()
				seen = append(seen, e.KV.Key+" by "+h.Checker)
				mu.Unlock()
			}
		}
	}()
	return func() []string {
		t.Helper()
		if _, err := st.Put(context.Background(), marker, []byte("x")); err != nil {
			t.Fatal(err)
		}
		select {
		case <-reached:
		case <-time.After(waitFor):
			t.Fatalf("the watch did not reach the marker within %v", waitFor)
		}
		mu.Lock()
		defer mu.Unlock()
		return slices.Clone(seen)
	}
}

// TestCheckerCutOffMarksNothing: a checker whose probes all fail while
// its peers' pass — its Runners see the failures before their verdicts
// turn Failing — writes none of those failing verdicts: it holds them
// from the first failures and finds itself cut off at its first Failing
// verdict. Connected again, it writes no failing verdict formed
// meanwhile: it checks those instances afresh.
func TestCheckerCutOffMarksNothing(t *testing.T) {
	b := memoryBackend(t)
	ids := []string{"x", "p", "q"}
	x := startChecker(t, b, "x", func(c *Config) {
		// Random phases: when most of its instances pass again, others
		// have not been probed since (their latest result is a failure).
		c.Prober, c.PeerInterval, c.Jitter = fromLoopback2(), 3*time.Second, nil
	})
	startChecker(t, b, "p", nil)
	startChecker(t, b, "q", nil)
	reader := b.process(t)
	tgs, owners := spreadWith(t, reader, 12, ids, fallThree())
	if n := countOf(owners, "x"); n < minCutOffInstances {
		t.Fatalf("x owns %d instances, fewer than the %d the test needs", n, minCutOffInstances)
	}
	for i := range tgs {
		awaitVerdict(t, reader.st, i, "a passing verdict", verdictIs(beacon.HealthPassing, owners[i]))
	}
	written := failingVerdicts(t, reader.st)
	for _, tg := range tgs {
		tg.refuse.Store(true)
	}
	x.awaitState(t, cutOff)
	x.awaitFailingVerdicts(t, countOf(owners, "x")) // held, every one
	for _, tg := range tgs {
		tg.refuse.Store(false)
	}
	x.awaitState(t, connected)
	for i := range tgs {
		awaitVerdict(t, reader.st, i, "a passing verdict", verdictIs(beacon.HealthPassing, owners[i]))
	}
	if w := written(); len(w) > 0 {
		t.Fatalf("failing verdicts written while x's probes alone failed: %v", w)
	}
}

// TestCheckerCutOffWhenItsProbesFail: a checker whose probes are all
// refused while its peers' pass is cut off: it warns once, sets its gauge,
// withdraws its failing verdicts, and writes them again only once it
// recovers.
func TestCheckerCutOffWhenItsProbesFail(t *testing.T) {
	b := memoryBackend(t)
	ids := []string{"x", "p", "q"}
	x := startChecker(t, b, "x", func(c *Config) { c.Prober = fromLoopback2() })
	startChecker(t, b, "p", nil)
	startChecker(t, b, "q", nil)
	reader := b.process(t)
	tgs, owners := spread(t, reader, 12, ids)
	if n := countOf(owners, "x"); n < minCutOffInstances {
		t.Fatalf("x owns %d instances, fewer than the %d the test needs", n, minCutOffInstances)
	}
	for i, tg := range tgs {
		tg.refuse.Store(true)
		if owners[i] != "x" {
			awaitVerdict(t, reader.st, i, "a passing verdict by a peer", verdictIs(beacon.HealthPassing, owners[i]))
		}
	}
	x.awaitState(t, cutOff)
	if g := testutil.ToFloat64(x.m.cutOff); g != 1 {
		t.Fatalf("beacon_health_checker_cut_off = %v while cut off", g)
	}
	for i := range tgs {
		if owners[i] == "x" {
			awaitVerdict(t, reader.st, i, "x's failing verdict withdrawn", func(h *beacon.Health) bool { return h == nil || h.Status != beacon.HealthFailing })
		}
	}
	for _, tg := range tgs {
		tg.refuse.Store(false)
	}
	x.awaitState(t, connected)
	if g, warned := testutil.ToFloat64(x.m.cutOff), x.warnings.count("is cut off"); g != 0 || warned != 1 {
		t.Fatalf("connected again: gauge %v, %d warnings that it was cut off (want 0 and 1)", g, warned)
	}
	for i := range tgs {
		if owners[i] == "x" {
			awaitVerdict(t, reader.st, i, "a passing verdict by x", verdictIs(beacon.HealthPassing, "x"))
		}
	}
}

func countOf(s []string, v string) int {
	n := 0
	for _, e := range s {
		if e == v {
			n++
		}
	}
	return n
}

// TestCheckerCutOffWhenNoPeerAnswers: a checker that reaches none of its
// peers at their addresses is cut off, and withdraws its failing verdicts.
func TestCheckerCutOffWhenNoPeerAnswers(t *testing.T) {
	b := memoryBackend(t)
	ids := []string{"x", "p"}
	x := startChecker(t, b, "x", nil)
	p := startChecker(t, b, "p", func(c *Config) { c.Addr = closedAddr(t) })
	reader := b.process(t)
	tgs, owners := spread(t, reader, 6, ids)
	i := slices.Index(owners, "x")
	if i < 0 {
		t.Fatal("x owns none of the instances")
	}
	tgs[i].down.Store(true)
	x.awaitState(t, cutOff)
	awaitVerdict(t, reader.st, i, "x's failing verdict withdrawn", func(h *beacon.Health) bool { return h == nil || h.Status != beacon.HealthFailing })
	p.awaitState(t, connected) // p reaches x
	if testutil.ToFloat64(p.m.cutOff) != 0 {
		t.Fatal("p, which reaches x, is cut off")
	}
}

// TestCheckerMarksARealOutage: when the instances are down for every
// checker, each marks its own failing and none is cut off (each is
// confirmed: most of its instances fail, and its peer sees as many).
func TestCheckerMarksARealOutage(t *testing.T) {
	b := memoryBackend(t)
	ids := []string{"x", "p"}
	checkers := []*testChecker{startChecker(t, b, "x", nil), startChecker(t, b, "p", nil)}
	reader := b.process(t)
	tgs, owners := spread(t, reader, 8, ids)
	for _, tg := range tgs {
		tg.down.Store(true)
	}
	for i := range tgs {
		awaitVerdict(t, reader.st, i, "a failing verdict by its owner", verdictIs(beacon.HealthFailing, owners[i]))
	}
	for _, c := range checkers {
		for range 3 {
			c.awaitState(t, confirmed) // most fail, and the peer sees as many
		}
		if c.warnings.count("is cut off") != 0 {
			t.Errorf("checker %s found itself cut off in an outage of every instance", c.ID())
		}
	}
}

// TestCheckerMarksARealOutageTogether: when the instances are down for
// every checker, all see most of theirs fail before any verdict turns:
// all hold, and each tells that its peers see as many failures from what
// they publish (CheckerSuspectMetadata), not from verdicts none has
// written. Every instance is marked by its owner; none is cut off.
func TestCheckerMarksARealOutageTogether(t *testing.T) {
	b := memoryBackend(t)
	ids := []string{"x", "p"}
	var checkers []*testChecker
	for _, id := range ids {
		checkers = append(checkers, startChecker(t, b, id, func(c *Config) { c.PeerInterval = time.Hour }))
	}
	reader := b.process(t)
	tgs, owners := spreadWith(t, reader, 12, ids, fallThree())
	for _, id := range ids {
		if n := countOf(owners, id); n < minCutOffInstances {
			t.Fatalf("%s owns %d instances, fewer than the %d that let it doubt", id, n, minCutOffInstances)
		}
	}
	for i := range tgs {
		awaitVerdict(t, reader.st, i, "a passing verdict", verdictIs(beacon.HealthPassing, owners[i]))
	}
	for _, tg := range tgs {
		tg.down.Store(true)
	}
	for i := range tgs {
		awaitVerdict(t, reader.st, i, "a failing verdict by its owner", verdictIs(beacon.HealthFailing, owners[i]))
	}
	for _, c := range checkers {
		if c.warnings.count("is cut off") != 0 || testutil.ToFloat64(c.m.cutOff) != 0 {
			t.Errorf("checker %s found itself cut off in an outage of every instance", c.ID())
		}
	}
}

// TestCheckerAloneWritesFailingAtOnce: a checker without peers, most of
// whose instances fail, writes their failing verdicts as they turn — it
// does not hold them for the interval of an unrelated instance checked
// every 10 minutes (nor at all: it could never find itself cut off).
func TestCheckerAloneWritesFailingAtOnce(t *testing.T) {
	b := memoryBackend(t)
	startChecker(t, b, "x", nil)
	reader := b.process(t)
	slow := &beacon.Check{Kind: beacon.CheckTCP, Interval: beacon.MaxCheckInterval}
	register(t, reader, 0, startTarget(t, nil).addr, slow)
	for i := 1; i <= 4; i++ {
		tg := startTarget(t, nil)
		tg.down.Store(true)
		register(t, reader, i, tg.addr, checkOf(beacon.CheckHTTP))
	}
	for i := 1; i <= 4; i++ {
		awaitVerdict(t, reader.st, i, "a failing verdict by x", verdictIs(beacon.HealthFailing, "x"))
	}
}

// TestCheckerSameID: a second checker with the ID of a live one cannot
// register: it warns, and checks nothing until the first is gone; then
// it registers and takes the instances over.
func TestCheckerSameID(t *testing.T) {
	b := memoryBackend(t)
	first := startChecker(t, b, "a", nil)
	reader := b.process(t)
	tg := startTarget(t, nil)
	register(t, reader, 0, tg.addr, checkOf(beacon.CheckHTTP))
	key := beacon.Keyspace{}.HealthKey(testRef(0))
	kv := awaitKey(t, reader.st, key, "a passing verdict", isVerdict(t, beacon.HealthPassing, "a"))
	second := startChecker(t, b, "a", nil)
	second.warnings.await(t, "another live health checker has this checker's ID")
	if owned := testutil.ToFloat64(second.m.owned); owned != 0 {
		t.Fatalf("the second checker a owns %v instances, want none", owned)
	}
	if err := first.Close(); err != nil {
		t.Fatal(err)
	}
	awaitKey(t, reader.st, key, "a verdict under the second checker's lease", func(got *store.KeyValue) bool {
		return isVerdict(t, beacon.HealthPassing, "a")(got) && got.Lease != kv.Lease
	})
}

// TestCheckerConfig: a bad configuration is refused naming the field.
func TestCheckerConfig(t *testing.T) {
	st := newMemoryStore(t)
	reg, err := registry.New(st, registry.Config{})
	if err != nil {
		t.Fatal(err)
	}
	defer reg.Close()
	good := Config{ID: "node-1", Addr: "127.0.0.1:9379", Registry: reg, Store: st}
	if err := good.Validate(); err != nil {
		t.Fatal(err)
	}
	for want, mutate := range map[string]func(*Config){
		"Config.ID":   func(c *Config) { c.ID = "" },
		"use letters": func(c *Config) { c.ID = "node 1" },
		"Config.Addr": func(c *Config) { c.Addr = "nowhere" },
		"Config.Store is required: the registry (*registry.StoreRegistry) does not keep verdicts itself": func(c *Config) { c.Store = nil },
		"Config.Registry is required": func(c *Config) { c.Registry = nil },
		"Config.LeaseTTL":             func(c *Config) { c.LeaseTTL = time.Millisecond },
		"Config.PeerInterval":         func(c *Config) { c.PeerInterval = -time.Second },
	} {
		c := good
		mutate(&c)
		if _, err := New(c); !errors.Is(err, ErrInvalidConfig) || !strings.Contains(err.Error(), want) {
			t.Errorf("want an error naming %s, got %v", want, err)
		}
	}
}

// TestShortReason: a verdict's reason is at most MaxReasonBytes of valid
// UTF-8, whatever the probed server said.
func TestShortReason(t *testing.T) {
	if got := shortReason("refused"); got != "refused" {
		t.Fatalf("a short reason became %q", got)
	}
	long := strings.Repeat("é", MaxReasonBytes)
	got := shortReason(long)
	if len(got) > MaxReasonBytes || !utf8.ValidString(got) || !strings.HasSuffix(got, "…") {
		t.Fatalf("a reason of %d bytes became %d bytes (valid UTF-8 %v)", len(long), len(got), utf8.ValidString(got))
	}
}
