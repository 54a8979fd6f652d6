package dnsapi

import (
	"context"
	"fmt"
	"net"
	"slices"
	"strings"
	"testing"
	"time"

	"github.com/beaconplane/beacon"
	"github.com/beaconplane/beacon/registry"
	"github.com/miekg/dns"
)

// fixture registers a small world: prod/api/web with two IPv4 instances,
// one IPv6 and one hostname instance, a draining one, and prod/api/grpc.
func fixture(t *testing.T) (*registry.StoreRegistry, *Server, string) {
	t.Helper()
	r := memRegistry(t)
	for _, in := range []beacon.Instance{
		{ID: "00000000000000a1", Endpoint: "web", Address: "10.0.0.1:8080", Metadata: map[string]string{"zone": "a", "weight": "50"}},
		{ID: "00000000000000a2", Endpoint: "web", Address: "10.0.0.2:8081", Metadata: map[string]string{"path": `c:\srv "x"`}},
		{ID: "00000000000000a3", Endpoint: "web", Address: "[2001:db8::3]:8082"},
		{ID: "00000000000000a4", Endpoint: "web", Address: "http://web-4.example.com:8083/"},
		{ID: "00000000000000a5", Endpoint: "web", Address: "10.0.0.5:8084", Status: beacon.StatusDraining},
		{ID: "00000000000000b1", Endpoint: "grpc", Address: "10.0.0.1:9090", Transport: "grpc"},
	} {
		in.Namespace, in.Component = "prod", "api"
		register(t, r, in)
	}
	s, addr := startDNS(t, r, Config{})
	waitView(t, s, "6 instances in the view", func() bool {
		v := s.view.Load()
		return v != nil && v.zone.instances == 5 // the draining one is left out
	})
	return r, s, addr
}

func TestDigNamingScheme(t *testing.T) {
	t.Parallel()
	_, _, addr := fixture(t)
	const ep = "web.api.prod.beacon."

	a := dig(t, addr, ep, "A")
	if a.status != "NOERROR" || !a.hasFlag("aa") || a.hasFlag("ra") {
		t.Fatalf("A %s: status %s flags %v, want NOERROR, aa, no ra\n%s", ep, a.status, a.flags, a.raw)
	}
	if got := sorted(a.rdata("A")); !slices.Equal(got, []string{"10.0.0.1", "10.0.0.2"}) {
		t.Errorf("A %s = %v, want the serving IPv4 instances (not the draining 10.0.0.5)", ep, got)
	}
	if ttl := strings.Fields(a.answer[0])[1]; ttl != "5" {
		t.Errorf("TTL %s, want the default 5", ttl)
	}
	if got := dig(t, addr, ep, "AAAA").rdata("AAAA"); !slices.Equal(got, []string{"2001:db8::3"}) {
		t.Errorf("AAAA %s = %v", ep, got)
	}
	wantSRV := []string{
		"10 10 8082 00000000000000a3.web.api.prod.beacon.",
		"10 10 8083 web-4.example.com.",
		"10 10 8081 00000000000000a2.web.api.prod.beacon.",
		"10 50 8080 00000000000000a1.web.api.prod.beacon.",
	}
	slices.Sort(wantSRV)
	for _, name := range []string{ep, "_web._tcp.api.prod.beacon.", "_web._udp.api.prod.beacon."} {
		if got := sorted(dig(t, addr, name, "SRV").rdata("SRV")); !slices.Equal(got, wantSRV) {
			t.Errorf("SRV %s =\n%v\nwant\n%v", name, got, wantSRV)
		}
	}
	// One instance: A, TXT metadata, SRV; a hostname address is a CNAME.
	id := "00000000000000a1." + ep
	if got := dig(t, addr, id, "A").rdata("A"); !slices.Equal(got, []string{"10.0.0.1"}) {
		t.Errorf("A %s = %v", id, got)
	}
	if got := dig(t, addr, id, "TXT").rdata("TXT"); !slices.Equal(got, []string{`"weight=50"`, `"zone=a"`}) {
		t.Errorf("TXT %s = %v", id, got)
	}
	if got := dig(t, addr, "00000000000000a2."+ep, "TXT").rdata("TXT"); !slices.Equal(got, []string{`"path=c:\\srv \"x\""`}) {
		t.Errorf("TXT with a backslash and quotes = %v", got)
	}
	if got := dig(t, addr, id, "SRV").rdata("SRV"); !slices.Equal(got, []string{"10 50 8080 " + id}) {
		t.Errorf("SRV %s = %v", id, got)
	}
	host := dig(t, addr, "00000000000000a4."+ep, "A")
	if got := host.rdata("CNAME"); !slices.Equal(got, []string{"web-4.example.com."}) || host.status != "NOERROR" {
		t.Errorf("A of a hostname instance: %s %v, want a CNAME to web-4.example.com.\n%s", host.status, got, host.raw)
	}
	// Every endpoint of the component.
	if got := sorted(dig(t, addr, "api.prod.beacon.", "A").rdata("A")); !slices.Equal(got, []string{"10.0.0.1", "10.0.0.2"}) {
		t.Errorf("A api.prod.beacon. = %v, want each address once", got)
	}
	if got := dig(t, addr, "api.prod.beacon.", "SRV").rdata("SRV"); len(got) != 5 {
		t.Errorf("SRV api.prod.beacon. = %v, want the 4 web and 1 grpc instances", got)
	}
	// Case does not matter; the question comes back as asked.
	mixed := dig(t, addr, "WeB.aPi.PROD.Beacon.", "A")
	if got := mixed.rdata("A"); len(got) != 2 {
		t.Errorf("mixed-case query: %v\n%s", got, mixed.raw)
	}
}

