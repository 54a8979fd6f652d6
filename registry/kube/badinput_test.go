package kube_test

import (
	"cmp"
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"math"
	"net"
	"os"
	"path/filepath"
	"strings"
	"testing"
	"time"

	"github.com/beaconplane/beacon"
	"github.com/beaconplane/beacon/internal/testkit/kubetest"
	"github.com/beaconplane/beacon/registry/kube"
	"github.com/beaconplane/beacon/registry/registrytest"
	"github.com/prometheus/client_golang/prometheus"
	"github.com/prometheus/client_golang/prometheus/testutil"
	corev1 "k8s.io/api/core/v1"
	apiextensionsv1 "k8s.io/apiextensions-apiserver/pkg/apis/apiextensions/v1"
	apierrors "k8s.io/apimachinery/pkg/api/errors"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/apis/meta/v1/unstructured"
	"k8s.io/apimachinery/pkg/types"
	"k8s.io/client-go/rest"
)

// A cluster without the CRD: Open says so and names the kubectl apply to
// run; once it is installed, Open works.
func TestCRDNotInstalled(t *testing.T) {
	cp := kubetest.New(t, kubetest.Options{NoCRD: true, NoControllers: true})
	_, err := kube.Open(kubetest.Ctx(t), kube.Config{REST: cp.Admin()})
	if !errors.Is(err, kube.ErrCRDNotInstalled) || !strings.Contains(err.Error(), "kubectl apply -f deploy/kubernetes/crd.yaml") {
		t.Fatalf("Open without the CRD: %v", err)
	}
	t.Log(err)
	ctx := kubetest.Ctx(t)
	crds := cp.Extension.CustomResourceDefinitions()

	// A CRD of another version: installed, but not Beacon's.
	other := kube.CRD()
	other.Spec.Versions[0].Name = "v1beta1"
	if _, err := crds.Create(ctx, other, metav1.CreateOptions{}); err != nil {
		t.Fatal(err)
	}
	waitCRD(t, cp, kubetest.Established)
	_, err = kube.Open(ctx, kube.Config{REST: cp.Admin()})
	if !errors.Is(err, kube.ErrCRDMismatch) || !strings.Contains(err.Error(), "v1beta1") ||
		!strings.Contains(err.Error(), "kubectl apply -f deploy/kubernetes/crd.yaml") {
		t.Fatalf("Open with a CRD of version v1beta1: %v", err)
	}
	t.Log(err)
	if err := crds.Delete(ctx, kube.CRDName, metav1.DeleteOptions{}); err != nil {
		t.Fatal(err)
	}
	waitCRD(t, cp, func(c *apiextensionsv1.CustomResourceDefinition) bool { return c == nil })

	// An older schema without a field Beacon writes: readers work, a
	// registration says the CRD is not this Beacon's.
	old := kube.CRD()
	delete(old.Spec.Versions[0].Schema.OpenAPIV3Schema.Properties["spec"].Properties, "holder")
	if _, err := crds.Create(ctx, old, metav1.CreateOptions{}); err != nil {
		t.Fatal(err)
	}
	waitCRD(t, cp, kubetest.Established)
	ns := cp.Namespace(t)
	pod := cp.SetReady(t, cp.Pod(t, ns, "w"), true)
	r := cp.Registry(t, ns, pod, nil)
	if _, _, err := r.List(ctx, beacon.Query{}); err != nil {
		t.Fatalf("List with the older schema: %v", err)
	}
	_, err = r.Register(ctx, inst("10.12.0.1:80"))
	if !errors.Is(err, kube.ErrCRDMismatch) || !strings.Contains(err.Error(), "holder") {
		t.Fatalf("Register with a schema without spec.holder: %v", err)
	}
	t.Log(err)

	// Beacon's own CRD over it: registering works.
	cur, err := crds.Get(ctx, kube.CRDName, metav1.GetOptions{})
	if err != nil {
		t.Fatal(err)
	}
	cur.Spec = kube.CRD().Spec
	if _, err := crds.Update(ctx, cur, metav1.UpdateOptions{}); err != nil {
		t.Fatal(err)
	}
	for { // until the API server applies with the new schema
		_, err := r.Register(ctx, inst("10.12.0.1:80"))
		if err == nil {
			break
		}
		if !errors.Is(err, kube.ErrCRDMismatch) || ctx.Err() != nil {
			t.Fatalf("Register after installing Beacon's CRD: %v", err)
		}
	}
}

