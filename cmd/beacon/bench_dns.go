package main

import (
	"errors"
	"fmt"

	"github.com/beaconplane/beacon/internal/lab/bench"
	"github.com/spf13/cobra"
	"github.com/spf13/pflag"
)

func init() {
	var cfg bench.DNSConfig
	addBenchScenario(benchScenario{
		use:   "dns",
		short: "DNS: Beacon's DNS interface vs CoreDNS's etcd plugin, with dnsperf",
		long: `Starts beacon serve (embedded etcd unless --etcd-endpoints, DNS on a free
loopback port) and CoreDNS 1.15 with its etcd plugin over the same etcd,
registers --instances instances in Beacon's registry and the same instances as
SkyDNS records, then alternates dnsperf runs (A and SRV queries of
web.api.bench.beacon.) against each, --rounds times.

Reported, Beacon beside CoreDNS: queries per second (goal: >= 5x), latency p50
and p99 (goal: p99 <= CoreDNS's), and freshness: a new registration -> the
first successful lookup of its name, p50 and p99.

Needs dnsperf (apt-get install dnsperf) and CoreDNS with the etcd plugin (bash
.ci/build-peers coredns). Everything started or written is removed at the end,
also on interrupt. The default run takes about a minute.`,
		flags: func(f *pflag.FlagSet) {
			f.StringSliceVar(&cfg.EtcdEndpoints, "etcd-endpoints", nil, "an external etcd for both servers (default: beacon serve's embedded etcd)")
			f.IntVar(&cfg.Instances, "instances", 10, "instances registered (1-10000)")
			f.DurationVar(&cfg.Duration, "duration", 0, "length of each dnsperf run (default 10s)")
			f.IntVar(&cfg.Rounds, "rounds", 2, "alternating dnsperf runs per server")
			f.IntVar(&cfg.Clients, "clients", 4, "dnsperf -c: clients (sockets)")
			f.IntVar(&cfg.Outstanding, "outstanding", 100, "dnsperf -q: queries in flight")
			f.IntVar(&cfg.Trials, "trials", 50, "freshness trials per server")
			f.StringVar(&cfg.CoreDNS, "coredns", "", "CoreDNS binary with the etcd plugin (default: built by .ci/build-peers, or in PATH)")
			f.StringVar(&cfg.DNSPerf, "dnsperf", "", "dnsperf binary (default: in PATH)")
		},
		prepare: func(cmd *cobra.Command) error {
			// Zero means "default" in bench.DNSConfig; here it was typed.
			var errs []error
			for _, v := range []struct {
				flag string
				n    int
			}{{"instances", cfg.Instances}, {"rounds", cfg.Rounds}, {"clients", cfg.Clients}, {"outstanding", cfg.Outstanding}, {"trials", cfg.Trials}} {
				if v.n == 0 {
					errs = append(errs, fmt.Errorf("--%s 0: must be at least 1", v.flag))
				}
			}
			if cmd.Flags().Changed("duration") && cfg.Duration == 0 {
				errs = append(errs, errors.New("--duration 0s: must be 1s-1h"))
			}
			return usage(errors.Join(append(errs, cfg.Validate())...))
		},
		run: measure(&cfg, &cfg.Logger, bench.RunDNS),
	})
}
