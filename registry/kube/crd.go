package kube

import (
	"github.com/beaconplane/beacon"
	apiextensionsv1 "k8s.io/apiextensions-apiserver/pkg/apis/apiextensions/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
)

// Schema limits, enforced by the API server (and, for the metadata size,
// which a schema cannot sum, by Beacon).
const (
	// MaxInstances bounds the instances of one InstanceSet.
	MaxInstances = 4096
	// MaxObjectSize bounds the JSON size of one InstanceSet that Beacon
	// writes, below the API server's request limit (about 1.5 MiB in etcd):
	// a registration that would make it larger is refused.
	MaxObjectSize = 1 << 20
	// MaxMetadataSize is the largest metadata limit (Config.MaxMetadataSize)
	// the schema admits: no metadata value, and no number of keys, above it.
	MaxMetadataSize = 64 << 10
	// MaxVerdicts bounds the verdicts of one InstanceSet (those of the
	// checker its process runs).
	MaxVerdicts = 1 << 16
	// maxReasonLength bounds a verdict's reason (the checker cuts it to
	// health.MaxReasonBytes).
	maxReasonLength = 1 << 10
)

const labelPattern = `^[a-z0-9]([-a-z0-9]*[a-z0-9])?$`

// CRD returns the CustomResourceDefinition of InstanceSet, as
// deploy/kubernetes/crd.yaml holds it.
func CRD() *apiextensionsv1.CustomResourceDefinition {
	return &apiextensionsv1.CustomResourceDefinition{
		TypeMeta: metav1.TypeMeta{APIVersion: "apiextensions.k8s.io/v1", Kind: "CustomResourceDefinition"},
		ObjectMeta: metav1.ObjectMeta{
			Name:   CRDName,
			Labels: map[string]string{"app.kubernetes.io/name": "beacon"},
		},
		Spec: apiextensionsv1.CustomResourceDefinitionSpec{
			Group: Group,
			Scope: apiextensionsv1.NamespaceScoped,
			Names: apiextensionsv1.CustomResourceDefinitionNames{
				Plural:     Resource,
				Singular:   "instanceset",
				Kind:       Kind,
				ListKind:   Kind + "List",
				ShortNames: []string{"isets"},
				Categories: []string{"beacon"},
			},
			Versions: []apiextensionsv1.CustomResourceDefinitionVersion{{
				Name:    Version,
				Served:  true,
				Storage: true,
				Schema:  &apiextensionsv1.CustomResourceValidation{OpenAPIV3Schema: ptr(instanceSetSchema())},
				AdditionalPrinterColumns: []apiextensionsv1.CustomResourceColumnDefinition{
					{Name: "Pod", Type: "string", JSONPath: ".spec.pod.name"},
					{Name: "Instances", Type: "integer", JSONPath: ".spec.instanceCount"},
					{Name: "Draining", Type: "integer", JSONPath: ".spec.drainingCount"},
					{Name: "Age", Type: "date", JSONPath: ".metadata.creationTimestamp"},
				},
			}},
		},
	}
}

// instanceSetSchema is the schema of a whole InstanceSet.
func instanceSetSchema() apiextensionsv1.JSONSchemaProps {
	return apiextensionsv1.JSONSchemaProps{
		Type: "object",
		Description: "The instances one process registered with Beacon (one InstanceSet per pod, or per " +
			"container). Owned by the pod: deleted with it. An instance is live while this resource " +
			"exists and its pod is Ready in an EndpointSlice labelled " + DiscoveryLabel + "=true.",
		Required: []string{"spec"},
		Properties: map[string]apiextensionsv1.JSONSchemaProps{
			"apiVersion": {Type: "string"},
			"kind":       {Type: "string"},
			"metadata":   {Type: "object"},
			"spec":       specSchema(),
		},
	}
}

