package main

import (
	"io"
	"os"
	"runtime/pprof"

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

// benchReport is what a scenario prints.
type benchReport interface {
	WriteJSON(io.Writer) error
	WriteTable(io.Writer) error
}

// checkBenchOutput refuses an output format no scenario prints, before any
// measuring starts.
func checkBenchOutput(output string) error {
	if output != "table" && output != "json" {
		return usagef("-o %q: want table or json", output)
	}
	return nil
}

// writeBenchReport prints r as -o asks.
func writeBenchReport(cmd *cobra.Command, output string, r benchReport) error {
	if output == "json" {
		return r.WriteJSON(cmd.OutOrStdout())
	}
	return r.WriteTable(cmd.OutOrStdout())
}

// startCPUProfile writes a CPU profile of this process to path until stop
// is called; with no path it does nothing.
func startCPUProfile(path string) (stop func(), err error) {
	if path == "" {
		return func() {}, nil
	}
	f, err := os.Create(path)
	if err != nil {
		return nil, err
	}
	if err := pprof.StartCPUProfile(f); err != nil {
		_ = f.Close()
		return nil, err
	}
	return func() {
		pprof.StopCPUProfile()
		_ = f.Close()
	}, nil
}
