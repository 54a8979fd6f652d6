package xdsapi

import (
	"fmt"
	"math"
	"slices"
	"strings"
	"testing"
	"time"

	"github.com/beaconplane/beacon"
	"github.com/beaconplane/beacon/internal/testkit/healthtest"
	clusterv3 "github.com/envoyproxy/go-control-plane/envoy/config/cluster/v3"
	endpointv3 "github.com/envoyproxy/go-control-plane/envoy/config/endpoint/v3"
)

// inst is an instance of demo/greeter/grpc for table tests.
func inst(id, addr string, meta ...string) beacon.Instance {
	m := map[string]string{}
	for i := 0; i+1 < len(meta); i += 2 {
		m[meta[i]] = meta[i+1]
	}
	return beacon.Instance{Namespace: "demo", Component: "greeter", Endpoint: "grpc", ID: id, Address: addr, Metadata: m,
		Status: beacon.StatusServing, RegisteredAt: time.Unix(1_700_000_000, 0)}
}

func draining(in beacon.Instance) beacon.Instance { in.Status = beacon.StatusDraining; return in }

func failing(in beacon.Instance) beacon.Instance { return healthtest.Failing(in, "connection refused") }

func panicking(in beacon.Instance) beacon.Instance { return healthtest.Panic(in, "connection refused") }

func registeredAt(in beacon.Instance, sec int64) beacon.Instance {
	in.RegisteredAt = time.Unix(sec, 0)
	return in
}

// decodeAssignment builds an assignment from instances and decodes it.
func decodeAssignment(t *testing.T, ins ...beacon.Instance) (*endpointv3.ClusterLoadAssignment, []omission) {
	t.Helper()
	eps, om := endpoints(ins)
	any := buildAssignment("grpc.greeter.demo", eps)
	if err := validate(any); err != nil {
		t.Fatalf("the assignment breaks Envoy's rules: %v", err)
	}
	cla := &endpointv3.ClusterLoadAssignment{}
	if err := any.UnmarshalTo(cla); err != nil {
		t.Fatal(err)
	}
	return cla, om
}

// describe renders an assignment as "prio/zone/weight: addr/health/weight ..."
// per locality, in order.
func describe(cla *endpointv3.ClusterLoadAssignment) []string {
	var out []string
	for _, l := range cla.GetEndpoints() {
		s := fmt.Sprintf("p%d/%s/%s/%s w%d:", l.GetPriority(), l.GetLocality().GetRegion(), l.GetLocality().GetZone(),
			l.GetLocality().GetSubZone(), l.GetLoadBalancingWeight().GetValue())
		for _, e := range l.GetLbEndpoints() {
			sa := e.GetEndpoint().GetAddress().GetSocketAddress()
			s += fmt.Sprintf(" %s:%d/%s/%d", sa.GetAddress(), sa.GetPortValue(), e.GetHealthStatus(), e.GetLoadBalancingWeight().GetValue())
		}
		out = append(out, s)
	}
	return out
}

func reasons(om []omission) []string {
	var out []string
	for _, o := range om {
		out = append(out, o.ref.ID+":"+o.reason)
	}
	slices.Sort(out)
	return out
}

