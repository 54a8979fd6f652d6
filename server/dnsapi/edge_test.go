package dnsapi

import (
	"slices"
	"testing"

	"github.com/miekg/dns"
	"github.com/prometheus/client_golang/prometheus"
)

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