// specSchema is the schema of an InstanceSet's spec: the process and the
// instances it advertises.
func specSchema() apiextensionsv1.JSONSchemaProps {
	return apiextensionsv1.JSONSchemaProps{
		Type:        "object",
		Description: "What one registering process advertises.",
		Required:    []string{"pod", "holder"},
		Properties: map[string]apiextensionsv1.JSONSchemaProps{
			"pod": {
				Type:        "object",
				Description: "The pod the process runs in; the ownerReference names the same pod.",
				Required:    []string{"name", "uid"},
				Properties: map[string]apiextensionsv1.JSONSchemaProps{
					"name": strSchema("Pod name.", 253),
					"uid":  strSchema("Pod UID.", 64),
				},
			},
			"container":     labelSchema("Container name, in container mode (one InstanceSet per container)."),
			"holder":        strSchema("The process incarnation that writes this resource (random per process start).", 64),
			"instanceCount": countSchema("Number of instances (for kubectl's columns)."),
			"drainingCount": countSchema("Number of draining instances (for kubectl's columns)."),
			"instances": {
				Type:         "array",
				Description:  "The instances the process registered.",
				MaxItems:     ptr[int64](MaxInstances),
				XListType:    ptr("map"),
				XListMapKeys: []string{"namespace", "component", "endpoint", "id"},
				Items:        &apiextensionsv1.JSONSchemaPropsOrArray{Schema: ptr(instanceSchema())},
			},
			"verdicts": {
				Type: "object",
				Description: "The health verdicts of the checker this process runs, by instance (namespace/component/" +
					"endpoint/id); readers count them while the pod is Ready.",
				MaxProperties: ptr[int64](MaxVerdicts),
				AdditionalProperties: &apiextensionsv1.JSONSchemaPropsOrBool{
					Allows: true,
					Schema: ptr(verdictSchema()),
				},
			},
		},
	}
}

// verdictSchema is the schema of one health verdict (beacon.Health as
// stored).
func verdictSchema() apiextensionsv1.JSONSchemaProps {
	return apiextensionsv1.JSONSchemaProps{
		Type:        "object",
		Description: "A checker's verdict on one instance.",
		Required:    []string{"status"},
		Properties: map[string]apiextensionsv1.JSONSchemaProps{
			"status":  enumSchema("unknown, passing or failing.", "unknown", "passing", "failing"),
			"reason":  strSchema("Why it is failing (the last probe's error).", maxReasonLength),
			"since":   {Type: "string", Format: "date-time", Description: "When the verdict last changed."},
			"checker": strSchema("The checker's ID.", 253),
		},
	}
}

// checkSchema is the schema of an instance's declared health check
// (beacon.Check as stored; durations as strings such as "10s").
func checkSchema() apiextensionsv1.JSONSchemaProps {
	dur := func(desc string) apiextensionsv1.JSONSchemaProps {
		return strSchema(desc+` (a duration such as "10s").`, 32)
	}
	threshold := func(desc string) apiextensionsv1.JSONSchemaProps {
		return apiextensionsv1.JSONSchemaProps{Type: "integer", Description: desc, Minimum: ptr[float64](0),
			Maximum: ptr[float64](beacon.MaxCheckThreshold)}
	}
	return apiextensionsv1.JSONSchemaProps{
		Type:        "object",
		Description: "The instance's health check, run by Beacon's checkers (beacon serve) from outside its pod.",
		Required:    []string{"kind"},
		Properties: map[string]apiextensionsv1.JSONSchemaProps{
			"kind":     enumSchema("grpc, http or tcp (ttl is refused on Kubernetes).", "grpc", "http", "tcp", "ttl"),
			"path":     strSchema("The HTTP check's request path.", beacon.MaxCheckPathBytes),
			"service":  strSchema("The gRPC check's service name.", 253),
			"ttl":      dur("A TTL check's TTL"),
			"interval": dur("How often the instance is probed"),
			"timeout":  dur("How long one probe may take"),
			"rise":     threshold("Passes in a row that bring a failing instance back."),
			"fall":     threshold("Failures in a row that take an instance out."),
		},
	}
}

