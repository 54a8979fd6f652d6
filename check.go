package beacon

import (
	"cmp"
	"encoding/json"
	"errors"
	"fmt"
	"strconv"
	"strings"
	"time"
	"unicode/utf8"
)

// ErrInvalidCheck matches every refused check declaration.
var ErrInvalidCheck = errors.New("beacon: invalid check")

// CheckKind is how an instance is checked.
type CheckKind string

// The check kinds.
const (
	// CheckGRPC follows the standard grpc.health.v1 service of the instance's
	// address: its Watch stream where the server has it (changes are pushed)
	// and its Check method once per interval (a hung server fails), else
	// Check alone.
	CheckGRPC CheckKind = "grpc"
	// CheckHTTP sends GET Path to the instance's address; a 2xx answer passes.
	CheckHTTP CheckKind = "http"
	// CheckTCP opens a connection to the instance's address and closes it.
	CheckTCP CheckKind = "tcp"
	// CheckTTL passes while the service itself reports that it is fine at least
	// once per TTL: an application-level heartbeat, apart from the lease. It
	// fails one TTL after the last report (or, before any, after its check is
	// first seen) and passes again at the next one; it has no interval,
	// timeout, rise or fall (see TTLReadInterval).
	CheckTTL CheckKind = "ttl"
)

// Defaults and bounds of a check's timing.
const (
	DefaultCheckInterval = 10 * time.Second
	DefaultCheckTimeout  = 2 * time.Second
	DefaultCheckRise     = 2
	DefaultCheckFall     = 3

	MinCheckInterval  = 500 * time.Millisecond
	MaxCheckInterval  = 10 * time.Minute
	MinCheckTimeout   = 50 * time.Millisecond
	MaxCheckThreshold = 100
	MinCheckTTL       = time.Second
	MaxCheckTTL       = 24 * time.Hour
	MaxCheckPathBytes = 1024
)

// TTLReadInterval is how often a checker reads the last report of a TTL
// check whose TTL is ttl: a quarter of it, at most DefaultCheckInterval.
// It reads it again at the moment it turns one TTL old, so the check
// fails one TTL after the last report the checker saw, which is at most
// one TTLReadInterval after it was written (beacon register writes one at
// least every quarter TTL while the service reports).
func TTLReadInterval(ttl time.Duration) time.Duration { return min(ttl/4, DefaultCheckInterval) }

// Check declares how, and how often, an instance is checked. The zero
// values of Interval, Timeout, Rise and Fall stand for their defaults; a
// TTL check has none of them (a writer refuses them, a reader ignores
// them: its TTL is its only timing).
type Check struct {
	Kind CheckKind `json:"kind"`
	// Path is the HTTP check's request path, from "/".
	Path string `json:"path,omitempty"`
	// Service is the gRPC check's service name; "" asks for the server's
	// overall health.
	Service string `json:"service,omitempty"`
	// CheckTTL is how long a TTL check's last report holds.
	TTL time.Duration `json:"ttl,omitempty"`

	Interval time.Duration `json:"interval,omitempty"`
	Timeout  time.Duration `json:"timeout,omitempty"`
	// Rise is how many passes in a row bring a failing instance back.
	Rise int `json:"rise,omitempty"`
	// Fall is how many failures in a row take a passing instance out.
	Fall int `json:"fall,omitempty"`
}

// ParseCheck reads the command line's form of a check: "grpc", "grpc:SERVICE",
// "http:/PATH", "tcp" or "ttl:DURATION". Timing takes its defaults; the
// caller sets Interval, Timeout, Rise and Fall from their own flags.
func ParseCheck(spec string) (Check, error) {
	kind, arg, hasArg := strings.Cut(spec, ":")
	c := Check{Kind: CheckKind(kind)}
	switch c.Kind {
	case CheckGRPC:
		c.Service = arg
	case CheckHTTP:
		if !hasArg {
			return Check{}, invalidCheck(spec, `an HTTP check names its path: http:/healthz`)
		}
		c.Path = arg
	case CheckTCP:
		if hasArg {
			return Check{}, invalidCheck(spec, `a TCP check takes no argument: tcp`)
		}
	case CheckTTL:
		d, err := time.ParseDuration(arg)
		if err != nil {
			return Check{}, invalidCheck(spec, `a TTL check names how long a report holds: ttl:30s`)
		}
		c.TTL = d
	default:
		return Check{}, invalidCheck(spec, "the kind must be grpc, http:/PATH, tcp or ttl:DURATION")
	}
	if err := c.Validate(); err != nil {
		return Check{}, err
	}
	return c, nil
}

// String is the command line's form of c (Parse's input).
func (c Check) String() string {
	switch c.Kind {
	case CheckGRPC:
		if c.Service != "" {
			return "grpc:" + c.Service
		}
		return "grpc"
	case CheckHTTP:
		return "http:" + c.Path
	case CheckTTL:
		return "ttl:" + c.TTL.String()
	}
	return string(c.Kind)
}

