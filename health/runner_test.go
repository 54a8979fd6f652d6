package health

import (
	"context"
	"errors"
	"net"
	"strings"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/beaconplane/beacon"
	"go.uber.org/goleak"
	"google.golang.org/grpc"
	healthpb "google.golang.org/grpc/health/grpc_health_v1"
)

func TestMain(m *testing.M) { goleak.VerifyTestMain(m) }

type change struct {
	status Status
	reason error
	// ticks is how many times the Runner had drawn its jitter by then:
	// once at the start and once at each interval's tick, before its
	// result.
	ticks int64
}

// runRunner runs r until the test ends and returns its changes. A nil
// Jitter is 0.
func runRunner(t *testing.T, r *Runner) <-chan change {
	t.Helper()
	ch, _ := runTicked(t, r)
	return ch
}

// runTicked is runRunner, and returns the Runner's tick count too.
func runTicked(t *testing.T, r *Runner) (<-chan change, *atomic.Int64) {
	t.Helper()
	ticks := &atomic.Int64{}
	jitter := r.Jitter
	if jitter == nil {
		jitter = func() float64 { return 0 }
	}
	r.Jitter = func() float64 { ticks.Add(1); return jitter() }
	ch := make(chan change, 16)
	r.OnChange = func(s Status, err error) { ch <- change{s, err, ticks.Load()} }
	ctx, cancel := context.WithCancel(context.Background())
	done := make(chan struct{})
	go func() { defer close(done); _ = r.Run(ctx) }()
	t.Cleanup(func() { cancel(); <-done })
	return ch, ticks
}

func expect(t *testing.T, ch <-chan change, want Status) change {
	t.Helper()
	select {
	case c := <-ch:
		if c.status != want {
			t.Fatalf("status %s (%v), want %s", c.status, c.reason, want)
		}
		return c
	case <-time.After(30 * time.Second):
		t.Fatalf("no change to %s within 30 s", want)
	}
	return change{}
}

var quick = beacon.Check{Interval: beacon.MinCheckInterval, Timeout: 400 * time.Millisecond, Rise: 1, Fall: 2}

func with(kind beacon.CheckKind, c beacon.Check) beacon.Check { c.Kind = kind; return c }

// TestRunnerGRPCWatch: a gRPC check follows the server's Watch: NOT_SERVING
// takes the instance out, SERVING brings it back.
func TestRunnerGRPCWatch(t *testing.T) {
	hs, addr := grpcServer(t, false)
	ch := runRunner(t, &Runner{Check: with(beacon.CheckGRPC, quick), Addr: addr})
	expect(t, ch, Passing)
	hs.SetServingStatus("", healthpb.HealthCheckResponse_NOT_SERVING)
	if c := expect(t, ch, Failing); c.reason == nil {
		t.Fatal("failing without a reason")
	}
	hs.SetServingStatus("", healthpb.HealthCheckResponse_SERVING)
	expect(t, ch, Passing)
}

// TestRunnerGRPCServerGone: the watched server stops: the broken stream
// and the failed reconnections count as failures.
func TestRunnerGRPCServerGone(t *testing.T) {
	lis, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	srv := grpc.NewServer()
	healthpb.RegisterHealthServer(srv, newCheckOnly(true))
	go func() { _ = srv.Serve(lis) }()
	defer srv.Stop()
	ch := runRunner(t, &Runner{Check: with(beacon.CheckGRPC, quick), Addr: lis.Addr().String()})
	expect(t, ch, Passing)
	srv.Stop()
	expect(t, ch, Failing)
}

// checkOnly serves grpc.health.v1 Check but not Watch, as some servers do.
type checkOnly struct {
	healthpb.UnimplementedHealthServer
	serving atomic.Bool
}

func newCheckOnly(serving bool) *checkOnly {
	c := &checkOnly{}
	c.serving.Store(serving)
	return c
}

func (c *checkOnly) Check(context.Context, *healthpb.HealthCheckRequest) (*healthpb.HealthCheckResponse, error) {
	s := healthpb.HealthCheckResponse_NOT_SERVING
	if c.serving.Load() {
		s = healthpb.HealthCheckResponse_SERVING
	}
	return &healthpb.HealthCheckResponse{Status: s}, nil
}

