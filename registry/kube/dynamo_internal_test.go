package kube

import (
	"context"
	"encoding/json"
	"fmt"
	"log/slog"
	"strings"
	"sync/atomic"
	"testing"
	"time"

	"github.com/beaconplane/beacon"
	"github.com/beaconplane/beacon/dynamo"
	"k8s.io/apimachinery/pkg/apis/meta/v1/unstructured"
)

// dwm returns a DynamoWorkerMetadata as the API server gives it (spec.data
// decoded into unstructured values; "-": no spec), owned by pod p1.
func dwm(t *testing.T, data string) *unstructured.Unstructured {
	t.Helper()
	return dwmOwned(t, data, nil)
}

// dwmOwned is dwm with other ownerReferences (nil: pod p1).
func dwmOwned(t *testing.T, data string, owners []map[string]any) *unstructured.Unstructured {
	t.Helper()
	if owners == nil {
		owners = []map[string]any{{"apiVersion": "v1", "kind": "Pod", "name": "p1", "uid": "uid-1"}}
	}
	obj := map[string]any{
		"apiVersion": "nvidia.com/v1alpha1", "kind": "DynamoWorkerMetadata",
		"metadata": map[string]any{"name": "p1", "namespace": "dyn", "uid": "obj-1", "resourceVersion": "7",
			"creationTimestamp": "2026-01-02T03:04:05Z", "ownerReferences": toAny(owners)},
	}
	if data != "-" {
		var d any
		if err := json.Unmarshal([]byte(data), &d); err != nil {
			t.Fatal(err)
		}
		obj["spec"] = map[string]any{"data": d}
	}
	// Through JSON, as the dynamic client decodes it (numbers as int64).
	b, _ := json.Marshal(obj)
	u := &unstructured.Unstructured{}
	if err := u.UnmarshalJSON(b); err != nil {
		t.Fatal(err)
	}
	return u
}

func toAny(owners []map[string]any) []any {
	out := make([]any, len(owners))
	for i, o := range owners {
		out[i] = o
	}
	return out
}

const goodEndpoint = `"dyn/backend/generate/2a":{"type":"Endpoint","namespace":"dyn","component":"backend","endpoint":"generate",
	"instance_id":42,"transport":{"tcp":"10.0.0.5:9999/generate"},"device_type":null,"request_plane_codec":"msgpack"}`

// A DynamoWorkerMetadata as the runtime writes it becomes the instances
// the store side decodes from the same entries, with its model cards
// joined, its creation time as the registration time, and where it was
// read (object, pod); event channels are not instances.
func TestDecodeDynamo(t *testing.T) {
	u := dwm(t, `{"endpoints":{`+goodEndpoint+`},
		"model_cards":{"dyn/backend/generate/2a":{"type":"Model","namespace":"dyn","component":"backend","endpoint":"generate",
			"instance_id":42,"card_json":{"display_name":"Qwen/Qwen3-0.6B"},"model_suffix":null}},
		"event_channels":{"dyn/backend/kv-events/2a":{"type":"EventChannel","topic":"kv-events","instance_id":42}}}`)
	s, skipped, err := decodeDynamo(u, 0, nil)
	if err != nil || len(skipped) != 0 {
		t.Fatalf("decodeDynamo: %v, skipped %v", err, skipped)
	}
	want, err := dynamo.Decode("v1/instances/dyn/backend/generate/2a", []byte(`{"type":"Endpoint","namespace":"dyn",
		"component":"backend","endpoint":"generate","instance_id":42,"transport":{"tcp":"10.0.0.5:9999/generate"},
		"device_type":null,"request_plane_codec":"msgpack"}`))
	if err != nil {
		t.Fatal(err)
	}
	w := want.Instance
	w.RegisteredAt = time.Date(2026, 1, 2, 3, 4, 5, 0, time.UTC)
	w.Metadata[dynamo.MetaModels] = "Qwen/Qwen3-0.6B"
	w.Metadata[MetaObject] = "dyn/p1"
	w.Metadata[MetaPod] = "dyn/p1"
	if len(s.instances) != 1 || !s.instances[0].Equal(w) {
		t.Fatalf("instances %+v\nwant %+v", s.instances, w)
	}
	if s.pod != podKey("dyn", "uid-1") || s.podName != "p1" || s.key != "dyn/p1" || s.rv != 7 {
		t.Fatalf("set %+v", s)
	}
	if w.ID != "000000000000002a" || w.Metadata[dynamo.MetaInstanceID] != "42" {
		t.Fatalf("ID %s, instance_id %s", w.ID, w.Metadata[dynamo.MetaInstanceID])
	}
	for key, want := range map[string]string{
		"v1/instances/dyn/c/e/2a": `spec.data.endpoints["dyn/c/e/2a"]`,
		"v1/mdc/dyn/c/e/2a/lora":  `spec.data.model_cards["dyn/c/e/2a/lora"]`,
		"elsewhere":               "elsewhere",
	} {
		if got := entryPath(key); got != want {
			t.Errorf("entryPath(%q) = %s, want %s", key, got, want)
		}
	}
}

