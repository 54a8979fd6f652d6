package registry_test

import (
	"context"
	"fmt"
	"syscall"
	"testing"
	"time"

	"github.com/beaconplane/beacon"
	"github.com/beaconplane/beacon/internal/testkit/etcdtest"
	"github.com/beaconplane/beacon/registry"
	"github.com/beaconplane/beacon/registry/registrytest"
	"github.com/beaconplane/beacon/store"
	"github.com/beaconplane/beacon/store/etcd"
	"github.com/prometheus/client_golang/prometheus"
)

// massFleet is a fleet that, losing its leases at once, is a burst (5 or
// more removals within 250 ms).
const massFleet = 6

// TestMassRevocationIsRiddenOut: every lease of a fleet is revoked at once
// behind its sessions' backs (as a resumed etcd leader does, or etcd after
// an outage longer than the TTL). The sessions re-register with the same
// IDs within a keep-alive interval, and a watcher sees nothing at all: the
// burst of removals was held and cancelled by the re-registrations.
func TestMassRevocationIsRiddenOut(t *testing.T) {
	ctx := within(t, 30*time.Second)
	ns := uniqueNS()
	st := newMemoryStore(t)
	const ttl = time.Second
	var fleet []*registry.StoreRegistry
	for i := range massFleet {
		r := newRegistry(t, st, registry.Config{LeaseTTL: ttl})
		if _, err := r.Register(ctx, inst(ns, fmt.Sprintf("10.0.0.%d:80", i+1))); err != nil {
			t.Fatal(err)
		}
		fleet = append(fleet, r)
	}
	metrics := prometheus.NewRegistry()
	watching := newRegistry(t, st, registry.Config{LeaseTTL: ttl, Metrics: metrics})
	w, err := watching.Watch(ctx, beacon.Query{Namespace: ns})
	if err != nil {
		t.Fatal(err)
	}
	defer w.Close()
	v := registrytest.NewView()
	for v.Len() < massFleet {
		next(t, ctx, w, v)
	}
	for _, r := range fleet {
		if err := st.Revoke(ctx, r.Lease()); err != nil {
			t.Fatal(err)
		}
	}
	// Every session notices and re-registers.
	for _, r := range fleet {
		waitState(t, r, 5*time.Second, registry.StateRecovered)
	}
	// A later registration: once the watcher has it, it has applied every
	// re-registration before it (events come in revision order).
	if _, err := watching.Register(ctx, inst(ns, "10.0.0.99:80")); err != nil {
		t.Fatal(err)
	}
	for v.Len() < massFleet+1 {
		b := next(t, ctx, w, v)
		for _, e := range b.Events {
			if e.Type != beacon.Added || e.Instance.Address != "10.0.0.99:80" {
				t.Fatalf("watcher saw %v %s during the mass revocation", e.Type, e.Instance.Ref())
			}
		}
	}
	if got := heldRemovals(t, metrics, "cancelled"); got != massFleet {
		t.Fatalf("held removals cancelled: %v, want %d (delivered %v)", got, massFleet, heldRemovals(t, metrics, "delivered"))
	}
	// Nothing arrives after the hold either.
	nctx, cancel := context.WithTimeout(ctx, ttl/3+3*time.Second)
	defer cancel()
	if b, err := w.Next(nctx); err == nil {
		t.Fatalf("batch after the hold: %+v", b)
	}
}

