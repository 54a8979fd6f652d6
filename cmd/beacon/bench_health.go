package main

import (
	"github.com/beaconplane/beacon/internal/lab/bench"
	"github.com/spf13/pflag"
)

func init() {
	var cfg bench.HealthConfig
	addBenchScenario(benchScenario{
		use:   "health",
		short: "Health checks: probes per instance per interval across beacon serve nodes, detection time, CPU per check",
		long: `Runs --nodes beacon serve processes in front of one etcd (run in this
process, no fsync); they share the checks of --instances gRPC health
services, each on a listener of its own in this process, checked every
--interval with --fall and --rise.

Reported:
  - probes per instance per interval, counted at the instances over
    --window intervals (goal: exactly 1, whatever the number of nodes);
  - the checking nodes' CPU per 1,000 checks/s;
  - NOT_SERVING -> out of the registry's view, and SERVING -> back, p50 and
    p99, for --trials instances one at a time (bound: fall x interval +
    0.5 s, and rise x interval + 0.5 s);
  - with more than one node: up to 10 instances made to fail, fewer than
    half of each checker's share (a checker that sees more than half of
    its own fail while its peers do not takes itself for cut off and
    holds its verdicts back), the checker that marked the first killed
    (SIGKILL): its verdicts gone with its lease
    (fail-open; bound: the lease TTL + 1 s), the instances marked failing
    again by the others, and the probes per instance per interval again.

The default run (3 nodes, 1,000 instances, 1 s interval) takes about a
minute and a half on 2 cores.`,
		flags: func(f *pflag.FlagSet) {
			f.IntVar(&cfg.Nodes, "nodes", 3, "beacon serve processes sharing the checks")
			f.IntVar(&cfg.Instances, "instances", 1000, "checked instances")
			f.DurationVar(&cfg.Interval, "interval", 0, "every instance's check interval (default 1s)")
			f.IntVar(&cfg.Fall, "fall", 3, "failures in a row that take an instance out")
			f.IntVar(&cfg.Rise, "rise", 2, "passes in a row that bring it back")
			f.IntVar(&cfg.Trials, "trials", 20, "instances turned NOT_SERVING and back, timed")
			f.IntVar(&cfg.Window, "window", 5, "intervals over which probes are counted")
		},
		prepare: prepareBeacon(&cfg.BeaconCommand, func() error { return cfg.Validate() }),
		run:     measure(&cfg, &cfg.Logger, bench.RunHealth),
	})
}
