package kube_test

import (
	"errors"
	"strings"
	"testing"

	"github.com/beaconplane/beacon"
	"github.com/beaconplane/beacon/dynamo"
	"github.com/beaconplane/beacon/internal/testkit/kubetest"
	"github.com/beaconplane/beacon/registry"
	"github.com/beaconplane/beacon/registry/kube"
	rbacv1 "k8s.io/api/rbac/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/types"
)

// held applies a DynamoWorkerMetadata that a finalizer keeps past its
// deletion (the garbage collector deletes it: its owner is not there),
// released when the test ends.
func (e *dynamoEnv) held(t *testing.T, name string, owners []any, data map[string]any) {
	t.Helper()
	e.apply(t, name, owners, map[string]any{"data": data}, "beacon.test/hold")
	t.Cleanup(func() {
		_, _ = e.cp.Dynamic.Resource(kube.DynamoGVR).Namespace(e.ns).Patch(kubetest.Ctx(t), name, types.MergePatchType,
			[]byte(`{"metadata":{"finalizers":null}}`), metav1.PatchOptions{})
	})
}

func checkVerdicts(x dynamo.Explanation) (string, string) {
	var parts []string
	all := ""
	for _, c := range x.Checks {
		parts = append(parts, c.Check+"="+string(c.Verdict))
		all += c.Found + " — " + c.Do + "\n"
	}
	return strings.Join(parts, " "), all
}

// Dynamo.Explain checks each resource holding an instance with its pod in
// place of etcd's lease, and agrees with what the registry serves (Get):
// a resource owned by a former pod of that name, or by no pod, is not
// seen; of two resources holding one instance, the one whose pod is Ready
// is, the other called stale; a reader with only the shipped Role (no get
// on pods) is told it cannot check the pod, and readiness decides.
func TestDynamoExplain(t *testing.T) {
	e := newDynamoEnv(t, nil)
	ctx := kubetest.Ctx(t)
	pod := e.cp.ReadyPod(t, e.ns, "w")
	ready := worker{ns: "dynamo", comp: "backend", ep: "generate", id: 0x71, tcp: "10.244.7.1:9999/generate", model: "Qwen/Qwen3-0.6B"}
	e.write(t, pod, metadata(ready))
	former := worker{ns: "dynamo", comp: "backend", ep: "generate", id: 0x72, tcp: "10.244.7.2:9999/generate"}
	e.held(t, "w-former", []any{owner(pod.Name, "0f0f0f0f-0000-0000-0000-000000000000")}, metadata(former))
	// Deleted, as the garbage collector deletes it: its finalizer holds it.
	if err := e.cp.Dynamic.Resource(kube.DynamoGVR).Namespace(e.ns).Delete(ctx, "w-former", metav1.DeleteOptions{}); err != nil {
		t.Fatal(err)
	}
	ownerless := worker{ns: "dynamo", comp: "backend", ep: "generate", id: 0x73, tcp: "10.244.7.3:9999/generate"}
	e.apply(t, "ownerless", []any{}, map[string]any{"data": metadata(ownerless)})
	stale := ready
	stale.model = "" // its card is not the one counted
	e.held(t, "w-stale", []any{owner("w-old", "0e0e0e0e-0000-0000-0000-000000000000")}, metadata(stale))

	var role rbacv1.Role
	shippedNamed(t, "rbac-dynamo.yaml", "Role", "beacon-dynamo-reader", &role)
	reader := openDynamo(t, e.cp, e.ns, func(c *kube.Config) { c.REST = e.cp.ServiceAccount(t, e.ns, "dyn-reader", role.Rules) })
	for _, tc := range []struct {
		name     string
		d        *kube.Dynamo
		w        worker
		want     string
		mentions []string
	}{
		{"a former pod's", e.d, former, "key=ok value=ok pod=fail name=ok model card=warn", []string{
			"pod " + e.ns + "/w is another pod (UID " + string(pod.UID) + ") than the resource's owner (UID 0f0f0f0f-",
			"; the resource is being deleted (since ", "held by its finalizers beacon.test/hold", "the garbage collector deletes it"}},
		{"no owner", e.d, ownerless, "key=ok value=ok pod=fail name=ok model card=warn", []string{
			"no ownerReference to its Pod", "something else wrote this one"}},
		{"one of two alive", e.d, ready,
			"key=warn key=ok value=ok pod=ok readiness=ok key=ok value=ok pod=fail name=ok model card=ok", []string{
				"2 resources hold this instance: " + e.ns + "/w, " + e.ns + "/w-stale; frontends see " + e.ns + "/w's, the only one alive",
				"delete the stale resource " + e.ns + "/w-stale (kubectl delete dynamoworkermetadata -n " + e.ns + " w-stale)", "Qwen/Qwen3-0.6B (DynamoWorkerMetadata " + e.ns + "/w "}},
		{"no right to get pods", reader, ready,
			"key=warn key=ok value=ok pod=warn readiness=ok key=ok value=ok pod=warn readiness=fail name=ok model card=ok", []string{
				"cannot tell whether it exists", "get pods", "grant get on pods"}},
	} {
		t.Run(tc.name, func(t *testing.T) {
			x, err := tc.d.Explain(ctx, tc.w.ref())
			if err != nil {
				t.Fatal(err)
			}
			got, all := checkVerdicts(x)
			if got != tc.want || !containsAll(all, tc.mentions...) {
				t.Fatalf("Explain(%s): %s\n%s\nwant %s, mentioning %q", tc.w.ref(), got, all, tc.want, tc.mentions)
			}
			_, err = tc.d.Get(ctx, tc.w.ref())
			if served := err == nil; served != x.Seen {
				t.Fatalf("Explain says seen=%v, Get says %v", x.Seen, err)
			}
		})
	}

	var isReader rbacv1.Role
	shippedNamed(t, "rbac.yaml", "Role", "beacon-discovery-reader", &isReader)
	rc := e.cp.ServiceAccount(t, e.ns, "is-reader", isReader.Rules)
	_, err := openDynamo(t, e.cp, e.ns, func(c *kube.Config) { c.REST = rc }).Explain(ctx, ready.ref())
	if !errors.Is(err, kube.ErrForbidden) || !strings.Contains(err.Error(), "rbac-dynamo.yaml") {
		t.Fatalf("Explain with Beacon's InstanceSet reader Role: %v", err)
	}
	if err := e.d.Close(); err != nil {
		t.Fatal(err)
	}
	if _, err := e.d.Explain(ctx, ready.ref()); !errors.Is(err, registry.ErrClosed) {
		t.Fatalf("Explain after Close: %v", err)
	}
	if _, err := reader.Explain(ctx, beacon.Ref{Namespace: "dynamo", Component: "backend", Endpoint: "generate", ID: "2a"}); !errors.Is(err, beacon.ErrInvalid) {
		t.Fatalf("Explain of an invalid ref: %v", err)
	}
}

// containsAll reports whether s contains every one of subs.
func containsAll(s string, subs ...string) bool {
	for _, sub := range subs {
		if !strings.Contains(s, sub) {
			return false
		}
	}
	return true
}
