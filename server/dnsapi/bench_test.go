package dnsapi

import (
	"fmt"
	"testing"

	"github.com/beaconplane/beacon"
	"github.com/miekg/dns"
)

func benchZone(b *testing.B, n int) (*zone, []beacon.Instance) {
	b.Helper()
	ins := make([]beacon.Instance, n)
	for i := range ins {
		ins[i] = beacon.Instance{Namespace: "prod", Component: "api", Endpoint: fmt.Sprintf("ep%d", i%10),
			ID: fmt.Sprintf("%016x", i), Address: fmt.Sprintf("10.%d.%d.%d:80", i>>16&255, i>>8&255, i&255),
			Metadata: map[string]string{"zone": "a"}}
	}
	z, _ := newZone(DefaultDomain, 5).with(1, map[compID][]beacon.Instance{{"prod", "api"}: ins})
	return z, ins
}

// BenchmarkAnswer is the hot path: look up, build, truncate and pack an
// answer (what ServeDNS does besides the socket write).
func BenchmarkAnswer(b *testing.B) {
	z, _ := benchZone(b, 10)
	a := &answerer{domain: DefaultDomain, ttl: 5, udpSize: DefaultUDPSize}
	for _, qt := range []uint16{dns.TypeA, dns.TypeSRV} {
		b.Run(dns.TypeToString[qt], func(b *testing.B) {
			req := new(dns.Msg)
			req.SetQuestion("ep1.api.prod.beacon.", qt)
			buf := make([]byte, 0, dns.DefaultMsgSize)
			b.ReportAllocs()
			for b.Loop() {
				m := a.answer(z, req, true)
				if _, err := m.PackBuffer(buf); err != nil {
					b.Fatal(err)
				}
			}
		})
	}
}

// BenchmarkRebuild rebuilds one component of 10,000 instances, what one
// watch batch touching it costs.
func BenchmarkRebuild(b *testing.B) {
	z, ins := benchZone(b, 10000)
	b.ReportAllocs()
	for b.Loop() {
		z.with(2, map[compID][]beacon.Instance{{"prod", "api"}: ins})
	}
}
