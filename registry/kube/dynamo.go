package kube

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"maps"
	"slices"
	"strings"
	"sync"

	"github.com/beaconplane/beacon"
	"github.com/beaconplane/beacon/dynamo"
	"github.com/beaconplane/beacon/registry"
	"k8s.io/apimachinery/pkg/apis/meta/v1/unstructured"
	"k8s.io/apimachinery/pkg/runtime/schema"
)

// The dynamo layout: a read-only Registry of what the NVIDIA Dynamo
// runtime's Kubernetes discovery writes (lib/runtime/src/discovery/kube in
// github.com/ai-dynamo/dynamo). Each Dynamo worker pod writes one
// DynamoWorkerMetadata (per container in its container mode), owned by
// the pod, whose spec.data holds its registrations by key:
//
//	spec:
//	  data:
//	    endpoints:   {"ns/component/endpoint/2a": {"type":"Endpoint", ...}}
//	    model_cards: {"ns/component/endpoint/2a": {"type":"Model", ...}}
//	    event_channels: {...}                          (not instances: ignored)
//
// with the keys and values Dynamo writes in etcd under v1/instances/ and
// v1/mdc/. They are decoded by package dynamo exactly as the store side
// decodes them (names, IDs, address, transport, metadata), and served by
// the same view, List and Watch as InstanceSets: an instance is live while
// its object exists and the pod its ownerReference names (by UID) is Ready
// in an EndpointSlice labelled as Dynamo's operator labels them
// (DynamoBackendLabel=kubernetes, DynamoEnabledLabel=true).

// DynamoWorkerMetadata, as the Dynamo runtime defines it.
const (
	DynamoGroup    = "nvidia.com"
	DynamoVersion  = "v1alpha1"
	DynamoKind     = "DynamoWorkerMetadata"
	DynamoResource = "dynamoworkermetadatas"

	// DynamoBackendLabel and DynamoEnabledLabel select the EndpointSlices
	// that say which Dynamo pods are Ready, with the values
	// DynamoBackendLabelValue and DynamoEnabledLabelValue: Dynamo's
	// operator puts them on its Services, and the EndpointSlice controller
	// copies them to the slices.
	DynamoBackendLabel      = "nvidia.com/dynamo-discovery-backend"
	DynamoBackendLabelValue = "kubernetes"
	DynamoEnabledLabel      = "nvidia.com/dynamo-discovery-enabled"
	DynamoEnabledLabelValue = "true"

	// MetaObject is the metadata key of the DynamoWorkerMetadata an
	// instance was read from (namespace/name), MetaPod that of its pod
	// (namespace/name).
	MetaObject = "dynamo.object"
	MetaPod    = "dynamo.pod"
)

// DynamoGVR is the group/version/resource of DynamoWorkerMetadata.
var DynamoGVR = schema.GroupVersionResource{Group: DynamoGroup, Version: DynamoVersion, Resource: DynamoResource}

var (
	// ErrReadOnly reports a write to a Dynamo registry (OpenDynamo).
	// It is registry.ErrReadOnlyLayout, as over a store.
	ErrReadOnly = registry.ErrReadOnlyLayout
	// ErrDynamoNotInstalled reports a cluster that does not serve
	// DynamoWorkerMetadata.
	ErrDynamoNotInstalled = errors.New("kube: the DynamoWorkerMetadata custom resource definition (" + DynamoResource + "." +
		DynamoGroup + ") is not installed: the cluster runs no Dynamo platform with Kubernetes discovery (Dynamo's CRDs " +
		"Helm chart installs it), or the kubeconfig points at another cluster")
	// ErrDynamoMismatch reports a cluster that serves the nvidia.com group,
	// but not the version of DynamoWorkerMetadata Beacon reads.
	ErrDynamoMismatch = errors.New("kube: the API server does not serve the version of DynamoWorkerMetadata Beacon reads (" +
		DynamoVersion + ")")
)

const dynamoSelector = DynamoBackendLabel + "=" + DynamoBackendLabelValue + "," + DynamoEnabledLabel + "=" + DynamoEnabledLabelValue

