package main

import (
	"bufio"
	"encoding/json"
	"fmt"
	"net/http"
	"os"
	"os/signal"
	"strconv"
	"strings"
	"sync"
	"syscall"
	"testing"
	"time"

	"github.com/beaconplane/beacon"
	healthcheck "github.com/beaconplane/beacon/health"
	"github.com/beaconplane/beacon/internal/lab/etcdproc"
	"github.com/beaconplane/beacon/internal/lab/freeport"
	"github.com/beaconplane/beacon/internal/testkit/etcdtest"
	"github.com/beaconplane/beacon/internal/testkit/machine"
	"github.com/beaconplane/beacon/internal/testkit/testpeer"
)

// The partition drill's cluster: one etcd member, two checkers in the
// test's own network namespace and one in a namespace of its own
// (cutID), and the instances' servers in another namespace, all on one
// bridge.
const (
	cutID          = "cut"
	partTargets    = 16 // healthtarget processes: a gRPC and an HTTP instance each
	partInterval   = 500 * time.Millisecond
	partFall       = 3
	partDetections = "this health checker is cut off"
	partRecovered  = "this health checker is connected again"
)

// TestHealthDrillCheckerPartitioned: a checker cut off from the instances
// it checks — and from nothing else: etcd and its peers stay reachable —
// marks none of them failing, says that it is cut off (its warning, and
// beacon_health_checker_cut_off 1 on its /metrics) while its peers keep
// checking theirs, and once the partition heals (the gauge back to 0) it
// still marks an instance that really fails within fall × interval.
//
// Everything is a real process: etcd, three `beacon serve` checkers (one
// in a network namespace of its own, `ip netns exec`), 32 instances
// (gRPC health and HTTP /healthz of 16 healthtarget processes, in another
// namespace) each registered by a `beacon register` of its own, so that
// their leases live all along, and `beacon watch` reading the registry's
// view. Two partitions, one after the other: the instances' answers to
// the checker are dropped silently (a route to it blackholed on their
// side: its probes time out and its gRPC Watch streams go silent), and
// the checker's host loses its route to the instances (refused at once).
// It needs root and ip(8): without them it skips, saying why.
func TestHealthDrillCheckerPartitioned(t *testing.T) {
	machine.Exclusive(t)
	start := time.Now()
	c := etcdtest.StartProcessCluster(t, 1, etcdtest.ProcessClusterOptions{Netns: true})
	etcdURL := c.Endpoints()[0]
	nw := c.Network()
	removeOnInterrupt(t, nw)
	cutHost, instHost := addHost(t, nw), addHost(t, nw)
	dir := t.TempDir()

	view := watchView(t, dir, etcdURL)
	cut := startChecker(t, dir, etcdURL, cutID, cutHost.Addr()+":9379", cutHost)
	for _, id := range []string{"peer-1", "peer-2"} {
		port, err := freeport.Port()
		if err != nil {
			t.Fatal(err)
		}
		startChecker(t, dir, etcdURL, id, nw.Gateway()+":"+strconv.Itoa(port), nil)
	}
	view.await(t, "the three checkers registered", func(v *viewState) bool { return v.checkers == 3 })

	targets, refs := registerTargets(t, dir, etcdURL, instHost)
	view.await(t, "every instance passing", func(v *viewState) bool { return v.all(refs, passing) })
	owners := view.owners(refs)
	owned := 0
	for _, o := range owners {
		if o == cutID {
			owned++
		}
	}
	t.Logf("set up in %v: %d instances, %d of them checked by %s", time.Since(start).Round(time.Millisecond), len(refs), owned, cutID)
	if owned < 3 {
		t.Fatalf("%s owns %d of the instances, fewer than the 3 a checker must own to tell its outage from theirs", cutID, owned)
	}

	cutMetrics := "http://" + cutHost.Addr() + ":9379/metrics"
	instNet := instHost.Addr() + "/32"
	view.mark() // from here until the last partition has healed, no instance fails
	for i, p := range []struct{ name, on, route string }{
		{"the instances' answers to the checker dropped", "instances", "blackhole " + cutHost.Addr() + "/32"},
		{"the checker's host without a route to the instances", "checker", "prohibit " + instNet},
	} {
		on := instHost
		if p.on == "checker" {
			on = cutHost
		}
		route := strings.Fields(p.route)
		failingBefore := metric(t, cutMetrics, `beacon_health_verdict_changes_total{status="failing"}`)
		partitioned := time.Now()
		if err := on.IP(append([]string{"route", "add"}, route...)...); err != nil {
			t.Fatal(err)
		}
		waitCount(t, cut, partDetections, i+1, 3*healthcheck.DefaultPeerInterval)
		detected := time.Since(partitioned)
		if g := metric(t, cutMetrics, "beacon_health_checker_cut_off"); g != 1 {
			t.Fatalf("%s: beacon_health_checker_cut_off = %v after the checker warned it is cut off", p.name, g)
		}
		// Partitioned until the verdict on every instance it checks is
		// Failing (held): still, nothing is marked, everything served.
		awaitMetric(t, cutMetrics, `beacon_health_verdict_changes_total{status="failing"}`, failingBefore+float64(owned))
		checkLsServing(t, dir, etcdURL, refs)
		if err := on.IP(append([]string{"route", "del"}, route...)...); err != nil {
			t.Fatal(err)
		}
		waitCount(t, cut, partRecovered, i+1, 3*healthcheck.DefaultPeerInterval)
		if g := metric(t, cutMetrics, "beacon_health_checker_cut_off"); g != 0 {
			t.Fatalf("%s: beacon_health_checker_cut_off = %v after the checker said it is connected again", p.name, g)
		}
		healed := time.Since(partitioned)
		if marks := view.failingSinceMark(t, nil); len(marks) > 0 {
			t.Fatalf("%s: instances marked failing, none of them failing: %s\n%s's log:\n%s", p.name, strings.Join(marks, "; "), cutID, cut.errOut())
		}
		t.Logf("%s: cut off after %v, connected again %v after the partition began; nothing marked failing",
			p.name, detected.Round(time.Millisecond), healed.Round(time.Millisecond))
	}

	// The checking was not just turned off: a server that really stops
	// serving is marked by its checker, the one cut off before, after fall
	// results (not at once: no verdict formed before was left to show);
	// no other instance is marked meanwhile (nor by a probe sent before
	// the partition healed).
	i, ref := ownedTarget(t, refs, owners, cutID)
	failed := time.Now()
	targets[i].do(t, "not-serving")
	view.await(t, ref.String()+" failing", func(v *viewState) bool { return v.failing(ref, cutID) })
	// At least fall - 2 intervals: NOT_SERVING pushed on the gRPC Watch
	// stream is a result at once, and the interval's Check can come
	// right after it.
	took, least, bound := time.Since(failed), (partFall-2)*partInterval*9/10, partFall*partInterval+time.Second
	t.Logf("NOT_SERVING after the partitions: marked failing by %s in %v (bound %v); the drill took %v",
		cutID, took.Round(time.Millisecond), bound, time.Since(start).Round(time.Millisecond))
	if took < least || took > bound {
		t.Errorf("a failing instance was marked after %v: want %d results, %v to %v", took, partFall, least, bound)
	}
	except := map[beacon.Ref]bool{{Namespace: "drill", Component: "part", Endpoint: "grpc", ID: ref.ID}: true,
		{Namespace: "drill", Component: "part", Endpoint: "http", ID: ref.ID}: true}
	if marks := view.failingSinceMark(t, except); len(marks) > 0 {
		t.Errorf("instances marked failing, none of them failing: %s", strings.Join(marks, "; "))
	}
}

