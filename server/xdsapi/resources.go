package xdsapi

import (
	"cmp"
	"math"
	"net/netip"
	"slices"
	"strings"

	"github.com/beaconplane/beacon"
	clusterv3 "github.com/envoyproxy/go-control-plane/envoy/config/cluster/v3"
	corev3 "github.com/envoyproxy/go-control-plane/envoy/config/core/v3"
	endpointv3 "github.com/envoyproxy/go-control-plane/envoy/config/endpoint/v3"
	listenerv3 "github.com/envoyproxy/go-control-plane/envoy/config/listener/v3"
	routev3 "github.com/envoyproxy/go-control-plane/envoy/config/route/v3"
	routerv3 "github.com/envoyproxy/go-control-plane/envoy/extensions/filters/http/router/v3"
	hcmv3 "github.com/envoyproxy/go-control-plane/envoy/extensions/filters/network/http_connection_manager/v3"
	"google.golang.org/protobuf/proto"
	"google.golang.org/protobuf/types/known/anypb"
	"google.golang.org/protobuf/types/known/wrapperspb"
)

// Metadata keys an instance may set to shape how xDS clients route to it.
// They mean what they mean in DNS (weight and priority of SRV records), so
// that one registration routes alike through either.
const (
	// MetaWeight is the instance's share of its locality's traffic,
	// 0-65535 (DefaultWeight when absent). xDS carries no weight 0: 0 is
	// sent as 1, the smallest share.
	MetaWeight = beacon.MetaWeight
	// MetaPriority orders instances into failover tiers, 0-65535, lower
	// first (DefaultPriority when absent); a client uses the next tier
	// only when the one before has no healthy instance. The distinct
	// values of a service become xDS priorities 0, 1, ... in order.
	MetaPriority = beacon.MetaPriority
	// MetaRegion, MetaZone and MetaSubZone place the instance in a
	// locality. Clients spread traffic over localities by their weight,
	// which is the sum of their instances' weights.
	MetaRegion  = "region"
	MetaZone    = "zone"
	MetaSubZone = "sub_zone"
	// MetaLBPolicy chooses the service's load-balancing policy
	// (round_robin, the default, ring_hash or least_request): the value
	// most of its instances carry, ties to the first in that order.
	MetaLBPolicy = beacon.MetaLBPolicy
)

// DefaultWeight and DefaultPriority apply to instances that set none, as
// in DNS.
const (
	DefaultWeight   = beacon.DefaultWeight
	DefaultPriority = beacon.DefaultPriority
)

// Type URLs of the resources Beacon serves.
const (
	ListenerType = "type.googleapis.com/envoy.config.listener.v3.Listener"
	RouteType    = "type.googleapis.com/envoy.config.route.v3.RouteConfiguration"
	ClusterType  = "type.googleapis.com/envoy.config.cluster.v3.Cluster"
	EndpointType = "type.googleapis.com/envoy.config.endpoint.v3.ClusterLoadAssignment"
)

// Reasons an instance is left out of its ClusterLoadAssignment, or served
// with a default in place of a value it set (labels of
// beacon_xds_omitted_endpoints and beacon_xds_defaulted_endpoints).
const (
	reasonHostname  = "hostname"          // the address names a host, not an IP (grpc-js and C-core NACK it)
	reasonURL       = "url"               // the address is a URL, not host:port
	reasonIPv6Zone  = "ipv6_zone"         // an IPv6 address with a zone (fe80::1%eth0) means nothing elsewhere
	reasonNotOne    = "not_one_host"      // unspecified, broadcast or multicast: no host to connect to (beacon.IPProblem)
	reasonDuplicate = "duplicate_address" // another instance of the service has the same address
	reasonWeight    = "invalid_weight"    // weight is not 0-65535: DefaultWeight is used
	reasonPriority  = "invalid_priority"  // priority is not 0-65535: DefaultPriority is used
	reasonPolicy    = "invalid_lb_policy" // lb_policy names no policy Beacon serves: ignored
)

// omission is one instance left out of xDS (or served with a default), and
// why.
type omission struct {
	ref    beacon.Ref
	addr   string
	reason string
	value  string // the offending value, for the log
}

// marshal encodes m deterministically, so that equal resources give equal
// bytes and an unchanged resource is never pushed again.
func marshal(m proto.Message) *anypb.Any {
	b, err := proto.MarshalOptions{Deterministic: true}.Marshal(m)
	if err != nil {
		// Only messages built here are marshalled: a failure is a bug.
		panic("xdsapi: marshal " + string(m.ProtoReflect().Descriptor().FullName()) + ": " + err.Error())
	}
	return &anypb.Any{TypeUrl: "type.googleapis.com/" + string(m.ProtoReflect().Descriptor().FullName()), Value: b}
}

