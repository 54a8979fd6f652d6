package kube_test

import (
	"context"
	"errors"
	"fmt"
	"log/slog"
	"net"
	"strings"
	"sync/atomic"
	"testing"
	"time"

	"github.com/beaconplane/beacon"
	"github.com/beaconplane/beacon/health"
	"github.com/beaconplane/beacon/internal/testkit/kubetest"
	"github.com/beaconplane/beacon/registry"
	"github.com/beaconplane/beacon/registry/kube"
	"github.com/beaconplane/beacon/registry/registrytest"
	"google.golang.org/grpc"
	grpchealth "google.golang.org/grpc/health"
	healthpb "google.golang.org/grpc/health/grpc_health_v1"
	corev1 "k8s.io/api/core/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/apis/meta/v1/unstructured"
	"k8s.io/apimachinery/pkg/runtime"
	"k8s.io/apimachinery/pkg/types"
	"k8s.io/apimachinery/pkg/watch"
	"k8s.io/client-go/tools/cache"
	watchtools "k8s.io/client-go/tools/watch"
)

// Health checks on Kubernetes, run by a real health.Checker whose process
// is a pod of its own (its verdicts live in its pod's InstanceSet), on
// instances whose gRPC health services are real grpc-go servers.

// grpcHealth serves grpc-go's health service on a loopback port, every
// service name SERVING, until the test ends.
func grpcHealth(t *testing.T, services ...string) (*grpchealth.Server, string) {
	t.Helper()
	ln, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	srv := grpc.NewServer()
	hs := grpchealth.NewServer()
	for _, s := range services {
		hs.SetServingStatus(s, healthpb.HealthCheckResponse_SERVING)
	}
	healthpb.RegisterHealthServer(srv, hs)
	go func() { _ = srv.Serve(ln) }()
	t.Cleanup(srv.Stop)
	return hs, ln.Addr().String()
}

// countingListener accepts connections and counts them, until the test
// ends: an address nobody should probe.
func countingListener(t *testing.T) (string, *atomic.Int64) {
	t.Helper()
	ln, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	var n atomic.Int64
	done := make(chan struct{})
	go func() {
		defer close(done)
		for {
			c, err := ln.Accept()
			if err != nil {
				return
			}
			n.Add(1)
			_ = c.Close()
		}
	}()
	t.Cleanup(func() { _ = ln.Close(); <-done })
	return ln.Addr().String(), &n
}

// startChecker runs a health.Checker as beacon serve does in pod: over a
// registry of that pod, with its verdicts in the pod's InstanceSet.
func startChecker(t *testing.T, cp *kubetest.ControlPlane, ns string, pod *corev1.Pod, id string) *health.Checker {
	t.Helper()
	return startCheckerWith(t, cp, ns, pod, id, nil)
}

// startCheckerWith is startChecker with a logger.
func startCheckerWith(t *testing.T, cp *kubetest.ControlPlane, ns string, pod *corev1.Pod, id string, log *slog.Logger) *health.Checker {
	t.Helper()
	r := cp.Registry(t, ns, pod, nil)
	addr, _ := countingListener(t)
	c, err := health.New(health.Config{ID: id, Addr: addr, Registry: r, PeerInterval: time.Hour, Jitter: func() float64 { return 0.5 },
		Logger: log})
	if err != nil {
		t.Fatalf("health.New over the Kubernetes registry: %v", err)
	}
	if err := c.Start(); err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { _ = c.Close() })
	return c
}

// grpcChecked is an instance whose gRPC health service is service at addr,
// probed every 500 ms, out after one failure, back after one pass.
func grpcChecked(addr, service string) beacon.Instance {
	in := inst(addr)
	in.Component, in.Transport = "checked", "grpc"
	in.Check = &beacon.Check{Kind: beacon.CheckGRPC, Service: service, Interval: beacon.MinCheckInterval, Rise: 1, Fall: 1}
	return in
}

