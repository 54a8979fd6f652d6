package xdsapi

import (
	"slices"
	"testing"
	"time"

	"github.com/beaconplane/beacon"
	"github.com/beaconplane/beacon/internal/testkit/healthtest"
	"github.com/beaconplane/beacon/naming/namingtest"
	discoveryv3 "github.com/envoyproxy/go-control-plane/envoy/service/discovery/v3"
)

// checked is a registry over the memory backend whose instances the test
// writes with the verdicts it chooses (healthtest.Put).
type checked struct {
	t testing.TB
	r *healthtest.Registry
}

func newChecked(t testing.TB) *checked { return &checked{t: t, r: healthtest.NewRegistry(t)} }

// instance is a new instance of demo/greeter/grpc at addr.
func (c *checked) instance(addr string) beacon.Instance {
	return beacon.Instance{Namespace: "demo", Component: "greeter", Endpoint: "grpc", ID: beacon.NewID(), Address: addr,
		Transport: "grpc", Status: beacon.StatusServing, RegisteredAt: time.Now().UTC()}
}

// put writes the instances with their verdicts, in order.
func (c *checked) put(ins ...beacon.Instance) {
	c.t.Helper()
	c.r.Put(c.t, ins...)
}

// TestPushesHealth: an instance whose check fails is pushed UNHEALTHY and
// kept in the assignment; passing again, HEALTHY; a service in panic
// (most of its instances failing) is pushed HEALTHY throughout.
func TestPushesHealth(t *testing.T) {
	c := newChecked(t)
	_, addr := startXDS(t, c.r, Config{})
	one, two := c.instance("127.0.0.1:5001"), c.instance("127.0.0.1:5002")
	c.put(healthtest.Passing(one), healthtest.Unknown(two))
	a := dialADS(t, addr, "raw")
	a.request(EndpointType, []string{"grpc.greeter.demo"}, nil, "")
	resp := awaitAddresses(t, a, nil, "127.0.0.1:5001/HEALTHY", "127.0.0.1:5002/HEALTHY")

	c.put(healthtest.Failing(two, "connection refused"))
	resp = awaitAddresses(t, a, resp, "127.0.0.1:5001/HEALTHY", "127.0.0.1:5002/UNHEALTHY")
	c.put(healthtest.Panic(one, "connection refused"), healthtest.Panic(two, "connection refused"))
	resp = awaitAddresses(t, a, resp, "127.0.0.1:5001/HEALTHY", "127.0.0.1:5002/HEALTHY")
	c.put(healthtest.Passing(one), healthtest.Failing(two, "connection refused"))
	resp = awaitAddresses(t, a, resp, "127.0.0.1:5001/HEALTHY", "127.0.0.1:5002/UNHEALTHY")
	drained := healthtest.Failing(two, "connection refused")
	drained.Status = beacon.StatusDraining
	c.put(drained)
	resp = awaitAddresses(t, a, resp, "127.0.0.1:5001/HEALTHY", "127.0.0.1:5002/DRAINING")
	c.put(healthtest.Passing(two))
	awaitAddresses(t, a, resp, "127.0.0.1:5001/HEALTHY", "127.0.0.1:5002/HEALTHY")
}

// awaitAddresses acknowledges prev (unless nil: the request was sent) and
// reads pushes of the stream's one assignment until it holds want (the
// stream's recv fails the test at its deadline).
func awaitAddresses(t *testing.T, a *ads, prev *discoveryv3.DiscoveryResponse, want ...string) *discoveryv3.DiscoveryResponse {
	t.Helper()
	for {
		if prev != nil {
			a.request(EndpointType, []string{"grpc.greeter.demo"}, prev, "")
		}
		prev = a.recv()
		got := addresses(assignments(t, prev)["grpc.greeter.demo"])
		if slices.Equal(got, want) {
			return prev
		}
		t.Logf("assignment %v, waiting for %v", got, want)
	}
}

// TestClientsFollowHealth: a failing instance gets no new RPCs; passing
// again, it gets them again; a service in panic is served whole — in
// every client.
func TestClientsFollowHealth(t *testing.T) {
	c := newChecked(t)
	_, addr := startXDS(t, c.r, Config{})
	b1, b2 := namingtest.Start(t, "one"), namingtest.Start(t, "two")
	one, two := c.instance(b1.Addr()), c.instance(b2.Addr())
	c.put(healthtest.Passing(one), healthtest.Passing(two))
	forEachClient(t, func(t *testing.T, k clientKind) {
		cl := k.start(t, addr, "xds:///grpc.greeter.demo")
		reachAll(t, cl, "one", "two")
		c.put(healthtest.Failing(two, "connection refused"))
		settleOn(t, cl, 20, "one")
		c.put(healthtest.Panic(one, "connection refused"), healthtest.Panic(two, "connection refused"))
		reachAll(t, cl, "one", "two")
		c.put(healthtest.Passing(one), healthtest.Failing(two, "connection refused"))
		settleOn(t, cl, 20, "one")
		c.put(healthtest.Passing(two))
		reachAll(t, cl, "one", "two")
	})
}