// dynamoObjects are the Dynamo runtime's objects.
var dynamoObjects = &objects{
	kind: DynamoKind, group: DynamoGroup, version: DynamoVersion, resource: DynamoResource,
	slices:       dynamoSelector,
	services:     "(Dynamo's operator creates them for the components of a DynamoGraphDeployment)",
	decode:       decodeDynamo,
	exclusive:    true,
	notInstalled: ErrDynamoNotInstalled, mismatch: ErrDynamoMismatch,
	role:        "the Role of deploy/kubernetes/rbac-dynamo.yaml",
	clusterRole: "the ClusterRole of deploy/kubernetes/rbac-dynamo.yaml",
}

// Dynamo is a read-only registry.Registry of what the Dynamo runtime's
// Kubernetes discovery writes (see OpenDynamo). It is safe for concurrent
// use.
type Dynamo struct {
	r *Registry
}

var (
	_ registry.Registry   = (*Dynamo)(nil)
	_ registry.Discoverer = (*Dynamo)(nil)
	_ registry.Getter     = (*Dynamo)(nil)
)

// OpenDynamo connects to the API server as Open does and checks, within
// cfg.Timeout, that it serves DynamoWorkerMetadata (ErrDynamoNotInstalled
// if not). List, Watch and Get serve the instances of the Dynamo workers
// in the watched namespaces (cfg.Namespaces, else as Open); Register is
// refused (ErrReadOnly). cfg.Pod and cfg.MaxMetadataSize do not apply.
// Reading needs list and watch on dynamoworkermetadatas.nvidia.com and on
// endpointslices.discovery.k8s.io (deploy/kubernetes/rbac-dynamo.yaml).
func OpenDynamo(ctx context.Context, cfg Config) (*Dynamo, error) {
	r, err := open(ctx, cfg, dynamoObjects)
	if err != nil {
		return nil, err
	}
	return &Dynamo{r: r}, nil
}

// List implements registry.Discoverer: the live instances q selects, read
// from the API server (see Registry.List).
func (d *Dynamo) List(ctx context.Context, q beacon.Query) ([]beacon.Instance, int64, error) {
	return d.r.List(ctx, q)
}

// Watch implements registry.Discoverer (see Registry.Watch).
func (d *Dynamo) Watch(ctx context.Context, q beacon.Query, opts ...registry.WatchOption) (registry.Watcher, error) {
	return d.r.Watch(ctx, q, opts...)
}

// Get implements registry.Getter.
func (d *Dynamo) Get(ctx context.Context, ref beacon.Ref) (beacon.Instance, error) {
	return d.r.Get(ctx, ref)
}

// Register implements registry.Registrar by refusing: the Dynamo runtime
// writes these resources, and its pods' readiness decides when their
// instances go.
func (d *Dynamo) Register(_ context.Context, in beacon.Instance) (registry.Registration, error) {
	if d.r.closed.Load() {
		return nil, registry.ErrClosed
	}
	return nil, fmt.Errorf("%w: registering an instance of %s/%s/%s refused: Dynamo's workers write their own %s resources, and their pods' "+
		"readiness decides when their instances go; register through Dynamo's runtime, or use Beacon's own layout of "+
		"the kubernetes backend (InstanceSets) for Beacon's registrations", ErrReadOnly, in.Namespace, in.Component, in.Endpoint, DynamoKind)
}

// Ping checks that the API server answers, serves DynamoWorkerMetadata,
// and lets this client read what List and Watch read (Registry.Ping).
func (d *Dynamo) Ping(ctx context.Context) error { return d.r.Ping(ctx) }

// Namespaces returns the Kubernetes namespaces List and Watch see ("" means
// every namespace).
func (d *Dynamo) Namespaces() []string { return d.r.Namespaces() }

// Host returns the API server's URL.
func (d *Dynamo) Host() string { return d.r.Host() }

// Close ends every watch. It writes nothing, and is idempotent.
func (d *Dynamo) Close() error { return d.r.Close() }

