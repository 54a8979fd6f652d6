package server

import (
	"context"
	"errors"
	"fmt"
	"net"
	"net/http"
	"strconv"
	"strings"
	"sync"
	"sync/atomic"
	"time"

	"github.com/beaconplane/beacon/bootstrap"
	v2 "github.com/beaconplane/beacon/bootstrap/v2"
	"github.com/beaconplane/beacon/internal/connlimit"
	"github.com/beaconplane/beacon/internal/httpapi"
	"github.com/beaconplane/beacon/internal/pprofhttp"
	"github.com/beaconplane/beacon/registry"
	"github.com/beaconplane/beacon/server/registryapi"
	etcdstore "github.com/beaconplane/beacon/store/etcd"
	"github.com/prometheus/client_golang/prometheus/promhttp"
	clientv3 "go.etcd.io/etcd/client/v3"
)

// httpState is the HTTP API's: its listener (taken first in Start), its
// server, the routes once installed, and what it serves (early, then the
// full routes).
type httpState struct {
	ln          net.Listener
	mu          sync.Mutex   // guards srv: Close may run while Start sets it
	srv         *http.Server // nil until serveEarly
	routes      *httpapi.Mux // the full routes, once installed
	handler     atomic.Pointer[http.Handler]
	stopStreams context.CancelCauseFunc // ends long-lived HTTP streams (SSE), with http.ErrServerClosed
}

// listenHTTP takes the HTTP port, bounded in connections and secured with
// TLS when configured.
func (s *Server) listenHTTP() error {
	ln, err := listen(s.cfg.HTTPAddr, "Config.HTTPAddr")
	if err != nil {
		return err
	}
	ln = limitConns(ln, s.sec.MaxConns, s.sec.MaxConnsPerClient, s.log.With("component", "http"))
	if ln, err = s.secureHTTPListener(ln); err != nil {
		return err
	}
	s.http.ln = ln
	return nil
}

// closeHTTP ends the long-lived streams and shuts the HTTP server down
// within Config.ShutdownTimeout (at once after Abort); before serveEarly
// it closes the listener. Requests still open then are cut: that is what
// the timeout is for, not a failure to stop (a client that sends its body
// slowly, or does not read its answer, cannot make a stop fail).
func (s *Server) closeHTTP() {
	s.http.mu.Lock()
	srv, ln := s.http.srv, s.http.ln
	s.http.mu.Unlock()
	if s.http.stopStreams != nil {
		s.http.stopStreams(http.ErrServerClosed) // streams say the server is closing
	}
	if srv == nil {
		if ln != nil {
			_ = ln.Close()
		}
		return
	}
	ctx, cancel := context.WithTimeout(s.life.abortCtx, s.cfg.ShutdownTimeout)
	defer cancel()
	if err := srv.Shutdown(ctx); err != nil {
		_ = srv.Close()
		if s.life.abortCtx.Err() == nil { // not cut short by Abort on purpose
			s.log.Warn("HTTP requests still open when the shutdown timeout passed were cut (their connections closed): clients sending or reading slowly, or not at all",
				"timeout", s.cfg.ShutdownTimeout, "setting", s.cfg.setting("Config.ShutdownTimeout"))
		}
	}
}

// readyTimeout bounds the store round trip of /readyz.
const readyTimeout = 2 * time.Second

// serveEarly starts serving the listener taken in Start with a minimal
// handler: /healthz answers at once and /readyz says the server is still
// starting, so that orchestrators do not kill a member that waits for its
// discovery peers. startHTTP later installs the full routes.
func (s *Server) serveEarly() {
	starting := http.NewServeMux()
	starting.HandleFunc("GET /healthz", healthz)
	starting.HandleFunc("GET /readyz", func(w http.ResponseWriter, _ *http.Request) {
		writeReadiness(w, readiness{Status: "starting", Checks: map[string]string{"server": "starting (joining the cluster)"}})
	})
	starting.HandleFunc("/", startingHandler)
	var h http.Handler = starting
	s.http.handler.Store(&h)

	ctx, cancel := context.WithCancelCause(context.Background())
	s.http.stopStreams = cancel
	srv := &http.Server{
		// connlimit: a connection with a request in flight is never
		// closed to make room for another (connlimit.go).
		Handler: connlimit.Handler(s.guard(httpapi.RefuseRepeatedHeaders(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
			(*s.http.handler.Load()).ServeHTTP(w, r)
		})))),
		ConnContext:       connlimit.ConnContext,
		ReadHeaderTimeout: 10 * time.Second,
		BaseContext:       func(net.Listener) context.Context { return ctx },
	}
	s.configureHTTPServer(srv)
	s.http.mu.Lock()
	s.http.srv = srv
	s.http.mu.Unlock()
	s.life.wg.Add(1)
	go func() {
		defer s.life.wg.Done()
		if err := srv.Serve(s.http.ln); err != nil && !errors.Is(err, http.ErrServerClosed) {
			s.fail(err)
		}
	}()
}