func TestAssignment(t *testing.T) {
	const a, b, c, d = "000000000000000a", "000000000000000b", "000000000000000c", "000000000000000d"
	const e, f = "000000000000000e", "000000000000000f"
	for _, tc := range []struct {
		name    string
		ins     []beacon.Instance
		want    []string
		omitted []string
	}{
		{name: "empty", ins: nil, want: nil},
		{
			// gRPC splits calls between localities by their weights
			// alone: zone a counting its failing and draining instances
			// sent 3/4 of the calls to its one healthy instance.
			name: "a locality weighs its HEALTHY endpoints only; one with none, all of them",
			ins: []beacon.Instance{failing(inst(a, "10.0.0.1:80", "zone", "a")), draining(inst(b, "10.0.0.2:80", "zone", "a")),
				inst(c, "10.0.0.3:80", "zone", "a"), inst(d, "10.0.0.4:80", "zone", "b"),
				failing(inst(e, "10.0.0.5:80", "zone", "c")), draining(inst(f, "10.0.0.6:80", "zone", "c"))},
			want: []string{"p0//a/ w10: 10.0.0.1:80/UNHEALTHY/10 10.0.0.2:80/DRAINING/10 10.0.0.3:80/HEALTHY/10",
				"p0//b/ w10: 10.0.0.4:80/HEALTHY/10", "p0//c/ w20: 10.0.0.5:80/UNHEALTHY/10 10.0.0.6:80/DRAINING/10"},
		},
		{
			name: "serving and draining, default weight",
			ins:  []beacon.Instance{inst(a, "10.0.0.1:80"), draining(inst(b, "10.0.0.2:80"))},
			want: []string{"p0/// w10: 10.0.0.1:80/HEALTHY/10 10.0.0.2:80/DRAINING/10"},
		},
		{
			name: "failing UNHEALTHY, kept; passing, unknown and panic HEALTHY; draining wins over failing",
			ins: []beacon.Instance{failing(inst(a, "10.0.0.1:80")), healthtest.Passing(inst(b, "10.0.0.2:80")),
				healthtest.Unknown(inst(c, "10.0.0.3:80")), panicking(inst(d, "10.0.0.4:80")), draining(failing(inst(e, "10.0.0.5:80")))},
			want: []string{"p0/// w30: 10.0.0.1:80/UNHEALTHY/10 10.0.0.2:80/HEALTHY/10 10.0.0.3:80/HEALTHY/10 10.0.0.4:80/HEALTHY/10 10.0.0.5:80/DRAINING/10"},
		},
		{
			name: "zones are localities weighted by the sum of their endpoints",
			ins: []beacon.Instance{inst(a, "10.0.0.1:80", "zone", "b", "weight", "3"), inst(b, "10.0.0.2:80", "zone", "a", "weight", "1"),
				inst(c, "10.0.0.3:80", "zone", "b", "weight", "2"), inst(d, "10.0.0.4:80", "region", "eu", "zone", "a", "sub_zone", "r1")},
			want: []string{"p0//a/ w1: 10.0.0.2:80/HEALTHY/1", "p0//b/ w5: 10.0.0.1:80/HEALTHY/3 10.0.0.3:80/HEALTHY/2", "p0/eu/a/r1 w10: 10.0.0.4:80/HEALTHY/10"},
		},
		{
			name: "weight 0 is the smallest share, never 0",
			ins:  []beacon.Instance{inst(a, "10.0.0.1:80", "weight", "0", "zone", "z")},
			want: []string{"p0//z/ w1: 10.0.0.1:80/HEALTHY/1"},
		},
		{
			name:    "bad weights and priorities take the defaults",
			ins:     []beacon.Instance{inst(a, "10.0.0.1:80", "weight", "-1"), inst(b, "10.0.0.2:80", "weight", "65536", "priority", "x")},
			want:    []string{"p0/// w20: 10.0.0.1:80/HEALTHY/10 10.0.0.2:80/HEALTHY/10"},
			omitted: []string{a + ":invalid_weight", b + ":invalid_priority", b + ":invalid_weight"},
		},
		{
			name: "priorities become contiguous from 0, lower first",
			ins:  []beacon.Instance{inst(a, "10.0.0.1:80", "priority", "50"), inst(b, "10.0.0.2:80", "priority", "7"), inst(c, "10.0.0.3:80")},
			want: []string{"p0/// w10: 10.0.0.2:80/HEALTHY/10", "p1/// w10: 10.0.0.3:80/HEALTHY/10", "p2/// w10: 10.0.0.1:80/HEALTHY/10"},
		},
		{
			name: "IPv6 and IPv4-mapped addresses",
			ins:  []beacon.Instance{inst(a, "[2001:db8::1]:443"), inst(b, "[::ffff:10.0.0.9]:80")},
			want: []string{"p0/// w20: 10.0.0.9:80/HEALTHY/10 2001:db8::1:443/HEALTHY/10"},
		},
		{
			name: "addresses a client would refuse are left out",
			ins: []beacon.Instance{inst(a, "localhost:80"), inst(b, "http://10.0.0.1:80"), inst(c, "[fe80::1%eth0]:80"), inst(d, "10.0.0.4:80"),
				inst(e, "0.0.0.0:80"), inst(f, "[ff02::1]:80")},
			want:    []string{"p0/// w10: 10.0.0.4:80/HEALTHY/10"},
			omitted: []string{a + ":hostname", b + ":url", c + ":ipv6_zone", e + ":not_one_host", f + ":not_one_host"},
		},
		{
			name: "one address once: healthy wins over failing, failing over draining",
			ins: []beacon.Instance{registeredAt(draining(inst(a, "10.0.0.1:80")), 1), registeredAt(failing(inst(b, "10.0.0.1:80")), 2),
				registeredAt(failing(inst(c, "10.0.0.2:80")), 1), registeredAt(panicking(inst(d, "10.0.0.2:80")), 2),
				registeredAt(healthtest.Passing(inst(e, "10.0.0.3:80")), 2), registeredAt(failing(inst(f, "10.0.0.3:80")), 1)},
			want:    []string{"p0/// w20: 10.0.0.1:80/UNHEALTHY/10 10.0.0.2:80/HEALTHY/10 10.0.0.3:80/HEALTHY/10"},
			omitted: []string{a + ":duplicate_address", c + ":duplicate_address", f + ":duplicate_address"},
		},
		{
			name: "one address once: serving wins over draining, then the older registration",
			ins: []beacon.Instance{draining(inst(a, "10.0.0.1:80")), inst(b, "10.0.0.1:80"), registeredAt(inst(c, "10.0.0.2:80"), 2),
				registeredAt(inst(d, "[::ffff:10.0.0.2]:80"), 1)},
			want:    []string{"p0/// w20: 10.0.0.1:80/HEALTHY/10 10.0.0.2:80/HEALTHY/10"},
			omitted: []string{a + ":duplicate_address", c + ":duplicate_address"},
		},
	} {
		t.Run(tc.name, func(t *testing.T) {
			cla, om := decodeAssignment(t, tc.ins...)
			if got := describe(cla); !slices.Equal(got, tc.want) {
				t.Errorf("assignment:\n got %q\nwant %q", got, tc.want)
			}
			if got := reasons(om); !slices.Equal(got, tc.omitted) {
				t.Errorf("omitted %q, want %q", got, tc.omitted)
			}
		})
	}
}

