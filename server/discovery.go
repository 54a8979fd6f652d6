package server

import (
	"context"
	"errors"
	"fmt"
	"log/slog"
	"net/url"
	"os"
	"path/filepath"
	"strings"
	"sync"
	"time"

	"github.com/beaconplane/beacon/bootstrap"
	"github.com/beaconplane/beacon/proxy"
	etcdstore "github.com/beaconplane/beacon/store/etcd"
	"github.com/prometheus/client_golang/prometheus"
)

// Values of DiscoveryConfig.Fallback (etcd's --discovery-fallback).
const (
	FallbackExit  = "exit"
	FallbackProxy = "proxy"
)

// DiscoveryConfig makes a new embedded etcd member join its cluster
// through an etcd v3 discovery token (etcd's --discovery-* flags).
type DiscoveryConfig struct {
	// Config is the v3 discovery token to join and how to reach its
	// registry (--discovery-token, --discovery-endpoints and the other
	// --discovery-* flags of etcd). With a token set, a new embedded etcd
	// member registers under it, waits until the token's cluster is
	// complete, and starts with the --initial-cluster the registry gives
	// (the token is the initial cluster token). A data directory that
	// already holds a member starts from it, ignoring the token, as etcd
	// does. Config.Logger is ignored: the server's logger is used.
	bootstrap.Config
	// Fallback is what a member does when the token's cluster is already
	// full: FallbackExit (the default) fails Start with
	// bootstrap.ErrFullCluster; FallbackProxy serves a readwrite etcd
	// proxy of that cluster on the first --listen-client-urls address
	// instead of running a member.
	Fallback string
	// Timeout bounds the wait for the token to fill; zero waits until
	// Start's context ends (etcd waits forever).
	Timeout time.Duration
}

// joining reports whether the member bootstraps through a token.
func (d DiscoveryConfig) joining() bool { return d.Token != "" || len(d.Endpoints) > 0 }

// validate checks the discovery settings of c (after defaults).
func (d DiscoveryConfig) validate(c Config) []error {
	var errs []error
	if d.Fallback != "" && d.Fallback != FallbackExit && d.Fallback != FallbackProxy {
		errs = append(errs, fmt.Errorf("Config.Discovery.Fallback %q: must be %s or %s", d.Fallback, FallbackExit, FallbackProxy))
	}
	if d.Timeout < 0 {
		errs = append(errs, fmt.Errorf("Config.Discovery.Timeout %v: must not be negative", d.Timeout))
	}
	if !d.joining() {
		return errs
	}
	switch {
	case d.Token == "" || len(d.Endpoints) == 0:
		errs = append(errs, errors.New("both Config.Discovery.Token and Config.Discovery.Endpoints must be set"))
	case !c.embedded():
		errs = append(errs, errors.New("Config.Discovery.Token bootstraps the embedded etcd: it cannot be used with Config.EtcdEndpoints or a non-etcd Config.Backend"))
	case c.InitialCluster != "":
		errs = append(errs, errors.New(`Config.InitialCluster and Config.Discovery.Token are both set: choose one (the token's registry gives the initial cluster)`))
	case c.InitialClusterState != "new":
		errs = append(errs, errors.New("Config.Discovery.Token bootstraps a new cluster: Config.InitialClusterState must be new (to add a member to a running cluster, use etcdctl member add and Config.InitialCluster)"))
	default:
		if err := d.Config.Validate(); err != nil {
			errs = append(errs, fmt.Errorf("Config.Discovery: %w", err))
		}
	}
	return errs
}

// bootstrapState is what the bootstrap integration owns inside a Server:
// the fallback proxy, when the token's cluster was full.
type bootstrapState struct {
	mu    sync.Mutex
	proxy *proxy.Proxy
	// stopProxy ends the fallback proxy's Serve; proxyDone is closed when
	// Serve has returned.
	stopProxy context.CancelFunc
	proxyDone chan struct{}
}

// close stops the fallback proxy, if any.
func (b *bootstrapState) close() {
	b.mu.Lock()
	p, stop, done := b.proxy, b.stopProxy, b.proxyDone
	b.mu.Unlock()
	if p != nil {
		_ = p.Close()
		stop()
		<-done
	}
}

// startMember starts the embedded etcd member, first joining its cluster
// through the discovery token when one is configured, or runs the
// fallback proxy when that cluster is already full.
func (s *Server) startMember(ctx context.Context) error {
	if s.cfg.Discovery.joining() {
		proxied, err := s.discover(ctx)
		if err != nil {
			return err
		}
		if proxied {
			return nil
		}
	}
	if err := s.startEtcd(ctx); err != nil {
		return err
	}
	if err := s.bootstrapAuth(ctx); err != nil { // authboot.go
		return err
	}
	cli, err := s.embeddedClient()
	if err != nil {
		return err
	}
	s.member.client = cli
	s.data.store, s.data.ownsStore = etcdstore.NewFromClient(s.member.client), true
	return nil
}

