package xdsapi

import (
	"context"
	"fmt"
	"log/slog"
	"maps"
	"slices"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/beaconplane/beacon"
	"github.com/beaconplane/beacon/internal/syncbuf"
	discoveryv3 "github.com/envoyproxy/go-control-plane/envoy/service/discovery/v3"
	"github.com/prometheus/client_golang/prometheus"
	"google.golang.org/grpc"
	"google.golang.org/grpc/codes"
	"google.golang.org/grpc/status"
)

// An unknown (or empty) service is answered at once: its Listener and
// Cluster exist and its assignment is empty, so that a client does not wait
// for its does-not-exist timer; the first instance then arrives in one
// push.
func TestEmptyServiceAnsweredAtOnce(t *testing.T) {
	r := memRegistry(t)
	_, addr := startXDS(t, r, Config{})
	a := dialADS(t, addr, "raw")
	a.request(ListenerType, []string{"grpc.greeter.demo"}, nil, "")
	lds := a.recv()
	if got := names(t, lds); !slices.Equal(got, []string{"grpc.greeter.demo"}) {
		t.Fatalf("LDS answered %v", got)
	}
	a.request(ClusterType, []string{"grpc.greeter.demo"}, nil, "")
	if got := names(t, a.recv()); !slices.Equal(got, []string{"grpc.greeter.demo"}) {
		t.Fatalf("CDS answered %v", got)
	}
	a.request(EndpointType, []string{"grpc.greeter.demo"}, nil, "")
	eds := a.recv()
	if cla := assignments(t, eds)["grpc.greeter.demo"]; cla == nil || len(cla.GetEndpoints()) != 0 {
		t.Fatalf("EDS answered %v, want an empty assignment", eds)
	}
	a.request(EndpointType, []string{"grpc.greeter.demo"}, eds, "")
	register(t, r, "127.0.0.1:5001", nil)
	eds = a.recv()
	if got := addresses(assignments(t, eds)["grpc.greeter.demo"]); !slices.Equal(got, []string{"127.0.0.1:5001/HEALTHY"}) {
		t.Fatalf("after a registration EDS pushed %v", got)
	}
}

// Names that are no Beacon service are answered as resources that do not
// exist: Listener and Cluster responses leave them out (which tells a
// client at once), and the stream goes on.
func TestNonServiceNamesDoNotExist(t *testing.T) {
	r := memRegistry(t)
	_, addr := startXDS(t, r, Config{})
	a := dialADS(t, addr, "raw")
	bad := []string{"x", "a.b", "a.b.c.d", "Grpc.Greeter.Demo", "a/b", "a/b/c/d", "-a.b.c", "a..c", strings.Repeat("a", 300), "grpc.greeter.demo.beacon"}
	a.request(ListenerType, bad, nil, "")
	resp := a.recv()
	if got := names(t, resp); len(got) != 0 {
		t.Fatalf("LDS for non-services answered %v", got)
	}
	a.request(ListenerType, append(bad, "demo/greeter/grpc"), resp, "")
	if got := names(t, a.recv()); !slices.Equal(got, []string{"demo/greeter/grpc"}) {
		t.Fatalf("LDS answered %v", got)
	}
}

// One change of a service is marshalled once and pushed only to the
// streams that follow it, with only that service's assignment.
func TestOnlyWhatChangedIsPushed(t *testing.T) {
	r := memRegistry(t)
	reg := prometheus.NewRegistry()
	_, addr := startXDS(t, r, Config{Metrics: reg})
	register(t, r, "127.0.0.1:5001", nil)
	other, err := r.Register(testContext(t), beacon.Instance{Namespace: "demo", Component: "other", Endpoint: "grpc", Address: "127.0.0.1:6001"})
	if err != nil {
		t.Fatal(err)
	}
	defer other.Close()
	streams := make([]*ads, 3)
	resps := make([]*discoveryv3.DiscoveryResponse, 3)
	both := []string{"grpc.greeter.demo", "grpc.other.demo"}
	for i := range streams {
		streams[i] = dialADS(t, addr, "raw")
		streams[i].request(EndpointType, both, nil, "")
		resps[i] = streams[i].recv()
		if got := len(resps[i].GetResources()); got != 2 {
			t.Fatalf("first EDS response holds %d assignments, want 2", got)
		}
		streams[i].request(EndpointType, both, resps[i], "")
		// The server may have answered before a registration reached it
		// (an empty assignment): its push follows; wait until both are in.
		held := assignments(t, resps[i])
		for len(held["grpc.greeter.demo"].GetEndpoints()) == 0 || len(held["grpc.other.demo"].GetEndpoints()) == 0 {
			resps[i] = streams[i].recv()
			maps.Copy(held, assignments(t, resps[i]))
			streams[i].request(EndpointType, both, resps[i], "")
		}
	}
	before := marshals(t, reg, "endpoint")
	register(t, r, "127.0.0.1:5002", nil)
	for i, a := range streams {
		resp := a.recv()
		if got := names(t, resp); !slices.Equal(got, []string{"grpc.greeter.demo"}) {
			t.Fatalf("stream %d: the push holds %v, want only the service that changed", i, got)
		}
	}
	if n := marshals(t, reg, "endpoint") - before; n != 1 {
		t.Fatalf("one change of one service marshalled %v assignments for 3 streams, want 1", n)
	}
}