// Weights that would add up past 2^32-1 (endpoints in a locality, or
// localities in a priority: clients refuse either) are scaled down to fit,
// each at least 1.
func TestLocalityWeightsFitUint32(t *testing.T) {
	var ins []beacon.Instance
	for i := range 70_000 {
		zone := "big"
		if i == 0 {
			zone = "small"
		}
		ins = append(ins, inst(fmt.Sprintf("%016x", i+1), fmt.Sprintf("10.%d.%d.%d:80", i>>16, (i>>8)&255, i&255), "zone", zone, "weight", "65535"))
	}
	cla, _ := decodeAssignment(t, ins...)
	var total uint64
	for _, l := range cla.GetEndpoints() {
		w := l.GetLoadBalancingWeight().GetValue()
		if w == 0 {
			t.Fatalf("locality %s has weight 0", l.GetLocality().GetZone())
		}
		total += uint64(w)
		var sum uint64
		for _, e := range l.GetLbEndpoints() {
			if e.GetLoadBalancingWeight().GetValue() == 0 {
				t.Fatal("an endpoint has weight 0")
			}
			sum += uint64(e.GetLoadBalancingWeight().GetValue())
		}
		if sum > math.MaxUint32 {
			t.Fatalf("locality %s: endpoint weights add up to %d, past 2^32-1", l.GetLocality().GetZone(), sum)
		}
	}
	if total > math.MaxUint32 {
		t.Fatalf("locality weights add up to %d, past 2^32-1", total)
	}
}

func TestPolicyMajority(t *testing.T) {
	const a, b, c = "000000000000000a", "000000000000000b", "000000000000000c"
	for _, tc := range []struct {
		ins  []beacon.Instance
		want clusterv3.Cluster_LbPolicy
		bad  []string
	}{
		{ins: []beacon.Instance{inst(a, "10.0.0.1:80")}, want: clusterv3.Cluster_ROUND_ROBIN},
		{ins: []beacon.Instance{inst(a, "10.0.0.1:80", "lb_policy", "ring_hash")}, want: clusterv3.Cluster_RING_HASH},
		{ins: []beacon.Instance{inst(a, "x:1", "lb_policy", "ring_hash"), inst(b, "x:1", "lb_policy", "least_request"), inst(c, "x:1", "lb_policy", "least_request")}, want: clusterv3.Cluster_LEAST_REQUEST},
		{ins: []beacon.Instance{inst(a, "x:1", "lb_policy", "ring_hash"), inst(b, "x:1", "lb_policy", "least_request")}, want: clusterv3.Cluster_RING_HASH},
		{ins: []beacon.Instance{inst(a, "x:1", "lb_policy", "maglev")}, want: clusterv3.Cluster_ROUND_ROBIN, bad: []string{a + ":invalid_lb_policy"}},
	} {
		got, bad := choosePolicy(tc.ins)
		if got != tc.want || !slices.Equal(reasons(bad), tc.bad) {
			t.Errorf("%v: policy %v (ignored %v), want %v (ignored %v)", tc.ins, got, reasons(bad), tc.want, tc.bad)
		}
	}
}

