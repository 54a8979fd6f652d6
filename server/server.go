package server

import (
	"context"
	"errors"
	"fmt"
	"log/slog"
	"net"
	"net/http"
	"net/url"
	"os"
	"path/filepath"
	"strings"
	"sync"
	"sync/atomic"
	"syscall"
	"time"

	v2 "github.com/beaconplane/beacon/bootstrap/v2"
	"github.com/beaconplane/beacon/internal/httpapi"
	"github.com/beaconplane/beacon/registry"
	"github.com/beaconplane/beacon/store"
	"github.com/beaconplane/beacon/store/backend"
	"github.com/prometheus/client_golang/prometheus"
	"go.etcd.io/etcd/client/pkg/v3/types"
	clientv3 "go.etcd.io/etcd/client/v3"
	"go.etcd.io/etcd/server/v3/embed"
	"go.uber.org/zap/zapcore"
)

// etcdStartTimeout bounds how long embedded etcd may take to become ready
// when the caller's context has no deadline.
const etcdStartTimeout = 60 * time.Second

// Server is `beacon serve`: embedded etcd (or a front over an external
// cluster, or another backend), and one HTTP listener for the API, health
// and metrics. Create it with New, then Start (or Run); Close stops it.
type Server struct {
	cfg    Config
	log    *slog.Logger
	reg    prometheus.Registerer
	gather prometheus.Gatherer

	mu        sync.Mutex
	started   bool
	etcd      *embed.Etcd
	client    *clientv3.Client // in-process client of the embedded etcd
	store     store.Store
	ownsStore bool
	httpLn    net.Listener
	registry  registry.Registry
	v2        *v2.Service
	httpSrv   *http.Server
	routes    *httpapi.Mux                 // the full routes, once installed
	handler   atomic.Pointer[http.Handler] // what httpSrv serves: early, then full
	stopHTTP  context.CancelFunc           // ends long-lived HTTP streams (SSE)
	wg        sync.WaitGroup
	errc      chan error
	boot      bootstrapState // discovery fallback proxy (discovery.go)
	dns       dnsState       // DNS interface (dns.go)
	xds       xdsState       // xDS interface (xds.go)
	closeOnce sync.Once
	closeErr  error
	// abortCtx bounds Close's graceful part; Abort ends it.
	abortCtx context.Context
	abort    context.CancelFunc
	// etcdClosing is set when Close stops embedded etcd (etcdlog.go).
	etcdClosing atomic.Bool
	// etcdRemoved is set when etcd says this member was removed from its
	// cluster (etcdlog.go).
	etcdRemoved atomic.Bool
	// dataDir is what the data directory held before etcd started, and
	// etcdReady whether etcd joined its cluster (startcheck.go).
	dataDir   *dataDirGuard
	etcdReady bool
	security  // TLS, authentication, limits (tls.go, auth*.go, limits.go)
}

// removeFailedFirstStart removes, after a failed first start, what it
// wrote to the data directory, unless the member had joined a cluster of
// several members (they now count it as a member: its data must stay).
func (s *Server) removeFailedFirstStart() {
	if s.dataDir == nil || !s.dataDir.first {
		return
	}
	if s.etcdReady {
		if m, err := types.NewURLsMap(s.cfg.InitialCluster); err != nil || len(m) > 1 {
			return
		}
	}
	if err := s.dataDir.cleanup(); err != nil {
		s.log.Warn("could not remove what the failed start wrote to the data directory", "data-dir", s.cfg.DataDir, "err", err)
	}
}