func TestDigNegativeAnswers(t *testing.T) {
	t.Parallel()
	_, _, addr := fixture(t)
	for _, tc := range []struct {
		name, qtype, status string
		soa                 bool
	}{
		{"nope.api.prod.beacon.", "A", "NXDOMAIN", true},
		{"00000000000000a5.web.api.prod.beacon.", "A", "NXDOMAIN", true}, // draining
		{"web.api.staging.beacon.", "SRV", "NXDOMAIN", true},
		{"web.api.prod.beacon.", "MX", "NOERROR", true},                    // NODATA
		{"web.api.prod.beacon.", "TYPE65280", "NOERROR", true},             // unknown type
		{"00000000000000a1.web.api.prod.beacon.", "AAAA", "NOERROR", true}, // NODATA
		{"prod.beacon.", "A", "NOERROR", true},                             // empty non-terminal
		{"_tcp.api.prod.beacon.", "SRV", "NOERROR", true},
		{"beacon.", "A", "NOERROR", true},
		{"example.com.", "A", "REFUSED", false},
		{"beacon.example.com.", "A", "REFUSED", false},
		{"xbeacon.", "A", "REFUSED", false},
		{".", "NS", "REFUSED", false},
	} {
		res := dig(t, addr, tc.name, tc.qtype)
		if res.status != tc.status {
			t.Errorf("%s %s: %s, want %s\n%s", tc.name, tc.qtype, res.status, tc.status, res.raw)
			continue
		}
		if tc.status == "NOERROR" && len(res.answer) != 0 {
			t.Errorf("%s %s: answer %v, want none (NODATA)", tc.name, tc.qtype, res.answer)
		}
		hasSOA := len(res.authority) == 1 && strings.Contains(res.authority[0], " SOA beacon. hostmaster.beacon. ")
		if hasSOA != tc.soa {
			t.Errorf("%s %s: authority %v, want SOA: %v", tc.name, tc.qtype, res.authority, tc.soa)
		}
		if tc.status == "REFUSED" && res.hasFlag("aa") {
			t.Errorf("%s: REFUSED answer claims authority", tc.name)
		}
	}
	if got := dig(t, addr, "beacon.", "SOA").rdata("SOA"); len(got) != 1 {
		t.Errorf("SOA at the apex: %v", got)
	}
	if got := dig(t, addr, "beacon.", "NS"); got.status != "NOERROR" || len(got.rdata("NS")) != 1 || got.rdata("NS")[0] != "beacon." {
		t.Errorf("NS at the apex: %s %v, want the SOA's primary name, beacon.", got.status, got.answer)
	}
	if got := dig(t, addr, "web.api.prod.beacon.", "NS"); got.status != "NOERROR" || len(got.answer) != 0 {
		t.Errorf("NS below the apex: %s %v, want NODATA (no delegation)", got.status, got.answer)
	}
	if got := dig(t, addr, "web.api.prod.beacon.", "ANY"); got.status != "NOERROR" || len(got.rdata("HINFO")) != 1 {
		t.Errorf("ANY: %s %v, want one RFC 8482 HINFO", got.status, got.answer)
	}
	if got := dig(t, addr, "web.api.prod.beacon.", "AXFR"); len(got.answer) != 0 {
		// dig prints "Transfer failed." for a refused AXFR.
		t.Errorf("AXFR answered: %v", got.answer)
	}
}