// waitCRD waits until the InstanceSet CRD (nil once deleted) satisfies ok.
func waitCRD(t *testing.T, cp *kubetest.ControlPlane, ok func(*apiextensionsv1.CustomResourceDefinition) bool) {
	t.Helper()
	waitCRDNamed(t, cp, kube.CRDName, ok)
}

// waitCRDNamed waits until the CRD name (nil once deleted) satisfies ok,
// and the API server's discovery agrees (kubetest.WaitCRD).
func waitCRDNamed(t *testing.T, cp *kubetest.ControlPlane, name string, ok func(*apiextensionsv1.CustomResourceDefinition) bool) {
	t.Helper()
	if err := cp.WaitCRD(kubetest.Ctx(t), name, ok); err != nil {
		t.Fatal(err)
	}
}

// An API server that refuses connections, and one that accepts them and
// never answers: Open fails with ErrUnreachable naming the server, within
// its Timeout (never a hang).
func TestUnreachable(t *testing.T) {
	closed, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	refused := closed.Addr().String()
	closed.Close()
	hole, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	defer hole.Close()
	go func() {
		for {
			c, err := hole.Accept()
			if err != nil {
				return
			}
			t.Cleanup(func() { _ = c.Close() })
		}
	}()
	for name, addr := range map[string]string{"refused": refused, "silent": hole.Addr().String()} {
		t.Run(name, func(t *testing.T) {
			const timeout = time.Second
			host := "https://" + addr
			start := time.Now()
			_, err := kube.Open(context.Background(), kube.Config{REST: &rest.Config{Host: host}, Timeout: timeout})
			took := time.Since(start)
			if !errors.Is(err, kube.ErrUnreachable) || !strings.Contains(err.Error(), host) {
				t.Fatalf("Open: %v", err)
			}
			if took > timeout+3*time.Second {
				t.Fatalf("Open took %v with a %v timeout", took, timeout)
			}
			t.Logf("after %v: %v", took.Round(time.Millisecond), err)
		})
	}
	// The caller's deadline, shorter than Timeout, is the bound the error
	// names (beacon's commands give Open theirs).
	t.Run("caller's deadline", func(t *testing.T) {
		ctx, cancel := context.WithTimeout(context.Background(), 1500*time.Millisecond)
		defer cancel()
		_, err := kube.Open(ctx, kube.Config{REST: &rest.Config{Host: "https://" + hole.Addr().String()}, Timeout: time.Minute})
		if !errors.Is(err, kube.ErrUnreachable) || !strings.Contains(err.Error(), "no answer within 1.5s") {
			t.Fatalf("Open with a 1.5 s deadline: %v", err)
		}
	})
}

// An API server whose certificate the client does not trust answered: the
// error says so (not "unreachable"), and what to check.
func TestUntrustedCertificate(t *testing.T) {
	cp := kubetest.Shared(t)
	for name, rc := range map[string]*rest.Config{
		"no CA":      {Host: cp.Host()},
		"another CA": {Host: cp.Host(), TLSClientConfig: rest.TLSClientConfig{CAData: cp.Admin().CertData}},
	} {
		t.Run(name, func(t *testing.T) {
			// The timeout is a bound, not the measure: a busy machine's
			// API server took more than 5 s to finish a TLS handshake in CI.
			_, err := kube.Open(kubetest.Ctx(t), kube.Config{REST: rc, Timeout: 30 * time.Second})
			if !errors.Is(err, kube.ErrUntrusted) || errors.Is(err, kube.ErrUnreachable) || !strings.Contains(err.Error(), "certificate-authority") {
				t.Fatalf("Open: %v", err)
			}
			t.Log(err)
		})
	}
	// Plain HTTP to the HTTPS port: what the server answered is in the error.
	_, err := kube.Open(kubetest.Ctx(t), kube.Config{REST: &rest.Config{Host: strings.Replace(cp.Host(), "https://", "http://", 1)}})
	if err == nil || !strings.Contains(err.Error(), "HTTP 400: Client sent an HTTP request to an HTTPS server") {
		t.Fatalf("Open over http://: %v", err)
	}
}

