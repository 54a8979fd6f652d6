package main

import (
	"github.com/spf13/cobra"
)

// benchCmd is `beacon bench`. Each scenario is a subcommand in its own file
// (bench_<scenario>.go) that adds itself to benchCmd from an init function,
// with its logic in package bench.
var benchCmd = &cobra.Command{
	Use:   "bench",
	Short: "Run benchmark scenarios, each beside its raw etcd client baseline",
	Long: `Each scenario runs Beacon and the equivalent raw etcd client code in the same
run, against the same embedded etcd (or --endpoints), and prints a table with
the ratio of the two. Defaults finish in about a minute on 2 cores; flags make
runs larger.`,
}

func init() { rootCmd.AddCommand(benchCmd) }
