package kube_test

import (
	"context"
	"errors"
	"fmt"
	"log/slog"
	"os"
	"slices"
	"strings"
	"testing"

	"github.com/beaconplane/beacon"
	"github.com/beaconplane/beacon/internal/testkit/kubetest"
	"github.com/beaconplane/beacon/registry/kube"
	"github.com/beaconplane/beacon/registry/registrytest"
	"github.com/beaconplane/beacon/store"
	rbacv1 "k8s.io/api/rbac/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/client-go/rest"
	"sigs.k8s.io/yaml"
)

// shipped decodes the (first) object of kind in a deploy/kubernetes file
// into out.
func shipped(t *testing.T, file, kind string, out any) { shippedNamed(t, file, kind, "", out) }

// shippedNamed decodes the object of kind named name ("" for the first)
// in a deploy/kubernetes file into out.
func shippedNamed(t *testing.T, file, kind, name string, out any) {
	t.Helper()
	b, err := os.ReadFile("../../deploy/kubernetes/" + file)
	if err != nil {
		t.Fatal(err)
	}
	for _, doc := range strings.Split(string(b), "\n---\n") {
		var meta struct {
			Kind     string
			Metadata struct{ Name string }
		}
		if err := yaml.Unmarshal([]byte(doc), &meta); err != nil {
			t.Fatal(err)
		}
		if meta.Kind == kind && (name == "" || meta.Metadata.Name == name) {
			if err := yaml.UnmarshalStrict([]byte(doc), out); err != nil {
				t.Fatal(err)
			}
			return
		}
	}
	t.Fatalf("no %s %q in %s", kind, name, file)
}

// shippedRole returns the Role of deploy/kubernetes/rbac.yaml.
func shippedRole(t *testing.T) *rbacv1.Role {
	var role rbacv1.Role
	shipped(t, "rbac.yaml", "Role", &role)
	return &role
}

// A reader of every namespace with only the shipped ClusterRole
// (rbac-cluster.yaml) lists and watches across namespaces; with only the
// namespaced Role it is refused, naming the cluster-wide verbs.
func TestRBACAllNamespaces(t *testing.T) {
	cp := kubetest.Shared(t)
	ns := cp.Namespace(t)
	in := register(t, cp.Registry(t, ns, cp.ReadyPod(t, ns, "w"), nil), inst("10.13.0.1:80")).Instance()
	var cr rbacv1.ClusterRole
	shipped(t, "rbac-cluster.yaml", "ClusterRole", &cr)
	rc := cp.ServiceAccount(t, ns, "all-reader", nil)
	cp.BindCluster(t, ns, "all-reader", &cr)
	all := func(c *kube.Config) { c.REST, c.Namespaces = rc, []string{kube.AllNamespaces} }
	r := cp.Registry(t, ns, nil, all)
	got, _, err := r.List(kubetest.Ctx(t), beacon.Query{Namespace: "demo", Component: "api"})
	if err != nil || !slicesHas(got, in) {
		t.Fatalf("List in every namespace with the ClusterRole: %v, %v", got, err)
	}
	f := follow(t, r, beacon.Query{Namespace: "demo"})
	f.until("the instance", func(v *registrytest.View) bool { return has(v, in) })

	nsOnly := cp.ServiceAccount(t, ns, "ns-reader", shippedRole(t).Rules)
	_, _, err = cp.Registry(t, ns, nil, func(c *kube.Config) { c.REST, c.Namespaces = nsOnly, []string{kube.AllNamespaces} }).
		List(kubetest.Ctx(t), beacon.Query{})
	if !errors.Is(err, kube.ErrForbidden) || !strings.Contains(err.Error(), "cluster-wide") ||
		!strings.Contains(err.Error(), "rbac-cluster.yaml") {
		t.Fatalf("List in every namespace with only the Role: %v", err)
	}
	// Without the pre-check, the request's own denial says the same.
	r = cp.Registry(t, ns, nil, func(c *kube.Config) { c.REST, c.Namespaces = nsOnly, []string{kube.AllNamespaces} })
	kube.DisableAccessCheck(r)
	if _, _, err = r.List(kubetest.Ctx(t), beacon.Query{}); !errors.Is(err, kube.ErrForbidden) || !strings.Contains(err.Error(), "rbac-cluster.yaml") {
		t.Fatalf("List in every namespace with only the Role, no access check: %v", err)
	}
}

