package proxy

import (
	"cmp"
	"crypto/tls"
	"fmt"
	"log/slog"
	"net/url"
	"strings"
	"time"

	"github.com/beaconplane/beacon/bootstrap"
	"github.com/beaconplane/beacon/internal/connlimit"
	"github.com/beaconplane/beacon/internal/hostport"
	"github.com/beaconplane/beacon/internal/setting"
	"github.com/prometheus/client_golang/prometheus"
	"go.etcd.io/etcd/client/pkg/v3/types"
)

// Mode says which requests the proxy forwards.
type Mode string

const (
	// ReadWrite forwards every request (the default; the zero Mode means
	// ReadWrite).
	ReadWrite Mode = "readwrite"
	// ReadOnly forwards reads and watches and refuses every write with gRPC
	// Unimplemented (HTTP 501) and a message saying the proxy is readonly.
	ReadOnly Mode = "readonly"
)

// ParseMode parses "readwrite" or "readonly" (case-insensitive; "" is
// readwrite).
func ParseMode(s string) (Mode, error) {
	switch strings.ToLower(strings.TrimSpace(s)) {
	case "", string(ReadWrite):
		return ReadWrite, nil
	case string(ReadOnly):
		return ReadOnly, nil
	}
	return "", fmt.Errorf("%w: %q: use %q or %q", ErrBadMode, s, ReadWrite, ReadOnly)
}

// Defaults, the values of etcd's v2 proxy flags (--proxy-*).
const (
	DefaultListenAddr      = "127.0.0.1:23790"
	DefaultPeerURL         = "http://localhost:2380"
	DefaultFailureWait     = 5 * time.Second
	DefaultRefreshInterval = 30 * time.Second
	DefaultDialTimeout     = time.Second
	DefaultWriteTimeout    = 5 * time.Second
	DefaultStartTimeout    = 30 * time.Second
	DefaultUpstreamConns   = 4
	DefaultWatchSilence    = 5 * time.Second
	// DefaultKeepAliveSilence is Config.KeepAliveSilenceTimeout's default.
	DefaultKeepAliveSilence = 500 * time.Millisecond
	// MinWatchSilence and MinKeepAliveSilence are the shortest silence
	// timeouts Validate takes: 20 ms benched a healthy member within
	// seconds, and every request failed.
	MinWatchSilence     = time.Second
	MinKeepAliveSilence = 100 * time.Millisecond
	// EmptyRefreshInterval is the refresh interval while no endpoint is
	// reachable (when RefreshInterval is longer).
	EmptyRefreshInterval = time.Second
)

