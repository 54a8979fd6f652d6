package server

import (
	"cmp"
	"errors"
	"fmt"
	"log/slog"
	"net"
	"net/url"
	"path/filepath"
	"strings"
	"time"

	"github.com/beaconplane/beacon/backend"
	"github.com/beaconplane/beacon/internal/hostport"
	"github.com/beaconplane/beacon/internal/setting"
	"github.com/beaconplane/beacon/registry"
	"github.com/beaconplane/beacon/store"
	"github.com/prometheus/client_golang/prometheus"
	"go.uber.org/zap/zapcore"
)

// Defaults of `beacon serve`: loopback only, the ports etcd users expect.
const (
	DefaultName            = "beacon"
	DefaultDataDir         = "beacon.data"
	DefaultClientURL       = "http://127.0.0.1:2379"
	DefaultPeerURL         = "http://127.0.0.1:2380"
	DefaultHTTPAddr        = "127.0.0.1:9379"
	DefaultShutdownTimeout = 10 * time.Second
	// DefaultAutoCompactionRetention is the history the embedded etcd
	// keeps: five minutes, as the Kubernetes API server keeps of its etcd.
	// A watcher away for longer lists again, which Beacon's watches do on
	// their own; a longer history fills etcd's quota sooner under churn.
	DefaultAutoCompactionRetention = 5 * time.Minute
)

