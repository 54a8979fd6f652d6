package kube_test

import (
	"context"
	"errors"
	"fmt"
	"strings"
	"testing"
	"time"

	"github.com/beaconplane/beacon"
	"github.com/beaconplane/beacon/internal/testkit/kubetest"
	"github.com/beaconplane/beacon/registry"
	"github.com/beaconplane/beacon/registry/kube"
	"github.com/beaconplane/beacon/registry/registrytest"
	"github.com/beaconplane/beacon/store"
	rbacv1 "k8s.io/api/rbac/v1"
	apiextensionsv1 "k8s.io/apiextensions-apiserver/pkg/apis/apiextensions/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
)

// TestDynamoContract runs the checks of registrytest's Registry contract
// that apply to a read-only registry (List, Watch, Close), with the
// instances written as Dynamo's pods write them: one pod (one object) per
// check, in Dynamo namespaces of its own.
func TestDynamoContract(t *testing.T) {
	e := newDynamoEnv(t, nil)
	for _, c := range []struct {
		name string
		fn   func(t *testing.T, e *dynamoEnv, ns string)
	}{
		{"List/QueryAndPrefixIsolation", dynamoListQuery},
		{"Watch/EmptySnapshot", dynamoEmptySnapshot},
		{"Watch/SnapshotFirst", dynamoSnapshotFirst},
		{"Watch/OrderedEvents", dynamoOrdered},
		{"Watch/SlowConsumerConverges", dynamoSlowConsumer},
		{"Watch/LocalCancelKeepsView", dynamoLocalCancel},
		{"Watch/ResumeGivesSnapshot", dynamoResume},
		{"Watch/InvalidQuery", dynamoInvalidQuery},
		{"Close/EndsWatches", dynamoClose},
	} {
		t.Run(c.name, func(t *testing.T) {
			c.fn(t, e, fmt.Sprintf("c%d", time.Now().UnixNano()%1e9))
		})
	}
}

// workers returns n workers of namespace ns, component api, endpoint
// http, their addresses numbered with round.
func workers(ns string, n, round int) []worker {
	var out []worker
	for i := range n {
		out = append(out, worker{ns: ns, comp: "api", ep: "http", id: uint64(0x100 + i), tcp: fmt.Sprintf("10.2.%d.%d:9999/http", round, i+1)})
	}
	return out
}

// serving writes ws as one Ready pod's object and waits until a watcher
// of q sees exactly them.
func (e *dynamoEnv) serving(t *testing.T, pod string, q beacon.Query, ws ...worker) {
	t.Helper()
	e.write(t, e.cp.ReadyPod(t, e.ns, pod), metadata(ws...))
	follow(t, e.d, q).until("the instances", func(v *registrytest.View) bool { return servesAll(v, ws) })
}

// servesAll reports whether the view holds exactly ws.
func servesAll(v *registrytest.View, ws []worker) bool {
	if v.Len() != len(ws) {
		return false
	}
	for _, w := range ws {
		if !servedAt(v, w) {
			return false
		}
	}
	return true
}

func dynamoListQuery(t *testing.T, e *dynamoEnv, ns string) {
	at := func(n, c, ep string, id uint64) worker {
		return worker{ns: n, comp: c, ep: ep, id: id, tcp: fmt.Sprintf("10.3.0.%d:9999/x", id)}
	}
	ws := []worker{at(ns, "api", "http", 1), at(ns, "api", "grpc", 2), at(ns, "api2", "http", 3), at(ns+"x", "api", "http", 4),
		at(ns+".sub", "api", "http", 5)}
	e.write(t, e.cp.ReadyPod(t, e.ns, ns), metadata(ws...))
	follow(t, e.d, beacon.Query{}).until("every instance", func(v *registrytest.View) bool {
		for _, w := range ws {
			if !servedAt(v, w) {
				return false
			}
		}
		return true
	})
	for _, c := range []struct {
		q    beacon.Query
		want []int
	}{
		{beacon.Query{Namespace: ns}, []int{1, 0, 2}}, // sorted by key: grpc before http
		{beacon.Query{Namespace: ns, Component: "api"}, []int{1, 0}},
		{beacon.Query{Namespace: ns, Component: "api", Endpoint: "http"}, []int{0}},
		{beacon.Query{Namespace: ns + "x"}, []int{3}},
		{beacon.Query{Namespace: ns + ".sub"}, []int{4}},
	} {
		got, rev, err := e.d.List(kubetest.Ctx(t), c.q)
		if err != nil || rev <= 0 {
			t.Fatalf("List(%q) at %d: %v", c.q, rev, err)
		}
		var refs []string
		for _, in := range got {
			refs = append(refs, in.Ref().String())
		}
		var want []string
		for _, i := range c.want {
			want = append(want, ws[i].ref().String())
		}
		if strings.Join(refs, " ") != strings.Join(want, " ") {
			t.Errorf("List(%q) = %v, want %v (sorted)", c.q, refs, want)
		}
	}
	if _, _, err := e.d.List(kubetest.Ctx(t), beacon.Query{Component: "api"}); !errors.Is(err, beacon.ErrInvalid) {
		t.Fatalf("List with a component but no namespace: %v", err)
	}
}

