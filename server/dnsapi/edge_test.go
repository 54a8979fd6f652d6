package dnsapi

import (
	"slices"
	"strings"
	"testing"

	"github.com/beaconplane/beacon"
	"github.com/miekg/dns"
	"github.com/prometheus/client_golang/prometheus"
)

// A long zone leaves room for fewer name bytes: an instance whose <id> name
// would be longer than 255 bytes is left out (logged, counted), and the
// names it shares with others — the component's SRV, with its targets —
// still answer with well-formed packets. dig rejects a packet holding a
// longer name ("Got bad packet: name too long"): the SRV of the whole
// component did, for every instance in it, before such instances were left
// out.
func TestNamesLongerThanDNSAllows(t *testing.T) {
	t.Parallel()
	domain := strings.Repeat("abcdefghi.", 14) + "z." // 142 bytes, valid
	long := strings.Repeat("a", beacon.MaxLabelLength)
	r := memRegistry(t)
	metrics := prometheus.NewRegistry()
	s, addr := startDNS(t, r, Config{Domain: domain, Metrics: metrics})
	fits := beacon.Instance{Namespace: "prod", Component: long, Endpoint: "web", ID: "00000000000000a1", Address: "10.0.0.1:80"}
	tooLong := beacon.Instance{Namespace: "prod", Component: long, Endpoint: long, ID: "00000000000000a2", Address: "10.0.0.2:80"}
	register(t, r, fits)
	register(t, r, tooLong)
	waitView(t, s, "both instances applied", func() bool {
		v := s.view.Load()
		return v != nil && v.zone.instances+v.zone.unanswerable == 2
	})
	if v := s.view.Load(); v.zone.instances != 1 || v.zone.unanswerable != 1 {
		t.Fatalf("view: %d instances, %d left out; want 1 and 1", v.zone.instances, v.zone.unanswerable)
	}
	if got := metricValue(t, metrics, "beacon_dns_unanswerable_instances"); got != 1 {
		t.Errorf("beacon_dns_unanswerable_instances = %v, want 1", got)
	}
	comp := long + ".prod." + domain
	srv := dig(t, addr, "+tcp", comp, "SRV")
	if srv.status != "NOERROR" || !slices.Equal(srv.rdata("SRV"), []string{"10 10 80 00000000000000a1.web." + comp}) {
		t.Errorf("SRV %s: %s %v, want the instance that fits\n%s", comp, srv.status, srv.rdata("SRV"), srv.raw)
	}
	if got := sorted(dig(t, addr, comp, "A").rdata("A")); !slices.Equal(got, []string{"10.0.0.1"}) {
		t.Errorf("A %s = %v, want 10.0.0.1 only", comp, got)
	}
}

// beacon_dns_unanswerable_instances counts the serving instances left out
// now: other registrations in the same component do not count them again,
// and it goes back to zero when they leave.
func TestUnanswerableInstancesGauge(t *testing.T) {
	t.Parallel()
	r := memRegistry(t)
	metrics := prometheus.NewRegistry()
	s, _ := startDNS(t, r, Config{Metrics: metrics})
	unix := register(t, r, beacon.Instance{Namespace: "prod", Component: "api", Endpoint: "sock", Address: "unix:///run/api.sock"})
	for _, a := range []string{"10.0.0.1:80", "10.0.0.2:80", "10.0.0.3:80"} {
		register(t, r, testInstance("web", a))
	}
	waitView(t, s, "4 instances applied", func() bool {
		v := s.view.Load()
		return v != nil && v.zone.instances == 3 && v.zone.unanswerable == 1
	})
	if got := metricValue(t, metrics, "beacon_dns_unanswerable_instances"); got != 1 {
		t.Errorf("after three more registrations in its component: beacon_dns_unanswerable_instances = %v, want 1", got)
	}
	// A component with nothing answerable has no names, not even its
	// namespace, but its instance is counted.
	other := register(t, r, beacon.Instance{Namespace: "dev", Component: "db", Endpoint: "sock", Address: "unix:///run/db.sock"})
	waitView(t, s, "the second unix instance", func() bool { return s.view.Load().zone.unanswerable == 2 })
	if n := s.view.Load().zone.lookup("dev"); n != nil {
		t.Errorf("namespace with only unanswerable instances exists: %+v", n)
	}
	if err := unix.Close(); err != nil {
		t.Fatal(err)
	}
	if err := other.Close(); err != nil {
		t.Fatal(err)
	}
	waitView(t, s, "the unix instances gone", func() bool { return s.view.Load().zone.unanswerable == 0 })
	if got := metricValue(t, metrics, "beacon_dns_unanswerable_instances"); got != 0 {
		t.Errorf("after they left: beacon_dns_unanswerable_instances = %v, want 0", got)
	}
}

