package server

import (
	"context"
	"errors"
	"fmt"
	"log/slog"
	"net"
	"strings"
	"sync"
	"syscall"

	"github.com/beaconplane/beacon/backend"
	v2 "github.com/beaconplane/beacon/bootstrap/v2"
	"github.com/beaconplane/beacon/registry"
	"github.com/beaconplane/beacon/store"
	"github.com/prometheus/client_golang/prometheus"
	clientv3 "go.etcd.io/etcd/client/v3"
)

// Server is `beacon serve`: embedded etcd (or a front over an external
// cluster, or another backend), and one HTTP listener for the API, health
// and metrics. Create it with New, then Start (or Run); Close stops it.
//
// Each subsystem owns its fields (doc.go draws them): the lifecycle shared
// by all, the embedded etcd member, the data the APIs serve, the HTTP API,
// the discovery fallback proxy, DNS, xDS, and the security layer.
type Server struct {
	cfg    Config
	log    *slog.Logger
	reg    prometheus.Registerer
	gather prometheus.Gatherer

	life     lifecycle      // start once, failures, close once (this file)
	member   member         // embedded etcd (member.go)
	data     dataPlane      // store and registry the APIs serve (this file)
	http     httpState      // HTTP listener, server and routes (http.go)
	boot     bootstrapState // discovery fallback proxy (discovery.go)
	dns      dnsState       // DNS interface (dns.go)
	xds      xdsState       // xDS interface (xds.go)
	health   healthState    // health checker (health.go)
	security                // TLS, authentication, limits (tls.go, authn.go, limits.go)
}

// lifecycle is what Start, Wait and Close share across the subsystems:
// the start guard, the goroutines they start (wg: Close waits for them),
// the failures they report to Wait, and Close's once and its abort.
type lifecycle struct {
	mu        sync.Mutex // guards started
	started   bool
	wg        sync.WaitGroup
	errc      chan error
	closeOnce sync.Once
	closeErr  error
	// abortCtx bounds Close's graceful part; Abort ends it.
	abortCtx context.Context
	abort    context.CancelFunc
}

// dataPlane is what the APIs serve: the store (embedded etcd's, an
// external backend's, or an injected one), the registry over it, and the
// v2 discovery service.
type dataPlane struct {
	store     store.Store
	ownsStore bool // opened by the server: Close closes it
	registry  registry.Registry
	v2        *v2.Service
}

// close closes what the server opened, users first: the v2 service and
// the registry, then the store.
func (d *dataPlane) close() []error {
	var errs []error
	if d.v2 != nil {
		_ = d.v2.Close()
	}
	if d.registry != nil {
		if err := d.registry.Close(); err != nil {
			errs = append(errs, fmt.Errorf("close registry: %w", err))
		}
	}
	if d.ownsStore && d.store != nil {
		if err := d.store.Close(); err != nil {
			errs = append(errs, fmt.Errorf("close store: %w", err))
		}
	}
	return errs
}

// New validates cfg and returns a server that is not yet running.
func New(cfg Config) (*Server, error) {
	if err := cfg.Validate(); err != nil {
		return nil, err
	}
	cfg = cfg.withDefaults()
	s := &Server{cfg: cfg, log: cfg.Logger}
	s.life.errc = make(chan error, 4)
	s.life.abortCtx, s.life.abort = context.WithCancel(context.Background())
	if s.log == nil {
		s.log = slog.New(slog.DiscardHandler)
	}
	s.initSecurity()
	s.reg, s.gather = cfg.Registerer, cfg.Gatherer
	if s.reg == nil {
		r := prometheus.NewRegistry()
		s.reg = r
		if s.gather == nil {
			s.gather = prometheus.Gatherers{r, prometheus.DefaultGatherer}
		}
	}
	if s.gather == nil {
		s.gather = prometheus.DefaultGatherer
	}
	return s, nil
}

// Start brings the server up and returns once it is ready: embedded etcd
// has joined its cluster (or the external backend answered) and the HTTP
// listener accepts connections. On error everything started is stopped.
//
// Start order: the listeners first (HTTP, DNS, xDS: a port in use fails
// before etcd writes to its data directory), /healthz served at once
// (serveEarly), then the data (openData: the embedded member, a registry
// backend or a store), then the full HTTP routes, DNS, xDS and the health
// checker over it.
func (s *Server) Start(ctx context.Context) (err error) {
	s.life.mu.Lock()
	if s.life.started {
		s.life.mu.Unlock()
		return errors.New("server: already started")
	}
	s.life.started = true
	s.life.mu.Unlock()
	defer func() {
		if err != nil {
			_ = s.Close()
			s.removeFailedFirstStart()
		}
	}()
	if err := s.listenHTTP(); err != nil { // http.go
		return err
	}
	if err := s.listenDNS(); err != nil { // dns.go
		return err
	}
	if err := s.listenXDS(); err != nil { // xds.go
		return err
	}
	s.serveEarly()
	if err := s.openData(ctx); err != nil {
		return err
	}
	if err := s.startHTTP(); err != nil {
		return err
	}
	s.logSecurityWarnings()
	if err := s.startDNS(); err != nil { // dns.go
		return err
	}
	if err := s.startXDS(); err != nil { // xds.go
		return err
	}
	if err := s.startHealth(); err != nil { // health.go
		return err
	}
	s.waitDNS(ctx)
	return nil
}

