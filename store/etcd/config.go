package etcd

import (
	"cmp"
	"crypto/tls"
	"crypto/x509"
	"errors"
	"fmt"
	"log/slog"
	"net"
	"net/url"
	"os"
	"strconv"
	"strings"
	"time"
	"unicode"

	clientv3 "go.etcd.io/etcd/client/v3"
)

// Defaults for the zero values of Config.
const (
	// DefaultEndpoint is the endpoint used when Config.Endpoints is empty.
	DefaultEndpoint = "http://localhost:2379"
	// DefaultDialTimeout bounds Open's connection and first round trip.
	DefaultDialTimeout = 5 * time.Second
	// DefaultRequestTimeout bounds a unary call whose context has no
	// deadline.
	DefaultRequestTimeout = 5 * time.Second
	// DefaultListPageSize is how many keys List reads per request.
	DefaultListPageSize = 1000
	// DefaultWatchSilenceTimeout is how long a watch may hear nothing from
	// etcd before it ends (see Config.WatchSilenceTimeout).
	DefaultWatchSilenceTimeout = 4 * time.Second
	// DefaultProbeTimeout bounds one probe of a member (see
	// Config.ProbeTimeout).
	DefaultProbeTimeout = time.Second
)

// The environment variables ConfigFromEnv reads. They are the ones the
// deployments Beacon serves already use.
const (
	EnvEndpoints  = "ETCD_ENDPOINTS"        // comma-separated endpoints
	EnvUsername   = "ETCD_AUTH_USERNAME"    // user name
	EnvPassword   = "ETCD_AUTH_PASSWORD"    // password
	EnvCA         = "ETCD_AUTH_CA"          // CA certificate file (PEM)
	EnvClientCert = "ETCD_AUTH_CLIENT_CERT" // client certificate file (PEM)
	EnvClientKey  = "ETCD_AUTH_CLIENT_KEY"  // client key file (PEM)
)

// ErrInvalidConfig is wrapped by every error of Config.Validate and by Open's
// errors about TLS files.
var ErrInvalidConfig = errors.New("etcd: invalid config")

// Config configures a Store. The zero value connects to DefaultEndpoint
// over plain HTTP without authentication.
type Config struct {
	// Endpoints are the cluster's client URLs, each "host:port",
	// "http://host:port" or "https://host:port" (IPv6 hosts in brackets).
	// Empty means DefaultEndpoint. All endpoints use the same scheme; an
	// https endpoint, or any of CA, ClientCert and ClientKey, selects TLS
	// for all of them, and a host:port endpoint follows that choice.
	Endpoints []string

	// Username and Password authenticate with etcd's user/password auth.
	// Empty means no authentication; setting one requires the other.
	Username string
	Password string

	// CA is the PEM file of the certificate authorities that sign the
	// server's certificate. Empty means the system roots (with TLS).
	CA string
	// ClientCert and ClientKey are the PEM files of the client certificate
	// and its key, for servers that require client certificates. Set both
	// or neither.
	ClientCert string
	ClientKey  string

	// DialTimeout bounds Open: connecting, authenticating and one round
	// trip to the cluster. Zero means DefaultDialTimeout.
	DialTimeout time.Duration
	// RequestTimeout bounds a unary call (Get, Put, Grant, ...) whose
	// context has no deadline, so that an unreachable cluster gives an
	// error matching store.ErrUnavailable instead of a hang. Calls whose
	// context has a deadline keep it. Zero means DefaultRequestTimeout.
	RequestTimeout time.Duration
	// ListPageSize is the most keys List reads per request; larger
	// listings take several requests at one revision (still one
	// consistent snapshot). Zero means DefaultListPageSize.
	ListPageSize int

	// WatchSilenceTimeout bounds how long a watch may hear nothing from
	// etcd: no event and no progress notification. A quiet watch asks its
	// member for a progress notification after half of it and again every
	// quarter, so a watch on a healthy member never reaches it; a watch
	// whose member hangs (a stopped process, a stuck disk) or is cut off
	// ends with an error matching store.ErrWatchSilent and
	// store.ErrUnavailable within 1.25 times it plus up to two
	// ProbeTimeouts: the members are probed first (see ProbeTimeout), so
	// that the caller's next watch goes to a member that answers. While
	// the probe leaves no member out — every member answers (etcd lags
	// behind its writes) or none does (the whole cluster down, this
	// process starved of CPU) — the next watch would fare no better, and a
	// silent watch carries on, its silence measured again, up to four
	// times in a row (about five times the timeout) before it ends all the
	// same. Each watch has a gRPC stream of its own for this. Zero means DefaultWatchSilenceTimeout; negative disables the
	// check (a hung member is then noticed only by gRPC keep-alive, after
	// 15 s or more).
	WatchSilenceTimeout time.Duration
	// ProbeTimeout bounds the probe of one member (its status, then a
	// linearizable read, asked on a connection of its own). When a call or
	// a watch of a Store made by Open with several endpoints fails for want
	// of an answer, every member is probed; members that do not answer
	// while another does, or know no leader while another does, are left
	// out of the client's endpoints (new calls and watches go to the
	// others) and probed again every ProbeTimeout until they answer with a
	// leader. The read leaves out a member that answers its status but
	// serves nothing in time (back from a partition before its requests
	// reach the leader again, or with a slow disk). A member that has not
	// answered a quarter of ProbeTimeout after another answered with a
	// leader counts as not answering. Zero means DefaultProbeTimeout;
	// negative disables probing.
	ProbeTimeout time.Duration

	// Logger receives the etcd client's own logs (reconnects, retries).
	// Nil means discard.
	Logger *slog.Logger

	// Configure, when set, adjusts the etcd client configuration right
	// before Open dials: keep-alive, message sizes, extra gRPC dial
	// options (appended options override Beacon's defaults). Open has
	// already set Endpoints, TLS, credentials, timeouts and the logger.
	Configure func(*clientv3.Config)
}

