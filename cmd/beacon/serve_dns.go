package main

import (
	"github.com/beaconplane/beacon/server"
	"github.com/beaconplane/beacon/server/dnsapi"
	"github.com/spf13/cobra"
)

// addDNSFlags registers the DNS interface's flags on `beacon serve`
// (docs/dns.md).
func addDNSFlags(cmd *cobra.Command, d *server.DNSConfig) {
	f := cmd.Flags()
	f.StringVar(&d.Addr, "dns-addr", dnsapi.DefaultAddr, "DNS listener, UDP and TCP, answering for every registered instance (empty, --dns-addr=, disables DNS)")
	f.StringVar(&d.Domain, "dns-domain", dnsapi.DefaultDomain, "zone DNS answers: <endpoint>.<component>.<namespace>.<zone>; other names are refused")
	f.DurationVar(&d.TTL, "dns-ttl", dnsapi.DefaultTTL, "TTL of DNS answers and of negative answers (whole seconds, 1s-1h)")
	f.DurationVar(&d.MaxStale, "dns-max-stale", dnsapi.DefaultMaxStale, "how long DNS serves its last view after the registry lost its store, before answering SERVFAIL (0: SERVFAIL at once)")
	allowEmpty(cmd, "dns-addr", "no DNS")
	allowZero(cmd, "dns-max-stale", "SERVFAIL at once")
}

// dnsFlags turns the DNS flags into the server's configuration, whose zero
// values mean "the default" (an empty zone and a zero TTL are refused with
// every empty or zero flag, checkEmptyFlags and checkZeroFlags): a zero
// --dns-max-stale means no stale answers at all, and a negative one is
// refused (the library reads it as 0s does here, which -1s does not say).
func dnsFlags(d *server.DNSConfig) error {
	if d.MaxStale < 0 {
		return usagef("--dns-max-stale %v: must not be negative (0s: SERVFAIL at once)", d.MaxStale)
	}
	if d.Addr != "" && d.MaxStale == 0 {
		d.MaxStale = -1 // SERVFAIL as soon as the watch is stale
	}
	return nil
}