// openData brings up what the APIs serve: the injected store, the embedded
// etcd member, a registry backend, or a store backend.
func (s *Server) openData(ctx context.Context) error {
	switch {
	case s.cfg.Store != nil:
		s.data.store = s.cfg.Store
		return nil
	case s.cfg.embedded():
		// A port in use fails here, before etcd writes to the data
		// directory (startcheck.go).
		if err := probePorts(s.cfg); err != nil {
			return err
		}
		return s.startMember(ctx) // discovery.go
	case s.cfg.Backend.IsRegistry():
		return s.openRegistryBackend(ctx) // registrybackend.go
	}
	b := s.cfg.Backend
	if len(s.cfg.EtcdEndpoints) > 0 {
		b.Etcd.Endpoints = s.cfg.EtcdEndpoints
	}
	b = b.WithLogger(s.log)
	st, err := backend.Open(ctx, b)
	if err != nil {
		return fmt.Errorf("open %s backend: %w", b.BackendName(), err)
	}
	s.data.store, s.data.ownsStore = st, true
	return nil
}

// Run starts the server, serves until ctx is done or a component fails,
// then shuts down gracefully.
func (s *Server) Run(ctx context.Context) error {
	if err := s.Start(ctx); err != nil {
		return err
	}
	return s.Wait(ctx)
}

// Wait serves a started server until ctx is done or a component fails,
// then shuts down gracefully.
func (s *Server) Wait(ctx context.Context) error {
	var runErr error
	select {
	case <-ctx.Done():
	case runErr = <-s.life.errc:
		s.log.Error("server component failed; shutting down", "err", runErr)
	}
	return errors.Join(runErr, s.Close())
}

// Close shuts down gracefully within the configured timeout. Close is
// idempotent. Shutdown order — every user stops before what it uses:
//
//  1. HTTP: long-lived streams end (each says why, within
//     httpapi.EndGrace), requests drain (within Config.ShutdownTimeout,
//     or until Abort: those left are cut), the listener closes;
//  2. DNS, then xDS (readers of the registry);
//  3. the health checker (it deregisters, and its verdicts go with its
//     lease);
//  4. the discovery fallback proxy;
//  5. authentication: its janitor, and every user view (etcd clients);
//  6. the data: the v2 service, the registry, the store if the server
//     opened it;
//  7. the member: its in-process client; etcd's client RPCs, streams
//     ended after a second (clientStreamGrace: etcd would wait 7 s for
//     them, its lessor running, while no client can renew a lease), or
//     at once after Abort; then embedded etcd;
//  8. every goroutine the server started is waited for.
func (s *Server) Close() error {
	s.life.closeOnce.Do(func() {
		s.closeHTTP()     // http.go
		s.closeDNS()      // dns.go
		s.closeXDS()      // xds.go
		s.closeHealth()   // health.go
		s.boot.close()    // discovery.go
		s.closeSecurity() // authhttp.go
		errs := s.data.close()
		s.member.close(s.life.abortCtx, s.log) // member.go
		s.life.wg.Wait()
		s.life.closeErr = errors.Join(errs...)
	})
	return s.life.closeErr
}

// Abort cuts a graceful Close short, now or while it runs: HTTP requests
// still in flight are not waited for (their connections are closed). It
// is safe to call at any time, more than once.
func (s *Server) Abort() { s.life.abort() }

// Registry returns the registry behind the HTTP API (nil before Start): a
// *registry.StoreRegistry over the store, or the registry of a registry
// backend (kubernetes). Build on its narrow interfaces
// (registry.Discoverer); optional capabilities are found by type assertion.
func (s *Server) Registry() registry.Registry { return s.data.registry }

// Store returns the store behind the API (nil before Start, and for a
// registry backend such as kubernetes, which has none).
func (s *Server) Store() store.Store { return s.data.store }

// EtcdClient returns an in-process client of the embedded etcd (nil when
// not embedded).
func (s *Server) EtcdClient() *clientv3.Client { return s.member.client }

// Endpoints reports where the server listens.
type Endpoints struct {
	// ClientURLs are the embedded etcd's client URLs (empty when not
	// embedded).
	ClientURLs []string
	// PeerURLs are the embedded etcd's peer URLs.
	PeerURLs []string
	// HTTP is the base URL of the HTTP API, health and metrics.
	HTTP string
	// Backend says what stores the data: "embedded etcd", "etcd at ...",
	// "memory", ...
	Backend string
	// DataDir is the embedded etcd's data directory.
	DataDir string
}