func dynamoEmptySnapshot(t *testing.T, e *dynamoEnv, ns string) {
	w, err := e.d.Watch(kubetest.Ctx(t), beacon.Query{Namespace: ns})
	if err != nil {
		t.Fatal(err)
	}
	defer w.Close()
	b, err := w.Next(kubetest.Ctx(t))
	if err != nil || b.Kind != registry.Snapshot || len(b.Events) != 0 || len(w.Instances()) != 0 {
		t.Fatalf("first batch %v (%d events), %v; want an empty snapshot", b.Kind, len(b.Events), err)
	}
}

func dynamoSnapshotFirst(t *testing.T, e *dynamoEnv, ns string) {
	ws := workers(ns, 3, 0)
	e.serving(t, ns, beacon.Query{Namespace: ns}, ws...)
	d := openDynamo(t, e.cp, e.ns, nil) // a view of its own, built from a listing
	w, err := d.Watch(kubetest.Ctx(t), beacon.Query{Namespace: ns})
	if err != nil {
		t.Fatal(err)
	}
	defer w.Close()
	b, err := w.Next(kubetest.Ctx(t))
	if err != nil || b.Kind != registry.Snapshot || b.Revision <= 0 {
		t.Fatalf("first batch %v at %d: %v; want a snapshot", b.Kind, b.Revision, err)
	}
	v := registrytest.NewView()
	if err := v.Apply(b); err != nil || !servesAll(v, ws) || !registrytest.SameInstances(w.Instances(), v.Instances()) {
		t.Fatalf("snapshot %v (%v), Instances() %v", v, err, w.Instances())
	}
}

func dynamoOrdered(t *testing.T, e *dynamoEnv, ns string) {
	q := beacon.Query{Namespace: ns}
	f := follow(t, e.d, q)
	pod := e.cp.ReadyPod(t, e.ns, ns)
	ws := workers(ns, 5, 0)
	e.write(t, pod, metadata(ws...))
	f.until("five instances", func(v *registrytest.View) bool { return servesAll(v, ws) })
	next := append(workers(ns, 3, 1), ws[3])
	e.write(t, pod, metadata(next...))
	want, _, err := e.d.List(kubetest.Ctx(t), q)
	if err != nil {
		t.Fatal(err)
	}
	f.until("the final state", func(v *registrytest.View) bool { return v.Equal(want) })
	if !servesAll(f.v, next) || !registrytest.SameInstances(f.w.Instances(), want) {
		t.Fatalf("watcher %v, Instances() %v; List says %v", f.v, f.w.Instances(), want)
	}
}

func dynamoSlowConsumer(t *testing.T, e *dynamoEnv, ns string) {
	q := beacon.Query{Namespace: ns}
	pod := e.cp.ReadyPod(t, e.ns, ns)
	const n, rounds = 5, 20
	e.write(t, pod, metadata(workers(ns, n, 0)...))
	fast, slow := follow(t, e.d, q), follow(t, e.d, q)
	fast.until("the instances", func(v *registrytest.View) bool { return servesAll(v, workers(ns, n, 0)) })
	slow.until("the instances", func(v *registrytest.View) bool { return servesAll(v, workers(ns, n, 0)) })
	events := slow.v.Events
	final := workers(ns, n-1, rounds)
	done := make(chan struct{})
	go func() { // the fast consumer keeps up meanwhile; the slow one reads nothing
		defer close(done)
		for !servesAll(fast.v, final) {
			b, err := fast.w.Next(kubetest.Ctx(t))
			if err != nil || fast.v.Apply(b) != nil {
				return
			}
		}
	}()
	for round := 1; round < rounds; round++ {
		e.write(t, pod, metadata(workers(ns, n, round)...))
	}
	e.write(t, pod, metadata(final...))
	<-done
	if !servesAll(fast.v, final) {
		t.Fatalf("the fast consumer has %v", fast.v)
	}
	slow.until("the slow consumer's catch-up", func(v *registrytest.View) bool { return servesAll(v, final) })
	if got := slow.v.Events - events; got > 3*n {
		t.Errorf("the slow consumer needed %d events to catch up on %d instances; want them coalesced", got, n)
	}
}