// TestMassDeathIsDeliveredAfterHold: a burst of processes that really end
// (their leases revoked, nobody re-registers) reaches watchers once each
// removal's hold ends — a hold bounded by the registrants' own lease TTL
// (1 s here), not by the watcher's (an hour: a hold derived from it would
// be 20 minutes, past the test's deadline); a single removal, and a few at
// once (independent crashes whose leases expire in the same tick of etcd's
// lessor), are not held.
func TestMassDeathIsDeliveredAfterHold(t *testing.T) {
	ctx := within(t, 60*time.Second)
	ns := uniqueNS()
	st := newMemoryStore(t)
	const ttl = time.Second
	const few = 3
	fleet := startFleet(t, ctx, st, ns, 1+few+massFleet, ttl, "10.0.1")
	metrics := prometheus.NewRegistry()
	watching := newRegistry(t, st, registry.Config{LeaseTTL: time.Hour, Metrics: metrics})
	w, err := watching.Watch(ctx, beacon.Query{Namespace: ns})
	if err != nil {
		t.Fatal(err)
	}
	defer w.Close()
	v := registrytest.NewView()
	for v.Len() < len(fleet) {
		next(t, ctx, w, v)
	}
	// One process ends: delivered after the 50 ms coalescing, not held.
	if err := fleet[0].Close(); err != nil {
		t.Fatal(err)
	}
	for v.Len() != len(fleet)-1 {
		next(t, ctx, w, v)
	}
	if n := heldRemovals(t, metrics, "delivered"); n != 0 {
		t.Fatalf("a single removal was held (%v held removals delivered)", n)
	}
	// A fleet ends at once: held, then delivered, within the deadline.
	for _, r := range fleet[1 : 1+massFleet] {
		if err := r.Close(); err != nil {
			t.Fatal(err)
		}
	}
	for v.Len() != few {
		next(t, ctx, w, v)
	}
	if n := heldRemovals(t, metrics, "delivered"); n != massFleet {
		t.Fatalf("held removals delivered: %v, want the burst's %d", n, massFleet)
	}
	// A few end at once (long after the burst): not a burst, not held.
	for _, r := range fleet[1+massFleet:] {
		if err := r.Close(); err != nil {
			t.Fatal(err)
		}
	}
	for v.Len() != 0 {
		next(t, ctx, w, v)
	}
	if n := heldRemovals(t, metrics, "delivered"); n != massFleet {
		t.Fatalf("%d removals at once were held as a burst (held removals delivered: %v)", few, n)
	}
}

// heldRemovals reads the held-removals counter of one outcome.
func heldRemovals(t *testing.T, reg *prometheus.Registry, outcome string) float64 {
	t.Helper()
	mfs, err := reg.Gather()
	if err != nil {
		t.Fatal(err)
	}
	for _, mf := range mfs {
		if mf.GetName() != "beacon_registry_watch_held_removals_total" {
			continue
		}
		for _, m := range mf.GetMetric() {
			for _, l := range m.GetLabel() {
				if l.GetName() == "outcome" && l.GetValue() == outcome {
					return m.GetCounter().GetValue()
				}
			}
		}
	}
	return 0
}

// TestMassRevocationSeenByRelistIsRiddenOut: the same mass revocation,
// found by a watcher that re-lists (its connection was cut meanwhile) before
// the sessions noticed: every removal in the listing carries the listing's
// revision, and still they count as a burst, so nothing reaches the consumer
// once the sessions re-registered.
func TestMassRevocationSeenByRelistIsRiddenOut(t *testing.T) {
	ctx := within(t, 60*time.Second)
	ns := uniqueNS()
	admin := newEtcdStore(t, nil, etcd.Config{})
	// Sessions renew every 2 s: they notice the revocation up to 2 s late,
	// long after the watcher re-listed.
	const fleetTTL = 6 * time.Second
	var fleet []*registry.StoreRegistry
	for i := range massFleet {
		r := newRegistry(t, newEtcdStore(t, nil, etcd.Config{}), registry.Config{LeaseTTL: fleetTTL})
		if _, err := r.Register(ctx, inst(ns, fmt.Sprintf("10.0.2.%d:80", i+1))); err != nil {
			t.Fatal(err)
		}
		fleet = append(fleet, r)
	}
	proxy, _ := cutRegistry(t, server)
	st := newEtcdStore(t, nil, etcd.Config{Endpoints: []string{proxy.Endpoint()}, RequestTimeout: 500 * time.Millisecond,
		WatchSilenceTimeout: time.Second})
	watching := newRegistry(t, st, registry.Config{LeaseTTL: etcdTTL, RetryMax: 100 * time.Millisecond, RemovalHold: 4 * time.Second})
	w, err := watching.Watch(ctx, beacon.Query{Namespace: ns})
	if err != nil {
		t.Fatal(err)
	}
	defer w.Close()
	v := registrytest.NewView()
	for v.Len() < massFleet {
		next(t, ctx, w, v)
	}
	// Cut until the watcher says it is stale, then revoke every lease and
	// reconnect at once: the re-list finds the fleet gone.
	proxy.Cut()
	for b := next(t, ctx, w, v); b.Kind != registry.Stale; b = next(t, ctx, w, v) {
	}
	for _, r := range fleet {
		if err := admin.Revoke(ctx, r.Lease()); err != nil {
			t.Fatal(err)
		}
	}
	proxy.Restore()
	recovered := make(chan struct{})
	go func() {
		defer close(recovered)
		for _, r := range fleet {
			waitState(t, r, 10*time.Second, registry.StateRecovered)
		}
	}()
	deadline := time.Now().Add(fleetTTL/3 + 6*time.Second)
	for {
		nctx, cancel := context.WithDeadline(ctx, deadline)
		b, err := w.Next(nctx)
		cancel()
		if err != nil {
			break
		}
		for _, e := range b.Events {
			if e.Type == beacon.Removed {
				t.Fatalf("watcher saw %s removed (batch %v)", e.Instance.Ref(), b.Kind)
			}
		}
		if err := v.Apply(b); err != nil {
			t.Fatal(err)
		}
	}
	<-recovered
	if v.Len() != massFleet {
		t.Fatalf("view %v", v)
	}
}

