package kubetest

import (
	"context"
	"crypto/rand"
	"encoding/hex"
	"fmt"
	"testing"
	"time"

	"github.com/beaconplane/beacon/registry/kube"
	authenticationv1 "k8s.io/api/authentication/v1"
	corev1 "k8s.io/api/core/v1"
	discoveryv1 "k8s.io/api/discovery/v1"
	rbacv1 "k8s.io/api/rbac/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/fields"
	"k8s.io/apimachinery/pkg/runtime"
	"k8s.io/apimachinery/pkg/runtime/schema"
	"k8s.io/apimachinery/pkg/watch"
	"k8s.io/client-go/rest"
	"k8s.io/client-go/tools/cache"
	watchtools "k8s.io/client-go/tools/watch"
)

// Ctx returns a context bounded by WaitTimeout, cancelled when the test
// ends.
func Ctx(tb testing.TB) context.Context {
	ctx, cancel := context.WithTimeout(context.Background(), WaitTimeout)
	tb.Cleanup(cancel)
	return ctx
}

// Namespace creates a namespace for the test, with a headless Service
// (ServiceName) labelled kube.DiscoveryLabel=true that selects the pods Pod
// creates. Nothing is deleted afterwards (the control plane is thrown
// away).
func (cp *ControlPlane) Namespace(tb testing.TB) string {
	tb.Helper()
	var b [4]byte
	_, _ = rand.Read(b[:])
	ns := "kt-" + hex.EncodeToString(b[:])
	ctx := Ctx(tb)
	if _, err := cp.Core.Namespaces().Create(ctx, &corev1.Namespace{ObjectMeta: metav1.ObjectMeta{Name: ns}}, metav1.CreateOptions{}); err != nil {
		tb.Fatalf("kubetest: create namespace: %v", err)
	}
	cp.Service(tb, ns, ServiceName, true)
	return ns
}

// Service creates a headless Service selecting the test pods, labelled
// kube.DiscoveryLabel=true when discovery is set.
func (cp *ControlPlane) Service(tb testing.TB, ns, name string, discovery bool) {
	tb.Helper()
	labels := map[string]string{}
	if discovery {
		labels[kube.DiscoveryLabel] = kube.DiscoveryLabelValue
	}
	_, err := cp.Core.Services(ns).Create(Ctx(tb), &corev1.Service{
		ObjectMeta: metav1.ObjectMeta{Name: name, Labels: labels},
		Spec: corev1.ServiceSpec{
			ClusterIP: corev1.ClusterIPNone,
			Selector:  map[string]string{PodLabel: "true"},
			Ports:     []corev1.ServicePort{{Name: "http", Port: 80}},
		},
	}, metav1.CreateOptions{})
	if err != nil {
		tb.Fatalf("kubetest: create service: %v", err)
	}
}

// Pod creates a pod bound to the test node (no kubelet runs it), labelled
// so that the namespace's Service selects it, with the given containers
// (none: one, "main"). It is not Ready until SetReady.
func (cp *ControlPlane) Pod(tb testing.TB, ns, name string, containers ...string) *corev1.Pod {
	tb.Helper()
	if len(containers) == 0 {
		containers = []string{"main"}
	}
	var cs []corev1.Container
	for _, c := range containers {
		cs = append(cs, corev1.Container{Name: c, Image: "beacon.invalid/test"})
	}
	pod, err := cp.Core.Pods(ns).Create(Ctx(tb), &corev1.Pod{
		ObjectMeta: metav1.ObjectMeta{Name: name, Labels: map[string]string{PodLabel: "true"}},
		Spec:       corev1.PodSpec{NodeName: NodeName, Containers: cs},
	}, metav1.CreateOptions{})
	if err != nil {
		tb.Fatalf("kubetest: create pod: %v", err)
	}
	return pod
}

// SetReady sets the pod's status as a kubelet would: Running with an IP,
// and the Ready condition true or false.
func (cp *ControlPlane) SetReady(tb testing.TB, pod *corev1.Pod, ready bool) *corev1.Pod {
	tb.Helper()
	ctx := Ctx(tb)
	cur, err := cp.Core.Pods(pod.Namespace).Get(ctx, pod.Name, metav1.GetOptions{})
	if err != nil {
		tb.Fatalf("kubetest: get pod: %v", err)
	}
	if cur.Status.PodIP == "" {
		cp.mu.Lock()
		cp.nextIP++
		n := cp.nextIP
		cp.mu.Unlock()
		ip := fmt.Sprintf("10.244.%d.%d", n/250, n%250+1)
		cur.Status.PodIP = ip
		cur.Status.PodIPs = []corev1.PodIP{{IP: ip}}
		cur.Status.HostIP = "192.0.2.1"
		cur.Status.StartTime = &metav1.Time{Time: time.Now()}
	}
	cur.Status.Phase = corev1.PodRunning
	status := corev1.ConditionFalse
	if ready {
		status = corev1.ConditionTrue
	}
	now := metav1.Now()
	cur.Status.Conditions = []corev1.PodCondition{
		{Type: corev1.PodReady, Status: status, LastTransitionTime: now},
		{Type: corev1.ContainersReady, Status: status, LastTransitionTime: now},
		{Type: corev1.PodScheduled, Status: corev1.ConditionTrue, LastTransitionTime: now},
	}
	out, err := cp.Core.Pods(pod.Namespace).UpdateStatus(ctx, cur, metav1.UpdateOptions{})
	if err != nil {
		tb.Fatalf("kubetest: update pod status: %v", err)
	}
	return out
}

