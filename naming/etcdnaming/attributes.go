package etcdnaming

import (
	"encoding/json"

	"google.golang.org/grpc/attributes"
)

// Every endpoint the resolver pushes carries its key and metadata in its
// attributes (resolver.Endpoint.Attributes, and the BalancerAttributes of
// State.Addresses). The metadata is kept as compact JSON text, so that
// gRPC can compare attributes whatever the metadata holds: etcd's resolver
// once passed JSON objects (maps) to gRPC, which panicked comparing them
// (etcd#19700), and has passed no metadata at all since.

type endpointKey struct{}

// endpointAttr is comparable: two strings.
type endpointAttr struct {
	key          string
	metadataJSON string
}

func (a endpointAttr) String() string { return a.key }

func attributesOf(key string, d decoded) *attributes.Attributes {
	return attributes.New(endpointKey{}, endpointAttr{key: key, metadataJSON: d.metadataJSON})
}

// KeyFrom returns the store key of the endpoint whose attributes are given
// (resolver.Endpoint.Attributes or resolver.Address.BalancerAttributes).
// ok is false for endpoints this package did not produce.
func KeyFrom(attrs *attributes.Attributes) (key string, ok bool) {
	a, ok := attrs.Value(endpointKey{}).(endpointAttr)
	return a.key, ok
}

// MetadataFrom returns the endpoint's metadata, freshly decoded (the
// generic JSON form: map[string]any, []any, float64, string, bool, or nil
// when the endpoint has none).
func MetadataFrom(attrs *attributes.Attributes) (any, bool) {
	a, ok := attrs.Value(endpointKey{}).(endpointAttr)
	if !ok {
		return nil, false
	}
	var md any
	if err := json.Unmarshal([]byte(a.metadataJSON), &md); err != nil {
		return nil, false // unreachable: the text came from a decoded value
	}
	return md, true
}

// MetadataJSON returns the endpoint's metadata as compact JSON ("null" when
// it has none).
func MetadataJSON(attrs *attributes.Attributes) (string, bool) {
	a, ok := attrs.Value(endpointKey{}).(endpointAttr)
	return a.metadataJSON, ok
}
