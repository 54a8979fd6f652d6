package main

import (
	"context"
	"time"

	"github.com/beaconplane/beacon/internal/lab/bench"
	"github.com/spf13/cobra"
	"github.com/spf13/pflag"
)

// The registry scenarios: `beacon bench register | watch | failover |
// memory`, each beside its raw etcd client baseline.
func init() {
	addRegistryScenario("register", "Registrations/s: one Beacon session vs etcd's ceiling for the same operation, txn-put and raw grant + put",
		`Registers --instances instances with each number of --concurrency workers,
then --sequential with one worker, through Beacon's registry (one session: one
lease for all, concurrent registrations batched into transactions), and
measures beside it, against the same etcd member, in rounds that take the sides
in turn, with as many keys in flight as workers and keys and values of the same
sizes:
  same-op ceiling   a raw clientv3 client writing Beacon's operation (per key, a
                    compare that it does not exist and a put under one lease) in
                    transactions of the width etcd commits fastest (Beacon's own
                    and 16 to 128 keys, each tried once before the rounds;
                    --batch to choose)
  txn-put ceiling   etcd's own benchmark tool, txn-put: plain puts, widths chosen
                    the same way
  raw grant+put     the raw etcd client: grant a lease + put, per instance
It prints the medians of --rounds rounds with their spread, and p50/p99 latency.
Goal: at least 0.8x the same-op ceiling.

etcd's benchmark tool is found with --benchmark-bin, in
$BEACON_PEERS_DIR/bin (default ~/.cache/beacon-peers/bin) or in PATH; build
it with "bash .ci/build-peers benchmark" from a Beacon checkout, or skip the
txn-put ceiling with --no-ceiling. Against --endpoints that ceiling is skipped
(the tool writes keys it cannot remove).`,
		bench.RunRegister, func(f *pflag.FlagSet, cfg *bench.RegistryConfig) {
			f.IntVar(&cfg.Instances, "instances", 20000, "instances registered per round by the concurrent workers")
			f.IntVar(&cfg.Rounds, "rounds", 3, "rounds taking the sides in turn (the median is shown, with the spread)")
			f.IntSliceVar(&cfg.Concurrency, "concurrency", []int{64, 256}, "numbers of concurrent workers to measure")
			f.IntVar(&cfg.Sequential, "sequential", 300, "instances registered by one worker")
			f.IntVar(&cfg.Batch, "batch", 0, "keys per transaction of both ceilings (for txn-put, --txn-ops; default: the fastest of Beacon's batch for that many workers and 16, 32, 48, 64, 128 up to one per worker, each tried once before the rounds)")
			f.StringVar(&cfg.BenchmarkBin, "benchmark-bin", "", "path of etcd's benchmark tool (default: found in $BEACON_PEERS_DIR/bin or PATH)")
			f.BoolVar(&cfg.NoCeiling, "no-ceiling", false, "do not measure the txn-put ceiling (no etcd benchmark tool needed; the same-op ceiling is measured all the same)")
		})
	addRegistryScenario("watch", "Register → watcher latency with 1, 100, 1000 watchers: one shared watch vs one etcd watch each",
		`For each watcher count, opens that many Beacon watchers of one query in one
process (sharing one etcd watch) and as many raw etcd watches (one client) in
another, each side a child process of its own (this binary, re-executed), then
registers --samples instances one at a time from this process, alternating
Beacon and raw, and measures the time from each write until every watcher has
it (p50, p99). It also counts the etcd server's watchers
(etcd_debugging_mvcc_watcher_total): Beacon must add exactly one; and reads
each watcher process's CPU time per change and its resident memory. Goal:
Beacon's latency at most 1.0x the raw one.`,
		bench.RunWatch, func(f *pflag.FlagSet, cfg *bench.RegistryConfig) {
			f.IntSliceVar(&cfg.Watchers, "watchers", []int{1, 100, 1000}, "watcher counts to measure")
			f.IntVar(&cfg.Samples, "samples", 300, "registrations measured per watcher count")
			f.StringVar(&cfg.WatchProfileDir, "profile-dir", "", "write CPU and allocation profiles of each side's watcher process (beacon.cpu, beacon.allocs, raw.cpu, raw.allocs; the last round's) to this existing directory")
		})
	addRegistryScenario("failover", "SIGKILL → removal observed: beacon register children vs raw keep-alive children",
		`Starts --children "beacon register" processes and as many raw etcd client
processes (grant + put + keep-alive), each holding one instance with a --ttl
lease, waits 1.5 TTL (any removal then is a false removal), kills them all with
SIGKILL and measures when a watcher sees each instance go: TTL + x. Goal: p99
at most TTL + 1 s, no false removal.`,
		bench.RunFailover, func(f *pflag.FlagSet, cfg *bench.RegistryConfig) {
			f.IntVar(&cfg.Children, "children", 10, "registrant processes per side")
			f.DurationVar(&cfg.TTL, "ttl", 2*time.Second, "lease TTL of the registrants (etcd's minimum is 2s)")
		})
	addRegistryScenario("memory", "Server memory per registered instance, client memory per watcher",
		`Measures the heap (after GC) of an etcd server running in a child process
before and after registering --mem-instances instances through Beacon (one
lease) and with the raw client (one lease each), this process's heap and
resident memory (after returning free memory to the OS) per registration it
keeps alive, and its heap before and after opening --mem-watchers watchers
(Beacon: one shared etcd watch; raw: one etcd watch each). Use
--mem-instances 100000 for the large run.`,
		bench.RunMemory, func(f *pflag.FlagSet, cfg *bench.RegistryConfig) {
			f.IntVar(&cfg.MemInstances, "mem-instances", 10_000, "instances registered per side")
			f.IntVar(&cfg.MemWatchers, "mem-watchers", 10_000, "watchers opened per side")
		})
}

