package main

import (
	"crypto/rand"
	"encoding/hex"
	"encoding/json"
	"fmt"
	"path/filepath"
	"strings"
	"testing"

	"github.com/beaconplane/beacon/dynamo"
	"github.com/beaconplane/beacon/internal/testkit/dynamotest"
	"github.com/beaconplane/beacon/internal/testkit/kubetest"
	"github.com/beaconplane/beacon/registry/kube"
	corev1 "k8s.io/api/core/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/apis/meta/v1/unstructured"
)

// dynamoCluster is a control plane with Dynamo's CRD, and a namespace
// whose only Service is labelled as Dynamo's operator labels them,
// selecting every test pod: a pod's readiness there is the Dynamo slice's.
type dynamoCluster struct {
	cp *kubetest.ControlPlane
	ns string
}

func newDynamoCluster(t *testing.T) *dynamoCluster {
	t.Helper()
	cp := kubetest.New(t, kubetest.Options{})
	if err := cp.InstallCRDFile(kubetest.Ctx(t), filepath.Join("..", "..", "registry", "kube", "testdata", "nvidia.com_dynamoworkermetadatas.yaml")); err != nil {
		t.Fatal(err)
	}
	var b [4]byte
	_, _ = rand.Read(b[:])
	c := &dynamoCluster{cp: cp, ns: "dyn-" + hex.EncodeToString(b[:])}
	ctx := kubetest.Ctx(t)
	if _, err := cp.Core.Namespaces().Create(ctx, &corev1.Namespace{ObjectMeta: metav1.ObjectMeta{Name: c.ns}}, metav1.CreateOptions{}); err != nil {
		t.Fatal(err)
	}
	_, err := cp.Core.Services(c.ns).Create(ctx, &corev1.Service{
		ObjectMeta: metav1.ObjectMeta{Name: "vllm-worker", Labels: map[string]string{
			kube.DynamoBackendLabel: kube.DynamoBackendLabelValue, kube.DynamoEnabledLabel: kube.DynamoEnabledLabelValue}},
		Spec: corev1.ServiceSpec{ClusterIP: corev1.ClusterIPNone, Selector: map[string]string{kubetest.PodLabel: "true"},
			Ports: []corev1.ServicePort{{Name: "system", Port: 9090}}},
	}, metav1.CreateOptions{})
	if err != nil {
		t.Fatal(err)
	}
	return c
}

// write applies the DynamoWorkerMetadata ns/name as the runtime of the
// pod ownerName (UID ownerUID) writes it, its spec.data holding the
// endpoint instance id of dynamo/backend/generate and, with a model, its
// card; finalizers, when given, hold it past its deletion.
func (c *dynamoCluster) write(t *testing.T, ns, name, ownerName, ownerUID string, id uint64, model string, finalizers ...string) {
	t.Helper()
	key := fmt.Sprintf("dynamo/backend/generate/%x", id)
	var ep, card map[string]any
	if err := json.Unmarshal([]byte(dynamotest.EndpointValue("dynamo", "backend", "generate", id,
		dynamotest.TCP("10.244.0.5:9999", "generate"))), &ep); err != nil {
		t.Fatal(err)
	}
	data := map[string]any{"endpoints": map[string]any{key: ep}}
	if model != "" {
		if err := json.Unmarshal([]byte(dynamotest.ModelValue("dynamo", "backend", "generate", id, model, "")), &card); err != nil {
			t.Fatal(err)
		}
		data["model_cards"] = map[string]any{key: card}
	}
	meta := map[string]any{"name": name, "namespace": ns, "ownerReferences": []any{map[string]any{
		"apiVersion": "v1", "kind": "Pod", "name": ownerName, "uid": ownerUID, "controller": false, "blockOwnerDeletion": false}}}
	if len(finalizers) > 0 {
		meta["finalizers"] = finalizers
	}
	obj := &unstructured.Unstructured{Object: map[string]any{
		"apiVersion": kube.DynamoGroup + "/" + kube.DynamoVersion, "kind": kube.DynamoKind, "metadata": meta,
		"spec": map[string]any{"data": data}}}
	if _, err := c.cp.Dynamic.Resource(kube.DynamoGVR).Namespace(ns).Apply(kubetest.Ctx(t), name, obj,
		metav1.ApplyOptions{FieldManager: "dynamo-worker", Force: true}); err != nil {
		t.Fatalf("apply DynamoWorkerMetadata %s/%s: %v", ns, name, err)
	}
}

