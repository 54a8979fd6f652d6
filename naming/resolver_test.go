package naming_test

import (
	"errors"
	"fmt"
	"net/url"
	"strings"
	"testing"
	"time"

	"github.com/beaconplane/beacon"
	"github.com/beaconplane/beacon/internal/testkit/healthtest"
	"github.com/beaconplane/beacon/naming"
	"github.com/beaconplane/beacon/naming/internal/cctest"
	"github.com/beaconplane/beacon/registry"
	"github.com/prometheus/client_golang/prometheus"
	"google.golang.org/grpc/attributes"
	"google.golang.org/grpc/resolver"
)

const target = "beacon:///prod/api/grpc"

func buildResolver(t *testing.T, d *fakeDiscoverer, opts ...naming.Option) (*cctest.ClientConn, resolver.Resolver) {
	t.Helper()
	b, err := naming.NewBuilder(d, opts...)
	if err != nil {
		t.Fatal(err)
	}
	u, err := url.Parse(target)
	if err != nil {
		t.Fatal(err)
	}
	cc := cctest.New()
	r, err := b.Build(resolver.Target{URL: *u}, cc, resolver.BuildOptions{})
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(r.Close)
	return cc, r
}

func TestResolverFullStateOnEveryBatch(t *testing.T) {
	d := newFakeDiscoverer()
	w := d.next()
	cc, _ := buildResolver(t, d)

	a := inst("000000000000000a", "10.0.0.1:50051", map[string]string{"zone": "a", "weight": "3"})
	b := inst("000000000000000b", "10.0.0.2:50051", nil)
	c := inst("000000000000000c", "10.0.0.3:50051", nil)
	w.send(registry.Snapshot, added(b), added(a), added(draining(c)))
	i, st := cc.WaitState(t, 0, "[10.0.0.1:50051 10.0.0.2:50051]") // sorted, draining left out

	// Every endpoint carries its instance; metadata is readable per key.
	if got, ok := naming.MetadataValue(st.Endpoints[0].Attributes, "weight"); !ok || got != "3" {
		t.Errorf("weight of a = %q, %v", got, ok)
	}
	in, ok := naming.InstanceFrom(st.Endpoints[0].Attributes)
	if !ok || !in.Equal(a) {
		t.Errorf("InstanceFrom = %+v, %v; want %+v", in, ok, a)
	}
	in.Metadata["zone"] = "mutated"
	if z, _ := naming.MetadataValue(st.Endpoints[0].Attributes, "zone"); z != "a" {
		t.Errorf("InstanceFrom shares its metadata: zone is now %q", z)
	}
	// The legacy address list carries the same attributes for balancers
	// that read addresses.
	if len(st.Addresses) != 2 || !st.Addresses[1].BalancerAttributes.Equal(st.Endpoints[1].Attributes) { //nolint:staticcheck // the legacy address list
		t.Errorf("addresses = %+v", st.Addresses)
	}

	// Changes: c serves again, b moves, a goes away. Each batch gives the
	// full state.
	w.send(registry.Changes, updated(c))
	i, _ = cc.WaitState(t, i, "[10.0.0.1:50051 10.0.0.2:50051 10.0.0.3:50051]")
	b.Address = "10.0.0.9:50051"
	w.send(registry.Changes, updated(b), removed(a))
	i, _ = cc.WaitState(t, i, "[10.0.0.9:50051 10.0.0.3:50051]")

	// A batch that changes nothing the channel sees (metadata of a
	// draining instance... here: c drains) pushes only what changed.
	w.send(registry.Changes, updated(draining(c)))
	cc.WaitState(t, i, "[10.0.0.9:50051]")
}

func TestResolverNoInstancesFailsFast(t *testing.T) {
	d := newFakeDiscoverer()
	w := d.next()
	cc, _ := buildResolver(t, d)

	w.send(registry.Snapshot) // nothing registered: only the error
	i, err := cc.WaitError(t, 0, "none registered")
	if !errors.Is(err, naming.ErrNoInstances) || !strings.Contains(err.Error(), target) {
		t.Errorf("error = %v; want ErrNoInstances naming the target", err)
	}

	a := inst("000000000000000a", "10.0.0.1:50051", nil)
	w.send(registry.Changes, added(a))
	i, _ = cc.WaitState(t, i, "[10.0.0.1:50051]")

	// Draining the last instance empties the channel (so that balancers
	// drop their connections), with an error that says why.
	w.send(registry.Changes, updated(draining(a)))
	i, st := cc.WaitState(t, i, "[]")
	if st.Endpoints == nil {
		t.Error("empty state has nil Endpoints; want an empty list")
	}
	cc.WaitError(t, i, "1 registered, 1 draining")
}

