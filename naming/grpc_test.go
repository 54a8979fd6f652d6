package naming_test

import (
	"context"
	"encoding/json"
	"errors"
	"strings"
	"testing"
	"time"

	"github.com/beaconplane/beacon"
	"github.com/beaconplane/beacon/internal/testkit/healthtest"
	"github.com/beaconplane/beacon/naming"
	"github.com/beaconplane/beacon/naming/namingtest"
	"github.com/beaconplane/beacon/registry"
	"github.com/beaconplane/beacon/store/memory"
	"google.golang.org/grpc"
	"google.golang.org/grpc/balancer"
	"google.golang.org/grpc/codes"
	"google.golang.org/grpc/resolver"
	"google.golang.org/grpc/serviceconfig"
	"google.golang.org/grpc/status"
)

// memRegistry is a registry over a fresh memory store.
func memRegistry(t *testing.T) *registry.StoreRegistry {
	t.Helper()
	st := memory.New(memory.Config{})
	t.Cleanup(func() { _ = st.Close() })
	return newRegistry(t, st, registry.Config{})
}

func memBuilder(t *testing.T, r registry.Discoverer, opts ...naming.Option) *naming.Builder {
	t.Helper()
	b, err := naming.NewBuilder(r, opts...)
	if err != nil {
		t.Fatal(err)
	}
	return b
}

// untilAll calls until every backend in names has served a call.
func untilAll(ctx context.Context, t *testing.T, cc *grpc.ClientConn, names ...string) {
	t.Helper()
	if err := namingtest.ReachAll(ctx, cc, names...); err != nil {
		t.Fatal(err)
	}
}

// untilOnly calls until n calls in a row were served by backends in names,
// and fails if a later call of n more reaches another backend.
func untilOnly(ctx context.Context, t *testing.T, cc *grpc.ClientConn, n int, names ...string) {
	t.Helper()
	if err := namingtest.SettleOn(ctx, cc, n, names...); err != nil {
		t.Fatal(err)
	}
}

func TestRoundRobinFollowsRegistry(t *testing.T) {
	ctx := testContext(t)
	r := memRegistry(t)
	q := beacon.Query{Namespace: "rr", Component: "api", Endpoint: "grpc"}
	b1, b2, b3 := namingtest.Start(t, "b1"), namingtest.Start(t, "b2"), namingtest.Start(t, "b3")
	reg1 := register(t, r, q, b1.Addr(), nil)
	reg2 := register(t, r, q, b2.Addr(), nil)
	register(t, r, q, b3.Addr(), nil)

	cc := dial(t, memBuilder(t, r), naming.Target(q), "round_robin")
	untilAll(ctx, t, cc, "b1", "b2", "b3")

	// Draining: b1 takes no new calls although it is still registered.
	if err := reg1.Update(ctx, func(in *beacon.Instance) { in.Status = beacon.StatusDraining }); err != nil {
		t.Fatal(err)
	}
	untilOnly(ctx, t, cc, 20, "b2", "b3")

	// Deregistered: b2 is gone.
	if err := reg2.Close(); err != nil {
		t.Fatal(err)
	}
	untilOnly(ctx, t, cc, 20, "b3")

	// Serving again: b1 comes back.
	if err := reg1.Update(ctx, func(in *beacon.Instance) { in.Status = beacon.StatusServing }); err != nil {
		t.Fatal(err)
	}
	untilAll(ctx, t, cc, "b1", "b3")
}

