package file

import (
	"cmp"
	"errors"
	"fmt"
	"log/slog"
	"os"
	"strconv"
	"time"
)

// Environment variables read by ConfigFromEnv.
const (
	// EnvDir names the store directory.
	EnvDir = "BEACON_FILE_DIR"
	// EnvHistory sets Config.History (a number of revisions).
	EnvHistory = "BEACON_FILE_HISTORY"
	// EnvHistoryBytes sets Config.HistoryBytes (a number of bytes).
	EnvHistoryBytes = "BEACON_FILE_HISTORY_BYTES"
)

// Defaults for the zero values of Config.
const (
	DefaultHistory      = 10_000
	DefaultHistoryBytes = 32 << 20 // 32 MiB
	DefaultPollInterval = 50 * time.Millisecond
	DefaultReapInterval = 250 * time.Millisecond
	// safetyPoll is how often the log is checked even when filesystem
	// notifications work, in case one is missed.
	safetyPoll = time.Second
)

// Config configures a file store. Only Dir is required.
type Config struct {
	// Dir is the store directory, shared by every process on the host
	// that uses the store. It is created if missing (unless MustExist); an
	// existing directory must be empty or hold a Beacon store.
	Dir string
	// History is how many recent revisions watches can resume from;
	// older ones are compacted (the log is truncated). Zero means
	// DefaultHistory.
	History int
	// HistoryBytes bounds the same history by what its events weigh in
	// memory (keys, values and about 72 bytes each), as History bounds it
	// in revisions; the tighter bound decides. A revision can hold many
	// events (a transaction, the end of a lease), so this is the bound on
	// every process's memory. Zero means DefaultHistoryBytes.
	HistoryBytes int64
	// PollInterval is how often the log is polled for other processes'
	// writes when filesystem notifications are unavailable or disabled.
	// Zero means DefaultPollInterval.
	PollInterval time.Duration
	// ReapInterval is how often the store looks for expired leases (of
	// any process) to delete their keys. Zero means DefaultReapInterval.
	ReapInterval time.Duration
	// DisableNotify turns off filesystem notifications (inotify) and
	// polls instead.
	DisableNotify bool
	// MustExist makes Open fail, with an error matching ErrNoStore, when
	// Dir does not exist or holds no store yet, instead of creating one:
	// for programs that only read (beacon ls, beacon watch), so that a
	// mistyped directory is an error rather than an empty listing and a
	// new directory.
	MustExist bool
	// Logger receives warnings about recovery actions (a torn log tail
	// repaired, stale temporary files removed), a directory replaced under
	// the process and re-opened, a long wait for a lock, and a log
	// truncated under the process. Nil discards them.
	Logger *slog.Logger

	envErr error // a bad environment variable, reported by Validate
}

// Validate checks the configuration.
func (c Config) Validate() error {
	errs := []error{c.envErr}
	if c.Dir == "" {
		errs = append(errs, fmt.Errorf("file: no store directory: set %s or Config.Dir", EnvDir))
	}
	if c.History < 0 {
		errs = append(errs, fmt.Errorf("file: History %d is negative", c.History))
	}
	if c.HistoryBytes < 0 {
		errs = append(errs, fmt.Errorf("file: HistoryBytes %d is negative", c.HistoryBytes))
	}
	if c.PollInterval < 0 || c.ReapInterval < 0 {
		errs = append(errs, fmt.Errorf("file: PollInterval and ReapInterval must not be negative"))
	}
	return errors.Join(errs...)
}

func (c Config) withDefaults() Config {
	c.History = cmp.Or(c.History, DefaultHistory)
	c.HistoryBytes = cmp.Or(c.HistoryBytes, DefaultHistoryBytes)
	c.PollInterval = cmp.Or(c.PollInterval, DefaultPollInterval)
	c.ReapInterval = cmp.Or(c.ReapInterval, DefaultReapInterval)
	c.Logger = cmp.Or(c.Logger, slog.New(slog.DiscardHandler))
	return c
}

// ConfigFromEnv reads BEACON_FILE_DIR, BEACON_FILE_HISTORY and
// BEACON_FILE_HISTORY_BYTES and validates the result. The configuration is
// returned even when it is invalid; its Validate reports the same error.
func ConfigFromEnv() (Config, error) {
	c := Config{Dir: os.Getenv(EnvDir)}
	var errs []error
	history, err := positiveEnv(EnvHistory, "revisions")
	errs = append(errs, err)
	c.History = int(history)
	c.HistoryBytes, err = positiveEnv(EnvHistoryBytes, "bytes")
	errs = append(errs, err)
	c.envErr = errors.Join(errs...)
	return c, c.Validate()
}

// positiveEnv reads the environment variable name as a positive number of
// unit: 0 when it is unset, or an error that names it.
func positiveEnv(name, unit string) (int64, error) {
	v := os.Getenv(name)
	if v == "" {
		return 0, nil
	}
	n, err := strconv.ParseInt(v, 10, strconv.IntSize)
	if err != nil || n <= 0 {
		return 0, fmt.Errorf("file: %s=%q: want a positive number of %s", name, v, unit)
	}
	return n, nil
}
