package dnsapi

import (
	"math/rand/v2"
	"slices"

	"github.com/miekg/dns"
)

// ednsVersion is the only EDNS version Beacon speaks (RFC 6891).
const ednsVersion = 0

// rfc8482 is the answer to ANY queries: a synthesized HINFO, as RFC 8482
// recommends, instead of every record (a cheap amplification vector).
func rfc8482(owner string, ttl uint32) dns.RR {
	return &dns.HINFO{Hdr: dns.RR_Header{Name: owner, Rrtype: dns.TypeHINFO, Class: dns.ClassINET, Ttl: ttl}, Cpu: "RFC8482"}
}

// answerer holds what answering needs besides the zone.
type answerer struct {
	domain  string
	ttl     uint32
	udpSize int // the largest UDP answer, and the EDNS0 size advertised
}

// answer builds the reply to req from z, which is nil while no view can be
// served (before the first snapshot, or stale past the bound): names under
// the domain then answer SERVFAIL. udp says whether the reply goes over
// UDP (and is truncated to the client's buffer size). The reply is never
// nil and always packs.
func (a *answerer) answer(z *zone, req *dns.Msg, udp bool) *dns.Msg {
	m := new(dns.Msg)
	m.Id = req.Id
	m.Response = true
	m.Opcode = req.Opcode
	m.RecursionDesired = req.RecursionDesired
	m.CheckingDisabled = req.CheckingDisabled
	if len(req.Question) != 1 {
		m.Rcode = dns.RcodeFormatError
		return m
	}
	q := req.Question[0]
	m.Question = []dns.Question{q}
	size := dns.MinMsgSize
	if optCount(req) > 1 {
		m.Rcode = dns.RcodeFormatError // RFC 6891 6.1.1
		return m
	}
	if opt := req.IsEdns0(); opt != nil {
		m.SetEdns0(uint16(a.udpSize), false)
		if opt.Version() != ednsVersion {
			m.Rcode = dns.RcodeBadVers
			return m
		}
		size = max(int(opt.UDPSize()), dns.MinMsgSize)
		size = min(size, a.udpSize)
	}
	if !udp {
		size = dns.MaxMsgSize
	}
	defer a.truncate(m, size)

	if req.Opcode != dns.OpcodeQuery {
		m.Rcode = dns.RcodeNotImplemented
		return m
	}
	// QCLASS ANY (255, RFC 1035 3.2.5) asks for the records of every
	// class; Beacon's are all IN, so it is answered as IN. BIND does the
	// same: its view selection (client.c) lets a query of class ANY
	// match a view of class IN.
	if q.Qclass != dns.ClassINET && q.Qclass != dns.ClassANY {
		m.Rcode = dns.RcodeRefused
		return m
	}
	rel, in := splitQName(q.Name, a.domain)
	if !in {
		// Not an open resolver: no recursion, nothing outside the domain.
		m.Rcode = dns.RcodeRefused
		return m
	}
	if z == nil {
		m.Rcode = dns.RcodeServerFailure
		return m
	}
	m.Authoritative = true
	n := z.lookup(rel)
	if n == nil {
		m.Rcode = dns.RcodeNameError
		m.Ns = []dns.RR{z.soa}
		return m
	}
	switch {
	case q.Qtype == dns.TypeAXFR || q.Qtype == dns.TypeIXFR:
		m.Authoritative = false
		m.Rcode = dns.RcodeRefused // no zone transfers
		return m
	case n.cname != nil && q.Qtype != dns.TypeCNAME:
		m.Answer = []dns.RR{n.cname}
		return m
	}
	switch q.Qtype {
	case dns.TypeA:
		m.Answer = shuffled(n.a)
	case dns.TypeAAAA:
		m.Answer = shuffled(n.aaaa)
	case dns.TypeSRV:
		m.Answer = shuffled(n.srv)
		if len(m.Answer) > 0 {
			m.Extra = append(slices.Clip(n.glue), m.Extra...) // glue before the OPT record
		}
	case dns.TypeTXT:
		m.Answer = n.txt
	case dns.TypeCNAME:
		if n.cname != nil {
			m.Answer = []dns.RR{n.cname}
		}
	case dns.TypeSOA:
		m.Answer = n.soa
	case dns.TypeNS:
		m.Answer = n.ns
	case dns.TypeANY:
		m.Answer = []dns.RR{rfc8482(q.Name, a.ttl)}
	}
	if len(m.Answer) == 0 {
		m.Ns = []dns.RR{z.soa} // NODATA: the name exists, this type does not
	}
	return m
}

// optCount counts the OPT records of a message's additional section.
func optCount(m *dns.Msg) int {
	n := 0
	for _, rr := range m.Extra {
		if rr.Header().Rrtype == dns.TypeOPT {
			n++
		}
	}
	return n
}

// shuffled returns a copy of rrs in random order: resolvers and clients
// that take the first address spread over every instance.
func shuffled(rrs []dns.RR) []dns.RR {
	if len(rrs) < 2 {
		return rrs
	}
	out := slices.Clone(rrs)
	rand.Shuffle(len(out), func(i, j int) { out[i], out[j] = out[j], out[i] })
	return out
}

// truncate fits m into size bytes: the additional section (glue) goes
// first, without TC; if the answer still does not fit, TC is set and the
// client retries over TCP, where the full answer fits.
func (a *answerer) truncate(m *dns.Msg, size int) {
	answers, ns := len(m.Answer), len(m.Ns)
	m.Truncate(size)
	if len(m.Answer) == answers && len(m.Ns) == ns {
		m.Truncated = false // only additional records were left out
	}
}