// threeGRPCChecked registers, from a worker pod, three instances whose
// checks are the services a, b and c of one grpc-go health server (all
// SERVING): three, so that one failing is no panic.
func threeGRPCChecked(t *testing.T, cp *kubetest.ControlPlane, ns string) (*grpchealth.Server, []beacon.Ref) {
	t.Helper()
	hs, addr := grpcHealth(t, "a", "b", "c")
	w := cp.Registry(t, ns, cp.ReadyPod(t, ns, "worker"), nil)
	var refs []beacon.Ref
	for _, s := range []string{"a", "b", "c"} {
		refs = append(refs, register(t, w, grpcChecked(addr, s)).Instance().Ref())
	}
	return hs, refs
}

// healthIs reports whether the view holds ref with this health status.
func healthIs(ref beacon.Ref, s beacon.HealthStatus) func(*registrytest.View) bool {
	return func(v *registrytest.View) bool {
		got, ok := v.Get(ref.String())
		return ok && got.Health != nil && got.Health.Status == s
	}
}

// transition applies batches until the view shows ref with status s, and
// returns the events about ref in the batch that made it so.
func (f *follower) transition(ref beacon.Ref, s beacon.HealthStatus) []beacon.Event {
	f.t.Helper()
	for !healthIs(ref, s)(f.v) {
		f.next(fmt.Sprintf("%s %s", ref, s))
	}
	var evs []beacon.Event
	for _, e := range f.batches[len(f.batches)-1].Events {
		if e.Instance.Ref() == ref {
			evs = append(evs, e)
		}
	}
	return evs
}

// A registration declares a gRPC check; a checker running in a pod of its
// own probes it (a real grpc-go health server) and its verdicts, in its
// pod's InstanceSet, reach every reader: NOT_SERVING takes the instance
// out of routing (Serving false, in List too) in one update to watchers,
// without removing it, and SERVING brings it back. An instance without a
// check is never probed.
func TestCheckerOnKubernetes(t *testing.T) {
	cp := kubetest.Shared(t)
	ns := cp.Namespace(t)
	hs, refs := threeGRPCChecked(t, cp, ns)
	plainAddr, probed := countingListener(t)
	plain := register(t, cp.Registry(t, ns, cp.ReadyPod(t, ns, "plain"), nil), inst(plainAddr)).Instance()
	reader := cp.Registry(t, ns, nil, nil)
	f := follow(t, reader, beacon.Query{Namespace: "demo"})
	if h := f.v.Instances(); len(h) != 4 {
		t.Fatalf("snapshot %v", f.v)
	}
	startChecker(t, cp, ns, cp.ReadyPod(t, ns, "checker"), "node-1")
	for _, ref := range refs {
		f.transition(ref, beacon.HealthPassing)
	}

	start := time.Now()
	hs.SetServingStatus("a", healthpb.HealthCheckResponse_NOT_SERVING)
	evs := f.transition(refs[0], beacon.HealthFailing)
	t.Logf("NOT_SERVING → failing for a watcher in %v (pushed on the Watch stream, written to the checker's InstanceSet)", time.Since(start).Round(time.Millisecond))
	if len(evs) != 1 || evs[0].Type != beacon.Updated || evs[0].Instance.Serving() {
		t.Fatalf("NOT_SERVING reached watchers as %+v, want one update of a not serving instance", evs)
	}
	if h := evs[0].Instance.Health; !strings.Contains(h.Reason, "NOT_SERVING") || h.Checker != "node-1" || h.Panic {
		t.Fatalf("failing verdict %+v: want the reason NOT_SERVING, checker node-1, no panic", h)
	}
	list, _, err := reader.List(kubetest.Ctx(t), beacon.Query{Namespace: "demo"})
	if err != nil {
		t.Fatal(err)
	}
	for _, in := range list {
		if failing := in.Ref() == refs[0]; in.Serving() == failing {
			t.Fatalf("List: %s with health %+v serving=%v", in.Ref(), in.Health, in.Serving())
		}
	}

	hs.SetServingStatus("a", healthpb.HealthCheckResponse_SERVING)
	evs = f.transition(refs[0], beacon.HealthPassing)
	if len(evs) != 1 || evs[0].Type != beacon.Updated || !evs[0].Instance.Serving() {
		t.Fatalf("SERVING reached watchers as %+v, want one update of a serving instance", evs)
	}
	got, _ := f.v.Get(plain.Ref().String())
	if got.Health != nil || probed.Load() != 0 {
		t.Fatalf("the instance without a check carries %+v and was connected to %d times", got.Health, probed.Load())
	}
	if f.removed(refs[0]) {
		t.Fatal("a failing instance was removed from the watch")
	}
}

