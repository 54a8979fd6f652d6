package xdsapi

import (
	"context"
	"fmt"
	"net"
	"testing"

	"github.com/beaconplane/beacon"
	"github.com/beaconplane/beacon/internal/testkit/testpeer"
	"github.com/beaconplane/beacon/naming/namingtest"
	"github.com/prometheus/client_golang/prometheus"
)

// Every scenario runs against the three client implementations.

// TestClientsRouteToRegistrations: register → RPCs reach every instance,
// in every client; grpc-go also resolves the slash form.
func TestClientsRouteToRegistrations(t *testing.T) {
	r := memRegistry(t)
	_, addr := startXDS(t, r, Config{})
	one, two := namingtest.Start(t, "one"), namingtest.Start(t, "two")
	register(t, r, one.Addr(), nil)
	register(t, r, two.Addr(), nil)
	forEachClient(t, func(t *testing.T, k clientKind) {
		reachAll(t, k.start(t, addr, "xds:///grpc.greeter.demo"), "one", "two")
	})
	t.Run("grpc-go/slash-form", func(t *testing.T) {
		reachAll(t, startGoClient(t, addr, "xds:///demo/greeter/grpc"), "one", "two")
	})
}

// TestClientsFollowDrain: a drained instance gets no new RPCs; serving again,
// it gets them again.
func TestClientsFollowDrain(t *testing.T) {
	r := memRegistry(t)
	_, addr := startXDS(t, r, Config{})
	one, two := namingtest.Start(t, "one"), namingtest.Start(t, "two")
	register(t, r, one.Addr(), nil)
	reg2 := register(t, r, two.Addr(), nil)
	forEachClient(t, func(t *testing.T, k clientKind) {
		c := k.start(t, addr, "xds:///grpc.greeter.demo")
		reachAll(t, c, "one", "two")
		setStatus(t, reg2, beacon.StatusDraining)
		settleOn(t, c, 20, "one")
		setStatus(t, reg2, beacon.StatusServing)
		reachAll(t, c, "one", "two")
	})
}

func setStatus(t testing.TB, reg interface {
	Update(ctx context.Context, mutate func(*beacon.Instance)) error
}, s beacon.Status) {
	t.Helper()
	if err := reg.Update(testContext(t), func(in *beacon.Instance) { in.Status = s }); err != nil {
		t.Fatal(err)
	}
}

// An instance whose address a client would refuse (a host name) is left
// out, never sent: no client NACKs, and RPCs go to the others.
func TestClientsHostNameLeftOut(t *testing.T) {
	r := memRegistry(t)
	reg := prometheus.NewRegistry()
	_, addr := startXDS(t, r, Config{Metrics: reg})
	one, two := namingtest.Start(t, "one"), namingtest.Start(t, "two")
	_, port, _ := net.SplitHostPort(one.Addr())
	register(t, r, "localhost:"+port, nil)
	register(t, r, two.Addr(), nil)
	forEachClient(t, func(t *testing.T, k clientKind) {
		settleOn(t, k.start(t, addr, "xds:///grpc.greeter.demo"), 20, "two")
	})
	if n := metricValue(t, reg, "beacon_xds_omitted_endpoints", map[string]string{"reason": "hostname"}); n != 1 {
		t.Errorf("beacon_xds_omitted_endpoints{reason=hostname} = %v, want 1", n)
	}
	if n := metricSum(t, reg, "beacon_xds_nacks_total"); n != 0 {
		t.Errorf("clients NACKed %v responses", n)
	}
}

// IPv6 endpoints are routed to by every client.
func TestClientsIPv6(t *testing.T) {
	if ln, err := net.Listen("tcp", "[::1]:0"); err != nil {
		testpeer.Missing(t, "no IPv6 loopback on this machine: "+err.Error())
	} else {
		_ = ln.Close()
	}
	r := memRegistry(t)
	_, addr := startXDS(t, r, Config{})
	b, err := namingtest.NewBackendAt("six", "[::1]:0")
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(b.Stop)
	register(t, r, b.Addr(), nil)
	forEachClient(t, func(t *testing.T, k clientKind) {
		reachAll(t, k.start(t, addr, "xds:///grpc.greeter.demo"), "six")
	})
}

