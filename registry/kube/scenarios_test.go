package kube_test

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"log/slog"
	"strconv"
	"strings"
	"sync/atomic"
	"testing"

	"github.com/beaconplane/beacon"
	"github.com/beaconplane/beacon/internal/testkit/kubetest"
	"github.com/beaconplane/beacon/registry"
	"github.com/beaconplane/beacon/registry/kube"
	"github.com/beaconplane/beacon/registry/registrytest"
	"github.com/prometheus/client_golang/prometheus"
	corev1 "k8s.io/api/core/v1"
	discoveryv1 "k8s.io/api/discovery/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/apis/meta/v1/unstructured"
	"k8s.io/apimachinery/pkg/types"
)

// An instance is visible only while its pod is Ready in a discovery
// EndpointSlice: registered before the pod is Ready, it appears when the
// EndpointSlice controller lists the pod as ready, goes when the pod turns
// NotReady, and comes back when it is Ready again. Visibility says why it
// is not visible meanwhile.
func TestReadinessGatesVisibility(t *testing.T) {
	cp := kubetest.Shared(t)
	ns := cp.Namespace(t)
	pod := cp.Pod(t, ns, "worker")
	r := cp.Registry(t, ns, pod, nil)
	f := follow(t, cp.Registry(t, ns, nil, nil), beacon.Query{Namespace: "demo"})
	ctx := kubetest.Ctx(t)

	reg := register(t, r, inst("10.1.0.1:80"))
	in := reg.Instance()
	if got, _, err := r.List(ctx, beacon.Query{Namespace: "demo"}); err != nil || len(got) != 0 {
		t.Fatalf("List before the pod is Ready = %v, %v; want nothing", got, err)
	}
	vis, err := r.Visibility(ctx)
	if err != nil || vis.Visible || !strings.Contains(vis.Reason, "in no EndpointSlice") {
		t.Fatalf("Visibility before the pod has an IP = %+v, %v", vis, err)
	}

	pod = cp.SetReady(t, pod, true)
	f.until("the instance once its pod is Ready", func(v *registrytest.View) bool { return has(v, in) })
	if vis, err := r.Visibility(ctx); err != nil || !vis.Visible {
		t.Fatalf("Visibility of a Ready pod = %+v, %v", vis, err)
	}

	cp.SetReady(t, pod, false)
	f.until("its removal once the pod is NotReady", func(v *registrytest.View) bool { return v.Len() == 0 })
	vis, err = r.Visibility(ctx)
	if err != nil || vis.Visible || !strings.Contains(vis.Reason, "is not Ready") {
		t.Fatalf("Visibility of a NotReady pod = %+v, %v", vis, err)
	}
	if got, _, err := r.List(ctx, beacon.Query{Namespace: "demo"}); err != nil || len(got) != 0 {
		t.Fatalf("List of a NotReady pod = %v, %v", got, err)
	}

	cp.SetReady(t, pod, true)
	f.until("the instance back once the pod is Ready again", func(v *registrytest.View) bool { return has(v, in) })

	// An address change without a readiness dip reaches watchers as one
	// Updated event (Dynamo #12566).
	events := f.v.Events
	if err := reg.Update(ctx, func(in *beacon.Instance) { in.Address = "10.1.0.1:81" }); err != nil {
		t.Fatal(err)
	}
	in.Address = "10.1.0.1:81"
	f.until("the new address", func(v *registrytest.View) bool { return has(v, in) })
	if f.v.Events != events+1 {
		t.Fatalf("an address change took %d events", f.v.Events-events)
	}
}