// Fail-open: a checker's verdicts count only while its pod is Ready. Not
// Ready, its failing verdict is ignored at once (the instance is served,
// health unknown); Ready again, it counts again; the pod deleted, it is
// ignored, and the garbage collector deletes the InstanceSet that held it.
func TestCheckerVerdictsFailOpen(t *testing.T) {
	cp := kubetest.Shared(t)
	ns := cp.Namespace(t)
	hs, refs := threeGRPCChecked(t, cp, ns)
	f := follow(t, cp.Registry(t, ns, nil, nil), beacon.Query{Namespace: "demo"})
	hs.SetServingStatus("a", healthpb.HealthCheckResponse_NOT_SERVING)
	pod := cp.ReadyPod(t, ns, "checker")
	startChecker(t, cp, ns, pod, "node-1")
	f.transition(refs[0], beacon.HealthFailing)

	start := time.Now()
	pod = cp.SetReady(t, pod, false)
	evs := f.transition(refs[0], beacon.HealthUnknown)
	t.Logf("checker's pod not Ready → its verdict ignored by a watcher in %v", time.Since(start).Round(time.Millisecond))
	if len(evs) != 1 || evs[0].Type != beacon.Updated || !evs[0].Instance.Serving() {
		t.Fatalf("the checker's pod not Ready reached watchers as %+v, want one update of a served instance", evs)
	}
	pod = cp.SetReady(t, pod, true)
	f.transition(refs[0], beacon.HealthFailing)

	cp.DeletePod(t, pod)
	f.transition(refs[0], beacon.HealthUnknown)
	cp.WaitGoneResource(t, kube.GVR, ns, pod.Name)
	if f.removed(refs[0]) {
		t.Fatal("a checked instance was removed from the watch")
	}
}

// Handover: a second checker joins and takes over some instances; once
// its own verdict on one shows, the first checker deletes its verdict on
// it from its InstanceSet (kept, it would come back should the second
// checker's pod stop being Ready). In the end each instance has a verdict
// in exactly one checker's InstanceSet.
func TestCheckersHandOverOnKubernetes(t *testing.T) {
	cp := kubetest.Shared(t)
	ns := cp.Namespace(t)
	addr, _ := countingListener(t)
	w := cp.Registry(t, ns, cp.ReadyPod(t, ns, "worker"), nil)
	var refs []beacon.Ref
	for range 8 {
		in := inst(addr)
		in.Check = &beacon.Check{Kind: beacon.CheckTCP, Interval: beacon.MinCheckInterval, Rise: 1, Fall: 1}
		refs = append(refs, register(t, w, in).Instance().Ref())
	}
	f := follow(t, cp.Registry(t, ns, nil, nil), beacon.Query{Namespace: "demo"})
	startChecker(t, cp, ns, cp.ReadyPod(t, ns, "checker-1"), "node-1")
	for _, ref := range refs {
		f.transition(ref, beacon.HealthPassing)
	}
	startChecker(t, cp, ns, cp.ReadyPod(t, ns, "checker-2"), "node-2")
	untilSets(t, cp, ns, "each instance's verdict in one checker's InstanceSet", func(sets map[string]*unstructured.Unstructured) bool {
		one, two := verdictKeys(sets["checker-1"]), verdictKeys(sets["checker-2"])
		for _, ref := range refs {
			if one[ref.String()] == two[ref.String()] {
				return false
			}
		}
		return len(one) > 0 && len(two) > 0
	})
}

