package main

import (
	"context"
	"log/slog"
	"os/exec"

	"github.com/beaconplane/beacon/internal/lab/bench"
	"github.com/spf13/cobra"
	"github.com/spf13/pflag"
)

// clusterHelp is the help of beacon bench cluster.
const clusterHelp = `Runs the registry at size on the cluster users run: --members "beacon serve"
processes (this binary, embedded etcd 3.7 with fsync) in network namespaces of
their own (with --net auto, when this process may make them: root and
iproute2; otherwise on loopback, said in the setup line), joined by a
discovery token.

  1. --watchers watchers open, spread over the --services services and the
     members (watcher w follows service w % services through member
     (w / services) % members), each with a client of its own per member.
  2. --instances instances are registered, spread over the services, by
     --sessions sessions (a client and a lease each) from --workers
     concurrent registrations, in --rounds rounds. After (or before, in
     turn) each round, etcd's ceiling for the same operation — a compare-
     on-create and a put under a lease per key, from a raw client, in the
     transaction width that writes fastest — writes --ceiling keys on the
     same cluster and revokes them. Beacon's instances stay resident. Each
     phase starts once every watcher has had a sentinel written after the
     last one (one instance per service, then revoked), so that a round's
     latencies are its own, not the backlog of the phase before.
  3. --kill-instances more are registered, and a third of the way in the
     member --kill names (follower or leader) is SIGKILLed. Then every
     watcher must have every instance that registered (goal: none missing).

Reported: registrations/s and register p50/p99 against the same-op ceiling
(goal 0.8x) and against Nacos 2.0's published figure (26,784/s, p99 30.62 ms,
on 3 x 8 cores: other hardware, said so); the members' CPU per registration;
register -> watcher p50/p99 (from the call to Register to the watcher's
batch; goal p99 <= 100 ms); registrations refused and instances missed while
the member was killed; instances resident at the end; every process's
resident memory.

The default (30,000 instances, 300 services, 900 watchers) takes about a
minute on 2 cores. The full size:

  beacon bench cluster --instances 1000000 --watchers 30000

A size that does not fit this machine's memory is refused before anything
starts, with what it would need. Every process, namespace and directory the
run made is removed at its end, also after an error or an interrupt.`

func init() {
	cfg := bench.ClusterConfig{Self: func(args ...string) *exec.Cmd { return selfCommand(args...) }}
	addBenchScenario(benchScenario{
		use:        "cluster",
		short:      "1M instances on a 3-member beacon serve cluster: registrations/s, watchers, a member SIGKILLed under load",
		long:       clusterHelp,
		cpuProfile: "write a CPU profile of this process (the sessions and the watchers) to this file",
		flags: func(f *pflag.FlagSet) {
			f.IntVar(&cfg.Members, "members", 3, "beacon serve members (odd)")
			f.IntVar(&cfg.Instances, "instances", 30_000, "instances registered and left resident")
			f.IntVar(&cfg.Services, "services", 0, "services (components) the instances spread over (default instances / 100)")
			f.IntVar(&cfg.Sessions, "sessions", 10, "registering sessions, each a client and a lease")
			f.IntVar(&cfg.Workers, "workers", 100, "concurrent registrations over all sessions")
			f.IntVar(&cfg.Watchers, "watchers", 0, "watchers, spread over the services and members (default 3 per service)")
			f.IntVar(&cfg.Rounds, "rounds", 4, "rounds the registrations are split into, each beside a ceiling round")
			f.IntVar(&cfg.Ceiling, "ceiling", 0, "keys each same-op ceiling round writes (default instances / rounds, at most 100,000)")
			f.StringVar(&cfg.Kill, "kill", bench.KillFollower, "member SIGKILLed under load: follower, leader or none")
			f.IntVar(&cfg.KillInstances, "kill-instances", 0, "registrations while the member is killed (default instances / 10)")
			f.StringVar(&cfg.Network, "net", bench.DrillNetAuto, "auto, netns (members in network namespaces: root, iproute2) or loopback")
			f.StringVar(&cfg.Dir, "dir", "", "keep the members' data and logs here (default: a temporary directory, removed)")
		},
		prepare: func(*cobra.Command) error { return usage(cfg.Validate()) },
		run: func(ctx context.Context, logger *slog.Logger) (benchReport, error) {
			cfg.Logger = logger
			r, err := bench.RunCluster(ctx, cfg)
			if r == nil {
				return nil, err
			}
			return r, err
		},
	})
}
