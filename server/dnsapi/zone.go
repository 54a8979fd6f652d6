package dnsapi

import (
	"cmp"
	"fmt"
	"maps"
	"net"
	"net/netip"
	"net/url"
	"slices"
	"strconv"
	"strings"

	"github.com/beaconplane/beacon"
	"github.com/miekg/dns"
)

// A zone is an immutable view of every serving instance as DNS records,
// precomputed per name so that a query is a map lookup. The watch loop
// builds a new zone for each batch (reusing the components that did not
// change) and swaps it in atomically; queries never wait for updates.
type zone struct {
	domain string // canonical, e.g. "beacon."
	ttl    uint32
	// namespaces counts components per namespace: a namespace is an empty
	// non-terminal (NODATA, not NXDOMAIN) while it has any.
	namespaces map[string]int
	// comps holds each component's names, by "<component>.<namespace>".
	comps     map[string]*compZone
	soa       *dns.SOA
	apex      *node
	instances int // serving instances answered for
	names     int // names that hold records
	// skipped counts, per component key, the serving instances left out
	// (see buildInstance); unanswerable is their sum.
	skipped      map[string]int
	unanswerable int
}

// compZone holds the names of one component, by the prefix before
// "<component>.<namespace>" ("" for the component itself). A component
// whose serving instances are all left out has no names and no instances;
// it is kept for its cache.
type compZone struct {
	names     map[string]*node
	cache     map[string]*instRecords // by "<endpoint>/<id>", for the next build
	instances int
	records   int
	skipped   int // serving instances whose address DNS cannot carry
}

// node is one name's records. A name with no records at all is an empty
// non-terminal (answers NODATA).
type node struct {
	a, aaaa, srv, txt []dns.RR
	soa, ns           []dns.RR // apex only
	cname             *dns.CNAME
	// glue holds the A/AAAA records of the SRV targets, for the additional
	// section of SRV answers.
	glue []dns.RR
}

func (n *node) size() int {
	c := len(n.a) + len(n.aaaa) + len(n.srv) + len(n.txt) + len(n.glue)
	if n.cname != nil {
		c++
	}
	return c
}

// entNode is the shared node of empty non-terminals.
var entNode = &node{}

// newZone returns an empty zone.
func newZone(domain string, ttl uint32) *zone {
	z := &zone{domain: domain, ttl: ttl, namespaces: map[string]int{}, comps: map[string]*compZone{}, skipped: map[string]int{}}
	z.setSerial(0)
	return z
}

// setSerial sets the SOA, whose serial follows the store revision so that
// secondary tooling sees the zone change: its low 32 bits (the memory
// backend's revisions start above 2^32), which increase in RFC 1982 serial
// arithmetic while fewer than 2^31 revisions pass between two views.
func (z *zone) setSerial(rev int64) {
	z.soa = &dns.SOA{
		Hdr:     dns.RR_Header{Name: z.domain, Rrtype: dns.TypeSOA, Class: dns.ClassINET, Ttl: z.ttl},
		Ns:      z.domain,
		Mbox:    "hostmaster." + z.domain,
		Serial:  uint32(rev),
		Refresh: 3600, Retry: 600, Expire: 86400,
		Minttl: z.ttl,
	}
	// The apex's NS record names the SOA's primary name: Beacon is the
	// zone's only server, reached by address (a stub domain, a forward),
	// never by delegation.
	ns := &dns.NS{Hdr: dns.RR_Header{Name: z.domain, Rrtype: dns.TypeNS, Class: dns.ClassINET, Ttl: z.ttl}, Ns: z.domain}
	z.apex = &node{soa: []dns.RR{z.soa}, ns: []dns.RR{ns}}
}

// lookup finds the node of a name relative to the domain (see splitQName).
// nil means NXDOMAIN.
func (z *zone) lookup(rel string) *node {
	if rel == "" {
		return z.apex
	}
	if strings.IndexByte(rel, '\\') >= 0 {
		return nil // no name Beacon answers needs an escape
	}
	ns, compKey, prefix := splitRel(rel)
	if compKey == "" {
		if z.namespaces[ns] > 0 {
			return entNode
		}
		return nil
	}
	cz := z.comps[compKey]
	if cz == nil {
		return nil
	}
	return cz.names[prefix]
}

// compID names one component.
type compID struct{ ns, comp string }

func (c compID) key() string { return c.comp + "." + c.ns }