// ReadyPod creates a pod, makes it Ready and waits until the EndpointSlice
// controller lists it as ready.
func (cp *ControlPlane) ReadyPod(tb testing.TB, ns, name string, containers ...string) *corev1.Pod {
	tb.Helper()
	pod := cp.SetReady(tb, cp.Pod(tb, ns, name, containers...), true)
	cp.WaitEndpoint(tb, pod, true)
	return pod
}

// WaitEndpoint waits until an EndpointSlice of the namespace lists the pod
// with the given readiness (ready false also matches a pod no longer
// listed).
func (cp *ControlPlane) WaitEndpoint(tb testing.TB, pod *corev1.Pod, ready bool) {
	tb.Helper()
	ctx := Ctx(tb)
	lw := &cache.ListWatch{
		ListWithContextFunc: func(ctx context.Context, o metav1.ListOptions) (runtime.Object, error) {
			return cp.Slices.EndpointSlices(pod.Namespace).List(ctx, o)
		},
		WatchFuncWithContext: func(ctx context.Context, o metav1.ListOptions) (watch.Interface, error) {
			return cp.Slices.EndpointSlices(pod.Namespace).Watch(ctx, o)
		},
	}
	slices := map[string]*discoveryv1.EndpointSlice{}
	done := func() bool {
		listedReady := false
		for _, s := range slices {
			for _, ep := range s.Endpoints {
				if ep.TargetRef != nil && ep.TargetRef.UID == pod.UID && (ep.Conditions.Ready == nil || *ep.Conditions.Ready) {
					listedReady = true
				}
			}
		}
		return listedReady == ready
	}
	_, err := watchtools.UntilWithSync(ctx, lw, &discoveryv1.EndpointSlice{}, func(store cache.Store) (bool, error) {
		for _, o := range store.List() {
			s := o.(*discoveryv1.EndpointSlice)
			slices[s.Name] = s
		}
		return done(), nil
	}, func(e watch.Event) (bool, error) {
		s, ok := e.Object.(*discoveryv1.EndpointSlice)
		if !ok {
			return false, nil
		}
		if e.Type == watch.Deleted {
			delete(slices, s.Name)
		} else {
			slices[s.Name] = s
		}
		return done(), nil
	})
	if err != nil {
		tb.Fatalf("kubetest: waiting for pod %s/%s to be listed as ready=%v in an EndpointSlice: %v\n%s",
			pod.Namespace, pod.Name, ready, err, cp.Logs())
	}
}

// DeletePod deletes the pod at once (grace period 0: there is no kubelet
// to confirm a graceful deletion).
func (cp *ControlPlane) DeletePod(tb testing.TB, pod *corev1.Pod) {
	tb.Helper()
	err := cp.Core.Pods(pod.Namespace).Delete(Ctx(tb), pod.Name, metav1.DeleteOptions{
		GracePeriodSeconds: new(int64),
		Preconditions:      &metav1.Preconditions{UID: &pod.UID},
	})
	if err != nil {
		tb.Fatalf("kubetest: delete pod: %v", err)
	}
}

// WaitGone waits until the InstanceSet ns/name does not exist.
func (cp *ControlPlane) WaitGone(tb testing.TB, ns, name string) {
	tb.Helper()
	cp.WaitGoneResource(tb, kube.GVR, ns, name)
}

// WaitGoneResource waits until the object ns/name of resource gvr does not
// exist.
func (cp *ControlPlane) WaitGoneResource(tb testing.TB, gvr schema.GroupVersionResource, ns, name string) {
	tb.Helper()
	ctx := Ctx(tb)
	sel := fields.OneTermEqualSelector("metadata.name", name).String()
	lw := &cache.ListWatch{
		ListWithContextFunc: func(ctx context.Context, o metav1.ListOptions) (runtime.Object, error) {
			o.FieldSelector = sel
			return cp.Dynamic.Resource(gvr).Namespace(ns).List(ctx, o)
		},
		WatchFuncWithContext: func(ctx context.Context, o metav1.ListOptions) (watch.Interface, error) {
			o.FieldSelector = sel
			return cp.Dynamic.Resource(gvr).Namespace(ns).Watch(ctx, o)
		},
	}
	present := false
	_, err := watchtools.UntilWithSync(ctx, lw, nil, func(store cache.Store) (bool, error) {
		present = len(store.List()) > 0
		return !present, nil
	}, func(e watch.Event) (bool, error) {
		return e.Type == watch.Deleted, nil
	})
	if err != nil {
		tb.Fatalf("kubetest: waiting for %s %s/%s to be deleted: %v", gvr.Resource, ns, name, err)
	}
}