// A pod deleted without a graceful shutdown: its instances leave watchers
// as soon as the EndpointSlice drops it, and the garbage collector deletes
// its InstanceSet (owned by the pod); the registry does not write it again.
func TestPodDeletedIsGarbageCollected(t *testing.T) {
	cp := kubetest.Shared(t)
	ns := cp.Namespace(t)
	pod := cp.ReadyPod(t, ns, "doomed")
	keep := cp.ReadyPod(t, ns, "keeper")
	r := cp.Registry(t, ns, pod, nil)
	rk := cp.Registry(t, ns, keep, nil)
	f := follow(t, cp.Registry(t, ns, nil, nil), beacon.Query{Namespace: "demo"})
	gone := register(t, r, inst("10.2.0.1:80")).Instance()
	stays := register(t, rk, inst("10.2.0.2:80")).Instance()
	f.until("both instances", func(v *registrytest.View) bool { return v.Len() == 2 })

	states := r.States()
	cp.DeletePod(t, pod)
	f.until("the removal of the deleted pod's instance", func(v *registrytest.View) bool {
		return v.Len() == 1 && has(v, stays)
	})
	if !f.removed(gone.Ref()) {
		t.Fatal("no Removed event")
	}
	cp.WaitGone(t, ns, pod.Name)
	// The registry notices its pod is gone and stops (state lost, for good).
	for c := range states {
		if c.State == registry.StateLost {
			if c.Err == nil || !strings.Contains(c.Err.Error(), "is gone") {
				t.Fatalf("lost state with %v", c.Err)
			}
			break
		}
	}
	if _, err := r.Register(kubetest.Ctx(t), inst("10.2.0.3:80")); err == nil || !strings.Contains(err.Error(), "is gone") {
		t.Fatalf("Register after the pod is gone: %v", err)
	}
}

// The pod's readiness is what counts, not the process: Drain marks the
// instance draining in the InstanceSet, watchers see the status, then the
// removal.
func TestDrain(t *testing.T) {
	cp := kubetest.Shared(t)
	ns := cp.Namespace(t)
	r := cp.Registry(t, ns, cp.ReadyPod(t, ns, "w"), nil)
	f := follow(t, cp.Registry(t, ns, nil, nil), beacon.Query{Namespace: "demo"})
	reg := register(t, r, inst("10.3.0.1:80"))
	in := reg.Instance()
	f.until("the instance", func(v *registrytest.View) bool { return has(v, in) })
	ctx, cancel := context.WithCancel(kubetest.Ctx(t))
	done := make(chan error, 1)
	go func() { done <- reg.Drain(ctx, registry.DrainGrace(kubetest.WaitTimeout)) }()
	in.Status = beacon.StatusDraining
	f.until("status draining", func(v *registrytest.View) bool { return has(v, in) })
	cancel()
	f.until("the removal", func(v *registrytest.View) bool { return v.Len() == 0 })
	if err := <-done; err != nil {
		t.Fatalf("Drain: %v", err)
	}
}

// The InstanceSet is deleted by hand (kubectl delete): the registry writes
// it again, so that nothing acknowledged is lost; its state goes lost, then
// recovered.
func TestDeletedByHandIsWrittenAgain(t *testing.T) {
	cp := kubetest.Shared(t)
	ns := cp.Namespace(t)
	pod := cp.ReadyPod(t, ns, "w")
	r := cp.Registry(t, ns, pod, nil)
	f := follow(t, cp.Registry(t, ns, nil, nil), beacon.Query{Namespace: "demo"})
	in := register(t, r, inst("10.4.0.1:80")).Instance()
	f.until("the instance", func(v *registrytest.View) bool { return has(v, in) })
	states := r.States()
	if err := cp.Dynamic.Resource(kube.GVR).Namespace(ns).Delete(kubetest.Ctx(t), r.ObjectName(), metav1.DeleteOptions{}); err != nil {
		t.Fatal(err)
	}
	var seen []registry.State
	for c := range states {
		seen = append(seen, c.State)
		if c.State == registry.StateRecovered {
			break
		}
	}
	if !strings.Contains(stateNames(seen), "lost") {
		t.Fatalf("states %v, want lost then recovered", seen)
	}
	f.until("the instance (again, if it went)", func(v *registrytest.View) bool { return has(v, in) })
	got, _, err := r.List(kubetest.Ctx(t), beacon.Query{Namespace: "demo"})
	if err != nil || len(got) != 1 || !registrytest.Same(got[0], in) {
		t.Fatalf("List after the re-write = %v, %v", got, err)
	}
}