// LogValue implements slog.LogValuer; it never logs the password.
func (c Config) LogValue() slog.Value {
	pw := ""
	if c.Password != "" {
		pw = "REDACTED"
	}
	return slog.GroupValue(
		slog.Any("endpoints", c.Endpoints),
		slog.String("username", c.Username),
		slog.String("password", pw),
		slog.String("ca", c.CA),
		slog.String("client_cert", c.ClientCert),
		slog.String("client_key", c.ClientKey),
		slog.Duration("dial_timeout", c.DialTimeout),
		slog.Duration("request_timeout", c.RequestTimeout),
	)
}

// ConfigFromEnv returns the configuration of the ETCD_* environment
// variables (see EnvEndpoints and the other Env constants). Unset variables
// leave their fields at the zero value; call Validate (Open does) to check
// the result.
func ConfigFromEnv() Config {
	return configFromLookup(os.LookupEnv)
}

func configFromLookup(lookup func(string) (string, bool)) Config {
	get := func(name string) string {
		v, _ := lookup(name)
		return v
	}
	return Config{
		Endpoints:  SplitEndpoints(get(EnvEndpoints)),
		Username:   get(EnvUsername),
		Password:   get(EnvPassword),
		CA:         strings.TrimSpace(get(EnvCA)),
		ClientCert: strings.TrimSpace(get(EnvClientCert)),
		ClientKey:  strings.TrimSpace(get(EnvClientKey)),
	}
}

// SplitEndpoints splits a comma-separated endpoint list (the form of
// ETCD_ENDPOINTS and of command-line flags), trimming spaces around each
// item. A blank list gives nil (the default endpoint); empty items are kept
// so that Validate reports them.
func SplitEndpoints(list string) []string {
	if strings.TrimSpace(list) == "" {
		return nil
	}
	parts := strings.Split(list, ",")
	for i, p := range parts {
		parts[i] = strings.TrimSpace(p)
	}
	return parts
}

// Validate checks the configuration without touching the network or the
// files it names (Open reads those and reports problems with them).
func (c Config) Validate() error {
	_, err := c.resolve()
	return err
}

// resolved is a validated Config with its defaults applied.
type resolved struct {
	endpoints      []string // normalized: scheme://host:port
	tls            bool
	dialTimeout    time.Duration
	requestTimeout time.Duration
	listPageSize   int64
	watchSilence   time.Duration // 0: no check
	probeTimeout   time.Duration // 0: no probes
}

func invalid(format string, args ...any) error {
	return fmt.Errorf("%w: "+format, append([]any{ErrInvalidConfig}, args...)...)
}