// Config configures a Server. The zero value runs a single-node embedded
// etcd with the defaults above; see Validate for the rules.
type Config struct {
	// Name is the etcd member name; DefaultName when empty.
	Name string
	// DataDir holds the embedded etcd's data; DefaultDataDir when empty.
	// It is created if missing.
	DataDir string
	// ListenClientURLs are where embedded etcd serves clients (etcdctl,
	// any etcd v3 client); [DefaultClientURL] when empty.
	ListenClientURLs []string
	// AdvertiseClientURLs are the client URLs told to other members and
	// clients; ListenClientURLs when empty (they must then be concrete,
	// not 0.0.0.0).
	AdvertiseClientURLs []string
	// ListenPeerURLs are where embedded etcd talks to other members;
	// [DefaultPeerURL] when empty.
	ListenPeerURLs []string
	// AdvertisePeerURLs are the peer URLs told to other members;
	// ListenPeerURLs when empty.
	AdvertisePeerURLs []string
	// InitialCluster is etcd's --initial-cluster (name=peerURL,...); a
	// single-node cluster of this member when empty.
	InitialCluster string
	// InitialClusterState is "new" (default) or "existing".
	InitialClusterState string
	// InitialClusterToken is etcd's --initial-cluster-token; "beacon" when
	// empty.
	InitialClusterToken string
	// Discovery joins a new cluster through an etcd v3 discovery token
	// instead of InitialCluster (see DiscoveryConfig, discovery.go).
	Discovery DiscoveryConfig

	// EtcdEndpoints, when set, make the server a stateless front over this
	// external etcd cluster instead of running embedded etcd. Credentials
	// and TLS for it are in Backend.Etcd.
	EtcdEndpoints []string

	// Backend is the store behind the HTTP API. Its name is "etcd" by
	// default: the embedded etcd, or the external one of EtcdEndpoints.
	// Other backends ("memory", "file", "nats") run without etcd: no etcd
	// client port and no v3 bootstrap discovery.
	Backend backend.Config

	// Store, when set, is used instead of opening Backend (embedders and
	// tests inject one). The server does not close it.
	Store store.Store

	// Registry configures the registry behind the HTTP API (key root,
	// metadata limit); its Logger and Metrics are the server's.
	Registry registry.Config

	// V2BaseURL is the URL under which clients reach the v2 discovery
	// service, without trailing slash; http://<HTTPAddr>/v2/discovery when
	// empty (with 127.0.0.1 for an unspecified host). Tokens from /new are
	// V2BaseURL/<token>.
	V2BaseURL string
	// V2TokenMaxAge is how long a v2 discovery token lives; the v2
	// service's default (7 days) when zero.
	V2TokenMaxAge time.Duration

	// HTTPAddr is the HTTP API, metrics and health listener;
	// DefaultHTTPAddr when empty.
	HTTPAddr string
	// CORSAllowedOrigins are the origins ("https://app.example.com", or
	// "*" for any) whose browser pages may use the HTTP API; none when
	// empty (see cors.go).
	CORSAllowedOrigins []string

	// Security configures TLS on every listener, etcd authentication and
	// resource limits (security.go).
	Security Security

	// DNS configures the DNS interface (dns.go); disabled when DNS.Addr is
	// empty, as in the zero value (`beacon serve` enables it by default).
	DNS DNSConfig

	// XDS configures the xDS interface (xds.go); disabled when XDS.Addr is
	// empty, as in the zero value (`beacon serve` enables it by default).
	XDS XDSConfig

	// Health configures the health checker (health.go); disabled in the
	// zero value (`beacon serve` enables it for store backends).
	Health HealthConfig

	// ShutdownTimeout bounds graceful shutdown; DefaultShutdownTimeout when
	// zero.
	ShutdownTimeout time.Duration

	// AutoCompactionRetention is how much history of changes the embedded
	// etcd keeps: every AutoCompactionRetention (at most every hour) it
	// compacts the revisions older than that (etcd's
	// --auto-compaction-mode periodic). Without it every change would be
	// kept until the backend reached its quota (2 GiB) and etcd refused
	// every write ("database space exceeded"). A watch that resumes from a
	// compacted revision lists again. DefaultAutoCompactionRetention when
	// zero; negative keeps everything (for an operator who compacts
	// with etcdctl compact). Only for the embedded etcd: an external
	// cluster compacts as its operator set it.
	AutoCompactionRetention time.Duration

	// UnsafeNoFsync runs the embedded etcd without syncing its WAL to disk
	// (etcd's --unsafe-no-fsync): faster, and data may be lost on a crash.
	// For benchmarks and tests only.
	UnsafeNoFsync bool
	// EnablePprof serves Go's runtime profiles under /debug/pprof/ on the
	// HTTP listener (etcd's --enable-pprof); off by default.
	EnablePprof bool

	// Logger receives the server's logs and, through EtcdLogLevel, the
	// embedded etcd's; nil discards them.
	Logger *slog.Logger
	// EtcdLogLevel is the lowest level of etcd's own logs that is passed
	// to Logger; zapcore.WarnLevel by default (the zero value is Info, so
	// set it explicitly; New treats an unset level as Warn).
	EtcdLogLevel *zapcore.Level
	// Registerer receives Beacon's metrics; a new registry when nil. The
	// /metrics endpoint serves it together with etcd's metrics.
	Registerer prometheus.Registerer
	// Gatherer is what /metrics serves; derived from Registerer when nil.
	Gatherer prometheus.Gatherer
	// SettingName names a setting in what the server says while it runs
	// (answers to clients, warnings, the banner): it is given a field
	// ("Config.Security.Auth", "xdsapi.Config.MaxStreamsPerClient") and
	// returns what an operator changes (beacon serve: the flag). Nil, or
	// "", names the field. Errors New and Start return name fields.
	SettingName func(field string) string
}

// setting names fields as c.SettingName does, joined by "and".
func (c *Config) setting(fields ...string) string {
	return c.namer().Names(fields...)
}

// namer is c.SettingName.
func (c *Config) namer() setting.Namer { return setting.Namer(c.SettingName) }

// embedded reports whether the server runs embedded etcd.
func (c *Config) embedded() bool {
	return c.Store == nil && len(c.EtcdEndpoints) == 0 && c.Backend.BackendName() == backend.Etcd
}