// Config configures a Proxy. The zero value is a readwrite proxy on
// 127.0.0.1:23790 in front of the cluster whose member answers at
// http://localhost:2380, with etcd v2 proxy's timing defaults.
//
// The cluster is found from exactly one of: DiscoveryToken (with
// DiscoveryEndpoints) or Discovery, DiscoveryURL, DiscoverySRV,
// InitialCluster, PeerURLs, Endpoints; with none set, PeerURLs defaults to
// http://localhost:2380.
// From peer URLs the proxy reads the members' client URLs (GET
// <peer>/members); from Endpoints it uses them as they are. Either way it
// refreshes them every RefreshInterval with a linearizable MemberList
// through the cluster, falling back to the peers' /members pages (when it
// knows peer URLs) if no member answers.
type Config struct {
	// Mode is ReadWrite (zero value) or ReadOnly.
	Mode Mode

	// ListenAddr is the address Run listens on; default 127.0.0.1:23790.
	// Serve uses the listener it is given instead.
	ListenAddr string

	// DiscoveryToken and DiscoveryEndpoints use the etcd v3 discovery
	// protocol (/_etcd/registry/<token>/...) to find the members' peer
	// URLs, also when the cluster is full. Both or neither must be set.
	DiscoveryToken     string
	DiscoveryEndpoints []string
	// Discovery, when set, is the full v3 discovery configuration
	// (credentials, TLS files, timeouts, or an existing Client) used
	// instead of DiscoveryToken and DiscoveryEndpoints; `beacon serve
	// --discovery-fallback=proxy` passes its own.
	Discovery *bootstrap.Config

	// DiscoveryURL is an etcd v2 discovery URL (e.g.
	// https://discovery.etcd.io/<token> or http://host:2379/v2/keys/_etcd/registry/<token>).
	DiscoveryURL string

	// DiscoverySRV is a DNS domain whose SRV records _etcd-server-ssl._tcp
	// and _etcd-server._tcp name the members' peer URLs.
	// DiscoverySRVName is an optional suffix (_etcd-server-<name>._tcp).
	DiscoverySRV     string
	DiscoverySRVName string
	// DNSServer is the host:port of the DNS server to ask for SRV, A and
	// AAAA records; empty means the system resolver.
	DNSServer string

	// InitialCluster is an etcd --initial-cluster string
	// (name=peerURL,name=peerURL,...).
	InitialCluster string

	// PeerURLs are members' peer URLs (what `beacon serve` found).
	PeerURLs []string

	// Endpoints are members' client URLs. The proxy uses them directly
	// and refreshes the list with MemberList.
	Endpoints []string

	// FailureWait is how long an endpoint that failed stays out of use;
	// default 5 s.
	FailureWait time.Duration
	// RefreshInterval is how often the member list is re-read; default
	// 30 s (1 s while no endpoint is reachable).
	RefreshInterval time.Duration
	// DialTimeout bounds connecting to a member; default 1 s.
	DialTimeout time.Duration
	// WriteTimeout bounds each forwarded write request; default 5 s.
	// Negative disables it (the client's deadline applies).
	WriteTimeout time.Duration
	// ReadTimeout bounds each forwarded read request; zero (default)
	// disables it: the client's deadline applies.
	ReadTimeout time.Duration
	// StartTimeout bounds finding the cluster at start; default 30 s.
	// Negative: no bound, look until ctx ends (requests are answered
	// Unavailable meanwhile).
	StartTimeout time.Duration
	// UpstreamConns is the number of connections the proxy spreads
	// requests over (each balanced over the endpoints); default 4.
	UpstreamConns int
	// WatchSilenceTimeout bounds how long the upstream watches may hear
	// nothing from their member: after half of it without a response the
	// proxy sends a progress request, and if that goes unanswered for the
	// other half the member is benched and the watches move to another
	// one (or, with none left, the client watchers are cancelled with a
	// reason). Default 5 s; negative disables the check.
	WatchSilenceTimeout time.Duration
	// KeepAliveSilenceTimeout bounds how long a lease keep-alive sent on
	// the shared upstream keep-alive stream may go unanswered (etcd
	// answers one in milliseconds, or, in an election, once a leader is
	// back): past it the stream moves to another member, with every
	// keep-alive its clients wait for sent again, and the silent member is
	// benched unless it answers a probe (a member in an election does).
	// Default 500 ms, so that a stream on a hung or cut-off member costs
	// its clients well under a third of etcd's shortest TTL (2 s);
	// negative disables the check.
	KeepAliveSilenceTimeout time.Duration

	// CacheMaxStaleness bounds how stale a serializable Range answered
	// from the proxy's watch-fed cache may be: every answer reflects every
	// write committed before now minus CacheMaxStaleness, and every write
	// forwarded by this proxy (see cache.go). Default 1 s; negative turns
	// the cache off (every read is forwarded). Linearizable reads, reads
	// at a revision and reads with credentials are never cached.
	CacheMaxStaleness time.Duration
	// EnablePprof serves Go's runtime profiles under /debug/pprof/ on the
	// proxy's listener (etcd's --enable-pprof); off by default.
	EnablePprof bool

	// CacheMaxBytes bounds the cache's copy of the keyspace (keys, values
	// and about 96 bytes each); a larger keyspace turns the cache off.
	// Default 256 MiB.
	CacheMaxBytes int64

	// MaxRequestBytes is the largest request the proxy reads from a client
	// (etcd's --max-request-bytes; its default, 1.5 MiB, when zero): a
	// larger gRPC message is refused with ResourceExhausted, and a JSON
	// gateway body over twice that (base64) with 413, before the proxy
	// buffers it.
	MaxRequestBytes uint

	// MaxWatchers bounds the watchers clients have open on the proxy, and
	// MaxWatchersPerStream those of one gRPC watch stream (what one etcd
	// client multiplexes on it): a watch created past either is answered
	// canceled, with the reason. Each watcher of its own key costs the
	// proxy an upstream watch (about 15 KiB): without a bound one client
	// creating 100,000 took the proxy from 72 MB to 1.6 GB. Defaults
	// DefaultMaxWatchers and DefaultMaxWatchersPerStream when zero; no
	// bound when negative.
	MaxWatchers, MaxWatchersPerStream int

	// MaxWatchWaitingBytes bounds the events from etcd waiting for the
	// client watch streams, all together: each response counted once (its
	// encoded events), however many streams and watchers it waits for.
	// When one takes them past it, the streams that have waited longest
	// are ended with ResourceExhausted (their clients re-watch from the
	// last revision they received) until what waits fits again. Each
	// stream is also bounded on its own (64 MiB of events, counted once
	// per watcher they are for), but streams are many (MaxStreams).
	// DefaultMaxWatchWaitingBytes when zero; no bound when negative.
	MaxWatchWaitingBytes int64

	// MaxStreams bounds the client streams (Watch, LeaseKeepAlive and any
	// other streaming call) open on the proxy at once: one past it is ended
	// at once with ResourceExhausted and a message saying what to do. An
	// empty watch stream costs the proxy about 20 KiB (two goroutines and
	// gRPC's buffers), and an etcd client needs one watch and one
	// keep-alive stream. DefaultMaxStreams when zero; no bound when
	// negative.
	MaxStreams int
	// MaxStreamsPerClient bounds the client streams of each kind (watch,
	// lease keep-alive, other) one client address has open at once, so
	// that one client cannot take all MaxStreams from the others. Every
	// process of a host shares its address, so kinds do not share places
	// (watches cannot lock out another process's keep-alives, and so its
	// lease), and at the bound a new stream takes the place of the oldest
	// one of its address and kind on which the client has sent nothing yet
	// (ended with ResourceExhausted). Only when every stream of the address
	// and kind has carried a request is a new one refused.
	// DefaultMaxStreamsPerClient when zero; no bound when negative (behind
	// a load balancer that does not keep client addresses, every client
	// has its address: raise it or turn it off).
	MaxStreamsPerClient int
	// MaxConns bounds the client connections open at once, so that a flood
	// of connections cannot take the file descriptors the proxy needs for
	// its members. At the bound, a new connection takes the place of the
	// oldest one that has carried no call (nor gateway request), else of
	// the one idle longest; one with a call or stream in flight is never
	// closed for it, and only while every one has one does a new
	// connection wait (in the kernel's accept queue). A quarter of the
	// open-file limit (at least 256) when zero; no bound when negative.
	MaxConns int
	// MaxConnsPerClient bounds the connections of one client address, as
	// MaxConns does: at the bound, a new one takes the place of one of the
	// address's, and is refused only while every one has a call or stream
	// in flight. DefaultMaxConnsPerClient when zero; no bound when
	// negative.
	MaxConnsPerClient int

	// ClientTLS is used to reach members (client and peer URLs with
	// https); nil uses the system roots for https URLs.
	ClientTLS *tls.Config
	// ServerTLS, when set, serves clients over TLS.
	ServerTLS *tls.Config

	// SelfAddrs are extra addresses (host:port or URLs) at which this
	// proxy is reachable (for example an advertised address behind NAT).
	// Endpoints matching them, or the listener, are never used.
	SelfAddrs []string

	// Logger receives the proxy's logs; nil discards them.
	Logger *slog.Logger
	// Registry receives the proxy's Prometheus metrics and is served on
	// /metrics; nil uses a private registry.
	Registry *prometheus.Registry
	// SettingName names a setting in what the proxy says while it runs
	// (answers to clients, logs): it is given a field
	// ("proxy.Config.MaxStreams") and returns what an operator changes (beacon
	// proxy: the flag). Nil, or "", names the field. Validate's errors
	// name fields.
	SettingName func(field string) string
}

