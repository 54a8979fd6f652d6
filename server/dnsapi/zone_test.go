package dnsapi

import (
	"fmt"
	"maps"
	"slices"
	"testing"

	"github.com/beaconplane/beacon"
	"github.com/miekg/dns"
)

// dumpZone renders every answer of every name of z, sorted, to compare
// views.
func dumpZone(z *zone) []string {
	a := &answerer{domain: z.domain, ttl: z.ttl, udpSize: dns.MaxMsgSize}
	var out []string
	for _, ck := range slices.Sorted(maps.Keys(z.comps)) {
		for _, prefix := range slices.Sorted(maps.Keys(z.comps[ck].names)) {
			name := ck + "." + z.domain
			if prefix != "" {
				name = prefix + "." + name
			}
			for _, qt := range []uint16{dns.TypeA, dns.TypeAAAA, dns.TypeSRV, dns.TypeTXT, dns.TypeCNAME} {
				req := new(dns.Msg)
				req.SetQuestion(name, qt)
				m := a.answer(z, req, false)
				var rrs []string
				for _, rr := range slices.Concat(m.Answer, m.Extra) {
					rrs = append(rrs, rr.String())
				}
				slices.Sort(rrs)
				out = append(out, fmt.Sprint(name, " ", dns.TypeToString[qt], " ", dns.RcodeToString[m.Rcode], " ", rrs))
			}
		}
	}
	return out
}

// A view rebuilt from the previous one (reusing unchanged instances'
// records) answers exactly like one built from scratch.
func TestIncrementalRebuild(t *testing.T) {
	id := compID{"prod", "api"}
	ins := []beacon.Instance{
		{Namespace: "prod", Component: "api", Endpoint: "web", ID: "00000000000000a1", Address: "10.0.0.1:80", Metadata: map[string]string{"k": "1"}},
		{Namespace: "prod", Component: "api", Endpoint: "web", ID: "00000000000000a2", Address: "10.0.0.2:80"},
		{Namespace: "prod", Component: "api", Endpoint: "grpc", ID: "00000000000000a3", Address: "h.example:90"},
		{Namespace: "prod", Component: "api", Endpoint: "grpc", ID: "00000000000000a4", Address: "10.0.0.1:91"},
	}
	z0, _ := newZone(DefaultDomain, 5).with(1, map[compID][]beacon.Instance{id: ins})

	changed := slices.Clone(ins)
	changed[0].Address = "10.0.0.9:80"                // moved
	changed[1].Metadata = map[string]string{"k": "2"} // new metadata
	changed[2].Status = beacon.StatusDraining         // leaves
	changed = append(changed[:3], beacon.Instance{Namespace: "prod", Component: "api", Endpoint: "web", ID: "00000000000000a5", Address: "[::1]:80"})

	incremental, _ := z0.with(2, map[compID][]beacon.Instance{id: changed})
	fresh, _ := newZone(DefaultDomain, 5).with(2, map[compID][]beacon.Instance{id: changed})
	got, want := dumpZone(incremental), dumpZone(fresh)
	if !slices.Equal(got, want) {
		t.Errorf("incremental view differs from a fresh one:\n%v\nwant\n%v", got, want)
	}
	if slices.Equal(dumpZone(z0), want) {
		t.Error("the change did not change the view")
	}
	if incremental.instances != 3 || fresh.names != incremental.names {
		t.Errorf("instances %d names %d/%d", incremental.instances, incremental.names, fresh.names)
	}
	// Removing everything removes the component and its namespace.
	empty, _ := incremental.with(3, map[compID][]beacon.Instance{id: nil})
	if len(empty.comps) != 0 || len(empty.namespaces) != 0 || empty.instances != 0 || empty.lookup("prod") != nil {
		t.Errorf("after removing every instance: %+v", empty)
	}
}

// An address that names no host to connect to — unspecified, broadcast,
// multicast, which older writers could store — is left out of DNS, as
// beacon.IPProblem refuses it to writers now; a host's own stays.
func TestAddressTargetLeavesOutNoHost(t *testing.T) {
	for addr, want := range map[string]bool{
		"0.0.0.0:80": false, "[::]:80": false, "255.255.255.255:80": false, "224.0.0.1:80": false,
		"[::ffff:0.0.0.0]:80": false, "http://0.0.0.0:80/": false,
		"[fe80::1%eth0]:80": false, "http://[fe80::1%25eth0]:80/": false,
		"127.0.0.1:80": true, "10.0.0.1:80": true, "[2001:db8::1]:80": true, "web.example:80": true,
	} {
		if _, why := addressTarget(addr); (why == "") != want {
			t.Errorf("addressTarget(%q) = %q, want it served: %v", addr, why, want)
		}
	}
}

// The SOA serial is the revision's low 32 bits (docs/dns.md): a memory
// store's revisions start at the wall-clock time in microseconds.
func TestSOASerialIsRevisionModulo32Bits(t *testing.T) {
	const rev = int64(1_764_000_000_000_000) // 2025-11-24 in microseconds
	z, _ := newZone(DefaultDomain, 5).with(rev, nil)
	if z.soa.Serial != uint32(rev%(1<<32)) {
		t.Errorf("serial %d for revision %d, want %d", z.soa.Serial, rev, rev%(1<<32))
	}
	next, _ := z.with(rev+1, nil)
	if next.soa.Serial-z.soa.Serial != 1 {
		t.Errorf("serial %d after %d: the next revision does not increase it by one", next.soa.Serial, z.soa.Serial)
	}
}