func TestParseName(t *testing.T) {
	for name, want := range map[string]string{
		"grpc.greeter.demo": "demo/greeter/grpc",
		"demo/greeter/grpc": "demo/greeter/grpc",
		"a-1.b.c":           "c/b/a-1",
	} {
		svc, _, ok := parseName(name, false)
		if !ok || svc.String() != want {
			t.Errorf("parseName(%q) = %v, %v; want %s", name, svc, ok, want)
		}
	}
	for _, name := range []string{"", ".", "a.b", "a.b.c.d", "A.b.c", "a/b", "/a/b", "a/b/", "a//b", "a_b.c.d", "é.b.c", strings.Repeat("a", 64) + ".b.c"} {
		if svc, _, ok := parseName(name, false); ok {
			t.Errorf("parseName(%q) = %v, want no service", name, svc)
		}
	}
}

// With a registry of the dynamo layout, names hold the NVIDIA Dynamo
// runtime's: the DNS-like form is read from the left, the namespace being
// what follows the component, dots and all.
func TestParseReadName(t *testing.T) {
	for name, want := range map[string]string{
		"grpc.greeter.demo":                  "demo/greeter/grpc",
		"a.b.c.d":                            "c.d/b/a",
		"a_b.c.d":                            "d/c/a_b",
		"-a.b.c":                             "c/b/-a",
		"clear_kv_blocks.backend.dynamo.t_1": "dynamo.t_1/backend/clear_kv_blocks",
		"dynamo.t_1/backend/clear_kv_blocks": "dynamo.t_1/backend/clear_kv_blocks",
	} {
		if svc, _, ok := parseName(name, true); !ok || svc.String() != want {
			t.Errorf("parseName(%q, read) = %v, %v; want %s", name, svc, ok, want)
		}
		if svc, _, ok := parseName(name, false); ok != (name == "grpc.greeter.demo") {
			t.Errorf("parseName(%q) = %v, %v: Beacon's own layout takes labels only", name, svc, ok)
		}
	}
	for _, name := range []string{"", ".", "a.b", "a.b.c..d", "a.b.c.", "A.b.c", "a/b", "a/b/", "a/b.c/d", "a//b", strings.Repeat("a", 64) + ".b.c"} {
		if svc, _, ok := parseName(name, true); ok {
			t.Errorf("parseName(%q, read) = %v, want no service", name, svc)
		}
	}
}

// Every name either is no service or round-trips through one of the two
// forms of the service it names.
func FuzzParseName(f *testing.F) {
	for _, s := range []string{"grpc.greeter.demo", "demo/greeter/grpc", "a.b", "a/b/c/d", "A.b.c", ""} {
		f.Add(s)
	}
	f.Fuzz(func(t *testing.T, name string) {
		for _, read := range []bool{false, true} {
			checkParsedName(t, name, read)
		}
	})
}

// checkParsedName fails unless name is no service or round-trips through
// one of the two forms of the service parseName(name, read) finds; one
// found without read is a service of Beacon's labels.
func checkParsedName(t *testing.T, name string, read bool) {
	svc, slash, ok := parseName(name, read)
	if !ok {
		return
	}
	back := svc.dnsName()
	if slash {
		back = svc.slashName()
	}
	if back != name {
		t.Fatalf("parseName(%q, %v) = %v, which names it %q", name, read, svc, back)
	}
	ref := beacon.Ref{Namespace: svc.ns, Component: svc.comp, Endpoint: svc.ep, ID: "0000000000000001"}
	if err := ref.Validate(); err != nil {
		t.Fatalf("parseName(%q, %v) accepted an invalid service: %v", name, read, err)
	}
	if !read && (beacon.Instance{Namespace: svc.ns, Component: svc.comp, Endpoint: svc.ep, ID: ref.ID, Address: "10.0.0.1:1"}).Validate() != nil {
		t.Fatalf("parseName(%q) accepted a service Beacon's writers cannot register", name)
	}
}

// TestPoliciesAreTheRegistrys: the policies xDS serves are those
// beacon.LBPolicies names (what a registration is warned against), in
// its order (the default first).
func TestPoliciesAreTheRegistrys(t *testing.T) {
	var names []string
	for _, p := range lbPolicies {
		names = append(names, p.name)
	}
	if !slices.Equal(names, beacon.LBPolicies) {
		t.Fatalf("xDS serves %v; beacon.LBPolicies is %v", names, beacon.LBPolicies)
	}
}
