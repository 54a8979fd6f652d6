package registry_test

import (
	"errors"
	"strings"
	"testing"
	"time"

	"github.com/beaconplane/beacon"
	"github.com/beaconplane/beacon/registry"
	"github.com/beaconplane/beacon/registry/registrytest"
	"github.com/beaconplane/beacon/store"
	"github.com/beaconplane/beacon/store/memory"
	"github.com/prometheus/client_golang/prometheus"
)

// TestLeasedLifecycle walks the HTTP API's building blocks on every
// backend: register with a TTL, heartbeat, update, deregister; the instance
// vanishes when its client stops heartbeating.
func TestLeasedLifecycle(t *testing.T) {
	for _, b := range backends(t) {
		t.Run(b.name, func(t *testing.T) {
			t.Parallel()
			st := b.store(t)
			r := newRegistry(t, st, registry.Config{LeaseTTL: b.ttl})
			ns := uniqueNS()
			ctx := within(t, 30*time.Second)
			q := beacon.Query{Namespace: ns}
			w, err := r.Watch(ctx, q)
			if err != nil {
				t.Fatal(err)
			}
			defer w.Close()
			v := registrytest.NewView()
			next(t, ctx, w, v)

			o, err := r.RegisterWithTTL(ctx, inst(ns, "10.0.0.1:80"), b.ttl)
			if err != nil {
				t.Fatal(err)
			}
			in, lease, secret := o.Instance, o.Lease, o.Secret
			if len(secret) < 22 || secret.String() != "REDACTED" {
				t.Fatalf("secret of %d characters (String %q): want at least 128 bits, redacted when printed", len(secret), secret.String())
			}
			if beacon.ValidateID(in.ID) != nil || in.Status != beacon.StatusServing || in.RegisteredAt.IsZero() || lease.ID == store.NoLease {
				t.Fatalf("registered %+v with lease %+v", in, lease)
			}
			if lease.TTL < b.ttl {
				t.Fatalf("granted TTL %v < asked %v", lease.TTL, b.ttl)
			}
			for v.Len() != 1 {
				next(t, ctx, w, v)
			}
			if got, _ := r.Get(ctx, in.Ref()); !registrytest.Same(got, in) {
				t.Fatalf("Get = %+v, want %+v", got, in)
			}
			ttl, err := r.Heartbeat(ctx, in.Ref(), secret)
			if err != nil || ttl != lease.TTL {
				t.Fatalf("Heartbeat = %v, %v", ttl, err)
			}
			up, err := r.UpdateLeased(ctx, in.Ref(), secret, func(i *beacon.Instance) { i.Address = "10.0.0.2:80" })
			if err != nil || up.Address != "10.0.0.2:80" {
				t.Fatalf("UpdateLeased = %+v, %v", up, err)
			}
			for {
				if got, _ := v.Get(in.Ref().String()); got.Address == "10.0.0.2:80" {
					break
				}
				next(t, ctx, w, v)
			}
			if err := r.DeregisterLeased(ctx, in.Ref(), secret); err != nil {
				t.Fatal(err)
			}
			for v.Len() != 0 {
				next(t, ctx, w, v)
			}
			if _, err := r.Heartbeat(ctx, in.Ref(), secret); !errors.Is(err, beacon.ErrNotFound) {
				t.Fatalf("heartbeat of a deregistered instance: %v", err)
			}
			// Deregistering revoked the registration's own lease.
			if _, err := r.KeepAliveLease(ctx, lease.ID); !errors.Is(err, beacon.ErrNotFound) || !errors.Is(err, store.ErrLeaseNotFound) {
				t.Fatalf("keep-alive of the deregistered registration's lease: %v", err)
			}

			// A client that stops heartbeating disappears within its TTL.
			o2, err := r.RegisterWithTTL(ctx, inst(ns, "10.0.0.3:80"), b.ttl)
			if err != nil {
				t.Fatal(err)
			}
			gone, l2 := o2.Instance, o2.Lease
			for v.Len() != 1 {
				next(t, ctx, w, v)
			}
			start := time.Now()
			for v.Len() != 0 {
				next(t, ctx, w, v)
			}
			if d := time.Since(start); d > l2.TTL+2*time.Second {
				t.Fatalf("expired after %v with a TTL of %v", d, l2.TTL)
			}
			if _, err := r.Heartbeat(ctx, gone.Ref(), o2.Secret); !errors.Is(err, beacon.ErrNotFound) {
				t.Fatalf("heartbeat after expiry: %v", err)
			}
		})
	}
}

