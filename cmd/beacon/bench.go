package main

import (
	"context"
	"errors"
	"fmt"
	"io"
	"log/slog"
	"os"
	"runtime/pprof"

	"github.com/beaconplane/beacon/internal/lab/bench"
	"github.com/spf13/cobra"
	"github.com/spf13/pflag"
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

// benchScenario declares one `beacon bench` scenario command. Every
// scenario runs the same way: -o is checked, then prepare completes the
// configuration and refuses bad input (before anything is measured), then
// run measures with the process logger (and a CPU profile, when the
// scenario has --cpuprofile), and what it returns is printed as -o asks: a
// table or JSON.
type benchScenario struct {
	use, short, long string
	// flags declares the scenario's own flags (-o is everyone's).
	flags func(f *pflag.FlagSet)
	// cpuProfile, when set, is the help of a --cpuprofile flag: a CPU
	// profile of the benchmark's process while run measures.
	cpuProfile string
	// prepare, when set, completes the configuration from cmd (its flags,
	// its streams) and checks it.
	prepare func(cmd *cobra.Command) error
	// run measures. A report returned with an error is printed before the
	// error is (a drill that failed half-way).
	run func(ctx context.Context, logger *slog.Logger) (benchReport, error)
}

// addBenchScenario adds s to `beacon bench`.
func addBenchScenario(s benchScenario) *cobra.Command {
	var output, cpuProfile string
	cmd := &cobra.Command{
		Use:   s.use,
		Short: s.short,
		Long:  s.long,
		Args:  cobra.NoArgs,
		RunE: func(cmd *cobra.Command, _ []string) error {
			// Bad input fails at once, not after a minute of measuring.
			if err := checkBenchOutput(output); err != nil {
				return err
			}
			if s.prepare != nil {
				if err := s.prepare(cmd); err != nil {
					return err
				}
			}
			logger, err := newLogger(cmd.ErrOrStderr())
			if err != nil {
				return err
			}
			stop, err := startCPUProfile(cpuProfile)
			if err != nil {
				return err
			}
			defer stop()
			r, err := s.run(cmd.Context(), logger)
			if r != nil {
				if werr := writeBenchReport(cmd, output, r); werr != nil {
					return werr
				}
			}
			return benchError(cmd.Context(), err, r != nil)
		},
	}
	f := cmd.Flags()
	s.flags(f)
	f.StringVarP(&output, "output", "o", "table", "table or json")
	if s.cpuProfile != "" {
		f.StringVar(&cpuProfile, "cpuprofile", "", s.cpuProfile)
	}
	benchCmd.AddCommand(cmd)
	return cmd
}

// measure is the run of a scenario configured by *cfg: it gives the
// configuration the process logger (in *logger, a field of *cfg) and
// measures with runFn. An error comes without a report.
func measure[C any](cfg *C, logger **slog.Logger, runFn func(context.Context, C) (*bench.Report, error)) func(context.Context, *slog.Logger) (benchReport, error) {
	return func(ctx context.Context, l *slog.Logger) (benchReport, error) {
		*logger = l
		r, err := runFn(ctx, *cfg)
		if err != nil {
			return nil, err
		}
		return r, nil
	}
}

// prepareBeacon is the prepare of a scenario that runs this binary (with
// args) as processes of its own: it sets *command to run it, then checks
// the configuration with validate.
func prepareBeacon(command *[]string, validate func() error, args ...string) func(*cobra.Command) error {
	return func(*cobra.Command) error {
		var err error
		if *command, err = beaconCommand(args...); err != nil {
			return err
		}
		return usage(validate())
	}
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

// checkPeer checks, when a scenario uses it, the peer program given by its
// flag (path), so that a wrong path fails before any measuring; an empty
// path is looked up when the scenario runs.
func checkPeer(p bench.Peer, path string, used bool) error {
	if path == "" || !used {
		return nil
	}
	if _, err := p.Find(path); err != nil {
		return usage(err)
	}
	return nil
}

// beaconCommand returns the command line that runs this beacon binary with
// args: what the scenarios that start beacon processes (serve, proxy) run.
func beaconCommand(args ...string) ([]string, error) {
	exe, err := os.Executable()
	if err != nil {
		return nil, fmt.Errorf("find the beacon binary to run: %w", err)
	}
	return append([]string{exe}, args...), nil
}

// benchError is what a scenario's error says to the user: bad usage for
// sizes that do not fit (refused before anything started), the interrupt
// for a call that an interrupt cut short.
func benchError(ctx context.Context, err error, reported bool) error {
	switch {
	case errors.Is(err, bench.ErrTooBig):
		return usage(err)
	case err != nil && ctx.Err() != nil && reported:
		return errors.New("bench interrupted: the report above is partial; what the run made was removed (a removal that failed is logged above)")
	case err != nil && ctx.Err() != nil:
		return errors.New("bench interrupted: nothing measured; what the run made was removed (a removal that failed is logged above)")
	}
	return err
}
