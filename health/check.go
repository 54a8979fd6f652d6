package health

import (
	"errors"
	"fmt"
	"strconv"
	"strings"
	"time"
)

// ErrInvalidCheck matches every refused check declaration.
var ErrInvalidCheck = errors.New("health: invalid check")

// Kind is how an instance is checked.
type Kind string

// The check kinds.
const (
	// GRPC follows the standard grpc.health.v1 service of the instance's
	// address: its Watch stream where the server has it (changes are pushed)
	// and its Check method once per interval (a hung server fails), else
	// Check alone.
	GRPC Kind = "grpc"
	// HTTP sends GET Path to the instance's address; a 2xx answer passes.
	HTTP Kind = "http"
	// TCP opens a connection to the instance's address and closes it.
	TCP Kind = "tcp"
	// TTL passes while the service itself reports that it is fine at least
	// once per TTL: an application-level heartbeat, apart from the lease.
	TTL Kind = "ttl"
)

// Defaults and bounds of a check's timing.
const (
	DefaultInterval = 10 * time.Second
	DefaultTimeout  = 2 * time.Second
	DefaultRise     = 2
	DefaultFall     = 3

	MinInterval  = 500 * time.Millisecond
	MaxInterval  = 10 * time.Minute
	MinTimeout   = 50 * time.Millisecond
	MaxThreshold = 100
	MinTTL       = time.Second
	MaxTTL       = 24 * time.Hour
	MaxPathBytes = 1024
)

// Check declares how, and how often, an instance is checked. The zero
// values of Interval, Timeout, Rise and Fall stand for their defaults.
type Check struct {
	Kind Kind `json:"kind"`
	// Path is the HTTP check's request path, from "/".
	Path string `json:"path,omitempty"`
	// Service is the gRPC check's service name; "" asks for the server's
	// overall health.
	Service string `json:"service,omitempty"`
	// TTL is how long a TTL check's last report holds.
	TTL time.Duration `json:"ttl,omitempty"`

	Interval time.Duration `json:"interval,omitempty"`
	Timeout  time.Duration `json:"timeout,omitempty"`
	// Rise is how many passes in a row bring a failing instance back.
	Rise int `json:"rise,omitempty"`
	// Fall is how many failures in a row take a passing instance out.
	Fall int `json:"fall,omitempty"`
}

// Parse reads the command line's form of a check: "grpc", "grpc:SERVICE",
// "http:/PATH", "tcp" or "ttl:DURATION". Timing takes its defaults; the
// caller sets Interval, Timeout, Rise and Fall from their own flags.
func Parse(spec string) (Check, error) {
	kind, arg, hasArg := strings.Cut(spec, ":")
	c := Check{Kind: Kind(kind)}
	switch c.Kind {
	case GRPC:
		c.Service = arg
	case HTTP:
		if !hasArg {
			return Check{}, invalid(spec, `an HTTP check names its path: http:/healthz`)
		}
		c.Path = arg
	case TCP:
		if hasArg {
			return Check{}, invalid(spec, `a TCP check takes no argument: tcp`)
		}
	case TTL:
		d, err := time.ParseDuration(arg)
		if err != nil {
			return Check{}, invalid(spec, `a TTL check names how long a report holds: ttl:30s`)
		}
		c.TTL = d
	default:
		return Check{}, invalid(spec, "the kind must be grpc, http:/PATH, tcp or ttl:DURATION")
	}
	if err := c.Validate(); err != nil {
		return Check{}, err
	}
	return c, nil
}

// String is the command line's form of c (Parse's input).
func (c Check) String() string {
	switch c.Kind {
	case GRPC:
		if c.Service != "" {
			return "grpc:" + c.Service
		}
		return "grpc"
	case HTTP:
		return "http:" + c.Path
	case TTL:
		return "ttl:" + c.TTL.String()
	}
	return string(c.Kind)
}

// WithDefaults returns c with its zero timing fields set to the defaults.
// The timeout never exceeds the interval.
func (c Check) WithDefaults() Check {
	if c.Interval == 0 {
		c.Interval = DefaultInterval
	}
	if c.Timeout == 0 {
		c.Timeout = min(DefaultTimeout, c.Interval)
	}
	if c.Rise == 0 {
		c.Rise = DefaultRise
	}
	if c.Fall == 0 {
		c.Fall = DefaultFall
	}
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
	case d.Interval < MinInterval || d.Interval > MaxInterval:
		return invalid(c.String(), fmt.Sprintf("interval %s is outside %s..%s", d.Interval, MinInterval, MaxInterval))
	case d.Timeout < MinTimeout || d.Timeout > d.Interval:
		return invalid(c.String(), fmt.Sprintf("timeout %s must be at least %s and at most the interval (%s)", d.Timeout, MinTimeout, d.Interval))
	case d.Rise < 1 || d.Rise > MaxThreshold:
		return invalid(c.String(), fmt.Sprintf("rise %d must be 1..%d (passes in a row that bring an instance back)", d.Rise, MaxThreshold))
	case d.Fall < 1 || d.Fall > MaxThreshold:
		return invalid(c.String(), fmt.Sprintf("fall %d must be 1..%d (failures in a row that take an instance out)", d.Fall, MaxThreshold))
	}
	return nil
}

func (c Check) validateKind() error {
	switch c.Kind {
	case GRPC:
		if len(c.Service) > MaxPathBytes || !printable(c.Service) {
			return invalid(c.String(), "the gRPC service name must be printable and at most 1024 bytes")
		}
	case HTTP:
		if !strings.HasPrefix(c.Path, "/") || len(c.Path) > MaxPathBytes || !printable(c.Path) || strings.ContainsAny(c.Path, " #") {
			return invalid(c.String(), "the HTTP path must start with / and be a printable request path of at most 1024 bytes, with no space or fragment")
		}
	case TCP:
	case TTL:
		if c.TTL < MinTTL || c.TTL > MaxTTL {
			return invalid(c.String(), fmt.Sprintf("the TTL must be %s..%s", MinTTL, MaxTTL))
		}
	default:
		return invalid(string(c.Kind), "the kind must be grpc, http, tcp or ttl")
	}
	return nil
}

// printable reports whether s has no control characters (which would let a
// declaration forge lines in logs or headers).
func printable(s string) bool {
	for _, r := range s {
		if !strconv.IsPrint(r) {
			return false
		}
	}
	return true
}

func invalid(spec, rule string) error {
	return fmt.Errorf("%w %q: %s", ErrInvalidCheck, shorten(spec), rule)
}

func shorten(s string) string {
	const max = 80
	if len(s) <= max {
		return s
	}
	return s[:max] + "…"
}