// marshals returns beacon_xds_marshals_total of a type.
func marshals(t testing.TB, reg *prometheus.Registry, typ string) float64 {
	t.Helper()
	return metricValue(t, reg, "beacon_xds_marshals_total", map[string]string{"type": typ})
}

// metricValue returns the value of the metric name with exactly the given
// labels (0 if there is none).
func metricValue(t testing.TB, reg *prometheus.Registry, name string, labels map[string]string) float64 {
	t.Helper()
	mfs, err := reg.Gather()
	if err != nil {
		t.Fatal(err)
	}
	for _, mf := range mfs {
		if mf.GetName() != name {
			continue
		}
	next:
		for _, m := range mf.GetMetric() {
			if len(m.GetLabel()) != len(labels) {
				continue
			}
			for _, l := range m.GetLabel() {
				if labels[l.GetName()] != l.GetValue() {
					continue next
				}
			}
			switch {
			case m.GetCounter() != nil:
				return m.GetCounter().GetValue()
			case m.GetGauge() != nil:
				return m.GetGauge().GetValue()
			}
		}
	}
	return 0
}

// A client that has not answered a response gets no other of that type:
// the changes meanwhile are folded into the one it gets after its ACK.
func TestOneResponseInFlightPerType(t *testing.T) {
	r := memRegistry(t)
	s, addr := startXDS(t, r, Config{})
	a := dialADS(t, addr, "raw")
	a.request(EndpointType, []string{"grpc.greeter.demo"}, nil, "")
	first := a.recv()
	// Three changes while the first response waits for its ACK, all in
	// the server's index before the ACK (a registration reaches it through
	// the registry's watch, a moment after Register returns).
	register(t, r, "127.0.0.1:5001", nil)
	register(t, r, "127.0.0.1:5002", nil)
	register(t, r, "127.0.0.1:5003", nil)
	waitIndexed(t, s, service{ns: "demo", comp: "greeter", ep: "grpc"}, 3)
	// A request of another type is answered meanwhile: the stream is
	// alive.
	a.request(ClusterType, []string{"grpc.greeter.demo"}, nil, "")
	if resp := a.recv(); resp.GetTypeUrl() != ClusterType {
		t.Fatalf("got a %s response while the assignment awaited its ACK", resp.GetTypeUrl())
	}
	a.request(EndpointType, []string{"grpc.greeter.demo"}, first, "")
	resp := a.recv()
	if got := addresses(assignments(t, resp)["grpc.greeter.demo"]); len(got) != 3 {
		t.Fatalf("after the ACK: %v, want the three instances in one response", got)
	}
}

// A client that never answers while newer state waits has its stream ended
// with a clear error, and the server counts it.
func TestUnansweredResponseEndsStream(t *testing.T) {
	r := memRegistry(t)
	reg := prometheus.NewRegistry()
	_, addr := startXDS(t, r, Config{AckTimeout: 100 * time.Millisecond, Metrics: reg})
	a := dialADS(t, addr, "raw")
	a.request(EndpointType, []string{"grpc.greeter.demo"}, nil, "")
	a.recv()
	register(t, r, "127.0.0.1:5001", nil)
	_, err := a.recvErr()
	if status.Code(err) != codes.DeadlineExceeded || !strings.Contains(err.Error(), "ACK or NACK") {
		t.Fatalf("stream ended with %v, want DeadlineExceeded saying an ACK is expected", err)
	}
	if n := metricValue(t, reg, "beacon_xds_ack_timeouts_total", nil); n != 1 {
		t.Fatalf("beacon_xds_ack_timeouts_total = %v", n)
	}
}