// A client without credentials (system:anonymous) is told to fix its
// credentials, not to grant a Role.
func TestAnonymous(t *testing.T) {
	cp := kubetest.Shared(t)
	_, err := kube.Open(kubetest.Ctx(t), kube.Config{REST: &rest.Config{Host: cp.Host(), TLSClientConfig: rest.TLSClientConfig{CAData: cp.Admin().CAData}}})
	if !errors.Is(err, kube.ErrForbidden) || !strings.Contains(err.Error(), "system:anonymous") || strings.Contains(err.Error(), "grant it") {
		t.Fatalf("Open without credentials: %v", err)
	}
	t.Log(err)
}

// firstDenial runs every operation (Register with a caller-chosen ID, List,
// Watch until its first batch, Close) and returns the first error matching
// kube.ErrForbidden that names want ("verb resource"), or nil.
func firstDenial(t *testing.T, r *kube.Registry, want string) error {
	t.Helper()
	ctx := kubetest.Ctx(t)
	var errs []error
	in := inst("10.6.1.1:80")
	in.ID = "00000000000000f1"
	_, err := r.Register(ctx, in)
	errs = append(errs, err)
	_, _, err = r.List(ctx, beacon.Query{})
	errs = append(errs, err)
	w, err := r.Watch(ctx, beacon.Query{})
	errs = append(errs, err)
	if err == nil {
		b, err := w.Next(ctx)
		errs = append(errs, err, b.Err)
		_ = w.Close()
	}
	errs = append(errs, r.Close())
	for _, err := range errs {
		if errors.Is(err, kube.ErrForbidden) && strings.Contains(err.Error(), want) {
			return err
		}
	}
	t.Logf("errors: %v", errs)
	return nil
}

