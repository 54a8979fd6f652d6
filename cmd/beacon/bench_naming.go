package main

import (
	"github.com/beaconplane/beacon/internal/lab/bench"
	"github.com/spf13/cobra"
	"github.com/spf13/pflag"
)

func init() {
	var cfg bench.NamingConfig
	addBenchScenario(benchScenario{
		use:   "naming",
		short: "gRPC name resolution: Beacon's resolver vs etcd's naming resolver, under load",
		long: `Runs two gRPC channels side by side under continuous load against the same
--backends gRPC servers: one through Beacon's beacon:/// resolver (registry
over etcd), one through etcd 3.7.3's own naming resolver (etcd:///). Each
backend registers in both formats under one lease.

Reported, Beacon beside etcd (goal: ratio <= 1.0 at p50 and p99):
  - lease revoke -> last call the removed backend receives, per channel;
  - drain -> last call (Beacon drains the instance; etcd deletes the endpoint).
Then a rolling restart of every backend under load on each channel alone:
failed calls when instances drain first (goal: 0), and without draining.

Uses an embedded etcd unless --endpoints is given (e.g. a running beacon
serve). The default run takes about a minute on 2 cores.`,
		flags: func(f *pflag.FlagSet) {
			f.StringSliceVar(&cfg.Endpoints, "endpoints", nil, "etcd client URLs (default: an embedded etcd)")
			f.IntVar(&cfg.Backends, "backends", 3, "gRPC backends")
			f.IntVar(&cfg.Trials, "trials", 100, "lease revokes, and drains, to measure")
			f.IntVar(&cfg.Callers, "callers", 8, "goroutines calling through each channel")
			f.DurationVar(&cfg.Pace, "pace", 0, "pause of each caller between calls (default 1ms)")
			f.DurationVar(&cfg.Quiet, "quiet", 0, "silence after which a removed backend's last call counts as the last (default 100ms)")
			f.DurationVar(&cfg.DrainGrace, "drain-grace", 0, "rolling restart: time between draining a backend and stopping it (default 250ms)")
		},
		prepare: func(*cobra.Command) error { return usage(cfg.Validate()) },
		run:     measure(&cfg, &cfg.Logger, bench.RunNaming),
	})
}