// setting names field ("proxy.Config.MaxStreams") as c.SettingName
// does.
func (c *Config) setting(field string) string {
	return setting.Namer(c.SettingName).Name(field)
}

// withDefaults returns a copy with zero values replaced.
func (c Config) withDefaults() Config {
	c.Mode = cmp.Or(c.Mode, ReadWrite)
	c.ListenAddr = cmp.Or(c.ListenAddr, DefaultListenAddr)
	c.FailureWait = cmp.Or(c.FailureWait, DefaultFailureWait)
	c.RefreshInterval = cmp.Or(c.RefreshInterval, DefaultRefreshInterval)
	c.DialTimeout = cmp.Or(c.DialTimeout, DefaultDialTimeout)
	c.WriteTimeout = cmp.Or(c.WriteTimeout, DefaultWriteTimeout)
	c.StartTimeout = cmp.Or(c.StartTimeout, DefaultStartTimeout)
	c.UpstreamConns = cmp.Or(c.UpstreamConns, DefaultUpstreamConns)
	c.WatchSilenceTimeout = cmp.Or(c.WatchSilenceTimeout, DefaultWatchSilence)
	c.KeepAliveSilenceTimeout = cmp.Or(c.KeepAliveSilenceTimeout, DefaultKeepAliveSilence)
	c.CacheMaxStaleness = cmp.Or(c.CacheMaxStaleness, DefaultCacheMaxStaleness)
	c.CacheMaxBytes = cmp.Or(c.CacheMaxBytes, DefaultCacheMaxBytes)
	c.MaxRequestBytes = cmp.Or(c.MaxRequestBytes, DefaultMaxRequestBytes)
	c.MaxWatchers = cmp.Or(c.MaxWatchers, DefaultMaxWatchers)
	c.MaxWatchersPerStream = cmp.Or(c.MaxWatchersPerStream, DefaultMaxWatchersPerStream)
	c.MaxWatchWaitingBytes = cmp.Or(c.MaxWatchWaitingBytes, DefaultMaxWatchWaitingBytes)
	c.MaxStreams = cmp.Or(c.MaxStreams, DefaultMaxStreams)
	c.MaxStreamsPerClient = cmp.Or(c.MaxStreamsPerClient, DefaultMaxStreamsPerClient)
	c.MaxConns = cmp.Or(c.MaxConns, connlimit.DefaultMax())
	c.MaxConnsPerClient = cmp.Or(c.MaxConnsPerClient, DefaultMaxConnsPerClient)
	if c.Logger == nil {
		c.Logger = slog.New(slog.DiscardHandler)
	}
	if c.sources() == 0 {
		c.PeerURLs = []string{DefaultPeerURL}
	}
	return c
}

