package registry_test

import (
	"context"
	"crypto/rand"
	"encoding/hex"
	"encoding/json"
	"errors"
	"fmt"
	"slices"
	"strings"
	"testing"
	"time"

	"github.com/beaconplane/beacon"
	"github.com/beaconplane/beacon/registry"
	"github.com/beaconplane/beacon/registry/registrytest"
	"github.com/beaconplane/beacon/store"
	"github.com/prometheus/client_golang/prometheus"
	"github.com/prometheus/client_golang/prometheus/testutil"
)

func uniqueNS() string {
	var b [5]byte
	_, _ = rand.Read(b[:])
	return "st-" + hex.EncodeToString(b[:])
}

func inst(ns, addr string) beacon.Instance {
	return beacon.Instance{Namespace: ns, Component: "api", Endpoint: "http", Address: addr, Transport: "http"}
}

// waitState reads r's state changes until one in want arrives.
func waitState(t *testing.T, r *registry.StoreRegistry, within time.Duration, want ...registry.State) registry.StateChange {
	t.Helper()
	deadline := time.After(within)
	for {
		select {
		case c, ok := <-r.States():
			if !ok {
				t.Fatalf("States closed while waiting for %v", want)
			}
			if slices.Contains(want, c.State) {
				return c
			}
		case <-deadline:
			t.Fatalf("no state in %v within %v (now %v)", want, within, r.State())
		}
	}
}

// converge reads w until its view equals the registry's listing of q.
func converge(t *testing.T, r registry.Discoverer, w registry.Watcher, v *registrytest.View, q beacon.Query, within time.Duration) []beacon.Instance {
	t.Helper()
	deadline := time.Now().Add(within)
	for {
		want, _, err := r.List(within0(t, deadline), q)
		if err == nil && v.Equal(want) {
			return want
		}
		ctx := within0(t, deadline)
		b, err := w.Next(ctx)
		if err != nil {
			t.Fatalf("watcher did not converge to the listing within %v: %v (view %v, list %d)", within, err, v, len(want))
		}
		if err := v.Apply(b); err != nil {
			t.Fatal(err)
		}
	}
}

func within0(t *testing.T, deadline time.Time) context.Context {
	ctx, cancel := context.WithDeadline(context.Background(), deadline)
	t.Cleanup(cancel)
	return ctx
}

// TestSessionRecoversAfterLeaseLoss ends the session's lease behind its back
// (as an expiry would): the session reports lost, gets a new lease, writes
// every registration again with the same IDs and reports recovered; a
// watcher in another process converges to the same instances.
func TestSessionRecoversAfterLeaseLoss(t *testing.T) {
	for _, b := range backends(t) {
		t.Run(b.name, func(t *testing.T) {
			t.Parallel()
			ns := uniqueNS()
			st := b.store(t)
			r := newRegistry(t, st, registry.Config{LeaseTTL: b.ttl})
			other := newRegistry(t, b.store(t), registry.Config{})
			ctx := within(t, 30*time.Second)
			var regs []registry.Registration
			for i := range 3 {
				reg, err := r.Register(ctx, inst(ns, fmt.Sprintf("10.0.0.%d:80", i+1)))
				if err != nil {
					t.Fatal(err)
				}
				regs = append(regs, reg)
			}
			if c := waitState(t, r, 5*time.Second, registry.StateActive); c.Lease == store.NoLease {
				t.Fatalf("first state change %+v", c)
			}
			q := beacon.Query{Namespace: ns}
			w, err := other.Watch(ctx, q)
			if err != nil {
				t.Fatal(err)
			}
			defer w.Close()
			v := registrytest.NewView()
			before := converge(t, other, w, v, q, 10*time.Second)
			if len(before) != 3 {
				t.Fatalf("listed %d instances", len(before))
			}

			old := r.Lease()
			if err := b.store(t).Revoke(ctx, old); err != nil {
				t.Fatal(err)
			}
			lost := waitState(t, r, 2*b.ttl, registry.StateLost)
			if !errors.Is(lost.Err, registry.ErrLeaseLost) || !errors.Is(lost.Err, store.ErrLeaseNotFound) {
				t.Fatalf("lost state error %v", lost.Err)
			}
			rec := waitState(t, r, 2*b.ttl, registry.StateRecovered)
			if rec.Lease == old || rec.Lease == store.NoLease || rec.Registered != 3 || len(rec.Conflicts) != 0 {
				t.Fatalf("recovered state %+v (old lease %x)", rec, old)
			}
			after := converge(t, other, w, v, q, 2*b.ttl)
			if !registrytest.SameInstances(before, after) {
				t.Fatalf("re-registered instances differ:\nbefore %+v\nafter  %+v", before, after)
			}
			for _, reg := range regs {
				if err := reg.Err(); err != nil {
					t.Errorf("%s: Err() = %v after recovery", reg.Instance().Ref(), err)
				}
			}
			// Registrations keep working under the new lease.
			if err := regs[0].Update(ctx, func(in *beacon.Instance) { in.Address = "10.1.0.1:80" }); err != nil {
				t.Fatal(err)
			}
			converge(t, other, w, v, q, 10*time.Second)
		})
	}
}

