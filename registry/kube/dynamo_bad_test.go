package kube_test

import (
	"errors"
	"log/slog"
	"strings"
	"testing"

	"github.com/beaconplane/beacon"
	"github.com/beaconplane/beacon/internal/testkit/kubetest"
	"github.com/beaconplane/beacon/registry"
	"github.com/beaconplane/beacon/registry/kube"
	"github.com/beaconplane/beacon/registry/registrytest"
	"github.com/prometheus/client_golang/prometheus"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/runtime/schema"
)

// Entries Beacon cannot serve, which the API server stores as they come
// (spec.data keeps unknown fields), are each reported once per version of
// their object (logged and counted, however many Lists and watchers read
// it) and skipped; the rest is served and the watch goes on. An entry that
// turns malformed keeps its last valid value; an object nothing of which is
// valid (no spec) is counted apart and serves nothing.
func TestDynamoMalformedEntries(t *testing.T) {
	metrics := prometheus.NewRegistry()
	logs := &countingHandler{match: "skipping an entry Beacon cannot serve"}
	e := newDynamoEnv(t, func(c *kube.Config) { c.Metrics, c.Logger = metrics, slog.New(logs) })
	pod := e.cp.ReadyPod(t, e.ns, "w")
	good := worker{ns: "dynamo", comp: "backend", ep: "generate", id: 0x31, tcp: "10.244.3.1:9999/generate"}
	withBad := func(ws ...worker) map[string]any {
		data := metadata(ws...)
		eps := data["endpoints"].(map[string]any)
		eps["dynamo/backend/generate/32"] = "not an object"
		eps["dynamo/backend/generate/33"] = map[string]any{"type": "Teapot"}
		eps["dynamo/backend/generate"] = map[string]any{"type": "Endpoint"}
		data["model_cards"] = map[string]any{good.key(): map[string]any{"type": "Model", "card_json": map[string]any{}}}
		return data
	}
	const bad = 4
	e.write(t, pod, withBad(good))
	f := follow(t, e.d, beacon.Query{Namespace: "dynamo"})
	f.until("the valid entry", func(v *registrytest.View) bool { return servedAt(v, good) })
	ctx := kubetest.Ctx(t)
	for range 2 {
		if list, _, err := e.d.List(ctx, beacon.Query{}); err != nil || len(list) != 1 {
			t.Fatalf("List = %v, %v; want the valid entry alone", list, err)
		}
	}
	follow(t, e.d, beacon.Query{Namespace: "dynamo"}).until("the valid entry", func(v *registrytest.View) bool { return servedAt(v, good) })
	if n, c := logs.n.Load(), counterValue(t, metrics, "beacon_kube_invalid_entries_total", ""); n != bad || c != bad {
		t.Fatalf("%d bad entries logged %d times, counted %v times; want once each", bad, n, c)
	}

	moved := good
	moved.tcp = "10.244.3.1:10000/generate"
	e.write(t, pod, withBad(moved))
	f.until("the update beside the bad entries", func(v *registrytest.View) bool { return servedAt(v, moved) })
	if n := logs.n.Load(); n != 2*bad {
		t.Fatalf("a new version with %d bad entries logged %d in all, want %d", bad, n, 2*bad)
	}

	broken := withBad(worker{ns: "dynamo", comp: "backend", ep: "generate", id: 0x34, tcp: "10.244.3.4:9999/generate"})
	broken["endpoints"].(map[string]any)[good.key()] = map[string]any{"type": "Endpoint", "namespace": "dynamo",
		"component": "backend", "endpoint": "generate", "instance_id": int64(good.id), "transport": map[string]any{"pigeon": "x"}}
	e.write(t, pod, broken)
	f.until("the entry added beside", func(v *registrytest.View) bool { return v.Len() == 2 })
	if !servedAt(f.v, moved) || f.removed(good.ref()) {
		t.Fatalf("the entry that turned malformed lost its last valid value: %v", f.v)
	}

	other := e.cp.ReadyPod(t, e.ns, "other")
	e.apply(t, "other-nospec", []any{owner(other.Name, string(other.UID))}, nil)
	barrier := worker{ns: "dynamo", comp: "backend", ep: "generate", id: 0x35, tcp: "10.244.3.5:9999/generate"}
	e.write(t, other, metadata(barrier))
	f.until("the next object", func(v *registrytest.View) bool { return servedAt(v, barrier) })
	if c := counterValue(t, metrics, "beacon_kube_invalid_resources_total", ""); c != 1 || f.v.Len() != 3 {
		t.Fatalf("an object without spec: counted %v times (want 1), view %v", c, f.v)
	}
}

