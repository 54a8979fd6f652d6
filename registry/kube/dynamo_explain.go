package kube

import (
	"context"
	"fmt"
	"strings"

	"github.com/beaconplane/beacon"
	"github.com/beaconplane/beacon/dynamo"
	"github.com/beaconplane/beacon/registry"
	apierrors "k8s.io/apimachinery/pkg/api/errors"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/apis/meta/v1/unstructured"
)

// Explain says why a Dynamo frontend would or would not see the instance
// at ref (dynamo.Explain: `beacon dynamo explain --backend kubernetes`),
// from the DynamoWorkerMetadata resources of the watched namespaces that
// hold entries of ref's component. Each entry is checked with its
// resource's pod in place of etcd's lease: the pod its ownerReference
// names exists with that UID ("pod"), and is Ready in an EndpointSlice of
// its namespace with Dynamo's labels ("readiness"), as for List. It reads
// what List reads, and gets pods (without that right the pod check says it
// cannot tell, and readiness, matched by the owner's UID, still decides).
// A resource whose spec.data Beacon cannot read at all is left out, as
// List leaves it out.
func (d *Dynamo) Explain(ctx context.Context, ref beacon.Ref) (dynamo.Explanation, error) {
	r := d.r
	if r.closed.Load() {
		return dynamo.Explanation{}, registry.ErrClosed
	}
	if err := ref.Validate(); err != nil {
		return dynamo.Explanation{}, err
	}
	if err := r.checkReader(ctx); err != nil {
		return dynamo.Explanation{}, err
	}
	src := &explainSource{ctx: ctx, r: r, owners: map[string]owner{}}
	var kvs []dynamo.KV
	prefixes := dynamo.ComponentPrefixes(ref)
	for _, ns := range r.namespaces {
		list, err := r.dyn.Resource(r.kind.gvr()).Namespace(ns).List(ctx, metav1.ListOptions{})
		if err != nil {
			return dynamo.Explanation{}, unavailable(r.explain(op{"list", r.kind.rbacName(), ns}, err))
		}
		for i := range list.Items {
			u := &list.Items[i]
			entries, err := objectEntries(u)
			if err != nil {
				continue
			}
			held := false
			for _, kv := range entries {
				if strings.HasPrefix(kv.Key, prefixes[0]) || strings.HasPrefix(kv.Key, prefixes[1]) {
					kvs, held = append(kvs, kv), true
				}
			}
			if held {
				src.owners[u.GetNamespace()+"/"+u.GetName()] = ownerOf(u)
			}
		}
	}
	return dynamo.Explain(ref, kvs, src), nil
}

// owner is what a DynamoWorkerMetadata says of its pod.
type owner struct {
	resource             string // its name
	namespace, name, uid string
	err                  error // no single owner pod (setInfo.ownerPod)
	deleting             string
}

func ownerOf(u *unstructured.Unstructured) owner {
	var s setInfo
	o := owner{resource: u.GetName(), namespace: u.GetNamespace(), err: s.ownerPod(u)}
	o.name, o.uid = s.podName, s.podUID
	if ts := u.GetDeletionTimestamp(); ts != nil {
		o.deleting = fmt.Sprintf("; the resource is being deleted (since %s), held by its finalizers %s",
			ts.UTC().Format("2006-01-02T15:04:05Z"), strings.Join(u.GetFinalizers(), ", "))
	}
	return o
}

// explainSource is the dynamo.Source of DynamoWorkerMetadata entries: a
// resource's entries live while its pod is Ready.
type explainSource struct {
	ctx    context.Context // the caller's, for the pod and slice reads of Live
	r      *Registry
	owners map[string]owner // by resource (namespace/name)
}

var _ dynamo.Source = (*explainSource)(nil)

// Where names an entry by its resource and its place in spec.data.
func (s *explainSource) Where(kv dynamo.KV) string {
	path := entryPath(strings.TrimSuffix(kv.Key, "/"))
	if kv.Holder == "" {
		return path + " of any " + DynamoKind + " in " + s.namespaces()
	}
	return DynamoKind + " " + kv.Holder + " " + path
}

func (s *explainSource) namespaces() string {
	if s.r.namespaces[0] == "" {
		return "any namespace"
	}
	return quoteNamespaces(s.r.namespaces)
}

func (s *explainSource) Missing() string {
	return "no pod of " + s.namespaces() + " (the namespaces Beacon reads: " + EnvNamespaces + ") registered it: check that the worker runs " +
		"there with DYN_DISCOVERY_BACKEND=kubernetes (Dynamo's operator sets it), and its logs; its runtime writes the entry when " +
		"the endpoint starts serving (kubectl get " + DynamoResource + " -n NAMESPACE -o yaml)"
}