func stateNames(ss []registry.State) string {
	var b strings.Builder
	for _, s := range ss {
		b.WriteString(s.String() + " ")
	}
	return b.String()
}

// Two processes in one pod without CONTAINER_NAME write one InstanceSet:
// the first one is told (state lost, Err matching ErrTakenOver) instead of
// being silently overwritten. With CONTAINER_NAME each has its own.
func TestTakeOverIsReported(t *testing.T) {
	cp := kubetest.Shared(t)
	ns := cp.Namespace(t)
	pod := cp.ReadyPod(t, ns, "shared")
	first := cp.Registry(t, ns, pod, nil)
	a := register(t, first, inst("10.5.0.1:80"))
	states := first.States()
	second := cp.Registry(t, ns, pod, nil)
	register(t, second, inst("10.5.0.2:80"))
	for c := range states {
		if c.State == registry.StateLost {
			if !errors.Is(c.Err, kube.ErrTakenOver) {
				t.Fatalf("lost with %v, want ErrTakenOver", c.Err)
			}
			break
		}
	}
	if err := a.Err(); !errors.Is(err, kube.ErrTakenOver) || !strings.Contains(err.Error(), kube.EnvContainerName) {
		t.Fatalf("Err() = %v", err)
	}

	// Container mode: one InstanceSet per container, both live.
	pod2 := cp.ReadyPod(t, ns, "two-containers", "left", "right")
	f := follow(t, cp.Registry(t, ns, nil, nil), beacon.Query{Namespace: "demo", Component: "c"})
	var want []beacon.Instance
	for _, c := range []string{"left", "right"} {
		r := cp.Registry(t, ns, pod2, func(cfg *kube.Config) { cfg.Pod.Container = c })
		if r.ObjectName() != pod2.Name+"."+c {
			t.Fatalf("object name %q", r.ObjectName())
		}
		want = append(want, register(t, r, beacon.Instance{Namespace: "demo", Component: "c", Endpoint: c, Address: "10.5.1.1:80"}).Instance())
	}
	f.until("both containers' instances", func(v *registrytest.View) bool { return v.Equal(want) })
}

// Only an EndpointSlice of the pod's own namespace says whether it is
// Ready: a labelled slice someone wrote in another namespace, naming the
// pod's UID as ready, does not make a NotReady pod's instances live for a
// reader of both namespaces (List and Watch).
func TestReadinessOnlyFromThePodsNamespace(t *testing.T) {
	cp := kubetest.Shared(t)
	ns, other := cp.Namespace(t), cp.Namespace(t)
	ctx := kubetest.Ctx(t)
	pod := cp.Pod(t, ns, "not-ready")
	hidden := register(t, cp.Registry(t, ns, pod, nil), inst("10.6.0.1:80")).Instance()

	ready := true
	forged := &discoveryv1.EndpointSlice{
		ObjectMeta:  metav1.ObjectMeta{Name: "forged", Labels: map[string]string{kube.DiscoveryLabel: kube.DiscoveryLabelValue}},
		AddressType: discoveryv1.AddressTypeIPv4,
		Endpoints: []discoveryv1.Endpoint{{
			Addresses:  []string{"192.0.2.10"},
			Conditions: discoveryv1.EndpointConditions{Ready: &ready},
			TargetRef:  &corev1.ObjectReference{Kind: "Pod", Namespace: ns, Name: pod.Name, UID: pod.UID},
		}, {
			Addresses:  []string{"192.0.2.11"},
			Conditions: discoveryv1.EndpointConditions{Ready: &ready},
			TargetRef:  &corev1.ObjectReference{Kind: "Pod", Name: pod.Name, UID: pod.UID},
		}},
	}
	if _, err := cp.Slices.EndpointSlices(other).Create(ctx, forged, metav1.CreateOptions{}); err != nil {
		t.Fatal(err)
	}
	reader := cp.Registry(t, ns, nil, func(c *kube.Config) { c.Namespaces = []string{ns, other} })
	f := follow(t, reader, beacon.Query{Namespace: "demo"})
	// A live instance in the other namespace, made Ready after the forged
	// slice was written: once a watcher has it, the slice's reflector has
	// passed the forged slice.
	marker := register(t, cp.Registry(t, other, cp.ReadyPod(t, other, "marker"), nil), inst("10.6.0.2:80")).Instance()
	f.until("the other namespace's instance", func(v *registrytest.View) bool { return has(v, marker) })
	if _, ok := f.v.Get(hidden.Ref().String()); ok {
		t.Fatalf("a slice of namespace %s made a NotReady pod of %s visible to watchers: %v", other, ns, f.v)
	}
	got, _, err := reader.List(ctx, beacon.Query{Namespace: "demo"})
	if err != nil || !registrytest.SameInstances(got, []beacon.Instance{marker}) {
		t.Fatalf("List = %v, %v; want only %s", got, err, marker.Ref())
	}
	// Its own namespace's slice still decides.
	cp.SetReady(t, pod, true)
	f.until("the instance once its pod is Ready", func(v *registrytest.View) bool { return has(v, hidden) })
}

