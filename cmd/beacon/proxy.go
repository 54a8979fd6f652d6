package main

import (
	"fmt"
	"log/slog"
	"net"
	"strconv"
	"strings"
	"time"

	"github.com/beaconplane/beacon/bootstrap"
	"github.com/beaconplane/beacon/internal/hostport"
	"github.com/beaconplane/beacon/proxy"
	"github.com/prometheus/client_golang/prometheus"
	"github.com/prometheus/client_golang/prometheus/collectors"
	"github.com/spf13/cobra"
	"github.com/spf13/pflag"
	"go.etcd.io/etcd/client/pkg/v3/transport"
)

func init() { rootCmd.AddCommand(newProxyCmd()) }

// msDuration is a duration flag that, like etcd's --proxy-* flags, also
// accepts a bare number of milliseconds.
type msDuration struct{ d *time.Duration }

func (m msDuration) String() string {
	if m.d == nil {
		return "0s"
	}
	return m.d.String()
}

func (m msDuration) Set(s string) error {
	if n, err := strconv.ParseInt(s, 10, 64); err == nil {
		*m.d = time.Duration(n) * time.Millisecond
		return nil
	}
	d, err := time.ParseDuration(s)
	if err != nil {
		return fmt.Errorf("want a duration such as 5s or a number of milliseconds")
	}
	*m.d = d
	return nil
}

func (m msDuration) Type() string { return "duration" }

// proxyFlags are beacon proxy's settings: the proxy's configuration and
// the flags that are not a field of it.
type proxyFlags struct {
	cfg               proxy.Config
	mode              string
	cacert, cert, key string
	listenTLS         *proxyListenTLS
	disc              bootstrap.Config
}

func newProxyCmd() *cobra.Command {
	p := &proxyFlags{}
	p.cfg.FailureWait = proxy.DefaultFailureWait
	p.cfg.RefreshInterval = proxy.DefaultRefreshInterval
	p.cfg.DialTimeout = proxy.DefaultDialTimeout
	p.cfg.WriteTimeout = proxy.DefaultWriteTimeout
	p.cfg.StartTimeout = proxy.DefaultStartTimeout
	cmd := &cobra.Command{
		Use:   "proxy",
		Short: "Run a readwrite or readonly proxy of an etcd cluster",
		Long: `Run an etcd v3 proxy: one listener (default 127.0.0.1:23790) serving the etcd
gRPC API (KV, Watch, Lease, Cluster, Maintenance, Auth, Lock, Election), the
etcd JSON gateway (/v3/kv/range, /v3/watch, ...), /metrics and /health.

--mode readwrite (default) forwards everything; --mode readonly forwards reads
and watches and refuses every write with gRPC Unimplemented / HTTP 501.

The cluster is found from one of, in this order: --discovery-token with
--discovery-endpoints (etcd v3 discovery; works when the cluster is full),
--discovery (etcd v2 discovery URL), --discovery-srv (DNS SRV records),
--initial-cluster, --endpoints (client URLs), else http://localhost:2380. The
members' client URLs are re-read every --proxy-refresh-interval (every second
while none is reachable); a failed endpoint is benched for
--proxy-failure-wait. Endpoints that are the proxy itself are never used.
Identical watches share one etcd watch; lease keep-alives share one stream.

The listener answers at once: until a member answers (within --start-timeout,
else the proxy exits 1; --start-timeout 0 looks until interrupted), /health is 503 and every request gets gRPC Unavailable
(HTTP 503) saying that no reachable member was found yet and what was tried.

Environment (flags win): BEACON_PROXY_MODE, BEACON_PROXY_LISTEN, ETCD_AUTH_CA,
ETCD_AUTH_CLIENT_CERT, ETCD_AUTH_CLIENT_KEY (then ETCDCTL_CACERT, ETCDCTL_CERT,
ETCDCTL_KEY), BEACON_LOG_LEVEL, BEACON_LOG_FORMAT.`,
		Example: `  beacon proxy --initial-cluster infra1=http://10.0.0.1:2380,infra2=http://10.0.0.2:2380
  beacon proxy --mode readonly --discovery-token $TOKEN --discovery-endpoints http://disc:2379
  beacon proxy --discovery-srv example.com --discovery-dns-server 10.0.0.53:53`,
		Args: cobra.NoArgs,
		RunE: func(cmd *cobra.Command, _ []string) error {
			logger, err := newLogger(cmd.ErrOrStderr())
			if err != nil {
				return err
			}
			if err := p.resolve(cmd.Flags(), logger); err != nil {
				return err
			}
			return serveProxy(cmd, p.cfg, logger)
		},
	}
	f := cmd.Flags()
	f.StringVar(&p.mode, "mode", "readwrite", "readwrite or readonly (env BEACON_PROXY_MODE)")
	f.StringVar(&p.cfg.ListenAddr, "listen-addr", proxy.DefaultListenAddr, "address to serve gRPC and HTTP on (env BEACON_PROXY_LISTEN)")
	p.addClusterFlags(f)
	p.addTimeoutFlags(cmd)
	f.StringSliceVar(&p.cfg.SelfAddrs, "advertise-addr", nil, "other addresses this proxy is reached at (never forwarded to)")
	f.StringVar(&p.cacert, "cacert", "", "CA file to verify members' certificates (env ETCD_AUTH_CA, then ETCDCTL_CACERT)")
	f.StringVar(&p.cert, "cert", "", "client certificate for members (env ETCD_AUTH_CLIENT_CERT, then ETCDCTL_CERT)")
	f.StringVar(&p.key, "key", "", "client key for members (env ETCD_AUTH_CLIENT_KEY, then ETCDCTL_KEY)")
	p.listenTLS = addProxyTLSFlags(cmd) // proxy_security.go: --cert-file ... and --listen-cert/--listen-key
	p.addLimitFlags(f)
	addProxyPerfFlags(cmd, &p.cfg) // proxy_perf.go
	allowZero(cmd, "watch-silence-timeout", "the default")
	return cmd
}

