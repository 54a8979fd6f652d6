package dnsapi

import (
	"testing"
	"time"

	"github.com/beaconplane/beacon/internal/testkit/backendtest"
	"github.com/miekg/dns"
)

// DNS works over every store backend: an instance registered by one
// registry (another process, for the shared backends) is answered by a DNS
// server over another, and gone once deregistered.
func TestEveryBackend(t *testing.T) {
	t.Parallel()
	for _, b := range backendtest.Kinds {
		t.Run(b.Name, func(t *testing.T) {
			t.Parallel()
			open := b.Start(t)
			server, registrant := backendtest.Registry(t, open), backendtest.Registry(t, open)
			s, addr := startDNS(t, server, Config{})
			reg := register(t, registrant, testInstance("web", "10.0.0.1:80"))
			name := reg.Instance().ID + ".web.api.prod.beacon."
			waitView(t, s, "the instance", func() bool { return query(t, addr, "udp", name, dns.TypeA, 0).Rcode == dns.RcodeSuccess })
			if got := dig(t, addr, "web.api.prod.beacon.", "SRV").rdata("SRV"); len(got) != 1 {
				t.Errorf("SRV = %v", got)
			}
			start := time.Now()
			if err := reg.Close(); err != nil {
				t.Fatal(err)
			}
			waitView(t, s, "the instance to go", func() bool { return query(t, addr, "udp", name, dns.TypeA, 0).Rcode == dns.RcodeNameError })
			t.Logf("%s: deregistration -> NXDOMAIN in %v", b.Name, time.Since(start).Round(time.Millisecond))
		})
	}
}