// TestSessionConflictAfterLoss: while the session's lease is gone, another
// process takes one of its IDs. The session re-registers the others,
// reports the conflict loudly (state change, Registration.Err, metric) and
// never overwrites the other process; when that process lets go, the
// session reclaims the ID.
func TestSessionConflictAfterLoss(t *testing.T) {
	st := newMemoryStore(t)
	metrics := prometheus.NewPedanticRegistry()
	a := newRegistry(t, st, registry.Config{LeaseTTL: time.Second, Metrics: metrics})
	b := newRegistry(t, st, registry.Config{})
	ns := uniqueNS()
	ctx := within(t, 30*time.Second)
	keep, err := a.Register(ctx, inst(ns, "10.0.0.1:80"))
	if err != nil {
		t.Fatal(err)
	}
	taken, err := a.Register(ctx, inst(ns, "10.0.0.2:80"))
	if err != nil {
		t.Fatal(err)
	}
	waitState(t, a, 5*time.Second, registry.StateActive)

	// Process b claims taken's ID with its own lease, in the same
	// revision as a's lease ends (so a cannot win the race).
	thief, err := b.GrantLease(ctx, time.Minute)
	if err != nil {
		t.Fatal(err)
	}
	stolen := taken.Instance()
	stolen.Address = "10.9.9.9:80"
	val, err := json.Marshal(stolen)
	if err != nil {
		t.Fatal(err)
	}
	key := a.Keyspace().Key(stolen.Ref())
	if _, err := st.Txn(ctx, store.Op{Kind: store.OpPut, Key: key, Value: val, Lease: thief.ID}); err != nil {
		t.Fatal(err)
	}
	if err := st.Revoke(ctx, a.Lease()); err != nil {
		t.Fatal(err)
	}
	waitState(t, a, 3*time.Second, registry.StateLost)
	rec := waitState(t, a, 3*time.Second, registry.StateRecovered)
	if len(rec.Conflicts) != 1 || rec.Conflicts[0] != stolen.Ref() || !errors.Is(rec.Err, beacon.ErrAlreadyRegistered) {
		t.Fatalf("recovered with %+v, want one conflict on %s", rec, stolen.Ref())
	}
	if err := taken.Err(); !errors.Is(err, beacon.ErrAlreadyRegistered) {
		t.Fatalf("conflicted registration Err() = %v", err)
	}
	if err := keep.Err(); err != nil {
		t.Fatalf("other registration Err() = %v", err)
	}
	if got := testutil.ToFloat64(collector(t, metrics, "beacon_registry_registration_conflicts")); got != 1 {
		t.Fatalf("conflicts metric %v", got)
	}
	// Never overwritten.
	got, err := b.Get(ctx, stolen.Ref())
	if err != nil || got.Address != "10.9.9.9:80" {
		t.Fatalf("the other process's instance: %+v, %v", got, err)
	}

	// The other process lets go: a reclaims the ID.
	if err := b.RevokeLease(ctx, thief.ID); err != nil {
		t.Fatal(err)
	}
	c := waitState(t, a, 5*time.Second, registry.StateRecovered, registry.StateActive)
	if len(c.Conflicts) != 0 || c.Err != nil {
		t.Fatalf("after the other process left: %+v", c)
	}
	got, err = b.Get(ctx, stolen.Ref())
	if err != nil || got.Address != "10.0.0.2:80" {
		t.Fatalf("reclaimed instance: %+v, %v", got, err)
	}
	if err := taken.Err(); err != nil {
		t.Fatalf("reclaimed registration Err() = %v", err)
	}
	if got := testutil.ToFloat64(collector(t, metrics, "beacon_registry_registration_conflicts")); got != 0 {
		t.Fatalf("conflicts metric %v after reclaiming", got)
	}
}