// Registering needs the pod's identity: missing variables are named with
// how to set them; a UID or name that does not match the cluster is
// refused before anything is written (the garbage collector would delete
// the InstanceSet at once).
func TestPodIdentity(t *testing.T) {
	cp := kubetest.Shared(t)
	ns := cp.Namespace(t)
	pod := cp.ReadyPod(t, ns, "w")
	ctx := kubetest.Ctx(t)
	for _, tc := range []struct {
		pod     kube.Pod
		target  error
		mention []string
	}{
		{kube.Pod{}, kube.ErrNoPodIdentity, []string{"POD_NAME, POD_NAMESPACE, POD_UID are not set", "Downward API", "metadata.uid for POD_UID"}},
		{kube.Pod{Name: pod.Name, Namespace: ns}, kube.ErrNoPodIdentity, []string{"POD_UID is not set"}},
		{kube.Pod{Name: pod.Name, Namespace: ns, UID: "0f0f0f0f-0000-0000-0000-000000000000"}, kube.ErrPodMismatch, []string{"POD_UID", string(pod.UID)}},
		{kube.Pod{Name: "nosuchpod", Namespace: ns, UID: string(pod.UID)}, kube.ErrPodMismatch, []string{`no pod "nosuchpod"`}},
		// Container mode names a container of the pod (a CONTAINER_NAME
		// the environment sets for something else must not pass).
		{kube.Pod{Name: pod.Name, Namespace: ns, UID: string(pod.UID), Container: "sidecar"}, kube.ErrPodMismatch,
			[]string{`CONTAINER_NAME "sidecar" is not a container of pod`, "it has main"}},
	} {
		r := cp.Registry(t, ns, nil, func(c *kube.Config) { c.Pod = tc.pod })
		_, err := r.Register(ctx, inst("10.8.0.1:80"))
		if !errors.Is(err, tc.target) {
			t.Errorf("pod %+v: %v, want %v", tc.pod, err, tc.target)
			continue
		}
		for _, m := range tc.mention {
			if !strings.Contains(err.Error(), m) {
				t.Errorf("pod %+v: %q does not say %q", tc.pod, err, m)
			}
		}
	}
	list, err := cp.Dynamic.Resource(kube.GVR).Namespace(ns).List(ctx, metav1.ListOptions{})
	if err != nil || len(list.Items) != 0 {
		t.Fatalf("refused registrations wrote %d InstanceSets (%v)", len(list.Items), err)
	}
}

func TestConfig(t *testing.T) {
	env := map[string]string{
		"POD_NAME": " w-1 ", "POD_NAMESPACE": "prod", "POD_UID": "u", "CONTAINER_NAME": "main",
		"KUBECONFIG": "/k", "BEACON_KUBE_NAMESPACES": "a, b",
	}
	c := kube.ConfigFromEnv(func(k string) string { return env[k] })
	if c.Pod != (kube.Pod{Name: "w-1", Namespace: "prod", UID: "u", Container: "main"}) || c.Kubeconfig != "/k" ||
		strings.Join(c.Namespaces, ",") != "a,b" {
		t.Fatalf("ConfigFromEnv: %+v", c)
	}
	if err := c.Validate(); err != nil {
		t.Fatal(err)
	}
	for _, tc := range []struct {
		cfg  kube.Config
		says string
	}{
		{kube.Config{Namespaces: []string{"*", "a"}}, `"*" means every namespace`},
		{kube.Config{Namespaces: []string{"Bad_NS"}}, `namespace "Bad_NS" (BEACON_KUBE_NAMESPACES)`},
		{kube.Config{Pod: kube.Pod{Name: "UPPER"}}, `POD_NAME "UPPER"`},
		{kube.Config{Pod: kube.Pod{Container: "a.b"}}, `CONTAINER_NAME "a.b"`},
		{kube.Config{MaxMetadataSize: kube.MaxMetadataSize + 1}, "MaxMetadataSize"},
		{kube.Config{HealthPanicThreshold: 1.5}, "HealthPanicThreshold 1.5 is not a share"},
		{kube.Config{HealthPanicThreshold: math.NaN()}, "HealthPanicThreshold NaN"},
	} {
		err := tc.cfg.Validate()
		if !errors.Is(err, kube.ErrInvalidConfig) || !strings.Contains(err.Error(), tc.says) {
			t.Errorf("Validate(%+v) = %v, want it to say %q", tc.cfg, err, tc.says)
		}
	}
}