// TXT follows RFC 1464: a '=' or '`' in a metadata key is quoted with '`',
// so that readers split key and value where the writer meant.
func TestTXTQuotesKeys(t *testing.T) {
	t.Parallel()
	r := memRegistry(t)
	s, addr := startDNS(t, r, Config{})
	in := testInstance("web", "10.0.0.1:80")
	in.ID = "00000000000000a1"
	in.Metadata = map[string]string{"a=b": "c=d", "x`y": "`", "plain": "v"}
	register(t, r, in)
	waitView(t, s, "the instance", func() bool { v := s.view.Load(); return v != nil && v.zone.instances == 1 })
	got := dig(t, addr, "00000000000000a1.web.api.prod.beacon.", "TXT").rdata("TXT")
	want := []string{`"a` + "`" + `=b=c=d"`, `"plain=v"`, `"x` + "``" + `y=` + "`" + `"`}
	if !slices.Equal(got, want) {
		t.Errorf("TXT = %v, want %v", got, want)
	}
}

// BADVERS is counted as BADVERS (miekg/dns names rcode 16 BADSIG).
func TestBadVersCounted(t *testing.T) {
	t.Parallel()
	r := memRegistry(t)
	metrics := prometheus.NewRegistry()
	s, addr := startDNS(t, r, Config{Metrics: metrics})
	waitView(t, s, "the first snapshot", s.Ready)
	m := new(dns.Msg)
	m.SetQuestion("web.api.prod.beacon.", dns.TypeA)
	m.SetEdns0(1232, false)
	m.IsEdns0().SetVersion(1)
	rep := raw(t, addr, packed(t, m), testDeadline)
	if rep == nil || rep.Rcode != dns.RcodeBadVers {
		t.Fatalf("EDNS version 1: %v, want BADVERS", rep)
	}
	mfs, err := metrics.Gather()
	if err != nil {
		t.Fatal(err)
	}
	var labels []string
	for _, mf := range mfs {
		if mf.GetName() != "beacon_dns_queries_total" {
			continue
		}
		for _, c := range mf.GetMetric() {
			for _, l := range c.GetLabel() {
				if l.GetName() == "rcode" {
					labels = append(labels, l.GetValue())
				}
			}
		}
	}
	if !slices.Equal(labels, []string{"BADVERS"}) {
		t.Errorf("rcode labels %v, want [BADVERS]", labels)
	}
}

// A name under the zone whose label ends in an escaped dot is a name under
// the zone (NXDOMAIN), not outside it (REFUSED).
func TestEscapedDotUnderTheZone(t *testing.T) {
	t.Parallel()
	r := memRegistry(t)
	s, addr := startDNS(t, r, Config{})
	waitView(t, s, "the first snapshot", s.Ready)
	for _, tc := range []struct {
		name  string
		rcode int
	}{
		{`x\..api.prod.beacon.`, dns.RcodeNameError},
		{`\000\255\..web.api.prod.beacon.`, dns.RcodeNameError},
		{`prod.a\.beacon.`, dns.RcodeRefused}, // "a.beacon" is one label under the root
	} {
		m := new(dns.Msg)
		m.SetQuestion(tc.name, dns.TypeA)
		rep := raw(t, addr, packed(t, m), testDeadline)
		if rep == nil || rep.Rcode != tc.rcode {
			t.Errorf("%s: %v, want %s", tc.name, rep, dns.RcodeToString[tc.rcode])
		}
	}
}