// TestSessionRewritesVanishedKey: someone deletes a registered key (an
// operator with etcdctl); the session notices at its next check and
// registers it again.
func TestSessionRewritesVanishedKey(t *testing.T) {
	for _, b := range backends(t) {
		t.Run(b.name, func(t *testing.T) {
			t.Parallel()
			st := b.store(t)
			r := newRegistry(t, st, registry.Config{LeaseTTL: b.ttl, VerifyInterval: 200 * time.Millisecond})
			ns := uniqueNS()
			ctx := within(t, 30*time.Second)
			reg, err := r.Register(ctx, inst(ns, "10.0.0.1:80"))
			if err != nil {
				t.Fatal(err)
			}
			q := beacon.Query{Namespace: ns}
			w, err := r.Watch(ctx, q)
			if err != nil {
				t.Fatal(err)
			}
			defer w.Close()
			v := registrytest.NewView()
			converge(t, r, w, v, q, 10*time.Second)
			if _, err := b.store(t).Delete(ctx, r.Keyspace().Key(reg.Instance().Ref())); err != nil {
				t.Fatal(err)
			}
			for v.Len() != 0 { // the watcher sees it go...
				nb, err := w.Next(ctx)
				if err != nil {
					t.Fatal(err)
				}
				if err := v.Apply(nb); err != nil {
					t.Fatal(err)
				}
			}
			for v.Len() != 1 { // ...and come back
				nb, err := w.Next(ctx)
				if err != nil {
					t.Fatal(err)
				}
				if err := v.Apply(nb); err != nil {
					t.Fatal(err)
				}
			}
			if got, _ := v.Get(reg.Instance().Ref().String()); !registrytest.Same(got, reg.Instance()) {
				t.Fatalf("re-registered %+v, want %+v", got, reg.Instance())
			}
		})
	}
}

// TestRegisterWaitsForRecovery: Register while the lease is lost waits
// (bounded by its context) for the session to recover, then succeeds.
func TestRegisterWaitsForRecovery(t *testing.T) {
	st := newMemoryStore(t)
	r := newRegistry(t, st, registry.Config{LeaseTTL: time.Second})
	ns := uniqueNS()
	ctx := within(t, 30*time.Second)
	if _, err := r.Register(ctx, inst(ns, "10.0.0.1:80")); err != nil {
		t.Fatal(err)
	}
	waitState(t, r, 5*time.Second, registry.StateActive)
	if err := st.Revoke(ctx, r.Lease()); err != nil {
		t.Fatal(err)
	}
	// The next Register finds the lease gone, or waits for the recovery.
	reg, err := r.Register(ctx, inst(ns, "10.0.0.2:80"))
	if err != nil {
		t.Fatal(err)
	}
	waitState(t, r, 5*time.Second, registry.StateRecovered)
	list, _, err := r.List(ctx, beacon.Query{Namespace: ns})
	if err != nil || len(list) != 2 {
		t.Fatalf("after recovery List = %d instances, %v", len(list), err)
	}
	if err := reg.Err(); err != nil {
		t.Fatal(err)
	}
}

// TestCloseRevokesAndReports: Close revokes the lease within the TTL,
// reports StateClosed last and closes States; later calls fail with
// ErrClosed.
func TestCloseRevokesAndReports(t *testing.T) {
	for _, b := range backends(t) {
		t.Run(b.name, func(t *testing.T) {
			t.Parallel()
			st := b.store(t)
			r, err := registry.New(st, registry.Config{LeaseTTL: b.ttl})
			if err != nil {
				t.Fatal(err)
			}
			ctx := within(t, 30*time.Second)
			reg, err := r.Register(ctx, inst(uniqueNS(), "10.0.0.1:80"))
			if err != nil {
				t.Fatal(err)
			}
			lease := r.Lease()
			start := time.Now()
			if err := r.Close(); err != nil {
				t.Fatal(err)
			}
			if d := time.Since(start); d > b.ttl {
				t.Fatalf("Close took %v, more than the TTL", d)
			}
			if _, err := st.KeepAlive(ctx, lease); !errors.Is(err, store.ErrLeaseNotFound) {
				t.Fatalf("lease after Close: %v, want revoked", err)
			}
			var last registry.StateChange
			for c := range r.States() {
				last = c
			}
			if last.State != registry.StateClosed {
				t.Fatalf("last state %v", last.State)
			}
			if err := r.Close(); err != nil {
				t.Fatalf("second Close: %v", err)
			}
			if err := reg.Close(); err != nil {
				t.Fatalf("Registration.Close after registry Close: %v", err)
			}
			if _, _, err := r.List(ctx, beacon.Query{}); !errors.Is(err, registry.ErrClosed) {
				t.Fatalf("List after Close: %v", err)
			}
			if _, err := r.Watch(ctx, beacon.Query{}); !errors.Is(err, registry.ErrClosed) {
				t.Fatalf("Watch after Close: %v", err)
			}
		})
	}
}

