package bench

import (
	"context"
	"errors"
	"fmt"
	"io"
	"log/slog"
	"net/http"
	"os"
	"os/exec"
	"path/filepath"
	"strconv"
	"strings"
	"sync"
	"time"

	"github.com/beaconplane/beacon"
	"github.com/beaconplane/beacon/internal/lab/freeport"
	"github.com/beaconplane/beacon/internal/syncbuf"
	"github.com/beaconplane/beacon/naming"
	"github.com/beaconplane/beacon/naming/namingtest"
	"github.com/beaconplane/beacon/registry"
	"github.com/beaconplane/beacon/server/xdsapi"
	"github.com/beaconplane/beacon/store/etcd"
	discoveryv3 "github.com/envoyproxy/go-control-plane/envoy/service/discovery/v3"
	"google.golang.org/grpc"
	"google.golang.org/grpc/credentials/insecure"
)

// XDSConfig configures the xds scenario. Zero values take the defaults in
// brackets.
type XDSConfig struct {
	// BeaconCommand runs `beacon serve` in a process of its own: the
	// beacon binary (with "serve" and flags appended). Required.
	BeaconCommand []string
	// ProbeBin is the xDS client process (internal/lab/xdsprobe); found like
	// the other peers when empty.
	ProbeBin string
	// Trials is the number of registrations, and of drains, timed [20].
	Trials int
	// Callers is the number of goroutines calling through each client
	// [8]; each waits Pace between calls [1ms].
	Callers int
	Pace    time.Duration
	// Quiet is how long a drained backend must receive no call from a
	// client before its last call counts as the last [100ms].
	Quiet time.Duration
	// Streams is the number of ADS streams that follow one service while
	// it changes [1,000; the documented full size is 10,000], and Changes
	// the number of changes timed [20].
	Streams int
	Changes int
	// Logger for progress; nil discards.
	Logger *slog.Logger
}

// MaxXDSStreams bounds Streams: each is a goroutine and a buffer in this
// process and in beacon serve's.
const MaxXDSStreams = 200_000

// Validate checks the configuration.
func (c XDSConfig) Validate() error {
	if len(c.BeaconCommand) == 0 {
		return errors.New("bench: the xds scenario needs the beacon binary (BeaconCommand) to run beacon serve")
	}
	if err := checkNotNegative(map[string]int{"trials": c.Trials, "callers": c.Callers, "streams": c.Streams, "changes": c.Changes},
		map[string]time.Duration{"pace": c.Pace, "quiet": c.Quiet}); err != nil {
		return err
	}
	if c.Streams > MaxXDSStreams {
		return fmt.Errorf("bench: --streams %d: at most %d (each stream costs a goroutine and buffers on both sides: about 40 KB of this machine's memory)", c.Streams, MaxXDSStreams)
	}
	return nil
}

func (c *XDSConfig) defaults() {
	setPositive(&c.Trials, 20)
	setPositive(&c.Callers, 8)
	setPositive(&c.Pace, time.Millisecond)
	setPositive(&c.Quiet, 100*time.Millisecond)
	setPositive(&c.Streams, 1000)
	setPositive(&c.Changes, 20)
	setDefault(&c.Logger, discardLogger())
}

// XDSProbePeer is the xDS client process of the xds scenario: grpc-go's own
// xDS support, which the beacon binary does not link.
var XDSProbePeer = Peer{
	Name: "beacon-xdsprobe", What: "the xDS client of `beacon bench xds` (grpc-go's xDS support)", Flag: "--probe-bin",
	Build: `go build -o "` + filepath.Join(PeersDir(), "bin", "beacon-xdsprobe") + `" ./internal/lab/xdsprobe   (from a Beacon checkout)`,
}

// The two sides of the naming comparison, as backends count their calls.
const (
	sideXDS      = "xds"
	sideResolver = "beacon-resolver"
)