// A process's InstanceSet edited by hand to be owned by another live pod
// (ownerReference and spec.pod both naming it, so that it would follow
// that pod's readiness and outlive its own): the process writes its own
// pod back, and readers never take the edited version.
func TestOwnerEditedByHandIsRestored(t *testing.T) {
	cp := kubetest.Shared(t)
	ns := cp.Namespace(t)
	pod, other := cp.ReadyPod(t, ns, "owner"), cp.ReadyPod(t, ns, "intruder")
	r := cp.Registry(t, ns, pod, nil)
	in := register(t, r, inst("10.7.0.1:80")).Instance()
	f := follow(t, cp.Registry(t, ns, nil, nil), beacon.Query{Namespace: "demo"})
	f.until("the instance", func(v *registrytest.View) bool { return has(v, in) })

	ctx := kubetest.Ctx(t)
	patch := fmt.Sprintf(`[{"op":"replace","path":"/metadata/ownerReferences/0/uid","value":%q},`+
		`{"op":"replace","path":"/metadata/ownerReferences/0/name","value":%q},`+
		`{"op":"replace","path":"/spec/pod","value":{"name":%q,"uid":%q}}]`, other.UID, other.Name, other.Name, other.UID)
	editAndWait(t, cp, ns, r.ObjectName(), patch, func(u *unstructured.Unstructured) bool {
		uid, _, _ := unstructured.NestedString(u.Object, "spec", "pod", "uid")
		owners := u.GetOwnerReferences()
		return uid == string(pod.UID) && len(owners) == 1 && owners[0].UID == pod.UID
	})
	if f.removed(in.Ref()) {
		t.Fatalf("the edit removed the instance for watchers")
	}
	got, _, err := cp.Registry(t, ns, nil, nil).List(ctx, beacon.Query{Namespace: "demo"})
	if err != nil || !registrytest.SameInstances(got, []beacon.Instance{in}) {
		t.Fatalf("a new reader's List = %v, %v; want %s", got, err, in.Ref())
	}
}

func parseRV(rv string) int64 {
	n, _ := strconv.ParseInt(rv, 10, 64)
	return n
}

// A process's own writes are not edits by someone else: the watch of its
// InstanceSet often delivers a write before the write's answer arrives, and
// that must neither be logged as an edit nor cost a second write.
func TestOwnWritesAreNotEdits(t *testing.T) {
	cp := kubetest.Shared(t)
	ns := cp.Namespace(t)
	metrics := prometheus.NewRegistry()
	logs := &countingHandler{match: "changed by someone else"}
	r := cp.Registry(t, ns, cp.ReadyPod(t, ns, "w"), func(c *kube.Config) {
		c.Metrics, c.Logger = metrics, slog.New(logs)
	})
	ctx := kubetest.Ctx(t)
	reg := register(t, r, inst("10.8.0.1:80"))
	const updates = 40
	for i := range updates {
		if err := reg.Update(ctx, func(in *beacon.Instance) { in.Metadata = map[string]string{"n": strconv.Itoa(i)} }); err != nil {
			t.Fatal(err)
		}
	}
	if err := reg.Close(); err != nil {
		t.Fatal(err)
	}
	writes := counterValue(t, metrics, "beacon_kube_writes_total", "ok")
	if n := logs.n.Load(); n != 0 || writes != updates+2 {
		t.Fatalf("%d writes for %d changes, %d logged as edits by someone else", int(writes), updates+2, n)
	}
}