func (c Config) sources() int {
	n := 0
	for _, set := range []bool{
		c.DiscoveryToken != "" || len(c.DiscoveryEndpoints) > 0 || c.Discovery != nil,
		c.DiscoveryURL != "",
		c.DiscoverySRV != "",
		c.InitialCluster != "",
		len(c.PeerURLs) > 0,
		len(c.Endpoints) > 0,
	} {
		if set {
			n++
		}
	}
	return n
}

// Validate reports the first problem with the configuration, with what to
// do about it.
func (c Config) Validate() error {
	if _, err := ParseMode(string(c.Mode)); err != nil {
		return err
	}
	if c.sources() > 1 {
		return fmt.Errorf("%w: set only one of proxy.Config.DiscoveryToken, proxy.Config.DiscoveryURL, proxy.Config.DiscoverySRV, proxy.Config.InitialCluster, proxy.Config.PeerURLs or proxy.Config.Endpoints", ErrConflictingDiscovery)
	}
	if c.Discovery != nil {
		if c.DiscoveryToken != "" || len(c.DiscoveryEndpoints) > 0 {
			return fmt.Errorf("%w: set proxy.Config.Discovery or proxy.Config.DiscoveryToken and proxy.Config.DiscoveryEndpoints, not both", ErrConflictingDiscovery)
		}
		if err := c.Discovery.Validate(); err != nil {
			return fmt.Errorf("%w: proxy.Config.Discovery: %w", ErrInvalidConfig, err)
		}
	}
	if (c.DiscoveryToken == "") != (len(c.DiscoveryEndpoints) == 0) {
		return fmt.Errorf("%w: proxy.Config.DiscoveryToken and proxy.Config.DiscoveryEndpoints go together: set both", ErrInvalidConfig)
	}
	if c.DiscoveryToken != "" {
		if err := bootstrap.ValidateToken(c.DiscoveryToken); err != nil {
			return fmt.Errorf("%w: proxy.Config.DiscoveryToken: %w", ErrInvalidConfig, err)
		}
	}
	for _, ep := range c.DiscoveryEndpoints {
		if strings.TrimSpace(ep) == "" {
			return fmt.Errorf("%w: proxy.Config.DiscoveryEndpoints must not contain empty endpoints", ErrInvalidConfig)
		}
	}
	if c.DiscoveryURL != "" {
		u, err := url.Parse(c.DiscoveryURL)
		if err != nil || (u.Scheme != "http" && u.Scheme != "https") || u.Host == "" || strings.Trim(u.Path, "/") == "" {
			return fmt.Errorf("%w: proxy.Config.DiscoveryURL %q: want http(s)://host/<token>", ErrBadURL, c.DiscoveryURL)
		}
	}
	if c.DiscoverySRV != "" && strings.ContainsAny(c.DiscoverySRV, "/: ") {
		return fmt.Errorf("%w: proxy.Config.DiscoverySRV %q must be a DNS domain such as example.com", ErrInvalidConfig, c.DiscoverySRV)
	}
	if c.DNSServer != "" {
		if err := hostport.Check(c.DNSServer); err != nil {
			return fmt.Errorf("%w: proxy.Config.DNSServer %q %w", ErrInvalidConfig, c.DNSServer, err)
		}
	}
	if c.InitialCluster != "" {
		if _, err := parseInitialCluster(c.InitialCluster); err != nil {
			return err
		}
	}
	for _, list := range [][]string{c.PeerURLs, c.Endpoints} {
		if _, err := parseURLs(list); err != nil {
			return err
		}
	}
	if c.ListenAddr != "" {
		if err := hostport.Check(c.ListenAddr); err != nil {
			return fmt.Errorf("%w: proxy.Config.ListenAddr %q %w", ErrInvalidConfig, c.ListenAddr, err)
		}
	}
	for name, d := range map[string]time.Duration{
		"FailureWait": c.FailureWait, "RefreshInterval": c.RefreshInterval,
		"DialTimeout": c.DialTimeout, "ReadTimeout": c.ReadTimeout,
	} {
		if d < 0 {
			return fmt.Errorf("%w: proxy.Config.%s %v must not be negative", ErrInvalidConfig, name, d)
		}
	}
	for _, b := range []struct {
		name     string
		v, least time.Duration
		why      string
	}{
		{"WatchSilenceTimeout", c.WatchSilenceTimeout, MinWatchSilence, "a member answers a progress request within half of it"},
		{"KeepAliveSilenceTimeout", c.KeepAliveSilenceTimeout, MinKeepAliveSilence, "a member answers a keep-alive within it"},
	} {
		if b.v > 0 && b.v < b.least {
			return fmt.Errorf("%w: proxy.Config.%s %v: at least %v (%s, even busy: shorter benches healthy members), or negative for no check", ErrInvalidConfig, b.name, b.v, b.least, b.why)
		}
	}
	if c.CacheMaxBytes < 0 {
		return fmt.Errorf("%w: proxy.Config.CacheMaxBytes %d must not be negative", ErrInvalidConfig, c.CacheMaxBytes)
	}
	if c.UpstreamConns < 0 || c.UpstreamConns > 64 {
		return fmt.Errorf("%w: proxy.Config.UpstreamConns %d must be between 1 and 64", ErrInvalidConfig, c.UpstreamConns)
	}
	return nil
}