// enumSchema is a string, one of values.
func enumSchema(desc string, values ...string) apiextensionsv1.JSONSchemaProps {
	p := apiextensionsv1.JSONSchemaProps{Type: "string", Description: desc}
	for _, v := range values {
		p.Enum = append(p.Enum, apiextensionsv1.JSON{Raw: []byte(`"` + v + `"`)})
	}
	return p
}

// instanceSchema is the schema of one instance, in the value format of
// every Beacon backend.
func instanceSchema() apiextensionsv1.JSONSchemaProps {
	id := strSchema("Instance ID: 16 lower-case hex digits (a string, so that JavaScript keeps every bit).", 16)
	id.Pattern = `^[0-9a-f]{16}$`
	address := strSchema("Where callers reach the instance: host:port or a URL.", beacon.MaxAddressLength)
	address.MinLength = ptr[int64](1)
	transport := strSchema("Protocol spoken at the address (grpc, http, tcp, nats...); empty if unspecified.", 32)
	transport.Pattern = `^[a-z0-9.+-]*$`
	return apiextensionsv1.JSONSchemaProps{
		Type:        "object",
		Description: "One registered instance, in the value format of every Beacon backend (docs/registry.md).",
		Required:    []string{"namespace", "component", "endpoint", "id", "address", "status", "registered_at"},
		Properties: map[string]apiextensionsv1.JSONSchemaProps{
			"namespace":     labelSchema("Beacon namespace (a DNS label; not the Kubernetes namespace)."),
			"component":     labelSchema("Component (a DNS label)."),
			"endpoint":      labelSchema("Endpoint (a DNS label)."),
			"id":            id,
			"address":       address,
			"transport":     transport,
			"metadata":      metadataSchema(),
			"status":        statusSchema(),
			"registered_at": {Type: "string", Format: "date-time", Description: "When the instance was registered."},
			"check":         checkSchema(),
		},
	}
}

// metadataSchema is the schema of an instance's metadata: a string map
// the schema bounds loosely (Beacon checks the total size).
func metadataSchema() apiextensionsv1.JSONSchemaProps {
	return apiextensionsv1.JSONSchemaProps{
		Type:          "object",
		Description:   "Free-form string metadata; keys and values total at most 4 KiB by default (checked by Beacon).",
		MaxProperties: ptr[int64](MaxMetadataSize),
		AdditionalProperties: &apiextensionsv1.JSONSchemaPropsOrBool{
			Allows: true,
			Schema: &apiextensionsv1.JSONSchemaProps{Type: "string", MaxLength: ptr[int64](MaxMetadataSize)},
		},
	}
}

// statusSchema is the schema of an instance's status.
func statusSchema() apiextensionsv1.JSONSchemaProps {
	return apiextensionsv1.JSONSchemaProps{
		Type:        "string",
		Description: "serving, or draining (resolvers send no new work).",
		Enum:        []apiextensionsv1.JSON{{Raw: []byte(`"serving"`)}, {Raw: []byte(`"draining"`)}},
	}
}

// strSchema is a string of at most maxLen characters.
func strSchema(desc string, maxLen int64) apiextensionsv1.JSONSchemaProps {
	return apiextensionsv1.JSONSchemaProps{Type: "string", Description: desc, MaxLength: &maxLen}
}

// labelSchema is a DNS label.
func labelSchema(desc string) apiextensionsv1.JSONSchemaProps {
	p := strSchema(desc, 63)
	p.MinLength = ptr[int64](1)
	p.Pattern = labelPattern
	return p
}

// countSchema is a count: an integer, at least 0.
func countSchema(desc string) apiextensionsv1.JSONSchemaProps {
	return apiextensionsv1.JSONSchemaProps{Type: "integer", Description: desc, Minimum: ptr[float64](0)}
}

func ptr[T any](v T) *T { return &v }
