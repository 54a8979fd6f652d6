package main

import (
	"time"

	"github.com/beaconplane/beacon/internal/lab/bench"
	"github.com/spf13/cobra"
	"github.com/spf13/pflag"
)

func init() {
	var cfg bench.ProxyConfig
	addBenchScenario(benchScenario{
		use:   "proxy",
		short: "Beacon's proxy vs etcd's grpc-proxy vs direct: ranges, puts, watch fan-out and latency, CPU per op",
		long: `Runs, in one run, the same etcd traffic straight to etcd ("direct"), through
Beacon's proxy (a ` + "`beacon proxy`" + ` process) and through etcd's own grpc-proxy
(an ` + "`etcd grpc-proxy start`" + ` process), in front of the same etcd (a cluster of
--members members on loopback, started in this process the way beacon serve
starts etcd, or --endpoints), the sides in turn for --rounds rounds:

  - range (linearizable and serializable) and put throughput with p50 and p99
    latency, and each proxy's CPU per request (from /proc);
  - --watches identical watches on one key over --streams connections (raw
    etcd watch streams, many watches each, read without clientv3): a burst
    of --burst-puts puts (events per second delivered, CPU per event, events
    lost, memory), then --latency-puts at --latency-rate per second (delivery
    latency p50, p99).

With --proxies K each proxy side is a tier of K processes, each with its
own etcd watch, the streams spread evenly over them (--streams a multiple
of K); CPU and memory are the tier's sums.

Every figure is the median of the rounds, with the spread; ratios are Beacon
over direct and over etcd's grpc-proxy. Goals against the grpc-proxy:
serializable range and fan-out >= 1.0x, CPU per event and delivery p99
<= 1.0x.

etcd's grpc-proxy is run from an etcd 3.7 binary: --etcd-bin, or "etcd" in
$BEACON_PEERS_DIR/bin (default ~/.cache/beacon-peers/bin) or PATH; build it
with "go build -o ~/.cache/beacon-peers/bin/etcd ./internal/lab/etcd" from a
Beacon checkout, or leave it out with --no-grpc-proxy. An interrupt (Ctrl-C)
stops both proxies and etcd and removes the keys written.`,
		flags: func(f *pflag.FlagSet) {
			f.StringSliceVar(&cfg.Endpoints, "endpoints", nil, "etcd client URLs to measure against (default: a cluster started by the benchmark)")
			f.IntVar(&cfg.Members, "members", 3, "members of the benchmark's etcd cluster")
			f.BoolVar(&cfg.Fsync, "fsync", true, "the members fsync their WAL like production etcd (--fsync=false: in-memory speed, the proxies' worst case)")
			f.IntVar(&cfg.Rounds, "rounds", 3, "rounds, the sides in turn (the median is shown with the spread)")
			f.DurationVar(&cfg.Duration, "duration", 2*time.Second, "length of each load phase, per side and round")
			f.IntVar(&cfg.Clients, "clients", 16, "concurrent workers")
			f.IntVar(&cfg.Conns, "conns", 4, "client connections the workers share")
			f.IntVar(&cfg.Watches, "watches", 1000, "identical watches to open")
			f.IntVar(&cfg.Streams, "streams", 10, "connections (one watch stream each) the watches are spread over")
			f.IntVar(&cfg.Proxies, "proxies", 1, "proxy processes per proxy side (a tier; each holds its own etcd watch), the streams spread evenly over them")
			f.IntVar(&cfg.BurstPuts, "burst-puts", 400, "puts of the burst, as fast as 4 writers can")
			f.IntVar(&cfg.LatencyPuts, "latency-puts", 100, "puts of the latency measurement")
			f.IntVar(&cfg.LatencyRate, "latency-rate", 50, "puts per second of the latency measurement")
			f.IntVar(&cfg.ValueSize, "value-size", 256, "bytes per value put")
			f.StringVar(&cfg.EtcdBin, "etcd-bin", "", "etcd 3.7 binary whose grpc-proxy is measured (default: found in $BEACON_PEERS_DIR/bin or PATH)")
			f.BoolVar(&cfg.ProxyPprof, "proxy-pprof", false, "run Beacon's proxies with --pprof: their profiles under /debug/pprof/ on the addresses logged as they start")
			f.BoolVar(&cfg.NoGRPCProxy, "no-grpc-proxy", false, "leave etcd's grpc-proxy out (no etcd binary needed)")
		},
		cpuProfile: "write a CPU profile of the benchmark's process (clients and etcd; the proxies have --pprof) to this file",
		prepare: func(*cobra.Command) error {
			var err error
			if cfg.BeaconCommand, err = beaconCommand("proxy"); err != nil {
				return err
			}
			if err := cfg.Validate(); err != nil {
				return usage(err)
			}
			return checkPeer(bench.EtcdPeer, cfg.EtcdBin, !cfg.NoGRPCProxy)
		},
		run: measure(&cfg, &cfg.Logger, bench.RunProxy),
	})
}