// New validates cfg and returns a server that is not yet running.
func New(cfg Config) (*Server, error) {
	if err := cfg.Validate(); err != nil {
		return nil, err
	}
	cfg = cfg.withDefaults()
	s := &Server{cfg: cfg, log: cfg.Logger, errc: make(chan error, 4)}
	s.abortCtx, s.abort = context.WithCancel(context.Background())
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
func (s *Server) Start(ctx context.Context) (err error) {
	s.mu.Lock()
	if s.started {
		s.mu.Unlock()
		return errors.New("server: already started")
	}
	s.started = true
	s.mu.Unlock()
	defer func() {
		if err != nil {
			_ = s.Close()
			s.removeFailedFirstStart()
		}
	}()
	// Take the HTTP port first: a port in use fails fast, before etcd
	// writes anything to the data directory.
	ln, err := listen(s.cfg.HTTPAddr, "--http-addr")
	if err != nil {
		return err
	}
	ln = limitConns(ln, s.sec.MaxConns, s.sec.MaxConnsPerClient, s.log.With("component", "http"))
	if ln, err = s.secureHTTPListener(ln); err != nil {
		return err
	}
	s.httpLn = ln
	if err := s.listenDNS(); err != nil { // dns.go
		return err
	}
	if err := s.listenXDS(); err != nil { // xds.go
		return err
	}
	s.serveEarly()

	switch {
	case s.cfg.Store != nil:
		s.store = s.cfg.Store
	case s.cfg.embedded():
		// A port in use fails here, before etcd writes to the data
		// directory (startcheck.go).
		if err := probePorts(s.cfg); err != nil {
			return err
		}
		if err := s.startMember(ctx); err != nil { // discovery.go
			return err
		}
	case s.cfg.Backend.IsRegistry():
		if err := s.openRegistryBackend(ctx); err != nil { // registrybackend.go
			return err
		}
	default:
		b := s.cfg.Backend
		if len(s.cfg.EtcdEndpoints) > 0 {
			b.Etcd.Endpoints = s.cfg.EtcdEndpoints
		}
		if b.Etcd.Logger == nil {
			b.Etcd.Logger = s.log
		}
		st, err := backend.Open(ctx, b)
		if err != nil {
			return fmt.Errorf("open %s backend: %w", b.BackendName(), err)
		}
		s.store, s.ownsStore = st, true
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
	s.waitDNS(ctx)
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
	case runErr = <-s.errc:
		s.log.Error("server component failed; shutting down", "err", runErr)
	}
	return errors.Join(runErr, s.Close())
}

// Close shuts down gracefully within the configured timeout: the HTTP
// listener stops (open streams end), then the store and embedded etcd.
// Close is idempotent.
func (s *Server) Close() error {
	s.closeOnce.Do(func() {
		var errs []error
		s.mu.Lock()
		httpSrv, ln := s.httpSrv, s.httpLn
		s.mu.Unlock()
		if s.stopHTTP != nil {
			s.stopHTTP()
		}
		if httpSrv != nil {
			ctx, cancel := context.WithTimeout(s.abortCtx, s.cfg.ShutdownTimeout)
			if err := httpSrv.Shutdown(ctx); err != nil {
				if s.abortCtx.Err() == nil { // not cut short by Abort on purpose
					errs = append(errs, fmt.Errorf("http shutdown: %w", err))
				}
				_ = httpSrv.Close()
			}
			cancel()
		} else if ln != nil {
			_ = ln.Close()
		}
		s.closeDNS()
		s.closeXDS()
		s.boot.close()
		s.closeSecurity()
		if s.v2 != nil {
			_ = s.v2.Close()
		}
		if s.registry != nil {
			if err := s.registry.Close(); err != nil {
				errs = append(errs, fmt.Errorf("close registry: %w", err))
			}
		}
		if s.ownsStore && s.store != nil {
			if err := s.store.Close(); err != nil {
				errs = append(errs, fmt.Errorf("close store: %w", err))
			}
		}
		if s.client != nil {
			_ = s.client.Close()
		}
		if s.etcd != nil {
			s.etcdClosing.Store(true) // its listeners' loops end now: not errors (etcdlog.go)
			if !s.etcdReady {
				// embed's Close waits for the client servers, which wait
				// for readiness or for the server to stop: a member
				// that never became ready (no quorum) must be stopped
				// first, or Close never returns.
				s.etcd.Server.HardStop()
			}
			s.etcd.Close()
		}
		s.wg.Wait()
		s.closeErr = errors.Join(errs...)
	})
	return s.closeErr
}

// Abort cuts a graceful Close short, now or while it runs: HTTP requests
// still in flight are not waited for (their connections are closed). It
// is safe to call at any time, more than once.
func (s *Server) Abort() { s.abort() }

// Registry returns the registry behind the HTTP API (nil before Start): a
// *registry.StoreRegistry over the store, or the registry of a registry
// backend (kubernetes). Build on its narrow interfaces
// (registry.Discoverer); optional capabilities are found by type assertion.
func (s *Server) Registry() registry.Registry { return s.registry }

// Store returns the store behind the API (nil before Start, and for a
// registry backend such as kubernetes, which has none).
func (s *Server) Store() store.Store { return s.store }

// EtcdClient returns an in-process client of the embedded etcd (nil when
// not embedded).
func (s *Server) EtcdClient() *clientv3.Client { return s.client }

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
	if s.httpLn != nil {
		ep.HTTP = s.httpScheme() + "://" + s.httpLn.Addr().String()
	}
	switch {
	case s.etcd != nil:
		for _, l := range s.etcd.Clients {
			ep.ClientURLs = append(ep.ClientURLs, schemeOf(s.cfg.ListenClientURLs)+"://"+l.Addr().String())
		}
		for _, p := range s.etcd.Peers {
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

// startEtcd starts embedded etcd and waits until it is ready.
func (s *Server) startEtcd(ctx context.Context) error {
	s.dataDir = guardDataDir(s.cfg.DataDir) // startcheck.go
	if err := checkDataDir(s.cfg.DataDir); err != nil {
		return err
	}
	ecfg, err := s.etcdConfig()
	if err != nil {
		return err
	}
	e, err := embed.StartEtcd(ecfg)
	if err != nil {
		return explainEtcdError(err)
	}
	s.etcd = e
	if _, ok := ctx.Deadline(); !ok {
		var cancel context.CancelFunc
		ctx, cancel = context.WithTimeout(ctx, etcdStartTimeout)
		defer cancel()
	}
	select {
	case <-e.Server.ReadyNotify():
		s.etcdReady = true
	case err := <-e.Err():
		if rerr := s.removedErr(e); rerr != nil {
			return rerr
		}
		return fmt.Errorf("embedded etcd failed while starting: %w", explainEtcdError(err))
	case <-e.Server.StopNotify():
		return s.etcdStopped(e)
	case <-ctx.Done():
		return fmt.Errorf("embedded etcd not ready (has the cluster a quorum? see --initial-cluster): %w", context.Cause(ctx))
	}
	s.wg.Add(1)
	go func() {
		defer s.wg.Done()
		select {
		case err, ok := <-e.Err():
			if ok && err != nil {
				s.fail(fmt.Errorf("embedded etcd: %w", err))
			}
		case <-e.Server.StopNotify():
			// Stopped by Close, or by etcd itself (e.g. removed from
			// its cluster); Close is idempotent, so report either way.
			s.fail(s.etcdStopped(e))
		}
	}()
	return nil
}

// etcdStopped explains why the embedded etcd stopped on its own: most
// often this member was removed from its cluster, which etcd reports only
// as a warning in its log, and which needs the operator to act.
func (s *Server) etcdStopped(e *embed.Etcd) error {
	if err := s.removedErr(e); err != nil {
		return err
	}
	return errors.New("embedded etcd stopped on its own (its log above says why)")
}

// removedErr says what to do when this member has been removed from its
// cluster (while running, or before it was started again with its old data
// directory); nil when it has not.
func (s *Server) removedErr(e *embed.Etcd) error {
	cluster, ok := e.Server.Cluster().(interface{ IsIDRemoved(types.ID) bool })
	if !s.etcdRemoved.Load() && (!ok || !cluster.IsIDRemoved(e.Server.MemberID())) {
		return nil
	}
	return fmt.Errorf("embedded etcd stopped: this member (%s, ID %s) was removed from its cluster (etcdctl member remove); "+
		"it cannot serve again with its data: to rejoin, remove --data-dir %s, add it back (etcdctl member add %s --peer-urls=...) "+
		"and start it with --initial-cluster-state existing and --initial-cluster set to the list member add prints (ETCD_INITIAL_CLUSTER)", s.cfg.Name, e.Server.MemberID(), s.cfg.DataDir, s.cfg.Name)
}

// fail reports a component failure to Run without blocking.
func (s *Server) fail(err error) {
	select {
	case s.errc <- err:
	default:
	}
}

func (s *Server) etcdConfig() (*embed.Config, error) {
	c := s.cfg
	ec := embed.NewConfig()
	ec.Name = c.Name
	ec.Dir = c.DataDir
	var err error
	parse := func(flag string, in []string) []url.URL {
		out := make([]url.URL, 0, len(in))
		for _, raw := range in {
			u, perr := url.Parse(raw)
			if perr != nil {
				err = errors.Join(err, fmt.Errorf("--%s %q: %w", flag, raw, perr))
				continue
			}
			out = append(out, *u)
		}
		return out
	}
	ec.ListenClientUrls = parse("listen-client-urls", c.ListenClientURLs)
	ec.AdvertiseClientUrls = parse("advertise-client-urls", c.AdvertiseClientURLs)
	ec.ListenPeerUrls = parse("listen-peer-urls", c.ListenPeerURLs)
	ec.AdvertisePeerUrls = parse("initial-advertise-peer-urls", c.AdvertisePeerURLs)
	if err != nil {
		return nil, err
	}
	ec.InitialCluster = c.InitialCluster
	ec.ClusterState = c.InitialClusterState
	ec.InitialClusterToken = c.InitialClusterToken
	ec.UnsafeNoFsync = c.UnsafeNoFsync
	level := zapcore.WarnLevel
	if c.EtcdLogLevel != nil {
		level = *c.EtcdLogLevel
	}
	ec.ZapLoggerBuilder = embed.NewZapLoggerBuilder(etcdLogger(s.log.With("component", "etcd"), level, &s.etcdClosing, &s.etcdRemoved))
	if err := s.applySecurity(ec); err != nil {
		return nil, err
	}
	return ec, nil
}

// checkDataDir creates the data directory if needed and checks that it is
// a writable directory, so that a bad --data-dir gives one clear line.
func checkDataDir(dir string) error {
	if fi, err := os.Stat(dir); err == nil && !fi.IsDir() {
		return fmt.Errorf("--data-dir %q exists and is not a directory: choose another path", dir)
	}
	if err := os.MkdirAll(dir, 0o700); err != nil {
		return fmt.Errorf("--data-dir %q cannot be created: %w", dir, unwrapPath(err))
	}
	probe, err := os.CreateTemp(dir, ".beacon-probe-*")
	if err != nil {
		return fmt.Errorf("--data-dir %q is not writable: %w", dir, unwrapPath(err))
	}
	name := probe.Name()
	_ = probe.Close()
	_ = os.Remove(name)
	if abs, err := filepath.Abs(dir); err == nil && abs == "/" {
		return fmt.Errorf("--data-dir %q: refusing to use the root directory", dir)
	}
	return nil
}

func unwrapPath(err error) error {
	var pe *os.PathError
	if errors.As(err, &pe) {
		return pe.Err
	}
	return err
}

// listen opens a TCP listener, turning "address in use" into advice.
func listen(addr, flag string) (net.Listener, error) {
	ln, err := net.Listen("tcp", addr)
	if err != nil {
		if errors.Is(err, syscall.EADDRINUSE) {
			return nil, fmt.Errorf("%s %s: address already in use (is another beacon serve running?): choose another with %s", flag, addr, flag)
		}
		return nil, fmt.Errorf("%s %s: %w", flag, addr, err)
	}
	return ln, nil
}

// explainEtcdError adds advice to embedded etcd's start errors.
func explainEtcdError(err error) error {
	if errors.Is(err, syscall.EADDRINUSE) {
		return fmt.Errorf("%w: a port of --listen-client-urls or --listen-peer-urls is in use (another beacon serve or etcd?): choose other URLs", err)
	}
	if errors.Is(err, syscall.EACCES) || errors.Is(err, syscall.EROFS) {
		return fmt.Errorf("%w: check --data-dir permissions", err)
	}
	return err
}