// WithDefaults returns c with its zero timing fields set to the defaults.
// The timeout never exceeds the interval.
func (c Check) WithDefaults() Check {
	c.Interval = cmp.Or(c.Interval, DefaultCheckInterval)
	c.Timeout = cmp.Or(c.Timeout, min(DefaultCheckTimeout, c.Interval))
	c.Rise = cmp.Or(c.Rise, DefaultCheckRise)
	c.Fall = cmp.Or(c.Fall, DefaultCheckFall)
	return c
}

// Validate reports what is wrong with c, and what to write instead. Zero
// timing fields are valid (they stand for the defaults).
func (c Check) Validate() error {
	if err := c.validateKind(); err != nil {
		return err
	}
	d := c.WithDefaults()
	switch {
	case d.Interval < MinCheckInterval || d.Interval > MaxCheckInterval:
		return invalidCheck(c.String(), fmt.Sprintf("interval %s is outside %s..%s", d.Interval, MinCheckInterval, MaxCheckInterval))
	case d.Timeout < MinCheckTimeout || d.Timeout > d.Interval:
		return invalidCheck(c.String(), fmt.Sprintf("timeout %s must be at least %s and at most the interval (%s)", d.Timeout, MinCheckTimeout, d.Interval))
	case d.Rise < 1 || d.Rise > MaxCheckThreshold:
		return invalidCheck(c.String(), fmt.Sprintf("rise %d must be 1..%d (passes in a row that bring an instance back)", d.Rise, MaxCheckThreshold))
	case d.Fall < 1 || d.Fall > MaxCheckThreshold:
		return invalidCheck(c.String(), fmt.Sprintf("fall %d must be 1..%d (failures in a row that take an instance out)", d.Fall, MaxCheckThreshold))
	}
	return nil
}

// validateUnused refuses, from a writer, a field the check's kind does
// not read (a TCP check's path), which was stored and meant nothing.
// Readers take what older writers stored.
func (c Check) validateUnused() error {
	switch {
	case c.Path != "" && c.Kind != CheckHTTP:
		return invalidCheck(c.String(), fmt.Sprintf("a %s check has no path (only an http check does)", c.Kind))
	case c.Service != "" && c.Kind != CheckGRPC:
		return invalidCheck(c.String(), fmt.Sprintf("a %s check has no service (only a grpc check does)", c.Kind))
	case c.TTL != 0 && c.Kind != CheckTTL:
		return invalidCheck(c.String(), fmt.Sprintf("a %s check has no ttl (only a ttl check does: the lease's TTL is the registration's)", c.Kind))
	case c.Timeout != 0 && c.Kind == CheckTTL:
		return invalidCheck(c.String(), "a ttl check has no timeout: it probes nothing (the service reports)")
	case (c.Interval != 0 || c.Rise != 0 || c.Fall != 0) && c.Kind == CheckTTL:
		return invalidCheck(c.String(), "a ttl check has no interval, rise or fall: it fails one TTL after the last report and passes again at the next one")
	}
	return nil
}

func (c Check) validateKind() error {
	switch c.Kind {
	case CheckGRPC:
		if len(c.Service) > MaxCheckPathBytes || !printable(c.Service) {
			return invalidCheck(c.String(), "the gRPC service name must be printable UTF-8 and at most 1024 bytes")
		}
	case CheckHTTP:
		if !strings.HasPrefix(c.Path, "/") || len(c.Path) > MaxCheckPathBytes || !printable(c.Path) || strings.ContainsAny(c.Path, " #") {
			return invalidCheck(c.String(), "the HTTP path must start with / and be a printable UTF-8 request path of at most 1024 bytes, with no space or fragment")
		}
	case CheckTCP:
	case CheckTTL:
		if c.TTL < MinCheckTTL || c.TTL > MaxCheckTTL {
			return invalidCheck(c.String(), fmt.Sprintf("the TTL must be %s..%s", MinCheckTTL, MaxCheckTTL))
		}
	default:
		return invalidCheck(string(c.Kind), "the kind must be grpc, http, tcp or ttl")
	}
	return nil
}

// printable reports whether s is valid UTF-8 (which is stored as it is
// declared: JSON would store another character for an invalid byte) with
// no control characters (which would let a declaration forge lines in
// logs or headers).
func printable(s string) bool {
	if !utf8.ValidString(s) {
		return false
	}
	for _, r := range s {
		if !strconv.IsPrint(r) {
			return false
		}
	}
	return true
}

func invalidCheck(spec, rule string) error {
	return fmt.Errorf("%w %q: %s", ErrInvalidCheck, shorten(spec), rule)
}

