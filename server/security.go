package server

import (
	"cmp"
	"errors"
	"fmt"
	"net"
	"net/url"
	"os"
	"strings"
	"time"

	"github.com/beaconplane/beacon/internal/connlimit"
	"github.com/beaconplane/beacon/internal/tlsfiles"
	"github.com/beaconplane/beacon/server/registryapi"
)

// Defaults of Security.
const (
	DefaultMaxBodyBytes   = 1 << 20
	DefaultRequestTimeout = 30 * time.Second
	DefaultIdleTimeout    = 2 * time.Minute
	DefaultMaxAuthClients = 256
	// DefaultAuthTokenTTL is etcd's --auth-token-ttl default.
	DefaultAuthTokenTTL = 300 * time.Second
	// EnvRootPassword holds the root password `beacon serve --auth` sets
	// up (or authenticates with); never a flag, so that it stays out of
	// argv and shell history.
	EnvRootPassword = "BEACON_ROOT_PASSWORD"
)

// TLSFiles are the PEM files of one listener, named as etcd's flags.
type TLSFiles = tlsfiles.Files

// Security configures transport security, authentication and resource
// limits. The zero value is plain HTTP on loopback without authentication
// (a warning is logged for every listener that is not on loopback), with
// the default limits.
type Security struct {
	// ClientTLS secures the embedded etcd's client listener: etcd's
	// --cert-file, --key-file, --trusted-ca-file, --client-cert-auth
	// (https:// in --listen-client-urls).
	ClientTLS TLSFiles
	// PeerTLS secures the embedded etcd's peer listener: etcd's
	// --peer-cert-file, --peer-key-file, --peer-trusted-ca-file,
	// --peer-client-cert-auth (https:// in --listen-peer-urls).
	PeerTLS TLSFiles
	// HTTPTLS serves the HTTP API over HTTPS (--http-cert-file,
	// --http-key-file, --http-trusted-ca-file, --http-client-cert-auth).
	// With a trusted CA, a verified client certificate authenticates its
	// common name as the etcd user, as etcd does on its client port.
	HTTPTLS TLSFiles
	// XDSTLS serves xDS over TLS (--xds-cert-file, --xds-key-file,
	// --xds-trusted-ca-file, --xds-client-cert-auth). With a trusted CA, a
	// verified client certificate authenticates its common name as the
	// etcd user, as on the HTTP API.
	XDSTLS TLSFiles

	// Auth enables etcd authentication on the embedded cluster (--auth):
	// on first start the root user is created with RootPassword (or the
	// content of RootPasswordFile) and auth is enabled; the HTTP API then
	// authenticates every request and acts as its etcd user.
	Auth bool
	// RootPasswordFile holds the root password (--auth-root-password-file;
	// the trailing newline is ignored).
	RootPasswordFile string
	// RootPassword is the root password itself; `beacon serve` takes it
	// from the environment (BEACON_ROOT_PASSWORD), never from a flag.
	RootPassword string
	// AuthToken is etcd's --auth-token: "simple" (etcd's default, and
	// the default here), or "jwt,pub-key=...,priv-key=...,sign-method=...,ttl=...",
	// or just "jwt": JWT with an ECDSA P-256 key pair generated once in
	// the data directory (DataDir/auth/). With JWT and a private key the
	// HTTP API can act as the etcd user a client certificate names (it has
	// no password to authenticate with). Every member of a cluster must
	// use the same token settings, and for JWT the same key files, as
	// etcd requires: generated keys suit a single member.
	AuthToken string
	// BcryptCost is etcd's --bcrypt-cost, the cost of the password hashes
	// of users created from now on; etcd's default (10) when zero.
	BcryptCost uint
	// AuthTokenTTL is how long a token lives (etcd's --auth-token-ttl for
	// simple tokens, the ttl of generated JWT keys); DefaultAuthTokenTTL
	// when zero.
	AuthTokenTTL time.Duration

	// HostWhitelist are the host names the HTTP API (and the embedded
	// etcd's HTTP gateway) answer to, etcd's --host-whitelist; requests
	// with another Host header get 421, which defeats DNS rebinding. IP
	// addresses and the loopback names are always accepted, and so are the
	// hosts of the server's own URLs; "*" accepts any.
	HostWhitelist []string

	// Limits bound watch streams, registrations and discovery token
	// creations per client and in all
	// (registryapi.Limits; the client is the authenticated user, else the
	// remote address).
	Limits registryapi.Limits
	// MaxAuthClients bounds the per-user etcd clients kept for
	// authenticated requests; DefaultMaxAuthClients when zero.
	MaxAuthClients int
	// MaxBodyBytes bounds every request body; DefaultMaxBodyBytes when
	// zero.
	MaxBodyBytes int64
	// RequestTimeout bounds reading a request and writing its answer
	// (watch streams and waiting v2 requests excepted: they extend their
	// own deadlines); DefaultRequestTimeout when zero.
	RequestTimeout time.Duration
	// IdleTimeout closes keep-alive connections idle this long;
	// DefaultIdleTimeout when zero.
	IdleTimeout time.Duration
	// MaxConns bounds the HTTP listener's open connections, so that a
	// flood of connections cannot take the file descriptors the embedded
	// etcd needs for its WAL, snapshots and peers. At the bound a new
	// connection takes the place of an idle one (silent ones first);
	// while every one carries a request, new ones wait in the kernel's
	// accept queue until one closes (internal/connlimit). Zero: a quarter
	// of the process's open-file limit (at least 256).
	MaxConns int
	// MaxConnsPerClient bounds those of one client address, so that a
	// client holding connections open (or reopening them as they time
	// out) cannot take all MaxConns from the others. Every process of a
	// host, and everyone behind one NAT or reverse proxy, shares an
	// address: at the bound, a new connection takes the place of the
	// address's oldest idle one (silent ones first), and is closed at
	// once only while every one of them carries a request.
	// DefaultMaxConnsPerClient when zero; no bound when negative.
	MaxConnsPerClient int
}

