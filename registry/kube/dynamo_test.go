package kube_test

import (
	"encoding/json"
	"errors"
	"fmt"
	"os"
	"strings"
	"testing"
	"time"

	"github.com/beaconplane/beacon"
	"github.com/beaconplane/beacon/dynamo"
	"github.com/beaconplane/beacon/internal/lab/netcut"
	"github.com/beaconplane/beacon/internal/testkit/kubetest"
	"github.com/beaconplane/beacon/registry"
	"github.com/beaconplane/beacon/registry/kube"
	"github.com/beaconplane/beacon/registry/registrytest"
	corev1 "k8s.io/api/core/v1"
	apiextensionsv1 "k8s.io/apiextensions-apiserver/pkg/apis/apiextensions/v1"
	apierrors "k8s.io/apimachinery/pkg/api/errors"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/apis/meta/v1/unstructured"
	"k8s.io/apimachinery/pkg/types"
	"sigs.k8s.io/yaml"
)

// The dynamo layout's tests write what the Dynamo runtime's pods write
// (lib/runtime/src/discovery/kube: build_cr, apply_cr, DiscoveryMetadata)
// to a real kube-apiserver with Dynamo's CRD applied, and let the real
// EndpointSlice controller and garbage collector do the rest. No Dynamo
// process runs.

const dynamoCRDName = kube.DynamoResource + "." + kube.DynamoGroup

// dynamoCRD returns Dynamo's CRD (testdata), as its Helm chart publishes it.
func dynamoCRD(t *testing.T) *apiextensionsv1.CustomResourceDefinition {
	t.Helper()
	b, err := os.ReadFile("testdata/nvidia.com_dynamoworkermetadatas.yaml")
	if err != nil {
		t.Fatal(err)
	}
	var crd apiextensionsv1.CustomResourceDefinition
	if err := yaml.UnmarshalStrict(b, &crd); err != nil {
		t.Fatal(err)
	}
	return &crd
}

// installDynamoCRD applies Dynamo's CRD (it may be there already) and
// waits until it is established.
func installDynamoCRD(t *testing.T, cp *kubetest.ControlPlane) {
	t.Helper()
	_, err := cp.Extension.CustomResourceDefinitions().Create(kubetest.Ctx(t), dynamoCRD(t), metav1.CreateOptions{})
	if err != nil && !apierrors.IsAlreadyExists(err) {
		t.Fatalf("create Dynamo's CRD: %v", err)
	}
	waitCRDNamed(t, cp, dynamoCRDName, kubetest.Established)
}

// dynamoEnv is a namespace of the shared control plane with Dynamo's CRD,
// a Service labelled as Dynamo's operator labels them (selecting the test
// pods, so that the EndpointSlice controller publishes their readiness in
// slices with those labels), and a Dynamo registry reading it.
type dynamoEnv struct {
	cp *kubetest.ControlPlane
	ns string
	d  *kube.Dynamo
}

func newDynamoEnv(t *testing.T, configure func(*kube.Config)) *dynamoEnv {
	t.Helper()
	cp := kubetest.Shared(t)
	installDynamoCRD(t, cp)
	ns := cp.Namespace(t)
	dynamoService(t, cp, ns, map[string]string{kubetest.PodLabel: "true"})
	return &dynamoEnv{cp: cp, ns: ns, d: openDynamo(t, cp, ns, configure)}
}

// dynamoService creates a headless Service labelled as Dynamo's operator
// labels them, selecting the pods with the given labels.
func dynamoService(t *testing.T, cp *kubetest.ControlPlane, ns string, selector map[string]string) {
	t.Helper()
	_, err := cp.Core.Services(ns).Create(kubetest.Ctx(t), &corev1.Service{
		ObjectMeta: metav1.ObjectMeta{Name: "dynamo-workers", Labels: map[string]string{
			kube.DynamoBackendLabel: kube.DynamoBackendLabelValue, kube.DynamoEnabledLabel: kube.DynamoEnabledLabelValue}},
		Spec: corev1.ServiceSpec{
			ClusterIP: corev1.ClusterIPNone,
			Selector:  selector,
			Ports:     []corev1.ServicePort{{Name: "system", Port: 9090}},
		},
	}, metav1.CreateOptions{})
	if err != nil {
		t.Fatal(err)
	}
}