// addClusterFlags declares how the proxy finds the etcd cluster.
func (p *proxyFlags) addClusterFlags(f *pflag.FlagSet) {
	f.StringVar(&p.cfg.DiscoveryToken, "discovery-token", "", "etcd v3 discovery token (with --discovery-endpoints)")
	f.StringSliceVar(&p.cfg.DiscoveryEndpoints, "discovery-endpoints", nil, "client URLs of the etcd cluster holding the v3 discovery token")
	f.StringVar(&p.disc.User, "discovery-user", "", "user for the v3 discovery service (user or user:password)")
	f.StringVar(&p.disc.Password, "discovery-password", "", "password for the v3 discovery service")
	f.StringVar(&p.disc.CACertFile, "discovery-cacert", "", "CA file to verify the v3 discovery service")
	f.StringVar(&p.disc.CertFile, "discovery-cert", "", "client certificate for the v3 discovery service")
	f.StringVar(&p.disc.KeyFile, "discovery-key", "", "client key for the v3 discovery service")
	f.StringVar(&p.cfg.DiscoveryURL, "discovery", "", "etcd v2 discovery URL, e.g. https://discovery.etcd.io/<token>")
	f.StringVar(&p.cfg.DiscoverySRV, "discovery-srv", "", "DNS domain with _etcd-server(-ssl)._tcp SRV records of the members")
	f.StringVar(&p.cfg.DiscoverySRVName, "discovery-srv-name", "", "suffix of the SRV service name (_etcd-server-<name>._tcp)")
	f.StringVar(&p.cfg.DNSServer, "discovery-dns-server", "", "host:port of the DNS server for --discovery-srv (default: system resolver)")
	f.StringVar(&p.cfg.InitialCluster, "initial-cluster", "", "members' peer URLs as name=http://host:2380,...")
	f.StringSliceVar(&p.cfg.Endpoints, "endpoints", nil, "members' client URLs, e.g. 10.0.0.1:2379 or https://10.0.0.1:2379 (refreshed with MemberList)")
}

// addTimeoutFlags declares the proxy's timeouts: etcd's --proxy-* flags
// (a duration or a number of milliseconds) and --start-timeout.
func (p *proxyFlags) addTimeoutFlags(cmd *cobra.Command) {
	f := cmd.Flags()
	f.Var(msDuration{&p.cfg.FailureWait}, "proxy-failure-wait", "how long a failed endpoint stays out of use (duration or milliseconds; positive)")
	f.Var(msDuration{&p.cfg.RefreshInterval}, "proxy-refresh-interval", "how often to re-read the member list (duration or milliseconds; positive)")
	f.Var(msDuration{&p.cfg.DialTimeout}, "proxy-dial-timeout", "timeout to connect to a member (duration or milliseconds; positive)")
	f.Var(msDuration{&p.cfg.WriteTimeout}, "proxy-write-timeout", "timeout of each forwarded write; 0 disables: the client's deadline applies (duration or milliseconds)")
	f.Var(msDuration{&p.cfg.ReadTimeout}, "proxy-read-timeout", "timeout of each forwarded read; 0, the default, disables: the client's deadline applies (duration or milliseconds)")
	f.Var(msDuration{&p.cfg.StartTimeout}, "start-timeout", "how long to look for a reachable cluster at start, then exit 1 (requests get Unavailable meanwhile); 0: look until interrupted")
	allowZero(cmd, "proxy-write-timeout", "disabled")
	allowZero(cmd, "proxy-read-timeout", "disabled")
	allowZero(cmd, "start-timeout", "look until interrupted")
}