// startingHandler answers every other route while the server starts.
func startingHandler(w http.ResponseWriter, _ *http.Request) {
	httpapi.WriteError(w, http.StatusServiceUnavailable, httpapi.CodeUnavailable,
		"beacon serve is starting (joining its cluster); retry shortly, /readyz says when it is ready")
}

// startHTTP builds the full routes and installs them. Every route is
// registered on one httpapi.Mux (unknown paths and methods get JSON 404
// and 405; /v1/openapi.json documents exactly the registered routes).
func (s *Server) startHTTP() error {
	mux := httpapi.NewMux()
	mux.NotFound = "the routes are listed at /v1/openapi.json"
	queries, err := queryRules() // openapi.go: every documented route's query is checked
	if err != nil {
		return err
	}
	mux.Queries = queries
	mux.Handle("GET /healthz", httpapi.NoQuery(http.HandlerFunc(healthz)))
	mux.Handle("GET /readyz", httpapi.NoQuery(http.HandlerFunc(s.readyz)))
	mux.Handle("GET /metrics", httpapi.NoQuery(promhttp.HandlerFor(s.gather, promhttp.HandlerOpts{ErrorLog: slogErrorLog{s}})))
	if err := s.mountAPIs(mux); err != nil {
		return err
	}
	if err := s.mountDashboard(mux); err != nil { // dashboard.go
		return fmt.Errorf("dashboard: %w", err)
	}
	if s.cfg.EnablePprof {
		pprofhttp.Mount(rootOnly{mux, s}) // not an API route: not in openapi.json
	}
	s.http.routes = mux
	guarded, err := crossOriginGuard(s.cfg.CORSAllowedOrigins, s.cfg.setting("Config.CORSAllowedOrigins"), s.requireAuth(mux)) // csrf.go, authhttp.go
	if err != nil {
		return fmt.Errorf("Config.CORSAllowedOrigins: %w", err)
	}
	h := cors(s.cfg.CORSAllowedOrigins, guarded) // cors.go
	s.http.handler.Store(&h)
	return nil
}

func healthz(w http.ResponseWriter, _ *http.Request) {
	w.Header().Set("Content-Type", "text/plain; charset=utf-8")
	_, _ = w.Write([]byte("ok\n"))
}

// mountAPIs adds the capability APIs that need the store: the registry
// API, the OpenAPI document, and the bootstrap APIs (discovery.go).
func (s *Server) mountAPIs(mux *httpapi.Mux) error {
	if s.data.registry == nil {
		rcfg := s.cfg.Registry
		rcfg.Logger, rcfg.Metrics = s.log, s.reg
		reg, err := registry.New(s.data.store, rcfg)
		if err != nil {
			return fmt.Errorf("registry: %w", err)
		}
		s.data.registry = reg
	}
	if err := s.setupAuth(); err != nil { // authhttp.go
		return err
	}
	s.mountAuth(mux)
	api, err := registryapi.New(s.data.registry, s.registryOptions(registryapi.Config{Logger: s.log, Metrics: s.reg, SettingName: s.cfg.SettingName}))
	if err != nil {
		return fmt.Errorf("registry API: %w", err)
	}
	api.Register(mux)
	mux.Handle("GET /v1/openapi.json", httpapi.NoQuery(openAPIHandler(mux))) // openapi.go
	if cli := s.etcdClient(); cli != nil {
		bootstrap.NewTokenAPI(cli, s.clientEndpoints(), s.log).Register(guarded{mux, func(h http.Handler) http.Handler {
			return s.guardTokens(limitTokenCreation(api, h)) // authhttp.go
		}})
	}
	if s.data.store == nil {
		mountWithoutStore(mux) // registrybackend.go
		return nil
	}
	base := s.cfg.V2BaseURL
	if base == "" {
		base = s.httpScheme() + "://" + loopbackIfUnspecified(s.http.ln.Addr().String()) + V2Path
	}
	v2svc, err := v2.New(v2.Config{Store: s.data.store, BaseURL: base, MaxAge: s.cfg.V2TokenMaxAge, Logger: s.log})
	if err != nil {
		return fmt.Errorf("v2 discovery: %w", err)
	}
	s.data.v2 = v2svc
	mux.Handle(V2Path+"/", s.guardV2(limitTokenCreation(api, limitV2Waits(api, http.StripPrefix(V2Path, v2svc)))))
	return nil
}