func (c Config) resolve() (resolved, error) {
	r := resolved{
		dialTimeout:    c.DialTimeout,
		requestTimeout: c.RequestTimeout,
		listPageSize:   int64(c.ListPageSize),
		watchSilence:   c.WatchSilenceTimeout,
		probeTimeout:   c.ProbeTimeout,
	}
	switch {
	case c.DialTimeout < 0:
		return r, invalid("DialTimeout %v is negative (zero means the default, %v)", c.DialTimeout, DefaultDialTimeout)
	case c.RequestTimeout < 0:
		return r, invalid("RequestTimeout %v is negative (zero means the default, %v)", c.RequestTimeout, DefaultRequestTimeout)
	case c.ListPageSize < 0:
		return r, invalid("ListPageSize %d is negative (zero means the default, %d)", c.ListPageSize, DefaultListPageSize)
	case c.Username != "" && c.Password == "":
		return r, invalid("Username %q is set but Password is empty (set both, e.g. %s and %s, or neither)", c.Username, EnvUsername, EnvPassword)
	case c.Username == "" && c.Password != "":
		return r, invalid("Password is set but Username is empty (set both, e.g. %s and %s, or neither)", EnvUsername, EnvPassword)
	case c.ClientCert != "" && c.ClientKey == "":
		return r, invalid("ClientCert %q is set but ClientKey is empty (set both, e.g. %s and %s, or neither)", c.ClientCert, EnvClientCert, EnvClientKey)
	case c.ClientCert == "" && c.ClientKey != "":
		return r, invalid("ClientKey %q is set but ClientCert is empty (set both, e.g. %s and %s, or neither)", c.ClientKey, EnvClientCert, EnvClientKey)
	}
	r.dialTimeout = cmp.Or(r.dialTimeout, DefaultDialTimeout)
	r.requestTimeout = cmp.Or(r.requestTimeout, DefaultRequestTimeout)
	r.listPageSize = cmp.Or(r.listPageSize, DefaultListPageSize)
	switch {
	case r.watchSilence == 0:
		r.watchSilence = DefaultWatchSilenceTimeout
	case r.watchSilence < 0:
		r.watchSilence = 0
	}
	switch {
	case r.probeTimeout == 0:
		r.probeTimeout = DefaultProbeTimeout
	case r.probeTimeout < 0:
		r.probeTimeout = 0
	}

	raw := c.Endpoints
	if len(raw) == 0 {
		raw = []string{DefaultEndpoint}
	}
	eps := make([]endpoint, len(raw))
	scheme := "" // the explicit scheme all endpoints share, if any
	for i, s := range raw {
		ep, err := parseEndpoint(s)
		if err != nil {
			return r, fmt.Errorf("%w: Endpoints[%d] (%s): %w", ErrInvalidConfig, i, EnvEndpoints, err)
		}
		if ep.Scheme != "" {
			if scheme != "" && scheme != ep.Scheme {
				return r, invalid("endpoints mix %s and %s: use one scheme for the whole cluster", scheme, ep.Scheme)
			}
			scheme = ep.Scheme
		}
		eps[i] = ep
	}
	tlsFiles := c.CA != "" || c.ClientCert != "" || c.ClientKey != ""
	if scheme == "http" && tlsFiles {
		return r, invalid("endpoints are plain http:// but TLS files are set (CA, ClientCert or ClientKey): use https:// endpoints, or host:port, or drop the files")
	}
	r.tls = scheme == "https" || tlsFiles
	seen := make(map[string]bool, len(eps))
	for _, ep := range eps {
		u := ep.url(r.tls)
		if seen[u] {
			return r, invalid("endpoint %s is listed twice", u)
		}
		seen[u] = true
		r.endpoints = append(r.endpoints, u)
	}
	return r, nil
}

// CheckEndpoint checks one endpoint as Validate does ("host:port",
// "http://host:port" or "https://host:port"); the error says what is wrong
// without naming where the endpoint came from, so that callers can.
func CheckEndpoint(s string) error {
	_, err := parseEndpoint(s)
	return err
}

// endpoint is one parsed endpoint.
type endpoint struct {
	Scheme string // "", "http" or "https"
	Host   string // host name or IP, without brackets
	Port   int
}

func (e endpoint) url(useTLS bool) string {
	scheme := "http"
	if useTLS {
		scheme = "https"
	}
	return scheme + "://" + net.JoinHostPort(e.Host, strconv.Itoa(e.Port))
}