// addLimitFlags declares the bounds on what clients may use.
func (p *proxyFlags) addLimitFlags(f *pflag.FlagSet) {
	f.UintVar(&p.cfg.MaxRequestBytes, "max-request-bytes", proxy.DefaultMaxRequestBytes, "largest client request read (etcd's --max-request-bytes)")
	f.IntVar(&p.cfg.MaxWatchers, "max-watchers", proxy.DefaultMaxWatchers, "most watchers clients may have open on the proxy (-1: no limit)")
	f.IntVar(&p.cfg.MaxWatchersPerStream, "max-watchers-per-stream", proxy.DefaultMaxWatchersPerStream, "most watchers on one client watch stream (one etcd client) (-1: no limit)")
	f.Int64Var(&p.cfg.MaxWatchWaitingBytes, "max-watch-waiting-bytes", proxy.DefaultMaxWatchWaitingBytes, "most bytes of events waiting for all client watch streams together, each counted once; past it the streams that have waited longest are ended, their clients re-watch (-1: no limit)")
	f.IntVar(&p.cfg.MaxStreams, "max-streams", proxy.DefaultMaxStreams, "most client streams (watch, lease keep-alive, ...) open on the proxy at once; an etcd client needs one watch and one keep-alive stream (-1: no limit)")
	f.IntVar(&p.cfg.MaxConns, "max-connections", 0, "most client connections open at once, so that a flood cannot take the file descriptors the proxy needs for its members; at the bound a new one takes the place of one that carries no call (silent ones first), and waits only while every one carries one (default: a quarter of the open-file limit, at least 256; -1: no limit)")
	f.IntVar(&p.cfg.MaxConnsPerClient, "max-connections-per-client", proxy.DefaultMaxConnsPerClient, "most client connections one client address (every local process, everyone behind one NAT) may have open at once; at the bound a new one takes the place of one of the address's that carries no call, and is refused only while every one carries one (-1: no limit)")
	f.IntVar(&p.cfg.MaxStreamsPerClient, "max-streams-per-client", proxy.DefaultMaxStreamsPerClient, "most client streams of each kind (watch, lease keep-alive, other) one client address (every local process, everyone behind one NAT) may have open at once, so that one client cannot take --max-streams from the others; at the bound a new stream takes the place of one of its kind that has carried no request, and is refused only while every one has (-1: no limit; 0 is refused)")
}

// resolve completes p.cfg from the flags and variables, checking each
// value and naming, on error, the flag or variable it came from.
func (p *proxyFlags) resolve(f *pflag.FlagSet, logger *slog.Logger) error {
	cfg := &p.cfg
	modeSet := lookup(f, "mode", "BEACON_PROXY_MODE")
	m, err := proxy.ParseMode(modeSet.val)
	if err != nil {
		return usagef("%v: %w", modeSet, err)
	}
	cfg.Mode = m
	listen := lookup(f, "listen-addr", "BEACON_PROXY_LISTEN")
	if err := hostport.Check(listen.val); err != nil {
		return usagef("%v: %w, e.g. %s", listen, err, proxy.DefaultListenAddr)
	}
	cfg.ListenAddr = listen.val
	if err := proxyDurations(f, cfg); err != nil {
		return err
	}
	tlsSrc := p.lookupClientTLS(f)
	// Like every other command, accept host:port endpoints.
	for i, ep := range cfg.Endpoints {
		if ep = strings.TrimSpace(ep); ep != "" && !strings.Contains(ep, "://") {
			scheme := "http://"
			if len(tlsSrc) > 0 {
				scheme = "https://"
			}
			ep = scheme + ep
		}
		cfg.Endpoints[i] = ep
	}
	cfg.Logger, cfg.SettingName = logger, flagFor
	if disc := &p.disc; disc.User != "" || disc.Password != "" || disc.CACertFile != "" || disc.CertFile != "" || disc.KeyFile != "" {
		// Credentials or TLS for the discovery service: hand the
		// token over as a full bootstrap configuration.
		disc.Token, disc.Endpoints = cfg.DiscoveryToken, cfg.DiscoveryEndpoints
		cfg.DiscoveryToken, cfg.DiscoveryEndpoints = "", nil
		cfg.Discovery = disc
	}
	if p.cacert != "" || p.cert != "" || p.key != "" {
		tlsCfg, err := (&transport.TLSInfo{TrustedCAFile: p.cacert, CertFile: p.cert, KeyFile: p.key}).ClientConfig()
		if err != nil {
			return usagef("TLS to etcd (%s): %w", strings.Join(tlsSrc, ", "), err)
		}
		cfg.ClientTLS = tlsCfg
	}
	reg := prometheus.NewRegistry()
	reg.MustRegister(collectors.NewGoCollector(), collectors.NewProcessCollector(collectors.ProcessCollectorOpts{}))
	cfg.Registry = reg
	if err := p.listenTLS.apply(cfg, logger); err != nil { // proxy_security.go
		return usage(err)
	}
	return nil
}