// routerFilter is the HTTP router, the last (and only) filter of every
// Listener: gRPC requires it last.
var routerFilter = &hcmv3.HttpFilter{
	Name:       "envoy.filters.http.router",
	ConfigType: &hcmv3.HttpFilter_TypedConfig{TypedConfig: marshal(&routerv3.Router{})},
}

// buildListener is the API Listener named name that routes every RPC to
// the cluster: an HttpConnectionManager with an inline route
// configuration, as proxyless gRPC reads it (gRFC A27).
func buildListener(name, cluster string) *anypb.Any {
	hcm := &hcmv3.HttpConnectionManager{
		StatPrefix: cluster, // Envoy requires one; gRPC ignores it
		RouteSpecifier: &hcmv3.HttpConnectionManager_RouteConfig{RouteConfig: &routev3.RouteConfiguration{
			Name: name,
			VirtualHosts: []*routev3.VirtualHost{{
				Name:    cluster,
				Domains: []string{"*"},
				Routes: []*routev3.Route{{
					Match: &routev3.RouteMatch{PathSpecifier: &routev3.RouteMatch_Prefix{Prefix: ""}},
					Action: &routev3.Route_Route{Route: &routev3.RouteAction{
						ClusterSpecifier: &routev3.RouteAction_Cluster{Cluster: cluster},
					}},
				}},
			}},
		}},
		HttpFilters: []*hcmv3.HttpFilter{routerFilter},
	}
	return marshal(&listenerv3.Listener{
		Name:        name,
		ApiListener: &listenerv3.ApiListener{ApiListener: marshal(hcm)},
	})
}

// lbPolicies are the policies MetaLBPolicy may name, the default first.
var lbPolicies = []struct {
	name   string
	policy clusterv3.Cluster_LbPolicy
}{
	{"round_robin", clusterv3.Cluster_ROUND_ROBIN},
	{"ring_hash", clusterv3.Cluster_RING_HASH},
	{"least_request", clusterv3.Cluster_LEAST_REQUEST},
}

// policySet is a set of load-balancing policies.
type policySet uint8

func (p policySet) has(policy clusterv3.Cluster_LbPolicy) bool { return p&(1<<policy) != 0 }

func policiesOf(policies ...clusterv3.Cluster_LbPolicy) policySet {
	var p policySet
	for _, policy := range policies {
		p |= 1 << policy
	}
	return p
}

// refusedPolicies returns the policies a client implementation, by its
// node's user_agent_name, is known to refuse: such a client gets the
// service's cluster with round_robin instead, rather than NACK it (a new
// cluster refused leaves its calls failing) or crash on it. Seen with
// real clients (TestPolicyFallbackPerClient): gRPC C-core (Python 1.51)
// refuses least_request ("LB policy is not supported") and its process
// dies of SIGSEGV on ring_hash; grpc-js (@grpc/grpc-js-xds 1.14) refuses
// least_request. grpc-go, Envoy and other clients get the service's
// policy.
func refusedPolicies(userAgent string) policySet {
	switch {
	case strings.HasPrefix(userAgent, "gRPC C-core"):
		return policiesOf(clusterv3.Cluster_LEAST_REQUEST, clusterv3.Cluster_RING_HASH)
	case strings.HasPrefix(userAgent, "gRPC Node"):
		return policiesOf(clusterv3.Cluster_LEAST_REQUEST)
	}
	return 0
}

// buildCluster is the EDS Cluster named name, its endpoints over ADS.
func buildCluster(name string, policy clusterv3.Cluster_LbPolicy) *anypb.Any {
	return marshal(&clusterv3.Cluster{
		Name:                 name,
		ClusterDiscoveryType: &clusterv3.Cluster_Type{Type: clusterv3.Cluster_EDS},
		EdsClusterConfig: &clusterv3.Cluster_EdsClusterConfig{
			EdsConfig: &corev3.ConfigSource{
				ConfigSourceSpecifier: &corev3.ConfigSource_Ads{Ads: &corev3.AggregatedConfigSource{}},
				ResourceApiVersion:    corev3.ApiVersion_V3,
			},
			ServiceName: name,
		},
		LbPolicy: policy,
	})
}

// choosePolicy returns the load-balancing policy most instances name
// (MetaLBPolicy), and the instances whose value names none.
func choosePolicy(ins []beacon.Instance) (clusterv3.Cluster_LbPolicy, []omission) {
	votes := make([]int, len(lbPolicies))
	var bad []omission
	for _, in := range ins {
		v, ok := in.Metadata[MetaLBPolicy]
		if !ok {
			continue
		}
		i := slices.IndexFunc(lbPolicies, func(p struct {
			name   string
			policy clusterv3.Cluster_LbPolicy
		}) bool {
			return p.name == v
		})
		if i < 0 {
			bad = append(bad, omission{ref: in.Ref(), addr: in.Address, reason: reasonPolicy, value: v})
			continue
		}
		votes[i]++
	}
	best := 0
	for i, n := range votes {
		if n > votes[best] {
			best = i
		}
	}
	return lbPolicies[best].policy, bad
}

