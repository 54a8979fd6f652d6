package server

import (
	"context"
	"errors"
	"fmt"
	"net"
	"syscall"
	"time"

	"github.com/beaconplane/beacon/internal/hostport"
	"github.com/beaconplane/beacon/registry"
	"github.com/beaconplane/beacon/server/dnsapi"
)

// DNSConfig configures the DNS interface of the server (docs/dns.md).
type DNSConfig struct {
	// Addr is where DNS is answered, UDP and TCP (host:port). Empty
	// disables DNS; `beacon serve` defaults to dnsapi.DefaultAddr
	// (127.0.0.1:9353).
	Addr string
	// Domain is the zone answered; dnsapi.DefaultDomain ("beacon.") when
	// empty.
	Domain string
	// TTL of answers; dnsapi.DefaultTTL (5 s) when zero.
	TTL time.Duration
	// MaxStale is how long the last view is served after the registry
	// watch lost its store before names answer SERVFAIL;
	// dnsapi.DefaultMaxStale (30 s) when zero, negative for at once.
	MaxStale time.Duration
}

func (c DNSConfig) validate() []error {
	if c.Addr == "" {
		return nil
	}
	var errs []error
	if err := hostport.Check(c.Addr); err != nil {
		errs = append(errs, fmt.Errorf("Config.DNS.Addr %q: %w, e.g. %s (or empty to disable DNS)", c.Addr, err, dnsapi.DefaultAddr))
	}
	if err := c.dnsapi().Validate(); err != nil {
		errs = append(errs, err)
	}
	return errs
}

func (c DNSConfig) dnsapi() dnsapi.Config {
	return dnsapi.Config{Domain: c.Domain, TTL: c.TTL, MaxStale: c.MaxStale}
}

// dnsState is the server's DNS interface.
type dnsState struct {
	pc   net.PacketConn
	ln   net.Listener
	addr string
	srv  *dnsapi.Server
}

// listenDNS takes the DNS ports early, so that a port in use fails before
// etcd writes anything.
func (s *Server) listenDNS() error {
	if s.cfg.DNS.Addr == "" {
		return nil
	}
	pc, ln, err := dnsapi.Listen(s.cfg.DNS.Addr)
	if errors.Is(err, syscall.EADDRINUSE) {
		return fmt.Errorf("Config.DNS.Addr %s: address already in use (another beacon serve or DNS server?): choose another with Config.DNS.Addr, or disable DNS with Config.DNS.Addr=", s.cfg.DNS.Addr)
	}
	if err != nil {
		return fmt.Errorf("Config.DNS.Addr: %w", err)
	}
	s.dns.pc, s.dns.ln, s.dns.addr = pc, ln, ln.Addr().String()
	return nil
}

// startDNS answers DNS from the registry behind the HTTP API.
func (s *Server) startDNS() error {
	if s.dns.pc == nil {
		return nil
	}
	cfg := s.cfg.DNS.dnsapi()
	cfg.Logger, cfg.Metrics, cfg.SettingName = s.log, s.reg, s.cfg.SettingName
	var d registry.Discoverer = s.data.registry
	srv, err := dnsapi.New(d, cfg)
	if err != nil {
		return fmt.Errorf("dns: %w", err)
	}
	s.dns.srv = srv
	pc, ln := s.dns.pc, s.dns.ln
	s.dns.pc, s.dns.ln = nil, nil // owned by srv now
	return srv.Serve(pc, ln)
}

// dnsReadyTimeout bounds how long Start waits for the DNS interface's
// first snapshot of the registry.
const dnsReadyTimeout = 10 * time.Second

// waitDNS waits until DNS answers from the registry's first snapshot, so
// that a server that says it is ready answers names (before it, they
// answer SERVFAIL). A registry that cannot list within dnsReadyTimeout is
// logged, not fatal: /readyz reports DNS as not ready until it can.
func (s *Server) waitDNS(ctx context.Context) {
	srv := s.dns.srv
	if srv == nil {
		return
	}
	t := time.NewTimer(dnsReadyTimeout)
	defer t.Stop()
	for {
		updated := srv.Updated()
		if srv.Ready() {
			return
		}
		select {
		case <-updated:
		case <-t.C:
			s.log.Warn("dns: no snapshot of the registry yet; names answer SERVFAIL until there is one",
				"waited", dnsReadyTimeout)
			return
		case <-ctx.Done():
			return
		}
	}
}

// dnsReadiness adds the DNS interface's state to a readiness report.
func (s *Server) dnsReadiness(res *readiness) {
	srv := s.dns.srv
	if srv == nil {
		return
	}
	if srv.Ready() {
		res.Checks["dns"] = "ok"
		return
	}
	res.Checks["dns"] = "waiting for the registry's first snapshot (names answer SERVFAIL)"
	res.Status = "unavailable"
}

// closeDNS stops the DNS interface (or releases its ports if it never
// started).
func (s *Server) closeDNS() {
	if s.dns.srv != nil {
		_ = s.dns.srv.Close()
	}
	if s.dns.pc != nil {
		_ = s.dns.pc.Close()
		_ = s.dns.ln.Close()
	}
}

// DNS returns the DNS interface (nil when disabled or before Start).
func (s *Server) DNS() *dnsapi.Server { return s.dns.srv }

// DNSAddr returns the address DNS is answered on, UDP and TCP (empty when
// disabled).
func (s *Server) DNSAddr() string {
	return s.dns.addr
}

func hostOf(addr string) string { h, _, _ := net.SplitHostPort(addr); return h }
func portOf(addr string) string { _, p, _ := net.SplitHostPort(addr); return p }