// A worker and a reader whose ServiceAccounts have exactly the shipped
// Role register, list and watch; with any one verb of it removed, the
// operation that needs it fails with an error naming the verb and the
// resource (so the Role holds no verb that is not used).
func TestRBAC(t *testing.T) {
	cp := kubetest.Shared(t)
	ns := cp.Namespace(t)
	role := shippedRole(t)
	pod := cp.ReadyPod(t, ns, "worker")

	var readerRole rbacv1.Role
	shippedNamed(t, "rbac.yaml", "Role", "beacon-discovery-reader", &readerRole)
	worker := cp.ServiceAccount(t, ns, "worker", role.Rules)
	reader := cp.ServiceAccount(t, ns, "reader", readerRole.Rules)
	w := cp.Registry(t, ns, pod, func(c *kube.Config) { c.REST = worker })
	r := cp.Registry(t, ns, nil, func(c *kube.Config) { c.REST = reader })
	f := follow(t, r, beacon.Query{Namespace: "demo"})
	reg := register(t, w, inst("10.6.0.1:80"))
	f.until("the worker's instance", func(v *registrytest.View) bool { return has(v, reg.Instance()) })
	if vis, err := w.Visibility(kubetest.Ctx(t)); err != nil || !vis.Visible {
		t.Fatalf("Visibility with the shipped Role: %+v, %v", vis, err)
	}
	explicit := inst("10.6.0.2:80")
	explicit.ID = "00000000000000e1"
	register(t, w, explicit) // a caller-chosen ID is checked with list
	if err := w.Close(); err != nil {
		t.Fatalf("Close (deletes the InstanceSet) with the shipped Role: %v", err)
	}
	f.until("the removal", func(v *registrytest.View) bool { return v.Len() == 0 })

	// The reader's Role writes nothing: a process with it and a pod
	// identity may not register.
	readerPod := cp.ReadyPod(t, ns, "reader")
	_, err := cp.Registry(t, ns, readerPod, func(c *kube.Config) { c.REST = reader }).Register(kubetest.Ctx(t), inst("10.6.0.3:80"))
	if !errors.Is(err, kube.ErrForbidden) || !strings.Contains(err.Error(), "create instancesets") {
		t.Fatalf("Register with the reader's Role: %v", err)
	}
	// Nor keep a health checker's verdicts, which live in its InstanceSet.
	sink, err := cp.Registry(t, ns, readerPod, func(c *kube.Config) { c.REST = reader }).VerdictSink("node-1")
	if err != nil {
		t.Fatal(err)
	}
	err = sink.PutVerdict(kubetest.Ctx(t), explicit.Ref(), beacon.Health{Status: beacon.HealthPassing})
	if !errors.Is(err, kube.ErrForbidden) || !strings.Contains(err.Error(), "patch instancesets") {
		t.Fatalf("a verdict with the reader's Role: %v", err)
	}
	// Each of its verbs is used by a reader.
	for i, rule := range readerRole.Rules {
		for _, verb := range rule.Verbs {
			rules := make([]rbacv1.PolicyRule, len(readerRole.Rules))
			for j, r := range readerRole.Rules {
				rules[j] = *r.DeepCopy()
			}
			rules[i].Verbs = slices.DeleteFunc(rules[i].Verbs, func(v string) bool { return v == verb })
			want := verb + " " + rule.Resources[0]
			rc := cp.ServiceAccount(t, ns, fmt.Sprintf("reader-no-%s-%s", verb, strings.ReplaceAll(rule.Resources[0], ".", "-")), rules)
			r := cp.Registry(t, ns, nil, func(c *kube.Config) { c.REST = rc })
			kube.DisableAccessCheck(r)
			if err := firstDenial(t, r, want); err == nil {
				t.Fatalf("a reader without %s never failed: the reader's Role holds a verb readers do not use", want)
			}
		}
	}

	for i, rule := range role.Rules {
		for _, verb := range rule.Verbs {
			resource := rule.Resources[0]
			t.Run(verb+"_"+resource, func(t *testing.T) {
				rules := make([]rbacv1.PolicyRule, len(role.Rules))
				for j, r := range role.Rules {
					rules[j] = *r.DeepCopy()
				}
				rules[i].Verbs = slices.DeleteFunc(rules[i].Verbs, func(v string) bool { return v == verb })
				if len(rules[i].Verbs) == 0 {
					rules = slices.Delete(rules, i, i+1)
				}
				sa := fmt.Sprintf("no-%s-%s", verb, strings.ReplaceAll(resource, ".", "-"))
				rc := cp.ServiceAccount(t, ns, sa, rules)
				pod := cp.ReadyPod(t, ns, sa)
				// With the access pre-check (what users get): the error
				// names the missing permission before anything is tried.
				checked := cp.Registry(t, ns, pod, func(c *kube.Config) { c.REST = rc })
				want := verb + " " + resource
				if err := firstDenial(t, checked, want); err == nil {
					t.Fatalf("without %s: no operation failed with an error naming it", want)
				} else {
					t.Logf("checked: %v", err)
				}
				// Without it, the requests themselves fail: the verb is used.
				raw := cp.Registry(t, ns, pod, func(c *kube.Config) { c.REST = rc })
				kube.DisableAccessCheck(raw)
				if err := firstDenial(t, raw, want); err == nil {
					t.Fatalf("without %s and without the pre-check, every operation succeeded: the verb is not used", want)
				} else {
					t.Logf("unchecked: %v", err)
				}
			})
		}
	}
}

