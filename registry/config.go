package registry

import (
	"cmp"
	"errors"
	"fmt"
	"log/slog"
	"math"
	"os"
	"regexp"
	"strconv"
	"strings"
	"time"

	"github.com/beaconplane/beacon"
	"github.com/beaconplane/beacon/registry/internal/defaults"
	"github.com/beaconplane/beacon/store"
	"github.com/prometheus/client_golang/prometheus"
)

// Lease TTL bounds and default.
const (
	// DefaultLeaseTTL is the session lease TTL when neither Config.LeaseTTL
	// nor BEACON_LEASE_TTL sets one.
	DefaultLeaseTTL = 10 * time.Second
	// MinLeaseTTL and MaxLeaseTTL bound every lease the registry grants.
	// (etcd raises TTLs below its own minimum, about 2 s, to that minimum.)
	MinLeaseTTL = time.Second
	MaxLeaseTTL = time.Hour
	// MinElectionTTL is the shortest lease TTL that rides out an etcd
	// leader election (etcd's default 1 s election timeout) on every path
	// that keeps a lease alive, including etcd's own client through `beacon
	// proxy`, which gives a lease up by its own clock: a lease's last
	// renewal may be a third of the TTL old when the leader fails, a new
	// leader is elected within two election timeouts, and the keeper must
	// then reach it (docs/registry.md derives it; the lease drills of
	// internal/lab/drill measure it). The registry warns at registration below
	// it.
	MinElectionTTL = 5 * time.Second
	// LeaseTTLEnv names the environment variable ConfigFromEnv reads.
	LeaseTTLEnv = "BEACON_LEASE_TTL"
	// DefaultWatchLinger is how long a shared store watch outlives its last
	// watcher, so that a consumer that reconnects (an SSE client, a gRPC
	// channel) finds it warm and can resume.
	DefaultWatchLinger = 30 * time.Second
	// DefaultHealthPanicThreshold is Config.HealthPanicThreshold's default.
	DefaultHealthPanicThreshold = defaults.HealthPanicThreshold
	// maxRetryCap bounds the default retry backoff.
	maxRetryCap = 5 * time.Second
)

// TTLWarning returns the warning to give about a lease TTL below
// MinElectionTTL ("" for one at or above it): the registry logs it when a
// session takes its lease, `beacon register` prints it, and the HTTP API
// returns it with the registration.
func TTLWarning(ttl time.Duration) string {
	if ttl <= 0 || ttl >= MinElectionTTL {
		return ""
	}
	return fmt.Sprintf("lease TTL %v is below %v, the shortest that rides out an etcd leader election on every path: "+
		"renewals wait up to two election timeouts (2 s) for a new leader, and a keeper that gives a lease up by its own "+
		"clock (etcd's client, an HTTP client that stops heartbeating) may lose it (docs/registry.md, \"Lease TTL and elections\")", ttl, MinElectionTTL)
}