// withDefaults returns a copy with every zero field set to its default.
func (c Config) withDefaults() Config {
	c.Name = cmp.Or(c.Name, DefaultName)
	c.DataDir = cmp.Or(c.DataDir, DefaultDataDir)
	if len(c.ListenClientURLs) == 0 {
		c.ListenClientURLs = []string{DefaultClientURL}
	}
	if len(c.AdvertiseClientURLs) == 0 {
		c.AdvertiseClientURLs = c.ListenClientURLs
	}
	if len(c.ListenPeerURLs) == 0 {
		c.ListenPeerURLs = []string{DefaultPeerURL}
	}
	if len(c.AdvertisePeerURLs) == 0 {
		c.AdvertisePeerURLs = c.ListenPeerURLs
	}
	if c.InitialCluster == "" && !c.Discovery.joining() {
		pairs := make([]string, len(c.AdvertisePeerURLs))
		for i, u := range c.AdvertisePeerURLs {
			pairs[i] = c.Name + "=" + u
		}
		c.InitialCluster = strings.Join(pairs, ",")
	}
	c.InitialClusterState = cmp.Or(c.InitialClusterState, "new")
	c.InitialClusterToken = cmp.Or(c.InitialClusterToken, "beacon")
	c.HTTPAddr = cmp.Or(c.HTTPAddr, DefaultHTTPAddr)
	c.ShutdownTimeout = cmp.Or(c.ShutdownTimeout, DefaultShutdownTimeout)
	c.AutoCompactionRetention = cmp.Or(c.AutoCompactionRetention, DefaultAutoCompactionRetention)
	return c
}

// Validate checks the configuration (after defaults) and returns every
// problem found, each saying which setting is wrong and why.
func (c Config) Validate() error {
	c = c.withDefaults()
	var errs []error
	if len(c.EtcdEndpoints) > 0 && c.Backend.BackendName() != backend.Etcd {
		errs = append(errs, fmt.Errorf("Config.EtcdEndpoints is set but the backend is %q: choose one", c.Backend.BackendName()))
	}
	if c.Store == nil && !c.embedded() {
		b := c.Backend
		if len(c.EtcdEndpoints) > 0 {
			b.Etcd.Endpoints = c.EtcdEndpoints
		}
		if err := b.Validate(); err != nil {
			errs = append(errs, err)
		}
	}
	if c.embedded() {
		// A URL that failed as a listen URL is not reported again when the
		// advertised URLs default to the listen URLs.
		failed := map[string]bool{}
		for _, set := range []struct {
			flag string
			urls []string
		}{
			{"listen-client-urls", c.ListenClientURLs},
			{"advertise-client-urls", c.AdvertiseClientURLs},
			{"listen-peer-urls", c.ListenPeerURLs},
			{"initial-advertise-peer-urls", c.AdvertisePeerURLs},
		} {
			listen := strings.HasPrefix(set.flag, "listen")
			for _, u := range set.urls {
				if !listen && failed[u] {
					continue
				}
				if err := validateURL(u, listen); err != nil {
					failed[u] = true
					errs = append(errs, fmt.Errorf("--%s %q: %w", set.flag, u, err))
				}
			}
		}
		if c.InitialClusterState != "new" && c.InitialClusterState != "existing" {
			errs = append(errs, fmt.Errorf("Config.InitialClusterState %q: must be new or existing", c.InitialClusterState))
		}
		if !validName(c.Name) {
			errs = append(errs, fmt.Errorf("Config.Name %q: use letters, digits, '-', '_' or '.'", c.Name))
		}
		if filepath.Clean(c.DataDir) == "/" {
			errs = append(errs, fmt.Errorf("Config.DataDir %q: refusing to use the root directory", c.DataDir))
		}
		if len(errs) == 0 {
			errs = append(errs, validateInitialCluster(c)...) // startcheck.go
		}
	}
	errs = append(errs, c.Discovery.validate(c)...)
	errs = append(errs, c.Security.validate(c)...)
	if err := hostport.Check(c.HTTPAddr); err != nil {
		errs = append(errs, fmt.Errorf("Config.HTTPAddr %q: %w, e.g. 127.0.0.1:9379", c.HTTPAddr, err))
	}
	if err := c.Registry.Validate(); err != nil {
		errs = append(errs, err)
	}
	errs = append(errs, c.DNS.validate()...)
	errs = append(errs, c.XDS.validate()...)
	errs = append(errs, c.Health.validate(c)...)
	if c.V2BaseURL != "" {
		if u, err := url.Parse(c.V2BaseURL); err != nil || (u.Scheme != "http" && u.Scheme != "https") || u.Host == "" || strings.HasSuffix(c.V2BaseURL, "/") {
			errs = append(errs, fmt.Errorf("Config.V2BaseURL %q: want an http(s) URL without trailing slash, e.g. http://10.0.0.1:9379/v2/discovery", c.V2BaseURL))
		}
	}
	errs = append(errs, validateCORS(c.CORSAllowedOrigins)...) // cors.go
	if c.V2TokenMaxAge < 0 {
		errs = append(errs, fmt.Errorf("Config.V2TokenMaxAge %v: must not be negative", c.V2TokenMaxAge))
	}
	if c.ShutdownTimeout < 0 {
		errs = append(errs, fmt.Errorf("shutdown timeout %v: must not be negative", c.ShutdownTimeout))
	}
	errs = append(errs, c.validateCompaction()...)
	errs = append(errs, c.validateDistinctListeners()...)
	return errors.Join(errs...)
}