// Readers without POD_NAMESPACE or BEACON_KUBE_NAMESPACES watch the
// kubeconfig context's namespace; one that is no namespace name is an
// error, not a silently empty registry.
func TestKubeconfigNamespace(t *testing.T) {
	cp := kubetest.Shared(t)
	ns := cp.Namespace(t)
	dir := t.TempDir()
	for _, tc := range []struct{ namespace, says string }{
		{ns, ""},
		{"Bad_NS", `the kubeconfig context's namespace "Bad_NS"`},
		{"", ""}, // none: "default"
	} {
		kc := filepath.Join(dir, "kubeconfig-"+tc.namespace)
		if err := kubetest.WriteKubeconfig(kc, cp.Admin(), tc.namespace); err != nil {
			t.Fatal(err)
		}
		r, err := kube.Open(kubetest.Ctx(t), kube.Config{Kubeconfig: kc})
		if tc.says != "" {
			if !errors.Is(err, kube.ErrInvalidConfig) || !strings.Contains(err.Error(), tc.says) {
				t.Errorf("Open with namespace %q in the kubeconfig: %v", tc.namespace, err)
			}
			continue
		}
		if err != nil {
			t.Fatalf("Open with namespace %q in the kubeconfig: %v", tc.namespace, err)
		}
		want := cmp.Or(tc.namespace, "default")
		if got := r.Namespaces(); len(got) != 1 || got[0] != want {
			t.Errorf("namespaces %q, want %q", got, want)
		}
		_ = r.Close()
	}
}

// Kubeconfig files as kubectl reads them: a KUBECONFIG list with a missing
// file works; a kubeconfig that names no cluster, and no kubeconfig at all
// outside a pod, say what is missing (not client-go's KUBERNETES_MASTER).
func TestKubeconfigFiles(t *testing.T) {
	cp := kubetest.Shared(t)
	ns := cp.Namespace(t)
	dir := t.TempDir()
	good := filepath.Join(dir, "good")
	if err := kubetest.WriteKubeconfig(good, cp.Admin(), ns); err != nil {
		t.Fatal(err)
	}
	list := filepath.Join(dir, "missing") + string(filepath.ListSeparator) + good
	r, err := kube.Open(kubetest.Ctx(t), kube.Config{Kubeconfig: list})
	if err != nil {
		t.Fatalf("Open with the list %s: %v", list, err)
	}
	if got := r.Namespaces(); len(got) != 1 || got[0] != ns {
		t.Errorf("namespaces %q from the list, want %q", got, ns)
	}
	_ = r.Close()

	empty := filepath.Join(dir, "empty")
	if err := os.WriteFile(empty, []byte("apiVersion: v1\nkind: Config\n"), 0o600); err != nil {
		t.Fatal(err)
	}
	_, err = kube.Open(kubetest.Ctx(t), kube.Config{Kubeconfig: empty})
	if !errors.Is(err, kube.ErrInvalidConfig) || !strings.Contains(err.Error(), "names no cluster to use") ||
		strings.Contains(err.Error(), "KUBERNETES_MASTER") {
		t.Errorf("Open with a kubeconfig without a context: %v", err)
	}

	t.Setenv("KUBECONFIG", "")
	t.Setenv("HOME", dir)
	t.Setenv("KUBERNETES_SERVICE_HOST", "")
	_, err = kube.Open(kubetest.Ctx(t), kube.Config{})
	if !errors.Is(err, kube.ErrInvalidConfig) || !strings.Contains(err.Error(), "not in a pod with a service account") ||
		strings.Contains(err.Error(), "KUBERNETES_MASTER") {
		t.Errorf("Open without any configuration: %v", err)
	}
}

