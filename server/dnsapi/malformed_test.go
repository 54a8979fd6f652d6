package dnsapi

import (
	"encoding/binary"
	"runtime"
	"strings"
	"testing"
	"time"

	"github.com/miekg/dns"
	"github.com/prometheus/client_golang/prometheus"
)

// rcodeCount sums beacon_dns_queries_total over query types for one rcode.
func rcodeCount(t *testing.T, g prometheus.Gatherer, rcode string) float64 {
	t.Helper()
	mfs, err := g.Gather()
	if err != nil {
		t.Fatal(err)
	}
	total := 0.0
	for _, mf := range mfs {
		if mf.GetName() != "beacon_dns_queries_total" {
			continue
		}
		for _, m := range mf.GetMetric() {
			for _, l := range m.GetLabel() {
				if l.GetName() == "rcode" && l.GetValue() == rcode {
					total += m.GetCounter().GetValue()
				}
			}
		}
	}
	return total
}

// header is a query header with id 0x1234, RD, and the given counts.
func header(qd, an, ns, ar uint16) []byte {
	h := []byte{0x12, 0x34, 0x01, 0x00}
	for _, c := range []uint16{qd, an, ns, ar} {
		h = binary.BigEndian.AppendUint16(h, c)
	}
	return h
}

// Every malformed query with a readable header is answered FORMERR and
// counted under rcode="FORMERR"; only a packet too short for a header is
// dropped and counted in beacon_dns_dropped_total.
func TestMalformedAnsweredFormerrAndCounted(t *testing.T) {
	t.Parallel()
	r := memRegistry(t)
	register(t, r, testInstance("web", "10.0.0.1:80"))
	metrics := prometheus.NewRegistry()
	s, addr := startDNS(t, r, Config{Metrics: metrics})
	waitView(t, s, "the instance", func() bool { return s.Ready() && s.view.Load().zone.instances == 1 })

	question := []byte("\x03web\x03api\x04prod\x06beacon\x00\x00\x01\x00\x01") // web.api.prod.beacon. A IN
	long := []byte{}
	for range 5 {
		long = append(long, 63)
		long = append(long, strings.Repeat("a", 63)...)
	}
	long = append(long, 0, 0, 1, 0, 1) // a 321-byte name
	cat := func(parts ...[]byte) []byte {
		var b []byte
		for _, p := range parts {
			b = append(b, p...)
		}
		return b
	}
	for _, tc := range []struct {
		what string
		pkt  []byte
	}{
		{"name pointing at itself", cat(header(1, 0, 0, 0), []byte{0xc0, 12, 0, 1, 0, 1})},
		{"name over 255 bytes", cat(header(1, 0, 0, 0), long)},
		{"question without class", cat(header(1, 0, 0, 0), question[:len(question)-2])},
		{"question without type and class", cat(header(1, 0, 0, 0), question[:len(question)-4])},
		{"question counted, absent", header(1, 0, 0, 0)},
		{"additional record counted, absent", cat(header(1, 0, 0, 1), question)},
		{"OPT record cut short", cat(header(1, 0, 0, 1), question, []byte{0, 0, 41, 0x04, 0xd0, 0, 0, 0, 0, 0, 4, 0})},
		{"answer record counted, absent", cat(header(1, 1, 0, 0), question)},
	} {
		for _, network := range []string{"udp", "tcp"} {
			dropped := metricValue(t, metrics, "beacon_dns_dropped_total")
			formerr := rcodeCount(t, metrics, "FORMERR")
			var reply *dns.Msg
			if network == "udp" {
				reply = raw(t, addr, tc.pkt, 5*time.Second)
			} else {
				reply = rawTCP(t, addr, tc.pkt, 5*time.Second)
			}
			switch {
			case reply == nil:
				t.Errorf("%s over %s: no reply, want FORMERR", tc.what, network)
			case reply.Rcode != dns.RcodeFormatError || reply.Id != 0x1234 || len(reply.Answer) != 0:
				t.Errorf("%s over %s: rcode %s id %#x answers %d, want FORMERR id 0x1234 and no answer",
					tc.what, network, dns.RcodeToString[reply.Rcode], reply.Id, len(reply.Answer))
			}
			if got := metricValue(t, metrics, "beacon_dns_dropped_total"); got != dropped {
				t.Errorf("%s over %s: beacon_dns_dropped_total went from %v to %v for a packet answered", tc.what, network, dropped, got)
			}
			if got := rcodeCount(t, metrics, "FORMERR"); got != formerr+1 {
				t.Errorf("%s over %s: queries_total{rcode=FORMERR} went from %v to %v, want +1", tc.what, network, formerr, got)
			}
		}
	}

	// Shorter than a header: nothing to answer to; dropped, and counted so.
	dropped := metricValue(t, metrics, "beacon_dns_dropped_total")
	if reply := raw(t, addr, header(1, 0, 0, 0)[:11], 300*time.Millisecond); reply != nil {
		t.Errorf("an 11-byte packet was answered: %v", reply)
	}
	// The UDP reader counts after the read; wait for it, no sleeping.
	deadline := time.Now().Add(testDeadline)
	for metricValue(t, metrics, "beacon_dns_dropped_total") != dropped+1 {
		if time.Now().After(deadline) {
			t.Fatalf("beacon_dns_dropped_total stayed at %v after an 11-byte packet", dropped)
		}
		runtime.Gosched()
	}
}
