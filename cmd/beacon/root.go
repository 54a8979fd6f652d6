package main

import (
	"fmt"
	"io"
	"log/slog"
	"os"

	"github.com/spf13/cobra"
)

// rootCmd is the beacon command. Each subcommand lives in its own file and
// adds itself from an init function.
var rootCmd = &cobra.Command{
	Use:   "beacon",
	Short: "Beacon: a discovery plane for distributed systems",
	Long: `Beacon lets the components of a distributed system find each other: a service
registry with leases and watches, etcd-compatible cluster bootstrap, gRPC naming,
an etcd proxy, and a server that runs it all on embedded etcd.

Flags override environment variables; each command's --help lists both.`,
	SilenceUsage:  true,
	SilenceErrors: true,
}

var logLevel string

func init() {
	rootCmd.PersistentFlags().StringVar(&logLevel, "log-level", envOr("BEACON_LOG_LEVEL", "info"),
		"log level: debug, info, warn or error (env BEACON_LOG_LEVEL)")
}

// newLogger returns the process logger, writing text to w.
func newLogger(w io.Writer) (*slog.Logger, error) {
	var level slog.Level
	if err := level.UnmarshalText([]byte(logLevel)); err != nil {
		return nil, fmt.Errorf("--log-level %q: must be debug, info, warn or error", logLevel)
	}
	return slog.New(slog.NewTextHandler(w, &slog.HandlerOptions{Level: level})), nil
}

// envOr returns the environment variable or def when it is unset or empty.
func envOr(name, def string) string {
	if v := os.Getenv(name); v != "" {
		return v
	}
	return def
}