// DefaultMaxConnsPerClient is the default of Security.MaxConnsPerClient.
const DefaultMaxConnsPerClient = 256

func (s Security) withDefaults() Security {
	s.AuthTokenTTL = cmp.Or(s.AuthTokenTTL, DefaultAuthTokenTTL)
	s.MaxAuthClients = cmp.Or(s.MaxAuthClients, DefaultMaxAuthClients)
	s.MaxBodyBytes = cmp.Or(s.MaxBodyBytes, DefaultMaxBodyBytes)
	s.RequestTimeout = cmp.Or(s.RequestTimeout, DefaultRequestTimeout)
	s.MaxConns = cmp.Or(s.MaxConns, connlimit.DefaultMax())
	s.MaxConnsPerClient = cmp.Or(s.MaxConnsPerClient, DefaultMaxConnsPerClient)
	s.IdleTimeout = cmp.Or(s.IdleTimeout, DefaultIdleTimeout)
	return s
}

// validate checks the security settings of c (after defaults).
func (s Security) validate(c Config) []error {
	var errs []error
	for _, t := range []struct {
		files TLSFiles
		field string
	}{{s.ClientTLS, "ClientTLS"}, {s.PeerTLS, "PeerTLS"}, {s.HTTPTLS, "HTTPTLS"}, {s.XDSTLS, "XDSTLS"}} {
		if err := t.files.Validate(tlsFieldName(t.field)); err != nil {
			errs = append(errs, err)
			continue
		}
		// An expired certificate is refused now rather than served: etcd
		// would serve it (its listeners read whatever the files hold).
		if t.files.CertFile != "" {
			if _, err := tlsfiles.CheckCertificate(t.files.CertFile, t.files.KeyFile, time.Now()); err != nil {
				errs = append(errs, fmt.Errorf("Config.Security.%s.CertFile: %w", t.field, err))
			}
		}
	}
	if c.embedded() {
		errs = append(errs, schemeMatches("ListenClientURLs", c.ListenClientURLs, s.ClientTLS, "ClientTLS")...)
		errs = append(errs, schemeMatches("ListenPeerURLs", c.ListenPeerURLs, s.PeerTLS, "PeerTLS")...)
	} else {
		if s.ClientTLS.Enabled() || s.PeerTLS.Enabled() {
			errs = append(errs, errors.New("Config.Security.ClientTLS.CertFile/Config.Security.PeerTLS.CertFile configure the embedded etcd, which does not run with Config.EtcdEndpoints or a non-etcd Config.Backend: for TLS to an external etcd use Config.Backend.Etcd.CA, Config.Backend.Etcd.ClientCert and Config.Backend.Etcd.ClientKey"))
		}
		if s.Auth {
			errs = append(errs, errors.New("Config.Security.Auth enables authentication on the embedded etcd, which does not run with Config.EtcdEndpoints or a non-etcd Config.Backend: enable auth on the external cluster (etcdctl auth enable) and give beacon serve Config.Backend.Etcd.Username"))
		}
	}
	if s.Auth && s.RootPasswordFile == "" && s.RootPassword == "" && c.Backend.Etcd.Username == "" {
		errs = append(errs, fmt.Errorf("Config.Security.Auth needs the root password: put it in a file given with Config.Security.RootPasswordFile, or in %s (never on the command line)", EnvRootPassword))
	}
	if s.RootPasswordFile != "" {
		if _, err := os.Stat(s.RootPasswordFile); err != nil {
			errs = append(errs, fmt.Errorf("Config.Security.RootPasswordFile %q: %w", s.RootPasswordFile, unwrapPath(err)))
		}
	}
	if s.AuthToken != "" {
		typ, _, _ := strings.Cut(s.AuthToken, ",")
		if s.AuthToken != "jwt" && typ == "jwt" {
			if _, err := newJWTMinter(s.AuthToken); err != nil {
				errs = append(errs, err)
			}
		}
		if typ != "simple" && typ != "jwt" {
			errs = append(errs, fmt.Errorf("Config.Security.AuthToken %q: want simple, or jwt,pub-key=FILE,priv-key=FILE,sign-method=ES256 (etcd's format)", s.AuthToken))
		}
	}
	for _, h := range s.HostWhitelist {
		if h == "" || strings.ContainsAny(h, "/ ") {
			errs = append(errs, fmt.Errorf("Config.Security.HostWhitelist %q: want host names (no scheme, path or port), or *", h))
		}
	}
	for _, d := range []struct {
		field string
		v     time.Duration
	}{{"AuthTokenTTL", s.AuthTokenTTL}, {"RequestTimeout", s.RequestTimeout}, {"IdleTimeout", s.IdleTimeout}} {
		if d.v < 0 {
			errs = append(errs, fmt.Errorf("Config.Security.%s %v: must not be negative", d.field, d.v))
		}
	}
	if s.MaxBodyBytes < 0 || s.MaxAuthClients < 0 {
		errs = append(errs, errors.New("Config.Security.MaxBodyBytes and Config.Security.MaxAuthClients must not be negative"))
	}
	if s.MaxConns < 0 || s.MaxConns == 1 {
		errs = append(errs, fmt.Errorf("Config.Security.MaxConns %d: want at least 2 (0 for the default: a quarter of the open-file limit)", s.MaxConns))
	}
	// etcd replaces a cost outside bcrypt's range by its default, with a
	// warning at every start: refuse it instead.
	const minBcryptCost, maxBcryptCost = 4, 31 // golang.org/x/crypto/bcrypt's MinCost and MaxCost
	if s.BcryptCost != 0 && (s.BcryptCost < minBcryptCost || s.BcryptCost > maxBcryptCost) {
		errs = append(errs, fmt.Errorf("Config.Security.BcryptCost %d: must be %d to %d (etcd's default is 10)", s.BcryptCost, minBcryptCost, maxBcryptCost))
	}
	return errs
}

