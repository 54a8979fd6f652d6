// Package etcdtest runs a real etcd server in-process for tests: the etcd
// 3.7 server code (go.etcd.io/etcd/server/v3/embed) on loopback ports chosen
// at start, with data in a temporary directory, optionally with client TLS
// (mutual) and user/password authentication. A server can be stopped and
// restarted on the same data directory and ports, for fault drills.
package etcdtest

import (
	"context"
	"crypto/tls"
	"errors"
	"fmt"
	"net/url"
	"os"
	"sync"
	"testing"
	"time"

	"github.com/beaconplane/beacon/internal/testkit/testcerts"
	"go.etcd.io/etcd/client/pkg/v3/transport"
	clientv3 "go.etcd.io/etcd/client/v3"
	"go.etcd.io/etcd/server/v3/embed"
	"go.uber.org/zap"
	"golang.org/x/crypto/bcrypt"
)

// StartTimeout bounds how long a server may take to become ready.
const StartTimeout = 30 * time.Second

// Options configure a test server.
type Options struct {
	// Name of the member; "beacon-test" by default.
	Name string
	// Dir is the data directory; a new temporary directory by default.
	Dir string
	// TLS serves clients over TLS and requires client certificates.
	TLS bool
	// User and Password, when set, enable etcd authentication with this
	// user as root.
	User, Password string
	// Configure, when set, adjusts the embed configuration before start
	// (for example discovery settings or a cluster of several members).
	Configure func(*embed.Config)
	// Verbose keeps etcd's logs (also enabled by BEACON_TEST_ETCD_LOG=1).
	Verbose bool
}

// Server is a running (or stopped) embedded etcd.
type Server struct {
	opts       Options
	clientURL  url.URL
	peerURL    url.URL
	certs      testcerts.Files
	certDir    string
	mu         sync.Mutex
	etcd       *embed.Etcd
	cleanupDir bool
}

// Start starts a server and stops it when the test ends.
func Start(tb testing.TB, opts Options) *Server {
	tb.Helper()
	if opts.Dir == "" {
		opts.Dir = tb.TempDir()
	}
	s, err := New(opts)
	if err != nil {
		tb.Fatalf("etcdtest: %v", err)
	}
	tb.Cleanup(s.Close)
	return s
}

// New starts a server; the caller must Stop it (and, if Options.Dir was
// empty, Stop also removes the temporary directory it made).
func New(opts Options) (*Server, error) {
	if opts.Name == "" {
		opts.Name = "beacon-test"
	}
	s := &Server{opts: opts}
	if s.opts.Dir == "" {
		dir, err := os.MkdirTemp("", "etcdtest-")
		if err != nil {
			return nil, err
		}
		s.opts.Dir, s.cleanupDir = dir, true
	}
	scheme := "http"
	if opts.TLS {
		scheme = "https"
		certDir, err := os.MkdirTemp("", "etcdtest-certs-")
		if err != nil {
			return nil, err
		}
		s.certDir = certDir
		if s.certs, err = testcerts.Write(certDir); err != nil {
			return nil, err
		}
	}
	// Ports are chosen once so that a restart keeps them; if another
	// process takes one in between, try again with new ones.
	var lastErr error
	for range 5 {
		cport, err1 := FreePort()
		pport, err2 := FreePort()
		if err := errors.Join(err1, err2); err != nil {
			return nil, err
		}
		s.clientURL = url.URL{Scheme: scheme, Host: fmt.Sprintf("127.0.0.1:%d", cport)}
		s.peerURL = url.URL{Scheme: "http", Host: fmt.Sprintf("127.0.0.1:%d", pport)}
		if lastErr = s.start(); lastErr == nil {
			break
		}
	}
	if lastErr != nil {
		s.Close()
		return nil, lastErr
	}
	if opts.User != "" {
		if err := s.enableAuth(); err != nil {
			s.Stop()
			return nil, err
		}
	}
	return s, nil
}

func (s *Server) config() *embed.Config {
	cfg := embed.NewConfig()
	cfg.Name = s.opts.Name
	cfg.Dir = s.opts.Dir
	cfg.ListenClientUrls = []url.URL{s.clientURL}
	cfg.AdvertiseClientUrls = []url.URL{s.clientURL}
	cfg.ListenPeerUrls = []url.URL{s.peerURL}
	cfg.AdvertisePeerUrls = []url.URL{s.peerURL}
	cfg.InitialCluster = cfg.Name + "=" + s.peerURL.String()
	cfg.UnsafeNoFsync = true
	// etcd's --bcrypt-cost at its minimum: at the default cost a password
	// check takes seconds under -race on a busy two-core machine, longer
	// than the dial timeouts whose errors tests check (a wrong password
	// must fail as "authentication failed", not as a timeout).
	cfg.BcryptCost = uint(bcrypt.MinCost)
	if s.opts.TLS {
		cfg.ClientTLSInfo = transport.TLSInfo{
			CertFile:       s.certs.ServerCert,
			KeyFile:        s.certs.ServerKey,
			TrustedCAFile:  s.certs.CA,
			ClientCertAuth: true,
		}
	}
	if !s.opts.Verbose && os.Getenv("BEACON_TEST_ETCD_LOG") == "" {
		cfg.ZapLoggerBuilder = embed.NewZapLoggerBuilder(zap.NewNop())
	}
	if s.opts.Configure != nil {
		s.opts.Configure(cfg)
	}
	return cfg
}

