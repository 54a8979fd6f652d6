package dnsapi

import (
	"cmp"
	"errors"
	"fmt"
	"log/slog"
	"strings"
	"time"

	"github.com/miekg/dns"
	"github.com/prometheus/client_golang/prometheus"
)

// Defaults of the DNS interface.
const (
	// DefaultAddr is where `beacon serve` answers DNS, UDP and TCP.
	DefaultAddr = "127.0.0.1:9353"
	// DefaultDomain is the zone Beacon is authoritative for.
	DefaultDomain = "beacon."
	// DefaultTTL is the TTL of every answer, and of negative answers (the
	// SOA minimum): small, so that resolvers that cache notice a change
	// within seconds.
	DefaultTTL = 5 * time.Second
	// DefaultMaxStale is how long the last view keeps being served after
	// the registry's watch lost its store; after that every name under
	// the domain answers SERVFAIL until the watch is back.
	DefaultMaxStale = 30 * time.Second
	// DefaultUDPSize is the EDNS0 buffer size Beacon advertises and the
	// largest UDP answer it sends (the DNS flag day 2020 value, which
	// avoids IP fragmentation).
	DefaultUDPSize = 1232
	// DefaultMaxTCPConns bounds concurrent DNS-over-TCP connections.
	DefaultMaxTCPConns = 256
	// DefaultMaxTCPConnsPerClient bounds those of one client address.
	DefaultMaxTCPConnsPerClient = 32
)

// Config configures a Server. The zero value serves DefaultDomain with the
// defaults above.
type Config struct {
	// Domain is the zone answered, e.g. "beacon." or "svc.example.com."
	// (a trailing dot is added when missing; case does not matter).
	// DefaultDomain when empty. Names outside it are REFUSED.
	Domain string
	// TTL of answers and of negative answers. DefaultTTL when zero; at
	// least 1 s (a zero TTL defeats caching resolvers) and at most 1 h.
	TTL time.Duration
	// MaxStale is how long the last view is served after the watch went
	// stale (lost its store) before names answer SERVFAIL. DefaultMaxStale
	// when zero; negative means SERVFAIL as soon as the watch is stale.
	MaxStale time.Duration
	// UDPSize is the EDNS0 UDP payload size advertised and the upper bound
	// of UDP answers (a client's smaller size wins). DefaultUDPSize when
	// zero; 512-65535.
	UDPSize int
	// MaxTCPConns bounds concurrent TCP connections; DefaultMaxTCPConns
	// when zero. At the bound, a new connection takes the place of the
	// one idle longest (internal/connlimit).
	MaxTCPConns int
	// MaxTCPConnsPerClient bounds the TCP connections of one client
	// address, so that one client holding connections open (a query every
	// few seconds keeps one) cannot take all MaxTCPConns from the others.
	// At the bound a new connection from the address takes the place of
	// its connection idle longest (silent ones first) rather than being
	// refused: every process of a host shares its address.
	// DefaultMaxTCPConnsPerClient when zero; no bound when negative.
	MaxTCPConnsPerClient int
	// Logger receives the server's logs; nil discards them.
	Logger *slog.Logger
	// Metrics receives the server's metrics (beacon_dns_*); nil registers
	// none.
	Metrics prometheus.Registerer
	// SettingName names a setting in what the server says while it runs
	// (answers, logs): it is given a field ("dnsapi.Config.MaxStale") and returns
	// what an operator changes (beacon serve: the flag). Nil, or "", names
	// the field.
	SettingName func(field string) string
}

func (c Config) withDefaults() Config {
	c.Domain = cmp.Or(c.Domain, DefaultDomain)
	c.Domain = dns.CanonicalName(c.Domain)
	c.TTL = cmp.Or(c.TTL, DefaultTTL)
	c.MaxStale = cmp.Or(c.MaxStale, DefaultMaxStale)
	c.UDPSize = cmp.Or(c.UDPSize, DefaultUDPSize)
	c.MaxTCPConns = cmp.Or(c.MaxTCPConns, DefaultMaxTCPConns)
	c.MaxTCPConnsPerClient = cmp.Or(c.MaxTCPConnsPerClient, DefaultMaxTCPConnsPerClient)
	c.Logger = cmp.Or(c.Logger, slog.New(slog.DiscardHandler))
	return c
}

// Validate checks the configuration and returns every problem found, each
// naming the field (dnsapi.Config.Domain ...).
func (c Config) Validate() error {
	var errs []error
	if c.Domain != "" {
		if err := validateDomain(c.Domain); err != nil {
			errs = append(errs, fmt.Errorf("dnsapi.Config.Domain %q: %w", c.Domain, err))
		}
	}
	if c.TTL != 0 && (c.TTL < time.Second || c.TTL > time.Hour || c.TTL%time.Second != 0) {
		errs = append(errs, fmt.Errorf("dnsapi.Config.TTL %v: must be whole seconds from 1s to 1h (DNS TTLs are in seconds)", c.TTL))
	}
	if c.UDPSize != 0 && (c.UDPSize < dns.MinMsgSize || c.UDPSize > dns.MaxMsgSize) {
		errs = append(errs, fmt.Errorf("UDP size %d: must be %d-%d", c.UDPSize, dns.MinMsgSize, dns.MaxMsgSize))
	}
	if c.MaxTCPConns < 0 {
		errs = append(errs, fmt.Errorf("max TCP connections %d: must not be negative", c.MaxTCPConns))
	}
	return errors.Join(errs...)
}

// validateDomain accepts a domain name of letter-digit-hyphen labels (the
// names Beacon answers are such labels, so that they pass every resolver).
func validateDomain(d string) error {
	d = strings.TrimSuffix(d, ".")
	if d == "" {
		return errors.New("must not be the root zone: Beacon must not answer for every name (use e.g. beacon.)")
	}
	if len(d) > 200 {
		return errors.New("is longer than 200 characters: the names under it would not fit in 255")
	}
	for _, l := range strings.Split(d, ".") {
		if !isLDHLabel(l) {
			return fmt.Errorf("label %q: must be 1-63 letters, digits or '-', not starting or ending with '-'", l)
		}
	}
	return nil
}

func isLDHLabel(l string) bool {
	if l == "" || len(l) > 63 || l[0] == '-' || l[len(l)-1] == '-' {
		return false
	}
	for i := 0; i < len(l); i++ {
		c := l[i]
		if !('a' <= c && c <= 'z' || 'A' <= c && c <= 'Z' || '0' <= c && c <= '9' || c == '-') {
			return false
		}
	}
	return true
}
