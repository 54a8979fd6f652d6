package main

import (
	"io"
	"log/slog"

	"github.com/beaconplane/beacon/registry/kube"
	"github.com/spf13/cobra"
)

// Environment variables of the logging flags.
const (
	envLogLevel  = "BEACON_LOG_LEVEL"
	envLogFormat = "BEACON_LOG_FORMAT"
)

// The process's logging settings, checked by preRun before any command
// runs.
var (
	logLevel  string
	logFormat string
	// logLevelValue is the checked level.
	logLevelValue slog.Level
)

func addLogFlags(c *cobra.Command) {
	f := c.PersistentFlags()
	f.StringVar(&logLevel, "log-level", "info", "log level: debug, info, warn or error (env "+envLogLevel+")")
	f.StringVar(&logFormat, "log-format", "text", "log format on stderr: text or json, one object per line (env "+envLogFormat+")")
}

// preRun runs before every command: it checks the settings every command
// shares, so that a bad one fails at once whatever the command.
func preRun(c *cobra.Command, _ []string) error {
	if err := checkEmptyFlags(c); err != nil { // cli.go
		return err
	}
	if err := checkZeroFlags(c); err != nil { // cli.go
		return err
	}
	if err := checkLogSettings(c); err != nil {
		return err
	}
	return applyWriteOutEnv(c) // cli.go
}

// checkLogSettings checks --log-level and --log-format (or their
// variables), naming whichever was wrong.
func checkLogSettings(c *cobra.Command) error {
	f := c.Flags()
	lvl := lookup(f, "log-level", envLogLevel)
	if err := logLevelValue.UnmarshalText([]byte(lvl.val)); err != nil {
		return usagef("%v: must be debug, info, warn or error", lvl)
	}
	logLevel = lvl.val
	format := lookup(f, "log-format", envLogFormat)
	if format.val != "text" && format.val != "json" {
		return usagef("%v: must be text or json", format)
	}
	logFormat = format.val
	return nil
}

// newLogger returns the process logger, writing to w in the format and at
// the level of --log-format and --log-level (checked before the command
// ran). client-go's own logs go to it too (kube.SetClientLogger).
func newLogger(w io.Writer) (*slog.Logger, error) {
	log, err := formatLogger(w)
	if err == nil {
		kube.SetClientLogger(log)
	}
	return log, err
}

// formatLogger is newLogger's logger.
func formatLogger(w io.Writer) (*slog.Logger, error) {
	var level slog.Level
	if err := level.UnmarshalText([]byte(logLevel)); err != nil {
		return nil, usagef("--log-level %q: must be debug, info, warn or error", logLevel)
	}
	opts := &slog.HandlerOptions{Level: level}
	switch logFormat {
	case "json":
		opts.ReplaceAttr = durationText
		return slog.New(slog.NewJSONHandler(w, opts)), nil
	case "text", "":
		return slog.New(slog.NewTextHandler(w, opts)), nil
	}
	return nil, usagef("--log-format %q: must be text or json", logFormat)
}

// durationText writes durations in JSON logs as the text logs and etcd's
// own JSON logs do ("ttl":"10s"), not as a count of nanoseconds
// ("ttl":10000000000).
func durationText(_ []string, a slog.Attr) slog.Attr {
	if a.Value.Kind() == slog.KindDuration {
		return slog.String(a.Key, a.Value.Duration().String())
	}
	return a
}