// RunXDS measures Beacon's xDS server (beacon serve --xds-addr, in a
// process of its own) with a real xDS client (grpc-go's, in a third
// process), beside Beacon's own beacon:/// resolver in this one, both
// calling the same backends under load:
//
//   - register → the first call a new backend receives from each client;
//   - drain → the last call a drained backend receives from each client;
//   - one change of a service → every one of Streams ADS streams that
//     follow it has the new assignment (this process holds the streams,
//     with the protocol as Envoy speaks it), and how many times beacon
//     serve encoded the assignment for them;
//   - beacon serve's memory per idle ADS stream.
func RunXDS(ctx context.Context, cfg XDSConfig) (*Report, error) {
	if err := cfg.Validate(); err != nil {
		return nil, err
	}
	cfg.defaults()
	probe, err := XDSProbePeer.Find(cfg.ProbeBin)
	if err != nil {
		return nil, err
	}
	srv, err := startServeForXDS(ctx, cfg)
	if err != nil {
		return nil, err
	}
	defer srv.stop()
	xb, err := newXDSBench(ctx, cfg, srv, probe)
	if err != nil {
		return nil, err
	}
	defer xb.close()

	r := &Report{
		Scenario:     "xds",
		BaselineName: "beacon:/// resolver",
		Setup: fmt.Sprintf("beacon serve (embedded etcd, no fsync) in its own process; an xDS client (grpc-go %s, xdsprobe) in another; "+
			"Beacon's beacon:/// resolver in this one, over the same etcd; each client %d callers (one call, then %v pause); %d trials; %d ADS streams",
			grpc.Version, cfg.Callers, cfg.Pace, cfg.Trials, cfg.Streams),
	}
	reg, drain, err := xb.namingTrials(ctx)
	if err != nil {
		return nil, err
	}
	for _, m := range []struct {
		name string
		lat  map[string][]time.Duration
		goal float64
	}{{"register → first call to the new backend", reg, 2.0}, {"drain → last call to the drained backend", drain, 0}} {
		for _, p := range []float64{50, 99} {
			goal := m.goal
			if p == 99 {
				goal = 0
			}
			r.Add(Row{Metric: fmt.Sprintf("%s, p%.0f", m.name, p), Unit: "ms",
				Beacon: Ms(Percentile(m.lat[sideXDS], p)), Baseline: Ms(Percentile(m.lat[sideResolver], p)), Goal: goal})
		}
	}
	r.Add(Row{Metric: "register → first call over xds:///, p99", Unit: "ms", Beacon: Ms(Percentile(reg[sideXDS], 99)),
		Baseline: 50, Against: "goal (50 ms)", Goal: 1.0})
	fan, err := xb.fanOut(ctx)
	if err != nil {
		return nil, err
	}
	streams := strconv.Itoa(cfg.Streams)
	r.Add(Row{Metric: "one change → " + streams + " ADS streams updated, p50", Unit: "ms", Beacon: Ms(Percentile(fan.delays, 50)), NoBaseline: true})
	r.Add(Row{Metric: "one change → " + streams + " ADS streams updated, p99", Unit: "ms", Beacon: Ms(Percentile(fan.delays, 99)),
		Baseline: 1000, Against: "goal (1 s)", Goal: 1.0})
	r.Add(Row{Metric: "one change → the last of " + streams + " streams updated, median over changes", Unit: "ms", Beacon: Ms(Percentile(fan.last, 50)), NoBaseline: true})
	r.Add(Row{Metric: "assignments encoded per change (for all streams)", Unit: "marshals", Beacon: fan.marshalsPerChange,
		Baseline: 1, Against: "goal (exactly 1)", Goal: 1.0})
	r.Add(Row{Metric: "beacon serve memory per idle ADS stream (heap + stacks)", Unit: "KB", Beacon: fan.bytesPerStream / 1024,
		Baseline: 20, Against: "goal (20 KB)", Goal: 1.0})
	r.Note("register: Registration of a new backend's instance (in etcd, through this process's registry) → the first call that backend received from each client; drain: Update to draining → the last call it received, once %v passed without one", cfg.Quiet)
	r.Note("the beacon:/// resolver follows etcd directly from this process; xDS goes etcd → beacon serve's registry watch → an ADS push → the client in its own process")
	r.Note("fan-out: %d raw ADS streams over %d connections from this process, each following one service's assignment and ACKing each response; %d changes (a registration in that service), each timed from the start of the registry write to each stream's receipt",
		cfg.Streams, fan.conns, cfg.Changes)
	r.Note("memory: beacon serve's go_memstats_heap_inuse_bytes + go_memstats_stack_inuse_bytes after a forced GC, with the streams open minus before, per stream")
	return r, nil
}

