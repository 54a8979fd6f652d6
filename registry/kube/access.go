package kube

import (
	"context"
	"errors"
	"fmt"
	"strconv"
	"strings"
	"sync"

	apierrors "k8s.io/apimachinery/pkg/api/errors"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/apis/meta/v1/unstructured"
)

// permission is one RBAC permission the registry needs.
type permission struct {
	verb      string
	group     string
	resource  string
	namespace string // "" for every namespace
	why       string
}

func (p permission) String() string {
	res := p.resource
	if p.group != "" {
		res += "." + p.group
	}
	return fmt.Sprintf("%s %s %s", p.verb, res, op{namespace: p.namespace}.where())
}

// readerPermissions are what List and Watch use, per watched namespace.
func (r *Registry) readerPermissions() []permission {
	var ps []permission
	for _, ns := range r.namespaces {
		for _, verb := range []string{"list", "watch"} {
			ps = append(ps,
				permission{verb, r.kind.group, r.kind.resource, ns, "to read " + r.kind.kind + "s"},
				permission{verb, "discovery.k8s.io", "endpointslices", ns, "to read which pods are Ready"})
		}
	}
	return ps
}

// writerPermissions are what Register and Close use in the pod's namespace.
func (r *Registry) writerPermissions() []permission {
	ns := r.cfg.Pod.Namespace
	return []permission{
		{"get", "", "pods", ns, "to check POD_UID against the pod"},
		{"create", Group, Resource, ns, "to create this process's InstanceSet (server-side apply of a new object)"},
		{"patch", Group, Resource, ns, "to write this process's InstanceSet (server-side apply): its instances, and its health checker's verdicts"},
		{"delete", Group, Resource, ns, "to delete it on Close"},
		{"list", Group, Resource, ns, "to check instance IDs against other processes and follow this process's InstanceSet"},
		{"watch", Group, Resource, ns, "to follow this process's InstanceSet (re-written if deleted)"},
	}
}

// checkAccess asks the API server (SelfSubjectAccessReview) whether every
// permission is granted, and returns one error naming each that is not.
// If the review itself cannot be made, the check is skipped: the requests
// themselves then fail with an error naming verb and resource.
func (r *Registry) checkAccess(ctx context.Context, ps []permission) error {
	if r.noAccessCheck {
		return nil
	}
	ctx, cancel := context.WithTimeout(ctx, r.cfg.Timeout)
	defer cancel()
	type result struct {
		p       permission
		allowed bool
		err     error
	}
	results := make([]result, len(ps))
	var wg sync.WaitGroup
	for i, p := range ps {
		wg.Add(1)
		go func() {
			defer wg.Done()
			review := &unstructured.Unstructured{Object: map[string]any{
				"apiVersion": "authorization.k8s.io/v1",
				"kind":       "SelfSubjectAccessReview",
				"spec": map[string]any{"resourceAttributes": map[string]any{
					"namespace": p.namespace, "verb": p.verb, "group": p.group, "resource": p.resource,
				}},
			}}
			res, err := r.dyn.Resource(accessReviewGVR).Create(ctx, review, metav1.CreateOptions{})
			results[i] = result{p: p, err: err}
			if err == nil {
				results[i].allowed, _, _ = unstructured.NestedBool(res.Object, "status", "allowed")
			}
		}()
	}
	wg.Wait()
	var denied []string
	clusterWide := false
	for _, res := range results {
		if res.err != nil {
			if isUnreachable(res.err) {
				return r.explain(op{verb: "create", resource: "selfsubjectaccessreviews.authorization.k8s.io"}, res.err)
			}
			r.log.Debug("cannot check access rights; relying on the requests' own errors", "err", res.err)
			return nil
		}
		if !res.allowed {
			denied = append(denied, res.p.String()+" ("+res.p.why+")")
			clusterWide = clusterWide || res.p.namespace == ""
		}
	}
	if len(denied) == 0 {
		return nil
	}
	return fmt.Errorf("%w: %s may not %s: %s", ErrForbidden, r.whoAmI(ctx), strings.Join(denied, "; "), r.grantHint(clusterWide))
}

// grantHint says which shipped RBAC grants what was denied: the namespaced
// Role, or, for every namespace, the ClusterRole.
func (r *Registry) grantHint(clusterWide bool) string {
	if clusterWide {
		return "reading every namespace needs a ClusterRole: grant it with " + r.kind.clusterRole + ", its binding naming the ServiceAccount"
	}
	return "grant it with " + r.kind.role + " bound to its ServiceAccount"
}

// whoAmI names the authenticated user for error messages.
func (r *Registry) whoAmI(ctx context.Context) string {
	res, err := r.dyn.Resource(subjectReviewGVR).Create(ctx, &unstructured.Unstructured{Object: map[string]any{
		"apiVersion": "authentication.k8s.io/v1", "kind": "SelfSubjectReview",
	}}, metav1.CreateOptions{})
	if err != nil {
		return "this client"
	}
	name, _, _ := unstructured.NestedString(res.Object, "status", "userInfo", "username")
	if name == "" {
		return "this client"
	}
	return fmt.Sprintf("user %q", name)
}

// checkReader checks the reader permissions once (successful checks are
// remembered).
func (r *Registry) checkReader(ctx context.Context) error {
	return unavailable(r.checkReaderOnce(ctx))
}

func (r *Registry) checkReaderOnce(ctx context.Context) error {
	r.readMu.Lock()
	defer r.readMu.Unlock()
	if r.readOK {
		return nil
	}
	err := r.checkAccess(ctx, r.readerPermissions())
	missing := r.missingNamespaces(ctx)
	if len(missing) > 0 && errors.Is(err, ErrForbidden) {
		// No Role can grant reads in a namespace that does not exist: the
		// namespace is what is wrong, most likely a typo.
		return fmt.Errorf("%w: %s %s not exist: check which namespaces readers watch (%s, %s, "+
			"else the kubeconfig context's namespace)", ErrInvalidConfig, quoteNamespaces(missing), doesNot(missing), EnvNamespaces, EnvPodNamespace)
	}
	if err != nil {
		return err
	}
	if len(missing) > 0 {
		r.log.Warn("a namespace readers watch does not exist: nothing is read there until it is created; check "+
			EnvNamespaces+" (or "+EnvPodNamespace+", the kubeconfig context's namespace) for a typo",
			"namespaces", missing)
	}
	r.readOK = true
	return nil
}

// missingNamespaces returns the watched namespaces that the API server
// says do not exist. It is best effort: a client that may not get
// namespaces (a reader with the namespaced Role) learns nothing.
func (r *Registry) missingNamespaces(ctx context.Context) []string {
	ctx, cancel := context.WithTimeout(ctx, r.cfg.Timeout)
	defer cancel()
	var out []string
	for _, ns := range r.namespaces {
		if ns == "" {
			continue
		}
		if err := r.rawGet(ctx, "/api/v1/namespaces/"+ns, nil); apierrors.IsNotFound(err) {
			out = append(out, ns)
		}
	}
	return out
}

func quoteNamespaces(nss []string) string {
	q := make([]string, len(nss))
	for i, ns := range nss {
		q[i] = strconv.Quote(ns)
	}
	if len(q) == 1 {
		return "namespace " + q[0]
	}
	return "namespaces " + strings.Join(q, ", ")
}

func doesNot(nss []string) string {
	if len(nss) == 1 {
		return "does"
	}
	return "do"
}