// Endpoints returns the addresses actually bound (useful with port 0).
func (s *Server) Endpoints() Endpoints {
	var ep Endpoints
	if s.http.ln != nil {
		ep.HTTP = s.httpScheme() + "://" + s.http.ln.Addr().String()
	}
	switch {
	case s.member.etcd != nil:
		for _, l := range s.member.etcd.Clients {
			ep.ClientURLs = append(ep.ClientURLs, schemeOf(s.cfg.ListenClientURLs)+"://"+l.Addr().String())
		}
		for _, p := range s.member.etcd.Peers {
			ep.PeerURLs = append(ep.PeerURLs, schemeOf(s.cfg.ListenPeerURLs)+"://"+p.Listener.Addr().String())
		}
		ep.Backend, ep.DataDir = "embedded etcd", s.cfg.DataDir
	case s.fallbackProxy() != nil:
		ep.Backend = "proxy of the discovery token's full cluster at " + s.fallbackProxy().Addr().String()
	case s.cfg.Store != nil:
		ep.Backend = "injected store"
	case len(s.cfg.EtcdEndpoints) > 0:
		ep.Backend = "external etcd at " + strings.Join(s.cfg.EtcdEndpoints, ",")
	default:
		ep.Backend = s.cfg.Backend.BackendName()
	}
	return ep
}

func schemeOf(urls []string) string {
	if len(urls) > 0 && strings.HasPrefix(urls[0], "https:") {
		return "https"
	}
	return "http"
}

// Banner is the short description `beacon serve` prints once ready.
func (s *Server) Banner() string {
	ep := s.Endpoints()
	var b strings.Builder
	fmt.Fprintf(&b, "beacon serve is ready (%s)\n", ep.Backend)
	if len(ep.ClientURLs) > 0 {
		// Clients use the advertised URLs (the bound ones may be 0.0.0.0).
		use := ep.ClientURLs
		if adv := s.cfg.AdvertiseClientURLs; len(adv) > 0 && !strings.HasSuffix(strings.Join(adv, ","), ":0") && !strings.Contains(strings.Join(adv, ","), ":0,") {
			use = adv
		}
		fmt.Fprintf(&b, "  etcd clients  %s   (etcdctl --endpoints=%s ...)\n", strings.Join(ep.ClientURLs, ","), strings.Join(use, ","))
		fmt.Fprintf(&b, "  etcd peers    %s\n", strings.Join(ep.PeerURLs, ","))
		fmt.Fprintf(&b, "  data dir      %s\n", ep.DataDir)
	}
	if httpAddr := strings.TrimPrefix(ep.HTTP, "http://"); loopbackIfUnspecified(httpAddr) != httpAddr {
		fmt.Fprintf(&b, "  HTTP API      %s on every interface, e.g. http://%s   (/healthz /readyz /metrics)\n", ep.HTTP, loopbackIfUnspecified(httpAddr))
	} else {
		fmt.Fprintf(&b, "  HTTP API      %s   (/healthz /readyz /metrics)\n", ep.HTTP)
	}
	// Where a browser on this host opens the dashboard.
	dash := ep.HTTP
	if httpAddr := strings.TrimPrefix(ep.HTTP, "http://"); loopbackIfUnspecified(httpAddr) != httpAddr {
		dash = "http://" + loopbackIfUnspecified(httpAddr)
	}
	fmt.Fprintf(&b, "  dashboard     %s/ui/\n", dash)
	if a := s.DNSAddr(); a != "" && s.dns.srv != nil {
		fmt.Fprintf(&b, "  DNS           %s udp+tcp, zone %s   (dig @%s -p %s SRV <endpoint>.<component>.<namespace>.%s)\n", a, s.dns.srv.Domain(), hostOf(loopbackIfUnspecified(a)), portOf(a), s.dns.srv.Domain())
	}
	if a := s.XDSAddr(); a != "" && s.xds.srv != nil {
		fmt.Fprintf(&b, "  xDS           %s gRPC ADS   (GRPC_XDS_BOOTSTRAP from: beacon xds bootstrap --server %s; dial xds:///<endpoint>.<component>.<namespace>)\n", a, loopbackIfUnspecified(a))
	}
	for _, w := range s.securityWarnings() {
		fmt.Fprintf(&b, "  WARNING       %s\n", w)
	}
	return b.String()
}

// fail reports a component failure to Run without blocking.
func (s *Server) fail(err error) {
	select {
	case s.life.errc <- err:
	default:
	}
}

// listen opens a TCP listener, turning "address in use" into advice that
// names the Config field of the address.
func listen(addr, field string) (net.Listener, error) {
	ln, err := net.Listen("tcp", addr)
	if err != nil {
		if errors.Is(err, syscall.EADDRINUSE) {
			return nil, fmt.Errorf("%s %s: address already in use (is another beacon serve running?): choose another with %s", field, addr, field)
		}
		return nil, fmt.Errorf("%s %s: %w", field, addr, err)
	}
	return ln, nil
}