// socketAddress parses an instance's address into what every xDS client
// accepts: an IP literal and a port. reason says why it cannot be.
func socketAddress(addr string) (netip.AddrPort, string) {
	if strings.Contains(addr, "://") {
		return netip.AddrPort{}, reasonURL
	}
	ap, err := netip.ParseAddrPort(addr)
	if err != nil {
		return netip.AddrPort{}, reasonHostname
	}
	if ap.Addr().Zone() != "" {
		return netip.AddrPort{}, reasonIPv6Zone
	}
	if beacon.IPProblem(ap.Addr()) != "" {
		return netip.AddrPort{}, reasonNotOne
	}
	return netip.AddrPortFrom(ap.Addr().Unmap(), ap.Port()), ""
}

// uint16Meta reads a 0-65535 metadata value (beacon.Uint16Meta); ok is
// false when the key is set to anything else.
func uint16Meta(in beacon.Instance, key string, def uint32) (v uint32, ok bool) {
	n, ok := beacon.Uint16Meta(in.Metadata, key, uint16(def))
	return uint32(n), ok
}

// endpoint is one instance as its ClusterLoadAssignment carries it.
type endpoint struct {
	in       beacon.Instance
	addr     netip.AddrPort
	weight   uint32
	priority uint32
	locality locality
}

type locality struct{ region, zone, subZone string }

func localityOf(in beacon.Instance) locality {
	return locality{region: in.Metadata[MetaRegion], zone: in.Metadata[MetaZone], subZone: in.Metadata[MetaSubZone]}
}

// endpoints turns a service's instances into the endpoints its
// ClusterLoadAssignment may carry: an IP address each, no address twice
// (a HEALTHY instance wins over an UNHEALTHY one, which wins over a
// DRAINING one — a failing check may pass again, a drain is for good —
// then the older registration, then the lower ID), weights and priorities
// read. The
// omissions say who was left out or defaulted, and why.
func endpoints(ins []beacon.Instance) ([]endpoint, []omission) {
	var out []endpoint
	var om []omission
	for _, in := range ins {
		ap, why := socketAddress(in.Address)
		if why != "" {
			om = append(om, omission{ref: in.Ref(), addr: in.Address, reason: why})
			continue
		}
		w, ok := uint16Meta(in, MetaWeight, DefaultWeight)
		if !ok {
			om = append(om, omission{ref: in.Ref(), addr: in.Address, reason: reasonWeight, value: in.Metadata[MetaWeight]})
		}
		p, ok := uint16Meta(in, MetaPriority, DefaultPriority)
		if !ok {
			om = append(om, omission{ref: in.Ref(), addr: in.Address, reason: reasonPriority, value: in.Metadata[MetaPriority]})
		}
		out = append(out, endpoint{in: in, addr: ap, weight: max(w, 1), priority: p, locality: localityOf(in)})
	}
	// Sort so that, for each address, the instance that keeps it comes
	// first.
	slices.SortFunc(out, func(a, b endpoint) int {
		if c := a.addr.Compare(b.addr); c != 0 {
			return c
		}
		return cmp.Or(cmp.Compare(healthRank(a.in), healthRank(b.in)), a.in.RegisteredAt.Compare(b.in.RegisteredAt),
			strings.Compare(a.in.ID, b.in.ID))
	})
	kept := out[:0]
	for i, e := range out {
		if i > 0 && e.addr == out[i-1].addr {
			om = append(om, omission{ref: e.in.Ref(), addr: e.in.Address, reason: reasonDuplicate})
			continue
		}
		kept = append(kept, e)
	}
	return kept, om
}

// healthOf is how an instance is sent (healthStatus): DRAINING when its
// registrant drains it, UNHEALTHY when its health check fails (and its
// priority level is not in panic), HEALTHY otherwise. Clients send new RPCs to
// HEALTHY endpoints only, and fail over to the next priority when one has
// none.
func healthOf(in beacon.Instance) corev3.HealthStatus {
	switch {
	case in.Draining():
		return corev3.HealthStatus_DRAINING
	case in.Health.Failing():
		return corev3.HealthStatus_UNHEALTHY
	}
	return corev3.HealthStatus_HEALTHY
}

// healthRank orders the statuses healthOf gives, the one that keeps a
// shared address first.
func healthRank(in beacon.Instance) int {
	switch healthOf(in) {
	case corev3.HealthStatus_HEALTHY:
		return 0
	case corev3.HealthStatus_UNHEALTHY:
		return 1
	}
	return 2
}