// A large answer is truncated over UDP (TC set) and complete over TCP; the
// client's EDNS0 buffer size is honored.
func TestDigTruncation(t *testing.T) {
	t.Parallel()
	r := memRegistry(t)
	const n = 120
	for i := range n {
		register(t, r, beacon.Instance{Namespace: "prod", Component: "big", Endpoint: "web",
			Address: fmt.Sprintf("10.1.%d.%d:80", i/200, i%200+1)})
	}
	s, addr := startDNS(t, r, Config{})
	waitView(t, s, "all instances", func() bool { v := s.view.Load(); return v != nil && v.zone.instances == n })

	udp := dig(t, addr, "+noedns", "+ignore", "web.big.prod.beacon.", "A")
	if !udp.hasFlag("tc") || len(udp.answer) >= n {
		t.Errorf("UDP without EDNS: flags %v, %d answers; want tc and fewer than %d", udp.flags, len(udp.answer), n)
	}
	// The server's bound (1232) wins over the client's 4096: more fits
	// than in 512 bytes, still not all.
	edns := query(t, addr, "udp", "web.big.prod.beacon.", dns.TypeA, 4096)
	if !edns.Truncated || wireLen(t, edns) > DefaultUDPSize || len(edns.Answer) <= len(udp.answer) {
		t.Errorf("EDNS 4096 over UDP: truncated=%v, %d bytes, %d answers (%d without EDNS); want TC, at most %d bytes, more answers",
			edns.Truncated, wireLen(t, edns), len(edns.Answer), len(udp.answer), DefaultUDPSize)
	}
	if opt := edns.IsEdns0(); opt == nil || int(opt.UDPSize()) != DefaultUDPSize {
		t.Errorf("reply OPT %v, want our size %d", opt, DefaultUDPSize)
	}
	small := query(t, addr, "udp", "web.big.prod.beacon.", dns.TypeA, 700)
	if !small.Truncated || wireLen(t, small) > 700 {
		t.Errorf("EDNS 700: truncated=%v, %d bytes", small.Truncated, wireLen(t, small))
	}
	srvUDP := query(t, addr, "udp", "web.big.prod.beacon.", dns.TypeSRV, 1232)
	if !srvUDP.Truncated || wireLen(t, srvUDP) > 1232 {
		t.Errorf("SRV of %d instances in 1232 bytes: truncated=%v, %d bytes", n, srvUDP.Truncated, wireLen(t, srvUDP))
	}
	tcp := dig(t, addr, "+tcp", "web.big.prod.beacon.", "SRV")
	if tcp.hasFlag("tc") || len(tcp.rdata("SRV")) != n {
		t.Errorf("TCP: flags %v, %d SRV records, want all %d", tcp.flags, len(tcp.rdata("SRV")), n)
	}
	// dig retries a truncated UDP answer over TCP by itself.
	if got := dig(t, addr, "web.big.prod.beacon.", "SRV"); len(got.rdata("SRV")) != n {
		t.Errorf("dig's TCP retry: %d SRV records, want %d", len(got.rdata("SRV")), n)
	}
	// The order varies (shuffled per query).
	first := map[string]bool{}
	for range 20 {
		first[query(t, addr, "tcp", "web.big.prod.beacon.", dns.TypeA, 0).Answer[0].String()] = true
	}
	if len(first) < 2 {
		t.Errorf("20 queries all gave the same first record: not shuffled")
	}
}

// Go's own resolver, pointed at Beacon, finds hosts, SRV records (the RFC
// 2782 name) and TXT metadata.
func TestGoResolver(t *testing.T) {
	t.Parallel()
	_, _, addr := fixture(t)
	res := &net.Resolver{PreferGo: true, Dial: func(ctx context.Context, network, _ string) (net.Conn, error) {
		var d net.Dialer
		return d.DialContext(ctx, network, addr)
	}}
	ctx, cancel := context.WithTimeout(context.Background(), testDeadline)
	defer cancel()
	hosts, err := res.LookupHost(ctx, "web.api.prod.beacon")
	if err != nil {
		t.Fatal(err)
	}
	if got := sorted(hosts); !slices.Equal(got, []string{"10.0.0.1", "10.0.0.2", "2001:db8::3"}) {
		t.Errorf("LookupHost = %v", got)
	}
	cname, srvs, err := res.LookupSRV(ctx, "web", "tcp", "api.prod.beacon")
	if err != nil {
		t.Fatal(err)
	}
	if cname != "_web._tcp.api.prod.beacon." || len(srvs) != 4 {
		t.Errorf("LookupSRV = %q, %d records", cname, len(srvs))
	}
	txt, err := res.LookupTXT(ctx, "00000000000000a1.web.api.prod.beacon")
	if err != nil {
		t.Fatal(err)
	}
	if !slices.Equal(txt, []string{"weight=50", "zone=a"}) {
		t.Errorf("LookupTXT = %v", txt)
	}
	target, err := res.LookupCNAME(ctx, "00000000000000a4.web.api.prod.beacon")
	if err == nil && target != "web-4.example.com." {
		t.Errorf("LookupCNAME = %q", target)
	}
	if _, err := res.LookupHost(ctx, "nope.api.prod.beacon"); !isNotFound(err) {
		t.Errorf("LookupHost of an absent name: %v, want not found", err)
	}
}

func isNotFound(err error) bool {
	var de *net.DNSError
	return err != nil && errorsAs(err, &de) && de.IsNotFound
}

// wireLen is the size of m on the wire, compressed as the server sends it.
func wireLen(t testing.TB, m *dns.Msg) int {
	t.Helper()
	m = m.Copy()
	m.Compress = true
	b, err := m.Pack()
	if err != nil {
		t.Fatal(err)
	}
	return len(b)
}

func sorted(s []string) []string { s = slices.Clone(s); slices.Sort(s); return s }

var _ = time.Second
