package kube

import (
	"errors"
	"fmt"
	"log/slog"
	"math"
	"os"
	"strings"
	"time"

	"github.com/beaconplane/beacon"
	"github.com/beaconplane/beacon/registry/internal/defaults"
	"github.com/prometheus/client_golang/prometheus"
	"k8s.io/apimachinery/pkg/util/validation"
	"k8s.io/client-go/rest"
)

// Environment variables ConfigFromEnv reads. POD_* come from the Downward API
// (deploy/kubernetes/worker.yaml shows how); KUBECONFIG is read as kubectl
// reads it.
const (
	EnvPodName       = "POD_NAME"
	EnvPodNamespace  = "POD_NAMESPACE"
	EnvPodUID        = "POD_UID"
	EnvContainerName = "CONTAINER_NAME"
	EnvKubeconfig    = "KUBECONFIG"
	// EnvNamespaces lists the Kubernetes namespaces readers watch, comma
	// separated, or "*" for every namespace.
	EnvNamespaces = "BEACON_KUBE_NAMESPACES"
)

// AllNamespaces is the Config.Namespaces (or BEACON_KUBE_NAMESPACES) value
// that makes readers watch every namespace, as its only element.
const AllNamespaces = "*"

// DefaultTimeout bounds reaching the API server at Open and each write the
// registry makes on its own behalf.
const DefaultTimeout = 10 * time.Second

// Config configures a Registry. The zero value reads the kubeconfig as
// kubectl does (KUBECONFIG, ~/.kube/config) or the in-cluster config, and
// watches the pod's namespace (else the kubeconfig's); registering needs
// Pod.
type Config struct {
	// REST, when set, is the client configuration to use (tests, embedders);
	// otherwise it is loaded from Kubeconfig, the default kubeconfig rules,
	// or the in-cluster service account.
	REST *rest.Config
	// Kubeconfig is the kubeconfig file to load, or a list of files
	// (separated as in PATH, as KUBECONFIG may hold) merged as kubectl
	// merges them; empty means the default rules (KUBECONFIG, then
	// ~/.kube/config), falling back to the in-cluster configuration.
	Kubeconfig string
	// Namespaces are the Kubernetes namespaces whose instances List and
	// Watch see. Empty means Pod.Namespace, else the kubeconfig context's
	// namespace; []string{AllNamespaces} means every namespace (which
	// needs a ClusterRole, deploy/kubernetes/rbac-cluster.yaml).
	Namespaces []string
	// Pod is the identity of the pod this process runs in, from the
	// Downward API. Only Register needs it.
	Pod Pod
	// MaxMetadataSize bounds an instance's metadata as in registry.Config;
	// zero means beacon.DefaultMaxMetadataSize, and at most
	// MaxMetadataSize is allowed.
	MaxMetadataSize int
	// DrainGrace is Drain's default grace period (registry.Config).
	DrainGrace time.Duration
	// HealthPanicThreshold is the share of a service's checked instances
	// that may be failing before their health is ignored, as in
	// registry.Config: zero means registry.DefaultHealthPanicThreshold
	// (0.5), a negative value turns it off, at most 1.
	HealthPanicThreshold float64
	// Timeout bounds reaching the API server at Open, and each write the
	// registry makes on its own behalf (Close, the removal after a drain).
	// Zero means DefaultTimeout.
	Timeout time.Duration
	// Logger receives the registry's logs, client-go's about the
	// registry's requests among them (cancellations left out); nil
	// discards them. What client-go logs elsewhere goes to klog's global
	// logger: SetClientLogger routes it.
	Logger *slog.Logger
	// Metrics registers the registry's Prometheus collectors (beacon_kube_*);
	// nil means none.
	Metrics prometheus.Registerer
}

// Pod is a pod's identity, as the Downward API gives it.
type Pod struct {
	Name      string // POD_NAME: fieldRef metadata.name
	Namespace string // POD_NAMESPACE: fieldRef metadata.namespace
	UID       string // POD_UID: fieldRef metadata.uid
	// Container (CONTAINER_NAME), when set, selects container mode: one
	// InstanceSet per container, named <pod>.<container>, so that several
	// registering processes share a pod.
	Container string
}

var osGetenv = os.Getenv

// ConfigFromEnv reads POD_NAME, POD_NAMESPACE, POD_UID, CONTAINER_NAME,
// KUBECONFIG and BEACON_KUBE_NAMESPACES through getenv (os.Getenv if nil).
func ConfigFromEnv(getenv func(string) string) Config {
	if getenv == nil {
		getenv = osGetenv
	}
	get := func(k string) string { return strings.TrimSpace(getenv(k)) }
	c := Config{
		Kubeconfig: get(EnvKubeconfig),
		Pod: Pod{
			Name:      get(EnvPodName),
			Namespace: get(EnvPodNamespace),
			UID:       get(EnvPodUID),
			Container: get(EnvContainerName),
		},
	}
	if ns := get(EnvNamespaces); ns != "" {
		for _, n := range strings.Split(ns, ",") {
			c.Namespaces = append(c.Namespaces, strings.TrimSpace(n))
		}
	}
	return c
}