// A NACK is counted per type and client, and logged with the client's
// reason; the refused version is not sent again.
func TestNackCountedAndLogged(t *testing.T) {
	r := memRegistry(t)
	reg := prometheus.NewRegistry()
	var logs syncbuf.Buffer
	_, addr := startXDS(t, r, Config{Metrics: reg, Logger: slog.New(slog.NewTextHandler(&logs, nil))})
	register(t, r, "127.0.0.1:5001", nil)
	a := dialADS(t, addr, "test-agent")
	a.request(ClusterType, []string{"grpc.greeter.demo"}, nil, "")
	resp := a.recv()
	a.request(ClusterType, []string{"grpc.greeter.demo"}, resp, "cluster grpc.greeter.demo: no thanks")
	// The stream goes on: another type is answered, and no second cluster
	// response comes first.
	a.request(ListenerType, []string{"grpc.greeter.demo"}, nil, "")
	if got := a.recv().GetTypeUrl(); got != ListenerType {
		t.Fatalf("after the NACK the server sent a %s response", got)
	}
	if n := metricValue(t, reg, "beacon_xds_nacks_total", map[string]string{"type": "cluster", "client": "test-agent"}); n != 1 {
		t.Fatalf("beacon_xds_nacks_total{type=cluster,client=test-agent} = %v", n)
	}
	if !strings.Contains(logs.String(), "no thanks") || !strings.Contains(logs.String(), "NACK") {
		t.Fatalf("the NACK was not logged with its reason:\n%s", logs.String())
	}
}

// Types Beacon serves none of are answered empty, once per subscription.
func TestUnknownTypeAnsweredEmpty(t *testing.T) {
	r := memRegistry(t)
	_, addr := startXDS(t, r, Config{})
	a := dialADS(t, addr, "raw")
	for _, typ := range []string{RouteType, "type.googleapis.com/no.such.Type"} {
		a.request(typ, []string{"x"}, nil, "")
		resp := a.recv()
		if resp.GetTypeUrl() != typ || len(resp.GetResources()) != 0 {
			t.Fatalf("a request of %s was answered %v", typ, resp)
		}
	}
}

// A wildcard subscription (no names) follows every service the registry
// holds: services appear and disappear with their instances.
func TestWildcardFollowsServices(t *testing.T) {
	r := memRegistry(t)
	s, addr := startXDS(t, r, Config{})
	register(t, r, "127.0.0.1:5001", nil)
	waitIndexed(t, s, service{ns: "demo", comp: "greeter", ep: "grpc"}, 1)
	a := dialADS(t, addr, "envoy")
	a.request(ClusterType, nil, nil, "")
	resp := a.recv()
	if got := names(t, resp); !slices.Equal(got, []string{"grpc.greeter.demo"}) {
		t.Fatalf("wildcard CDS answered %v", got)
	}
	a.request(ClusterType, nil, resp, "")
	other, err := r.Register(testContext(t), beacon.Instance{Namespace: "demo", Component: "other", Endpoint: "grpc", Address: "127.0.0.1:6001"})
	if err != nil {
		t.Fatal(err)
	}
	resp = a.recv()
	got := names(t, resp)
	slices.Sort(got)
	if !slices.Equal(got, []string{"grpc.greeter.demo", "grpc.other.demo"}) {
		t.Fatalf("after a new service wildcard CDS pushed %v", got)
	}
	a.request(ClusterType, nil, resp, "")
	if err := other.Close(); err != nil {
		t.Fatal(err)
	}
	if got := names(t, a.recv()); !slices.Equal(got, []string{"grpc.greeter.demo"}) {
		t.Fatalf("after the service left wildcard CDS pushed %v", got)
	}
}

// Requests about an older response are ignored, as the protocol says; the
// current subscription stands.
func TestStaleNonceIgnored(t *testing.T) {
	r := memRegistry(t)
	_, addr := startXDS(t, r, Config{})
	a := dialADS(t, addr, "raw")
	a.request(ListenerType, []string{"grpc.greeter.demo"}, nil, "")
	first := a.recv()
	a.request(ListenerType, []string{"grpc.greeter.demo", "demo/greeter/grpc"}, first, "")
	second := a.recv()
	if len(second.GetResources()) != 2 {
		t.Fatalf("second LDS response: %v", names(t, second))
	}
	// About the first response: ignored (no answer, no change).
	a.request(ListenerType, []string{"grpc.other.demo"}, first, "")
	a.request(ClusterType, nil, nil, "")
	if got := a.recv().GetTypeUrl(); got != ClusterType {
		t.Fatalf("a request with a stale nonce was answered (%s)", got)
	}
}