// limitTokenCreation counts each creation of a discovery token (POST
// /v1/tokens, GET or POST /v2/discovery/new) against the per-minute caps of
// its client and of the server. It runs after the permission check, so a
// request refused for lack of permission spends nothing and the client is
// the authenticated user.
func limitTokenCreation(api *registryapi.Handler, h http.Handler) http.Handler {
	return http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		if createsToken(r) && !api.CreateTokenAllowed(w, r) {
			return
		}
		h.ServeHTTP(w, r)
	})
}

// createsToken reports the requests that create a discovery token.
func createsToken(r *http.Request) bool {
	if r.URL.Path == bootstrap.TokenPath {
		return r.Method == http.MethodPost
	}
	return writesDespiteMethod(r) && (r.Method == http.MethodGet || r.Method == http.MethodPost) // csrf.go
}

// limitV2Waits counts each v2 long poll (wait=true), which holds a store
// watch for up to a minute, against the watch-stream caps of its client
// and of the server.
func limitV2Waits(api *registryapi.Handler, h http.Handler) http.Handler {
	return http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		if !v2Waits(r) {
			h.ServeHTTP(w, r)
			return
		}
		release, ok := api.HoldStream(w, r)
		if !ok {
			return
		}
		defer release()
		h.ServeHTTP(w, r)
	})
}

// v2Waits reports a v2 discovery long poll: wait given as etcd's v2 API
// reads it (strconv.ParseBool: true, 1, t, ...).
func v2Waits(r *http.Request) bool {
	if !strings.HasPrefix(r.URL.Path, V2Path+"/") {
		return false
	}
	v, ok := r.URL.Query()["wait"]
	if !ok || len(v) == 0 {
		return false
	}
	b, err := strconv.ParseBool(v[0])
	return err == nil && b
}

// V2Path is where the discovery.etcd.io-compatible v2 service is mounted.
const V2Path = "/v2/discovery"

// etcdClient returns a client of the etcd the server runs or fronts (nil
// for other backends).
func (s *Server) etcdClient() *clientv3.Client {
	if s.member.client != nil {
		return s.member.client
	}
	if es, ok := s.data.store.(*etcdstore.Store); ok {
		return es.Client()
	}
	return nil
}

// clientEndpoints are the etcd client URLs members and clients should use.
func (s *Server) clientEndpoints() []string {
	if s.member.etcd != nil {
		return s.cfg.AdvertiseClientURLs
	}
	return s.cfg.EtcdEndpoints
}

// loopbackIfUnspecified turns 0.0.0.0:port / [::]:port into 127.0.0.1:port.
func loopbackIfUnspecified(addr string) string {
	host, port, err := net.SplitHostPort(addr)
	if err != nil {
		return addr
	}
	if ip := net.ParseIP(host); ip != nil && ip.IsUnspecified() {
		return net.JoinHostPort("127.0.0.1", port)
	}
	return addr
}

type readiness struct {
	Status string            `json:"status"`
	Checks map[string]string `json:"checks"`
}

// readyz reports ready when embedded etcd (if any) serves, a read of the
// store succeeds, and DNS (if enabled) answers from the registry.
func (s *Server) readyz(w http.ResponseWriter, r *http.Request) {
	res := readiness{Status: "ok", Checks: map[string]string{}}
	if s.member.etcd != nil {
		select {
		case <-s.member.etcd.Server.ReadyNotify():
			res.Checks["etcd"] = "ok"
		default:
			res.Checks["etcd"] = "not ready"
			res.Status = "unavailable"
		}
	}
	ctx, cancel := context.WithTimeout(r.Context(), readyTimeout)
	defer cancel()
	if s.data.store == nil {
		s.registryReadiness(ctx, &res) // registrybackend.go
	} else if err := s.probeStore(ctx); err != nil {
		res.Checks["store"] = err.Error()
		res.Status = "unavailable"
	} else {
		res.Checks["store"] = "ok"
	}
	s.dnsReadiness(&res) // dns.go
	s.xdsReadiness(&res) // xds.go
	writeReadiness(w, res)
}

func writeReadiness(w http.ResponseWriter, res readiness) {
	code := http.StatusOK
	if res.Status != "ok" {
		code = http.StatusServiceUnavailable
	}
	httpapi.WriteJSON(w, code, res)
}

// slogErrorLog adapts the server logger for promhttp.
type slogErrorLog struct{ s *Server }

func (l slogErrorLog) Println(v ...any) { l.s.log.Error("metrics", "err", v) }