// TestResolverLeavesOutFailing: an instance whose health check fails is
// left out as a draining one, and back when it passes; passing, unknown
// and panic (failing in a service in panic) instances are pushed; with
// none left the error counts the draining and the failing apart.
func TestResolverLeavesOutFailing(t *testing.T) {
	d := newFakeDiscoverer()
	w := d.next()
	cc, _ := buildResolver(t, d)

	a := healthtest.Passing(inst("000000000000000a", "10.0.0.1:50051", nil))
	b := healthtest.Unknown(inst("000000000000000b", "10.0.0.2:50051", nil))
	c := inst("000000000000000c", "10.0.0.3:50051", nil)
	w.send(registry.Snapshot, added(a), added(healthtest.Failing(b, "refused")), added(c))
	i, _ := cc.WaitState(t, 0, "[10.0.0.1:50051 10.0.0.3:50051]")
	w.send(registry.Changes, updated(b))
	i, _ = cc.WaitState(t, i, "[10.0.0.1:50051 10.0.0.2:50051 10.0.0.3:50051]")
	w.send(registry.Changes, updated(healthtest.Panic(a, "refused")), updated(healthtest.Panic(b, "refused")))
	i, st := cc.WaitState(t, i, "[10.0.0.1:50051 10.0.0.2:50051 10.0.0.3:50051]")
	if in, ok := naming.InstanceFrom(st.Endpoints[0].Attributes); !ok || in.Health == nil || !in.Health.Panic {
		t.Errorf("InstanceFrom = %+v, %v; want the instance with its panic verdict", in, ok)
	}
	w.send(registry.Changes, updated(healthtest.Failing(a, "refused")), updated(healthtest.Failing(b, "refused")), updated(draining(c)))
	i, _ = cc.WaitState(t, i, "[]")
	cc.WaitError(t, i, "3 registered, 1 draining, 2 failing their health check, 0 with an address")
}

func TestResolverStaleReportsErrorThenResyncs(t *testing.T) {
	d := newFakeDiscoverer()
	w := d.next()
	reg := prometheus.NewRegistry()
	cc, _ := buildResolver(t, d, naming.WithMetrics(reg))

	a := inst("000000000000000a", "10.0.0.1:50051", nil)
	b := inst("000000000000000b", "10.0.0.2:50051", nil)
	w.send(registry.Snapshot, added(a), added(b))
	i, _ := cc.WaitState(t, 0, "[10.0.0.1:50051 10.0.0.2:50051]")

	w.stale(errors.New("store unreachable: connection refused"))
	i, err := cc.WaitError(t, i, "connection refused")
	if !errors.Is(err, naming.ErrStale) {
		t.Errorf("stale error = %v; want ErrStale", err)
	}
	// The stale batch did not touch the state.
	for _, e := range cc.Events()[i-1:] {
		if e.State != nil {
			t.Fatalf("state pushed on a stale batch: %v", e)
		}
	}
	// Resync with no difference: the state is pushed again, clearing the
	// error; with a difference, the new state.
	w.send(registry.Resync)
	i, _ = cc.WaitState(t, i, "[10.0.0.1:50051 10.0.0.2:50051]")
	w.stale(errors.New("again"))
	i, _ = cc.WaitError(t, i, "again")
	w.send(registry.Resync, removed(a))
	cc.WaitState(t, i, "[10.0.0.2:50051]")

	if got := counter(t, reg, "beacon_naming_resolver_errors_total", "stale"); got != 2 {
		t.Errorf("stale errors counted = %v, want 2", got)
	}
}