// validateDistinctListeners refuses two TCP listeners given one address
// (the same host and port, not port 0): the second failed when the server
// started, as "address already in use (is another beacon serve
// running?)", which it was not.
func (c Config) validateDistinctListeners() []error {
	seen := map[string]string{}
	var errs []error
	add := func(field, addr string) {
		host, port, err := net.SplitHostPort(addr)
		if err != nil || port == "0" || addr == "" {
			return
		}
		key := net.JoinHostPort(host, port)
		if first, ok := seen[key]; ok {
			errs = append(errs, fmt.Errorf("%s and %s are both %s: give each its own port", first, field, key))
			return
		}
		seen[key] = field
	}
	add("Config.HTTPAddr", c.HTTPAddr)
	add("Config.XDS.Addr", c.XDS.Addr)
	add("Config.DNS.Addr", c.DNS.Addr) // its TCP listener
	if c.embedded() {
		for _, set := range []struct {
			field string
			urls  []string
		}{{"Config.ListenClientURLs", c.ListenClientURLs}, {"Config.ListenPeerURLs", c.ListenPeerURLs}} {
			for _, raw := range set.urls {
				if u, err := url.Parse(raw); err == nil {
					add(set.field, u.Host)
				}
			}
		}
	}
	return errs
}

// validateURL checks an etcd URL: http or https, a host and a port, no path.
// isHostPort reports whether addr is host:port with a port number from 0
// to 65535 (net.Listen would refuse another only when the server starts,
// as a run-time failure).
func validateURL(s string, listen bool) error {
	u, err := url.Parse(s)
	if err != nil {
		return fmt.Errorf("not a URL: %w", err)
	}
	if strings.HasPrefix(u.Scheme, "unix") {
		return errors.New("is a Unix socket: Unix sockets are not supported; give an http:// or https:// URL, e.g. http://127.0.0.1:2379")
	}
	if u.Scheme != "http" && u.Scheme != "https" {
		return errors.New("scheme must be http or https, e.g. http://127.0.0.1:2379")
	}
	host, port, err := net.SplitHostPort(u.Host)
	if err != nil || port == "" {
		return errors.New("must include a host and a port, e.g. http://127.0.0.1:2379")
	}
	if u.Path != "" && u.Path != "/" {
		return errors.New("must not have a path")
	}
	if !listen {
		if ip := net.ParseIP(host); ip != nil && ip.IsUnspecified() {
			return errors.New("an advertised URL must be reachable, not " + host + ": set it explicitly")
		}
	}
	return nil
}

func validName(s string) bool {
	if s == "" {
		return false
	}
	for _, r := range s {
		if !(r >= 'a' && r <= 'z' || r >= 'A' && r <= 'Z' || r >= '0' && r <= '9' || r == '-' || r == '_' || r == '.') {
			return false
		}
	}
	return true
}

// validateCompaction checks AutoCompactionRetention (after defaults).
func (c Config) validateCompaction() []error {
	r := c.AutoCompactionRetention
	switch {
	case !c.embedded() && r != DefaultAutoCompactionRetention:
		return []error{errors.New("Config.AutoCompactionRetention applies to the embedded etcd only: " +
			"an external cluster compacts as its members are configured (etcd --auto-compaction-retention)")}
	case r > 0 && r < time.Second:
		return []error{fmt.Errorf("Config.AutoCompactionRetention %v: keep at least 1s of history (negative keeps everything)", r)}
	}
	return nil
}