func (s *explainSource) Stale(kvs []dynamo.KV) string {
	var holders []string
	for _, kv := range kvs {
		if len(holders) == 0 || holders[len(holders)-1] != kv.Holder {
			holders = append(holders, kv.Holder)
		}
	}
	kind := strings.ToLower(DynamoKind)
	ns, name, _ := strings.Cut(holders[0], "/")
	switch {
	case len(holders) == 1 && len(kvs) > 1: // two keys of one instance in one resource
		return fmt.Sprintf("restart the pod of %s %s (its runtime writes the resource anew), or edit the stale entry out "+
			"(kubectl edit %s -n %s %s)", DynamoKind, holders[0], kind, ns, name)
	case len(holders) == 1:
		return fmt.Sprintf("delete the stale resource %s (kubectl delete %s -n %s %s); the garbage collector deletes a "+
			"resource with its pod", holders[0], kind, ns, name)
	}
	return fmt.Sprintf("delete the stale ones among %s (kubectl delete %s -n NAMESPACE NAME); the garbage collector "+
		"deletes a resource with its pod", strings.Join(holders, ", "), kind)
}

// Live checks the resource's pod and, if it is there (or cannot be told),
// the pod's readiness.
func (s *explainSource) Live(kv dynamo.KV) []dynamo.Check {
	o := s.owners[kv.Holder]
	if o.err != nil {
		return []dynamo.Check{{Check: "pod", Verdict: dynamo.Fail, Found: o.err.Error() + o.deleting,
			Do: "the Dynamo runtime writes its resource owned by its pod (one ownerReference, kind Pod, with its uid); something else " +
				"wrote this one: delete it, and restart the worker to write its own"}}
	}
	pc := s.podCheck(o)
	if pc.Verdict == dynamo.Fail {
		return []dynamo.Check{pc} // no pod of the owner's UID to be Ready
	}
	return []dynamo.Check{pc, s.readinessCheck(o)}
}

func (s *explainSource) podCheck(o owner) dynamo.Check {
	pod := o.namespace + "/" + o.name
	uid, err := s.r.podUID(s.ctx, o.namespace, o.name)
	switch {
	case apierrors.IsNotFound(err):
		return dynamo.Check{Check: "pod", Verdict: dynamo.Fail,
			Found: fmt.Sprintf("pod %s (UID %s), the resource's owner, does not exist%s", pod, o.uid, o.deleting),
			Do: "the garbage collector (in kube-controller-manager) deletes a resource whose owner pod is gone: it has not yet, " +
				"a finalizer holds the resource, or the collector is not running; delete the resource (kubectl delete " +
				strings.ToLower(DynamoKind) + " -n " + o.namespace + " " + o.resource + ")"}
	case err != nil:
		return dynamo.Check{Check: "pod", Verdict: dynamo.Warn,
			Found: fmt.Sprintf("pod %s (UID %s): cannot tell whether it exists: %v", pod, o.uid, s.r.explain(op{"get", podsResource, o.namespace}, err)),
			Do:    "readiness (below) matches the owner's UID all the same; to check the pod too, grant get on pods"}
	case uid != o.uid:
		return dynamo.Check{Check: "pod", Verdict: dynamo.Fail,
			Found: fmt.Sprintf("pod %s is another pod (UID %s) than the resource's owner (UID %s)%s", pod, uid, o.uid, o.deleting),
			Do: "the resource is a former pod's of that name: the garbage collector deletes it; the new pod's runtime writes its " +
				"own when its endpoint starts (its logs say why it has not)"}
	}
	return dynamo.Check{Check: "pod", Verdict: dynamo.OK, Found: fmt.Sprintf("pod %s (UID %s) owns the resource%s", pod, uid, o.deleting)}
}

func (s *explainSource) readinessCheck(o owner) dynamo.Check {
	rd, err := s.r.readiness(s.ctx, o.namespace, o.name, o.uid)
	switch {
	case err != nil:
		return dynamo.Check{Check: "readiness", Verdict: dynamo.Warn, Found: "cannot read the EndpointSlices: " + err.Error(),
			Do: "frontends see the instance only while its pod is Ready in an EndpointSlice with Dynamo's labels"}
	case !rd.Visible:
		return dynamo.Check{Check: "readiness", Verdict: dynamo.Fail, Found: rd.found, Do: rd.do}
	}
	return dynamo.Check{Check: "readiness", Verdict: dynamo.OK, Found: rd.found}
}