// Config configures a StoreRegistry. The zero value is valid: keys under
// "/services/", a 10 s lease, 4 KiB of metadata, no logs, no metrics.
type Config struct {
	// Root is the keyspace root: "" (keys start with /services/) or a path
	// like "/beacon" (keys start with /beacon/services/).
	Root string
	// Layout is what the registry reads: Beacon's keys (LayoutBeacon, the
	// zero value), or a read-only view of what the NVIDIA Dynamo runtime
	// writes (LayoutDynamo: its v1/instances/ and v1/mdc/ keys, no Root;
	// every write refused with ErrReadOnlyLayout).
	Layout Layout
	// LeaseTTL is the TTL of the session lease, kept alive every TTL/3.
	// Zero means DefaultLeaseTTL; otherwise it must be in [1 s, 1 h].
	LeaseTTL time.Duration
	// MaxMetadataSize bounds an instance's metadata (keys plus values, in
	// bytes). Zero means beacon.DefaultMaxMetadataSize (4 KiB); at most
	// store.MaxValueSize (512 KiB), the most a stored value holds. Larger
	// metadata is refused, never truncated.
	MaxMetadataSize int
	// RetryMax caps the backoff between attempts to recover a lost lease
	// or a broken watch. Zero means min(LeaseTTL/3, 5 s).
	RetryMax time.Duration
	// DrainGrace is how long Drain keeps an instance advertised as
	// draining before removing it, unless the call says otherwise. Zero:
	// remove it as soon as the draining status is written.
	DrainGrace time.Duration
	// VerifyInterval is how often the session checks that the store still
	// holds every registration as written, so that a key deleted or
	// overwritten by someone else (an operator with etcdctl, a buggy tool)
	// is re-registered or reported as a conflict instead of silently
	// missing; an instance someone else marked draining (an operator, see
	// Operator) is not rewritten but adopted as draining
	// (StateChange.Drained). Each check lists the registrations' endpoint
	// prefixes. Zero
	// means every 10 keep-alive intervals (10 × LeaseTTL/3); negative
	// disables the check.
	VerifyInterval time.Duration
	// RemovalHold limits how long a watch holds back the removal of a
	// serving instance that looks like a lease lost by its whole fleet
	// rather than a process gone: one seen shortly after the store came
	// back from an outage, or in a burst (5 or more processes' leases
	// within 250 ms). If the instance is written again meanwhile (its
	// session re-registered it with the same ID), watchers see nothing;
	// otherwise they see the removal when the hold ends. Each removal's
	// hold is its registrant's, not the watcher's: the time a session
	// with the lease TTL its stored value declares takes to notice the
	// loss and re-register — a keep-alive interval, one store call of its
	// recovery lost to a hung server (min(max(TTL/3, 1 s), 5 s)) and 1 s,
	// at most that TTL + 1 s (2 s at TTL 1 s, 3 s at 3 s, 7.7 s at 10 s);
	// an instance whose value declares no TTL is not held. Other removals
	// of serving instances wait 50 ms (to tell a burst), removals of
	// draining instances none. Zero means no further limit; positive
	// shortens every hold to at most RemovalHold (it never lengthens
	// one); negative delivers every removal at once. See
	// docs/operations.md.
	RemovalHold time.Duration
	// HealthPanicThreshold is the share of the checked instances of a
	// priority level of a service (those of one
	// namespace/component/endpoint and one beacon.MetaPriority that declare
	// a Check) that may be failing before the level is in panic: when more
	// than that share are failing, and no other level has an instance that
	// takes work (where clients would go instead), health is ignored for
	// the level, and its failing instances carry
	// Health.Panic and are served anyway (Instance.Serving), rather than
	// all of its traffic going to the few instances left. Zero means
	// DefaultHealthPanicThreshold (0.5: panic once more than half fail);
	// negative never panics; above 1 is refused (no share exceeds it).
	HealthPanicThreshold float64
	// WatchLinger is how long a shared store watch stays open after its
	// last watcher closed. Zero means DefaultWatchLinger; negative means
	// close at once.
	WatchLinger time.Duration
	// Logger receives the registry's logs (lease loss and recovery,
	// conflicts, watch trouble). Nil means discard.
	Logger *slog.Logger
	// Metrics registers the registry's Prometheus collectors. Nil means no
	// metrics. Collectors already registered by another registry on the
	// same Registerer are shared.
	Metrics prometheus.Registerer
}

// ConfigFromEnv returns a Config with LeaseTTL read from BEACON_LEASE_TTL
// (a Go duration such as "10s", or a number of seconds) and Layout from
// BEACON_LAYOUT (beacon or dynamo), or an error naming the variable if one
// is malformed or out of range.
func ConfigFromEnv() (Config, error) {
	var c Config
	l, err := ParseLayout(os.Getenv(LayoutEnv))
	if err != nil {
		return c, fmt.Errorf("%s: %w", LayoutEnv, err)
	}
	c.Layout = l
	v := strings.TrimSpace(os.Getenv(LeaseTTLEnv))
	if v == "" {
		return c, nil
	}
	ttl, err := ParseTTL(v)
	if err != nil {
		return c, fmt.Errorf("%s: %w", LeaseTTLEnv, err)
	}
	c.LeaseTTL = ttl
	return c, nil
}

// ParseTTL parses a lease TTL: a Go duration ("10s", "1m30s") or a whole
// number of seconds ("10"), within [MinLeaseTTL, MaxLeaseTTL]. A number
// or duration too large for a time.Duration is refused as outside the
// range, like any other.
func ParseTTL(s string) (time.Duration, error) {
	var ttl time.Duration
	if n, err := strconv.ParseInt(s, 10, 64); err == nil || errors.Is(err, strconv.ErrRange) {
		if err != nil || n > int64(MaxLeaseTTL/time.Second) || n < 0 {
			return 0, outsideTTL(fmt.Sprintf("%q", s))
		}
		ttl = time.Duration(n) * time.Second
	} else {
		d, err := time.ParseDuration(s)
		switch {
		case err != nil && durationSyntax.MatchString(s):
			return 0, outsideTTL(fmt.Sprintf("%q", s)) // it overflows
		case err != nil:
			return 0, fmt.Errorf("%w: %q is not a duration like 10s or a number of seconds", ErrInvalidTTL, s)
		}
		ttl = d
	}
	if err := ValidateTTL(ttl); err != nil {
		return 0, err
	}
	return ttl, nil
}