// verdictKeys returns the keys of an InstanceSet's verdicts (none for nil).
func verdictKeys(u *unstructured.Unstructured) map[string]bool {
	out := map[string]bool{}
	if u == nil {
		return out
	}
	vs, _, _ := unstructured.NestedMap(u.Object, "spec", "verdicts")
	for k := range vs {
		out[k] = true
	}
	return out
}

// untilSets watches the InstanceSets of ns until cond holds for them (by
// name).
func untilSets(t *testing.T, cp *kubetest.ControlPlane, ns, what string, cond func(map[string]*unstructured.Unstructured) bool) {
	t.Helper()
	lw := &cache.ListWatch{
		ListWithContextFunc: func(ctx context.Context, o metav1.ListOptions) (runtime.Object, error) {
			return cp.Dynamic.Resource(kube.GVR).Namespace(ns).List(ctx, o)
		},
		WatchFuncWithContext: func(ctx context.Context, o metav1.ListOptions) (watch.Interface, error) {
			return cp.Dynamic.Resource(kube.GVR).Namespace(ns).Watch(ctx, o)
		},
	}
	sets := map[string]*unstructured.Unstructured{}
	_, err := watchtools.UntilWithSync(kubetest.Ctx(t), lw, &unstructured.Unstructured{}, func(store cache.Store) (bool, error) {
		for _, o := range store.List() {
			u := o.(*unstructured.Unstructured)
			sets[u.GetName()] = u
		}
		return cond(sets), nil
	}, func(e watch.Event) (bool, error) {
		u, ok := e.Object.(*unstructured.Unstructured)
		switch {
		case !ok:
		case e.Type == watch.Deleted:
			delete(sets, u.GetName())
		default:
			sets[u.GetName()] = u
		}
		return cond(sets), nil
	})
	if err != nil {
		t.Fatalf("waiting for %s: %v (InstanceSets %v)", what, err, sets)
	}
}

// A checker's verdicts edited by hand (another field manager adds one and
// changes one) are written back as the checker holds them, as its
// instances are.
func TestVerdictsEditedByHand(t *testing.T) {
	cp := kubetest.Shared(t)
	ns := cp.Namespace(t)
	pod := cp.ReadyPod(t, ns, "checker")
	r := cp.Registry(t, ns, pod, nil)
	sink, err := r.VerdictSink("node-1")
	if err != nil {
		t.Fatal(err)
	}
	ref := beacon.Ref{Namespace: "demo", Component: "api", Endpoint: "http", ID: "00000000000000a1"}
	ctx := kubetest.Ctx(t)
	if err := sink.PutVerdict(ctx, ref, beacon.Health{Status: beacon.HealthPassing, Since: time.Now().UTC(), Checker: "node-1"}); err != nil {
		t.Fatal(err)
	}
	only := func(sets map[string]*unstructured.Unstructured) bool {
		vs, _, _ := unstructured.NestedMap(sets[pod.Name].Object, "spec", "verdicts")
		v, _ := vs[ref.String()].(map[string]any)
		return len(vs) == 1 && v["status"] == "passing"
	}
	untilSets(t, cp, ns, "the checker's verdict", func(sets map[string]*unstructured.Unstructured) bool { return sets[pod.Name] != nil && only(sets) })
	patch := fmt.Sprintf(`{"spec":{"verdicts":{%q:{"status":"failing"},"demo/api/http/00000000000000ff":{"status":"failing"}}}}`, ref.String())
	edited, err := cp.Dynamic.Resource(kube.GVR).Namespace(ns).Patch(ctx, pod.Name, types.MergePatchType, []byte(patch),
		metav1.PatchOptions{FieldManager: "kubectl-edit"})
	if err != nil || len(verdictKeys(edited)) != 2 {
		t.Fatalf("the edit: %v, %v", err, edited)
	}
	// Whatever is listed from now on is the edit or later: its verdict
	// passing alone again is the checker's rewrite.
	untilSets(t, cp, ns, "the checker's verdict alone again", only)
	if err := sink.Close(); err != nil {
		t.Fatal(err)
	}
	untilSets(t, cp, ns, "no verdict after Close", func(sets map[string]*unstructured.Unstructured) bool {
		return sets[pod.Name] != nil && len(verdictKeys(sets[pod.Name])) == 0
	})
}