// serveProc is the beacon serve process of the xds scenario.
type serveProc struct {
	*proc
	http, xds string
	etcdEps   []string
}

// startServeForXDS runs beacon serve with embedded etcd, xDS without a
// per-client bound (every stream comes from this host) and profiling (a
// forced GC before memory is read).
func startServeForXDS(ctx context.Context, cfg XDSConfig) (*serveProc, error) {
	ports := make([]int, 4)
	for i := range ports {
		p, err := freeport.Port()
		if err != nil {
			return nil, err
		}
		ports[i] = p
	}
	dir, err := os.MkdirTemp("", "beacon-bench-xds-")
	if err != nil {
		return nil, err
	}
	addr := func(i int) string { return "127.0.0.1:" + strconv.Itoa(ports[i]) }
	argv := append(append([]string{}, cfg.BeaconCommand...), "serve", "--data-dir", filepath.Join(dir, "data"),
		"--listen-client-urls", "http://"+addr(0), "--listen-peer-urls", "http://"+addr(1),
		"--http-addr", addr(2), "--xds-addr", addr(3), "--dns-addr=", "--unsafe-no-fsync", "--pprof",
		"--xds-max-streams-per-client", "-1", "--xds-max-streams", strconv.Itoa(cfg.Streams+1000), "--log-level", "warn")
	p, err := startProc(ctx, cfg.Logger, "beacon serve", addr(0), argv, dir)
	if err != nil {
		_ = os.RemoveAll(dir)
		return nil, err
	}
	s := &serveProc{proc: p, http: "http://" + addr(2), xds: addr(3), etcdEps: []string{"http://" + addr(0)}}
	if err := poll(ctx, 30*time.Second, "beacon serve's xDS ready", func() bool {
		v, err := scrape(ctx, s.http, "beacon_xds_ready")
		return err == nil && v == 1
	}); err != nil {
		s.stop()
		return nil, err
	}
	return s, nil
}

// scrape reads one series of a metric from a /metrics page: series is
// the line's start up to its value, e.g. go_goroutines or
// beacon_xds_marshals_total{type="endpoint"}.
func scrape(ctx context.Context, base, series string) (float64, error) {
	var v string
	found := false
	err := readMetrics(ctx, base, func(line string) bool {
		v, found = strings.CutPrefix(line, series+" ")
		return !found
	})
	if err != nil {
		return 0, err
	}
	if !found {
		return 0, fmt.Errorf("bench: no %s at %s/metrics", series, base)
	}
	return strconv.ParseFloat(strings.TrimSpace(v), 64)
}

// xdsBench holds the backends, the registry and the two clients.
type xdsBench struct {
	cfg    XDSConfig
	srv    *serveProc
	st     *etcd.Store
	reg    *registry.StoreRegistry
	q      beacon.Query
	steady []*namingtest.Backend
	regs   []registry.Registration
	cc     *grpc.ClientConn // the beacon:/// resolver's channel
	stopCC func()
	probe  *exec.Cmd
	in     io.WriteCloser
	out    *syncbuf.Buffer
	done   chan struct{}
}