// TestRunnerGRPCPollsWithoutWatch: a server without Watch is polled with
// Check.
func TestRunnerGRPCPollsWithoutWatch(t *testing.T) {
	lis, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	srv := grpc.NewServer()
	hs := newCheckOnly(true)
	healthpb.RegisterHealthServer(srv, hs)
	go func() { _ = srv.Serve(lis) }()
	defer srv.Stop()
	ch := runRunner(t, &Runner{Check: with(beacon.CheckGRPC, quick), Addr: lis.Addr().String()})
	expect(t, ch, Passing)
	hs.serving.Store(false)
	expect(t, ch, Failing)
	hs.serving.Store(true)
	expect(t, ch, Passing)
}

// TestRunnerHTTPUnreachable: an unreachable address fails after Fall
// probes, with the dial error as the reason.
func TestRunnerHTTPUnreachable(t *testing.T) {
	ch := runRunner(t, &Runner{Check: with(beacon.CheckHTTP, beacon.Check{Path: "/ok", Interval: quick.Interval, Timeout: quick.Timeout, Fall: 2}), Addr: closedAddr(t)})
	expect(t, ch, Failing)
}

// TestRunnerTTL: a TTL check whose service never reported stays unknown
// (no grace pass) and fails one TTL after the check started; it passes at
// the next report, and fails again one TTL after the last one.
func TestRunnerTTL(t *testing.T) {
	const ttl = beacon.MinCheckTTL
	r := &Runner{Check: beacon.Check{Kind: beacon.CheckTTL, TTL: ttl}}
	start := time.Now()
	ch := runRunner(t, r)
	if c := expect(t, ch, Failing); time.Since(start) < ttl || !strings.Contains(c.reason.Error(), "since its check was first seen") {
		t.Fatalf("failing %v after the start because %v: want one TTL (%v), never reported", time.Since(start), c.reason, ttl)
	}
	r.Report()
	expect(t, ch, Passing)
	r.Report()
	last := time.Now()
	if expect(t, ch, Failing); time.Since(last) < ttl {
		t.Fatalf("failing %v after the last report, before its TTL (%v)", time.Since(last), ttl)
	}
}

// TestRunnerTTLIgnoresIntervalAndThresholds: a TTL check fails one TTL
// after the last report whatever interval, rise and fall an older writer
// stored with it (an interval of 10 minutes and fall 3 would take half an
// hour), and passes at the next report whatever the rise.
func TestRunnerTTLIgnoresIntervalAndThresholds(t *testing.T) {
	const ttl = beacon.MinCheckTTL
	c := beacon.Check{Kind: beacon.CheckTTL, TTL: ttl, Interval: beacon.MaxCheckInterval, Rise: 3, Fall: 3}
	r := &Runner{Check: c}
	r.Report()
	last := time.Now()
	ch := runRunner(t, r)
	expect(t, ch, Passing)
	if expect(t, ch, Failing); time.Since(last) < ttl {
		t.Fatalf("failing %v after the last report, before its TTL (%v)", time.Since(last), ttl)
	}
	r.Report()
	expect(t, ch, Passing)
}

// TestJitter: the first probe comes anywhere within one interval, later
// ones every interval ±10 %.
func TestJitter(t *testing.T) {
	iv := 10 * time.Second
	for j, want := range map[float64][2]time.Duration{
		0:     {0, 9 * time.Second},
		0.5:   {5 * time.Second, 10 * time.Second},
		0.999: {9990 * time.Millisecond, 10998 * time.Millisecond},
	} {
		if got := firstWait(iv, j); got != want[0] {
			t.Errorf("firstWait(%v) = %s, want %s", j, got, want[0])
		}
		if got := nextWait(iv, j); got != want[1] {
			t.Errorf("nextWait(%v) = %s, want %s", j, got, want[1])
		}
	}
}

// scripted is a grpc-go health server that does what grpc-go's own does
// not: its Watch pushes every status set, a repeated one too (as grpc-js's
// grpc-health-check and grpcio-health-checking do), and it can hang: while
// stalled, Check answers nothing and Watch pushes nothing, and their
// connections stay open.
type scripted struct {
	healthpb.UnimplementedHealthServer
	mu       sync.Mutex
	status   healthpb.HealthCheckResponse_ServingStatus
	watchers []chan healthpb.HealthCheckResponse_ServingStatus
	resumed  chan struct{} // open while stalled
}

