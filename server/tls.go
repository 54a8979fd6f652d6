package server

import (
	"crypto/tls"
	"net"
	"time"

	"github.com/beaconplane/beacon/internal/tlsfiles"
	"go.etcd.io/etcd/client/pkg/v3/transport"
	"go.etcd.io/etcd/server/v3/embed"
)

// security is the state of the security layer inside a Server.
type security struct {
	sec       Security // with defaults
	secState  securityState
	authToken string             // the embedded etcd's --auth-token, resolved
	hosts     map[string]bool    // Host names the HTTP API answers to
	httpTLS   *tlsfiles.Reloader // nil: plain HTTP
}

// initSecurity resolves the security settings; New calls it.
func (s *Server) initSecurity() {
	s.sec = s.cfg.Security.withDefaults()
	s.hosts = s.allowedHosts()
}

// secureHTTPListener wraps the HTTP listener in TLS when --http-cert-file
// is set. Every handshake uses the current files (rotation needs no
// restart); clients are verified against --http-trusted-ca-file when one
// is given, and required to present a certificate with
// --http-client-cert-auth.
func (s *Server) secureHTTPListener(ln net.Listener) (net.Listener, error) {
	if s.sec.HTTPTLS.CertFile == "" {
		return ln, nil
	}
	r, err := tlsfiles.NewReloader(s.sec.HTTPTLS, s.log.With("component", "http-tls"))
	if err != nil {
		return nil, err
	}
	s.httpTLS = r
	return tls.NewListener(ln, r.ServerConfig("h2", "http/1.1")), nil
}

// httpScheme is the scheme of the HTTP API's URLs.
func (s *Server) httpScheme() string {
	if s.sec.HTTPTLS.CertFile != "" {
		return "https"
	}
	return "http"
}

func etcdTLSInfo(f TLSFiles) transport.TLSInfo {
	return transport.TLSInfo{CertFile: f.CertFile, KeyFile: f.KeyFile, TrustedCAFile: f.TrustedCAFile, ClientCertAuth: f.ClientCertAuth}
}

// applySecurity sets the embedded etcd's TLS (etcd re-reads certificates
// and keys at each handshake; it loads CA files once), its auth token
// provider and its Host whitelist.
func (s *Server) applySecurity(ec *embed.Config) error {
	switch s.sec.AuthToken {
	case "":
	case "jwt":
		tok, err := defaultJWTAuthToken(s.cfg.DataDir, s.sec.AuthTokenTTL)
		if err != nil {
			return err
		}
		s.authToken = tok
	default:
		s.authToken = s.sec.AuthToken
	}
	if s.sec.ClientTLS.CertFile != "" {
		ec.ClientTLSInfo = etcdTLSInfo(s.sec.ClientTLS)
	}
	if s.sec.PeerTLS.CertFile != "" {
		ec.PeerTLSInfo = etcdTLSInfo(s.sec.PeerTLS)
	}
	if s.authToken != "" {
		ec.AuthToken = s.authToken
	}
	ec.AuthTokenTTL = uint(max(1, s.sec.AuthTokenTTL.Round(time.Second)/time.Second))
	if s.sec.BcryptCost != 0 {
		ec.BcryptCost = s.sec.BcryptCost
	}
	if wl := s.etcdHostWhitelist(); wl != nil {
		ec.HostWhitelist = wl
	}
	return nil
}
