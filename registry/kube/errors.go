package kube

import (
	"context"
	"crypto/tls"
	"crypto/x509"
	"errors"
	"fmt"
	"net"
	"net/url"
	"regexp"
	"strings"

	"github.com/beaconplane/beacon"
	"github.com/beaconplane/beacon/store"
	apierrors "k8s.io/apimachinery/pkg/api/errors"
)

// Sentinel errors. Errors from the API server are wrapped with one of them
// and a sentence saying what to do.
var (
	// ErrInvalidConfig reports a Config that does not validate.
	ErrInvalidConfig = errors.New("kube: invalid config")
	// ErrNoPodIdentity reports a Register without the pod identity
	// (POD_NAME, POD_NAMESPACE, POD_UID).
	ErrNoPodIdentity = errors.New("kube: no pod identity")
	// ErrPodMismatch reports a pod identity that names no pod, or a pod
	// with another UID (the garbage collector would delete the
	// InstanceSet at once).
	ErrPodMismatch = errors.New("kube: pod identity does not match the cluster")
	// ErrCRDNotInstalled reports a cluster without the InstanceSet
	// CustomResourceDefinition.
	ErrCRDNotInstalled = errors.New("kube: the InstanceSet custom resource definition (" + CRDName + ") is not installed; " +
		"install it with: kubectl apply -f deploy/kubernetes/crd.yaml")
	// ErrCRDMismatch reports an InstanceSet CustomResourceDefinition that
	// is installed but is not the one this Beacon needs (another version,
	// or an older schema that lacks fields Beacon writes).
	ErrCRDMismatch = errors.New("kube: the installed InstanceSet custom resource definition (" + CRDName + ") is not " +
		"the one this Beacon needs; install its own with: kubectl apply -f deploy/kubernetes/crd.yaml")
	// ErrForbidden reports an RBAC denial; the message names the verb and
	// the resource.
	ErrForbidden = errors.New("kube: forbidden by RBAC")
	// ErrUnauthorized reports credentials the API server does not accept.
	ErrUnauthorized = errors.New("kube: the API server does not accept the credentials")
	// ErrUnreachable reports an API server that did not answer in time.
	ErrUnreachable = errors.New("kube: the Kubernetes API server is unreachable")
	// ErrUntrusted reports an API server whose TLS certificate the client
	// configuration does not trust (a wrong CA, or a server name the
	// certificate does not cover).
	ErrUntrusted = errors.New("kube: the Kubernetes API server's certificate is not trusted")
	// ErrTakenOver reports that another live process writes this process's
	// InstanceSet (two processes in one pod without CONTAINER_NAME).
	ErrTakenOver = errors.New("kube: another process took over this process's InstanceSet")
	// ErrTooLarge reports a registration that would make the InstanceSet
	// larger than MaxObjectSize or MaxInstances.
	ErrTooLarge = errors.New("kube: InstanceSet too large")
	// ErrHealthCheck reports a registration that declares a TTL health
	// check (beacon.CheckTTL): on Kubernetes there is no store for its
	// service's reports. It comes with beacon.ErrInvalid.
	ErrHealthCheck = errors.New("kube: TTL health checks are not run on Kubernetes")
)

// checkRefused refuses in if it declares a check Kubernetes cannot run: a
// TTL check. grpc, http and tcp checks are run by Beacon's checkers (beacon
// serve in a pod) like on every backend.
func checkRefused(in beacon.Instance) error {
	if in.Check == nil || in.Check.Kind != beacon.CheckTTL {
		return nil
	}
	return fmt.Errorf("%w: %w: %s declares a ttl check: on Kubernetes there is no store for its reports; give the "+
		"container an exec readinessProbe that runs the same test instead (the pod's readiness already takes an instance out "+
		"of routing), or declare a grpc, http or tcp check", ErrHealthCheck, beacon.ErrInvalid, in.Ref())
}

// op describes one API request for error messages: the RBAC verb, the
// resource (as RBAC names it), and the namespace ("" for every namespace).
type op struct {
	verb      string
	resource  string
	namespace string
}

func (o op) where() string {
	if o.verb == "discover" {
		return "(API discovery)"
	}
	if o.namespace == "" {
		return "in every namespace (cluster-wide)"
	}
	return fmt.Sprintf("in namespace %q", o.namespace)
}