// Malformed requests end the stream with InvalidArgument, saying what was
// wrong.
func TestMalformedRequests(t *testing.T) {
	r := memRegistry(t)
	_, addr := startXDS(t, r, Config{MaxNamesPerStream: 10})
	for _, tc := range []struct {
		name string
		send func(a *ads)
		code codes.Code
		want string
	}{
		{"no type", func(a *ads) { a.request("", []string{"x"}, nil, "") }, codes.InvalidArgument, "type_url"},
		{"too many names", func(a *ads) { a.request(ListenerType, make([]string, 11), nil, "") }, codes.ResourceExhausted, "at most 10"},
		{"too many types", func(a *ads) {
			for i := range maxTypesPerStream + 1 {
				a.request("type.googleapis.com/t"+strings.Repeat("x", i), nil, nil, "")
			}
		}, codes.InvalidArgument, "resource types"},
	} {
		t.Run(tc.name, func(t *testing.T) {
			a := dialADS(t, addr, "raw")
			tc.send(a)
			for {
				_, err := a.recvErr()
				if err == nil {
					continue // answers to the valid requests before the bad one
				}
				if status.Code(err) != tc.code || !strings.Contains(err.Error(), tc.want) {
					t.Fatalf("stream ended with %v, want %v mentioning %q", err, tc.code, tc.want)
				}
				return
			}
		})
	}
}

// One client address may hold at most MaxStreamsPerClient streams.
func TestStreamsPerClientBounded(t *testing.T) {
	r := memRegistry(t)
	reg := prometheus.NewRegistry()
	_, addr := startXDS(t, r, Config{MaxStreamsPerClient: 2, Metrics: reg})
	for i := range 2 {
		a := dialADS(t, addr, "raw")
		a.request(ClusterType, nil, nil, "")
		a.recv()
		_ = i
	}
	a := dialADS(t, addr, "raw")
	a.request(ClusterType, nil, nil, "")
	_, err := a.recvErr()
	if status.Code(err) != codes.ResourceExhausted || !strings.Contains(err.Error(), "xdsapi.Config.MaxStreamsPerClient") {
		t.Fatalf("third stream: %v, want ResourceExhausted naming the flag", err)
	}
}

// switchAccess lets a test grant and revoke namespaces while streams run.
type switchAccess struct {
	mu       sync.Mutex
	readable map[string]bool
	released chan struct{}
}

func (a *switchAccess) Readable(_ context.Context, ns string) (bool, error) {
	a.mu.Lock()
	defer a.mu.Unlock()
	return a.readable[ns], nil
}

func (a *switchAccess) set(ns string, ok bool) {
	a.mu.Lock()
	defer a.mu.Unlock()
	a.readable[ns] = ok
}

func (a *switchAccess) Release() { close(a.released) }

// A stream sees only the namespaces its Access allows, and a permission
// granted or revoked later applies to its subscriptions within
// PermissionRecheck, with no change in the registry.
func TestPermissionsFollowTheAccess(t *testing.T) {
	r := memRegistry(t)
	access := &switchAccess{readable: map[string]bool{"team-a": true}, released: make(chan struct{})}
	_, addr := startXDS(t, r, Config{PermissionRecheck: 20 * time.Millisecond,
		Authorize: func(context.Context) (Access, error) { return access, nil }})
	a := dialADS(t, addr, "raw")
	both := []string{"grpc.web.team-a", "grpc.web.team-b"}
	a.request(ListenerType, both, nil, "")
	resp := a.recv()
	if got := names(t, resp); !slices.Equal(got, []string{"grpc.web.team-a"}) {
		t.Fatalf("answered %v, want team-a only", got)
	}
	access.set("team-b", true)
	a.request(ListenerType, both, resp, "")
	resp = a.recv()
	got := names(t, resp)
	slices.Sort(got)
	if !slices.Equal(got, both) {
		t.Fatalf("after team-b was granted: %v", got)
	}
	access.set("team-a", false)
	a.request(ListenerType, both, resp, "")
	if got := names(t, a.recv()); !slices.Equal(got, []string{"grpc.web.team-b"}) {
		t.Fatalf("after team-a was revoked: %v", got)
	}
}