// buildAssignment is the ClusterLoadAssignment named name of eps, each
// endpoint with its healthOf status (draining and failing instances stay
// in the assignment), grouped into localities per priority. Priorities are
// contiguous from 0; a locality's weight is the sum of its endpoints'
// weights (never 0), kept within what clients accept.
func buildAssignment(name string, eps []endpoint) *anypb.Any {
	prios := make([]uint32, 0, 4)
	for _, e := range eps {
		if !slices.Contains(prios, e.priority) {
			prios = append(prios, e.priority)
		}
	}
	slices.Sort(prios)
	type groupKey struct {
		prio uint32
		loc  locality
	}
	groups := map[groupKey]*endpointv3.LocalityLbEndpoints{}
	var order []groupKey
	for _, e := range eps {
		k := groupKey{prio: uint32(slices.Index(prios, e.priority)), loc: e.locality}
		g := groups[k]
		if g == nil {
			g = &endpointv3.LocalityLbEndpoints{
				Locality: &corev3.Locality{Region: k.loc.region, Zone: k.loc.zone, SubZone: k.loc.subZone},
				Priority: k.prio,
			}
			groups[k] = g
			order = append(order, k)
		}
		g.LbEndpoints = append(g.LbEndpoints, &endpointv3.LbEndpoint{
			HostIdentifier: &endpointv3.LbEndpoint_Endpoint{Endpoint: &endpointv3.Endpoint{
				Address: &corev3.Address{Address: &corev3.Address_SocketAddress{SocketAddress: &corev3.SocketAddress{
					Protocol:      corev3.SocketAddress_TCP,
					Address:       e.addr.Addr().String(),
					PortSpecifier: &corev3.SocketAddress_PortValue{PortValue: uint32(e.addr.Port())},
				}}},
			}},
			HealthStatus:        healthOf(e.in),
			LoadBalancingWeight: wrapperspb.UInt32(e.weight),
		})
	}
	slices.SortFunc(order, func(a, b groupKey) int {
		return cmp.Or(cmp.Compare(a.prio, b.prio), cmp.Compare(a.loc.region, b.loc.region),
			cmp.Compare(a.loc.zone, b.loc.zone), cmp.Compare(a.loc.subZone, b.loc.subZone))
	})
	cla := &endpointv3.ClusterLoadAssignment{ClusterName: name}
	for _, k := range order {
		cla.Endpoints = append(cla.Endpoints, groups[k])
	}
	setLocalityWeights(cla.Endpoints)
	return marshal(cla)
}

// setLocalityWeights keeps the weights within what clients accept (they
// refuse a locality whose endpoint weights add up past 2^32-1, and a
// priority whose locality weights do) and gives each locality the sum of
// its HEALTHY endpoints' weights (of all of them when none is: a weight
// is never 0): gRPC clients split calls between localities by these
// weights alone, so a locality counting its UNHEALTHY or DRAINING
// endpoints sent their share to its healthy ones. Where a sum would not
// fit, the weights it adds up are scaled down to fit, each at least 1.
func setLocalityWeights(locs []*endpointv3.LocalityLbEndpoints) {
	byPrio := map[uint32][]int{} // locality indexes per priority
	sums := make([]uint64, len(locs))
	for i, l := range locs {
		ws := make([]uint64, len(l.LbEndpoints))
		for j, e := range l.LbEndpoints {
			ws[j] = uint64(e.GetLoadBalancingWeight().GetValue())
		}
		var all, healthy uint64
		for j, w := range scaleToFit(ws) {
			l.LbEndpoints[j].LoadBalancingWeight = wrapperspb.UInt32(w)
			all += uint64(w)
			if l.LbEndpoints[j].GetHealthStatus() == corev3.HealthStatus_HEALTHY {
				healthy += uint64(w)
			}
		}
		sums[i] = cmp.Or(healthy, all)
		byPrio[l.Priority] = append(byPrio[l.Priority], i)
	}
	for _, idx := range byPrio {
		ws := make([]uint64, len(idx))
		for k, i := range idx {
			ws[k] = sums[i]
		}
		for k, w := range scaleToFit(ws) {
			locs[idx[k]].LoadBalancingWeight = wrapperspb.UInt32(w)
		}
	}
}

// scaleToFit returns ws if their sum fits in a uint32, else ws scaled down
// in proportion so that it does, each at least 1.
func scaleToFit(ws []uint64) []uint32 {
	var total uint64
	for _, w := range ws {
		total += w
	}
	out := make([]uint32, len(ws))
	for i, w := range ws {
		if total > math.MaxUint32 {
			// Leave room for the rounding up of every weight to 1.
			w = max(1, w*(math.MaxUint32-uint64(len(ws)))/total)
		}
		out[i] = uint32(w)
	}
	return out
}