func dynamoLocalCancel(t *testing.T, e *dynamoEnv, ns string) {
	ws := workers(ns, 2, 0)
	e.serving(t, ns, beacon.Query{Namespace: ns}, ws...)
	ctx, cancel := context.WithCancel(context.Background())
	w, err := e.d.Watch(ctx, beacon.Query{Namespace: ns})
	if err != nil {
		t.Fatal(err)
	}
	defer w.Close()
	b, err := w.Next(kubetest.Ctx(t))
	if err != nil || len(b.Events) != 2 {
		t.Fatalf("snapshot %v: %v", b, err)
	}
	cancel()
	for {
		b, err := w.Next(kubetest.Ctx(t))
		if err != nil {
			if !errors.Is(err, registry.ErrWatchClosed) {
				t.Fatalf("after cancel, Next: %v, want ErrWatchClosed", err)
			}
			break
		}
		for _, ev := range b.Events {
			if ev.Type == beacon.Removed {
				t.Fatalf("local cancel delivered a removal of %s", ev.Instance.Ref())
			}
		}
	}
	if got := w.Instances(); len(got) != 2 {
		t.Fatalf("after cancel Instances() = %v, want the last view kept", got)
	}
}

// A Kubernetes watch cannot resume from a revision (see Registry.Watch):
// the first batch is a snapshot, the consumer's state replaced.
func dynamoResume(t *testing.T, e *dynamoEnv, ns string) {
	ws := workers(ns, 2, 0)
	e.serving(t, ns, beacon.Query{Namespace: ns}, ws...)
	_, rev, err := e.d.List(kubetest.Ctx(t), beacon.Query{Namespace: ns})
	if err != nil {
		t.Fatal(err)
	}
	w, err := e.d.Watch(kubetest.Ctx(t), beacon.Query{Namespace: ns}, registry.FromRevision(rev))
	if err != nil {
		t.Fatal(err)
	}
	defer w.Close()
	if b, err := w.Next(kubetest.Ctx(t)); err != nil || b.Kind != registry.Snapshot || len(b.Events) != 2 {
		t.Fatalf("first batch of a resumed watch: %v, %v", b, err)
	}
}

func dynamoInvalidQuery(t *testing.T, e *dynamoEnv, ns string) {
	for _, q := range []beacon.Query{{Namespace: ns, Endpoint: "http"}, {Namespace: "Not_A_Label"}} {
		if _, err := e.d.Watch(kubetest.Ctx(t), q); !errors.Is(err, beacon.ErrInvalid) {
			t.Errorf("Watch(%+v): %v, want ErrInvalid", q, err)
		}
	}
}

// Closing the registry ends its watches with ErrClosed, never with
// removals, and keeps their last view.
func dynamoClose(t *testing.T, e *dynamoEnv, ns string) {
	ws := workers(ns, 2, 0)
	e.serving(t, ns, beacon.Query{Namespace: ns}, ws...)
	d := openDynamo(t, e.cp, e.ns, nil)
	f := follow(t, d, beacon.Query{Namespace: ns})
	f.until("the instances", func(v *registrytest.View) bool { return servesAll(v, ws) })
	if err := d.Close(); err != nil {
		t.Fatal(err)
	}
	if _, err := f.w.Next(kubetest.Ctx(t)); !errors.Is(err, registry.ErrClosed) {
		t.Fatalf("Next after Close: %v, want ErrClosed", err)
	}
	if got := f.w.Instances(); len(got) != 2 {
		t.Fatalf("Instances() after Close = %v, want the last view", got)
	}
}