// removeOnInterrupt removes nw's namespaces and bridge if the test
// process is interrupted (SIGINT, SIGTERM), which skips the test's
// cleanups; its child processes die with it (Pdeathsig). A test process
// killed otherwise leaves them to the next run in the same slot, which
// removes them first (etcdproc.Netns).
func removeOnInterrupt(t *testing.T, nw *etcdproc.Network) {
	sigs, done := make(chan os.Signal, 1), make(chan struct{})
	signal.Notify(sigs, os.Interrupt, syscall.SIGTERM)
	t.Cleanup(func() {
		signal.Stop(sigs)
		close(done)
	})
	go func() {
		select {
		case sig := <-sigs:
			nw.Close()
			fmt.Fprintf(os.Stderr, "%s: %v: removed its network namespaces\n", t.Name(), sig)
			os.Exit(1)
		case <-done:
		}
	}()
}

// addHost gives a process a network namespace of its own on nw's bridge.
func addHost(t *testing.T, nw *etcdproc.Network) *etcdproc.Host {
	t.Helper()
	h, err := nw.AddHost()
	if err != nil {
		t.Fatal(err)
	}
	return h
}

// startOn starts `beacon args...` on host (nil: in the test's namespace);
// it dies with the test process.
func startOn(t *testing.T, dir string, host *etcdproc.Host, args ...string) *child {
	t.Helper()
	cmd := beaconCmd(t, dir, nil, args...)
	if host != nil {
		host.Wrap(cmd)
	}
	return runChild(t, cmd)
}