// openDynamo opens a Dynamo registry reading ns, closed when the test ends.
func openDynamo(t *testing.T, cp *kubetest.ControlPlane, ns string, configure func(*kube.Config)) *kube.Dynamo {
	t.Helper()
	cfg := kube.Config{REST: cp.Admin(), Namespaces: []string{ns}, Timeout: 20 * time.Second}
	if configure != nil {
		configure(&cfg)
	}
	d, err := kube.OpenDynamo(kubetest.Ctx(t), cfg)
	if err != nil {
		t.Fatalf("OpenDynamo: %v", err)
	}
	t.Cleanup(func() { _ = d.Close() })
	return d
}

// worker is one registration as a Dynamo worker writes it: an endpoint
// instance and, with a model, its model card.
type worker struct {
	ns, comp, ep string
	id           uint64 // below 2^53, as the runtime's pod-name hashes are
	tcp, http    string // the transport: a tcp target, or an http URL
	model        string
}

func (w worker) key() string { return fmt.Sprintf("%s/%s/%s/%x", w.ns, w.comp, w.ep, w.id) }

func (w worker) ref() beacon.Ref {
	return beacon.Ref{Namespace: w.ns, Component: w.comp, Endpoint: w.ep, ID: beacon.FormatID(w.id)}
}

func (w worker) endpoint() map[string]any {
	transport := map[string]any{"tcp": w.tcp}
	if w.http != "" {
		transport = map[string]any{"http": w.http}
	}
	return map[string]any{"type": "Endpoint", "namespace": w.ns, "component": w.comp, "endpoint": w.ep,
		"instance_id": int64(w.id), "transport": transport, "device_type": nil, "request_plane_codec": "msgpack"}
}

func (w worker) card() map[string]any {
	return map[string]any{"type": "Model", "namespace": w.ns, "component": w.comp, "endpoint": w.ep, "instance_id": int64(w.id),
		"card_json": map[string]any{"display_name": w.model, "kv_cache_block_size": int64(16)}, "model_suffix": nil}
}

// metadata is spec.data as the runtime serializes its DiscoveryMetadata:
// endpoints and model cards by key, and event channels (no instances).
func metadata(ws ...worker) map[string]any {
	eps, cards, chans := map[string]any{}, map[string]any{}, map[string]any{}
	for _, w := range ws {
		eps[w.key()] = w.endpoint()
		if w.model != "" {
			cards[w.key()] = w.card()
		}
		chans[fmt.Sprintf("%s/%s/kv-events/%x", w.ns, w.comp, w.id)] = map[string]any{"type": "EventChannel",
			"namespace": w.ns, "component": w.comp, "topic": "kv-events", "instance_id": int64(w.id),
			"transport": map[string]any{"kind": "Zmq", "config": map[string]any{"endpoint": "tcp://10.0.0.1:5557"}}}
	}
	return map[string]any{"endpoints": eps, "model_cards": cards, "event_channels": chans}
}

// write applies pod's DynamoWorkerMetadata as the runtime does: named
// after the pod, owned by it (controller and blockOwnerDeletion false),
// the whole document server-side applied by the field manager
// "dynamo-worker" with force.
func (e *dynamoEnv) write(t *testing.T, pod *corev1.Pod, data map[string]any) {
	t.Helper()
	e.apply(t, pod.Name, []any{owner(pod.Name, string(pod.UID))}, map[string]any{"data": data})
}

func owner(name, uid string) map[string]any {
	return map[string]any{"apiVersion": "v1", "kind": "Pod", "name": name, "uid": uid, "controller": false, "blockOwnerDeletion": false}
}

// apply applies a DynamoWorkerMetadata (spec nil: none), with finalizers
// if any.
func (e *dynamoEnv) apply(t *testing.T, name string, owners []any, spec map[string]any, finalizers ...string) {
	t.Helper()
	meta := map[string]any{"name": name, "namespace": e.ns, "ownerReferences": owners}
	if len(finalizers) > 0 {
		meta["finalizers"] = finalizers
	}
	obj := &unstructured.Unstructured{Object: map[string]any{
		"apiVersion": kube.DynamoGroup + "/" + kube.DynamoVersion, "kind": kube.DynamoKind, "metadata": meta,
	}}
	if spec != nil {
		obj.Object["spec"] = spec
	}
	_, err := e.cp.Dynamic.Resource(kube.DynamoGVR).Namespace(e.ns).Apply(kubetest.Ctx(t), name, obj,
		metav1.ApplyOptions{FieldManager: "dynamo-worker", Force: true})
	if err != nil {
		t.Fatalf("apply DynamoWorkerMetadata %s: %v", name, err)
	}
}

