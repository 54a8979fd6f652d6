package kube

import (
	"cmp"
	"encoding/json"
	"errors"
	"fmt"
	"slices"
	"strconv"
	"strings"
	"sync"
	"time"

	"github.com/beaconplane/beacon"
	"github.com/beaconplane/beacon/dynamo"
	"k8s.io/apimachinery/pkg/apis/meta/v1/unstructured"
)

// setInfo is the parsed, valid content of one InstanceSet (or, in the
// dynamo layout, of one DynamoWorkerMetadata).
type setInfo struct {
	key       string // namespace/name
	uid       string
	rv        int64
	podUID    string
	podName   string
	pod       string // namespace/pod UID: readiness is looked up by it (podKey)
	holder    string
	created   time.Time
	instances []beacon.Instance
	// verdicts are the health verdicts of the checker the set's process
	// runs, by ref key (refKey), without Panic.
	verdicts map[string]beacon.Health
	// entries are a DynamoWorkerMetadata's entries Beacon read, by key
	// (dynamo.go); nil for an InstanceSet.
	entries map[string]dynamo.Entry
}

// rawSpec is the spec as read: instances are decoded one by one, so that
// each is checked like a stored value.
type rawSpec struct {
	Pod       PodRef                     `json:"pod"`
	Container string                     `json:"container"`
	Holder    string                     `json:"holder"`
	Instances []json.RawMessage          `json:"instances"`
	Verdicts  map[string]json.RawMessage `json:"verdicts"`
}

// decodeSet parses and checks an InstanceSet: a pod owner whose UID and
// name the spec repeats, an object named after that pod (pod.container in
// container mode), as the registering process names it, and instances that
// are valid (with the metadata limit max) and unique.
func decodeSet(u *unstructured.Unstructured, maxMetadata int) (*setInfo, error) {
	s := &setInfo{
		key:     u.GetNamespace() + "/" + u.GetName(),
		uid:     string(u.GetUID()),
		rv:      parseRV(u.GetResourceVersion()),
		created: u.GetCreationTimestamp().Time,
	}
	var owners []string
	for _, o := range u.GetOwnerReferences() {
		if o.Kind == "Pod" && o.APIVersion == "v1" {
			owners = append(owners, string(o.UID))
		}
	}
	if len(owners) == 0 {
		return nil, errors.New("no ownerReference to its Pod (apiVersion v1, kind Pod): it can never be live")
	}
	specObj, ok := u.Object["spec"]
	if !ok {
		return nil, errors.New("no spec")
	}
	raw, err := json.Marshal(specObj)
	if err != nil {
		return nil, fmt.Errorf("spec: %w", err)
	}
	var spec rawSpec
	if err := json.Unmarshal(raw, &spec); err != nil {
		return nil, fmt.Errorf("spec: %w", err)
	}
	for _, o := range u.GetOwnerReferences() {
		if o.Kind == "Pod" && o.APIVersion == "v1" && string(o.UID) == spec.Pod.UID && o.UID != "" {
			s.podUID, s.podName = string(o.UID), o.Name
			break
		}
	}
	switch {
	case s.podUID == "":
		return nil, fmt.Errorf("spec.pod.uid %q differs from the ownerReference's pod UID %q", spec.Pod.UID, strings.Join(owners, ", "))
	case s.podName != spec.Pod.Name:
		return nil, fmt.Errorf("spec.pod.name %q differs from the ownerReference's pod name %q", spec.Pod.Name, s.podName)
	}
	if want := (Pod{Name: spec.Pod.Name, Container: spec.Container}).resourceName(); u.GetName() != want {
		return nil, fmt.Errorf("named %q, but the InstanceSet of pod %q (container %q) is named %q: it names another pod",
			u.GetName(), spec.Pod.Name, spec.Container, want)
	}
	s.pod = podKey(u.GetNamespace(), s.podUID)
	s.holder = spec.Holder
	seen := make(map[beacon.Ref]bool, len(spec.Instances))
	for i, rawIn := range spec.Instances {
		in, err := beacon.UnmarshalInstance(rawIn)
		if err == nil {
			err = in.ValidateStored(maxMetadata)
		}
		if err != nil {
			return nil, fmt.Errorf("spec.instances[%d]: %w", i, err)
		}
		if seen[in.Ref()] {
			return nil, fmt.Errorf("spec.instances[%d]: %s is listed twice", i, in.Ref())
		}
		seen[in.Ref()] = true
		s.instances = append(s.instances, in)
	}
	if s.verdicts, err = decodeVerdicts(spec.Verdicts); err != nil {
		return nil, err
	}
	return s, nil
}