// setObject is an InstanceSet as a process would write it, for tests that
// write one by hand.
func setObject(pod *corev1.Pod, ins ...beacon.Instance) *unstructured.Unstructured {
	raw, _ := json.Marshal(kube.InstanceSet{
		TypeMeta: metav1.TypeMeta{APIVersion: kube.Group + "/" + kube.Version, Kind: kube.Kind},
		ObjectMeta: metav1.ObjectMeta{Name: pod.Name, Namespace: pod.Namespace, OwnerReferences: []metav1.OwnerReference{{
			APIVersion: "v1", Kind: "Pod", Name: pod.Name, UID: pod.UID,
		}}},
		Spec: kube.InstanceSetSpec{Pod: kube.PodRef{Name: pod.Name, UID: string(pod.UID)}, Holder: "by-hand", Instances: ins},
	})
	u := &unstructured.Unstructured{}
	_ = json.Unmarshal(raw, &u.Object)
	return u
}

// An InstanceSet edited by hand: the schema refuses what it can express
// (the API server rejects the write); what it cannot (an address without
// a port, metadata over the limit, no pod owner) is skipped by readers, who
// keep the last valid content of that object (no removal), count and log
// it, and follow it again once it is valid.
func TestGarbageInstanceSet(t *testing.T) {
	cp := kubetest.Shared(t)
	ns := cp.Namespace(t)
	pod := cp.ReadyPod(t, ns, "byhand")
	other := cp.ReadyPod(t, ns, "other")
	metrics := prometheus.NewRegistry()
	reader := cp.Registry(t, ns, nil, func(c *kube.Config) { c.Metrics = metrics })
	invalid := func() float64 {
		mfs, _ := metrics.Gather()
		for _, mf := range mfs {
			if mf.GetName() == "beacon_kube_invalid_resources_total" {
				return mf.GetMetric()[0].GetCounter().GetValue()
			}
		}
		return 0
	}
	f := follow(t, reader, beacon.Query{Namespace: "demo"})
	ctx := kubetest.Ctx(t)
	sets := cp.Dynamic.Resource(kube.GVR).Namespace(ns)
	good := inst("10.9.0.1:80")
	good.ID, good.Status, good.RegisteredAt = "00000000000000a1", beacon.StatusServing, time.Now().UTC().Truncate(time.Second)
	if _, err := sets.Create(ctx, setObject(pod, good), metav1.CreateOptions{}); err != nil {
		t.Fatal(err)
	}
	f.until("the hand-written instance", func(v *registrytest.View) bool { return has(v, good) })

	// The schema refuses a verdict of an unknown status outright.
	badVerdict := setObject(pod, good)
	_ = unstructured.SetNestedField(badVerdict.Object, map[string]any{good.Ref().String(): map[string]any{"status": "sick"}}, "spec", "verdicts")
	if _, err := sets.Apply(ctx, pod.Name, badVerdict, metav1.ApplyOptions{FieldManager: "by-hand", Force: true}); !apierrors.IsInvalid(err) {
		t.Errorf("write with a verdict of status sick: %v, want the schema to refuse it", err)
	}
	// The schema refuses a bad ID, status or name outright.
	for field, value := range map[string]any{"id": "xyz", "status": "up", "component": "Bad_Name"} {
		bad := setObject(pod, good)
		ins, _, _ := unstructured.NestedSlice(bad.Object, "spec", "instances")
		ins[0].(map[string]any)[field] = value
		_ = unstructured.SetNestedSlice(bad.Object, ins, "spec", "instances")
		_, err := sets.Apply(ctx, pod.Name, bad, metav1.ApplyOptions{FieldManager: "by-hand", Force: true})
		if !apierrors.IsInvalid(err) {
			t.Errorf("write with %s=%v: %v, want the schema to refuse it", field, value, err)
		}
	}

	// Garbage the schema admits: kept at its last valid content.
	marker := 0
	otherSet := func() beacon.Instance {
		marker++
		in := inst(fmt.Sprintf("10.9.1.%d:80", marker))
		in.ID, in.Status, in.RegisteredAt = "00000000000000b1", beacon.StatusServing, good.RegisteredAt
		if _, err := sets.Apply(ctx, other.Name, setObject(other, in), metav1.ApplyOptions{FieldManager: "by-hand", Force: true}); err != nil {
			t.Fatal(err)
		}
		return in
	}
	for i, garbage := range []func(*unstructured.Unstructured){
		func(u *unstructured.Unstructured) { setField(u, "address", "no-port") },
		func(u *unstructured.Unstructured) {
			setField(u, "metadata", map[string]any{"blob": strings.Repeat("x", beacon.DefaultMaxMetadataSize+1)})
		},
		func(u *unstructured.Unstructured) { u.SetOwnerReferences(nil) },
		func(u *unstructured.Unstructured) {
			_ = unstructured.SetNestedField(u.Object, "another-uid", "spec", "pod", "uid")
		},
		func(u *unstructured.Unstructured) { // owned, consistently, by another live pod: not the pod it is named after
			u.SetOwnerReferences([]metav1.OwnerReference{{APIVersion: "v1", Kind: "Pod", Name: other.Name, UID: other.UID}})
			_ = unstructured.SetNestedField(u.Object, map[string]any{"name": other.Name, "uid": string(other.UID)}, "spec", "pod")
		},
		func(u *unstructured.Unstructured) { // the spec names a pod other than its owner
			u.SetOwnerReferences([]metav1.OwnerReference{{APIVersion: "v1", Kind: "Pod", Name: pod.Name, UID: pod.UID}})
			_ = unstructured.SetNestedField(u.Object, map[string]any{"name": other.Name, "uid": string(pod.UID)}, "spec", "pod")
		},
		func(u *unstructured.Unstructured) { // a verdict on something that is no instance
			_ = unstructured.SetNestedField(u.Object, map[string]any{"not-an-instance": map[string]any{"status": "failing"}}, "spec", "verdicts")
		},
	} {
		before := invalid()
		cur, err := sets.Get(ctx, pod.Name, metav1.GetOptions{})
		if err != nil {
			t.Fatal(err)
		}
		// Each garbage alone, on the valid content (not on the previous
		// garbage, which would keep it invalid whatever this one does).
		bad := setObject(pod, good)
		bad.SetResourceVersion(cur.GetResourceVersion())
		garbage(bad)
		if _, err := sets.Update(ctx, bad, metav1.UpdateOptions{}); err != nil { // as kubectl edit does
			t.Fatalf("garbage %d: %v", i, err)
		}
		// Events of one resource arrive in order: once a later write is
		// seen, the garbage was processed.
		later := otherSet()
		f.until(fmt.Sprintf("the write after garbage %d", i), func(v *registrytest.View) bool { return has(v, later) })
		if !has(f.v, good) || f.removed(good.Ref()) {
			t.Fatalf("garbage %d: the last valid instance was not kept (view %v)", i, f.v)
		}
		if got := invalid(); got != before+1 {
			t.Fatalf("garbage %d: invalid counter %v -> %v", i, before, got)
		}
		// List keeps it too.
		got, _, err := reader.List(ctx, beacon.Query{Namespace: "demo", Component: "api"})
		if err != nil || !slicesHas(got, good) {
			t.Fatalf("garbage %d: List = %v, %v", i, got, err)
		}
	}
	// Valid again: followed again.
	fixed := good
	fixed.Address = "10.9.0.1:81"
	cur, err := sets.Get(ctx, pod.Name, metav1.GetOptions{})
	if err != nil {
		t.Fatal(err)
	}
	want := setObject(pod, fixed)
	want.SetResourceVersion(cur.GetResourceVersion())
	if _, err := sets.Update(ctx, want, metav1.UpdateOptions{}); err != nil {
		t.Fatal(err)
	}
	f.until("the fixed instance", func(v *registrytest.View) bool { return has(v, fixed) })
	_ = testutil.ToFloat64
	_ = types.UID("")
}