// scriptedServer starts a scripted server, serving, on a loopback port.
func scriptedServer(t *testing.T) (*scripted, string) {
	t.Helper()
	lis, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	s := &scripted{status: healthpb.HealthCheckResponse_SERVING, resumed: make(chan struct{})}
	close(s.resumed)
	srv := grpc.NewServer()
	healthpb.RegisterHealthServer(srv, s)
	go func() { _ = srv.Serve(lis) }()
	t.Cleanup(func() { s.resume(); srv.Stop() })
	return s, lis.Addr().String()
}

func (s *scripted) set(status healthpb.HealthCheckResponse_ServingStatus) {
	s.mu.Lock()
	defer s.mu.Unlock()
	s.status = status
	for _, w := range s.watchers {
		w <- status
	}
}

func (s *scripted) stall() {
	s.mu.Lock()
	s.resumed = make(chan struct{})
	s.mu.Unlock()
}

func (s *scripted) resume() {
	s.mu.Lock()
	defer s.mu.Unlock()
	select {
	case <-s.resumed:
	default:
		close(s.resumed)
	}
}

// await returns once the server is not stalled, or ctx ends.
func (s *scripted) await(ctx context.Context) error {
	s.mu.Lock()
	resumed := s.resumed
	s.mu.Unlock()
	select {
	case <-resumed:
		return nil
	case <-ctx.Done():
		return ctx.Err()
	}
}

func (s *scripted) Check(ctx context.Context, _ *healthpb.HealthCheckRequest) (*healthpb.HealthCheckResponse, error) {
	if err := s.await(ctx); err != nil {
		return nil, err
	}
	s.mu.Lock()
	defer s.mu.Unlock()
	return &healthpb.HealthCheckResponse{Status: s.status}, nil
}

func (s *scripted) Watch(_ *healthpb.HealthCheckRequest, stream healthpb.Health_WatchServer) error {
	pushes := make(chan healthpb.HealthCheckResponse_ServingStatus, 16)
	s.mu.Lock()
	s.watchers = append(s.watchers, pushes)
	pushes <- s.status
	s.mu.Unlock()
	for {
		select {
		case status := <-pushes:
			if err := s.await(stream.Context()); err != nil {
				return err
			}
			if err := stream.Send(&healthpb.HealthCheckResponse{Status: status}); err != nil {
				return err
			}
		case <-stream.Context().Done():
			return stream.Context().Err()
		}
	}
}

// TestRunnerGRPCRepeatedPushCountsOnce: a status pushed again unchanged
// is no new result: Fall pushes of NOT_SERVING in a row fail the check
// only after Fall results (the first push and Fall-1 intervals).
func TestRunnerGRPCRepeatedPushCountsOnce(t *testing.T) {
	s, addr := scriptedServer(t)
	c := with(beacon.CheckGRPC, quick)
	c.Interval, c.Fall = 2*time.Second, 3
	ch, ticks := runTicked(t, &Runner{Check: c, Addr: addr})
	expect(t, ch, Passing)
	before := ticks.Load()
	for range c.Fall {
		s.set(healthpb.HealthCheckResponse_NOT_SERVING)
	}
	if got := expect(t, ch, Failing).ticks - before; got < int64(c.Fall-1) {
		t.Fatalf("failing %d intervals after %d pushes of NOT_SERVING, want at least %d", got, c.Fall, c.Fall-1)
	}
}

// TestRunnerGRPCFlapShorterThanFallChangesNothing: a real gRPC health
// server NOT_SERVING for two ticks at a time (interval 1 s, the waits
// 0.9 s, the shortest the jitter allows; fall 3, rise 2) changes nothing,
// although each outage gives three failures — the push, and the Check of
// each tick — two of them in one interval; a lasting outage fails the
// check. The flips are made from the Runner's own ticks (its Jitter), so
// that the test does not depend on how fast the machine is.
func TestRunnerGRPCFlapShorterThanFallChangesNothing(t *testing.T) {
	hs, addr := grpcServer(t, false)
	const lasting = 12 // from this draw of the jitter on, NOT_SERVING stays
	var draws int
	jitter := func() float64 {
		draws++ // 1: the first wait; n > 1: the tick n-1, before its probe
		switch {
		case draws >= lasting || draws%3 == 0:
			hs.SetServingStatus("", healthpb.HealthCheckResponse_NOT_SERVING)
		case draws%3 == 2 && draws > 2:
			hs.SetServingStatus("", healthpb.HealthCheckResponse_SERVING)
		}
		return 0
	}
	c := beacon.Check{Kind: beacon.CheckGRPC, Interval: time.Second, Timeout: 500 * time.Millisecond, Rise: 2, Fall: 3}
	ch, _ := runTicked(t, &Runner{Check: c, Addr: addr, Jitter: jitter})
	expect(t, ch, Passing)
	if got := expect(t, ch, Failing); got.ticks < int64(lasting+c.Fall-1) {
		t.Fatalf("failing at draw %d of the jitter, while NOT_SERVING lasted two ticks at a time until draw %d: "+
			"a push and a Check in one interval counted twice", got.ticks, lasting)
	}
}