// explain turns an error of one API request into an error that says what
// went wrong and what to do.
func (r *Registry) explain(o op, err error) error {
	if err == nil {
		return nil
	}
	host := r.host
	var st apierrors.APIStatus
	switch {
	case apierrors.IsForbidden(err):
		if m := deniedRE.FindStringSubmatch(apiMessage(err)); m != nil {
			// The verb the API server checked (creating an object through
			// server-side apply is a create, not a patch).
			o.verb = m[1]
		}
		if strings.Contains(apiMessage(err), `User "system:anonymous"`) {
			return fmt.Errorf("%w: the API server took this client for system:anonymous, so it may not %s %s %s (%s): the "+
				"kubeconfig's user (%s) or the in-cluster service account token holds no credentials it accepts",
				ErrForbidden, o.verb, o.resource, o.where(), apiMessage(err), EnvKubeconfig)
		}
		return fmt.Errorf("%w: may not %s %s %s (%s): %s",
			ErrForbidden, o.verb, o.resource, o.where(), apiMessage(err), r.grantHint(o.namespace == "" && o.verb != "discover"))
	case apierrors.IsUnauthorized(err):
		return fmt.Errorf("%w at %s (%s): check the kubeconfig or service account token", ErrUnauthorized, host, apiMessage(err))
	case apierrors.IsNotFound(err) && o.resource == r.kind.rbacName() && notFoundResource(err):
		return fmt.Errorf("%w (%s %s %s: %s)", r.kind.notInstalled, o.verb, o.resource, o.where(), apiMessage(err))
	case o.resource == instanceSetsResource && strings.Contains(apiMessage(err), "field not declared in schema"):
		// Server-side apply of a field the installed schema lacks.
		return fmt.Errorf("%w (%s %s %s: %s)", ErrCRDMismatch, o.verb, o.resource, o.where(), apiMessage(err))
	case errors.As(err, &st):
		return fmt.Errorf("kube: %s %s %s: %w", o.verb, o.resource, o.where(), err)
	case isCertificateError(err):
		return fmt.Errorf("%w at %s (%s %s %s): %w; the server answered, with a certificate the client does not trust: check "+
			"the kubeconfig's certificate-authority (%s) or the in-cluster service account's ca.crt, and that the server "+
			"URL names a host the certificate covers", ErrUntrusted, host, o.verb, o.resource, o.where(), err, EnvKubeconfig)
	case isUnreachable(err):
		return fmt.Errorf("%w at %s (%s %s %s): %w; check that the cluster is up and the kubeconfig (%s) or in-cluster "+
			"configuration points at it", ErrUnreachable, host, o.verb, o.resource, o.where(), err, EnvKubeconfig)
	}
	return fmt.Errorf("kube: %s %s %s: %w", o.verb, o.resource, o.where(), err)
}

// deniedRE finds the verb in an RBAC denial: `... cannot create resource "instancesets" in API group ...`.
var deniedRE = regexp.MustCompile(`cannot (\w+) resource "`)

// apiMessage returns the API server's message of an API error.
func apiMessage(err error) string {
	var st apierrors.APIStatus
	if errors.As(err, &st) {
		if m := st.Status().Message; m != "" {
			return m
		}
	}
	return err.Error()
}

// notFoundResource reports whether a 404 is about the resource type (the
// CRD is missing) rather than one object.
func notFoundResource(err error) bool {
	var st apierrors.APIStatus
	if !errors.As(err, &st) {
		return false
	}
	d := st.Status().Details
	return d == nil || d.Name == "" || strings.Contains(st.Status().Message, "could not find the requested resource")
}

// isCertificateError reports a TLS verification failure of the server's
// certificate.
func isCertificateError(err error) bool {
	var (
		cv *tls.CertificateVerificationError
		ua x509.UnknownAuthorityError
		he x509.HostnameError
		ci x509.CertificateInvalidError
	)
	return errors.As(err, &cv) || errors.As(err, &ua) || errors.As(err, &he) || errors.As(err, &ci)
}

// isUnreachable reports a transport failure or a timeout.
func isUnreachable(err error) bool {
	var ne net.Error
	var ue *url.Error
	return errors.Is(err, context.DeadlineExceeded) || errors.As(err, &ne) || errors.As(err, &ue) ||
		apierrors.IsTimeout(err) || apierrors.IsServerTimeout(err)
}

// backendError is a reader's error that comes from the API server or this
// client's access to it (RBAC, credentials, the CRD, reachability, the
// namespaces it watches), not from the request: it also matches
// store.ErrUnavailable, so that a server over this registry (beacon serve)
// answers 503 "unavailable", as over an etcd it cannot use, instead of 500
// "internal". Its message is the wrapped error's.
type backendError struct{ err error }

func (e *backendError) Error() string        { return e.err.Error() }
func (e *backendError) Unwrap() error        { return e.err }
func (e *backendError) Is(target error) bool { return target == store.ErrUnavailable }

// unavailable marks err as a backendError when it is one of the registry's
// errors about the API server or access to it.
func unavailable(err error) error {
	for _, s := range []error{ErrForbidden, ErrUnauthorized, ErrUnreachable, ErrUntrusted, ErrCRDNotInstalled, ErrCRDMismatch,
		ErrDynamoNotInstalled, ErrDynamoMismatch, ErrInvalidConfig} {
		if errors.Is(err, s) {
			return &backendError{err}
		}
	}
	var st apierrors.APIStatus
	if errors.As(err, &st) || isUnreachable(err) {
		return &backendError{err}
	}
	return err
}