// Localities carry the sum of their instances' weights, and clients share
// traffic between zones by it: 1 in zone a, 3 in zone b.
func TestClientsZoneWeights(t *testing.T) {
	r := memRegistry(t)
	_, addr := startXDS(t, r, Config{})
	light, heavy := namingtest.Start(t, "light"), namingtest.Start(t, "heavy")
	register(t, r, light.Addr(), map[string]string{"zone": "a", "weight": "1"})
	register(t, r, heavy.Addr(), map[string]string{"zone": "b", "weight": "3"})
	forEachClient(t, func(t *testing.T, k clientKind) {
		c := k.start(t, addr, "xds:///grpc.greeter.demo")
		reachAll(t, c, "light", "heavy")
		const n = 400
		got := 0
		for range n {
			b, err := c.Call(testContext(t))
			if err != nil {
				t.Fatal(err)
			}
			if b == "heavy" {
				got++
			}
		}
		// Expected 300 of 400; the bounds are 7 standard deviations.
		if share := float64(got) / n; share < 0.6 || share > 0.9 {
			t.Fatalf("zone b (weight 3 against 1) served %d of %d calls", got, n)
		}
	})
}

// A service of 1,000 instances is one assignment every client accepts.
func TestClientsThousandEndpoints(t *testing.T) {
	r := memRegistry(t)
	reg := prometheus.NewRegistry()
	_, addr := startXDS(t, r, Config{Metrics: reg})
	b := namingtest.Start(t, "many")
	more, err := b.ListenMore(999)
	if err != nil {
		t.Fatal(err)
	}
	for i, a := range append(more, b.Addr()) {
		register(t, r, a, map[string]string{"zone": fmt.Sprintf("z%d", i%3)})
	}
	forEachClient(t, func(t *testing.T, k clientKind) {
		settleOn(t, k.start(t, addr, "xds:///grpc.greeter.demo"), 20, "many")
	})
	if n := metricSum(t, reg, "beacon_xds_nacks_total"); n != 0 {
		t.Errorf("clients NACKed %v responses", n)
	}
}

// metricSum adds up every series of a metric.
func metricSum(t testing.TB, reg *prometheus.Registry, name string) float64 {
	t.Helper()
	mfs, err := reg.Gather()
	if err != nil {
		t.Fatal(err)
	}
	var sum float64
	for _, mf := range mfs {
		if mf.GetName() == name {
			for _, m := range mf.GetMetric() {
				sum += m.GetCounter().GetValue() + m.GetGauge().GetValue()
			}
		}
	}
	return sum
}

// One client process with channels to two services (one xDS client, one
// ADS stream): the second channel's subscription extends the first's
// after its response was acknowledged, and both route.
func TestClientsTwoServicesOneStream(t *testing.T) {
	r := memRegistry(t)
	_, addr := startXDS(t, r, Config{})
	one, two := namingtest.Start(t, "one"), namingtest.Start(t, "two")
	register(t, r, one.Addr(), nil)
	if _, err := r.Register(testContext(t), beacon.Instance{Namespace: "demo", Component: "other", Endpoint: "grpc", Address: two.Addr()}); err != nil {
		t.Fatal(err)
	}
	forEachClient(t, func(t *testing.T, k clientKind) {
		c := k.start(t, addr, "xds:///grpc.greeter.demo", "xds:///grpc.other.demo")
		reachAll(t, c, "one")
		reachAll(t, onTarget{c, 1}, "two")
	})
}

// onTarget calls a multiClient's i-th target.
type onTarget struct {
	c multiClient
	i int
}

func (o onTarget) Call(ctx context.Context) (string, error) { return o.c.CallOn(ctx, o.i) }

// TestPolicyFallbackPerClient: every client implementation routes a
// service whatever its lb_policy, and accepts its cluster: one known to
// refuse the policy gets the cluster with round_robin. C-core (Python
// 1.51) NACKed least_request and its process died of SIGSEGV on
// ring_hash; grpc-js NACKed least_request; a cluster refused at first
// sight leaves the client's calls failing.
func TestPolicyFallbackPerClient(t *testing.T) {
	for _, policy := range []string{"ring_hash", "least_request"} {
		t.Run(policy, func(t *testing.T) {
			r := memRegistry(t)
			reg := prometheus.NewRegistry()
			_, addr := startXDS(t, r, Config{Metrics: reg})
			one, two := namingtest.Start(t, "one"), namingtest.Start(t, "two")
			register(t, r, one.Addr(), map[string]string{"lb_policy": policy})
			register(t, r, two.Addr(), map[string]string{"lb_policy": policy})
			forEachClient(t, func(t *testing.T, k clientKind) {
				reachAll(t, k.start(t, addr, "xds:///grpc.greeter.demo"), "one", "two")
			})
			if n := metricSum(t, reg, "beacon_xds_nacks_total"); n != 0 {
				t.Fatalf("clients NACKed %v responses", n)
			}
		})
	}
}
