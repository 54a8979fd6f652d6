package dnsapi

import (
	"fmt"
	"sync/atomic"
	"time"

	"github.com/beaconplane/beacon/internal/promreg"
	"github.com/miekg/dns"
	"github.com/prometheus/client_golang/prometheus"
)

// Query types and rcodes counted under their own label; others count as
// "other", so that a flood of random types cannot grow the series.
var (
	countedTypes  = []uint16{dns.TypeA, dns.TypeAAAA, dns.TypeSRV, dns.TypeTXT, dns.TypeCNAME, dns.TypeSOA, dns.TypeNS, dns.TypeANY, dns.TypePTR, dns.TypeAXFR}
	countedRcodes = []int{dns.RcodeSuccess, dns.RcodeNameError, dns.RcodeServerFailure, dns.RcodeRefused, dns.RcodeFormatError, dns.RcodeNotImplemented, dns.RcodeBadVers}
)

type metrics struct {
	queries   *prometheus.CounterVec
	cells     [][]atomic.Pointer[prometheus.Counter] // [type][rcode], resolved lazily
	truncated prometheus.Counter
	updates   prometheus.Counter
	dropped   prometheus.Counter
}

func newMetrics(reg prometheus.Registerer, s *Server) (*metrics, error) {
	f := promreg.With(nil) // registered below, not shared: a second server on one Registerer is an error
	m := &metrics{
		queries: f.CounterVec("beacon_dns_queries_total",
			"DNS queries answered, by query type and response code.", "qtype", "rcode"),
		truncated: f.Counter("beacon_dns_truncated_total",
			"UDP answers sent truncated (TC set: the client retries over TCP)."),
		updates: f.Counter("beacon_dns_zone_updates_total",
			"Views of the registry swapped in (one per watch batch applied)."),
		dropped: f.Counter("beacon_dns_dropped_total",
			"Packets dropped without an answer: shorter than a DNS header, or DNS responses (never answered, to avoid loops). Malformed queries with a header are answered FORMERR and counted in beacon_dns_queries_total."),
	}
	m.cells = make([][]atomic.Pointer[prometheus.Counter], len(countedTypes)+1)
	for i := range m.cells {
		m.cells[i] = make([]atomic.Pointer[prometheus.Counter], len(countedRcodes)+1)
	}
	if reg == nil {
		return m, nil
	}
	gauge := func(name, help string, f func(v *view) float64) prometheus.Collector {
		return prometheus.NewGaugeFunc(prometheus.GaugeOpts{Name: name, Help: help}, func() float64 {
			if v := s.view.Load(); v != nil {
				return f(v)
			}
			return 0
		})
	}
	cs := []prometheus.Collector{
		m.queries, m.truncated, m.updates, m.dropped,
		gauge("beacon_dns_instances", "Serving instances in the DNS view.", func(v *view) float64 { return float64(v.zone.instances) }),
		gauge("beacon_dns_unanswerable_instances", "Serving instances left out of the DNS view: their address has no IP address or host name DNS can carry, or is an IPv6 address with a zone, or a host name inside the zone, or their name would be longer than 255 bytes (the log says which).",
			func(v *view) float64 { return float64(v.zone.unanswerable) }),
		gauge("beacon_dns_names", "Names in the DNS view (the size of the answer cache).", func(v *view) float64 { return float64(v.zone.names) }),
		gauge("beacon_dns_stale_seconds", "Seconds since the registry watch behind DNS lost its store (0 while it is live); past the server's maximum staleness (MaxStale) names answer SERVFAIL.",
			func(v *view) float64 {
				if v.staleSince.IsZero() {
					return 0
				}
				return time.Since(v.staleSince).Seconds()
			}),
		prometheus.NewGaugeFunc(prometheus.GaugeOpts{Name: "beacon_dns_ready", Help: "1 once the DNS view holds the registry's first snapshot."}, func() float64 {
			if s.view.Load() != nil {
				return 1
			}
			return 0
		}),
	}
	if err := promreg.RegisterEach(reg, cs...); err != nil {
		return nil, fmt.Errorf("dns metrics: %w", err)
	}
	return m, nil
}

// count records one answered query.
func (m *metrics) count(qtype uint16, rcode int, truncated bool) {
	ti := len(countedTypes)
	for i, t := range countedTypes {
		if t == qtype {
			ti = i
			break
		}
	}
	ri := len(countedRcodes)
	for i, r := range countedRcodes {
		if r == rcode {
			ri = i
			break
		}
	}
	cell := &m.cells[ti][ri]
	c := cell.Load()
	if c == nil {
		tl, rl := "other", "other"
		if ti < len(countedTypes) {
			tl = dns.TypeToString[countedTypes[ti]]
		}
		if ri < len(countedRcodes) {
			rl = rcodeLabel(countedRcodes[ri])
		}
		counter := m.queries.WithLabelValues(tl, rl)
		cell.Store(&counter)
		c = &counter
	}
	(*c).Inc()
	if truncated {
		m.truncated.Inc()
	}
}

// rcodeLabel names an rcode. miekg/dns names 16 BADSIG (its meaning in a
// TSIG record); in a query's answer, the only place Beacon sends it, 16 is
// BADVERS (RFC 6891).
func rcodeLabel(rcode int) string {
	if rcode == dns.RcodeBadVers {
		return "BADVERS"
	}
	return dns.RcodeToString[rcode]
}