// worker writes the resource of pod as its runtime does: named after it,
// owned by it.
func (c *dynamoCluster) worker(t *testing.T, pod *corev1.Pod, id uint64, model string) {
	t.Helper()
	c.write(t, pod.Namespace, pod.Name, pod.Name, string(pod.UID), id, model)
}

// explained is the output of `beacon dynamo explain -o json`.
type explained struct {
	Seen    bool           `json:"seen"`
	Verdict string         `json:"verdict"`
	Models  []string       `json:"models"`
	Checks  []dynamo.Check `json:"checks"`
}

func (x explained) verdicts() string {
	var parts []string
	for _, c := range x.Checks {
		parts = append(parts, c.Check+"="+string(c.Verdict))
	}
	return strings.Join(parts, " ")
}

// TestDynamoExplainKubernetes runs beacon dynamo explain --backend
// kubernetes against a real control plane holding what Dynamo's worker
// pods write (no Dynamo process runs): a Ready pod's instance is seen,
// every check ok; a pod in no EndpointSlice, one listed only in a slice
// without Dynamo's labels, one listed not Ready, a resource whose pod is
// gone, an unknown instance and one instance in two resources each fail
// saying why and what to do, exit 1.
func TestDynamoExplainKubernetes(t *testing.T) {
	c := newDynamoCluster(t)
	cp := c.cp
	plainNS := cp.Namespace(t) // its Service has Beacon's label, not Dynamo's
	kc := filepath.Join(t.TempDir(), "kubeconfig")
	if err := kubetest.WriteKubeconfig(kc, cp.Admin(), c.ns); err != nil {
		t.Fatal(err)
	}
	c.worker(t, cp.ReadyPod(t, c.ns, "ready"), 0x1d4c3b2a190817, "Qwen/Qwen3-0.6B")
	c.worker(t, cp.Pod(t, c.ns, "no-ip"), 0x21, "")
	c.worker(t, cp.ReadyPod(t, plainNS, "plain"), 0x22, "")
	unready := cp.ReadyPod(t, c.ns, "unready")
	c.worker(t, unready, 0x23, "")
	cp.SetReady(t, unready, false)
	cp.WaitEndpoint(t, unready, false)
	// The owner is gone: the garbage collector deletes the resource, which
	// a finalizer holds (as one whose collector is late).
	c.write(t, c.ns, "gone", "gone", "0f0f0f0f-0000-0000-0000-000000000000", 0x24, "", "beacon.test/hold")
	c.worker(t, cp.ReadyPod(t, c.ns, "twin-0"), 0x25, "")
	c.worker(t, cp.ReadyPod(t, c.ns, "twin-1"), 0x25, "")

	explain := func(t *testing.T, id string, env ...string) (explained, *child) {
		t.Helper()
		b := runBeacon(t, append([]string{"KUBECONFIG=" + kc}, env...), "dynamo", "explain", "dynamo/backend/generate/"+id,
			"--kube-namespaces", c.ns+","+plainNS, "--command-timeout", "30s", "-o", "json")
		var x explained
		if err := json.Unmarshal([]byte(b.out()), &x); err != nil {
			t.Fatalf("explain %s: %v: %s%s", id, err, b.out(), b.errOut())
		}
		return x, b
	}
	t.Run("ready", func(t *testing.T) {
		x, b := explain(t, "1d4c3b2a190817", "BEACON_DISCOVERY_BACKEND=kubernetes")
		if b.exitCode() != 0 || !x.Seen || x.verdicts() != "key=ok value=ok pod=ok readiness=ok name=ok model card=ok" ||
			!strings.Contains(x.Verdict, "route Qwen/Qwen3-0.6B requests to it") {
			t.Fatalf("explain of a Ready pod's instance: %d %+v\n%s", b.exitCode(), x, b.errOut())
		}
		text := runBeacon(t, []string{"KUBECONFIG=" + kc, "DYN_DISCOVERY_BACKEND=kubernetes"}, "dynamo", "explain",
			"dynamo/backend/generate/1d4c3b2a190817", "--command-timeout", "30s")
		if text.exitCode() != 0 || !hasRow(text.out(), "ok", "readiness", "pod", c.ns+"/ready", "is", "Ready", "in") ||
			!strings.Contains(text.out(), "DynamoWorkerMetadata "+c.ns+"/ready spec.data.endpoints") {
			t.Fatalf("explain (text, the kubeconfig's namespace): %d\n%s%s", text.exitCode(), text.out(), text.errOut())
		}
		t.Logf("beacon dynamo explain --backend kubernetes:\n%s", text.out())
	})
	for _, tc := range []struct {
		name, id, want string
		mentions       []string
	}{
		{"in no slice", "21", "key=ok value=ok pod=ok readiness=fail name=ok model card=warn", []string{
			"/no-ip is in no EndpointSlice — create a Service whose selector matches the pod's labels, labelled " +
				"nvidia.com/dynamo-discovery-backend=kubernetes nvidia.com/dynamo-discovery-enabled=true"}},
		{"only in a slice without Dynamo's labels", "22", "key=ok value=ok pod=ok readiness=fail name=ok model card=warn", []string{
			"(Service \"" + kubetest.ServiceName + "\"), which lacks the labels nvidia.com/dynamo-discovery-backend=kubernetes " +
				"nvidia.com/dynamo-discovery-enabled=true — label the Service"}},
		{"not Ready in the slice", "23", "key=ok value=ok pod=ok readiness=fail name=ok model card=warn", []string{
			"/unready is not Ready in " + c.ns + "/vllm-worker-", "(ready=false, serving=false, terminating=false)"}},
		{"its pod gone", "24", "key=ok value=ok pod=fail name=ok model card=warn", []string{
			"pod " + c.ns + "/gone (UID 0f0f0f0f-0000-0000-0000-000000000000), the resource's owner, does not exist",
			"the garbage collector (in kube-controller-manager) deletes a resource whose owner pod is gone",
			"kubectl delete dynamoworkermetadata -n " + c.ns + " gone)"}},
		{"unknown", "26", "key=fail name=ok model card=warn", []string{
			`no spec.data.endpoints["dynamo/backend/generate/26"] of any DynamoWorkerMetadata in namespaces`,
			"DYN_DISCOVERY_BACKEND=kubernetes"}},
		{"in two resources", "25", "key=fail key=ok value=ok pod=ok readiness=ok key=ok value=ok pod=ok readiness=ok name=ok model card=warn", []string{
			"2 resources hold this instance: " + c.ns + "/twin-0, " + c.ns + "/twin-1, alive in more than one",
			"two workers have one instance ID", "delete the stale ones among " + c.ns + "/twin-0, " + c.ns + "/twin-1"}},
	} {
		t.Run(tc.name, func(t *testing.T) {
			x, b := explain(t, tc.id, "DYN_DISCOVERY_BACKEND=kubernetes")
			all := ""
			for _, c := range x.Checks {
				all += c.Found + " — " + c.Do + "\n"
			}
			if b.exitCode() != exitFailure || x.Seen || x.verdicts() != tc.want || !containsAll(all, tc.mentions...) ||
				!strings.Contains(b.errOut(), "a Dynamo frontend would not see") {
				t.Fatalf("explain %s: exit %d, %s\n%s%s\nwant exit %d, %s, mentioning %q", tc.id, b.exitCode(), x.verdicts(), all,
					b.errOut(), exitFailure, tc.want, tc.mentions)
			}
		})
	}
	checkBadInputEnv(t, []string{"KUBECONFIG=" + kc}, []badInput{
		{args: []string{"dynamo", "explain", "dynamo/backend/generate/2a", "--backend", "memory"}, want: "holds no Dynamo registrations"},
		{args: []string{"dynamo", "explain", "dynamo/backend/generate/2a", "--backend", "kubernetes", "--kube-namespaces", "*,x"},
			want: `"*" means every namespace`},
	})
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
