package kube_test

import (
	"errors"
	"strings"
	"testing"
	"time"

	"github.com/beaconplane/beacon"
	"github.com/beaconplane/beacon/internal/lab/netcut"
	"github.com/beaconplane/beacon/internal/testkit/kubetest"
	"github.com/beaconplane/beacon/registry"
	"github.com/beaconplane/beacon/registry/kube"
	"github.com/beaconplane/beacon/registry/registrytest"
)

// The API server crashes (SIGKILL) and restarts under a watch, with etcd compacted meanwhile so
// that the watch cannot resume (410 Gone) and the reflectors re-list: the
// watcher is told it is stale, then converges to the changes made after
// the restart, and an instance that never went is never removed (no
// phantom removal). Not parallel: it restarts the shared API server.
func TestAPIServerRestart(t *testing.T) {
	cp := kubetest.Shared(t)
	ns := cp.Namespace(t)
	pa, pb := cp.ReadyPod(t, ns, "a"), cp.ReadyPod(t, ns, "b")
	ra, rb := cp.Registry(t, ns, pa, nil), cp.Registry(t, ns, pb, nil)
	f := follow(t, cp.Registry(t, ns, nil, nil), beacon.Query{Namespace: "demo"})
	a := register(t, ra, inst("10.7.0.1:80")).Instance()
	b := register(t, rb, inst("10.7.0.2:80")).Instance()
	f.until("both instances", func(v *registrytest.View) bool { return v.Len() == 2 })

	start := time.Now()
	cp.KillAPIServer(t)
	var stale bool
	f.until("a stale batch", func(*registrytest.View) bool {
		stale = stale || f.batches[len(f.batches)-1].Kind == registry.Stale
		return stale
	})
	t.Logf("stale after %v", time.Since(start).Round(time.Millisecond))
	cp.CompactEtcd(t)
	cp.StartAPIServer(t)
	t.Logf("API server back after %v", time.Since(start).Round(time.Millisecond))

	c := register(t, ra, inst("10.7.0.3:80")).Instance()
	cp.SetReady(t, pb, false)
	f.until("c added and b removed", func(v *registrytest.View) bool {
		return v.Len() == 2 && has(v, a) && has(v, c)
	})
	if f.removed(a.Ref()) {
		t.Fatal("a was removed at some point: a phantom removal")
	}
	resynced := false
	for _, bt := range f.batches {
		resynced = resynced || bt.Kind == registry.Resync
	}
	if !resynced {
		t.Fatalf("no resync batch after the stale one: %v", kinds(f.batches))
	}
	_ = b
	t.Logf("converged after %v; batches: %v", time.Since(start).Round(time.Millisecond), kinds(f.batches))
}

func kinds(bs []registry.Batch) []string {
	var out []string
	for _, b := range bs {
		out = append(out, b.Kind.String())
	}
	return out
}

// The API server hangs (SIGSTOP: connections open, no answers): the watch
// is reported stale within the probe's bound (probe interval + Timeout),
// and once the server answers again it resyncs, without a removal.
func TestAPIServerHangIsStale(t *testing.T) {
	cp := kubetest.Shared(t)
	ns := cp.Namespace(t)
	in := register(t, cp.Registry(t, ns, cp.ReadyPod(t, ns, "w"), nil), inst("10.14.0.1:80")).Instance()
	const timeout = 3 * time.Second
	f := follow(t, cp.Registry(t, ns, nil, func(c *kube.Config) { c.Timeout = timeout }), beacon.Query{Namespace: "demo"})
	f.until("the instance", func(v *registrytest.View) bool { return has(v, in) })

	resume := cp.PauseAPIServer(t)
	start := time.Now()
	stale := false
	f.until("a stale batch", func(*registrytest.View) bool {
		stale = stale || f.batches[len(f.batches)-1].Kind == registry.Stale
		return stale
	})
	took := time.Since(start)
	t.Logf("stale after %v: %v", took.Round(time.Millisecond), f.batches[len(f.batches)-1].Err)
	if bound := 5*time.Second + timeout + 10*time.Second; took > bound { // probe interval + timeout + scheduling slack (15.8 s seen with both cores busy)
		t.Errorf("stale after %v, more than %v", took, bound)
	}
	resume()
	f.until("a resync", func(*registrytest.View) bool { return f.batches[len(f.batches)-1].Kind == registry.Resync })
	if !has(f.v, in) || f.removed(in.Ref()) {
		t.Fatalf("after the hang: view %v, removed %v", f.v, f.removed(in.Ref()))
	}
}