// A client that acknowledged a response and then changes its subscription
// sends the same nonce again (the last it received): the change is applied
// and answered, not taken for a request about an older response.
func TestSubscriptionChangeAfterACK(t *testing.T) {
	r := memRegistry(t)
	_, addr := startXDS(t, r, Config{})
	a := dialADS(t, addr, "raw")
	a.request(ListenerType, []string{"grpc.greeter.demo"}, nil, "")
	resp := a.recv()
	a.request(ListenerType, []string{"grpc.greeter.demo"}, resp, "") // ACK
	a.request(ListenerType, []string{"grpc.greeter.demo", "grpc.other.demo"}, resp, "")
	got := names(t, a.recv())
	slices.Sort(got)
	if !slices.Equal(got, []string{"grpc.greeter.demo", "grpc.other.demo"}) {
		t.Fatalf("after a second channel's subscription: %v", got)
	}
}

// Close tells every open stream why it ends (Unavailable: the server is
// shutting down), rather than cut its connection under it: clients saw
// "Unavailable: EOF" (internal/grpcstop bounds the wait for streams that
// do not end).
func TestCloseTellsStreamsWhy(t *testing.T) {
	r := memRegistry(t)
	s, addr := startXDS(t, r, Config{})
	a := dialADS(t, addr, "raw")
	a.request(ListenerType, []string{"grpc.greeter.demo"}, nil, "")
	a.recv()
	if err := s.Close(); err != nil {
		t.Fatal(err)
	}
	_, err := a.recvErr()
	if status.Code(err) != codes.Unavailable || !strings.Contains(err.Error(), "shutting down") {
		t.Fatalf("an open stream ended with %v, want Unavailable saying the server is shutting down", err)
	}
}

// A stream's names are bounded over all its types (a client asked for
// 100,000 names under each of 16 types: 180 MB per stream), and the names
// of one client address's streams together, so that opening streams buys
// no more; names a stream drops, or a stream that ends, free their places.
func TestNamesBoundedOverTypesAndClients(t *testing.T) {
	r := memRegistry(t)
	reg := prometheus.NewRegistry()
	_, addr := startXDS(t, r, Config{MaxNamesPerStream: 10, MaxNamesPerClient: 15, Metrics: reg})
	svcNames := func(from, to int) []string {
		var out []string
		for i := from; i < to; i++ {
			out = append(out, fmt.Sprintf("e%d.c.ns", i))
		}
		return out
	}
	ended := func(a *ads, want string) {
		t.Helper()
		for {
			_, err := a.recvErr()
			if err == nil {
				continue
			}
			if status.Code(err) != codes.ResourceExhausted || !strings.Contains(err.Error(), want) {
				t.Fatalf("stream ended with %v, want ResourceExhausted saying %q", err, want)
			}
			return
		}
	}
	a := dialADS(t, addr, "raw")
	a.request(ListenerType, svcNames(0, 6), nil, "")
	a.recv()
	a.request(ClusterType, svcNames(0, 5), nil, "")
	ended(a, "at most 10 per stream, over all types")

	b, c := dialADS(t, addr, "raw"), dialADS(t, addr, "raw")
	b.request(ListenerType, svcNames(0, 8), nil, "")
	lds := b.recv()
	c.request(ListenerType, svcNames(0, 8), nil, "")
	ended(c, "the most one client address may (xdsapi.Config.MaxNamesPerClient)")
	b.request(ListenerType, svcNames(0, 2), lds, "")
	b.recv()
	d := dialADS(t, addr, "raw")
	d.request(ListenerType, svcNames(0, 8), nil, "")
	if got := names(t, d.recv()); len(got) != 8 {
		t.Fatalf("LDS answered %v, want the 8 services named (each exists, empty)", got)
	}
	for _, reason := range []string{"max_names_per_stream", "max_names_per_client"} {
		if n := metricValue(t, reg, "beacon_xds_streams_refused_total", map[string]string{"reason": reason}); n != 1 {
			t.Errorf("refused{%s} = %v, want 1", reason, n)
		}
	}
}

// One request may name many services, and is answered: each name costs
// the same whatever came before (each new name once looked at every name
// subscribed: 20,000 took 5.9 s of the server's CPU, 100,000 five
// minutes, which went on after the client had gone). BenchmarkSubscribe
// measures the cost per name.
func TestManyNamesInOneRequest(t *testing.T) {
	r := memRegistry(t)
	_, addr := startXDS(t, r, Config{})
	const n = 10_000 // the answer, a Listener per name, fits a client's 4 MiB
	a := dialADS(t, addr, "raw")
	a.request(ClusterType, manyNames(n), nil, "")
	if got := names(t, a.recv()); len(got) != n {
		t.Fatalf("CDS answered %d clusters, want %d", len(got), n)
	}
}