func TestResolverWatchesAgainAfterErrors(t *testing.T) {
	d := newFakeDiscoverer()
	d.fail(errors.New("watch refused")) // the first Watch call fails
	w1 := d.next()
	cc, _ := buildResolver(t, d, naming.WithRetryMax(time.Millisecond))

	i, err := cc.WaitError(t, 0, "watch refused")
	if !errors.Is(err, naming.ErrWatchEnded) {
		t.Errorf("error = %v; want ErrWatchEnded", err)
	}
	a := inst("000000000000000a", "10.0.0.1:50051", nil)
	b := inst("000000000000000b", "10.0.0.2:50051", nil)
	w1.send(registry.Snapshot, added(a), added(b))
	i, _ = cc.WaitState(t, i, "[10.0.0.1:50051 10.0.0.2:50051]")

	// The watch ends unexpectedly: error reported, old watcher closed, a
	// new watch's snapshot replaces the whole state (b is gone in it).
	w2 := d.next()
	w1.end(registry.ErrWatchClosed)
	i, _ = cc.WaitError(t, i, "watch closed")
	w1.waitClosed(t)
	w2.send(registry.Snapshot, added(a))
	cc.WaitState(t, i, "[10.0.0.1:50051]")

	d.mu.Lock()
	defer d.mu.Unlock()
	for _, q := range d.queries {
		if q != (beacon.Query{Namespace: "prod", Component: "api", Endpoint: "grpc"}) {
			t.Errorf("watched %+v", q)
		}
	}
}

func TestResolverRegistryClosed(t *testing.T) {
	d := newFakeDiscoverer()
	w := d.next()
	cc, r := buildResolver(t, d, naming.WithRetryMax(time.Millisecond))
	w.send(registry.Snapshot, added(inst("000000000000000a", "10.0.0.1:50051", nil)))
	i, _ := cc.WaitState(t, 0, "[10.0.0.1:50051]")
	w.end(registry.ErrClosed)
	_, err := cc.WaitError(t, i, "registry: closed")
	if !errors.Is(err, registry.ErrClosed) {
		t.Errorf("error = %v; want one matching registry.ErrClosed", err)
	}
	// No retry against a closed registry, and Close returns.
	r.Close()
	select {
	case res := <-d.watches:
		t.Errorf("watched again after the registry closed: %+v", res)
	default:
	}
}

func TestResolverSkipsUndialableAndDuplicateAddresses(t *testing.T) {
	d := newFakeDiscoverer()
	w := d.next()
	reg := prometheus.NewRegistry()
	cc, _ := buildResolver(t, d, naming.WithMetrics(reg))
	w.send(registry.Snapshot,
		added(inst("000000000000000a", "nats://10.0.0.1:4222/x", nil)),
		added(inst("000000000000000b", "10.0.0.2:50051", nil)),
		added(inst("000000000000000c", "10.0.0.2:50051", nil)))
	i, _ := cc.WaitState(t, 0, "[10.0.0.2:50051]")
	if got := counter(t, reg, "beacon_naming_skipped_total", "not_dialable"); got != 1 {
		t.Errorf("not_dialable = %v", got)
	}
	if got := counter(t, reg, "beacon_naming_skipped_total", "duplicate_address"); got != 1 {
		t.Errorf("duplicate_address = %v", got)
	}
	// Only undialable instances left: no instances, and the error says so.
	w.send(registry.Changes, removed(inst("000000000000000b", "10.0.0.2:50051", nil)),
		removed(inst("000000000000000c", "10.0.0.2:50051", nil)))
	i, _ = cc.WaitState(t, i, "[]")
	cc.WaitError(t, i, "1 with an address gRPC cannot dial")
}

func TestBuildNeverBlocks(t *testing.T) {
	d := newFakeDiscoverer() // Watch waits forever: no watcher scripted
	cc := cctest.New()
	b, err := naming.NewBuilder(d)
	if err != nil {
		t.Fatal(err)
	}
	u, _ := url.Parse(target)
	done := make(chan resolver.Resolver)
	go func() {
		r, err := b.Build(resolver.Target{URL: *u}, cc, resolver.BuildOptions{})
		if err != nil {
			t.Error(err)
		}
		done <- r
	}()
	select {
	case r := <-done:
		r.Close() // and Close returns although Watch is still waiting
	case <-time.After(5 * time.Second):
		t.Fatal("Build blocked")
	}
	if ev := cc.Events(); len(ev) != 0 {
		t.Errorf("events before any batch: %v", ev)
	}
}

func TestBuildRejectsMalformedTargets(t *testing.T) {
	b, err := naming.NewBuilder(newFakeDiscoverer())
	if err != nil {
		t.Fatal(err)
	}
	for _, raw := range []string{
		"beacon://prod/api/grpc", "beacon:///prod/api", "beacon:///prod/api/grpc/x",
		"beacon:///Prod/api/grpc", "beacon:///prod/api/grpc?x=1", "beacon:///",
		"beacon:///prod/api/grpc_1", // a Dynamo name: a registry of Beacon's layout holds none
	} {
		u, err := url.Parse(raw)
		if err != nil {
			t.Fatal(err)
		}
		_, err = b.Build(resolver.Target{URL: *u}, cctest.New(), resolver.BuildOptions{})
		if !errors.Is(err, naming.ErrInvalidTarget) {
			t.Errorf("Build(%q) = %v; want ErrInvalidTarget", raw, err)
		}
	}
}