func setField(u *unstructured.Unstructured, field string, value any) {
	ins, _, _ := unstructured.NestedSlice(u.Object, "spec", "instances")
	ins[0].(map[string]any)[field] = value
	_ = unstructured.SetNestedSlice(u.Object, ins, "spec", "instances")
}

func slicesHas(list []beacon.Instance, in beacon.Instance) bool {
	for _, x := range list {
		if registrytest.Same(x, in) {
			return true
		}
	}
	return false
}

// A registration that would make the InstanceSet larger than the API
// server takes is refused with ErrTooLarge; what was registered stays.
func TestTooLarge(t *testing.T) {
	cp := kubetest.Shared(t)
	ns := cp.Namespace(t)
	r := cp.Registry(t, ns, cp.ReadyPod(t, ns, "big"), func(c *kube.Config) { c.MaxMetadataSize = kube.MaxMetadataSize })
	ctx := kubetest.Ctx(t)
	blob := map[string]string{"blob": strings.Repeat("x", kube.MaxMetadataSize-10)}
	n := 0
	for ; n < 32; n++ {
		in := inst(fmt.Sprintf("10.10.0.%d:80", n+1))
		in.Metadata = blob
		_, err := r.Register(ctx, in)
		if errors.Is(err, kube.ErrTooLarge) {
			t.Logf("refused after %d: %v", n, err)
			break
		}
		if err != nil {
			t.Fatal(err)
		}
	}
	if n == 32 || n == 0 {
		t.Fatalf("%d registrations of 64 KiB accepted", n)
	}
	cp.WaitEndpoint(t, mustPod(t, cp, ns, "big"), true)
	got, _, err := r.List(ctx, beacon.Query{Namespace: "demo"})
	if err != nil || len(got) != n {
		t.Fatalf("List after the refusal: %d instances (%v), want %d", len(got), err, n)
	}
}