// Validate checks the configuration. The pod identity is checked by
// Register (readers need none), except that what is set must be well-formed.
func (c Config) Validate() error {
	var errs []error
	all := false
	for _, ns := range c.Namespaces {
		if ns == AllNamespaces {
			all = true
			continue
		}
		if msgs := validation.IsDNS1123Label(ns); len(msgs) > 0 {
			errs = append(errs, fmt.Errorf("namespace %q (%s): %s", ns, EnvNamespaces, strings.Join(msgs, "; ")))
		}
	}
	if all && len(c.Namespaces) > 1 {
		errs = append(errs, fmt.Errorf("namespaces %q (%s): %q means every namespace and cannot be combined with others",
			strings.Join(c.Namespaces, ","), EnvNamespaces, AllNamespaces))
	}
	if c.MaxMetadataSize < 0 || c.MaxMetadataSize > MaxMetadataSize {
		errs = append(errs, fmt.Errorf("MaxMetadataSize %d: must be between 0 (the default, %d bytes) and %d on Kubernetes",
			c.MaxMetadataSize, beacon.DefaultMaxMetadataSize, MaxMetadataSize))
	}
	if c.DrainGrace < 0 {
		errs = append(errs, fmt.Errorf("drain grace %v is negative", c.DrainGrace))
	}
	if c.Timeout < 0 {
		errs = append(errs, fmt.Errorf("timeout %v is negative", c.Timeout))
	}
	if math.IsNaN(c.HealthPanicThreshold) || c.HealthPanicThreshold > 1 {
		errs = append(errs, fmt.Errorf("HealthPanicThreshold %v is not a share of a service's checked instances: use a value "+
			"up to 1 (0 for the default, %v), or a negative one to turn the panic threshold off", c.HealthPanicThreshold,
			defaults.HealthPanicThreshold))
	}
	p := c.Pod
	if p.Name != "" {
		if msgs := validation.IsDNS1123Subdomain(p.Name); len(msgs) > 0 {
			errs = append(errs, fmt.Errorf("%s %q: %s", EnvPodName, p.Name, strings.Join(msgs, "; ")))
		}
	}
	if p.Namespace != "" {
		if msgs := validation.IsDNS1123Label(p.Namespace); len(msgs) > 0 {
			errs = append(errs, fmt.Errorf("%s %q: %s", EnvPodNamespace, p.Namespace, strings.Join(msgs, "; ")))
		}
	}
	if p.Container != "" {
		if msgs := validation.IsDNS1123Label(p.Container); len(msgs) > 0 {
			errs = append(errs, fmt.Errorf("%s %q: %s", EnvContainerName, p.Container, strings.Join(msgs, "; ")))
		} else if p.Name != "" && len(p.resourceName()) > validation.DNS1123SubdomainMaxLength {
			errs = append(errs, fmt.Errorf("%s %q with %s %q: the InstanceSet name %q is longer than %d characters",
				EnvPodName, p.Name, EnvContainerName, p.Container, p.resourceName(), validation.DNS1123SubdomainMaxLength))
		}
	}
	if len(errs) > 0 {
		return fmt.Errorf("%w: %w", ErrInvalidConfig, errors.Join(errs...))
	}
	return nil
}

// check reports what is missing for registering, naming the variables and
// how to set them.
func (p Pod) check() error {
	var missing []string
	if p.Name == "" {
		missing = append(missing, EnvPodName)
	}
	if p.Namespace == "" {
		missing = append(missing, EnvPodNamespace)
	}
	if p.UID == "" {
		missing = append(missing, EnvPodUID)
	}
	if len(missing) == 0 {
		return nil
	}
	verb := "is"
	if len(missing) > 1 {
		verb = "are"
	}
	return fmt.Errorf("%w: %s %s not set: registering on Kubernetes needs the identity of the pod the process runs in, "+
		"from the Downward API: in the container's env, valueFrom.fieldRef.fieldPath metadata.name for POD_NAME, "+
		"metadata.namespace for POD_NAMESPACE and metadata.uid for POD_UID (see deploy/kubernetes/worker.yaml). "+
		"Outside a pod, register with another backend", ErrNoPodIdentity, strings.Join(missing, ", "), verb)
}

// resourceName is the name of the pod's (or container's) InstanceSet.
func (p Pod) resourceName() string {
	if p.Container != "" {
		return p.Name + "." + p.Container
	}
	return p.Name
}