// checkJSON is a check's JSON form: durations as Go duration strings
// ("10s"), so that a declaration reads as it is written on the command line.
// The durations, Rise and Fall are pointers so that an explicit zero (or
// "") is told from a field left out.
type checkJSON struct {
	Kind     CheckKind `json:"kind"`
	Path     string    `json:"path,omitempty"`
	Service  string    `json:"service,omitempty"`
	TTL      *string   `json:"ttl,omitempty"`
	Interval *string   `json:"interval,omitempty"`
	Timeout  *string   `json:"timeout,omitempty"`
	Rise     *int      `json:"rise,omitempty"`
	Fall     *int      `json:"fall,omitempty"`
}

// nonZero is &v, or nil for 0 (left out).
func nonZero(v int) *int {
	if v == 0 {
		return nil
	}
	return &v
}

// MarshalJSON writes durations as strings ("10s").
func (c Check) MarshalJSON() ([]byte, error) {
	j := checkJSON{Kind: c.Kind, Path: c.Path, Service: c.Service, Rise: nonZero(c.Rise), Fall: nonZero(c.Fall)}
	for _, d := range []struct {
		to **string
		v  time.Duration
	}{{&j.TTL, c.TTL}, {&j.Interval, c.Interval}, {&j.Timeout, c.Timeout}} {
		if d.v != 0 {
			v := d.v.String()
			*d.to = &v
		}
	}
	return json.Marshal(j)
}

// UnmarshalJSON reads durations written as strings ("10s", "1m30s"). A
// field given as zero ("0s", 0) is refused: left out, a field takes its
// default; zero is no interval, timeout, TTL or count of probes, and was
// read as the default without a word.
func (c *Check) UnmarshalJSON(data []byte) error {
	var j checkJSON
	if err := json.Unmarshal(data, &j); err != nil {
		return fmt.Errorf("%w: %w", ErrInvalidCheck, err)
	}
	out := Check{Kind: j.Kind, Path: j.Path, Service: j.Service}
	for _, n := range []struct {
		name string
		from *int
		to   *int
	}{{"rise", j.Rise, &out.Rise}, {"fall", j.Fall, &out.Fall}} {
		if n.from == nil {
			continue
		}
		if *n.from == 0 {
			return fmt.Errorf("%w: %s 0: must be 1..%d; leave %q out for its default", ErrInvalidCheck, n.name, MaxCheckThreshold, n.name)
		}
		*n.to = *n.from
	}
	for _, d := range []struct {
		name string
		from *string
		to   *time.Duration
	}{{"ttl", j.TTL, &out.TTL}, {"interval", j.Interval, &out.Interval}, {"timeout", j.Timeout, &out.Timeout}} {
		if d.from == nil {
			continue
		}
		v, err := time.ParseDuration(*d.from)
		if err != nil {
			return fmt.Errorf("%w: %s %q is not a duration such as \"10s\" (leave %q out for its default)", ErrInvalidCheck, d.name, shorten(*d.from), d.name)
		}
		if v == 0 {
			return fmt.Errorf("%w: %s %q is zero: give a duration such as \"10s\", or leave %q out for its default", ErrInvalidCheck, d.name, shorten(*d.from), d.name)
		}
		*d.to = v
	}
	*c = out
	return nil
}

// HealthStatus is the checkers' verdict on an instance that declares a
// check.
type HealthStatus string

// The verdicts. Unknown (no verdict yet) and passing instances are served;
// failing ones are left out of routing as draining ones are, unless their
// priority level of their service is in panic (Health.Panic).
const (
	HealthUnknown HealthStatus = "unknown"
	HealthPassing HealthStatus = "passing"
	HealthFailing HealthStatus = "failing"
)

// Health is what the checkers say of an instance that declares a Check.
// It is never stored with the instance: a checker writes its verdict under
// a lease of its own (so that a checker that dies takes its verdicts with
// it), and the registry's view joins the two for every reader.
type Health struct {
	Status HealthStatus `json:"status"`
	// Reason is the last failure, while failing.
	Reason string `json:"reason,omitempty"`
	// Since is when the checker reached this verdict.
	Since time.Time `json:"since,omitzero"`
	// Checker names the checker that said so.
	Checker string `json:"checker,omitempty"`
	// Panic is set on a failing instance whose priority level is in panic:
	// more of the checked instances at its MetaPriority in its service are
	// failing than the panic threshold allows, and no other priority has an
	// instance that takes work (where clients would go instead). Health is
	// ignored for that level, and the instance is served anyway. See
	// docs/health.md.
	Panic bool `json:"panic,omitempty"`
}

// Failing reports whether the verdict takes the instance out of routing:
// failing, and its priority level not in panic.
func (h *Health) Failing() bool { return h != nil && h.Status == HealthFailing && !h.Panic }