func mustPod(t *testing.T, cp *kubetest.ControlPlane, ns, name string) *corev1.Pod {
	t.Helper()
	p, err := cp.Core.Pods(ns).Get(kubetest.Ctx(t), name, metav1.GetOptions{})
	if err != nil {
		t.Fatal(err)
	}
	return p
}

// Readers choose their namespaces: one, several, or every namespace.
func TestNamespaces(t *testing.T) {
	cp := kubetest.Shared(t)
	ns1, ns2 := cp.Namespace(t), cp.Namespace(t)
	in1 := register(t, cp.Registry(t, ns1, cp.ReadyPod(t, ns1, "w"), nil), inst("10.11.0.1:80")).Instance()
	in2 := register(t, cp.Registry(t, ns2, cp.ReadyPod(t, ns2, "w"), nil), inst("10.11.0.2:80")).Instance()
	for _, tc := range []struct {
		namespaces []string
		want       []beacon.Instance
	}{
		{[]string{ns1}, []beacon.Instance{in1}},
		{[]string{ns2, ns1}, []beacon.Instance{in1, in2}},
	} {
		r := cp.Registry(t, ns1, nil, func(c *kube.Config) { c.Namespaces = tc.namespaces })
		got, _, err := r.List(kubetest.Ctx(t), beacon.Query{Namespace: "demo"})
		if err != nil || !registrytest.SameInstances(got, tc.want) {
			t.Fatalf("List in %v = %v, %v", tc.namespaces, got, err)
		}
		f := follow(t, r, beacon.Query{Namespace: "demo"})
		f.until("the instances", func(v *registrytest.View) bool { return v.Equal(tc.want) })
	}
	// Every namespace: at least these two (other tests' namespaces too).
	all := cp.Registry(t, ns1, nil, func(c *kube.Config) { c.Namespaces = []string{kube.AllNamespaces} })
	f := follow(t, all, beacon.Query{Namespace: "demo"})
	f.until("both namespaces' instances", func(v *registrytest.View) bool { return has(v, in1) && has(v, in2) })
}