// startChecker starts a `beacon serve` over the etcd at etcdURL whose
// checker has the ID id and is reached at addr (its HTTP address).
func startChecker(t *testing.T, dir, etcdURL, id, addr string, host *etcdproc.Host) *child {
	t.Helper()
	s := startOn(t, dir, host, "serve", "--etcd-endpoints", etcdURL, "--data-dir", t.TempDir(), "--http-addr", addr,
		"--dns-addr=", "--xds-addr=", "--health-checks", "--health-checker-id", id)
	s.waitLine(t, "beacon serve is ready", 60*time.Second)
	return s
}

// registerTargets starts the healthtarget processes on host and registers
// their gRPC and HTTP servers, each with a `beacon register` of its own,
// as instances of drill/part/grpc and drill/part/http.
func registerTargets(t *testing.T, dir, etcdURL string, host *etcdproc.Host) ([]*healthTarget, []beacon.Ref) {
	t.Helper()
	var targets []*healthTarget
	var refs []beacon.Ref
	var regs []*child
	timing := []string{"--check-interval", partInterval.String(), "--check-timeout", "200ms", "--check-rise", "2",
		"--check-fall", strconv.Itoa(partFall), "--endpoints", etcdURL}
	for i := range partTargets {
		tg := startHealthTargetOn(t, host)
		targets = append(targets, tg)
		for _, r := range []struct{ ep, addr, check string }{{"grpc", tg.grpc, "grpc"}, {"http", tg.http, "http:/healthz"}} {
			ref := beacon.Ref{Namespace: "drill", Component: "part", Endpoint: r.ep, ID: fmt.Sprintf("%016x", 0xd000+i)}
			refs = append(refs, ref)
			regs = append(regs, startOn(t, dir, nil, append([]string{"register", "drill/part/" + r.ep, "--addr", r.addr,
				"--id", ref.ID, "--check", r.check}, timing...)...))
		}
	}
	for i, reg := range regs {
		reg.waitLine(t, "registered "+refs[i].String(), 60*time.Second)
	}
	return targets, refs
}

// ownedTarget returns the index of a healthtarget one of whose instances
// owner checks, and that instance.
func ownedTarget(t *testing.T, refs []beacon.Ref, owners map[beacon.Ref]string, owner string) (int, beacon.Ref) {
	t.Helper()
	for i, ref := range refs {
		if owners[ref] == owner {
			return i / 2, ref
		}
	}
	t.Fatalf("%s owns no instance", owner)
	return 0, beacon.Ref{}
}