func TestPickFirstMovesOnDrain(t *testing.T) {
	ctx := testContext(t)
	r := memRegistry(t)
	q := beacon.Query{Namespace: "pf", Component: "api", Endpoint: "grpc"}
	backends := map[string]*namingtest.Backend{"b1": namingtest.Start(t, "b1"), "b2": namingtest.Start(t, "b2")}
	regs := map[string]registry.Registration{}
	for name, be := range backends {
		regs[name] = register(t, r, q, be.Addr(), nil)
	}
	cc := dial(t, memBuilder(t, r), naming.Target(q), "pick_first")

	first, err := namingtest.Call(ctx, cc)
	if err != nil {
		t.Fatal(err)
	}
	untilOnly(ctx, t, cc, 20, first) // pick_first sticks to one backend
	other := map[string]string{"b1": "b2", "b2": "b1"}[first]

	// Drain the one in use, the way a server shuts down: Drain marks it
	// draining, then removes it; pick_first moves to the other.
	done := make(chan error, 1)
	go func() { done <- regs[first].Drain(ctx, registry.DrainGrace(0)) }()
	untilOnly(ctx, t, cc, 20, other)
	if err := <-done; err != nil {
		t.Fatal(err)
	}
}

func TestNoInstancesFailFast(t *testing.T) {
	for _, policy := range []string{"pick_first", "round_robin"} {
		t.Run(policy, func(t *testing.T) {
			ctx := testContext(t)
			r := memRegistry(t)
			q := beacon.Query{Namespace: "empty", Component: "api", Endpoint: "grpc"}
			cc := dial(t, memBuilder(t, r), naming.Target(q), policy)

			// No instance: the call fails at once with Unavailable
			// instead of waiting for its deadline.
			callCtx, cancel := context.WithTimeout(ctx, 10*time.Second)
			defer cancel()
			start := time.Now()
			_, err := namingtest.Call(callCtx, cc)
			if status.Code(err) != codes.Unavailable {
				t.Fatalf("call with no instances: %v; want Unavailable", err)
			}
			if d := time.Since(start); d > 5*time.Second {
				t.Errorf("failing took %v", d)
			}
			// pick_first carries the resolver's message; round_robin says
			// it has no children to pick from.
			if policy == "pick_first" && !strings.Contains(err.Error(), "no serving instances of beacon:///empty/api/grpc") {
				t.Errorf("pick_first error %q does not say why", err)
			}

			// A call that waits for ready waits, and succeeds as soon as
			// an instance registers.
			res := make(chan error, 1)
			go func() {
				_, err := namingtest.Call(ctx, cc, grpc.WaitForReady(true))
				res <- err
			}()
			be := namingtest.Start(t, "late")
			register(t, r, q, be.Addr(), nil)
			select {
			case err := <-res:
				if err != nil {
					t.Fatalf("wait-for-ready call: %v", err)
				}
			case <-ctx.Done():
				t.Fatal("wait-for-ready call never completed")
			}
		})
	}
}

func TestMalformedTargetFailsRPCsWithReason(t *testing.T) {
	ctx := testContext(t)
	cc := dial(t, memBuilder(t, memRegistry(t)), "beacon://prod/api/grpc", "round_robin")
	_, err := namingtest.Call(ctx, cc)
	if err == nil || !strings.Contains(err.Error(), "three slashes") {
		t.Fatalf("call on a malformed target: %v; want the parser's advice", err)
	}
}

// zoneBalancer is a custom load balancing policy that reads instance
// metadata from endpoint attributes: it keeps the endpoints of one zone and
// round-robins over them.
const zoneBalancerName = "beacon_test_zone"

func init() { balancer.Register(zoneBuilder{}) }

type zoneConfig struct {
	serviceconfig.LoadBalancingConfig
	Zone string `json:"zone"`
}

type zoneBuilder struct{}

func (zoneBuilder) Name() string { return zoneBalancerName }

func (zoneBuilder) Build(cc balancer.ClientConn, opts balancer.BuildOptions) balancer.Balancer {
	return &zoneBalancer{child: balancer.Get("round_robin").Build(cc, opts)}
}

func (zoneBuilder) ParseConfig(js json.RawMessage) (serviceconfig.LoadBalancingConfig, error) {
	var c zoneConfig
	if err := json.Unmarshal(js, &c); err != nil {
		return nil, err
	}
	return &c, nil
}

type zoneBalancer struct{ child balancer.Balancer }