// schemeMatches checks that the URLs of Config field urlField use https
// exactly when the TLS files of Config.Security field tlsField are set.
func schemeMatches(urlField string, urls []string, files TLSFiles, tlsField string) []error {
	var errs []error
	for _, raw := range urls {
		u, err := url.Parse(raw)
		if err != nil {
			continue // reported by validateURL
		}
		switch {
		case u.Scheme == "https" && files.CertFile == "":
			errs = append(errs, fmt.Errorf("%s %q is https: give %s and %s", "Config."+urlField, raw, tlsFieldName(tlsField)("CertFile"), tlsFieldName(tlsField)("KeyFile")))
		case u.Scheme == "http" && files.CertFile != "":
			errs = append(errs, fmt.Errorf("%s %q is plain http but %s is set: use https://", "Config."+urlField, raw, tlsFieldName(tlsField)("CertFile")))
		}
	}
	return errs
}

// tlsFieldName names the fields of the TLSFiles in the security settings'
// field tls (e.g. "Config.Security.HTTPTLS.CertFile") in errors.
func tlsFieldName(tls string) func(string) string {
	return func(field string) string { return "Config.Security." + tls + "." + field }
}

// rootPassword returns the configured root password.
func (s Security) rootPassword() (string, error) {
	if s.RootPasswordFile == "" {
		return s.RootPassword, nil
	}
	b, err := os.ReadFile(s.RootPasswordFile)
	if err != nil {
		return "", fmt.Errorf("Config.Security.RootPasswordFile: %w", err)
	}
	pw := strings.TrimRight(string(b), "\r\n")
	if pw == "" {
		return "", fmt.Errorf("Config.Security.RootPasswordFile %q is empty", s.RootPasswordFile)
	}
	return pw, nil
}

// isLoopback reports whether host (a name or IP, possibly empty for "all
// interfaces") is reachable from this machine only.
func isLoopback(host string) bool {
	if host == "localhost" {
		return true
	}
	ip := net.ParseIP(strings.Trim(host, "[]"))
	return ip != nil && ip.IsLoopback()
}
