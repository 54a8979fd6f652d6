package main

import (
	"github.com/beaconplane/beacon/internal/lab/bench"
	"github.com/spf13/cobra"
)

func init() {
	var (
		cfg    bench.BootstrapConfig
		output string
	)
	cmd := &cobra.Command{
		Use:   "bootstrap",
		Short: "Cluster discovery through Beacon vs etcd's own discovery client, for 3, 5 and 7 members",
		Long: `Bootstraps clusters of --sizes members through one discovery registry (an
embedded etcd, or --endpoints, e.g. a running beacon serve), alternating
Beacon (token from bootstrap.CreateToken, members running bootstrap.Join) and
the baseline (size key from a plain etcd put, members running etcd 3.7.3's own
v3discovery.JoinCluster). For each size it reports the time from the start of
the last member until every member has its initial cluster (goal: Beacon
<= 1.1x etcd at p50). Members are in-process discovery clients, each with its
own connection; no etcd member is started.`,
		Args: cobra.NoArgs,
		RunE: func(cmd *cobra.Command, _ []string) error {
			if err := checkBenchOutput(output); err != nil {
				return err
			}
			logger, err := newLogger(cmd.ErrOrStderr())
			if err != nil {
				return err
			}
			cfg.Logger = logger
			r, err := bench.RunBootstrap(cmd.Context(), cfg)
			if err != nil {
				return err
			}
			return writeBenchReport(cmd, output, r)
		},
	}
	f := cmd.Flags()
	f.StringSliceVar(&cfg.Endpoints, "endpoints", nil, "discovery registry client URLs (default: an embedded etcd)")
	f.IntSliceVar(&cfg.Sizes, "sizes", []int{3, 5, 7}, "cluster sizes to bootstrap")
	f.IntVar(&cfg.Rounds, "rounds", 15, "clusters of each size per side")
	f.StringVarP(&output, "output", "o", "table", "table or json")
	benchCmd.AddCommand(cmd)
}
