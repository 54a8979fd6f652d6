package registry_test

import (
	"errors"
	"slices"
	"testing"
	"time"

	"github.com/beaconplane/beacon"
	"github.com/beaconplane/beacon/registry"
	"github.com/beaconplane/beacon/registry/registrytest"
	"github.com/beaconplane/beacon/store"
	"github.com/prometheus/client_golang/prometheus"
	"github.com/prometheus/client_golang/prometheus/testutil"
)

// waitDrained reads r's state changes until one reports ref drained
// elsewhere.
func waitDrained(t *testing.T, r *registry.StoreRegistry, ref beacon.Ref, within time.Duration) registry.StateChange {
	t.Helper()
	deadline := time.After(within)
	for {
		select {
		case c, ok := <-r.States():
			if !ok {
				t.Fatal("States closed while waiting for the adopted drain")
			}
			if slices.Contains(c.Drained, ref) {
				return c
			}
		case <-deadline:
			t.Fatalf("the session did not report %s drained elsewhere within %v", ref, within)
		}
	}
}

// follow applies w's batches to v until cond holds, failing if any event
// of ref shows it serving.
func follow(t *testing.T, w registry.Watcher, v *registrytest.View, ref beacon.Ref, what string, cond func() bool) {
	t.Helper()
	ctx := within(t, 20*time.Second)
	for !cond() {
		b, err := w.Next(ctx)
		if err != nil {
			t.Fatalf("waiting for %s: %v", what, err)
		}
		for _, ev := range b.Events {
			if ev.Instance.Ref() == ref && ev.Type != beacon.Removed && ev.Instance.Status != beacon.StatusDraining {
				t.Fatalf("waiting for %s: watchers saw the drained instance %s again (%v)", what, ev.Instance.Status, ev.Type)
			}
		}
		if err := v.Apply(b); err != nil {
			t.Fatal(err)
		}
	}
}

