package kube

import (
	"github.com/beaconplane/beacon"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/runtime/schema"
)

// The custom resource. Its definition (CRD) is CRD(); deploy/kubernetes/crd.yaml
// is the same object as YAML, checked against it by a test.
const (
	// Group is the API group of Beacon's resources.
	Group = "discovery.beaconplane.io"
	// Version is the served and stored version of InstanceSet.
	Version = "v1alpha1"
	// Kind is the kind of the resource one registering process writes.
	Kind = "InstanceSet"
	// Resource is its plural resource name (kubectl get instancesets).
	Resource = "instancesets"
	// CRDName is the name of its CustomResourceDefinition.
	CRDName = Resource + "." + Group

	// DiscoveryLabel selects the EndpointSlices that say which pods are
	// Ready: put it, with the value "true", on the Service(s) selecting
	// the registering pods. The EndpointSlice controller copies a
	// Service's labels to its slices.
	DiscoveryLabel = Group + "/enabled"
	// DiscoveryLabelValue is the value DiscoveryLabel must have.
	DiscoveryLabelValue = "true"

	// FieldManager is the server-side apply field manager of every write.
	FieldManager = "beacon"
)

// GVR is the group/version/resource of InstanceSet.
var GVR = schema.GroupVersionResource{Group: Group, Version: Version, Resource: Resource}

// InstanceSet is the custom resource a registering process writes in its
// pod's namespace: every instance it registers, in one object named after
// the pod (pod.container in container mode), owned by the pod so that the
// garbage collector deletes it with the pod.
type InstanceSet struct {
	metav1.TypeMeta   `json:",inline"`
	metav1.ObjectMeta `json:"metadata,omitempty"`
	Spec              InstanceSetSpec `json:"spec"`
}

// InstanceSetSpec is what the process advertises.
type InstanceSetSpec struct {
	// Pod is the pod the process runs in (its ownerReference names the
	// same pod; readiness is looked up by its UID).
	Pod PodRef `json:"pod"`
	// Container is set in container mode (several registering processes
	// per pod, one per container).
	Container string `json:"container,omitempty"`
	// Holder identifies the process incarnation that writes the resource
	// (random per process start): a second live process writing the same
	// resource is detected and reported instead of silently overwriting.
	Holder string `json:"holder"`
	// InstanceCount and DrainingCount summarise Instances for kubectl's
	// columns; readers do not use them.
	InstanceCount int `json:"instanceCount"`
	DrainingCount int `json:"drainingCount"`
	// Instances are the registered instances, in the stored value format
	// of every backend (docs/registry.md).
	Instances []beacon.Instance `json:"instances"`
	// Verdicts are the health verdicts of the checker this process runs
	// (beacon serve's), by instance (namespace/component/endpoint/id),
	// in the stored form of every backend (beacon.Health without panic).
	// Readers count them only while this resource's pod is Ready: the
	// checker's own registration is live exactly then.
	Verdicts map[string]beacon.Health `json:"verdicts,omitempty"`
}

// PodRef names a pod.
type PodRef struct {
	Name string `json:"name"`
	UID  string `json:"uid"`
}