// The shipped RBAC (deploy/kubernetes/rbac-dynamo.yaml) is what reading
// needs: its Role lets a ServiceAccount list and watch one namespace, its
// ClusterRole every namespace; without them (Beacon's InstanceSet reader
// Role grants nothing of Dynamo's) the error names what is missing and the
// file that grants it, and is an unavailable backend (503), not a bad
// request.
func TestDynamoRBAC(t *testing.T) {
	e := newDynamoEnv(t, nil)
	w := worker{ns: "dynamo", comp: "backend", ep: "generate", id: 0x51, tcp: "10.244.5.1:9999/generate"}
	e.write(t, e.cp.ReadyPod(t, e.ns, "w"), metadata(w))
	var role rbacv1.Role
	shippedNamed(t, "rbac-dynamo.yaml", "Role", "beacon-dynamo-reader", &role)
	reader := openDynamo(t, e.cp, e.ns, func(c *kube.Config) { c.REST = e.cp.ServiceAccount(t, e.ns, "dyn-reader", role.Rules) })
	follow(t, reader, beacon.Query{Namespace: "dynamo"}).until("the instance", func(v *registrytest.View) bool { return servedAt(v, w) })
	if list, _, err := reader.List(kubetest.Ctx(t), beacon.Query{}); err != nil || len(list) != 1 {
		t.Fatalf("List with the shipped Role: %v, %v", list, err)
	}

	var isReader rbacv1.Role
	shippedNamed(t, "rbac.yaml", "Role", "beacon-discovery-reader", &isReader)
	rc := e.cp.ServiceAccount(t, e.ns, "is-reader", isReader.Rules)
	_, _, err := openDynamo(t, e.cp, e.ns, func(c *kube.Config) { c.REST = rc }).List(kubetest.Ctx(t), beacon.Query{})
	if !errors.Is(err, kube.ErrForbidden) || !errors.Is(err, store.ErrUnavailable) ||
		!strings.Contains(err.Error(), "list dynamoworkermetadatas.nvidia.com") || !strings.Contains(err.Error(), "rbac-dynamo.yaml") {
		t.Fatalf("List with Beacon's InstanceSet reader Role: %v", err)
	}
	t.Log(err)

	var cr rbacv1.ClusterRole
	shipped(t, "rbac-dynamo.yaml", "ClusterRole", &cr)
	all := e.cp.ServiceAccount(t, e.ns, "all-dyn", nil)
	e.cp.BindCluster(t, e.ns, "all-dyn", &cr)
	list, _, err := openDynamo(t, e.cp, e.ns, func(c *kube.Config) { c.REST, c.Namespaces = all, []string{kube.AllNamespaces} }).
		List(kubetest.Ctx(t), beacon.Query{Namespace: "dynamo", Component: "backend", Endpoint: "generate"})
	if err != nil || slicesIndex(list, w.ref()) < 0 {
		t.Fatalf("List in every namespace with the shipped ClusterRole: %v, %v", list, err)
	}
	roleOnly := e.cp.ServiceAccount(t, e.ns, "ns-dyn", role.Rules)
	_, _, err = openDynamo(t, e.cp, e.ns, func(c *kube.Config) { c.REST, c.Namespaces = roleOnly, []string{kube.AllNamespaces} }).
		List(kubetest.Ctx(t), beacon.Query{})
	if !errors.Is(err, kube.ErrForbidden) || !strings.Contains(err.Error(), "the ClusterRole of deploy/kubernetes/rbac-dynamo.yaml") {
		t.Fatalf("List in every namespace with only the Role: %v", err)
	}
}

// A cluster without Dynamo's CRD: OpenDynamo says so. One that serves the
// nvidia.com group only for another NVIDIA operator (its ClusterPolicy,
// v1): OpenDynamo says which versions it serves. With Dynamo's CRD,
// OpenDynamo works.
func TestDynamoNotInstalled(t *testing.T) {
	cp := kubetest.New(t, kubetest.Options{NoControllers: true})
	ctx := kubetest.Ctx(t)
	_, err := kube.OpenDynamo(ctx, kube.Config{REST: cp.Admin()})
	if !errors.Is(err, kube.ErrDynamoNotInstalled) || !strings.Contains(err.Error(), "runs no Dynamo platform") {
		t.Fatalf("OpenDynamo without Dynamo's CRD: %v", err)
	}
	t.Log(err)
	other := dynamoCRD(t)
	other.Name = "clusterpolicies.nvidia.com"
	other.Spec.Names = apiextensionsv1.CustomResourceDefinitionNames{Plural: "clusterpolicies", Singular: "clusterpolicy",
		Kind: "ClusterPolicy", ListKind: "ClusterPolicyList"}
	other.Spec.Scope = apiextensionsv1.ClusterScoped
	other.Spec.Versions[0].Name = "v1"
	if _, err := cp.Extension.CustomResourceDefinitions().Create(ctx, other, metav1.CreateOptions{}); err != nil {
		t.Fatal(err)
	}
	waitCRDNamed(t, cp, other.Name, kubetest.Established)
	_, err = kube.OpenDynamo(ctx, kube.Config{REST: cp.Admin()})
	if !errors.Is(err, kube.ErrDynamoMismatch) || !strings.Contains(err.Error(), "serves nvidia.com in version v1,") {
		t.Fatalf("OpenDynamo with nvidia.com/v1 only: %v", err)
	}
	t.Log(err)
	installDynamoCRD(t, cp)
	d, err := kube.OpenDynamo(ctx, kube.Config{REST: cp.Admin()})
	if err != nil {
		t.Fatalf("OpenDynamo with Dynamo's CRD: %v", err)
	}
	_ = d.Close()
}
