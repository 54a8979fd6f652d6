package main

import (
	"github.com/beaconplane/beacon/internal/lab/bench"
	"github.com/spf13/pflag"
)

func init() {
	var cfg bench.XDSConfig
	addBenchScenario(benchScenario{
		use:   "xds",
		short: "xDS: a real xDS client through beacon serve vs Beacon's beacon:/// resolver, and ADS fan-out",
		long: `Runs beacon serve (embedded etcd) in a process of its own, a proxyless gRPC
client (grpc-go's xDS support: the beacon-xdsprobe peer) dialing
xds:///grpc.xds.bench in another, and Beacon's beacon:/// resolver in this
one, all calling the same backends under load.

Reported, xDS beside beacon:///:
  - register -> the first call the new backend receives (goal: p50 <= 2x,
    p99 < 50 ms);
  - drain -> the last call the drained backend receives;
then --streams ADS streams (this process) following one service while it
changes --changes times:
  - one change -> every stream updated, p50 and p99 (goal: p99 <= 1 s at
    10,000 streams);
  - assignments encoded per change, for all streams (goal: exactly 1);
  - beacon serve's memory per idle stream (goal: <= 20 KB).

The probe is built with: go build -o ~/.cache/beacon-peers/bin/beacon-xdsprobe
./internal/lab/xdsprobe (from a Beacon checkout), or given with --probe-bin. The
default run takes about a minute on 2 cores; the documented full size is
--streams 10000.`,
		flags: func(f *pflag.FlagSet) {
			f.StringVar(&cfg.ProbeBin, "probe-bin", "", "the xDS client process (default: beacon-xdsprobe in the peers directory, else PATH)")
			f.IntVar(&cfg.Trials, "trials", 20, "registrations, and drains, to time")
			f.IntVar(&cfg.Callers, "callers", 8, "goroutines calling through each client")
			f.DurationVar(&cfg.Pace, "pace", 0, "pause of each caller between calls (default 1ms)")
			f.DurationVar(&cfg.Quiet, "quiet", 0, "silence after which a drained backend's last call counts as the last (default 100ms)")
			f.IntVar(&cfg.Streams, "streams", 1000, "ADS streams following one service")
			f.IntVar(&cfg.Changes, "changes", 20, "changes of that service to time")
		},
		prepare: prepareBeacon(&cfg.BeaconCommand, func() error { return cfg.Validate() }),
		run:     measure(&cfg, &cfg.Logger, bench.RunXDS),
	})
}