// discover joins the token's cluster and sets the initial cluster of the
// member about to start; proxied is true when the cluster was full and
// the fallback proxy now serves instead.
func (s *Server) discover(ctx context.Context) (proxied bool, err error) {
	d := s.cfg.Discovery
	lg := s.log.With("component", "discovery", "discovery-token", d.Token)
	if hasWAL(s.cfg.DataDir) {
		lg.Warn("discovery token is ignored since the data directory already holds a member", "data-dir", s.cfg.DataDir)
		s.cfg.InitialCluster = selfCluster(s.cfg)
		return false, nil
	}
	if d.Timeout > 0 {
		var cancel context.CancelFunc
		ctx, cancel = context.WithTimeout(ctx, d.Timeout)
		defer cancel()
	}
	bcfg := d.Config
	bcfg.Logger = s.log.With("component", "discovery") // bootstrap adds the token
	lg.Info("joining the cluster through the discovery token", "discovery-endpoints", strings.Join(d.Endpoints, ","),
		"peer-urls", strings.Join(s.cfg.AdvertisePeerURLs, ","))
	cluster, err := bootstrap.Join(ctx, bcfg, s.cfg.Name, s.cfg.AdvertisePeerURLs,
		bootstrap.WithProgress(func(p bootstrap.Progress) {
			if p.Err != nil {
				return // bootstrap logged the retry, with its reason
			}
			lg.Info("discovery progress", "progress", p.String(), "registered", p.Registered, "size", p.Size)
		}))
	switch {
	case errors.Is(err, bootstrap.ErrFullCluster) && d.Fallback == FallbackProxy:
		lg.Warn("discovery cluster full, falling back to proxy", "err", err)
		return true, s.startFallbackProxy(ctx, lg)
	case errors.Is(err, bootstrap.ErrFullCluster):
		return false, fmt.Errorf("failed to join discovery cluster: %w (Config.Discovery.Fallback=%s; use Config.Discovery.Fallback=proxy to serve as a proxy of that cluster instead)",
			err, FallbackExit)
	case err != nil:
		return false, fmt.Errorf("failed to join discovery cluster: %w", err)
	}
	lg.Info("joined the cluster through the discovery token", "initial-cluster", cluster.InitialCluster)
	s.cfg.InitialCluster = cluster.InitialCluster
	s.cfg.InitialClusterToken = cluster.Token
	s.cfg.InitialClusterState = "new"
	return false, nil
}

// hasWAL reports whether dir already holds an etcd member's log.
func hasWAL(dir string) bool {
	entries, err := os.ReadDir(filepath.Join(dir, "member", "wal"))
	if err != nil {
		return false
	}
	for _, e := range entries {
		if strings.HasSuffix(e.Name(), ".wal") {
			return true
		}
	}
	return false
}

func selfCluster(c Config) string {
	pairs := make([]string, len(c.AdvertisePeerURLs))
	for i, u := range c.AdvertisePeerURLs {
		pairs[i] = c.Name + "=" + u
	}
	return strings.Join(pairs, ",")
}

// startFallbackProxy serves a readwrite proxy of the token's (full)
// cluster where this member's clients would connect, and makes the HTTP
// API use the cluster through it.
func (s *Server) startFallbackProxy(ctx context.Context, lg *slog.Logger) error {
	u, err := url.Parse(s.cfg.ListenClientURLs[0])
	if err != nil {
		return err
	}
	// The whole discovery configuration, so that the proxy reaches the
	// discovery service with the same TLS and credentials as the member.
	d := s.cfg.Discovery.Config
	pcfg := proxy.Config{
		Mode:       proxy.ReadWrite,
		ListenAddr: u.Host,
		Discovery:  &d,
		Logger:     s.log,
	}
	if reg, ok := s.reg.(*prometheus.Registry); ok {
		pcfg.Registry = reg
	}
	scheme, scfg, err := s.fallbackSecurity(&pcfg) // tls.go
	if err != nil {
		return fmt.Errorf("discovery fallback proxy: %w", err)
	}
	p, err := proxy.New(pcfg)
	if err != nil {
		return fmt.Errorf("discovery fallback proxy: %w", err)
	}
	ln, err := listen(u.Host, "Config.ListenClientURLs")
	if err != nil {
		return err
	}
	pctx, stop := context.WithCancel(context.Background())
	done := make(chan struct{})
	serveErr := make(chan error, 1)
	s.boot.mu.Lock()
	s.boot.proxy, s.boot.stopProxy, s.boot.proxyDone = p, stop, done
	s.boot.mu.Unlock()
	s.life.wg.Add(1)
	go func() {
		defer s.life.wg.Done()
		defer close(done)
		if err := p.Serve(pctx, ln); err != nil {
			serveErr <- err
			s.fail(fmt.Errorf("discovery fallback proxy: %w", err))
		}
	}()
	select {
	case <-p.Ready():
	case err := <-serveErr:
		return fmt.Errorf("discovery fallback proxy: %w", err)
	case <-ctx.Done():
		return fmt.Errorf("discovery fallback proxy not ready: %w", context.Cause(ctx))
	}
	addr := scheme + "://" + p.Addr().String()
	scfg.Endpoints = []string{addr}
	s.fallbackStore = scfg
	st, err := etcdstore.Open(ctx, scfg)
	if err != nil {
		return fmt.Errorf("discovery fallback proxy: reach the cluster through %s: %w", addr, err)
	}
	s.data.store, s.data.ownsStore = st, true
	lg.Warn("serving as a readwrite proxy of the discovery token's cluster", "listen", addr)
	return nil
}

// fallbackProxy returns the fallback proxy, or nil when the server runs a
// member.
func (s *Server) fallbackProxy() *proxy.Proxy {
	s.boot.mu.Lock()
	defer s.boot.mu.Unlock()
	return s.boot.proxy
}
