package main

import (
	"fmt"
	"io"
	"log/slog"
	"os"
	"strings"

	"github.com/spf13/cobra"
	"github.com/spf13/pflag"
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

// envList splits a comma-separated environment variable.
func envList(name string, def []string) []string {
	v := os.Getenv(name)
	if v == "" {
		return def
	}
	var out []string
	for _, s := range strings.Split(v, ",") {
		if s = strings.TrimSpace(s); s != "" {
			out = append(out, s)
		}
	}
	return out
}

// flagChanged reports whether the named flag was set on the command line.
func flagChanged(fs *pflag.FlagSet, name string) bool {
	f := fs.Lookup(name)
	return f != nil && f.Changed
}
