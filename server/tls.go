package server

import (
	"crypto/tls"
	"net"
	"slices"
	"sync/atomic"
	"time"

	"github.com/beaconplane/beacon/internal/tlsfiles"
	"github.com/beaconplane/beacon/proxy"
	etcdstore "github.com/beaconplane/beacon/store/etcd"
	"go.etcd.io/etcd/client/pkg/v3/transport"
	"go.etcd.io/etcd/server/v3/embed"
)

// security is the state of the security layer inside a Server.
type security struct {
	sec       Security                      // with defaults
	authnPtr  atomic.Pointer[authenticator] // set once etcd is up (setupAuth)
	authToken string                        // the embedded etcd's --auth-token, resolved
	hosts     map[string]bool               // Host names the HTTP API answers to
	httpTLS   *tlsfiles.Reloader            // nil: plain HTTP
	// fallbackStore reaches the cluster through the discovery fallback
	// proxy (set when the server became one).
	fallbackStore etcdstore.Config
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
	// A rotated certificate must still cover every name the server is
	// reached by that the one in use covers (its listen address, the
	// names it answers to).
	var names []string
	for h := range s.hosts {
		names = append(names, h)
	}
	slices.Sort(names)
	r, err := tlsfiles.NewReloader(s.sec.HTTPTLS, tlsfiles.Config{Logger: s.log.With("component", "http-tls"), Listener: "http",
		Names: tlsfiles.ListenerNames(s.cfg.HTTPAddr, names...), Metrics: s.reg})
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

// fallbackSecurity secures the discovery fallback proxy as the member's
// client listener would have been: it serves TLS with --cert-file
// (verifying clients against --trusted-ca-file, required with
// --client-cert-auth), reaches the cluster's members with the same files,
// and the server reaches it over TLS, with its own credentials when the
// cluster has auth on. It returns the configuration of the server's store
// in front of the proxy (without endpoints).
func (s *Server) fallbackSecurity(pcfg *proxy.Config) (scheme string, st etcdstore.Config, err error) {
	user, pw, err := s.selfCredentials()
	if err != nil {
		return "", st, err
	}
	st = etcdstore.Config{Username: user, Password: pw, Logger: s.log}
	f := s.sec.ClientTLS
	if f.CertFile == "" {
		return "http", st, nil
	}
	r, err := tlsfiles.NewReloader(f, tlsfiles.Config{Logger: s.log.With("component", "fallback-proxy-tls"), Listener: "fallback-proxy", Metrics: s.reg})
	if err != nil {
		return "", st, err
	}
	pcfg.ServerTLS = r.ServerConfig("h2", "http/1.1")
	pcfg.ClientTLS = r.ClientConfig("")
	st.CA, st.ClientCert, st.ClientKey = f.TrustedCAFile, f.CertFile, f.KeyFile
	return "https", st, nil
}