// Collisions are remembered up to a bound, then all forgotten.
func TestCollisionsBounded(t *testing.T) {
	var c collisions
	for i := range maxCollisions {
		if !c.first(fmt.Sprint(i), "a@1") {
			t.Fatalf("collision %d not new", i)
		}
	}
	if c.first("0", "a@1") {
		t.Fatal("a remembered collision reported again")
	}
	c.first("new", "a@1")
	if !c.first("0", "a@1") || len(c.seen) != 2 {
		t.Fatalf("past the bound, %d remembered", len(c.seen))
	}
}

// An object nothing of which can be served is an error (its last valid
// content is kept by parseSet): no Pod owner, or several; no spec.data;
// spec.data or one of its maps not an object.
func TestDecodeDynamoInvalidObject(t *testing.T) {
	pod := func(name, uid string) map[string]any {
		return map[string]any{"apiVersion": "v1", "kind": "Pod", "name": name, "uid": uid}
	}
	for _, tc := range []struct {
		name   string
		u      *unstructured.Unstructured
		saying string
	}{
		{"no owner", dwmOwned(t, `{}`, []map[string]any{}), "no ownerReference to its Pod"},
		{"owned by a ReplicaSet", dwmOwned(t, `{}`, []map[string]any{{"apiVersion": "apps/v1", "kind": "ReplicaSet", "name": "r", "uid": "u"}}),
			"no ownerReference to its Pod"},
		{"two pods", dwmOwned(t, `{}`, []map[string]any{pod("a", "u1"), pod("b", "u2")}), "name 2 pods"},
		{"no spec", dwm(t, "-"), "spec.data is missing or null"},
		{"null data", dwm(t, `null`), "spec.data is missing or null"},
		{"data a string", dwm(t, `"x"`), "spec.data is a string, not an object"},
		{"endpoints a list", dwm(t, `{"endpoints":[]}`), "spec.data.endpoints is a []interface {}, not an object"},
		{"model_cards a number", dwm(t, `{"model_cards":3}`), "spec.data.model_cards is a int64, not an object"},
	} {
		s, _, err := decodeDynamo(tc.u, 0, nil)
		if err == nil || s != nil || !strings.Contains(err.Error(), tc.saying) {
			t.Errorf("%s: %v, %v; want an error saying %q", tc.name, s, err, tc.saying)
		}
	}
	// Absent and null maps hold nothing.
	if s, skipped, err := decodeDynamo(dwm(t, `{"endpoints":null}`), 0, nil); err != nil || len(skipped) > 0 || len(s.instances) != 0 {
		t.Fatalf("null endpoints: %v, %v, %v", s, skipped, err)
	}
}