// TestSessionMetrics checks the state and count metrics through a loss and
// a recovery.
func TestSessionMetrics(t *testing.T) {
	st := newMemoryStore(t)
	reg := prometheus.NewPedanticRegistry()
	r := newRegistry(t, st, registry.Config{LeaseTTL: time.Second, Metrics: reg})
	ctx := within(t, 30*time.Second)
	for i := range 2 {
		if _, err := r.Register(ctx, inst(uniqueNS(), fmt.Sprintf("10.0.0.%d:80", i+1))); err != nil {
			t.Fatal(err)
		}
	}
	waitState(t, r, 5*time.Second, registry.StateActive)
	if err := st.Revoke(ctx, r.Lease()); err != nil {
		t.Fatal(err)
	}
	waitState(t, r, 5*time.Second, registry.StateRecovered)
	w, err := r.Watch(ctx, beacon.Query{})
	if err != nil {
		t.Fatal(err)
	}
	defer w.Close()
	want := `
# HELP beacon_registry_lease_losses_total Session leases lost: the store said the lease ended (expired or revoked).
# TYPE beacon_registry_lease_losses_total counter
beacon_registry_lease_losses_total 1
# HELP beacon_registry_lease_recoveries_total Recoveries after a lease loss: a lease held again and the instances re-registered.
# TYPE beacon_registry_lease_recoveries_total counter
beacon_registry_lease_recoveries_total 1
# HELP beacon_registry_registrations Instances registered through registry sessions (including conflicted ones); a server's HTTP registrations are in beacon_registry_leased_registrations.
# TYPE beacon_registry_registrations gauge
beacon_registry_registrations 2
# HELP beacon_registry_session_state Number of registry sessions in each state (idle, active, lost, recovered, closed); every state is a series, 0 when no session is in it.
# TYPE beacon_registry_session_state gauge
beacon_registry_session_state{state="active"} 0
beacon_registry_session_state{state="closed"} 0
beacon_registry_session_state{state="idle"} 0
beacon_registry_session_state{state="lost"} 0
beacon_registry_session_state{state="recovered"} 1
# HELP beacon_registry_watch_streams Shared store watches (one per watched prefix, shared by every watcher of it).
# TYPE beacon_registry_watch_streams gauge
beacon_registry_watch_streams 1
# HELP beacon_registry_watchers Open registry watchers.
# TYPE beacon_registry_watchers gauge
beacon_registry_watchers 1
`
	if err := testutil.GatherAndCompare(reg, strings.NewReader(want),
		"beacon_registry_lease_losses_total", "beacon_registry_lease_recoveries_total",
		"beacon_registry_registrations", "beacon_registry_session_state",
		"beacon_registry_watch_streams", "beacon_registry_watchers"); err != nil {
		t.Fatal(err)
	}
	// A second registry on the same Registerer shares the collectors.
	r2 := newRegistry(t, st, registry.Config{Metrics: reg})
	if _, err := r2.Register(ctx, inst(uniqueNS(), "10.0.0.9:80")); err != nil {
		t.Fatal(err)
	}
	if got := testutil.ToFloat64(collector(t, reg, "beacon_registry_registrations")); got != 3 {
		t.Fatalf("registrations %v with two registries", got)
	}
}

// collector returns a gauge or counter registered in reg by name.
func collector(t *testing.T, reg *prometheus.Registry, name string) prometheus.Collector {
	t.Helper()
	mfs, err := reg.Gather()
	if err != nil {
		t.Fatal(err)
	}
	for _, mf := range mfs {
		if mf.GetName() == name {
			m := mf.GetMetric()[0]
			v := m.GetGauge().GetValue() + m.GetCounter().GetValue()
			return prometheus.NewGaugeFunc(prometheus.GaugeOpts{Name: name, Help: name}, func() float64 { return v })
		}
	}
	t.Fatalf("metric %s not registered", name)
	return nil
}
