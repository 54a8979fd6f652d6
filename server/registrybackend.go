package server

import (
	"context"
	"fmt"
	"net/http"

	"github.com/beaconplane/beacon"
	"github.com/beaconplane/beacon/backend"
	"github.com/beaconplane/beacon/internal/httpapi"
)

// Registry backends (kubernetes) keep no key/value store: the server serves
// the registry (HTTP API lists and watches; registration over HTTP is
// refused with 501 because such a registry has no leases) and everything
// built on registry.Discoverer, but not the store-based features (v2
// discovery tokens, etcd bootstrap tokens).

// openRegistryBackend opens the registry of a registry backend.
func (s *Server) openRegistryBackend(ctx context.Context) error {
	rcfg := s.cfg.Registry
	rcfg.Logger, rcfg.Metrics = s.log, s.reg
	r, err := backend.OpenRegistry(ctx, s.cfg.Backend, rcfg)
	if err != nil {
		return fmt.Errorf("open %s backend: %w", s.cfg.Backend.BackendName(), err)
	}
	s.data.registry = r
	return nil
}

// mountWithoutStore answers the store-based APIs with 501, saying why.
func mountWithoutStore(mux *httpapi.Mux) {
	mux.HandleFunc(V2Path+"/", func(w http.ResponseWriter, _ *http.Request) {
		httpapi.WriteError(w, http.StatusNotImplemented, "not_implemented",
			"v2 discovery tokens need a key/value store backend (etcd, memory, file, nats); this server runs a registry backend without one")
	})
}

// registryReadiness checks a registry backend: through its Ping when it has
// one (kubernetes: the API server answers and serves the CRD), else with a
// List.
func (s *Server) registryReadiness(ctx context.Context, res *readiness) {
	var err error
	if p, ok := s.data.registry.(interface{ Ping(context.Context) error }); ok {
		err = p.Ping(ctx)
	} else {
		_, _, err = s.data.registry.List(ctx, beacon.Query{})
	}
	if err != nil {
		res.Checks["registry"] = err.Error()
		res.Status = "unavailable"
		return
	}
	res.Checks["registry"] = "ok"
}