// storeSide is the instance the store side serves for w's entries: the
// same keys and values in etcd, through dynamo.Decode and a Catalog.
func storeSide(t *testing.T, w worker) beacon.Instance {
	t.Helper()
	cat := dynamo.NewCatalog[struct{}]()
	put := func(key string, v map[string]any) {
		b, _ := json.Marshal(v)
		e, err := dynamo.Decode(key, b)
		if err != nil {
			t.Fatal(err)
		}
		cat.Put(e, struct{}{})
	}
	put(dynamo.InstancesPrefix+w.key(), w.endpoint())
	if w.model != "" {
		put(dynamo.ModelsPrefix+w.key(), w.card())
	}
	s, ok := cat.Lookup(w.ref())
	if !ok {
		t.Fatalf("the store side serves no %s", w.ref())
	}
	return s.Instance
}

// checkServed checks that got is w as the store side serves it, plus where
// it was read (object and pod) and when its object was created.
func checkServed(t *testing.T, got beacon.Instance, w worker, ns string, pod *corev1.Pod) {
	t.Helper()
	want := storeSide(t, w)
	want.Metadata[kube.MetaObject] = ns + "/" + pod.Name
	want.Metadata[kube.MetaPod] = ns + "/" + pod.Name
	want.RegisteredAt = got.RegisteredAt
	if !got.Equal(want) || got.RegisteredAt.IsZero() {
		t.Fatalf("served %+v\nwant     %+v (and a registration time)", got, want)
	}
}

// servedAt reports whether the view holds w's instance at its address.
func servedAt(v *registrytest.View, w worker) bool {
	got, ok := v.Get(w.ref().String())
	return ok && (got.Metadata[dynamo.MetaTarget] == w.tcp+w.http)
}

// Instances written as Dynamo's pods write them are listed, watched and
// got with the names, IDs, addresses and metadata the store side gives the
// same entries (model cards joined, event channels ignored); a transport
// that changes without a readiness dip is an update of the same ID.
func TestDynamoListWatch(t *testing.T) {
	e := newDynamoEnv(t, nil)
	p1, p2 := e.cp.ReadyPod(t, e.ns, "vllm-worker-0"), e.cp.ReadyPod(t, e.ns, "vllm-worker-1")
	f := follow(t, e.d, beacon.Query{Namespace: "dynamo"})
	a := worker{ns: "dynamo", comp: "backend", ep: "generate", id: 0x1d4c3b2a190817, tcp: "10.244.0.5:9999/generate", model: "Qwen/Qwen3-0.6B"}
	b := worker{ns: "dynamo", comp: "backend", ep: "clear_kv_blocks", id: 0x0a0b0c0d0e0f, http: "http://10.244.0.6:8888/v1/rpc/clear_kv_blocks"}
	e.write(t, p1, metadata(a))
	e.write(t, p2, metadata(b))
	f.until("both instances", func(v *registrytest.View) bool { return servedAt(v, a) && servedAt(v, b) })
	got, _ := f.v.Get(a.ref().String())
	checkServed(t, got, a, e.ns, p1)
	got, _ = f.v.Get(b.ref().String())
	checkServed(t, got, b, e.ns, p2)

	ctx := kubetest.Ctx(t)
	list, rev, err := e.d.List(ctx, beacon.Query{Namespace: "dynamo", Component: "backend"})
	if err != nil || rev <= 0 || !registrytest.SameInstances(list, f.v.Instances()) {
		t.Fatalf("List = %v at %d, %v; the watcher has %v", list, rev, err, f.v)
	}
	if in, err := e.d.Get(ctx, a.ref()); err != nil || !in.Equal(list[slicesIndex(list, a.ref())]) {
		t.Fatalf("Get(%s) = %v, %v", a.ref(), in, err)
	}
	missing := a.ref()
	missing.ID = beacon.FormatID(a.id + 1)
	if _, err := registry.Get(ctx, e.d, missing); !errors.Is(err, beacon.ErrNotFound) {
		t.Fatalf("Get of an unknown instance: %v", err)
	}

	moved := a
	moved.tcp = "10.244.0.5:10000/generate"
	e.write(t, p1, metadata(moved))
	f.until("the new transport", func(v *registrytest.View) bool { return servedAt(v, moved) })
	if f.removed(a.ref()) {
		t.Fatal("a transport change was delivered as a removal")
	}
}