// decodeVerdicts checks and reads an InstanceSet's verdicts: each keyed by
// an instance's namespace/component/endpoint/id, with a known status.
// Panic is the view's to decide: what a value says of it is dropped.
func decodeVerdicts(raw map[string]json.RawMessage) (map[string]beacon.Health, error) {
	if len(raw) == 0 {
		return nil, nil
	}
	out := make(map[string]beacon.Health, len(raw))
	for key, val := range raw {
		ref, err := beacon.ParseRef(key)
		if err != nil {
			return nil, fmt.Errorf("spec.verdicts[%q]: not an instance's namespace/component/endpoint/id: %w", key, err)
		}
		var h beacon.Health
		if err := json.Unmarshal(val, &h); err != nil {
			return nil, fmt.Errorf("spec.verdicts[%q]: %w", key, err)
		}
		switch h.Status {
		case beacon.HealthUnknown, beacon.HealthPassing, beacon.HealthFailing:
		default:
			return nil, fmt.Errorf("spec.verdicts[%q]: status %q is not unknown, passing or failing", key, h.Status)
		}
		h.Panic = false
		out[refKey(ref)] = h
	}
	return out, nil
}

// parseSet returns the set's valid content: its own, or, if it is not valid
// (edited by hand into garbage), the last valid content seen for the same
// object UID, or nil if there is none. An invalid version, and what a
// valid one skipped (entries of a DynamoWorkerMetadata), are counted and
// logged once per version.
func (r *Registry) parseSet(u *unstructured.Unstructured) *setInfo {
	uid, key, rv := string(u.GetUID()), u.GetNamespace()+"/"+u.GetName(), u.GetResourceVersion()
	last := r.valid.last(uid)
	s, skipped, err := r.kind.decode(u, r.cfg.MaxMetadataSize, last)
	if err == nil {
		r.valid.put(s)
		if len(skipped) > 0 && r.valid.firstReport(uid, key, rv) {
			for _, e := range skipped {
				r.m.invalidEntry()
				r.log.Warn("skipping an entry Beacon cannot serve; the rest of the resource is served",
					"kind", r.kind.kind, r.kind.logKey(), key, "resourceVersion", rv, "err", e)
			}
		}
		return s
	}
	if r.valid.firstReport(uid, key, rv) {
		r.m.invalidResource()
		kept := -1 // no valid content seen: it contributes nothing
		if last != nil {
			kept = len(last.instances)
		}
		r.log.Warn("skipping a resource version that is not valid; its last valid content is kept",
			"kind", r.kind.kind, r.kind.logKey(), key, "resourceVersion", rv, "kept_instances", kept, "err", err)
	}
	return last
}

// validCache remembers the last valid content of every object by UID, and
// which versions were already reported (invalid, or skipping entries).
type validCache struct {
	mu       sync.Mutex
	byUID    map[string]*setInfo
	reported map[string]invalidVersion // by uid: the last invalid version reported
}

type invalidVersion struct{ key, rv string }

func newValidCache() *validCache {
	return &validCache{byUID: map[string]*setInfo{}, reported: map[string]invalidVersion{}}
}

func (c *validCache) put(s *setInfo) {
	c.mu.Lock()
	defer c.mu.Unlock()
	if old := c.byUID[s.uid]; old == nil || old.rv <= s.rv {
		c.byUID[s.uid] = s
	}
}

