package registry_test

import (
	"encoding/json"
	"testing"
	"time"

	"github.com/beaconplane/beacon"
	"github.com/beaconplane/beacon/registry"
	"github.com/beaconplane/beacon/registry/registrytest"
	"github.com/prometheus/client_golang/prometheus"
	"github.com/prometheus/client_golang/prometheus/testutil"
)

// What a stored instance value says about its health (another writer's,
// or an older Beacon's) is never read: Get and List carry the view's
// health, nil for an instance without a check.
func TestStoredHealthClaimsAreDropped(t *testing.T) {
	st := newMemoryStore(t)
	r := newRegistry(t, st, registry.Config{})
	ctx := within(t, 30*time.Second)
	ns := uniqueNS()
	claims := func(id string, c *beacon.Check) beacon.Instance {
		in := inst(ns, "10.0.0.1:80")
		in.ID, in.Status, in.RegisteredAt, in.Check = id, beacon.StatusServing, time.Unix(1, 0).UTC(), c
		in.Health = &beacon.Health{Status: beacon.HealthFailing, Reason: "says the value"}
		val, err := json.Marshal(in)
		if err != nil {
			t.Fatal(err)
		}
		if _, err := st.Put(ctx, r.Keyspace().Key(in.Ref()), val); err != nil {
			t.Fatal(err)
		}
		return in
	}
	plain, checked := claims("00000000000000a1", nil), claims("00000000000000a2", &beacon.Check{Kind: beacon.CheckTCP})
	for _, c := range []struct {
		in   beacon.Instance
		want string
	}{{plain, "-"}, {checked, "unknown"}} {
		got, err := r.Get(ctx, c.in.Ref())
		if err != nil || describeHealth(got) != c.want {
			t.Fatalf("Get(%s) = %s, %v; want %s", c.in.ID, describeHealth(got), err, c.want)
		}
	}
	list, _, err := r.List(ctx, beacon.Query{Namespace: ns})
	if err != nil || len(list) != 2 || describeHealth(list[0]) != "-" || describeHealth(list[1]) != "unknown" {
		t.Fatalf("List = %d instances, %v", len(list), err)
	}
}

func describeHealth(in beacon.Instance) string {
	if in.Health == nil {
		return "-"
	}
	return string(in.Health.Status)
}

// The panic gauge counts a registry's services in panic while it watches
// them, and nothing once it is closed.
func TestHealthPanicGaugeEndsWithTheRegistry(t *testing.T) {
	st := newMemoryStore(t)
	reg := prometheus.NewRegistry()
	r, err := registry.New(st, registry.Config{Metrics: reg})
	if err != nil {
		t.Fatal(err)
	}
	defer r.Close()
	ctx := within(t, 30*time.Second)
	ns := uniqueNS()
	in := inst(ns, "10.0.0.1:80")
	in.Check = &beacon.Check{Kind: beacon.CheckTCP}
	g, err := r.Register(ctx, in)
	if err != nil {
		t.Fatal(err)
	}
	val, _ := json.Marshal(beacon.Health{Status: beacon.HealthFailing})
	if _, err := st.Put(ctx, r.Keyspace().HealthKey(g.Instance().Ref()), val); err != nil {
		t.Fatal(err)
	}
	// Two watches of the service: two feeds, one service in panic.
	v := registrytest.NewView()
	for _, q := range []beacon.Query{{Namespace: ns}, {Namespace: ns, Component: in.Component}} {
		w, err := r.Watch(ctx, q)
		if err != nil {
			t.Fatal(err)
		}
		defer w.Close()
		next(t, ctx, w, v)
	}
	gauge := func() float64 {
		n, err := testutil.GatherAndCount(reg, "beacon_registry_health_panic_services")
		if err != nil || n != 1 {
			t.Fatalf("the gauge is not exported: %d series, %v", n, err)
		}
		mfs, _ := reg.Gather()
		for _, mf := range mfs {
			if mf.GetName() == "beacon_registry_health_panic_services" {
				return mf.GetMetric()[0].GetGauge().GetValue()
			}
		}
		return -1
	}
	if n := gauge(); n != 1 {
		t.Fatalf("gauge %v with one service in panic, want 1", n)
	}
	if err := r.Close(); err != nil {
		t.Fatal(err)
	}
	if n := gauge(); n != 0 {
		t.Fatalf("gauge %v after Close, want 0", n)
	}
}

// A registrant never advertises health: what it sets is dropped by
// Register, Update, RegisterWithTTL and UpdateLeased alike.
func TestRegistrantsAdvertiseNoHealth(t *testing.T) {
	r := newRegistry(t, newMemoryStore(t), registry.Config{})
	ctx := within(t, 30*time.Second)
	says := &beacon.Health{Status: beacon.HealthFailing}
	in := inst(uniqueNS(), "10.0.0.1:80")
	in.Health = says
	reg, err := r.Register(ctx, in)
	if err != nil || reg.Instance().Health != nil {
		t.Fatalf("Register: %v, health %+v", err, reg.Instance().Health)
	}
	if err := reg.Update(ctx, func(in *beacon.Instance) { in.Health = says }); err != nil || reg.Instance().Health != nil {
		t.Fatalf("Update: %v, health %+v", err, reg.Instance().Health)
	}
	in.ID = ""
	o, err := r.RegisterWithTTL(ctx, in, time.Minute)
	if err != nil || o.Instance.Health != nil {
		t.Fatalf("RegisterWithTTL: %v, health %+v", err, o.Instance.Health)
	}
	up, err := r.UpdateLeased(ctx, o.Instance.Ref(), o.Secret, func(in *beacon.Instance) { in.Health = says })
	if err != nil || up.Health != nil {
		t.Fatalf("UpdateLeased: %v, health %+v", err, up.Health)
	}
}