// parseInitialCluster returns the peer URLs of an --initial-cluster string.
func parseInitialCluster(s string) ([]string, error) {
	m, err := types.NewURLsMap(s)
	if err != nil {
		return nil, fmt.Errorf("%w: proxy.Config.InitialCluster %q: %v (want name=http://host:2380,...)", ErrBadURL, s, err)
	}
	var out []string
	for _, urls := range m {
		for _, u := range urls {
			out = append(out, u.String())
		}
	}
	if len(out) == 0 {
		return nil, fmt.Errorf("%w: proxy.Config.InitialCluster %q names no member", ErrBadURL, s)
	}
	if _, err := parseURLs(out); err != nil {
		return nil, err
	}
	return out, nil
}

// parseURLs checks member URLs: http or https, a host and a port, no path.
func parseURLs(list []string) ([]*url.URL, error) {
	var out []*url.URL
	for _, s := range list {
		u, err := parseMemberURL(s)
		if err != nil {
			return nil, err
		}
		out = append(out, u)
	}
	return out, nil
}

func parseMemberURL(s string) (*url.URL, error) {
	const want = "want scheme http or https, a host and a port, e.g. http://10.0.0.1:2379"
	u, err := url.Parse(strings.TrimSpace(s))
	if err != nil {
		return nil, fmt.Errorf("%w: %q: %s", ErrBadURL, s, want)
	}
	if u.Scheme != "http" && u.Scheme != "https" {
		return nil, fmt.Errorf("%w: %q: %s", ErrBadURL, s, want)
	}
	if u.Host == "" || u.Port() == "" {
		return nil, fmt.Errorf("%w: %q: no port: %s", ErrBadURL, s, want)
	}
	if u.Path != "" && u.Path != "/" {
		return nil, fmt.Errorf("%w: %q: a member URL has no path: %s", ErrBadURL, s, want)
	}
	u.Path = ""
	return u, nil
}