// A TTL check that reaches a checker anyway (an InstanceSet written by
// hand: Register refuses it) is not run: there is nowhere its service
// could report to. The checker warns, saying so, and the instance stays
// unknown (served) while the checker's other instances get verdicts.
func TestCheckerTTLWithoutStore(t *testing.T) {
	cp := kubetest.Shared(t)
	ns := cp.Namespace(t)
	pod := cp.ReadyPod(t, ns, "byhand")
	ttl := inst("10.9.0.1:80")
	ttl.ID, ttl.Status, ttl.RegisteredAt = "00000000000000a1", beacon.StatusServing, time.Now().UTC().Truncate(time.Second)
	ttl.Check = &beacon.Check{Kind: beacon.CheckTTL, TTL: time.Second, Interval: beacon.MinCheckInterval, Fall: 1}
	addr, _ := countingListener(t)
	tcp := ttl
	tcp.ID, tcp.Address = "00000000000000a2", addr
	tcp.Check = &beacon.Check{Kind: beacon.CheckTCP, Interval: beacon.MinCheckInterval, Rise: 1, Fall: 1}
	if _, err := cp.Dynamic.Resource(kube.GVR).Namespace(ns).Create(kubetest.Ctx(t), setObject(pod, ttl, tcp), metav1.CreateOptions{}); err != nil {
		t.Fatal(err)
	}
	f := follow(t, cp.Registry(t, ns, nil, nil), beacon.Query{Namespace: "demo"})
	logs := &warnLog{warned: make(chan string, 64)}
	startCheckerWith(t, cp, ns, cp.ReadyPod(t, ns, "checker"), "node-1", slog.New(logs))
	f.transition(tcp.Ref(), beacon.HealthPassing)
	for msg := ""; !strings.Contains(msg, "cannot run a TTL check"); {
		select {
		case msg = <-logs.warned:
		case <-kubetest.Ctx(t).Done():
			t.Fatal("no warning about the TTL check")
		}
		if strings.Contains(msg, "TTL") && (!strings.Contains(msg, "needs a store to report to") || !strings.Contains(msg, ttl.Ref().String())) {
			t.Fatalf("warning %q: want it to name the instance and say that a TTL check needs a store", msg)
		}
	}
	if got, _ := f.v.Get(ttl.Ref().String()); got.Health == nil || got.Health.Status != beacon.HealthUnknown || !got.Serving() {
		t.Fatalf("the TTL-checked instance: %+v, want unknown and served", got.Health)
	}
}

// warnLog is a slog handler that sends each warning, with its attributes,
// on warned.
type warnLog struct{ warned chan string }

func (h *warnLog) Enabled(_ context.Context, l slog.Level) bool { return l >= slog.LevelWarn }
func (h *warnLog) Handle(_ context.Context, r slog.Record) error {
	msg := r.Message
	r.Attrs(func(a slog.Attr) bool { msg += " " + a.String(); return true })
	select {
	case h.warned <- msg:
	default:
	}
	return nil
}
func (h *warnLog) WithAttrs([]slog.Attr) slog.Handler { return h }
func (h *warnLog) WithGroup(string) slog.Handler      { return h }

