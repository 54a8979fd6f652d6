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

// at returns in at priority prio (metadata beacon.MetaPriority).
func at(in beacon.Instance, prio string) beacon.Instance {
	in.Metadata = map[string]string{beacon.MetaPriority: prio}
	return in
}

// TestPushesAFailedPrimaryTierUnhealthy: panic is judged per priority.
// A whole primary tier failing (3 of the service's 5 checked instances,
// more than the panic threshold) while its backup tier passes is no
// panic: the primaries are pushed UNHEALTHY, so clients fail over to the
// backups. When the backups fail too, no tier can take the traffic, and
// both are served whole.
func TestPushesAFailedPrimaryTierUnhealthy(t *testing.T) {
	c := newChecked(t)
	_, addr := startXDS(t, c.r, Config{})
	var primary, backup []beacon.Instance
	for _, a := range []string{"127.0.0.1:5001", "127.0.0.1:5002", "127.0.0.1:5003"} {
		primary = append(primary, healthtest.Failing(c.instance(a), "NOT_SERVING"))
	}
	for _, a := range []string{"127.0.0.1:5004", "127.0.0.1:5005"} {
		backup = append(backup, healthtest.Passing(at(c.instance(a), "20")))
	}
	c.put(append(primary, backup...)...)
	a := dialADS(t, addr, "raw")
	a.request(EndpointType, []string{"grpc.greeter.demo"}, nil, "")
	resp := awaitAddresses(t, a, nil, "127.0.0.1:5001/UNHEALTHY", "127.0.0.1:5002/UNHEALTHY", "127.0.0.1:5003/UNHEALTHY",
		"127.0.0.1:5004/HEALTHY", "127.0.0.1:5005/HEALTHY")
	for _, l := range assignments(t, resp)["grpc.greeter.demo"].GetEndpoints() {
		port := l.GetLbEndpoints()[0].GetEndpoint().GetAddress().GetSocketAddress().GetPortValue()
		if primary := port <= 5003; primary != (l.GetPriority() == 0) {
			t.Fatalf("the locality of port %d is at xDS priority %d: the primaries must be first, the backups after", port, l.GetPriority())
		}
	}
	c.put(healthtest.Failing(backup[0], "NOT_SERVING"), healthtest.Failing(backup[1], "NOT_SERVING"))
	awaitAddresses(t, a, resp, "127.0.0.1:5001/HEALTHY", "127.0.0.1:5002/HEALTHY", "127.0.0.1:5003/HEALTHY",
		"127.0.0.1:5004/HEALTHY", "127.0.0.1:5005/HEALTHY")
}

// TestClientsFailOverWhenAPrimaryTierFails: the outside tester's case in
// every client. With the whole primary tier failing its checks, calls go
// to the backup tier only; when a primary passes again, back to it.
func TestClientsFailOverWhenAPrimaryTierFails(t *testing.T) {
	c := newChecked(t)
	_, addr := startXDS(t, c.r, Config{})
	var primary, backup []beacon.Instance
	for _, name := range []string{"p1", "p2", "p3"} {
		primary = append(primary, c.instance(namingtest.Start(t, name).Addr()))
	}
	for _, name := range []string{"b4", "b5"} {
		backup = append(backup, healthtest.Passing(at(c.instance(namingtest.Start(t, name).Addr()), "20")))
	}
	failing := func(ins []beacon.Instance) []beacon.Instance {
		var out []beacon.Instance
		for _, in := range ins {
			out = append(out, healthtest.Failing(in, "NOT_SERVING"))
		}
		return out
	}
	c.put(backup...)
	forEachClient(t, func(t *testing.T, k clientKind) {
		c.put(failing(primary)...)
		cl := k.start(t, addr, "xds:///grpc.greeter.demo")
		settleOn(t, cl, 20, "b4", "b5")
		c.put(healthtest.Passing(primary[0]))
		settleOn(t, cl, 20, "p1")
	})
}