// ParseTTLSeconds parses a lease TTL given as a number of seconds in
// JSON's number syntax (possibly fractional or with an exponent: "1.5",
// "15", "1e1"), within [MinLeaseTTL, MaxLeaseTTL]. A number out of that
// range, however large ("1e308", "1e400"), is refused saying so, never
// converted first (it would not fit a time.Duration).
func ParseTTLSeconds(num string) (time.Duration, error) {
	n, err := strconv.ParseFloat(num, 64)
	if err != nil && !errors.Is(err, strconv.ErrRange) {
		return 0, fmt.Errorf("%w: %q is not a number of seconds", ErrInvalidTTL, num)
	}
	if err != nil || !(n >= MinLeaseTTL.Seconds() && n <= MaxLeaseTTL.Seconds()) {
		return 0, outsideTTL(num + " seconds")
	}
	return time.Duration(n * float64(time.Second)), nil
}

// durationSyntax is time.ParseDuration's syntax: a duration that matches
// it but does not parse is too large.
var durationSyntax = regexp.MustCompile(`^[-+]?(([0-9]+(\.[0-9]*)?|\.[0-9]+)(ns|us|µs|μs|ms|s|m|h))+$`)

func outsideTTL(what string) error {
	return fmt.Errorf("%w: %s is outside [%v, %v]", ErrInvalidTTL, what, MinLeaseTTL, MaxLeaseTTL)
}

// ValidateTTL checks that ttl is in [MinLeaseTTL, MaxLeaseTTL].
func ValidateTTL(ttl time.Duration) error {
	if ttl < MinLeaseTTL || ttl > MaxLeaseTTL {
		return fmt.Errorf("%w: %v is outside [%v, %v]", ErrInvalidTTL, ttl, MinLeaseTTL, MaxLeaseTTL)
	}
	return nil
}

// Validate checks the configuration.
func (c Config) Validate() error {
	if _, err := beacon.NewKeyspace(c.Root); err != nil {
		return fmt.Errorf("%w: Root: %w", ErrInvalidConfig, err)
	}
	if err := c.Layout.validate(c.Root); err != nil {
		return err
	}
	if c.LeaseTTL != 0 {
		if err := ValidateTTL(c.LeaseTTL); err != nil {
			return fmt.Errorf("%w: LeaseTTL: %w", ErrInvalidConfig, err)
		}
	}
	if c.MaxMetadataSize < 0 || c.MaxMetadataSize > store.MaxValueSize {
		return fmt.Errorf("%w: MaxMetadataSize %d: must be between 0 (the default, %d bytes) and %d, the most a stored value holds",
			ErrInvalidConfig, c.MaxMetadataSize, beacon.DefaultMaxMetadataSize, store.MaxValueSize)
	}
	if c.RetryMax < 0 {
		return fmt.Errorf("%w: RetryMax %v is negative; use 0 for the default", ErrInvalidConfig, c.RetryMax)
	}
	if c.DrainGrace < 0 {
		return fmt.Errorf("%w: DrainGrace %v is negative", ErrInvalidConfig, c.DrainGrace)
	}
	if math.IsNaN(c.HealthPanicThreshold) || c.HealthPanicThreshold > 1 {
		return fmt.Errorf("%w: HealthPanicThreshold %v is not a share of a service's checked instances: use a value up to 1 "+
			"(0 for the default, %v), or a negative one to turn the panic threshold off", ErrInvalidConfig, c.HealthPanicThreshold, DefaultHealthPanicThreshold)
	}
	return nil
}

// withDefaults returns c with every zero value replaced by its default.
func (c Config) withDefaults() Config {
	c.LeaseTTL = cmp.Or(c.LeaseTTL, DefaultLeaseTTL)
	c.MaxMetadataSize = cmp.Or(c.MaxMetadataSize, beacon.DefaultMaxMetadataSize)
	c.RetryMax = cmp.Or(c.RetryMax, min(c.LeaseTTL/3, maxRetryCap))
	c.VerifyInterval = cmp.Or(c.VerifyInterval, 10*(c.LeaseTTL/3))
	c.WatchLinger = cmp.Or(c.WatchLinger, DefaultWatchLinger)
	c.HealthPanicThreshold = cmp.Or(c.HealthPanicThreshold, DefaultHealthPanicThreshold)
	c.Logger = cmp.Or(c.Logger, slog.New(slog.DiscardHandler))
	return c
}