// Ping (beacon serve's /readyz) fails, naming what is denied, when the
// reader may not read one of its namespaces: it answered ready while every
// List and Watch failed with the RBAC error.
func TestPingChecksReadAccess(t *testing.T) {
	cp := kubetest.Shared(t)
	ns, other := cp.Namespace(t), cp.Namespace(t)
	var readerRole rbacv1.Role
	shippedNamed(t, "rbac.yaml", "Role", "beacon-discovery-reader", &readerRole)
	reader := cp.ServiceAccount(t, ns, "reader", readerRole.Rules)
	ok := cp.Registry(t, ns, nil, func(c *kube.Config) { c.REST, c.Namespaces = reader, []string{ns} })
	if err := ok.Ping(kubetest.Ctx(t)); err != nil {
		t.Fatalf("Ping of a reader of its own namespace: %v", err)
	}
	both := cp.Registry(t, ns, nil, func(c *kube.Config) { c.REST, c.Namespaces = reader, []string{ns, other} })
	err := both.Ping(kubetest.Ctx(t))
	if !errors.Is(err, kube.ErrForbidden) || !strings.Contains(err.Error(), "list instancesets.discovery.beaconplane.io in namespace \""+other+"\"") {
		t.Fatalf("Ping of a reader of %s and %s, denied in %s: %v", ns, other, other, err)
	}
	// A server over this registry answers 503 "unavailable" (it answered
	// 500 "internal"): the error also matches store.ErrUnavailable.
	if _, _, lerr := both.List(kubetest.Ctx(t), beacon.Query{}); !errors.Is(lerr, kube.ErrForbidden) || !errors.Is(lerr, store.ErrUnavailable) {
		t.Fatalf("List: %v", lerr)
	}
	if _, werr := both.Watch(kubetest.Ctx(t), beacon.Query{}); !errors.Is(werr, kube.ErrForbidden) || !errors.Is(werr, store.ErrUnavailable) {
		t.Fatalf("Watch: %v", werr)
	}
}

// A registering process whose watch of its own InstanceSet is denied (the
// Role changed under it, or one without watch and no pre-check) says so:
// it logged only client-go's raw retries, and a deletion of its InstanceSet
// then went unnoticed, the instance silently unadvertised. The warning and
// Registration.Err name the verb and resource; once watch is granted again
// the writer follows again.
func TestOwnWatchDeniedIsReported(t *testing.T) {
	cp := kubetest.Shared(t)
	ns := cp.Namespace(t)
	role := shippedRole(t)
	rules := make([]rbacv1.PolicyRule, len(role.Rules))
	for i, r := range role.Rules {
		rules[i] = *r.DeepCopy()
	}
	rules[0].Verbs = slices.DeleteFunc(rules[0].Verbs, func(v string) bool { return v == "watch" })
	rc := cp.ServiceAccount(t, ns, "no-watch", rules)
	logs := &signalHandler{ch: make(chan slog.Record, 16)}
	r := cp.Registry(t, ns, cp.ReadyPod(t, ns, "w"), func(c *kube.Config) { c.REST, c.Logger = rc, slog.New(logs) })
	kube.DisableAccessCheck(r)
	reg := register(t, r, inst("10.6.2.1:80"))
	rec := logs.wait(t, "cannot follow this process's InstanceSet")
	if err := attr(rec, "err"); !strings.Contains(err, "may not watch instancesets.discovery.beaconplane.io in namespace \""+ns+"\"") {
		t.Fatalf("warning's err = %q, want it to name the verb and resource", err)
	}
	if err := reg.Err(); !errors.Is(err, kube.ErrForbidden) || !strings.Contains(err.Error(), "watch instancesets") {
		t.Fatalf("Registration.Err() = %v, want the denied watch", err)
	}
	rules[0].Verbs = append(rules[0].Verbs, "watch")
	ctx := kubetest.Ctx(t)
	cur, err := cp.RBAC.Roles(ns).Get(ctx, "no-watch", metav1.GetOptions{})
	if err != nil {
		t.Fatal(err)
	}
	cur.Rules = rules
	if _, err := cp.RBAC.Roles(ns).Update(ctx, cur, metav1.UpdateOptions{}); err != nil {
		t.Fatal(err)
	}
	logs.wait(t, "following this process's InstanceSet again")
	if err := reg.Err(); err != nil {
		t.Fatalf("Registration.Err() once watch is granted = %v", err)
	}
}