// with returns a new zone in which the given components are rebuilt from
// their current instances (all instances of the component, serving or
// not; an empty slice removes the component). Other components are shared
// with z. left lists the serving instances newly left out by this build
// (see buildInstance), for the log; instances left out before and still
// unchanged are counted in the zone but not listed again.
func (z *zone) with(rev int64, changed map[compID][]beacon.Instance) (nz *zone, left []leftOut) {
	nz = &zone{domain: z.domain, ttl: z.ttl, namespaces: maps.Clone(z.namespaces), comps: maps.Clone(z.comps),
		instances: z.instances, names: z.names, skipped: maps.Clone(z.skipped), unanswerable: z.unanswerable}
	nz.setSerial(rev)
	for id, ins := range changed {
		k := id.key()
		old := nz.comps[k]
		if old != nil {
			nz.instances -= old.instances
			nz.names -= len(old.names)
			delete(nz.comps, k)
			if old.instances > 0 {
				if nz.namespaces[id.ns]--; nz.namespaces[id.ns] <= 0 {
					delete(nz.namespaces, id.ns)
				}
			}
		}
		nz.unanswerable -= nz.skipped[k]
		delete(nz.skipped, k)
		cz, n, l := buildComponent(id, ins, old, z.domain, z.ttl)
		left = append(left, l...)
		if n > 0 {
			nz.skipped[k] = n
			nz.unanswerable += n
		}
		if cz == nil {
			continue
		}
		nz.comps[k] = cz
		if cz.instances == 0 {
			continue // only instances left out: no names, kept for their cache
		}
		nz.namespaces[id.ns]++
		nz.instances += cz.instances
		nz.names += len(cz.names)
	}
	return nz, left
}

// leftOut is a serving instance DNS cannot answer for, and why.
type leftOut struct {
	in  beacon.Instance
	why string
}

// target is where an instance's address points.
type target struct {
	ip   netip.Addr // valid for an IP address
	host string     // canonical name for a hostname address
	port uint16     // 0 when the address has none (a URL without port)
}

// noHost is why an address with no host DNS can carry is left out.
const noHost = "its address has no IP address or host name DNS can carry"

// addressTarget reads host and port from an instance address: host:port,
// or a URL (nats://host:4222/subject). why says why the address has no
// host DNS can carry ("" when it has one); the instance is then left out
// of DNS.
func addressTarget(addr string) (t target, why string) {
	var host, port string
	if strings.Contains(addr, "://") {
		u, err := url.Parse(addr)
		if err != nil {
			return t, noHost
		}
		host, port = u.Hostname(), u.Port()
	} else {
		var err error
		if host, port, err = net.SplitHostPort(addr); err != nil {
			return t, noHost
		}
	}
	if port != "" {
		p, err := strconv.ParseUint(port, 10, 16)
		if err != nil || p == 0 {
			return t, noHost
		}
		t.port = uint16(p)
	}
	if ip, err := netip.ParseAddr(host); err == nil {
		if ip.Zone() != "" {
			// fe80::1%eth0: the zone names an interface of the
			// registering host; an A/AAAA record cannot carry it, and
			// without it the address reaches no one else.
			return t, fmt.Sprintf("its address %s has an IPv6 zone (%%%s): a link-local address is reachable only through that host's interface, and DNS cannot carry the zone; register a global or unique local address", ip, ip.Zone())
		}
		t.ip = ip.Unmap()
		if beacon.IPProblem(t.ip) != "" {
			return t, noHost
		}
		return t, ""
	}
	if host == "" || beacon.HostNameProblem(host) != "" {
		return t, noHost
	}
	t.host = dns.CanonicalName(host)
	return t, ""
}

// srvNumbers reads the SRV priority and weight of an instance from its
// metadata keys "priority" and "weight" (0-65535); 10 and 10 otherwise
// (beacon.Uint16Meta, as xDS reads them).
func srvNumbers(in beacon.Instance) (prio, weight uint16) {
	prio, _ = beacon.Uint16Meta(in.Metadata, beacon.MetaPriority, beacon.DefaultPriority)
	weight, _ = beacon.Uint16Meta(in.Metadata, beacon.MetaWeight, beacon.DefaultWeight)
	return prio, weight
}

// instRecords are the records one instance contributes to its
// component's names, kept from one build to the next while the instance is
// unchanged: a batch touching one instance of a large component rebuilds
// the component's name sets, not every record.
type instRecords struct {
	in   beacon.Instance // as built
	ok   bool            // false: left out of DNS, for the reason in why
	why  string
	ip   netip.Addr // valid for an IP address
	node *node      // <id>.<endpoint>...
	// Owned by the endpoint name, the component name and the two RFC 2782
	// names: the A/AAAA record (IP addresses only) and the SRV records
	// (addresses with a port).
	epAddr, compAddr               dns.RR
	epSRV, compSRV, tcpSRV, udpSRV dns.RR
}

