package xdsapi

import (
	"strings"

	"github.com/beaconplane/beacon"
)

// A service is one namespace/component/endpoint: what a client routes to.
// Each has one Cluster and one ClusterLoadAssignment, named in the DNS-like
// form, and a Listener under each of the two names a client may dial.
type service struct {
	ns, comp, ep string
}

func serviceOf(in beacon.Instance) service {
	return service{ns: in.Namespace, comp: in.Component, ep: in.Endpoint}
}

// dnsName is the DNS-like name "endpoint.component.namespace": the name of
// the service's Cluster and ClusterLoadAssignment, and of the Listener that
// xds:///endpoint.component.namespace resolves (every client accepts it).
func (s service) dnsName() string { return s.ep + "." + s.comp + "." + s.ns }

// slashName is "namespace/component/endpoint", the Listener name
// xds:///namespace/component/endpoint resolves in grpc-go (the form of
// beacon:///).
func (s service) slashName() string { return s.ns + "/" + s.comp + "/" + s.ep }

func (s service) String() string { return s.slashName() }

// maxNameLength bounds the resource names parsed: longer ones name no
// service (three labels of 63 and two separators); maxReadNameLength, for a
// registry of the dynamo layout, a namespace and two labels.
const (
	maxNameLength     = 3*beacon.MaxLabelLength + 2
	maxReadNameLength = beacon.MaxNamespaceLength + 2*beacon.MaxLabelLength + 2
)

// parseName reads a resource name in either form. ok is false for a name
// that is no Beacon service (wrong shape, or a part that breaks the label
// rule): such a name is answered as a resource that does not exist.
// Names are case-sensitive, as xDS resource names are: only the lower-case
// form the registry holds is a service.
//
// With readNames (a registry of the dynamo layout, which serves the NVIDIA
// Dynamo runtime's names: docs/dynamo.md) the parts follow the read rules
// (beacon.Query.Validate) instead of the label rule, and the DNS-like
// form is read from the left: component and endpoint hold no dot, the
// namespace may.
func parseName(name string, readNames bool) (svc service, slash, ok bool) {
	if readNames {
		return parseReadName(name)
	}
	if len(name) > maxNameLength {
		return service{}, false, false
	}
	if strings.Contains(name, "/") {
		parts := strings.Split(name, "/")
		if len(parts) != 3 {
			return service{}, false, false
		}
		svc = service{ns: parts[0], comp: parts[1], ep: parts[2]}
		slash = true
	} else {
		parts := strings.Split(name, ".")
		if len(parts) != 3 {
			return service{}, false, false
		}
		svc = service{ep: parts[0], comp: parts[1], ns: parts[2]}
	}
	if beacon.ValidateLabel("namespace", svc.ns) != nil || beacon.ValidateLabel("component", svc.comp) != nil ||
		beacon.ValidateLabel("endpoint", svc.ep) != nil {
		return service{}, false, false
	}
	return svc, slash, true
}

// parseReadName is parseName with readNames.
func parseReadName(name string) (svc service, slash, ok bool) {
	if len(name) > maxReadNameLength {
		return service{}, false, false
	}
	var parts []string
	if slash = strings.Contains(name, "/"); slash {
		parts = strings.Split(name, "/")
	} else {
		parts = strings.SplitN(name, ".", 3)
	}
	if len(parts) != 3 {
		return service{}, false, false
	}
	if slash {
		svc = service{ns: parts[0], comp: parts[1], ep: parts[2]}
	} else {
		svc = service{ep: parts[0], comp: parts[1], ns: parts[2]}
	}
	if (beacon.Ref{Namespace: svc.ns, Component: svc.comp, Endpoint: svc.ep, ID: beacon.FormatID(0)}).Validate() != nil {
		return service{}, false, false
	}
	return svc, slash, true
}
