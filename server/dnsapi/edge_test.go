package dnsapi

import (
	"testing"

	"github.com/miekg/dns"
)

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
