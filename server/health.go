package server

import (
	"errors"
	"fmt"
	"net"
	"os"

	"github.com/beaconplane/beacon"
	"github.com/beaconplane/beacon/health"
	"github.com/beaconplane/beacon/registry"
)

// HealthConfig configures the server's health checker (package health,
// docs/health.md): it probes the instances that declare a check, shared
// with the checkers of the cluster's other servers, and writes their
// verdicts to the store, or, over the kubernetes backend, to its pod's
// InstanceSet (registry.VerdictKeeper).
type HealthConfig struct {
	// Enabled runs the checker. Off in the zero value; `beacon serve`
	// turns it on for every store backend, and for the kubernetes backend
	// when it runs in a pod (the checker needs the pod identity there, as
	// registering does: without it, Start fails saying what is missing).
	// The dynamo layout (read-only) refuses it.
	Enabled bool
	// CheckerID names the checker in its verdicts and in the sharing of
	// instances, one per server (health.Config.ID). Empty: the embedded
	// etcd member's name (Config.Name) when the server runs one, else the
	// host name.
	CheckerID string
	// Addr is where the other servers' checkers reach this one (its
	// registration's address). Empty: the HTTP listener's address, with
	// the host name for an unspecified host (0.0.0.0, ::).
	Addr string
}

func (c HealthConfig) validate(cfg Config) []error {
	if !c.Enabled {
		return nil
	}
	var errs []error
	if cfg.Registry.Layout == registry.LayoutDynamo {
		errs = append(errs, errors.New("Config.Health.Enabled: the dynamo layout is a read-only view of what the Dynamo runtime writes: no checker registers or writes verdicts there; turn health checks off"))
	}
	if c.CheckerID != "" {
		if err := health.ValidateCheckerID(c.CheckerID); err != nil {
			errs = append(errs, fmt.Errorf("Config.Health.CheckerID: %w", err))
		}
	}
	if c.Addr != "" {
		if err := beacon.ValidateAddress(c.Addr); err != nil {
			errs = append(errs, fmt.Errorf("Config.Health.Addr: %w", err))
		}
	}
	return errs
}

// healthState is the server's health checker.
type healthState struct {
	checker *health.Checker
}

// startHealth starts the health checker over the registry and store
// behind the HTTP API (a registry backend has no store: its registry
// keeps the verdicts, registry.VerdictKeeper).
func (s *Server) startHealth() error {
	if !s.cfg.Health.Enabled {
		return nil
	}
	id, err := s.checkerID()
	if err != nil {
		return err
	}
	addr := s.cfg.Health.Addr
	if addr == "" {
		addr = s.checkerAddr()
	}
	c, err := health.New(health.Config{ID: id, Addr: addr, Registry: s.data.registry, Store: s.data.store,
		Logger: s.log, Metrics: s.reg})
	if err != nil {
		return fmt.Errorf("Config.Health.Enabled: cannot run the health checker over the %s backend: %w", s.cfg.Backend.BackendName(), err)
	}
	if err := c.Start(); err != nil {
		return fmt.Errorf("health checker: %w", err)
	}
	s.health.checker = c
	return nil
}

// checkerID is Config.Health.CheckerID, or its default.
func (s *Server) checkerID() (string, error) {
	if id := s.cfg.Health.CheckerID; id != "" {
		return id, nil
	}
	if s.cfg.embedded() {
		return s.cfg.Name, nil
	}
	host, err := os.Hostname()
	if err == nil {
		err = health.ValidateCheckerID(host)
	}
	if err != nil {
		return "", fmt.Errorf("Config.Health.CheckerID: the host name cannot name the health checker (%w): set one", err)
	}
	return host, nil
}

// checkerAddr is where the other servers' checkers reach this one: the
// HTTP listener's address, with the host name for an unspecified host
// (0.0.0.0, ::).
func (s *Server) checkerAddr() string {
	addr := s.http.ln.Addr().String()
	host, port, err := net.SplitHostPort(addr)
	if err != nil {
		return addr
	}
	if ip := net.ParseIP(host); ip != nil && ip.IsUnspecified() {
		if name, err := os.Hostname(); err == nil && beacon.ValidateAddress(net.JoinHostPort(name, port)) == nil {
			return net.JoinHostPort(name, port)
		}
		return loopbackIfUnspecified(addr)
	}
	return addr
}

// closeHealth stops the health checker: it deregisters, and its verdicts
// go (with its lease, or removed from its pod's InstanceSet).
func (s *Server) closeHealth() {
	if s.health.checker != nil {
		_ = s.health.checker.Close()
	}
}

// HealthChecker returns the health checker (nil when disabled or before
// Start).
func (s *Server) HealthChecker() *health.Checker { return s.health.checker }