// An instance whose address is a host name inside the zone is left out
// (counted, logged): its <id> name would be a CNAME to itself, or to
// another such instance pointing back (a loop), and SRV targets would be
// names that are themselves aliases, which RFC 2782 forbids.
func TestHostNameInsideZoneLeftOut(t *testing.T) {
	t.Parallel()
	r := memRegistry(t)
	metrics := prometheus.NewRegistry()
	s, addr := startDNS(t, r, Config{Metrics: metrics})
	const comp = "web.loop.prod.beacon."
	in := func(id, address string) beacon.Instance {
		return beacon.Instance{Namespace: "prod", Component: "loop", Endpoint: "web", ID: id, Address: address}
	}
	for _, i := range []beacon.Instance{
		in("1111111111111111", "1111111111111111."+comp+":80"), // itself
		in("2222222222222222", "3333333333333333."+comp+":80"), // each other
		in("3333333333333333", "2222222222222222."+comp+":80"),
		in("4444444444444444", "WEB.Loop.prod.BEACON:80"), // the endpoint's own name, any case
		in("5555555555555555", "10.0.0.5:80"),
		in("6666666666666666", "web-6.example.com:80"), // outside the zone: a CNAME, as before
	} {
		register(t, r, i)
	}
	waitView(t, s, "6 instances applied", func() bool {
		v := s.view.Load()
		return v != nil && v.zone.instances+v.zone.unanswerable == 6
	})
	if got := metricValue(t, metrics, "beacon_dns_unanswerable_instances"); got != 4 {
		t.Errorf("beacon_dns_unanswerable_instances = %v, want 4", got)
	}
	for _, id := range []string{"1111111111111111", "2222222222222222", "3333333333333333", "4444444444444444"} {
		if m := query(t, addr, "udp", id+"."+comp, dns.TypeA, 0); m.Rcode != dns.RcodeNameError || len(m.Answer) != 0 {
			t.Errorf("%s.%s A: %s %v, want NXDOMAIN", id, comp, dns.RcodeToString[m.Rcode], m.Answer)
		}
	}
	var targets []string
	for _, rr := range query(t, addr, "tcp", comp, dns.TypeSRV, 0).Answer {
		targets = append(targets, rr.(*dns.SRV).Target)
	}
	if want := []string{"5555555555555555." + comp, "web-6.example.com."}; !slices.Equal(sorted(targets), want) {
		t.Errorf("SRV %s targets = %v, want %v", comp, sorted(targets), want)
	}
	if m := query(t, addr, "udp", "6666666666666666."+comp, dns.TypeA, 0); len(m.Answer) != 1 || m.Answer[0].Header().Rrtype != dns.TypeCNAME {
		t.Errorf("a host name outside the zone: %v, want its CNAME", m.Answer)
	}
}

// A link-local address with a zone (fe80::1%eth0) reaches the instance
// only through that interface of its own host, and AAAA cannot carry the
// zone: it is left out (counted, logged), not served as a bare fe80::1.
func TestZonedAddressLeftOut(t *testing.T) {
	t.Parallel()
	r := memRegistry(t)
	metrics := prometheus.NewRegistry()
	s, addr := startDNS(t, r, Config{Metrics: metrics})
	register(t, r, testInstance("web", "[fe80::1%eth0]:80"))
	register(t, r, testInstance("web", "http://[fe80::2%25eth0]:81/"))
	register(t, r, testInstance("web", "[2001:db8::1]:80"))
	waitView(t, s, "3 instances applied", func() bool {
		v := s.view.Load()
		return v != nil && v.zone.instances+v.zone.unanswerable == 3
	})
	if got := metricValue(t, metrics, "beacon_dns_unanswerable_instances"); got != 2 {
		t.Errorf("beacon_dns_unanswerable_instances = %v, want 2", got)
	}
	var got []string
	for _, rr := range query(t, addr, "udp", "web.api.prod.beacon.", dns.TypeAAAA, 0).Answer {
		got = append(got, rr.(*dns.AAAA).AAAA.String())
	}
	if !slices.Equal(got, []string{"2001:db8::1"}) {
		t.Errorf("AAAA web.api.prod.beacon. = %v, want 2001:db8::1 only", got)
	}
	if srv := query(t, addr, "udp", "web.api.prod.beacon.", dns.TypeSRV, 0).Answer; len(srv) != 1 {
		t.Errorf("SRV web.api.prod.beacon. = %v, want the one instance without a zone", srv)
	}
}