// Each entry Beacon cannot serve is skipped with its place in the object
// and what was wrong; the rest is served.
func TestDecodeDynamoBadEntries(t *testing.T) {
	u := dwm(t, `{"endpoints":{`+goodEndpoint+`,
		"dyn/backend/generate/2b":"not an object",
		"dyn/backend/generate/2c":{"type":"Teapot"},
		"dyn/backend/generate":{"type":"Endpoint"},
		"dyn/backend/generate/2d":{"type":"Endpoint","namespace":"dyn","component":"backend","endpoint":"generate","instance_id":-45,"transport":{"tcp":"h:1/x"}},
		"dyn/backend/generate/2e":{"type":"Endpoint","namespace":"dyn","component":"backend","endpoint":"generate","instance_id":47,"transport":{"tcp":"h:1/x"}},
		"dyn/backend/generate/2f":{"type":"Model","namespace":"dyn","component":"backend","endpoint":"generate","instance_id":47,"card_json":{"display_name":"m"}}},
		"model_cards":{"dyn/backend/generate/2a":{"type":"Model","card_json":{}}}}`)
	s, skipped, err := decodeDynamo(u, 0, nil)
	if err != nil {
		t.Fatal(err)
	}
	if len(s.instances) != 1 || s.instances[0].ID != "000000000000002a" || s.instances[0].Metadata[dynamo.MetaModels] != "" {
		t.Fatalf("instances %+v", s.instances)
	}
	for _, want := range []string{
		`spec.data.endpoints["dyn/backend/generate/2b"]: dynamo: entry "v1/instances/dyn/backend/generate/2b": value is not a JSON object`,
		`spec.data.endpoints["dyn/backend/generate/2c"]: dynamo: entry "v1/instances/dyn/backend/generate/2c": has unknown type "Teapot"`,
		`spec.data.endpoints["dyn/backend/generate"]: dynamo: entry "v1/instances/dyn/backend/generate": has 3 segments`,
		`spec.data.endpoints["dyn/backend/generate/2d"]: dynamo: entry "v1/instances/dyn/backend/generate/2d": value's instance_id -45 is negative`,
		`spec.data.endpoints["dyn/backend/generate/2e"]: dynamo: entry "v1/instances/dyn/backend/generate/2e": value's instance_id 47 is not the key's 2e`,
		`spec.data.endpoints["dyn/backend/generate/2f"]: dynamo: entry "v1/instances/dyn/backend/generate/2f": holds a value of type "Model"`,
		`spec.data.model_cards["dyn/backend/generate/2a"]: dynamo: entry "v1/mdc/dyn/backend/generate/2a": value has no "namespace"`,
	} {
		if !containsErr(skipped, want) {
			t.Errorf("no skipped entry saying %q in\n%v", want, skipped)
		}
	}
	if len(skipped) != 7 {
		t.Errorf("%d skipped, want 7: %v", len(skipped), skipped)
	}
}

func containsErr(errs []error, want string) bool {
	for _, e := range errs {
		if strings.Contains(e.Error(), want) {
			return true
		}
	}
	return false
}

// A key whose entry turns malformed keeps the entry the object's last
// valid content held there (as the store side keeps a key's last valid
// value); a new malformed key offers nothing.
func TestDecodeDynamoKeepsLastValidEntry(t *testing.T) {
	last, _, err := decodeDynamo(dwm(t, `{"endpoints":{`+goodEndpoint+`}}`), 0, nil)
	if err != nil {
		t.Fatal(err)
	}
	s, skipped, err := decodeDynamo(dwm(t, `{"endpoints":{"dyn/backend/generate/2a":{"type":"Endpoint"},
		"dyn/backend/generate/2b":{"type":"Endpoint"}}}`), 0, last)
	if err != nil || len(skipped) != 2 {
		t.Fatalf("decodeDynamo: %v, skipped %v", err, skipped)
	}
	if len(s.instances) != 1 || !s.instances[0].Equal(last.instances[0]) {
		t.Fatalf("instances %+v, want the last valid one %+v", s.instances, last.instances)
	}
}

