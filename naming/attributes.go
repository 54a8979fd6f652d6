package naming

import (
	"github.com/beaconplane/beacon"
	"google.golang.org/grpc/attributes"
)

// Every endpoint the resolver pushes carries the instance it stands for in
// its attributes: resolver.Endpoint.Attributes, and the same attributes as
// resolver.Address.BalancerAttributes of State.Addresses for balancers that
// still read addresses. A custom balancer reads them with InstanceFrom or
// MetadataValue:
//
//	weight, ok := naming.MetadataValue(ep.Attributes, "weight")
//
// gRPC compares attributes when it diffs states. A map is not comparable
// (comparing one panics, which is how etcd's resolver once crashed on map
// metadata, etcd#19700), so the instance is stored in a value whose Equal
// method compares instances field by field.

// instanceKey is the attribute key of the instance.
type instanceKey struct{}

// instanceAttr holds an instance; it is never modified after creation.
type instanceAttr struct{ in beacon.Instance }

// Equal implements the interface attributes.Attributes.Equal uses.
func (a instanceAttr) Equal(o any) bool {
	b, ok := o.(instanceAttr)
	return ok && a.in.Equal(b.in)
}

// String keeps attribute dumps (channelz, logs) short.
func (a instanceAttr) String() string { return a.in.Ref().String() + "@" + a.in.Address }

// attributesOf returns the attributes of an instance's endpoint.
func attributesOf(in beacon.Instance) *attributes.Attributes {
	return attributes.New(instanceKey{}, instanceAttr{in.Clone()})
}

// InstanceFrom returns the instance behind an endpoint, given its
// Attributes (resolver.Endpoint.Attributes, or
// resolver.Address.BalancerAttributes). ok is false for endpoints that a
// Beacon resolver did not produce. The instance is a copy: changing it
// changes nothing else.
func InstanceFrom(attrs *attributes.Attributes) (in beacon.Instance, ok bool) {
	a, ok := attrs.Value(instanceKey{}).(instanceAttr)
	if !ok {
		return beacon.Instance{}, false
	}
	return a.in.Clone(), true
}

// MetadataValue returns one metadata value of the instance behind an
// endpoint (see InstanceFrom), without copying the instance: what a
// balancer reads per pick, such as "weight" or "zone".
func MetadataValue(attrs *attributes.Attributes, key string) (string, bool) {
	a, ok := attrs.Value(instanceKey{}).(instanceAttr)
	if !ok {
		return "", false
	}
	v, ok := a.in.Metadata[key]
	return v, ok
}