// dynamoBuckets are the maps of spec.data Beacon reads, with the prefix
// that makes their keys the etcd keys Dynamo writes for the same entries.
var dynamoBuckets = []struct{ field, prefix string }{
	{"endpoints", dynamo.InstancesPrefix},
	{"model_cards", dynamo.ModelsPrefix},
}

// decodeDynamo parses a DynamoWorkerMetadata: its pod (the one Pod of its
// ownerReferences) and its entries, each decoded by dynamo.Decode. An
// entry Beacon cannot serve is skipped (returned, to be reported) and,
// when the object's last valid content (last) had a valid entry at its
// key, that entry is kept, as the store side keeps a key's last valid
// value; instance entries of one object that map to one Beacon ID are
// skipped, all of them. Model cards join the instances of their own object.
func decodeDynamo(u *unstructured.Unstructured, _ int, last *setInfo) (*setInfo, []error, error) {
	s := &setInfo{
		key:     u.GetNamespace() + "/" + u.GetName(),
		uid:     string(u.GetUID()),
		rv:      parseRV(u.GetResourceVersion()),
		created: u.GetCreationTimestamp().Time,
		entries: map[string]dynamo.Entry{},
	}
	if err := s.ownerPod(u); err != nil {
		return nil, nil, err
	}
	kvs, err := objectEntries(u)
	if err != nil {
		return nil, nil, err
	}
	var skipped []error
	cat := dynamo.NewCatalog[struct{}]()
	for _, kv := range kvs {
		e, err := dynamo.Decode(kv.Key, kv.Value)
		if err != nil {
			skipped = append(skipped, fmt.Errorf("%s: %w", entryPath(kv.Key), err))
			prev, ok := last.entry(kv.Key)
			if !ok {
				continue
			}
			e = prev
		}
		s.entries[kv.Key] = e
		cat.Put(e, struct{}{})
	}
	for _, ref := range cat.Refs() {
		served, ok := cat.Lookup(ref)
		if !ok {
			skipped = append(skipped, collisionError(ref, cat.Colliding(ref)))
			continue
		}
		in := served.Instance
		in.RegisteredAt = s.created
		in.Metadata[MetaObject] = s.key
		in.Metadata[MetaPod] = u.GetNamespace() + "/" + s.podName
		s.instances = append(s.instances, in)
	}
	return s, skipped, nil
}

// ownerPod sets the set's pod: the one Pod its ownerReferences name, as
// the Dynamo runtime writes them (the garbage collector deletes the object
// with it, and that pod's readiness makes its instances live).
func (s *setInfo) ownerPod(u *unstructured.Unstructured) error {
	n := 0
	for _, o := range u.GetOwnerReferences() {
		if o.Kind == "Pod" && o.APIVersion == "v1" && o.UID != "" {
			s.podUID, s.podName = string(o.UID), o.Name
			n++
		}
	}
	switch {
	case n == 0:
		return errors.New("no ownerReference to its Pod (apiVersion v1, kind Pod, with a uid): no pod's readiness can make it live")
	case n > 1:
		return fmt.Errorf("its ownerReferences name %d pods, and the Dynamo runtime writes one: which pod's readiness "+
			"decides is unclear, so none does", n)
	}
	s.pod = podKey(u.GetNamespace(), s.podUID)
	return nil
}

// objectEntries returns the entries of a DynamoWorkerMetadata's spec.data
// that Beacon reads (dynamoBuckets), each with the key Dynamo writes for
// the same entry in etcd and its value as JSON, held by the object
// (namespace/name); in bucket order, then by key.
func objectEntries(u *unstructured.Unstructured) ([]dynamo.KV, error) {
	data, err := specData(u)
	if err != nil {
		return nil, err
	}
	var out []dynamo.KV
	for _, b := range dynamoBuckets {
		entries, err := bucket(data, b.field)
		if err != nil {
			return nil, err
		}
		for _, name := range slices.Sorted(maps.Keys(entries)) {
			value, _ := json.Marshal(entries[name]) // decoded from JSON, it encodes
			out = append(out, dynamo.KV{Key: b.prefix + name, Value: value, Holder: u.GetNamespace() + "/" + u.GetName()})
		}
	}
	return out, nil
}