// TestOperatorDrainIsAdopted: an operator (another process, through
// registry.Operator) drains a Go session's instance in the store. The
// session's verification adopts the drain instead of rewriting it
// (Instance shows draining, a state change and a metric say so); an
// operator's deregistration is written again, still draining; the owner's
// own Update keeps the drain, unless it sets Status.
func TestOperatorDrainIsAdopted(t *testing.T) {
	for _, b := range backends(t) {
		t.Run(b.name, func(t *testing.T) {
			t.Parallel()
			metrics := prometheus.NewPedanticRegistry()
			r := newRegistry(t, b.store(t), registry.Config{LeaseTTL: b.ttl, VerifyInterval: 200 * time.Millisecond, Metrics: metrics})
			op := newRegistry(t, b.store(t), registry.Config{LeaseTTL: b.ttl})
			ns := uniqueNS()
			ctx := within(t, 60*time.Second)
			reg, err := r.Register(ctx, beacon.Instance{Namespace: ns, Component: "api", Endpoint: "http", Address: "10.0.0.1:80",
				Metadata: map[string]string{"zone": "a"}})
			if err != nil {
				t.Fatal(err)
			}
			waitState(t, r, 5*time.Second, registry.StateActive)
			ref := reg.Instance().Ref()
			q := beacon.Query{Namespace: ns}
			w, err := op.Watch(ctx, q)
			if err != nil {
				t.Fatal(err)
			}
			defer w.Close()
			v := registrytest.NewView()
			converge(t, op, w, v, q, 10*time.Second)

			drained, err := op.DrainInstance(ctx, ref)
			if err != nil {
				t.Fatal(err)
			}
			want := reg.Instance()
			want.Status = beacon.StatusDraining
			if !registrytest.Same(drained, want) {
				t.Fatalf("DrainInstance = %+v, want %+v", drained, want)
			}
			kv, err := b.store(t).Get(ctx, r.Keyspace().Key(ref))
			if err != nil || kv.Lease != r.Lease() {
				t.Fatalf("after the drain the key is bound to lease %x (%v), want the session's %x", kv.Lease, err, r.Lease())
			}
			if again, err := op.DrainInstance(ctx, ref); err != nil || !registrytest.Same(again, want) {
				t.Fatalf("draining again: %+v, %v", again, err)
			}

			c := waitDrained(t, r, ref, 10*time.Second)
			if !errors.Is(c.Err, registry.ErrDrainedElsewhere) || c.State != registry.StateActive || c.Registered != 1 {
				t.Fatalf("state change %+v", c)
			}
			if got := reg.Instance(); got.Status != beacon.StatusDraining || reg.Err() != nil {
				t.Fatalf("the registration shows %s (err %v) after the operator's drain", got.Status, reg.Err())
			}
			follow(t, w, v, ref, "the drain", func() bool {
				got, ok := v.Get(ref.String())
				return ok && got.Status == beacon.StatusDraining
			})

			// The operator deregisters it: the live session writes it
			// again at its next verification, still draining, and no
			// watcher sees it serving.
			if err := op.DeregisterInstance(ctx, ref); err != nil {
				t.Fatal(err)
			}
			follow(t, w, v, ref, "the removal", func() bool { _, ok := v.Get(ref.String()); return !ok })
			follow(t, w, v, ref, "the re-registration", func() bool { _, ok := v.Get(ref.String()); return ok })
			if got, _ := v.Get(ref.String()); !registrytest.Same(got, want) {
				t.Fatalf("re-registered as %+v, want %+v", got, want)
			}

			// The owner's Update keeps the drain...
			if err := reg.Update(ctx, func(in *beacon.Instance) { in.Metadata = map[string]string{"zone": "b"} }); err != nil {
				t.Fatal(err)
			}
			got, err := op.Get(ctx, ref)
			if err != nil || got.Status != beacon.StatusDraining || got.Metadata["zone"] != "b" {
				t.Fatalf("after the owner's Update: %+v, %v", got, err)
			}
			// ...unless it sets Status.
			if err := reg.Update(ctx, func(in *beacon.Instance) { in.Status = beacon.StatusServing }); err != nil {
				t.Fatal(err)
			}
			if got, err := op.Get(ctx, ref); err != nil || got.Status != beacon.StatusServing || reg.Instance().Status != beacon.StatusServing {
				t.Fatalf("after the owner set serving: %+v, %v", got, err)
			}
			if n := testutil.ToFloat64(collector(t, metrics, "beacon_registry_drained_elsewhere_total")); n != 1 {
				t.Fatalf("beacon_registry_drained_elsewhere_total = %v, want 1", n)
			}

			if err := op.DeregisterInstance(ctx, beacon.Ref{Namespace: ns, Component: "api", Endpoint: "http", ID: "00000000000000ff"}); !errors.Is(err, beacon.ErrNotFound) {
				t.Fatalf("deregistering an unknown instance: %v", err)
			}
			if _, err := op.DrainInstance(ctx, beacon.Ref{Namespace: ns, Component: "api", Endpoint: "http", ID: "00000000000000ff"}); !errors.Is(err, beacon.ErrNotFound) {
				t.Fatalf("draining an unknown instance: %v", err)
			}
		})
	}
}