// Two instance entries of one object that map to one Beacon ID (a padded
// and an unpadded ID) are both skipped, in one report naming both.
func TestDecodeDynamoCollision(t *testing.T) {
	padded := strings.Replace(strings.Replace(goodEndpoint, "generate/2a", "generate/000000000000002a", 1), "10.0.0.5", "10.0.0.6", 1)
	other := strings.Replace(strings.Replace(goodEndpoint, "generate/2a", "generate/2b", 1), `"instance_id":42`, `"instance_id":43`, 1)
	s, skipped, err := decodeDynamo(dwm(t, `{"endpoints":{`+goodEndpoint+`,`+padded+`,`+other+`}}`), 0, nil)
	if err != nil {
		t.Fatal(err)
	}
	if len(s.instances) != 1 || s.instances[0].ID != "000000000000002b" {
		t.Fatalf("instances %+v, want only 2b", s.instances)
	}
	want := `spec.data.endpoints["dyn/backend/generate/000000000000002a"], spec.data.endpoints["dyn/backend/generate/2a"] ` +
		`all map to the instance dyn/backend/generate/000000000000002a`
	if len(skipped) != 1 || !strings.Contains(skipped[0].Error(), want) {
		t.Fatalf("skipped %v, want one saying %q", skipped, want)
	}
}

// Dynamo's names (underscores, dotted namespaces) are served.
func TestDecodeDynamoNames(t *testing.T) {
	e := `"dyn.prod/backend_x/clear_kv_blocks/2a":{"type":"Endpoint","namespace":"dyn.prod","component":"backend_x",
		"endpoint":"clear_kv_blocks","instance_id":42,"transport":{"nats_tcp":"dyn_prod.backend_x.clear_kv_blocks-2a"}}`
	s, skipped, err := decodeDynamo(dwm(t, `{"endpoints":{`+e+`}}`), 0, nil)
	if err != nil || len(skipped) != 0 || len(s.instances) != 1 {
		t.Fatalf("%v, %v, %v", s, skipped, err)
	}
	if got := s.instances[0].Ref(); got != (beacon.Ref{Namespace: "dyn.prod", Component: "backend_x", Endpoint: "clear_kv_blocks", ID: "000000000000002a"}) {
		t.Fatalf("ref %v", got)
	}
}

// resolve: InstanceSets held twice serve the older one's instance; the
// dynamo layout serves none and reports each holder once per collision
// (the same objects at the same versions), again when one is rewritten.
func TestResolve(t *testing.T) {
	logs := &countLogs{}
	m, _ := newMetrics(nil)
	r := &Registry{kind: dynamoObjects, log: slog.New(logs), m: m}
	t0 := time.Now()
	a := &setInfo{key: "ns/a", rv: 1, created: t0.Add(time.Second)}
	b := &setInfo{key: "ns/b", rv: 1, created: t0}
	in := func(addr string) beacon.Instance {
		return beacon.Instance{Namespace: "n", Component: "c", Endpoint: "e", ID: "000000000000002a", Address: addr,
			Metadata: map[string]string{dynamo.MetaKey: "v1/instances/n/c/e/2a"}}
	}
	cands := func() []candidate { return []candidate{{inst: in("a:1"), set: a}, {inst: in("b:1"), set: b}} }
	if c, ok := r.resolve("k", cands()[:1]); !ok || c.set != a {
		t.Fatalf("one holder: %v, %v", c, ok)
	}
	if _, ok := r.resolve("k", nil); ok {
		t.Fatal("no holder served something")
	}
	for range 3 {
		if c, ok := r.resolve("k", cands()); ok {
			t.Fatalf("dynamo collision served %v", c)
		}
	}
	if n := logs.n.Load(); n != 2 {
		t.Fatalf("%d reports of one collision of two objects, want 2", n)
	}
	a.rv = 2
	r.resolve("k", cands())
	if n := logs.n.Load(); n != 4 {
		t.Fatalf("%d reports after a holder was rewritten, want 4", n)
	}
	r.kind = instanceSets
	if c, ok := r.resolve("k", cands()); !ok || c.set != b {
		t.Fatalf("InstanceSets: %v, %v; want the older set's", c, ok)
	}
}

type countLogs struct{ n atomic.Int64 }

func (h *countLogs) Enabled(context.Context, slog.Level) bool { return true }
func (h *countLogs) Handle(_ context.Context, rec slog.Record) error {
	h.n.Add(1)
	return nil
}
func (h *countLogs) WithAttrs([]slog.Attr) slog.Handler { return h }
func (h *countLogs) WithGroup(string) slog.Handler      { return h }