// countingHandler counts the log records whose message contains match.
type countingHandler struct {
	match string
	n     atomic.Int64
}

func (h *countingHandler) Enabled(context.Context, slog.Level) bool { return true }
func (h *countingHandler) Handle(_ context.Context, rec slog.Record) error {
	if strings.Contains(rec.Message, h.match) {
		h.n.Add(1)
	}
	return nil
}
func (h *countingHandler) WithAttrs([]slog.Attr) slog.Handler { return h }
func (h *countingHandler) WithGroup(string) slog.Handler      { return h }

// counterValue returns the value of a counter with one label value ("":
// a counter without labels).
func counterValue(t *testing.T, g prometheus.Gatherer, name, label string) float64 {
	t.Helper()
	mfs, err := g.Gather()
	if err != nil {
		t.Fatal(err)
	}
	for _, mf := range mfs {
		if mf.GetName() != name {
			continue
		}
		for _, m := range mf.GetMetric() {
			if label == "" && len(m.GetLabel()) == 0 {
				return m.GetCounter().GetValue()
			}
			for _, lp := range m.GetLabel() {
				if lp.GetValue() == label {
					return m.GetCounter().GetValue()
				}
			}
		}
	}
	t.Fatalf("no %s{%s} in the registry", name, label)
	return 0
}

// A labelled Service with publishNotReadyAddresses (a StatefulSet's
// headless Service often has it) gets EndpointSlices whose ready condition
// is true for every pod; its serving condition is the pod's readiness, and
// it is what gates discovery there: a NotReady pod stays invisible.
func TestPublishNotReadyAddresses(t *testing.T) {
	cp := kubetest.Shared(t)
	ns := cp.Namespace(t)
	ctx := kubetest.Ctx(t)
	_, err := cp.Core.Services(ns).Create(ctx, &corev1.Service{
		ObjectMeta: metav1.ObjectMeta{Name: "peers", Labels: map[string]string{kube.DiscoveryLabel: kube.DiscoveryLabelValue}},
		Spec: corev1.ServiceSpec{
			ClusterIP: corev1.ClusterIPNone, PublishNotReadyAddresses: true,
			Selector: map[string]string{kubetest.PodLabel: "true"},
			Ports:    []corev1.ServicePort{{Name: "http", Port: 80}},
		},
	}, metav1.CreateOptions{})
	if err != nil {
		t.Fatal(err)
	}
	pod := cp.SetReady(t, cp.Pod(t, ns, "starting"), false)
	cp.WaitEndpoint(t, pod, true) // the peers slice lists it, ready=true (serving=false)
	r := cp.Registry(t, ns, pod, nil)
	hidden := register(t, r, inst("10.9.2.1:80")).Instance()
	reader := cp.Registry(t, ns, nil, nil)
	f := follow(t, reader, beacon.Query{Namespace: "demo"})
	marker := register(t, cp.Registry(t, ns, cp.ReadyPod(t, ns, "ready"), nil), inst("10.9.2.2:80")).Instance()
	f.until("the Ready pod's instance", func(v *registrytest.View) bool { return has(v, marker) })
	if _, ok := f.v.Get(hidden.Ref().String()); ok {
		t.Fatalf("a NotReady pod's instance is visible through a publishNotReadyAddresses Service: %v", f.v)
	}
	if got, _, err := reader.List(ctx, beacon.Query{Namespace: "demo"}); err != nil || !registrytest.SameInstances(got, []beacon.Instance{marker}) {
		t.Fatalf("List = %v, %v; want only %s", got, err, marker.Ref())
	}
	if vis, err := r.Visibility(ctx); err != nil || vis.Visible || !strings.Contains(vis.Reason, "is not Ready") {
		t.Fatalf("Visibility of the NotReady pod = %+v, %v", vis, err)
	}
	cp.SetReady(t, pod, true)
	f.until("the instance once its pod is Ready", func(v *registrytest.View) bool { return has(v, hidden) })
}

