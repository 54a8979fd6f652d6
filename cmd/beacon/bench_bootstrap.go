package main

import (
	"github.com/beaconplane/beacon/internal/lab/bench"
	"github.com/spf13/pflag"
)

func init() {
	var cfg bench.BootstrapConfig
	addBenchScenario(benchScenario{
		use:   "bootstrap",
		short: "Cluster discovery through Beacon vs etcd's own discovery client, for 3, 5 and 7 members",
		long: `Bootstraps clusters of --sizes members through one discovery registry (an
embedded etcd, or --endpoints, e.g. a running beacon serve), alternating
Beacon (token from bootstrap.CreateToken, members running bootstrap.Join) and
the baseline (size key from a plain etcd put, members running etcd 3.7.3's own
v3discovery.JoinCluster). For each size it reports the time from the start of
the last member until every member has its initial cluster (goal: Beacon
<= 1.1x etcd at p50). Members are in-process discovery clients, each with its
own connection; no etcd member is started.`,
		flags: func(f *pflag.FlagSet) {
			f.StringSliceVar(&cfg.Endpoints, "endpoints", nil, "discovery registry client URLs (default: an embedded etcd)")
			f.IntSliceVar(&cfg.Sizes, "sizes", []int{3, 5, 7}, "cluster sizes to bootstrap")
			f.IntVar(&cfg.Rounds, "rounds", 15, "clusters of each size per side")
		},
		run: measure(&cfg, &cfg.Logger, bench.RunBootstrap),
	})
}