// last returns the last valid content of uid, or nil.
func (c *validCache) last(uid string) *setInfo {
	c.mu.Lock()
	defer c.mu.Unlock()
	return c.byUID[uid]
}

// firstReport records that version rv of object uid (at key) is reported,
// and says whether it was not yet.
func (c *validCache) firstReport(uid, key, rv string) bool {
	c.mu.Lock()
	defer c.mu.Unlock()
	first := c.reported[uid].rv != rv
	c.reported[uid] = invalidVersion{key: key, rv: rv}
	return first
}

// retain forgets the objects of namespace ns ("" for all) whose UIDs a
// complete listing of it no longer holds (deleted objects).
func (c *validCache) retain(ns string, present map[string]bool) {
	c.mu.Lock()
	defer c.mu.Unlock()
	for uid, s := range c.byUID {
		if !present[uid] && inNamespace(s.key, ns) {
			delete(c.byUID, uid)
		}
	}
	for uid, v := range c.reported {
		if !present[uid] && inNamespace(v.key, ns) {
			delete(c.reported, uid)
		}
	}
}

// forget drops a deleted object.
func (c *validCache) forget(uid string) {
	c.mu.Lock()
	defer c.mu.Unlock()
	delete(c.byUID, uid)
	delete(c.reported, uid)
}

// candidate is one instance a set offers.
type candidate struct {
	inst beacon.Instance
	set  *setInfo
}

// better reports whether a wins over b when two InstanceSets hold the same
// instance (two processes claimed one caller-chosen ID at the same
// moment): the older resource, then the smaller namespace/name.
func better(a, b candidate) bool {
	if !a.set.created.Equal(b.set.created) {
		return a.set.created.Before(b.set.created)
	}
	return a.set.key < b.set.key
}

// liveInstances returns the instance served at each ref the sets whose pod
// is ready hold (resolve).
func (r *Registry) liveInstances(sets []*setInfo, ready func(pod string) bool) map[string]candidate {
	byRef := map[string][]candidate{}
	for _, s := range sets {
		if !ready(s.pod) {
			continue
		}
		for _, in := range s.instances {
			k := refKey(in.Ref())
			byRef[k] = append(byRef[k], candidate{inst: in, set: s})
		}
	}
	out := make(map[string]candidate, len(byRef))
	for k, cands := range byRef {
		if c, ok := r.resolve(k, cands); ok {
			out[k] = c
		}
	}
	return out
}

// resolve picks the instance served at the ref key k from what the sets
// of Ready pods offer (cands): the older set's (better), or, when the
// registry's objects are exclusive (Dynamo's), none as soon as two offer
// it, reported (reportCollision).
func (r *Registry) resolve(k string, cands []candidate) (candidate, bool) {
	switch {
	case len(cands) == 0:
		return candidate{}, false
	case len(cands) > 1 && r.kind.exclusive:
		r.reportCollision(k, cands)
		return candidate{}, false
	}
	best := cands[0]
	for _, c := range cands[1:] {
		if better(c, best) {
			best = c
		}
	}
	return best, true
}

// podKey is the key of a pod's readiness: its namespace and UID. Only an
// EndpointSlice of the pod's own namespace says whether it is Ready (a
// slice someone wrote in another namespace cannot make it so for readers
// of both).
func podKey(namespace, uid string) string { return namespace + "/" + uid }

// refKey is the sort and map key of an instance: namespace/component/
// endpoint/id, in the order of the store keys.
func refKey(r beacon.Ref) string { return r.String() }

// parseRV reads a resourceVersion as a number (0 if it is not one; they
// are etcd revisions in every API server Beacon knows).
func parseRV(rv string) int64 {
	n, err := strconv.ParseInt(rv, 10, 64)
	if err != nil || n < 0 {
		return 0
	}
	return n
}

func sortInstances(ins []beacon.Instance) {
	slices.SortFunc(ins, func(a, b beacon.Instance) int { return cmp.Compare(refKey(a.Ref()), refKey(b.Ref())) })
}