func TestNewBuilderValidates(t *testing.T) {
	if _, err := naming.NewBuilder(nil); !errors.Is(err, naming.ErrInvalidConfig) {
		t.Errorf("nil discoverer: %v", err)
	}
	for _, s := range []string{"", "Beacon", "1x", "be acon", "x_y"} {
		if _, err := naming.NewBuilder(newFakeDiscoverer(), naming.WithScheme(s)); !errors.Is(err, naming.ErrInvalidConfig) {
			t.Errorf("scheme %q: %v", s, err)
		}
	}
	if _, err := naming.NewBuilder(newFakeDiscoverer(), naming.WithRetryMax(-1)); !errors.Is(err, naming.ErrInvalidConfig) {
		t.Errorf("negative retry: %v", err)
	}
	b, err := naming.NewBuilder(newFakeDiscoverer(), naming.WithScheme("beacon-eu"))
	if err != nil || b.Scheme() != "beacon-eu" {
		t.Errorf("scheme beacon-eu: %v, %v", b, err)
	}
	// Two builders share the collectors of one Registerer.
	reg := prometheus.NewRegistry()
	for range 2 {
		if _, err := naming.NewBuilder(newFakeDiscoverer(), naming.WithMetrics(reg)); err != nil {
			t.Fatal(err)
		}
	}
}

func TestOverrideAuthority(t *testing.T) {
	b, _ := naming.NewBuilder(newFakeDiscoverer())
	for raw, want := range map[string]string{
		"beacon:///prod/api/grpc": "grpc.api.prod",
		"beacon:prod/api/grpc":    "grpc.api.prod",
		"beacon:///prod/api":      "prod%2Fapi",
	} {
		u, _ := url.Parse(raw)
		if got := b.OverrideAuthority(resolver.Target{URL: *u}); got != want {
			t.Errorf("authority of %s = %q, want %q", raw, got, want)
		}
	}
}

// Map metadata must never reach gRPC in a form it cannot compare
// (etcd#19700): comparing attributes of instances with metadata works and
// tells changes apart.
func TestAttributesCompareInstancesWithMaps(t *testing.T) {
	d := newFakeDiscoverer()
	w := d.next()
	cc, _ := buildResolver(t, d)
	a := inst("000000000000000a", "10.0.0.1:50051", map[string]string{"zone": "a"})
	w.send(registry.Snapshot, added(a))
	i, s1 := cc.WaitState(t, 0, "[10.0.0.1:50051]")
	a2 := a.Clone()
	a2.Metadata["zone"] = "b"
	w.send(registry.Changes, updated(a2))
	_, s2 := cc.WaitState(t, i, "[10.0.0.1:50051]")
	e1, e2 := s1.Endpoints[0].Attributes, s2.Endpoints[0].Attributes
	if e1.Equal(e2) {
		t.Error("attributes of different metadata compare equal")
	}
	if !e1.Equal(e1) || e2.Equal(attributes.New("x", 1)) {
		t.Error("attribute equality is broken")
	}
	if _, ok := naming.InstanceFrom(attributes.New("other", 1)); ok {
		t.Error("InstanceFrom found an instance in foreign attributes")
	}
	if _, ok := naming.MetadataValue(nil, "zone"); ok {
		t.Error("MetadataValue found a value in nil attributes")
	}
	_ = fmt.Sprint(e1) // String must not panic either
}

// counter returns the value of the counter name with label reason (summed
// over other labels), or 0.
func counter(t *testing.T, reg *prometheus.Registry, name, reason string) float64 {
	t.Helper()
	mfs, err := reg.Gather()
	if err != nil {
		t.Fatal(err)
	}
	sum := 0.0
	for _, mf := range mfs {
		if mf.GetName() != name {
			continue
		}
		for _, m := range mf.GetMetric() {
			for _, l := range m.GetLabel() {
				if l.GetName() == "reason" && l.GetValue() == reason {
					sum += m.GetCounter().GetValue()
				}
			}
		}
	}
	return sum
}