func slicesIndex(list []beacon.Instance, ref beacon.Ref) int {
	for i, in := range list {
		if in.Ref() == ref {
			return i
		}
	}
	return -1
}

// An instance is served while its pod is Ready in an EndpointSlice with
// Dynamo's labels: a pod not Ready yet is left out, as registry/kube
// leaves out every unready pod (and as Dynamo's own frontends do), then
// added once Ready, then removed (not marked draining) when it turns
// NotReady. A pod Ready only in slices without Dynamo's labels is never
// served.
func TestDynamoReadiness(t *testing.T) {
	e := newDynamoEnv(t, nil)
	pod := e.cp.Pod(t, e.ns, "w")
	w := worker{ns: "dynamo", comp: "backend", ep: "generate", id: 0x11, tcp: "10.244.1.1:9999/generate"}
	e.write(t, pod, metadata(w))
	barrier := worker{ns: "dynamo", comp: "backend", ep: "generate", id: 0x12, tcp: "10.244.1.2:9999/generate"}
	e.write(t, e.cp.ReadyPod(t, e.ns, "barrier"), metadata(barrier))
	f := follow(t, e.d, beacon.Query{Namespace: "dynamo"})
	f.until("the Ready pod's instance", func(v *registrytest.View) bool { return servedAt(v, barrier) })
	if _, ok := f.v.Get(w.ref().String()); ok {
		t.Fatalf("the instance of a pod that is not Ready is served: %v", f.v)
	}

	e.cp.SetReady(t, pod, true)
	f.until("the instance once its pod is Ready", func(v *registrytest.View) bool { return servedAt(v, w) })
	e.cp.SetReady(t, pod, false)
	f.until("the instance gone once its pod is NotReady", func(v *registrytest.View) bool {
		_, ok := v.Get(w.ref().String())
		return !ok
	})
	if !f.removed(w.ref()) {
		t.Fatal("no Removed event for the NotReady pod's instance")
	}
	for _, b := range f.batches {
		for _, ev := range b.Events {
			if ev.Instance.Status != beacon.StatusServing {
				t.Fatalf("an instance was delivered %s: %v", ev.Instance.Status, ev)
			}
		}
	}

	// Only slices with Dynamo's labels count. A namespace whose Service
	// with Beacon's label selects every test pod, and whose Service with
	// Dynamo's labels selects one: the other is never served, though
	// Ready (its object was written first, so seeing the second pod's
	// instance means both were read).
	plain := &dynamoEnv{cp: e.cp, ns: e.cp.Namespace(t)}
	dynamoService(t, e.cp, plain.ns, map[string]string{"dynamo-worker": "true"})
	plain.write(t, e.cp.ReadyPod(t, plain.ns, "beacon-only"), metadata(w))
	dyn := e.cp.Pod(t, plain.ns, "dyn")
	_, err := e.cp.Core.Pods(plain.ns).Patch(kubetest.Ctx(t), dyn.Name, types.MergePatchType,
		[]byte(`{"metadata":{"labels":{"dynamo-worker":"true"}}}`), metav1.PatchOptions{})
	if err != nil {
		t.Fatal(err)
	}
	plain.write(t, e.cp.SetReady(t, dyn, true), metadata(barrier))
	plain.d = openDynamo(t, e.cp, plain.ns, nil)
	pf := follow(t, plain.d, beacon.Query{Namespace: "dynamo"})
	pf.until("the instance of the pod in the Dynamo-labelled slice", func(v *registrytest.View) bool { return servedAt(v, barrier) })
	list, _, err := plain.d.List(kubetest.Ctx(t), beacon.Query{})
	if err != nil || len(list) != 1 || pf.v.Len() != 1 {
		t.Fatalf("a pod Ready only in slices without Dynamo's labels is served: List %v, %v; watcher %v", list, err, pf.v)
	}
}

