package main

import (
	"fmt"
	"os"
	"runtime/pprof"
	"time"

	"github.com/beaconplane/beacon/bench"
	"github.com/spf13/cobra"
)

func init() {
	var (
		cfg        bench.ProxyConfig
		output     string
		cpuProfile string
		inProcess  bool
	)
	cmd := &cobra.Command{
		Use:   "proxy",
		Short: "Proxy vs direct: range/put throughput and latency, 1,000 watches → 1 etcd watch",
		Long: `Runs a readwrite ` + "`beacon proxy`" + ` process (as deployed; --in-process runs it inside
the benchmark) in front of etcd (an embedded cluster of --members members on
loopback, or --endpoints) and measures, in one run, the same load straight to
etcd and through the proxy: range and put throughput with p50 and
p99 latency (goals: >= 0.8x throughput, <= 1.3x p50), then --watches identical
watches on one key (direct: one etcd watch each; through the proxy: they share
one), with the heap they hold and the time one event takes to reach them all.`,
		Args: cobra.NoArgs,
		RunE: func(cmd *cobra.Command, _ []string) error {
			logger, err := newLogger(cmd.ErrOrStderr())
			if err != nil {
				return err
			}
			cfg.Logger = logger
			if cpuProfile != "" {
				f, err := os.Create(cpuProfile)
				if err != nil {
					return err
				}
				defer f.Close()
				if err := pprof.StartCPUProfile(f); err != nil {
					return err
				}
				defer pprof.StopCPUProfile()
			}
			if !inProcess {
				exe, err := os.Executable()
				if err != nil {
					return fmt.Errorf("find the beacon binary to run the proxy: %w (or use --in-process)", err)
				}
				cfg.ProxyCommand = []string{exe, "proxy"}
			}
			r, err := bench.RunProxy(cmd.Context(), cfg)
			if err != nil {
				return err
			}
			switch output {
			case "json":
				return r.WriteJSON(cmd.OutOrStdout())
			case "", "table":
				return r.WriteTable(cmd.OutOrStdout())
			}
			return usagef("-o %q: want table or json", output)
		},
	}
	f := cmd.Flags()
	f.StringSliceVar(&cfg.Endpoints, "endpoints", nil, "etcd client URLs to measure against (default: an embedded etcd)")
	f.IntVar(&cfg.Members, "members", 3, "members of the embedded etcd cluster")
	f.BoolVar(&cfg.Fsync, "fsync", true, "embedded members fsync their WAL like production etcd (--fsync=false: in-memory etcd, the proxy's worst case)")
	f.DurationVar(&cfg.Duration, "duration", 4*time.Second, "length of each of the four load phases")
	f.IntVar(&cfg.Clients, "clients", 16, "concurrent workers")
	f.IntVar(&cfg.Conns, "conns", 4, "client connections the workers share")
	f.IntVar(&cfg.Watches, "watches", 1000, "identical watches to open")
	f.IntVar(&cfg.ValueSize, "value-size", 256, "bytes per value put")
	f.StringVarP(&output, "output", "o", "table", "table or json")
	f.BoolVar(&inProcess, "in-process", false, "run the proxy inside the benchmark process instead of as its own `beacon proxy` process")
	f.StringVar(&cpuProfile, "cpuprofile", "", "write a CPU profile of the whole run (proxy, clients and embedded etcd) to this file")
	benchCmd.AddCommand(cmd)
}