func newXDSBench(ctx context.Context, cfg XDSConfig, srv *serveProc, probeBin string) (_ *xdsBench, err error) {
	xb := &xdsBench{cfg: cfg, srv: srv, q: beacon.Query{Namespace: "bench", Component: "xds", Endpoint: "grpc"}}
	defer func() {
		if err != nil {
			xb.close()
		}
	}()
	if xb.st, err = etcd.Open(ctx, etcd.Config{Endpoints: srv.etcdEps}); err != nil {
		return nil, err
	}
	if xb.reg, err = registry.New(xb.st, registry.Config{}); err != nil {
		return nil, err
	}
	for i := range 2 {
		b, err := namingtest.NewBackend(fmt.Sprintf("steady%d", i))
		if err != nil {
			return nil, err
		}
		xb.steady = append(xb.steady, b)
		r, err := xb.register(ctx, b)
		if err != nil {
			return nil, err
		}
		xb.regs = append(xb.regs, r)
	}
	builder, err := naming.NewBuilder(xb.reg)
	if err != nil {
		return nil, err
	}
	if xb.cc, err = grpc.NewClient(naming.Target(xb.q), builder.DialOption(),
		grpc.WithTransportCredentials(insecure.NewCredentials()),
		grpc.WithDefaultServiceConfig(`{"loadBalancingConfig":[{"round_robin":{}}]}`)); err != nil {
		return nil, err
	}
	xb.stopCC = callLoop(xb.cc, sideResolver, cfg.Callers, cfg.Pace)
	if err := xb.startProbe(probeBin); err != nil {
		return nil, err
	}
	return xb, nil
}

// startProbe starts the xDS client process.
func (xb *xdsBench) startProbe(bin string) error {
	boot, err := xdsapi.Bootstrap(xdsapi.BootstrapConfig{Server: xb.srv.xds, NodeID: "beacon-bench-xds"})
	if err != nil {
		return err
	}
	bootFile := filepath.Join(xb.srv.tmpDir, "xds-bootstrap.json")
	if err := os.WriteFile(bootFile, boot, 0o600); err != nil {
		return err
	}
	target := "xds:///" + xb.q.Endpoint + "." + xb.q.Component + "." + xb.q.Namespace
	cmd := exec.Command(bin, "--target", target, "--callers", strconv.Itoa(xb.cfg.Callers), "--pace", xb.cfg.Pace.String(), "--tag", sideXDS)
	cmd.Env = append(os.Environ(), "GRPC_XDS_BOOTSTRAP="+bootFile)
	cmd.SysProcAttr = childAttr()
	xb.out = &syncbuf.Buffer{}
	cmd.Stdout, cmd.Stderr = xb.out, xb.out
	if xb.in, err = cmd.StdinPipe(); err != nil {
		return err
	}
	if err := cmd.Start(); err != nil {
		return fmt.Errorf("bench: start %s: %w", bin, err)
	}
	xb.probe, xb.done = cmd, make(chan struct{})
	go func() { _ = cmd.Wait(); close(xb.done) }()
	return nil
}

func (xb *xdsBench) register(ctx context.Context, b *namingtest.Backend) (registry.Registration, error) {
	return xb.reg.Register(ctx, beacon.Instance{Namespace: xb.q.Namespace, Component: xb.q.Component, Endpoint: xb.q.Endpoint,
		Address: b.Addr(), Transport: "grpc"})
}

func (xb *xdsBench) close() {
	if xb.probe != nil {
		_ = xb.in.Close()
		select {
		case <-xb.done:
		case <-time.After(10 * time.Second):
			_ = xb.probe.Process.Kill()
			<-xb.done
		}
	}
	if xb.stopCC != nil {
		xb.stopCC()
	}
	if xb.cc != nil {
		_ = xb.cc.Close()
	}
	for _, r := range xb.regs {
		_ = r.Close()
	}
	for _, b := range xb.steady {
		b.Stop()
	}
	if xb.reg != nil {
		_ = xb.reg.Close()
	}
	if xb.st != nil {
		_ = xb.st.Close()
	}
}