// Deleting a pod removes its instances (its EndpointSlice entry goes, and
// the garbage collector deletes its DynamoWorkerMetadata through the
// ownerReference); an object owned by another incarnation of a pod (its
// name, an old UID) is never served, however Ready the pod of that name.
func TestDynamoPodDeleted(t *testing.T) {
	e := newDynamoEnv(t, nil)
	pod := e.cp.ReadyPod(t, e.ns, "w")
	w := worker{ns: "dynamo", comp: "backend", ep: "generate", id: 0x21, tcp: "10.244.2.1:9999/generate"}
	e.write(t, pod, metadata(w))
	f := follow(t, e.d, beacon.Query{Namespace: "dynamo"})
	f.until("the instance", func(v *registrytest.View) bool { return servedAt(v, w) })
	e.cp.DeletePod(t, pod)
	f.until("the instance removed", func(v *registrytest.View) bool { return v.Len() == 0 })
	e.cp.WaitGoneResource(t, kube.DynamoGVR, e.ns, pod.Name)
	if list, _, err := e.d.List(kubetest.Ctx(t), beacon.Query{}); err != nil || len(list) != 0 {
		t.Fatalf("List after the pod was deleted: %v, %v", list, err)
	}

	again := e.cp.ReadyPod(t, e.ns, "w2")
	stale := worker{ns: "dynamo", comp: "backend", ep: "generate", id: 0x22, tcp: "10.244.2.2:9999/generate"}
	e.apply(t, "w2-stale", []any{owner(again.Name, "0f0f0f0f-0000-0000-0000-000000000000")}, map[string]any{"data": metadata(stale)})
	fresh := worker{ns: "dynamo", comp: "backend", ep: "generate", id: 0x23, tcp: "10.244.2.3:9999/generate"}
	e.write(t, again, metadata(fresh))
	f.until("the new incarnation's instance", func(v *registrytest.View) bool { return servedAt(v, fresh) })
	for _, b := range f.batches {
		for _, ev := range b.Events {
			if ev.Instance.Ref() == stale.ref() {
				t.Fatalf("an object owned by another incarnation of pod %s was served: %v", again.Name, ev)
			}
		}
	}
}

// A Dynamo worker pod replaced under the same name (a StatefulSet's: the
// runtime's instance ID is a hash of the pod's name, so it keeps its ID)
// with a new transport, while a reader is cut off from the API server,
// which then restarts with etcd compacted: the reader's watches cannot
// resume (410 Gone), it re-lists both resources as one step, and its
// watchers get a Stale batch, then a Resync in which the instance is
// Updated (its new transport), never Removed. Not parallel: it restarts
// the shared API server.
func TestDynamoResync(t *testing.T) {
	e := newDynamoEnv(t, nil)
	proxy, err := netcut.Start(strings.TrimPrefix(e.cp.Host(), "https://"))
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { _ = proxy.Close() })
	rc := e.cp.Admin()
	rc.Host = "https://" + proxy.Addr()
	f := follow(t, openDynamo(t, e.cp, e.ns, func(c *kube.Config) { c.REST = rc }), beacon.Query{Namespace: "dynamo"})
	pod := e.cp.ReadyPod(t, e.ns, "vllm-worker-0")
	w := worker{ns: "dynamo", comp: "backend", ep: "generate", id: 0x61, tcp: "10.244.6.1:9999/generate"}
	e.write(t, pod, metadata(w))
	f.until("the instance", func(v *registrytest.View) bool { return servedAt(v, w) })

	proxy.Cut()
	f.until("a stale batch", func(*registrytest.View) bool { return f.batches[len(f.batches)-1].Kind == registry.Stale })
	since := len(f.batches)
	e.cp.DeletePod(t, pod)
	e.cp.WaitGoneResource(t, kube.DynamoGVR, e.ns, pod.Name)
	moved := w
	moved.tcp = "10.244.6.2:9999/generate"
	e.write(t, e.cp.ReadyPod(t, e.ns, "vllm-worker-0"), metadata(moved))
	e.cp.KillAPIServer(t)
	e.cp.CompactEtcd(t)
	e.cp.StartAPIServer(t)
	proxy.Restore()

	f.until("the new transport", func(v *registrytest.View) bool { return servedAt(v, moved) })
	resynced := false
	for _, b := range f.batches[since:] {
		resynced = resynced || b.Kind == registry.Resync
		for _, ev := range b.Events {
			if ev.Type == beacon.Removed {
				t.Fatalf("%s was removed when the reader re-listed (batches %v): a phantom removal", ev.Instance.Ref(), kinds(f.batches[since:]))
			}
		}
	}
	if !resynced {
		t.Fatalf("no Resync after the Stale batch: %v", kinds(f.batches))
	}
	t.Logf("batches after the cut: %v", kinds(f.batches[since-1:]))
}