// TestLeasedBadInput: every kind of bad input gets a clear error matching
// the sentinel the HTTP layer maps to a status, and writes nothing.
func TestLeasedBadInput(t *testing.T) {
	st := newMemoryStore(t)
	r := newRegistry(t, st, registry.Config{})
	ns := uniqueNS()
	ctx := within(t, 30*time.Second)

	for _, ttl := range []time.Duration{0, -time.Second, 500 * time.Millisecond, 2 * time.Hour} {
		if _, err := r.RegisterWithTTL(ctx, inst(ns, "10.0.0.1:80"), ttl); !errors.Is(err, registry.ErrInvalidTTL) {
			t.Errorf("TTL %v: %v", ttl, err)
		}
	}
	big := inst(ns, "10.0.0.1:80")
	big.Metadata = map[string]string{"k": strings.Repeat("v", 5000)}
	if _, err := r.RegisterWithTTL(ctx, big, time.Minute); !errors.Is(err, beacon.ErrMetadataTooLarge) {
		t.Errorf("metadata over 4 KiB: %v", err)
	}
	if _, err := r.RegisterWithTTL(ctx, inst("Bad", "10.0.0.1:80"), time.Minute); !errors.Is(err, beacon.ErrInvalidName) {
		t.Errorf("bad namespace: %v", err)
	}
	if _, err := r.RegisterWithTTL(ctx, inst(ns, "localhost"), time.Minute); !errors.Is(err, beacon.ErrInvalidAddress) {
		t.Errorf("address without a port: %v", err)
	}
	// Uniqueness: a live ID cannot be taken, by a leased or a session
	// registration; the failed attempt leaves no lease behind.
	owned, err := r.RegisterWithTTL(ctx, inst(ns, "10.0.0.1:80"), time.Minute)
	if err != nil {
		t.Fatal(err)
	}
	held, lease, secret := owned.Instance, owned.Lease, owned.Secret
	dup := inst(ns, "10.0.0.2:80")
	dup.ID = held.ID
	if _, err := r.RegisterWithTTL(ctx, dup, time.Minute); !errors.Is(err, beacon.ErrAlreadyRegistered) {
		t.Errorf("duplicate ID: %v", err)
	}
	if _, err := r.Register(ctx, dup); !errors.Is(err, beacon.ErrAlreadyRegistered) {
		t.Errorf("duplicate ID through the session: %v", err)
	}
	if got, _ := r.Get(ctx, held.Ref()); got.Address != "10.0.0.1:80" {
		t.Fatalf("held instance overwritten: %+v", got)
	}
	// Unknown IDs, wrong secrets, the session's own lease.
	unknown := beacon.Ref{Namespace: ns, Component: "api", Endpoint: "http", ID: beacon.NewID()}
	if _, err := r.Heartbeat(ctx, unknown, secret); !errors.Is(err, beacon.ErrNotFound) {
		t.Errorf("heartbeat of an unknown ID: %v", err)
	}
	if err := r.DeregisterLeased(ctx, unknown, secret); !errors.Is(err, beacon.ErrNotFound) {
		t.Errorf("deregister of an unknown ID: %v", err)
	}
	if _, err := r.UpdateLeased(ctx, held.Ref(), secret, func(i *beacon.Instance) { i.ID = beacon.NewID() }); !errors.Is(err, registry.ErrIdentityChanged) {
		t.Errorf("update of the ID: %v", err)
	}
	if _, err := r.UpdateLeased(ctx, held.Ref(), secret, func(i *beacon.Instance) { i.Address = "" }); !errors.Is(err, beacon.ErrInvalidAddress) {
		t.Errorf("update to an empty address: %v", err)
	}
	if _, err := r.Heartbeat(ctx, beacon.Ref{Namespace: ns}, secret); !errors.Is(err, beacon.ErrInvalid) {
		t.Errorf("heartbeat of a malformed ref: %v", err)
	}
	if _, err := r.KeepAliveLease(ctx, store.NoLease); !errors.Is(err, beacon.ErrInvalid) {
		t.Errorf("keep-alive of lease 0: %v", err)
	}
	if _, err := r.Register(ctx, inst(ns, "10.0.0.5:80")); err != nil {
		t.Fatal(err)
	}
	if err := r.RevokeLease(ctx, r.Lease()); !errors.Is(err, registry.ErrLeaseMismatch) {
		t.Errorf("revoking the session lease through the leased API: %v", err)
	}
	if _, _, err := r.RegisterLeased(ctx, inst(ns, "10.0.0.6:80"), lease.ID+1000); !errors.Is(err, beacon.ErrNotFound) {
		t.Errorf("register with an unknown lease: %v", err)
	}
	list, _, err := r.List(ctx, beacon.Query{Namespace: ns})
	if err != nil || len(list) != 2 {
		t.Fatalf("after the bad input List has %d instances, %v; want the 2 good ones", len(list), err)
	}
}

