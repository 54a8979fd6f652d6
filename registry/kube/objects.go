package kube

import (
	"strings"

	"k8s.io/apimachinery/pkg/apis/meta/v1/unstructured"
	"k8s.io/apimachinery/pkg/runtime/schema"
)

// objects is what a Registry reads: the custom resource that holds the
// instances of one process (owned by its pod), and the label selector of
// the EndpointSlices that say which pods are Ready. Beacon's InstanceSets
// (instanceSets), or the Dynamo runtime's DynamoWorkerMetadata
// (dynamoObjects, dynamo.go); the view, List, the access checks and the
// error messages are the same for both.
type objects struct {
	kind     string // the resource's Kind, for messages
	group    string
	version  string
	resource string // its plural
	// slices selects the EndpointSlices that say which pods are Ready:
	// label=value pairs, comma separated (selects).
	slices string
	// services says where Services with those labels come from, for the
	// message of a pod in no EndpointSlice.
	services string
	// decode parses and checks one object, given the last valid content
	// of the same object (UID), if any: its valid content, and what it
	// skipped in it (reported once per version); or an error when it
	// offers nothing valid at all (its last valid content is kept).
	decode func(u *unstructured.Unstructured, maxMetadata int, last *setInfo) (*setInfo, []error, error)
	// exclusive serves an instance that the objects of two Ready pods both
	// hold from neither (reported), Dynamo's rule for colliding IDs;
	// otherwise the older object's is served.
	exclusive bool
	// notInstalled is the error of a cluster that does not serve the
	// resource; mismatch of one that serves another version of its group.
	notInstalled, mismatch error
	// role and clusterRole name the shipped RBAC that grants the reads
	// (in one namespace, in every namespace).
	role, clusterRole string
}

// instanceSets are Beacon's own objects.
var instanceSets = &objects{
	kind: Kind, group: Group, version: Version, resource: Resource,
	slices:   discoverySelector,
	services: "(see deploy/kubernetes/worker.yaml)",
	decode: func(u *unstructured.Unstructured, maxMetadata int, _ *setInfo) (*setInfo, []error, error) {
		s, err := decodeSet(u, maxMetadata)
		return s, nil, err
	},
	notInstalled: ErrCRDNotInstalled, mismatch: ErrCRDMismatch,
	role:        "a Role like deploy/kubernetes/rbac.yaml",
	clusterRole: "deploy/kubernetes/rbac-cluster.yaml",
}

func (o *objects) gvr() schema.GroupVersionResource {
	return schema.GroupVersionResource{Group: o.group, Version: o.version, Resource: o.resource}
}

// selects reports whether an EndpointSlice with these labels is one of
// those o.slices selects.
func (o *objects) selects(labels map[string]string) bool {
	for _, pair := range strings.Split(o.slices, ",") {
		k, v, _ := strings.Cut(pair, "=")
		if labels[k] != v {
			return false
		}
	}
	return true
}

// rbacName is the resource as RBAC and error messages name it
// (instancesets.discovery.beaconplane.io).
func (o *objects) rbacName() string { return o.resource + "." + o.group }

// logKey is the log key of an object's namespace/name ("instanceset").
func (o *objects) logKey() string { return strings.ToLower(o.kind) }