// buildInstance computes an instance's records (see instRecords).
func buildInstance(in beacon.Instance, compName, domain string, ttl uint32) *instRecords {
	hdr := func(name string, t uint16) dns.RR_Header {
		return dns.RR_Header{Name: name, Rrtype: t, Class: dns.ClassINET, Ttl: ttl}
	}
	r := &instRecords{in: in}
	if r.why = unnameable(in); r.why != "" {
		return r
	}
	t, why := addressTarget(in.Address)
	if why != "" {
		r.why = why
		return r
	}
	if t.host != "" && dns.IsSubDomain(domain, t.host) {
		// Its <id> name would be a CNAME to a name of this zone (itself,
		// or another alias: a loop), and its SRV records would point at
		// a name Beacon holds no address for, or at an alias (RFC 2782
		// forbids it).
		r.why = fmt.Sprintf("its address is a host name inside the zone %s, which Beacon answers from registrations alone: register the instance's IP address or a host name outside the zone", domain)
		return r
	}
	epName := in.Endpoint + "." + compName
	idName := in.ID + "." + epName
	// The <id> name is the longest the instance has (longer than the
	// RFC 2782 names by the ID's label): if it fits, they all do.
	if len(idName)+1 > maxNameWire {
		r.why = fmt.Sprintf("its name %s is longer than DNS allows (255 bytes): shorten the zone's domain or the instance's names", idName)
		return r
	}
	r.ok = true
	n := &node{}
	srvTarget := idName
	if t.ip.IsValid() {
		r.ip = t.ip
		addAddr(n, addrRR(hdr(idName, 0), t.ip))
		r.epAddr = addrRR(hdr(epName, 0), t.ip)
		r.compAddr = addrRR(hdr(compName, 0), t.ip)
		n.txt = txtRecords(hdr(idName, dns.TypeTXT), in.Metadata)
	} else {
		// RFC 1034: a CNAME is alone at its name; RFC 2782: an SRV
		// target is not an alias, so SRV points at the host itself.
		n.cname = &dns.CNAME{Hdr: hdr(idName, dns.TypeCNAME), Target: t.host}
		srvTarget = t.host
	}
	if t.port != 0 {
		prio, weight := srvNumbers(in)
		srv := func(owner string) dns.RR {
			return &dns.SRV{Hdr: hdr(owner, dns.TypeSRV), Priority: prio, Weight: weight, Port: t.port, Target: srvTarget}
		}
		r.epSRV, r.compSRV = srv(epName), srv(compName)
		r.tcpSRV = srv("_" + in.Endpoint + "._tcp." + compName)
		r.udpSRV = srv("_" + in.Endpoint + "._udp." + compName)
		if n.cname == nil {
			n.srv = []dns.RR{srv(idName)}
			n.glue = slices.Concat(n.a, n.aaaa)
		}
	}
	r.node = n
	return r
}

// unnameable says why DNS cannot name an instance Beacon serves ("" if it
// can): beacon.CheckDNSName, for the names Beacon reads but does not write
// (the NVIDIA Dynamo runtime's).
func unnameable(in beacon.Instance) string {
	if err := beacon.CheckDNSName(in.Namespace, in.Endpoint); err != nil {
		return err.Error() + ": reach it through the HTTP API, the beacon:/// resolver or xDS (docs/dynamo.md)"
	}
	return ""
}

// maxNameWire is the longest domain name in wire format (RFC 1035). A
// canonical name of letter-digit-hyphen labels with its trailing dot takes
// one byte more on the wire than in text.
const maxNameWire = 255