// specData returns spec.data, which must be an object.
func specData(u *unstructured.Unstructured) (map[string]any, error) {
	spec, _ := u.Object["spec"].(map[string]any)
	raw := spec["data"]
	if raw == nil {
		return nil, errors.New("spec.data is missing or null: the pod wrote no discovery metadata")
	}
	data, ok := raw.(map[string]any)
	if !ok {
		return nil, fmt.Errorf("spec.data is a %T, not an object", raw)
	}
	return data, nil
}

// bucket returns the entries of spec.data.<field> by key; none if absent.
func bucket(data map[string]any, field string) (map[string]any, error) {
	raw := data[field]
	if raw == nil {
		return nil, nil
	}
	entries, ok := raw.(map[string]any)
	if !ok {
		return nil, fmt.Errorf("spec.data.%s is a %T, not an object of entries by key", field, raw)
	}
	return entries, nil
}

// entry returns the entry the set held at key, if any (s may be nil).
func (s *setInfo) entry(key string) (dynamo.Entry, bool) {
	if s == nil {
		return dynamo.Entry{}, false
	}
	e, ok := s.entries[key]
	return e, ok
}

// entryPath names an entry by where it is in a DynamoWorkerMetadata:
// spec.data.endpoints["ns/c/e/2a"].
func entryPath(key string) string {
	for _, b := range dynamoBuckets {
		if name, ok := strings.CutPrefix(key, b.prefix); ok {
			return fmt.Sprintf("spec.data.%s[%q]", b.field, name)
		}
	}
	return key
}

// collisionError reports instance entries of one object that map to one
// Beacon ID.
func collisionError(ref beacon.Ref, keys []string) error {
	paths := make([]string, len(keys))
	for i, k := range keys {
		paths[i] = entryPath(k)
	}
	return fmt.Errorf("%s all map to the instance %s (a padded and an unpadded ID?): none of them is served while "+
		"they all exist; delete the stale one", strings.Join(paths, ", "), ref)
}

// reportCollision reports the instance at the ref key k that the objects
// of several Ready pods hold (cands), which none of them serves: each
// object with its entry, once per collision (the same objects at the same
// versions).
func (r *Registry) reportCollision(k string, cands []candidate) {
	slices.SortFunc(cands, func(a, b candidate) int { return strings.Compare(a.set.key, b.set.key) })
	var sig strings.Builder
	for _, c := range cands {
		fmt.Fprintf(&sig, "%s@%d ", c.set.key, c.set.rv)
	}
	if !r.collided.first(k, sig.String()) {
		return
	}
	objs := make([]string, len(cands))
	for i, c := range cands {
		objs[i] = c.set.key
	}
	for _, c := range cands {
		r.m.invalidEntry()
		r.log.Warn("skipping an instance that the resource of another Ready pod also holds: none of them is served "+
			"while more than one pod holding it is Ready", "kind", r.kind.kind, r.kind.logKey(), c.set.key, "entry", entryPath(c.inst.Metadata[dynamo.MetaKey]),
			"instance", k, "held_by", strings.Join(objs, ", "))
	}
}

// collisions remembers the collisions reported, so that each is logged
// once however often it is seen (Lists, re-lists). Its mu is a leaf lock.
type collisions struct {
	mu   sync.Mutex
	seen map[string]string // ref key -> the objects and versions holding it
}

// maxCollisions bounds the collisions remembered; past it, all are
// forgotten (a collision may then be reported once more).
const maxCollisions = 4096

// first records the collision at ref key k between the objects sig names,
// and says whether it was not reported yet.
func (c *collisions) first(k, sig string) bool {
	c.mu.Lock()
	defer c.mu.Unlock()
	if c.seen[k] == sig {
		return false
	}
	if c.seen == nil || len(c.seen) >= maxCollisions {
		c.seen = map[string]string{}
	}
	c.seen[k] = sig
	return true
}