// waitCount waits until the child has logged s n times.
func waitCount(t *testing.T, b *child, s string, n int, timeout time.Duration) {
	t.Helper()
	deadline := time.After(timeout)
	for strings.Count(b.errOut(), s) < n {
		select {
		case <-b.wrote:
		case <-b.done:
			t.Fatalf("beacon exited (%v) before logging %q %d times\nstderr:\n%s", b.err, s, n, b.errOut())
		case <-deadline:
			t.Fatalf("beacon did not log %q %d times within %v\nstderr:\n%s", s, n, timeout, b.errOut())
		}
	}
}

// metric reads one series (name with its labels, as the Prometheus text
// format writes them) from a /metrics page; 0 when it is not there yet.
func metric(t *testing.T, url, series string) float64 {
	t.Helper()
	resp, err := http.Get(url)
	if err != nil {
		t.Fatal(err)
	}
	defer resp.Body.Close()
	sc := bufio.NewScanner(resp.Body)
	for sc.Scan() {
		if v, ok := strings.CutPrefix(sc.Text(), series+" "); ok {
			f, err := strconv.ParseFloat(v, 64)
			if err != nil {
				t.Fatalf("%s: %s %q: %v", url, series, v, err)
			}
			return f
		}
	}
	return 0
}

// awaitMetric polls series every 100 ms (another process's metrics offer
// no event to wait on) until it reaches least, for at most a minute.
func awaitMetric(t *testing.T, url, series string, least float64) {
	t.Helper()
	deadline := time.After(time.Minute)
	tick := time.NewTicker(100 * time.Millisecond)
	defer tick.Stop()
	for metric(t, url, series) < least {
		select {
		case <-tick.C:
		case <-deadline:
			t.Fatalf("%s: %s below %v for a minute", url, series, least)
		}
	}
}

// checkLsServing checks with `beacon ls -o json` that every instance is
// listed and served (its verdict not failing).
func checkLsServing(t *testing.T, dir, etcdURL string, refs []beacon.Ref) {
	t.Helper()
	ls := startOn(t, dir, nil, "ls", "drill", "-o", "json", "--endpoints", etcdURL)
	if err := ls.wait(t, 30*time.Second); err != nil {
		t.Fatalf("beacon ls: %v\n%s", err, ls.errOut())
	}
	var listed struct{ Instances []beacon.Instance }
	if err := json.Unmarshal([]byte(ls.out()), &listed); err != nil {
		t.Fatalf("beacon ls -o json: %v\n%s", err, ls.out())
	}
	serving := map[beacon.Ref]bool{}
	for _, in := range listed.Instances {
		serving[in.Ref()] = in.Serving()
	}
	for _, ref := range refs {
		if !serving[ref] {
			t.Errorf("beacon ls while the checker is cut off: %s not served (%d listed)", ref, len(listed.Instances))
		}
	}
}

// startHealthTargetOn starts a healthtarget listening on host's address,
// in its namespace.
func startHealthTargetOn(t *testing.T, host *etcdproc.Host) *healthTarget {
	t.Helper()
	bin := testpeer.GoBuild(t, "github.com/beaconplane/beacon/internal/lab/healthtarget")
	cmd := testpeer.Command(bin, "-host", host.Addr())
	host.Wrap(cmd)
	return runHealthTarget(t, cmd)
}

// view is the registry's view as `beacon watch -o json` prints it.
type view struct {
	w *child

	mu   sync.Mutex
	read int // bytes of w's output applied
	viewState
}

type viewState struct {
	instances map[beacon.Ref]beacon.Instance
	checkers  int
	marking   bool   // since mark: collect failing verdicts
	marks     []mark // failing verdicts seen since mark
}

// mark is a failing verdict the view showed.
type mark struct {
	ref  beacon.Ref
	what string
}