// callLoop calls cc from callers goroutines, tagged side, until stopped.
func callLoop(cc *grpc.ClientConn, side string, callers int, pace time.Duration) (stop func()) {
	ctx, cancel := context.WithCancel(context.Background())
	var wg sync.WaitGroup
	tagged := namingtest.Tag(ctx, side)
	for range callers {
		wg.Go(func() {
			t := time.NewTicker(pace)
			defer t.Stop()
			for ctx.Err() == nil {
				cctx, ccancel := context.WithTimeout(tagged, 2*time.Second)
				_, _ = namingtest.Call(cctx, cc)
				ccancel()
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

// namingTrials times, for each trial, a new backend's first call and a
// drained backend's last call from both clients.
func (xb *xdsBench) namingTrials(ctx context.Context) (reg, drain map[string][]time.Duration, err error) {
	sides := []string{sideXDS, sideResolver}
	for _, b := range xb.steady {
		for _, side := range sides {
			if err := poll(ctx, 30*time.Second, fmt.Sprintf("the %s client reaches %s", side, b.Name()),
				func() bool { return b.CallsFrom(side) > 2 }); err != nil {
				return nil, nil, fmt.Errorf("%w (xdsprobe: %s)", err, lastLines(xb.out.String(), 5))
			}
		}
	}
	reg, drain = map[string][]time.Duration{}, map[string][]time.Duration{}
	for k := range xb.cfg.Trials {
		b, err := namingtest.NewBackend(fmt.Sprintf("trial%d", k))
		if err != nil {
			return nil, nil, err
		}
		t0 := time.Now()
		r, err := xb.register(ctx, b)
		if err != nil {
			b.Stop()
			return nil, nil, err
		}
		for _, side := range sides {
			if err := poll(ctx, 10*time.Second, side+" client calls "+b.Name(), func() bool { return !b.FirstCall(side).IsZero() }); err != nil {
				return nil, nil, errors.Join(err, r.Close(), func() error { b.Stop(); return nil }())
			}
			reg[side] = append(reg[side], b.FirstCall(side).Sub(t0))
		}
		t1 := time.Now()
		if err := r.Update(ctx, func(in *beacon.Instance) { in.Status = beacon.StatusDraining }); err != nil {
			return nil, nil, err
		}
		for _, side := range sides {
			if err := poll(ctx, 10*time.Second, side+" client stops calling "+b.Name(), func() bool {
				return time.Since(b.LastCall(side)) >= xb.cfg.Quiet && time.Since(t1) >= xb.cfg.Quiet
			}); err != nil {
				return nil, nil, err
			}
			drain[side] = append(drain[side], max(0, b.LastCall(side).Sub(t1)))
		}
		_ = r.Close()
		b.Stop()
		xb.cfg.Logger.Debug("xds trial", "trial", k, "register_xds", reg[sideXDS][k], "register_resolver", reg[sideResolver][k],
			"drain_xds", drain[sideXDS][k], "drain_resolver", drain[sideResolver][k])
	}
	return reg, drain, nil
}

// fanOutResult is what the fan-out part measured.
type fanOutResult struct {
	delays            []time.Duration // change → a stream's receipt, every stream of every change
	last              []time.Duration // change → the last stream's receipt, per change
	marshalsPerChange float64
	bytesPerStream    float64
	conns             int
}

// streamsPerConn is how many ADS streams share one connection in the
// fan-out (an Envoy fleet has one per process; this keeps the client side
// of a 10,000-stream run light).
const streamsPerConn = 100

// fanOut opens the ADS streams, measures beacon serve's memory per stream,
// then times the changes.
func (xb *xdsBench) fanOut(ctx context.Context) (fanOutResult, error) {
	const name = "grpc.fanout.bench"
	var res fanOutResult
	before, err := xb.serveMemory(ctx)
	if err != nil {
		return res, err
	}
	res.conns = (xb.cfg.Streams + streamsPerConn - 1) / streamsPerConn
	var conns []*grpc.ClientConn
	defer func() {
		for _, c := range conns {
			_ = c.Close()
		}
	}()
	for range res.conns {
		cc, err := grpc.NewClient(xb.srv.xds, grpc.WithTransportCredentials(insecure.NewCredentials()))
		if err != nil {
			return res, err
		}
		conns = append(conns, cc)
	}
	sctx, cancel := context.WithCancel(ctx)
	defer cancel()
	changed := make(chan time.Time, xb.cfg.Streams) // receipt times of the current change
	var wg sync.WaitGroup
	defer wg.Wait()
	defer cancel()
	opened := make(chan error, xb.cfg.Streams)
	for i := range xb.cfg.Streams {
		wg.Go(func() { adsFollower(sctx, conns[i/streamsPerConn], name, opened, changed) })
	}
	for range xb.cfg.Streams {
		select {
		case err := <-opened:
			if err != nil {
				return res, err
			}
		case <-ctx.Done():
			return res, ctx.Err()
		}
	}
	after, err := xb.serveMemory(ctx)
	if err != nil {
		return res, err
	}
	res.bytesPerStream = (after - before) / float64(xb.cfg.Streams)
	m0, err := scrape(ctx, xb.srv.http, `beacon_xds_marshals_total{type="endpoint"}`)
	if err != nil {
		return res, err
	}
	svc := beacon.Query{Namespace: "bench", Component: "fanout", Endpoint: "grpc"}
	var live []registry.Registration
	defer func() {
		for _, r := range live {
			_ = r.Close()
		}
	}()
	for k := range xb.cfg.Changes {
		t0 := time.Now()
		r, err := xb.reg.Register(ctx, beacon.Instance{Namespace: svc.Namespace, Component: svc.Component, Endpoint: svc.Endpoint,
			Address: fmt.Sprintf("10.0.%d.%d:80", k/250, k%250+1)})
		if err != nil {
			return res, err
		}
		live = append(live, r)
		var last time.Duration
		for range xb.cfg.Streams {
			select {
			case at := <-changed:
				d := at.Sub(t0)
				res.delays = append(res.delays, d)
				last = max(last, d)
			case <-time.After(30 * time.Second):
				return res, fmt.Errorf("bench: change %d did not reach every ADS stream within 30 s", k)
			case <-ctx.Done():
				return res, ctx.Err()
			}
		}
		res.last = append(res.last, last)
	}
	m1, err := scrape(ctx, xb.srv.http, `beacon_xds_marshals_total{type="endpoint"}`)
	if err != nil {
		return res, err
	}
	res.marshalsPerChange = (m1 - m0) / float64(xb.cfg.Changes)
	return res, nil
}

// adsFollower opens one ADS stream on cc, subscribes to the assignment
// name, reports on opened once the first response is in, then reports the
// receipt time of every further response on changed, acknowledging each,
// until ctx ends.
func adsFollower(ctx context.Context, cc *grpc.ClientConn, name string, opened chan<- error, changed chan<- time.Time) {
	st, err := discoveryv3.NewAggregatedDiscoveryServiceClient(cc).StreamAggregatedResources(ctx)
	if err == nil {
		err = st.Send(&discoveryv3.DiscoveryRequest{TypeUrl: xdsapi.EndpointType, ResourceNames: []string{name}})
	}
	first := true
	for err == nil {
		var resp *discoveryv3.DiscoveryResponse
		if resp, err = st.Recv(); err != nil {
			break
		}
		at := time.Now()
		if first {
			first = false
			if !send(ctx, opened, nil) {
				return
			}
		} else if !send(ctx, changed, at) {
			return
		}
		err = st.Send(&discoveryv3.DiscoveryRequest{TypeUrl: xdsapi.EndpointType, ResourceNames: []string{name},
			VersionInfo: resp.GetVersionInfo(), ResponseNonce: resp.GetNonce()})
	}
	if first && ctx.Err() == nil {
		send(ctx, opened, fmt.Errorf("bench: ADS stream: %w", err))
	}
}

// send sends v on ch unless ctx ends first (the reader gave up: a follower
// must not block its owner's Wait), and says whether it did.
func send[T any](ctx context.Context, ch chan<- T, v T) bool {
	select {
	case ch <- v:
		return true
	case <-ctx.Done():
		return false
	}
}

// serveMemory forces a GC in beacon serve and returns its heap and stack
// in use.
func (xb *xdsBench) serveMemory(ctx context.Context) (float64, error) {
	req, err := http.NewRequestWithContext(ctx, http.MethodGet, xb.srv.http+"/debug/pprof/heap?gc=1", nil)
	if err != nil {
		return 0, err
	}
	resp, err := http.DefaultClient.Do(req)
	if err != nil {
		return 0, err
	}
	_, _ = io.Copy(io.Discard, resp.Body)
	_ = resp.Body.Close()
	heap, err := scrape(ctx, xb.srv.http, "go_memstats_heap_inuse_bytes")
	if err != nil {
		return 0, err
	}
	stack, err := scrape(ctx, xb.srv.http, "go_memstats_stack_inuse_bytes")
	return heap + stack, err
}