// editAndWait JSON-patches InstanceSet ns/name as kubectl would, then waits
// for a later version of it that satisfies restored.
func editAndWait(t *testing.T, cp *kubetest.ControlPlane, ns, name, patch string, restored func(*unstructured.Unstructured) bool) {
	t.Helper()
	ctx := kubetest.Ctx(t)
	sets := cp.Dynamic.Resource(kube.GVR).Namespace(ns)
	w, err := sets.Watch(ctx, metav1.ListOptions{FieldSelector: "metadata.name=" + name})
	if err != nil {
		t.Fatal(err)
	}
	defer w.Stop()
	edited, err := sets.Patch(ctx, name, types.JSONPatchType, []byte(patch), metav1.PatchOptions{FieldManager: "kubectl-edit"})
	if err != nil {
		t.Fatal(err)
	}
	for {
		select {
		case ev, ok := <-w.ResultChan():
			if !ok {
				t.Fatal("watch ended")
			}
			u, ok := ev.Object.(*unstructured.Unstructured)
			if ok && parseRV(u.GetResourceVersion()) > parseRV(edited.GetResourceVersion()) && restored(u) {
				return
			}
		case <-ctx.Done():
			t.Fatalf("the process did not restore its InstanceSet after %s: %v", patch, edited.Object)
		}
	}
}

// What a server-side apply cannot remove, because another field manager
// set it (kubectl edit), the process removes from its InstanceSet: an
// instance added by hand, fields set in one of its instances, a container
// in pod mode, another owner. Readers end with exactly what it registered.
func TestForeignEditsAreRemoved(t *testing.T) {
	cp := kubetest.Shared(t)
	ns := cp.Namespace(t)
	pod, other := cp.ReadyPod(t, ns, "owner"), cp.ReadyPod(t, ns, "other")
	r := cp.Registry(t, ns, pod, nil)
	in := register(t, r, inst("10.7.2.1:80")).Instance()
	mine := func(u *unstructured.Unstructured) bool {
		items, _, _ := unstructured.NestedSlice(u.Object, "spec", "instances")
		if len(items) != 1 {
			return false
		}
		raw, _ := json.Marshal(items[0])
		got, err := beacon.UnmarshalInstance(raw)
		_, container, _ := unstructured.NestedString(u.Object, "spec", "container")
		owners := u.GetOwnerReferences()
		return err == nil && registrytest.Same(got, in) && !container && len(owners) == 1 && owners[0].UID == pod.UID
	}
	for _, patch := range []string{
		`[{"op":"add","path":"/spec/instances/-","value":{"namespace":"demo","component":"api","endpoint":"http",` +
			`"id":"00000000000000ff","address":"10.66.0.1:80","status":"serving","registered_at":"2026-01-01T00:00:00Z"}}]`,
		`[{"op":"add","path":"/spec/instances/0/metadata","value":{"injected":"1"}},{"op":"replace","path":"/spec/instances/0/transport","value":"grpc"}]`,
		`[{"op":"add","path":"/spec/container","value":"main"}]`,
		fmt.Sprintf(`[{"op":"add","path":"/metadata/ownerReferences/-","value":{"apiVersion":"v1","kind":"Pod","name":%q,"uid":%q}}]`, other.Name, other.UID),
	} {
		editAndWait(t, cp, ns, r.ObjectName(), patch, mine)
	}
	got, _, err := cp.Registry(t, ns, nil, nil).List(kubetest.Ctx(t), beacon.Query{Namespace: "demo"})
	if err != nil || !registrytest.SameInstances(got, []beacon.Instance{in}) {
		t.Fatalf("List after the edits = %v, %v; want only %s", got, err, in.Ref())
	}
}
