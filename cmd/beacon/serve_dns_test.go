package main

import (
	"strings"
	"testing"
	"time"

	"github.com/beaconplane/beacon/server"
	"github.com/spf13/cobra"
)

// The DNS flags' zero values are not silently the defaults: an empty zone
// and a zero TTL are errors (checkEmptyFlags, checkZeroFlags: as every
// empty or zero flag, also with DNS disabled), and --dns-max-stale 0s means SERVFAIL as soon
// as the registry's watch is stale (server.DNSConfig's zero value would
// mean 30 s); a negative --dns-max-stale is refused, as other durations'
// negatives are.
func TestDNSFlags(t *testing.T) {
	for _, tc := range []struct {
		args     []string
		maxStale time.Duration
		err      string
	}{
		{args: nil, maxStale: 30 * time.Second},
		{args: []string{"--dns-max-stale", "0s"}, maxStale: -1},
		{args: []string{"--dns-max-stale", "-5s"}, err: "--dns-max-stale -5s: must not be negative"},
		{args: []string{"--dns-max-stale", "-1s", "--dns-addr="}, err: "--dns-max-stale -1s: must not be negative"},
		{args: []string{"--dns-max-stale", "1m"}, maxStale: time.Minute},
		{args: []string{"--dns-ttl", "0s"}, err: "--dns-ttl 0s"},
		{args: []string{"--dns-domain="}, err: `--dns-domain "": empty`},
		{args: []string{"--dns-ttl", "0s", "--dns-addr="}, err: "--dns-ttl 0s: 0 is not a value of this flag"},
		{args: []string{"--dns-ttl", "5s", "--dns-addr="}}, // DNS disabled
	} {
		var d server.DNSConfig
		cmd := &cobra.Command{}
		addDNSFlags(cmd, &d)
		if err := cmd.Flags().Parse(tc.args); err != nil {
			t.Fatal(err)
		}
		err := checkEmptyFlags(cmd)
		if err == nil {
			err = checkZeroFlags(cmd)
		}
		if err == nil {
			err = dnsFlags(&d)
		}
		if tc.err != "" {
			if err == nil || !strings.Contains(err.Error(), tc.err) {
				t.Errorf("%v: %v, want an error with %q", tc.args, err, tc.err)
			}
			continue
		}
		if err != nil {
			t.Errorf("%v: %v", tc.args, err)
			continue
		}
		if d.Addr != "" && d.MaxStale != tc.maxStale {
			t.Errorf("%v: MaxStale %v, want %v", tc.args, d.MaxStale, tc.maxStale)
		}
	}
}