// TestOwnerUpdateFindsOperatorDrain: an owner's Update that runs into an
// operator's drain before any verification noticed it keeps the drain,
// calling mutate again with the drained instance.
func TestOwnerUpdateFindsOperatorDrain(t *testing.T) {
	for _, b := range backends(t) {
		t.Run(b.name, func(t *testing.T) {
			t.Parallel()
			r := newRegistry(t, b.store(t), registry.Config{LeaseTTL: b.ttl, VerifyInterval: -1})
			op := newRegistry(t, b.store(t), registry.Config{LeaseTTL: b.ttl})
			ctx := within(t, 30*time.Second)
			reg, err := r.Register(ctx, inst(uniqueNS(), "10.0.0.1:80"))
			if err != nil {
				t.Fatal(err)
			}
			ref := reg.Instance().Ref()
			if _, err := op.DrainInstance(ctx, ref); err != nil {
				t.Fatal(err)
			}
			var seen []beacon.Status
			if err := reg.Update(ctx, func(in *beacon.Instance) {
				seen = append(seen, in.Status)
				in.Address = "10.0.0.2:80"
			}); err != nil {
				t.Fatal(err)
			}
			if !slices.Equal(seen, []beacon.Status{beacon.StatusServing, beacon.StatusDraining}) {
				t.Fatalf("mutate saw %v, want serving then draining", seen)
			}
			got, err := op.Get(ctx, ref)
			if err != nil || got.Status != beacon.StatusDraining || got.Address != "10.0.0.2:80" || !registrytest.Same(got, reg.Instance()) {
				t.Fatalf("after the owner's Update: %+v (%v), the registration shows %+v", got, err, reg.Instance())
			}
			waitDrained(t, r, ref, 5*time.Second)
			kv, err := b.store(t).Get(ctx, r.Keyspace().Key(ref))
			if err != nil || kv.Lease != r.Lease() {
				t.Fatalf("key bound to %x (%v), want the session's lease %x", kv.Lease, err, r.Lease())
			}
			// The owner's own Drain after an operator's: draining, then gone.
			if err := reg.Drain(ctx, registry.DrainGrace(0)); err != nil {
				t.Fatal(err)
			}
			if _, err := op.Get(ctx, ref); !errors.Is(err, beacon.ErrNotFound) {
				t.Fatalf("after the owner's Drain: %v", err)
			}
		})
	}
}

// TestOperatorDeregisterOfLeasedRegistration: an operator's deregistration
// of an HTTP-style registration (a lease of its own and a secret) removes
// the instance for good; its owner's next heartbeat finds nothing. An
// operator's drain keeps its lease, so the owner's heartbeats go on, and
// the owner may set it serving again.
func TestOperatorDeregisterOfLeasedRegistration(t *testing.T) {
	for _, b := range backends(t) {
		t.Run(b.name, func(t *testing.T) {
			t.Parallel()
			srv := newRegistry(t, b.store(t), registry.Config{LeaseTTL: b.ttl})
			op := newRegistry(t, b.store(t), registry.Config{LeaseTTL: b.ttl})
			ctx := within(t, 30*time.Second)
			o, err := srv.RegisterWithTTL(ctx, inst(uniqueNS(), "10.0.0.1:80"), time.Minute)
			if err != nil {
				t.Fatal(err)
			}
			ref := o.Instance.Ref()
			if _, err := op.DrainInstance(ctx, ref); err != nil {
				t.Fatal(err)
			}
			if _, err := srv.Heartbeat(ctx, ref, o.Secret); err != nil {
				t.Fatalf("the owner's heartbeat after an operator's drain: %v", err)
			}
			kv, err := b.store(t).Get(ctx, srv.Keyspace().Key(ref))
			if err != nil || kv.Lease != o.Lease.ID {
				t.Fatalf("after the drain the key is bound to %x (%v), want the registration's lease %x", kv.Lease, err, o.Lease.ID)
			}
			in, err := srv.UpdateLeased(ctx, ref, o.Secret, func(in *beacon.Instance) { in.Metadata = map[string]string{"k": "v"} })
			if err != nil || in.Status != beacon.StatusDraining {
				t.Fatalf("the owner's update without status: %+v, %v", in, err)
			}
			in, err = srv.UpdateLeased(ctx, ref, o.Secret, func(in *beacon.Instance) { in.Status = beacon.StatusServing })
			if err != nil || in.Status != beacon.StatusServing {
				t.Fatalf("the owner sets serving again: %+v, %v", in, err)
			}
			if err := op.DeregisterInstance(ctx, ref); err != nil {
				t.Fatal(err)
			}
			if _, err := op.Get(ctx, ref); !errors.Is(err, beacon.ErrNotFound) {
				t.Fatalf("after the operator's deregistration: %v", err)
			}
			if _, err := srv.Heartbeat(ctx, ref, o.Secret); !errors.Is(err, beacon.ErrNotFound) {
				t.Fatalf("the owner's heartbeat after the operator's deregistration: %v, want not found", err)
			}
			if _, err := b.store(t).Get(ctx, srv.Keyspace().Key(ref)); !errors.Is(err, store.ErrNotFound) {
				t.Fatalf("the key came back: %v", err)
			}
		})
	}
}