// lookupClientTLS reads the TLS files for the members from the flags, else
// the variables, and returns where each one given came from.
func (p *proxyFlags) lookupClientTLS(f *pflag.FlagSet) (tlsSrc []string) {
	tlsFiles := map[string]*string{"cacert": &p.cacert, "cert": &p.cert, "key": &p.key}
	for _, fl := range []struct{ flag, env, etcdctl string }{
		{"cacert", "ETCD_AUTH_CA", envEtcdctlCACert},
		{"cert", "ETCD_AUTH_CLIENT_CERT", envEtcdctlCert},
		{"key", "ETCD_AUTH_CLIENT_KEY", envEtcdctlKey},
	} {
		s := lookup(f, fl.flag, fl.env, fl.etcdctl)
		*tlsFiles[fl.flag] = s.val
		if s.val != "" {
			tlsSrc = append(tlsSrc, s.String())
		}
	}
	return tlsSrc
}

// serveProxy runs the proxy of cfg until the command's context ends.
func serveProxy(cmd *cobra.Command, cfg proxy.Config, logger *slog.Logger) error {
	p, err := proxy.New(cfg)
	if err != nil {
		return usage(withFlagNames(err)) // New only checks the configuration
	}
	go func() {
		select {
		case <-p.Ready():
			fmt.Fprintf(cmd.OutOrStdout(), "beacon proxy (%s) serving on %s; endpoints: %s\n",
				p.Mode(), p.Addr(), describeEndpoints(p.Endpoints()))
			if w := proxyExposureWarning(p.Addr(), cfg.ServerTLS != nil); w != "" {
				logger.Warn("SECURITY: listener exposed without protection", "problem", w)
				fmt.Fprintf(cmd.OutOrStdout(), "  WARNING  %s\n", w)
			}
		case <-p.Done():
		}
	}()
	l, err := net.Listen("tcp", cfg.ListenAddr)
	if err != nil {
		return fmt.Errorf("proxy: listen on %s: %w", cfg.ListenAddr, err)
	}
	fmt.Fprintf(cmd.OutOrStdout(), "beacon proxy listening on %s; finding the etcd cluster (/health answers 503 until a member does)\n", l.Addr())
	defer paceProxyGC(cmd.Context())()
	return p.Serve(cmd.Context(), l)
}

// proxyDurations checks the proxy's duration flags and gives 0 the meaning
// their help says (the configuration's 0 is the default): none may be
// negative; --proxy-write-timeout 0 disables the bound, --start-timeout 0
// looks for the cluster until interrupted. The others refuse 0
// (checkZeroFlags): etcd 2 re-read the member list without pause at a
// --proxy-refresh-interval of 0, Beacon silently used 30 s.
func proxyDurations(f *pflag.FlagSet, cfg *proxy.Config) error {
	for _, d := range []struct {
		flag string
		v    *time.Duration
	}{
		{"proxy-failure-wait", &cfg.FailureWait}, {"proxy-refresh-interval", &cfg.RefreshInterval},
		{"proxy-dial-timeout", &cfg.DialTimeout}, {"proxy-write-timeout", &cfg.WriteTimeout},
		{"proxy-read-timeout", &cfg.ReadTimeout}, {"start-timeout", &cfg.StartTimeout},
	} {
		if *d.v < 0 {
			return usagef("--%s %v: must not be negative", d.flag, *d.v)
		}
	}
	if f.Changed("proxy-write-timeout") && cfg.WriteTimeout == 0 {
		cfg.WriteTimeout = -1 // the configuration's "disabled"
	}
	if f.Changed("start-timeout") && cfg.StartTimeout == 0 {
		cfg.StartTimeout = -1 // the configuration's "no bound"
	}
	return nil
}

func describeEndpoints(eps []proxy.EndpointStatus) string {
	var parts []string
	for _, e := range eps {
		parts = append(parts, e.URL+" ("+e.State+")")
	}
	return strings.Join(parts, ", ")
}