// source says where the proxy looks for the cluster (for messages; no
// token, password or URL path).
func (c Config) source() string {
	switch {
	case c.DiscoveryToken != "" || c.Discovery != nil:
		eps := c.DiscoveryEndpoints
		if c.Discovery != nil && len(c.Discovery.Endpoints) > 0 {
			eps = c.Discovery.Endpoints
		}
		if len(eps) == 0 {
			return "through the discovery token"
		}
		return "through the discovery token at " + redactedURLs(eps)
	case c.DiscoveryURL != "":
		if u, err := url.Parse(c.DiscoveryURL); err == nil && u.Host != "" {
			return "through the discovery URL at " + u.Scheme + "://" + u.Host
		}
		return "through the discovery URL"
	case c.DiscoverySRV != "":
		return "through the DNS SRV records of " + c.DiscoverySRV
	case c.InitialCluster != "":
		return "from the initial cluster " + c.InitialCluster
	case len(c.Endpoints) > 0:
		return "at the member client URLs " + redactedURLs(c.Endpoints)
	}
	return "from the peer URLs " + redactedURLs(c.PeerURLs)
}

// redactedURLs joins URLs with any password hidden.
func redactedURLs(urls []string) string {
	out := make([]string, len(urls))
	for i, s := range urls {
		out[i] = s
		if u, err := url.Parse(s); err == nil {
			out[i] = u.Redacted()
		}
	}
	return strings.Join(out, ", ")
}