func watchView(t *testing.T, dir, etcdURL string) *view {
	t.Helper()
	w := startOn(t, dir, nil, "watch", "-o", "json", "--endpoints", etcdURL)
	return &view{w: w, viewState: viewState{instances: map[beacon.Ref]beacon.Instance{}}}
}

// apply applies the watch's lines printed since the last call.
func (v *view) apply(t *testing.T) {
	t.Helper()
	v.mu.Lock()
	defer v.mu.Unlock()
	out := v.w.out()[v.read:]
	end := strings.LastIndexByte(out, '\n') + 1
	v.read += end
	for _, line := range strings.Split(out[:end], "\n") {
		if line == "" {
			continue
		}
		var l watchLine
		if err := json.Unmarshal([]byte(line), &l); err != nil {
			t.Fatalf("beacon watch -o json printed %q: %v", line, err)
		}
		if l.Instance == nil {
			continue
		}
		in := *l.Instance
		if l.Type == "delete" {
			delete(v.instances, in.Ref())
		} else {
			v.instances[in.Ref()] = in
			if v.marking && in.Health.Failing() {
				v.marks = append(v.marks, mark{in.Ref(), fmt.Sprintf("%s by %s (%s)", in.Ref(), in.Health.Checker, in.Health.Reason)})
			}
		}
	}
	v.checkers = 0
	for ref := range v.instances {
		if ref.Namespace == healthcheck.CheckersNamespace && ref.Component == healthcheck.CheckersComponent {
			v.checkers++
		}
	}
}

// await waits until cond holds of the view.
func (v *view) await(t *testing.T, what string, cond func(*viewState) bool) {
	t.Helper()
	deadline := time.After(60 * time.Second)
	for {
		v.apply(t)
		v.mu.Lock()
		ok := cond(&v.viewState)
		v.mu.Unlock()
		if ok {
			return
		}
		select {
		case <-v.w.lines:
		case <-v.w.done:
			t.Fatalf("beacon watch exited (%v) before %s\n%s", v.w.err, what, v.w.errOut())
		case <-deadline:
			t.Fatalf("not %s within 60s; the view:\n%s", what, v.describe())
		}
	}
}

// mark starts collecting the failing verdicts the view shows.
func (v *view) mark() {
	v.mu.Lock()
	defer v.mu.Unlock()
	v.marking, v.marks = true, nil
}

// failingSinceMark applies what the watch printed and returns the failing
// verdicts seen since mark, but on the instances in except.
func (v *view) failingSinceMark(t *testing.T, except map[beacon.Ref]bool) []string {
	v.apply(t)
	v.mu.Lock()
	defer v.mu.Unlock()
	var out []string
	for _, m := range v.marks {
		if !except[m.ref] {
			out = append(out, m.what)
		}
	}
	return out
}

func (v *view) owners(refs []beacon.Ref) map[beacon.Ref]string {
	v.mu.Lock()
	defer v.mu.Unlock()
	out := map[beacon.Ref]string{}
	for _, ref := range refs {
		if h := v.instances[ref].Health; h != nil {
			out[ref] = h.Checker
		}
	}
	return out
}

func (v *view) describe() string {
	v.mu.Lock()
	defer v.mu.Unlock()
	var b strings.Builder
	for ref, in := range v.instances {
		fmt.Fprintf(&b, "%s %+v\n", ref, in.Health)
	}
	return b.String()
}

func passing(in beacon.Instance) bool {
	return in.Health != nil && in.Health.Status == beacon.HealthPassing
}

// all reports whether every instance at refs is in the view and ok.
func (s *viewState) all(refs []beacon.Ref, ok func(beacon.Instance) bool) bool {
	for _, ref := range refs {
		in, found := s.instances[ref]
		if !found || !ok(in) {
			return false
		}
	}
	return true
}

// failing reports whether the instance at ref is marked failing by
// checker.
func (s *viewState) failing(ref beacon.Ref, checker string) bool {
	h := s.instances[ref].Health
	return h != nil && h.Status == beacon.HealthFailing && h.Checker == checker
}