// signalHandler passes every log record to ch (dropping when it is full).
type signalHandler struct{ ch chan slog.Record }

func (h *signalHandler) Enabled(context.Context, slog.Level) bool { return true }
func (h *signalHandler) Handle(_ context.Context, rec slog.Record) error {
	select {
	case h.ch <- rec.Clone():
	default:
	}
	return nil
}
func (h *signalHandler) WithAttrs([]slog.Attr) slog.Handler { return h }
func (h *signalHandler) WithGroup(string) slog.Handler      { return h }

// wait returns the first record whose message contains msg.
func (h *signalHandler) wait(t *testing.T, msg string) slog.Record {
	t.Helper()
	ctx := kubetest.Ctx(t)
	for {
		select {
		case rec := <-h.ch:
			if strings.Contains(rec.Message, msg) {
				return rec
			}
		case <-ctx.Done():
			t.Fatalf("no log %q", msg)
		}
	}
}

// attr returns a record's attribute as text.
func attr(rec slog.Record, key string) string {
	var out string
	rec.Attrs(func(a slog.Attr) bool {
		if a.Key == key {
			out = a.Value.String()
			return false
		}
		return true
	})
	return out
}

// A namespace readers watch that does not exist (a typo in
// BEACON_KUBE_NAMESPACES) is named: a reader that may read it everywhere
// listed nothing there in silence ('beacon ls' printed "no instances",
// exit 0), and one whose Role could not cover it was told to grant a Role,
// which no namespace that does not exist can hold. The first gets a
// warning, the second an ErrInvalidConfig naming the namespace (when it
// may get namespaces; otherwise the RBAC error stands).
func TestMissingNamespaceIsNamed(t *testing.T) {
	cp := kubetest.Shared(t)
	ns := cp.Namespace(t)
	missing := ns + "-typo"
	logs := &signalHandler{ch: make(chan slog.Record, 16)}
	admin := cp.Registry(t, ns, nil, func(c *kube.Config) { c.Namespaces, c.Logger = []string{ns, missing}, slog.New(logs) })
	if _, _, err := admin.List(kubetest.Ctx(t), beacon.Query{}); err != nil {
		t.Fatalf("List: %v", err)
	}
	if rec := logs.wait(t, "does not exist"); !strings.Contains(attr(rec, "namespaces"), missing) {
		t.Fatalf("warning names %s, want %s", attr(rec, "namespaces"), missing)
	}

	var readerRole rbacv1.Role
	shippedNamed(t, "rbac.yaml", "Role", "beacon-discovery-reader", &readerRole)
	rc := cp.ServiceAccount(t, ns, "reader", readerRole.Rules)
	cp.BindCluster(t, ns, "reader", &rbacv1.ClusterRole{
		ObjectMeta: metav1.ObjectMeta{Name: "get-namespaces"},
		Rules:      []rbacv1.PolicyRule{{APIGroups: []string{""}, Resources: []string{"namespaces"}, Verbs: []string{"get"}}},
	})
	r := cp.Registry(t, ns, nil, func(c *kube.Config) { c.REST, c.Namespaces = rc, []string{ns, missing} })
	_, _, err := r.List(kubetest.Ctx(t), beacon.Query{})
	if !errors.Is(err, kube.ErrInvalidConfig) || !strings.Contains(err.Error(), "namespace \""+missing+"\" does not exist") {
		t.Fatalf("List by a reader of %s and the missing %s: %v", ns, missing, err)
	}
	if _, err := r.Watch(kubetest.Ctx(t), beacon.Query{}); !errors.Is(err, kube.ErrInvalidConfig) {
		t.Fatalf("Watch: %v", err)
	}
}
