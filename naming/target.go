package naming

import (
	"fmt"
	"net/url"
	"strings"

	"github.com/beaconplane/beacon"
)

// Scheme is the URL scheme of Beacon targets: beacon:///ns/component/endpoint.
const Scheme = "beacon"

// targetForm is how error messages spell a valid target.
const targetForm = "beacon:///namespace/component/endpoint"

// Target returns the gRPC target of the endpoint q names, for
// grpc.NewClient: "beacon:///namespace/component/endpoint". It does not
// validate q; Build does.
func Target(q beacon.Query) string {
	return Scheme + ":///" + q.Namespace + "/" + q.Component + "/" + q.Endpoint
}

// ParseTarget parses a Beacon target: "beacon:///namespace/component/endpoint"
// (or the equivalent "beacon:namespace/component/endpoint"). Each of the three
// names must be one Beacon serves (beacon.Query.Validate): a DNS label, or
// one of the NVIDIA Dynamo runtime's names ('_', a namespace nested with
// dots). Anything else, an authority
// ("beacon://host/..."), query parameters or a fragment gives an error
// matching ErrInvalidTarget that says what to write instead.
func ParseTarget(target string) (beacon.Query, error) {
	u, err := url.Parse(target)
	if err != nil {
		return beacon.Query{}, invalidTarget(target, "not a URL ("+err.Error()+"); write "+targetForm)
	}
	return parseURL(Scheme, u, target)
}

// parseURL validates a parsed target whose scheme must be scheme.
func parseURL(scheme string, u *url.URL, raw string) (beacon.Query, error) {
	if u.Scheme != scheme {
		if u.Scheme == "" {
			return beacon.Query{}, invalidTarget(raw, fmt.Sprintf("has no scheme; write %s:///namespace/component/endpoint", scheme))
		}
		return beacon.Query{}, invalidTarget(raw, fmt.Sprintf("scheme %q is not %q; write %s:///namespace/component/endpoint", u.Scheme, scheme, scheme))
	}
	if u.User != nil || u.Host != "" {
		authority := u.Host
		if u.User != nil {
			authority = u.User.String() + "@" + authority
		}
		return beacon.Query{}, invalidTarget(raw, fmt.Sprintf(
			"has authority %q, but %s targets have none: put all three names in the path, %s:///%s%s (three slashes)",
			authority, scheme, scheme, u.Host, u.EscapedPath()))
	}
	if u.RawQuery != "" || u.ForceQuery || u.Fragment != "" {
		return beacon.Query{}, invalidTarget(raw, fmt.Sprintf("query parameters and fragments are not supported; write %s:///namespace/component/endpoint", scheme))
	}
	path := u.Path
	if path == "" {
		path = u.Opaque
	}
	path = strings.TrimPrefix(path, "/")
	parts := strings.Split(path, "/")
	if path == "" || len(parts) != 3 {
		return beacon.Query{}, invalidTarget(raw, fmt.Sprintf(
			"must name namespace, component and endpoint, like %s:///prod/api/grpc (got %d path segments in %q)",
			scheme, countSegments(path), path))
	}
	q := beacon.Query{Namespace: parts[0], Component: parts[1], Endpoint: parts[2]}
	if err := (beacon.Ref{Namespace: q.Namespace, Component: q.Component, Endpoint: q.Endpoint, ID: beacon.FormatID(0)}).Validate(); err != nil {
		// The names Beacon serves, Dynamo's among them: all three.
		return beacon.Query{}, fmt.Errorf("%w %q: %w", ErrInvalidTarget, raw, err)
	}
	return q, nil
}

func countSegments(path string) int {
	if path == "" {
		return 0
	}
	return strings.Count(path, "/") + 1
}

func invalidTarget(raw, why string) error {
	const max = 200
	if len(raw) > max {
		raw = raw[:max] + "…"
	}
	return fmt.Errorf("%w %q: %s", ErrInvalidTarget, raw, why)
}

// authority is the :authority of a channel to q: a DNS name,
// endpoint.component.namespace, which TLS certificates of the service can
// name.
func authority(q beacon.Query) string {
	return q.Endpoint + "." + q.Component + "." + q.Namespace
}
