package main

import (
	"github.com/beaconplane/beacon/server"
	"github.com/beaconplane/beacon/server/dnsapi"
	"github.com/spf13/cobra"
	"github.com/spf13/pflag"
)

// addDNSFlags registers the DNS interface's flags on `beacon serve`
// (docs/dns.md).
func addDNSFlags(cmd *cobra.Command, d *server.DNSConfig) {
	f := cmd.Flags()
	f.StringVar(&d.Addr, "dns-addr", dnsapi.DefaultAddr, "DNS listener, UDP and TCP, answering for every registered instance (empty, --dns-addr=, disables DNS)")
	f.StringVar(&d.Domain, "dns-domain", dnsapi.DefaultDomain, "zone DNS answers: <endpoint>.<component>.<namespace>.<zone>; other names are refused")
	f.DurationVar(&d.TTL, "dns-ttl", dnsapi.DefaultTTL, "TTL of DNS answers and of negative answers (whole seconds, 1s-1h)")
	allowEmpty(cmd, "dns-addr", "no DNS")
	f.DurationVar(&d.MaxStale, "dns-max-stale", dnsapi.DefaultMaxStale, "how long DNS serves its last view after the registry lost its store, before answering SERVFAIL (0: SERVFAIL at once)")
}

// dnsFlags turns the DNS flags into the server's configuration, whose zero
// values mean "the default": a TTL given as zero is a mistake to report,
// not the default to apply silently (an empty zone is refused with every
// empty flag, checkEmptyFlags), and a zero --dns-max-stale means no stale
// answers at all.
func dnsFlags(f *pflag.FlagSet, d *server.DNSConfig) error {
	if d.Addr == "" {
		return nil // DNS disabled: the other flags do not matter
	}
	if f.Changed("dns-ttl") && d.TTL == 0 {
		return usagef("--dns-ttl 0s: must be whole seconds from 1s to 1h (a zero TTL defeats caching resolvers)")
	}
	if d.MaxStale == 0 {
		d.MaxStale = -1 // SERVFAIL as soon as the watch is stale
	}
	return nil
}