// TestHeldRemovalReachesResume: while a burst of removals is held, a
// watcher is given a batch at a later revision; once the removals are
// delivered, a watch resumed from that revision still gets them (they
// happened before it, but the consumer saw the instances listed there).
func TestHeldRemovalReachesResume(t *testing.T) {
	ctx := within(t, 30*time.Second)
	ns := uniqueNS()
	st := newMemoryStore(t)
	const ttl = time.Second
	fleet := startFleet(t, ctx, st, ns, massFleet, ttl, "10.0.3")
	watching := newRegistry(t, st, registry.Config{LeaseTTL: ttl})
	w, err := watching.Watch(ctx, beacon.Query{Namespace: ns})
	if err != nil {
		t.Fatal(err)
	}
	defer w.Close()
	v := registrytest.NewView()
	for v.Len() < massFleet {
		next(t, ctx, w, v)
	}
	for _, r := range fleet { // a burst: held
		if err := r.Close(); err != nil {
			t.Fatal(err)
		}
	}
	if _, err := watching.Register(ctx, inst(ns, "10.0.3.99:80")); err != nil {
		t.Fatal(err)
	}
	b := next(t, ctx, w, v)
	if v.Len() != massFleet+1 || len(b.Events) != 1 || b.Events[0].Type != beacon.Added {
		t.Fatalf("during the hold: batch %+v, view %v", b, v)
	}
	told := b.Revision
	for v.Len() != 1 { // the hold ends: the removals arrive
		next(t, ctx, w, v)
	}
	r, err := watching.Watch(ctx, beacon.Query{Namespace: ns}, registry.FromRevision(told))
	if err != nil {
		t.Fatal(err)
	}
	defer r.Close()
	rb, err := r.Next(ctx)
	if err != nil {
		t.Fatal(err)
	}
	removed := 0
	for _, e := range rb.Events {
		if e.Type == beacon.Removed {
			removed++
		}
	}
	if rb.Kind != registry.Changes || removed != massFleet {
		t.Fatalf("resume from %d: %v batch with %d removals (%+v)", told, rb.Kind, removed, rb.Events)
	}
}

// TestOneProcessClosingManyIsNotHeld: a process that closes many of its
// registrations one after another (a shutdown without draining) removes
// them at distinct revisions, but under one lease: not a fleet losing its
// leases, so watchers see each removal after the 50 ms coalescing, not
// after RemovalHold.
func TestOneProcessClosingManyIsNotHeld(t *testing.T) {
	ctx := within(t, 30*time.Second)
	ns := uniqueNS()
	st := newMemoryStore(t)
	owner := newRegistry(t, st, registry.Config{LeaseTTL: time.Second})
	var regs []registry.Registration
	for i := range 2 * massFleet {
		r, err := owner.Register(ctx, inst(ns, fmt.Sprintf("10.0.4.%d:80", i+1)))
		if err != nil {
			t.Fatal(err)
		}
		regs = append(regs, r)
	}
	metrics := prometheus.NewRegistry()
	watching := newRegistry(t, st, registry.Config{LeaseTTL: 10 * time.Second, Metrics: metrics})
	w, err := watching.Watch(ctx, beacon.Query{Namespace: ns})
	if err != nil {
		t.Fatal(err)
	}
	defer w.Close()
	v := registrytest.NewView()
	for v.Len() < len(regs) {
		next(t, ctx, w, v)
	}
	for _, r := range regs {
		if err := r.Close(); err != nil {
			t.Fatal(err)
		}
	}
	for v.Len() != 0 {
		next(t, ctx, w, v)
	}
	if n := heldRemovals(t, metrics, "delivered") + heldRemovals(t, metrics, "cancelled"); n != 0 {
		t.Fatalf("%v removals held", n)
	}
}