// Two Ready pods whose objects hold one instance ID: neither is served
// (Dynamo's rule for colliding IDs, not a silent winner), each holder is
// reported once; once one pod is NotReady, the other's is served.
func TestDynamoCollisionAcrossPods(t *testing.T) {
	logs := &countingHandler{match: "also holds"}
	e := newDynamoEnv(t, func(c *kube.Config) { c.Logger = slog.New(logs) })
	p1, p2 := e.cp.ReadyPod(t, e.ns, "w1"), e.cp.ReadyPod(t, e.ns, "w2")
	a := worker{ns: "dynamo", comp: "backend", ep: "generate", id: 0x41, tcp: "10.244.4.1:9999/generate"}
	b := a
	b.tcp = "10.244.4.2:9999/generate"
	f := follow(t, e.d, beacon.Query{Namespace: "dynamo"})
	e.write(t, p1, metadata(a))
	f.until("the first holder's instance", func(v *registrytest.View) bool { return servedAt(v, a) })
	e.write(t, p2, metadata(b))
	f.until("the instance withdrawn", func(v *registrytest.View) bool { return v.Len() == 0 })
	if list, _, err := e.d.List(kubetest.Ctx(t), beacon.Query{}); err != nil || len(list) != 0 {
		t.Fatalf("List of a colliding ID: %v, %v", list, err)
	}
	if n := logs.n.Load(); n != 2 {
		t.Fatalf("the collision of two objects was logged %d times, want 2", n)
	}
	e.cp.SetReady(t, p2, false)
	f.until("the remaining holder's instance", func(v *registrytest.View) bool { return servedAt(v, a) })
}

// Every write is refused with an error saying the layout is read-only and
// what to do; nothing is written, and no write capability is offered to
// consumers (the HTTP API answers them 501). After Close every call says
// the registry is closed.
func TestDynamoReadOnly(t *testing.T) {
	e := newDynamoEnv(t, nil)
	ctx := kubetest.Ctx(t)
	in := beacon.Instance{Namespace: "dynamo", Component: "backend", Endpoint: "generate", Address: "10.0.0.1:80"}
	_, err := e.d.Register(ctx, in)
	if !errors.Is(err, kube.ErrReadOnly) || !strings.Contains(err.Error(), "register through Dynamo's runtime") {
		t.Fatalf("Register: %v", err)
	}
	t.Log(err)
	for _, gvr := range []schema.GroupVersionResource{kube.GVR, kube.DynamoGVR} {
		list, err := e.cp.Dynamic.Resource(gvr).Namespace(e.ns).List(ctx, metav1.ListOptions{})
		if err != nil || len(list.Items) != 0 {
			t.Fatalf("a refused registration wrote %s: %v, %v", gvr.Resource, list, err)
		}
	}
	var r registry.Registry = e.d
	if _, ok := r.(registry.LeasedRegistrar); ok {
		t.Error("the dynamo layout offers registrations over HTTP")
	}
	if _, ok := r.(registry.Operator); ok {
		t.Error("the dynamo layout offers operator writes")
	}
	if _, ok := r.(registry.TTLReporter); ok {
		t.Error("the dynamo layout offers TTL reports")
	}
	if err := e.d.Close(); err != nil {
		t.Fatal(err)
	}
	if err := e.d.Close(); err != nil {
		t.Fatalf("second Close: %v", err)
	}
	if _, err := e.d.Register(ctx, in); !errors.Is(err, registry.ErrClosed) {
		t.Fatalf("Register after Close: %v", err)
	}
	if _, _, err := e.d.List(ctx, beacon.Query{}); !errors.Is(err, registry.ErrClosed) {
		t.Fatalf("List after Close: %v", err)
	}
	if _, err := e.d.Watch(ctx, beacon.Query{}); !errors.Is(err, registry.ErrClosed) {
		t.Fatalf("Watch after Close: %v", err)
	}
}