// PodIdentity returns the Downward API identity of a pod.
func PodIdentity(pod *corev1.Pod) kube.Pod {
	return kube.Pod{Name: pod.Name, Namespace: pod.Namespace, UID: string(pod.UID)}
}

// Registry opens a registry as a process in pod (nil: a reader outside any
// pod) would, with admin rights, watching the pod's (or ns's) namespace. It
// is closed when the test ends. configure, if not nil, adjusts the
// configuration first.
func (cp *ControlPlane) Registry(tb testing.TB, ns string, pod *corev1.Pod, configure func(*kube.Config)) *kube.Registry {
	tb.Helper()
	cfg := kube.Config{REST: cp.Admin(), Namespaces: []string{ns}, Timeout: 20 * time.Second}
	if pod != nil {
		cfg.Pod = PodIdentity(pod)
	}
	if configure != nil {
		configure(&cfg)
	}
	r, err := kube.Open(Ctx(tb), cfg)
	if err != nil {
		tb.Fatalf("kubetest: open registry: %v", err)
	}
	tb.Cleanup(func() { _ = r.Close() })
	return r
}

// ServiceAccount creates a ServiceAccount in ns bound to a Role with the
// given rules, and returns a client configuration authenticating as it
// (a token from the TokenRequest API, as a projected token in a pod).
func (cp *ControlPlane) ServiceAccount(tb testing.TB, ns, name string, rules []rbacv1.PolicyRule) *rest.Config {
	tb.Helper()
	ctx := Ctx(tb)
	if _, err := cp.Core.ServiceAccounts(ns).Create(ctx, &corev1.ServiceAccount{ObjectMeta: metav1.ObjectMeta{Name: name}}, metav1.CreateOptions{}); err != nil {
		tb.Fatalf("kubetest: create service account: %v", err)
	}
	if rules != nil {
		cp.Bind(tb, ns, name, &rbacv1.Role{ObjectMeta: metav1.ObjectMeta{Name: name}, Rules: rules})
	}
	expiry := int64(3600)
	tok, err := cp.Core.ServiceAccounts(ns).CreateToken(ctx, name, &authenticationv1.TokenRequest{
		Spec: authenticationv1.TokenRequestSpec{ExpirationSeconds: &expiry},
	}, metav1.CreateOptions{})
	if err != nil {
		tb.Fatalf("kubetest: token request: %v", err)
	}
	return &rest.Config{
		Host:            cp.admin.Host,
		TLSClientConfig: rest.TLSClientConfig{CAData: cp.ca},
		BearerToken:     tok.Status.Token,
	}
}

// Bind creates the role in ns and binds it to the ServiceAccount sa.
func (cp *ControlPlane) Bind(tb testing.TB, ns, sa string, role *rbacv1.Role) {
	tb.Helper()
	ctx := Ctx(tb)
	role = role.DeepCopy()
	role.Namespace = ns
	if _, err := cp.RBAC.Roles(ns).Create(ctx, role, metav1.CreateOptions{}); err != nil {
		tb.Fatalf("kubetest: create role: %v", err)
	}
	_, err := cp.RBAC.RoleBindings(ns).Create(ctx, &rbacv1.RoleBinding{
		ObjectMeta: metav1.ObjectMeta{Name: role.Name + "-" + sa},
		RoleRef:    rbacv1.RoleRef{APIGroup: rbacv1.GroupName, Kind: "Role", Name: role.Name},
		Subjects:   []rbacv1.Subject{{Kind: rbacv1.ServiceAccountKind, Name: sa, Namespace: ns}},
	}, metav1.CreateOptions{})
	if err != nil {
		tb.Fatalf("kubetest: create role binding: %v", err)
	}
}

// BindCluster creates the cluster role (its name suffixed with ns, so that
// tests do not collide) and binds it to the ServiceAccount ns/sa.
func (cp *ControlPlane) BindCluster(tb testing.TB, ns, sa string, role *rbacv1.ClusterRole) {
	tb.Helper()
	ctx := Ctx(tb)
	role = role.DeepCopy()
	role.Name += "-" + ns
	role.ResourceVersion = ""
	if _, err := cp.RBAC.ClusterRoles().Create(ctx, role, metav1.CreateOptions{}); err != nil {
		tb.Fatalf("kubetest: create cluster role: %v", err)
	}
	_, err := cp.RBAC.ClusterRoleBindings().Create(ctx, &rbacv1.ClusterRoleBinding{
		ObjectMeta: metav1.ObjectMeta{Name: role.Name + "-" + sa},
		RoleRef:    rbacv1.RoleRef{APIGroup: rbacv1.GroupName, Kind: "ClusterRole", Name: role.Name},
		Subjects:   []rbacv1.Subject{{Kind: rbacv1.ServiceAccountKind, Name: sa, Namespace: ns}},
	}, metav1.CreateOptions{})
	if err != nil {
		tb.Fatalf("kubetest: create cluster role binding: %v", err)
	}
}