// parseEndpoint parses one endpoint: "host:port", "http://host:port" or
// "https://host:port" (IPv6 hosts in brackets). The error says what is
// wrong.
func parseEndpoint(s string) (endpoint, error) {
	var ep endpoint
	if s == "" {
		return ep, errors.New("empty endpoint: want host:port, http://host:port or https://host:port")
	}
	if i := strings.IndexFunc(s, func(r rune) bool { return unicode.IsSpace(r) || unicode.IsControl(r) }); i >= 0 {
		return ep, fmt.Errorf("endpoint %q contains a space or control character", s)
	}
	hostport := s
	if scheme, rest, ok := strings.Cut(s, "://"); ok {
		u, err := url.Parse(s)
		if err != nil {
			return ep, fmt.Errorf("endpoint %q is not a valid URL: %w", s, err)
		}
		switch strings.ToLower(scheme) {
		case "http", "https":
			ep.Scheme = strings.ToLower(scheme)
		default:
			return ep, fmt.Errorf("endpoint %q: scheme %q is not http or https", s, scheme)
		}
		switch {
		case u.User != nil:
			return ep, fmt.Errorf("endpoint %q carries credentials: set Username/Password (%s/%s) instead", s, EnvUsername, EnvPassword)
		case u.Opaque != "" || (u.Path != "" && u.Path != "/") || u.RawQuery != "" || u.Fragment != "" || strings.ContainsAny(rest, "?#"):
			return ep, fmt.Errorf("endpoint %q has a path, query or fragment: want %s://host:port", s, ep.Scheme)
		}
		hostport = u.Host
	}
	host, port, err := net.SplitHostPort(hostport)
	if err != nil {
		return ep, fmt.Errorf("endpoint %q: want host:port (etcd's client port is usually 2379): %w", s, unwrapAddrError(err))
	}
	if host == "" {
		return ep, fmt.Errorf("endpoint %q has no host", s)
	}
	if !validHost(host) {
		return ep, fmt.Errorf("endpoint %q: host %q is not a host name or IP address", s, host)
	}
	n, err := strconv.Atoi(port)
	if err != nil || n < 1 || n > 65535 || strings.HasPrefix(port, "+") {
		return ep, fmt.Errorf("endpoint %q: port %q is not a number in 1-65535", s, port)
	}
	ep.Host, ep.Port = host, n
	return ep, nil
}

// validHost accepts IP addresses and names of letters, digits, '.', '-'
// and '_'.
func validHost(h string) bool {
	if strings.Contains(h, ":") {
		return net.ParseIP(h) != nil
	}
	for _, r := range h {
		if !(r >= 'a' && r <= 'z' || r >= 'A' && r <= 'Z' || r >= '0' && r <= '9' || r == '.' || r == '-' || r == '_') {
			return false
		}
	}
	return true
}

// unwrapAddrError drops net.AddrError's repetition of the address.
func unwrapAddrError(err error) error {
	var ae *net.AddrError
	if errors.As(err, &ae) {
		return errors.New(ae.Err)
	}
	return err
}

// tlsConfig loads the TLS files; each error names the file.
func (c Config) tlsConfig() (*tls.Config, error) {
	cfg := &tls.Config{MinVersion: tls.VersionTLS12}
	if c.CA != "" {
		pem, err := os.ReadFile(c.CA)
		if err != nil {
			return nil, fmt.Errorf("%w: read CA file (%s): %w", ErrInvalidConfig, EnvCA, err)
		}
		pool := x509.NewCertPool()
		if !pool.AppendCertsFromPEM(pem) {
			return nil, invalid("CA file %q (%s) holds no PEM certificate", c.CA, EnvCA)
		}
		cfg.RootCAs = pool
	}
	if c.ClientCert != "" {
		for _, f := range []struct{ path, env string }{{c.ClientCert, EnvClientCert}, {c.ClientKey, EnvClientKey}} {
			if _, err := os.Stat(f.path); err != nil {
				return nil, fmt.Errorf("%w: %s: %w", ErrInvalidConfig, f.env, err)
			}
		}
		cert, err := tls.LoadX509KeyPair(c.ClientCert, c.ClientKey)
		if err != nil {
			return nil, invalid("load client certificate %q and key %q (%s, %s): %v", c.ClientCert, c.ClientKey, EnvClientCert, EnvClientKey, err)
		}
		cfg.Certificates = []tls.Certificate{cert}
	}
	return cfg, nil
}
