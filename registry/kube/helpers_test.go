package kube_test

import (
	"context"
	"testing"

	"github.com/beaconplane/beacon"
	"github.com/beaconplane/beacon/internal/testkit/kubetest"
	"github.com/beaconplane/beacon/registry"
	"github.com/beaconplane/beacon/registry/registrytest"
)

// follower applies a watcher's batches to a view, keeping every batch.
type follower struct {
	t       *testing.T
	w       registry.Watcher
	v       *registrytest.View
	batches []registry.Batch
}

func follow(t *testing.T, r registry.Discoverer, q beacon.Query) *follower {
	t.Helper()
	ctx, cancel := context.WithCancel(context.Background())
	t.Cleanup(cancel)
	w, err := r.Watch(ctx, q)
	if err != nil {
		t.Fatalf("Watch(%q): %v", q, err)
	}
	t.Cleanup(func() { _ = w.Close() })
	f := &follower{t: t, w: w, v: registrytest.NewView()}
	f.until("the snapshot", func(v *registrytest.View) bool { return v.Batches > 0 })
	return f
}

// next applies the next batch.
func (f *follower) next(what string) registry.Batch {
	f.t.Helper()
	b, err := f.w.Next(kubetest.Ctx(f.t))
	if err != nil {
		f.t.Fatalf("waiting for %s: %v (view %v)", what, err, f.v)
	}
	if err := f.v.Apply(b); err != nil {
		f.t.Fatalf("batch %v: %v", b.Kind, err)
	}
	f.batches = append(f.batches, b)
	return b
}

// until applies batches until cond holds (within kubetest.WaitTimeout).
func (f *follower) until(what string, cond func(*registrytest.View) bool) {
	f.t.Helper()
	for !cond(f.v) {
		f.next(what)
	}
}

// has reports whether the view holds ref with this address.
func has(v *registrytest.View, in beacon.Instance) bool {
	got, ok := v.Get(in.Ref().String())
	return ok && got.Address == in.Address && got.Status == in.Status
}

// removed reports whether any batch removed ref.
func (f *follower) removed(ref beacon.Ref) bool {
	for _, b := range f.batches {
		for _, e := range b.Events {
			if e.Type == beacon.Removed && e.Instance.Ref() == ref {
				return true
			}
		}
	}
	return false
}

func register(t *testing.T, r registry.Registrar, in beacon.Instance) registry.Registration {
	t.Helper()
	reg, err := r.Register(kubetest.Ctx(t), in)
	if err != nil {
		t.Fatalf("Register(%s): %v", in.Ref(), err)
	}
	return reg
}

func inst(addr string) beacon.Instance {
	return beacon.Instance{Namespace: "demo", Component: "api", Endpoint: "http", Address: addr, Transport: "http"}
}