func (s *Server) start() error {
	e, err := embed.StartEtcd(s.config())
	if err != nil {
		return fmt.Errorf("start etcd: %w", err)
	}
	select {
	case <-e.Server.ReadyNotify():
	case err := <-e.Err():
		e.Close()
		return fmt.Errorf("etcd failed while starting: %w", err)
	case <-time.After(StartTimeout):
		e.Close()
		return fmt.Errorf("etcd not ready after %v", StartTimeout)
	}
	s.mu.Lock()
	s.etcd = e
	s.mu.Unlock()
	return nil
}

func (s *Server) enableAuth() error {
	cli, err := clientv3.New(s.baseConfig())
	if err != nil {
		return err
	}
	defer cli.Close()
	ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
	defer cancel()
	if _, err := cli.UserAdd(ctx, s.opts.User, s.opts.Password); err != nil {
		return fmt.Errorf("add user: %w", err)
	}
	if _, err := cli.RoleAdd(ctx, "root"); err != nil {
		return fmt.Errorf("add role: %w", err)
	}
	if _, err := cli.UserGrantRole(ctx, s.opts.User, "root"); err != nil {
		return fmt.Errorf("grant role: %w", err)
	}
	if s.opts.User != "root" {
		if _, err := cli.UserAdd(ctx, "root", s.opts.Password); err != nil {
			return fmt.Errorf("add root: %w", err)
		}
		if _, err := cli.UserGrantRole(ctx, "root", "root"); err != nil {
			return fmt.Errorf("grant root: %w", err)
		}
	}
	if _, err := cli.AuthEnable(ctx); err != nil {
		return fmt.Errorf("enable auth: %w", err)
	}
	return nil
}

// Endpoints returns the client URLs, e.g. ["http://127.0.0.1:41234"].
func (s *Server) Endpoints() []string { return []string{s.clientURL.String()} }

// Endpoint returns the client URL.
func (s *Server) Endpoint() string { return s.clientURL.String() }

// PeerURL returns the peer URL.
func (s *Server) PeerURL() string { return s.peerURL.String() }

// Dir returns the data directory.
func (s *Server) Dir() string { return s.opts.Dir }

// Certs returns the TLS files (zero unless Options.TLS).
func (s *Server) Certs() testcerts.Files { return s.certs }

// Etcd returns the embedded server (nil while stopped).
func (s *Server) Etcd() *embed.Etcd {
	s.mu.Lock()
	defer s.mu.Unlock()
	return s.etcd
}

func (s *Server) baseConfig() clientv3.Config {
	cfg := clientv3.Config{
		Endpoints:   s.Endpoints(),
		DialTimeout: 5 * time.Second,
		Logger:      zap.NewNop(),
	}
	if s.opts.TLS {
		info := transport.TLSInfo{CertFile: s.certs.ClientCert, KeyFile: s.certs.ClientKey, TrustedCAFile: s.certs.CA}
		tlsCfg, err := info.ClientConfig()
		if err != nil {
			panic(fmt.Sprintf("etcdtest: client TLS: %v", err))
		}
		cfg.TLS = tlsCfg
	}
	return cfg
}

// ClientConfig returns a client configuration that reaches the server with
// its TLS material and credentials.
func (s *Server) ClientConfig() clientv3.Config {
	cfg := s.baseConfig()
	cfg.Username, cfg.Password = s.opts.User, s.opts.Password
	return cfg
}

// TLSConfig returns the client TLS configuration (nil without TLS).
func (s *Server) TLSConfig() *tls.Config { return s.ClientConfig().TLS }

// Client returns a client closed when the test ends.
func (s *Server) Client(tb testing.TB) *clientv3.Client {
	tb.Helper()
	cli, err := clientv3.New(s.ClientConfig())
	if err != nil {
		tb.Fatalf("etcdtest: client: %v", err)
	}
	tb.Cleanup(func() { _ = cli.Close() })
	return cli
}

// Stop stops the server, keeping its data directory for Restart (a
// temporary directory New made itself is removed). Stop is idempotent.
func (s *Server) Stop() {
	s.mu.Lock()
	e := s.etcd
	s.etcd = nil
	s.mu.Unlock()
	if e != nil {
		e.Close()
	}
}

// Restart starts a stopped server again on the same data directory and
// ports.
func (s *Server) Restart() error {
	if s.Etcd() != nil {
		return errors.New("etcdtest: restart of a running server")
	}
	return s.start()
}

// Close stops the server and removes a temporary data directory New made.
func (s *Server) Close() {
	s.Stop()
	if s.cleanupDir {
		_ = os.RemoveAll(s.opts.Dir)
	}
	if s.certDir != "" {
		_ = os.RemoveAll(s.certDir)
	}
}