// TestRunnerGRPCHungWatch: a server that hangs with its Watch stream open
// fails the check (each interval's Check finds no answer), and passes
// again once it answers.
func TestRunnerGRPCHungWatch(t *testing.T) {
	s, addr := scriptedServer(t)
	ch := runRunner(t, &Runner{Check: with(beacon.CheckGRPC, quick), Addr: addr})
	expect(t, ch, Passing)
	s.stall()
	if c := expect(t, ch, Failing); c.reason == nil || !strings.Contains(c.reason.Error(), "no answer within the check's timeout (400ms)") {
		t.Fatalf("failing because %v, want no answer within the timeout", c.reason)
	}
	s.resume()
	expect(t, ch, Passing)
}

// TestRunnerGRPCUndialable: an address gRPC cannot dial fails the check,
// saying why.
func TestRunnerGRPCUndialable(t *testing.T) {
	ch := runRunner(t, &Runner{Check: with(beacon.CheckGRPC, quick), Addr: "%zz"})
	if c := expect(t, ch, Failing); c.reason == nil || !strings.Contains(c.reason.Error(), "invalid URL escape") {
		t.Fatalf("failing because %v, want the dial error", c.reason)
	}
}

// TestRunnerOnProbe: each interval's probe is reported with its result
// and duration.
func TestRunnerOnProbe(t *testing.T) {
	lis, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	defer lis.Close()
	for _, tc := range []struct {
		addr string
		pass bool
	}{{lis.Addr().String(), true}, {closedAddr(t), false}} {
		probes := make(chan error, 16)
		r := &Runner{Check: with(beacon.CheckTCP, quick), Addr: tc.addr,
			OnProbe: func(result error, took time.Duration) {
				if took <= 0 {
					t.Errorf("a probe took %v", took)
				}
				probes <- result
			}}
		runRunner(t, r)
		for range 2 {
			select {
			case result := <-probes:
				if (result == nil) != tc.pass {
					t.Fatalf("probe of %s: %v, want passing %v", tc.addr, result, tc.pass)
				}
			case <-time.After(30 * time.Second):
				t.Fatal("no probe reported within 30 s")
			}
		}
	}
}

// TestRunnerTTLRefresh: a TTL check's Refresh runs before each judgement
// of the report's age (every beacon.TTLReadInterval); a report it finds
// keeps the check passing, and a judgement whose Refresh fails has no
// result (the report could not be read: nothing is said of the service).
func TestRunnerTTLRefresh(t *testing.T) {
	var failRefresh, stopReporting atomic.Bool
	refreshed := make(chan struct{}, 64)
	probes := make(chan error, 64)
	r := &Runner{Check: beacon.Check{Kind: beacon.CheckTTL, TTL: beacon.MinCheckTTL},
		OnProbe: func(result error, _ time.Duration) { probes <- result }}
	r.Refresh = func(context.Context) error {
		defer func() { refreshed <- struct{}{} }()
		if failRefresh.Load() {
			return errors.New("the store is down")
		}
		if !stopReporting.Load() {
			r.Report()
		}
		return nil
	}
	failRefresh.Store(true)
	ch := runRunner(t, r)
	next := func() {
		t.Helper()
		select {
		case <-refreshed:
		case <-time.After(30 * time.Second):
			t.Fatal("no Refresh within 30 s")
		}
	}
	for range 8 { // 7 reads at least 225 ms apart (0.9 × TTL/4), or 6 and the one at expiry: past the TTL
		next()
	}
	if len(probes) != 0 || len(ch) != 0 {
		t.Fatalf("%d results and %d changes from intervals whose Refresh failed, want none", len(probes), len(ch))
	}
	failRefresh.Store(false)
	expect(t, ch, Passing)
	for range 8 { // past the TTL again, kept by the reports
		next()
	}
	for len(probes) > 0 {
		if err := <-probes; err != nil {
			t.Fatalf("a reported TTL check failed: %v", err)
		}
	}
	stopReporting.Store(true)
	expect(t, ch, Failing)
}