// startFleet registers n instances, each through a registry (a process)
// of its own with lease TTL ttl, at addresses subnet.1:80, subnet.2:80, ...
// The test closes them (their Close is what it watches).
func startFleet(t *testing.T, ctx context.Context, st store.Store, ns string, n int, ttl time.Duration, subnet string) []*registry.StoreRegistry {
	t.Helper()
	var fleet []*registry.StoreRegistry
	for i := range n {
		r, err := registry.New(st, registry.Config{LeaseTTL: ttl})
		if err != nil {
			t.Fatal(err)
		}
		if _, err := r.Register(ctx, inst(ns, fmt.Sprintf("%s.%d:80", subnet, i+1))); err != nil {
			t.Fatal(err)
		}
		fleet = append(fleet, r)
	}
	return fleet
}

// TestMassDeathLeavesByRegistrantsTTL (end to end, real etcd, real
// registrant processes): registrants with etcd's shortest lease (2 s) are
// SIGKILLed together, and a watcher whose own TTL is an hour sees every
// removal by a generous deadline. A hold derived from the watcher's
// settings would keep them listed 20 minutes; bounded by the registrants'
// TTL it is 2.7 s at most, so the deadline tells the two apart without
// timing anything.
//
//   - killed together: their leases expire as etcd's lessor finds them,
//     one tick or a few;
//   - leases revoked together: what etcd's lessor does when they all
//     expire in one tick (a rack lost), made certain — a burst, which the
//     watcher must hold, and then deliver by the registrants' bound;
//   - etcd restarted right after the kill (as `beacon serve` killed and
//     restarted): etcd extends every lease on its return, the watcher
//     re-lists, and the removals come after its store came back.
func TestMassDeathLeavesByRegistrantsTTL(t *testing.T) {
	const n = massFleet
	for _, c := range []string{"killed together", "leases revoked together", "etcd restarted"} {
		t.Run(c, func(t *testing.T) {
			srv := server
			cfg := etcd.Config{}
			if c == "etcd restarted" {
				srv = etcdtest.Start(t, etcdtest.Options{})
				cfg = etcd.Config{Endpoints: srv.Endpoints(), RequestTimeout: 500 * time.Millisecond, Configure: fastReconnect}
			}
			ctx := within(t, 90*time.Second)
			ns := uniqueNS()
			metrics := prometheus.NewRegistry()
			watching := newRegistry(t, newEtcdStore(t, srv, cfg), registry.Config{LeaseTTL: time.Hour, Metrics: metrics})
			w, err := watching.Watch(ctx, beacon.Query{Namespace: ns})
			if err != nil {
				t.Fatal(err)
			}
			defer w.Close()
			v := registrytest.NewView()
			next(t, ctx, w, v)
			var children []*child
			for range n {
				children = append(children, startChild(t, srv.Endpoints(), ns, 1, etcdTTL))
			}
			for v.Len() < n {
				next(t, ctx, w, v)
			}
			for _, ch := range children {
				if err := ch.cmd.Process.Signal(syscall.SIGKILL); err != nil {
					t.Fatal(err)
				}
			}
			switch c {
			case "leases revoked together":
				// As a resumed leader revokes them: all at once. Revoked one
				// after another, a loaded machine spread them past the burst
				// window and the test failed for the machine, not the hold.
				admin := newEtcdStore(t, srv, etcd.Config{})
				errs := make(chan error, len(children))
				start := make(chan struct{})
				for _, ch := range children {
					go func() { <-start; errs <- admin.Revoke(ctx, ch.lease) }()
				}
				close(start)
				for range children {
					if err := <-errs; err != nil {
						t.Fatal(err)
					}
				}
			case "etcd restarted":
				srv.Stop()
				if err := srv.Restart(); err != nil {
					t.Fatal(err)
				}
			}
			for v.Len() > 0 {
				b := next(t, ctx, w, v)
				for _, e := range b.Events {
					if e.Type != beacon.Removed {
						t.Fatalf("%v %s after the kill", e.Type, e.Instance.Ref())
					}
				}
			}
			held := heldRemovals(t, metrics, "delivered")
			t.Logf("%d registrants: every removal delivered (%v of them held first)", n, held)
			if c == "leases revoked together" && held != n {
				t.Fatalf("%v held removals delivered, want %d: the burst was not held", held, n)
			}
		})
	}
}