func (b *zoneBalancer) UpdateClientConnState(s balancer.ClientConnState) error {
	zone := s.BalancerConfig.(*zoneConfig).Zone
	var kept []resolver.Endpoint
	for _, ep := range s.ResolverState.Endpoints {
		if z, _ := naming.MetadataValue(ep.Attributes, "zone"); z == zone {
			kept = append(kept, ep)
		}
	}
	if len(kept) == 0 {
		b.child.ResolverError(errors.New("no endpoint in zone " + zone))
		return balancer.ErrBadResolverState
	}
	s.ResolverState.Endpoints = kept
	s.ResolverState.Addresses = nil
	s.BalancerConfig = nil
	return b.child.UpdateClientConnState(s)
}

func (b *zoneBalancer) ResolverError(err error) { b.child.ResolverError(err) }
func (b *zoneBalancer) UpdateSubConnState(balancer.SubConn, balancer.SubConnState) {
}
func (b *zoneBalancer) Close()    { b.child.Close() }
func (b *zoneBalancer) ExitIdle() { b.child.ExitIdle() }

func TestMetadataReachesCustomBalancer(t *testing.T) {
	ctx := testContext(t)
	r := memRegistry(t)
	q := beacon.Query{Namespace: "zones", Component: "api", Endpoint: "grpc"}
	a1, b1, b2 := namingtest.Start(t, "a1"), namingtest.Start(t, "b1"), namingtest.Start(t, "b2")
	register(t, r, q, a1.Addr(), map[string]string{"zone": "a", "weight": "1"})
	register(t, r, q, b1.Addr(), map[string]string{"zone": "b", "weight": "2"})
	regB2 := register(t, r, q, b2.Addr(), map[string]string{"zone": "b"})

	cc := dial(t, memBuilder(t, r), naming.Target(q), `{"`+zoneBalancerName+`":{"zone":"b"}}`)
	untilAll(ctx, t, cc, "b1", "b2")
	untilOnly(ctx, t, cc, 20, "b1", "b2")

	// A metadata change (b2 moves to zone a) reaches the balancer.
	if err := regB2.Update(ctx, func(in *beacon.Instance) { in.Metadata = map[string]string{"zone": "a"} }); err != nil {
		t.Fatal(err)
	}
	untilOnly(ctx, t, cc, 20, "b1")
}

// TestRoundRobinLeavesOutFailing: through a real registry, an instance
// whose health check fails takes no new calls, a service in panic is
// called whole, and a check that passes again brings the instance back.
func TestRoundRobinLeavesOutFailing(t *testing.T) {
	ctx := testContext(t)
	r := healthtest.NewRegistry(t)
	q := beacon.Query{Namespace: "hc", Component: "api", Endpoint: "grpc"}
	put := func(ins ...beacon.Instance) { t.Helper(); r.Put(t, ins...) }
	at := func(be *namingtest.Backend) beacon.Instance {
		return beacon.Instance{Namespace: q.Namespace, Component: q.Component, Endpoint: q.Endpoint, ID: beacon.NewID(),
			Address: be.Addr(), Status: beacon.StatusServing, RegisteredAt: time.Now().UTC()}
	}
	i1, i2 := at(namingtest.Start(t, "b1")), at(namingtest.Start(t, "b2"))
	put(healthtest.Passing(i1), healthtest.Passing(i2))
	cc := dial(t, memBuilder(t, r.StoreRegistry), naming.Target(q), "round_robin")
	untilAll(ctx, t, cc, "b1", "b2")

	put(healthtest.Failing(i1, "connection refused"))
	untilOnly(ctx, t, cc, 20, "b2")
	put(healthtest.Panic(i1, "connection refused"), healthtest.Panic(i2, "connection refused"))
	untilAll(ctx, t, cc, "b1", "b2")
	put(healthtest.Failing(i1, "connection refused"), healthtest.Passing(i2))
	untilOnly(ctx, t, cc, 20, "b2")
	put(healthtest.Passing(i1))
	untilAll(ctx, t, cc, "b1", "b2")
}