// manyNames returns n service names.
func manyNames(n int) []string {
	out := make([]string, n)
	for i := range out {
		out[i] = fmt.Sprintf("e%d.c.ns", i)
	}
	return out
}

// A client that NACKs every response as fast as it can (it wrote 5,000
// WARN lines, 5.7 MB, in 0.67 s) gets its NACKs of a type logged at WARN
// once per nackLogEvery; every one is counted.
func TestNackLogBounded(t *testing.T) {
	r := memRegistry(t)
	reg := prometheus.NewRegistry()
	var logs syncbuf.Buffer
	_, addr := startXDS(t, r, Config{Metrics: reg, Logger: slog.New(slog.NewTextHandler(&logs, nil))})
	a := dialADS(t, addr, "storm")
	const n = 50
	subs := [][]string{{"grpc.greeter.demo"}, {"grpc.greeter.demo", "other.greeter.demo"}}
	a.request(ClusterType, subs[0], nil, "")
	resp := a.recv()
	for i := range n {
		// A NACK that changes the subscription is answered anew.
		a.request(ClusterType, subs[(i+1)%2], resp, "no thanks")
		resp = a.recv()
	}
	if got := metricSum(t, reg, "beacon_xds_nacks_total"); got != n {
		t.Fatalf("beacon_xds_nacks_total = %v, want %d", got, n)
	}
	if warns := strings.Count(logs.String(), "level=WARN"); warns != 1 {
		t.Fatalf("%d NACKs logged %d WARN lines, want 1:\n%s", n, warns, logs.String())
	}
}

// A client that stops reading (its flow-control window full) is ended once
// a response has waited AckTimeout to be read: Send blocked until the
// stream ended, which only the handler's return brings about, so the ACK
// deadline, checked between sends, never came (a stream lived over 200 s
// with a minute's deadline) and held its place and goroutines.
func TestClientThatDoesNotReadIsEnded(t *testing.T) {
	r := memRegistry(t)
	reg := prometheus.NewRegistry()
	ended := make(chan struct{})
	log := slog.New(onMessage{slog.NewTextHandler(testWriter{t}, nil), "does not read its responses", sync.OnceFunc(func() { close(ended) })})
	s, addr := startXDS(t, r, Config{AckTimeout: 200 * time.Millisecond, Metrics: reg, Logger: log})
	// A fixed window of 64 KiB (no BDP growth), and two responses of
	// about 2,000 resources each that the client does not read: the
	// first leaves the stream's write quota spent, the second waits.
	a := dialADS(t, addr, "no-reader", grpc.WithInitialWindowSize(64<<10), grpc.WithInitialConnWindowSize(64<<10))
	a.request(ClusterType, manyNames(2_000), nil, "")
	a.request(EndpointType, manyNames(2_000), nil, "")
	select {
	case <-ended:
	case <-time.After(testDeadline):
		t.Fatal("the stream of a client that does not read was not ended")
	}
	for {
		_, err := a.recvErr()
		if err == nil {
			continue // what was buffered before the end
		}
		if status.Code(err) != codes.DeadlineExceeded || !strings.Contains(err.Error(), "does not read") {
			t.Fatalf("the stream ended with %v, want DeadlineExceeded saying the client does not read", err)
		}
		break
	}
	if n := metricValue(t, reg, "beacon_xds_ack_timeouts_total", nil); n != 1 {
		t.Fatalf("beacon_xds_ack_timeouts_total = %v, want 1", n)
	}
	waitFor(t, s, "the stream gone", func() bool { return s.streamCount() == 0 })
}

// onMessage is a slog handler that calls do when a record's message
// contains msg.
type onMessage struct {
	slog.Handler
	msg string
	do  func()
}

func (h onMessage) Handle(ctx context.Context, r slog.Record) error {
	if strings.Contains(r.Message, h.msg) {
		h.do()
	}
	return h.Handler.Handle(ctx, r)
}

func (h onMessage) WithAttrs(as []slog.Attr) slog.Handler {
	return onMessage{h.Handler.WithAttrs(as), h.msg, h.do}
}

func (h onMessage) WithGroup(name string) slog.Handler {
	return onMessage{h.Handler.WithGroup(name), h.msg, h.do}
}