// A pod replaced under the same name (a StatefulSet's), its new process
// registering the same caller-chosen ID, while a reader is cut off from
// the API server, which then restarts with etcd compacted: the reader's
// watches cannot resume (410 Gone) and its InstanceSets and EndpointSlices
// are re-listed, as one step. Watchers get one Resync in which the
// instance is Updated (its registration time), never Removed then Added,
// which re-listing the InstanceSets (the new pod's UID) before the
// EndpointSlices (that UID Ready), or the other way round, gave. Not
// parallel: it restarts the shared API server.
func TestRelistIsOneStep(t *testing.T) {
	cp := kubetest.Shared(t)
	ns := cp.Namespace(t)
	proxy, err := netcut.Start(strings.TrimPrefix(cp.Host(), "https://"))
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { _ = proxy.Close() })
	rc := cp.Admin()
	rc.Host = "https://" + proxy.Addr()
	f := follow(t, cp.Registry(t, ns, nil, func(c *kube.Config) { c.REST = rc }), beacon.Query{Namespace: "demo"})

	in := inst("10.7.1.1:80")
	in.ID = "00000000000000d1"
	pod := cp.ReadyPod(t, ns, "stateful-0")
	first := register(t, cp.Registry(t, ns, pod, nil), in).Instance()
	f.until("the instance", func(v *registrytest.View) bool { return has(v, first) })

	proxy.Cut()
	f.until("a stale batch", func(*registrytest.View) bool { return f.batches[len(f.batches)-1].Kind == registry.Stale })
	since := len(f.batches)
	cp.DeletePod(t, pod)
	cp.WaitGone(t, ns, pod.Name) // garbage-collected
	pod = cp.ReadyPod(t, ns, "stateful-0")
	in.RegisteredAt = first.RegisteredAt.Add(time.Second)
	second := register(t, cp.Registry(t, ns, pod, nil), in).Instance()
	cp.KillAPIServer(t)
	cp.CompactEtcd(t)
	cp.StartAPIServer(t)
	proxy.Restore()

	f.until("the new registration", func(v *registrytest.View) bool {
		got, ok := v.Get(second.Ref().String())
		return ok && registrytest.Same(got, second)
	})
	for _, b := range f.batches[since:] {
		for _, e := range b.Events {
			if e.Type == beacon.Removed {
				t.Fatalf("%s was removed when the reader re-listed (batches %v): a phantom removal", e.Instance.Ref(), kinds(f.batches[since:]))
			}
		}
	}
	t.Logf("batches after the cut: %v", kinds(f.batches[since-1:]))
}

// A deregistration that cannot reach the API server says what becomes of
// the instance: it said only "retried in the background", which a process
// that exits right after (beacon register on SIGTERM) never does. Not
// parallel: it stops the shared API server.
func TestDeregisterUnreachableSaysWhatHappens(t *testing.T) {
	cp := kubetest.Shared(t)
	ns := cp.Namespace(t)
	r := cp.Registry(t, ns, cp.ReadyPod(t, ns, "w"), func(c *kube.Config) { c.Timeout = time.Second })
	reg := register(t, r, inst("10.7.1.1:80"))
	cp.KillAPIServer(t)
	err := reg.Close()
	cp.StartAPIServer(t)
	if !errors.Is(err, kube.ErrUnreachable) || !strings.Contains(err.Error(), "until the registry is closed") ||
		!strings.Contains(err.Error(), "garbage collector deletes it with the pod") {
		t.Fatalf("Close with the API server down: %v", err)
	}
}

// After API server restarts, the EndpointSlice controller follows pods at
// once: the harness restarts kube-controller-manager with the API server,
// whose informers otherwise backed off for up to a minute after a few
// restarts, so that the first test after these (TestReadinessGatesVisibility)
// waited in vain for the pod it made Ready. Not parallel: it restarts the
// shared API server.
func TestControllersFollowAPIServerRestarts(t *testing.T) {
	cp := kubetest.Shared(t)
	for range 2 {
		cp.KillAPIServer(t)
		cp.StartAPIServer(t)
	}
	ns := cp.Namespace(t)
	pod := cp.Pod(t, ns, "after-restarts")
	r := cp.Registry(t, ns, pod, nil)
	f := follow(t, cp.Registry(t, ns, nil, nil), beacon.Query{Namespace: "demo"})
	in := register(t, r, inst("10.7.2.1:80")).Instance()
	cp.SetReady(t, pod, true)
	f.until("the instance once its pod is Ready", func(v *registrytest.View) bool { return has(v, in) })
}
