// Package dnsapi is Beacon's DNS interface: an authoritative DNS server for
// one zone (default "beacon.") that answers for every instance of a
// registry, from the registry's watch, over UDP and TCP.
//
// It is built on registry.Discoverer alone, so it serves every backend
// (etcd, memory, file, NATS, Kubernetes). A Server follows one Watch of
// everything the registry holds and folds each batch into an immutable
// view, precomputed per name (rebuilding only the components a batch
// touched), which it swaps in atomically: a query is a map lookup and a
// message pack, never a store read, and never waits for an update.
//
// # Names
//
// Under the zone, with labels as registered (DNS labels, so every instance
// has a name); case does not matter:
//
//	<endpoint>.<component>.<namespace>       A/AAAA of the endpoint's serving instances with
//	                                         IP addresses; SRV, one per instance, with glue
//	_<endpoint>._tcp.<component>.<namespace> the same SRV records (RFC 2782; also _udp)
//	<component>.<namespace>                  A/AAAA and SRV of every endpoint of the component
//	<id>.<endpoint>.<component>.<namespace>  one instance: A or AAAA, SRV, TXT (metadata)
//	<namespace>, _tcp.<component>...          exist without records (NODATA, not NXDOMAIN)
//	the zone apex                            SOA (serial: the store revision of the view); NS:
//	                                         the SOA's primary name, the apex itself
//
// An instance address is host:port or a URL (the SRV port is the URL's; a
// URL without port gets no SRV record). An instance whose host is a name
// rather than an IP address is a CNAME at its <id> name, and its SRV
// records point at the host itself (RFC 2782: SRV targets are not
// aliases); a CNAME stands alone at its name (RFC 1034), so such an
// instance has no TXT record. SRV priority and weight come from the
// metadata keys "priority" and "weight" (0-65535), 10 otherwise. TXT holds
// one record per metadata key, "key=value" (RFC 1464, with '=' and '`' in
// keys quoted by '`'), continued in further strings of the record past 255
// bytes. Instances whose address has no host DNS can carry, or is an IPv6
// address with a zone (fe80::1%eth0: no AAAA record carries the zone), or
// is a host name inside the zone (a CNAME back into the zone could loop,
// and an SRV target must not be an alias), or whose <id> name would be
// longer than 255 bytes, are left out (logged, and counted in
// beacon_dns_unanswerable_instances); so are, of the NVIDIA Dynamo
// runtime's names that Beacon serves read-only, a namespace nested with
// dots (DNS would read it as several names) and an endpoint starting with
// '_' (it would stand where _tcp does). Underscores elsewhere are served.
//
// Instances that take no new work (beacon.Instance.Serving: draining, or
// failing their health check at a priority not in panic) are left out, as if
// deregistered. Answers are shuffled per query.
//
// # Protocol
//
// Names outside the zone are REFUSED (no recursion: not an open resolver);
// absent names are NXDOMAIN and absent types NODATA, both with the SOA in
// the authority section (negative TTL: the TTL). ANY is answered with an
// RFC 8482 HINFO; zone transfers are refused. A UDP answer fits the
// client's EDNS0 buffer (512 bytes without EDNS0), capped at UDPSize
// (1232): glue is left out first, then answers with TC set, and the full
// answer comes over TCP. EDNS versions other than 0 get BADVERS; a query
// that is not one question, or has more than one OPT record (RFC 6891
// 6.1.1), gets FORMERR.
//
// # Freshness and staleness
//
// Until the registry's first snapshot is in, names under the zone answer
// SERVFAIL. If the watch loses its store (a Stale batch), the last view
// keeps being served for Config.MaxStale (beacon_dns_stale_seconds counts
// the time), then names answer SERVFAIL until the watch is back, so that
// resolvers try another server rather than trust an old view forever.
package dnsapi