// buildComponent precomputes every name of one component from its
// instances, reusing the records of instances unchanged since prev (nil
// for none). Instances that take no new work (draining, or failing their
// health check: Serving), and instances DNS cannot answer for
// (buildInstance), are left out: skipped counts the latter, and left lists
// those not already left out by prev. It returns nil when nothing is left.
func buildComponent(id compID, all []beacon.Instance, prev *compZone, domain string, ttl uint32) (cz *compZone, skipped int, left []leftOut) {
	ins := make([]beacon.Instance, 0, len(all))
	for _, in := range all {
		if in.Serving() {
			ins = append(ins, in)
		}
	}
	if len(ins) == 0 {
		return nil, 0, nil
	}
	slices.SortFunc(ins, func(a, b beacon.Instance) int {
		return cmp.Or(cmp.Compare(a.Endpoint, b.Endpoint), cmp.Compare(a.ID, b.ID))
	})
	compName := id.comp + "." + id.ns + "." + domain
	cz = &compZone{names: make(map[string]*node, 4*len(ins)), cache: make(map[string]*instRecords, len(ins))}
	comp := &node{}
	compAddrs := map[netip.Addr]bool{}

	for i := 0; i < len(ins); {
		ep := ins[i].Endpoint
		j := i
		for j < len(ins) && ins[j].Endpoint == ep {
			j++
		}
		epNode, tcpNode, udpNode := &node{}, &node{}, &node{}
		addrs := map[netip.Addr]bool{}
		n := 0
		for _, in := range ins[i:j] {
			key := in.Endpoint + "/" + in.ID
			r := cz.cache[key]
			if prev != nil {
				if old := prev.cache[key]; old != nil && old.in.Equal(in) {
					r = old
				}
			}
			if r == nil {
				r = buildInstance(in, compName, domain, ttl)
				if !r.ok {
					left = append(left, leftOut{in: in, why: r.why})
				}
			}
			cz.cache[key] = r
			if !r.ok {
				cz.skipped++
				continue
			}
			if r.ip.IsValid() {
				if !addrs[r.ip] {
					addrs[r.ip] = true
					addAddr(epNode, r.epAddr)
				}
				if !compAddrs[r.ip] {
					compAddrs[r.ip] = true
					addAddr(comp, r.compAddr)
				}
			}
			if r.epSRV != nil {
				epNode.srv = append(epNode.srv, r.epSRV)
				tcpNode.srv = append(tcpNode.srv, r.tcpSRV)
				udpNode.srv = append(udpNode.srv, r.udpSRV)
				comp.srv = append(comp.srv, r.compSRV)
				epNode.glue = append(epNode.glue, r.node.glue...)
				comp.glue = append(comp.glue, r.node.glue...)
			}
			cz.names[in.ID+"."+ep] = r.node
			cz.instances++
			n++
		}
		if n > 0 {
			tcpNode.glue, udpNode.glue = epNode.glue, epNode.glue
			cz.names[ep] = epNode
			cz.names["_"+ep+"._tcp"] = tcpNode
			cz.names["_"+ep+"._udp"] = udpNode
		}
		i = j
	}
	if cz.instances == 0 {
		// Keep the cache of the instances left out, so that the next
		// build neither rebuilds nor lists them again.
		return &compZone{cache: cz.cache, skipped: cz.skipped}, cz.skipped, left
	}
	cz.names[""] = comp
	cz.names["_tcp"] = entNode
	cz.names["_udp"] = entNode
	for _, n := range cz.names {
		cz.records += n.size()
	}
	return cz, cz.skipped, left
}

func addrRR(h dns.RR_Header, ip netip.Addr) dns.RR {
	if ip.Is4() {
		h.Rrtype = dns.TypeA
		return &dns.A{Hdr: h, A: net.IP(ip.AsSlice())}
	}
	h.Rrtype = dns.TypeAAAA
	return &dns.AAAA{Hdr: h, AAAA: net.IP(ip.AsSlice())}
}

func addAddr(n *node, rr dns.RR) {
	if rr.Header().Rrtype == dns.TypeA {
		n.a = append(n.a, rr)
	} else {
		n.aaaa = append(n.aaaa, rr)
	}
}

// txtRecords renders metadata as one TXT record per key, "key=value"
// (RFC 1464: a '=' or '`' in the key is quoted with a '`'), sorted by key.
// A pair longer than a TXT string (255 bytes) continues in further strings
// of the same record, to be concatenated.
func txtRecords(h dns.RR_Header, md map[string]string) []dns.RR {
	if len(md) == 0 {
		return nil
	}
	out := make([]dns.RR, 0, len(md))
	for _, k := range slices.Sorted(maps.Keys(md)) {
		kv := rfc1464Key.Replace(k) + "=" + md[k]
		var strs []string
		for len(kv) > 255 {
			strs = append(strs, escapeTXT(kv[:255]))
			kv = kv[255:]
		}
		strs = append(strs, escapeTXT(kv))
		out = append(out, &dns.TXT{Hdr: h, Txt: strs})
	}
	return out
}

// rfc1464Key quotes the characters RFC 1464 reserves in attribute names.
var rfc1464Key = strings.NewReplacer("`", "``", "=", "`=")

// escapeTXT escapes a raw string for miekg/dns, which packs TXT strings
// from presentation format (a backslash starts an escape).
func escapeTXT(s string) string {
	if strings.IndexByte(s, '\\') < 0 {
		return s
	}
	return strings.ReplaceAll(s, `\`, `\\`)
}