func addRegistryScenario(name, short, long string, runFn func(ctx context.Context, cfg bench.RegistryConfig) (*bench.Report, error),
	flags func(*pflag.FlagSet, *bench.RegistryConfig)) {
	var cfg bench.RegistryConfig
	addBenchScenario(benchScenario{
		use:   name,
		short: short,
		long:  long + "\n\nBy default it starts its own single-node etcd in a child process (with fsync, like production; --no-fsync without); --endpoints measures an existing one. An interrupt (Ctrl-C) stops it cleanly: leases revoked, child processes stopped, data removed.",
		flags: func(f *pflag.FlagSet) {
			f.StringSliceVar(&cfg.Endpoints, "endpoints", nil, "etcd client URLs to measure against (default: an embedded etcd)")
			f.BoolVar(&cfg.NoFsync, "no-fsync", false, "run the scenario's etcd without fsync")
			flags(f, &cfg)
		},
		cpuProfile: "write a CPU profile of the benchmark's own process (its clients; etcd and the watch scenario's watchers run in processes of their own: see bench watch --profile-dir) to this file",
		prepare: func(*cobra.Command) error {
			if err := cfg.Validate(); err != nil {
				return usage(err)
			}
			return checkPeer(bench.BenchmarkPeer, cfg.BenchmarkBin, !cfg.NoCeiling)
		},
		run: measure(&cfg, &cfg.Logger, runFn),
	})
}

// Hidden helpers the scenarios run as child processes.
func init() {
	var (
		endpoints []string
		key, val  string
		ttl       time.Duration
		noFsync   bool
	)
	raw := &cobra.Command{
		Use:    "raw-registrant",
		Short:  "Child of bench failover: a raw etcd client holding one key under a kept-alive lease",
		Hidden: true,
		Args:   cobra.NoArgs,
		RunE: func(cmd *cobra.Command, _ []string) error {
			return bench.RunRawRegistrant(cmd.Context(), endpoints, key, val, ttl, cmd.InOrStdin(), cmd.OutOrStdout())
		},
	}
	raw.Flags().StringSliceVar(&endpoints, "endpoints", nil, "etcd endpoints")
	raw.Flags().StringVar(&key, "key", "", "key to hold")
	raw.Flags().StringVar(&val, "value", "", "value to hold")
	raw.Flags().DurationVar(&ttl, "ttl", 2*time.Second, "lease TTL")
	srv := &cobra.Command{
		Use:    "etcd-server",
		Short:  "Child of bench memory: an embedded etcd alone in its process, reporting its heap",
		Hidden: true,
		Args:   cobra.NoArgs,
		RunE: func(cmd *cobra.Command, _ []string) error {
			return bench.RunEtcdServerChild(cmd.Context(), noFsync, cmd.InOrStdin(), cmd.OutOrStdout())
		},
	}
	srv.Flags().BoolVar(&noFsync, "no-fsync", false, "run without fsync")
	benchCmd.AddCommand(raw, srv, watchWatchersCommand())
}

// watchWatchersCommand is the child of bench watch that runs one side's
// watchers.
func watchWatchersCommand() *cobra.Command {
	var cfg bench.WatchChildConfig
	cmd := &cobra.Command{
		Use:    "watch-watchers",
		Short:  "Child of bench watch: one side's watchers in a process of their own, reporting when each had each sample",
		Hidden: true,
		Args:   cobra.NoArgs,
		RunE: func(cmd *cobra.Command, _ []string) error {
			return bench.RunWatchChild(cmd.Context(), cfg, cmd.InOrStdin(), cmd.OutOrStdout())
		},
	}
	f := cmd.Flags()
	f.StringVar(&cfg.Side, "side", "", "beacon or raw")
	f.StringSliceVar(&cfg.Endpoints, "endpoints", nil, "etcd endpoints")
	f.StringVar(&cfg.Namespace, "namespace", "", "the samples' namespace")
	f.IntVar(&cfg.Watchers, "watchers", 0, "watchers to open")
	f.IntVar(&cfg.Samples, "samples", 0, "samples to expect")
	f.StringVar(&cfg.ProfileDir, "profile-dir", "", "write <side>.cpu and <side>.allocs profiles here")
	return cmd
}