// TestLeasedRegistrationsMetric: beacon_registry_leased_registrations
// counts the instances registered on leases of their own through the
// registries of a Registerer, down on deregistration, revocation and on a
// lease that expired without a renewal through them.
func TestLeasedRegistrationsMetric(t *testing.T) {
	reg := prometheus.NewRegistry()
	st := memory.New(memory.Config{})
	defer st.Close()
	r1 := newRegistry(t, st, registry.Config{Metrics: reg})
	r2 := newRegistry(t, st, registry.Config{Metrics: reg})
	ctx := within(t, 30*time.Second)
	count := func() float64 {
		t.Helper()
		mfs, err := reg.Gather()
		if err != nil {
			t.Fatal(err)
		}
		for _, mf := range mfs {
			if mf.GetName() == "beacon_registry_leased_registrations" {
				return mf.GetMetric()[0].GetGauge().GetValue()
			}
		}
		t.Fatal("beacon_registry_leased_registrations is not exported")
		return 0
	}
	ns := uniqueNS()
	a, err := r1.RegisterWithTTL(ctx, inst(ns, "10.0.0.1:80"), time.Minute)
	if err != nil {
		t.Fatal(err)
	}
	b, err := r2.RegisterWithTTL(ctx, inst(ns, "10.0.0.2:80"), time.Minute)
	if err != nil {
		t.Fatal(err)
	}
	if _, err := r1.RegisterWithTTL(ctx, inst(ns, "10.0.0.3:80"), time.Second); err != nil {
		t.Fatal(err)
	}
	if _, err := r1.Register(ctx, inst(ns, "10.0.0.4:80")); err != nil { // the session's: not counted here
		t.Fatal(err)
	}
	if got := count(); got != 3 {
		t.Fatalf("after three HTTP-style registrations: %v", got)
	}
	if _, err := r1.Heartbeat(ctx, a.Instance.Ref(), a.Secret); err != nil {
		t.Fatal(err)
	}
	if err := r2.DeregisterLeased(ctx, b.Instance.Ref(), b.Secret); err != nil {
		t.Fatal(err)
	}
	if got := count(); got != 2 {
		t.Fatalf("after a deregistration: %v", got)
	}
	deadline := time.Now().Add(20 * time.Second) // the 1 s lease, never renewed
	for count() != 1 {
		if time.Now().After(deadline) {
			t.Fatalf("an expired lease still counts: %v", count())
		}
		select {
		case <-time.After(50 * time.Millisecond): // the clock is the event: the TTL
		case <-ctx.Done():
			t.Fatal(ctx.Err())
		}
	}
	if err := r1.RevokeLease(ctx, a.Lease.ID); err != nil {
		t.Fatal(err)
	}
	if got := count(); got != 0 {
		t.Fatalf("after a revocation: %v", got)
	}
	// A registration heartbeated through a registry that did not make it
	// (the server restarted, or the client's heartbeats go to another
	// server) counts there from its first heartbeat: it stayed 0 while
	// the instance was live and kept alive through it.
	other := prometheus.NewRegistry()
	r3 := newRegistry(t, st, registry.Config{Metrics: other})
	c, err := r1.RegisterWithTTL(ctx, inst(ns, "10.0.0.5:80"), time.Minute)
	if err != nil {
		t.Fatal(err)
	}
	if _, err := r3.Heartbeat(ctx, c.Instance.Ref(), c.Secret); err != nil {
		t.Fatal(err)
	}
	mfs, err := other.Gather()
	if err != nil {
		t.Fatal(err)
	}
	got := -1.0
	for _, mf := range mfs {
		if mf.GetName() == "beacon_registry_leased_registrations" {
			got = mf.GetMetric()[0].GetGauge().GetValue()
		}
	}
	if got != 1 {
		t.Fatalf("a registry that heartbeats a registration made elsewhere counts %v of it, want 1", got)
	}
}