// A TTL check is refused on Kubernetes (no store for its reports), saying
// what to use instead, at Register and Update, and writes nothing; a grpc,
// http or tcp check is accepted and kept whole through the resource's
// schema. A registrant's Health is never taken: a checked instance is
// unknown until a checker's verdict, an unchecked one has none.
func TestHealthChecksDeclared(t *testing.T) {
	cp := kubetest.Shared(t)
	ns := cp.Namespace(t)
	r := cp.Registry(t, ns, cp.ReadyPod(t, ns, "checked"), nil)
	ctx := kubetest.Ctx(t)
	ttl := inst("10.12.0.1:80")
	ttl.Check = &beacon.Check{Kind: beacon.CheckTTL, TTL: 10 * time.Second}
	_, err := r.Register(ctx, ttl)
	if !errors.Is(err, kube.ErrHealthCheck) || !errors.Is(err, beacon.ErrInvalid) || !strings.Contains(err.Error(), "exec readinessProbe") {
		t.Fatalf("Register with a ttl check: %v, want ErrHealthCheck (and ErrInvalid) naming an exec readinessProbe", err)
	}
	checked := inst("10.12.0.2:80")
	checked.Check = &beacon.Check{Kind: beacon.CheckHTTP, Path: "/healthz", Interval: 2 * time.Second, Timeout: time.Second, Rise: 3, Fall: 4}
	checked.Health = &beacon.Health{Status: beacon.HealthFailing}
	reg := register(t, r, checked)
	if h := reg.Instance().Health; h != nil {
		t.Fatalf("a registration carries health %+v", h)
	}
	err = reg.Update(ctx, func(in *beacon.Instance) { in.Check = &beacon.Check{Kind: beacon.CheckTTL, TTL: time.Minute} })
	if !errors.Is(err, kube.ErrHealthCheck) {
		t.Fatalf("Update to a ttl check: %v, want ErrHealthCheck", err)
	}
	plain := register(t, r, inst("10.12.0.3:80")).Instance()
	got, _, err := r.List(ctx, beacon.Query{Namespace: "demo"})
	if err != nil || len(got) != 2 {
		t.Fatalf("List = %+v, %v", got, err)
	}
	for _, in := range got {
		switch in.Ref() {
		case plain.Ref():
			if in.Check != nil || in.Health != nil {
				t.Errorf("the unchecked instance carries %+v, %+v", in.Check, in.Health)
			}
		default:
			if *in.Check != *checked.Check || in.Health == nil || in.Health.Status != beacon.HealthUnknown || !in.Serving() {
				t.Errorf("the checked instance reads back as %+v, health %+v; want its check whole, unknown, served", in.Check, in.Health)
			}
		}
	}
}

// A checker keeps its verdicts in its pod's InstanceSet: without a pod
// identity there is none, and the error says what is missing.
func TestVerdictSinkNeedsPodIdentity(t *testing.T) {
	cp := kubetest.Shared(t)
	ns := cp.Namespace(t)
	var keeper registry.VerdictKeeper = cp.Registry(t, ns, nil, nil)
	if _, err := keeper.VerdictSink("node-1"); !errors.Is(err, kube.ErrNoPodIdentity) {
		t.Fatalf("VerdictSink without a pod identity: %v, want ErrNoPodIdentity", err)
	}
	_, err := health.New(health.Config{ID: "node-1", Addr: "127.0.0.1:9379", Registry: keeper.(registry.Registry)})
	if !errors.Is(err, health.ErrInvalidConfig) || !errors.Is(err, kube.ErrNoPodIdentity) || !strings.Contains(err.Error(), "POD_NAME, POD_NAMESPACE, POD_UID") {
		t.Fatalf("a checker over a registry without a pod identity: %v, want an error naming the variables", err)
	}
}
