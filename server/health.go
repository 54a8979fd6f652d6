package server

import (
	"errors"
	"fmt"
	"net"
	"os"

	"github.com/beaconplane/beacon"
	"github.com/beaconplane/beacon/backend"
	"github.com/beaconplane/beacon/health"
	"github.com/beaconplane/beacon/registry"
)

// HealthConfig configures the server's health checker (package health,
// docs/health.md): it probes the instances that declare a check, shared
// with the checkers of the cluster's other servers, and writes their
// verdicts to the store.
type HealthConfig struct {
	// Enabled runs the checker. Off in the zero value; `beacon serve`
	// turns it on for every store backend. A registry backend
	// (kubernetes, where readiness is the check) refuses it.
	Enabled bool
	// CheckerID names the checker in its verdicts and in the sharing of
	// instances, one per server (health.Config.ID). Empty: the embedded
	// etcd member's name (Config.Name) when the server runs one, else the
	// host name.
	CheckerID string
}

func (c HealthConfig) validate(cfg Config) []error {
	if !c.Enabled {
		return nil
	}
	var errs []error
	switch name := cfg.Backend.BackendName(); {
	case cfg.Store != nil:
	case name == backend.Kubernetes || cfg.Backend.IsRegistry():
		errs = append(errs, fmt.Errorf("Config.Health.Enabled: the %s backend keeps no store for verdicts, and its readiness is the check: turn health checks off", name))
	}
	if cfg.Registry.Layout == registry.LayoutDynamo {
		errs = append(errs, errors.New("Config.Health.Enabled: the dynamo layout is a read-only view of what the Dynamo runtime writes: no checker registers or writes verdicts there; turn health checks off"))
	}
	if c.CheckerID != "" {
		if err := health.ValidateCheckerID(c.CheckerID); err != nil {
			errs = append(errs, fmt.Errorf("Config.Health.CheckerID: %w", err))
		}
	}
	return errs
}

// healthState is the server's health checker.
type healthState struct {
	checker *health.Checker
}

// startHealth starts the health checker over the registry and store
// behind the HTTP API.
func (s *Server) startHealth() error {
	if !s.cfg.Health.Enabled || s.data.store == nil {
		return nil
	}
	id, err := s.checkerID()
	if err != nil {
		return err
	}
	c, err := health.New(health.Config{ID: id, Addr: s.checkerAddr(), Registry: s.data.registry, Store: s.data.store,
		Logger: s.log, Metrics: s.reg})
	if err != nil {
		return fmt.Errorf("health checker: %w", err)
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
// go with its lease.
func (s *Server) closeHealth() {
	if s.health.checker != nil {
		_ = s.health.checker.Close()
	}
}

// HealthChecker returns the health checker (nil when disabled or before
// Start).
func (s *Server) HealthChecker() *health.Checker { return s.health.checker }
