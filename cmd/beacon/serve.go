package main

import (
	"context"
	"fmt"
	"os"

	"github.com/beaconplane/beacon/backend"
	"github.com/beaconplane/beacon/server"
	"github.com/spf13/cobra"
	"github.com/spf13/pflag"
	"go.uber.org/zap/zapcore"
)

func init() { rootCmd.AddCommand(newServeCmd()) }

func newServeCmd() *cobra.Command {
	var (
		cfg          server.Config
		etcdLogLevel string
		etcdAuth     *backendFlags
	)
	cmd := &cobra.Command{
		Use:   "serve",
		Short: "Run Beacon: embedded etcd, HTTP API, health and metrics",
		Long: `Run Beacon's server. By default it starts a single-node embedded etcd (clients on
127.0.0.1:2379, peers on 127.0.0.1:2380, data in ./beacon.data) that etcdctl and
any etcd v3 client use unchanged, an HTTP listener on 127.0.0.1:9379 with
/healthz, /readyz, /metrics and the HTTP API, DNS on 127.0.0.1:9353 (UDP and
TCP) answering for every registered instance (docs/dns.md), and xDS on
127.0.0.1:9380 for gRPC clients in any language and Envoy (docs/xds.md).

With --etcd-endpoints it runs no etcd and fronts an external cluster instead
(credentials from ETCD_AUTH_* or the --etcd-* flags). With
BEACON_DISCOVERY_BACKEND=memory|file|nats (or --backend) the HTTP API runs on
that backend without etcd. With --backend kubernetes it serves the instances
of InstanceSet custom resources whose pods are Ready (lists and watches;
registration over HTTP is refused: register from the pods), see
docs/kubernetes.md and --kubeconfig, --kube-namespaces. With --layout dynamo
(BEACON_LAYOUT=dynamo) it serves, read-only, what the NVIDIA Dynamo runtime
writes to the etcd it fronts (--etcd-endpoints) or embeds: v1/instances/...
with the model names of v1/mdc/..., through the HTTP API, the dashboard, DNS
and xDS; every write is refused (docs/dynamo.md).

It stops gracefully on SIGINT or SIGTERM, giving open HTTP requests up to
--shutdown-timeout to finish; a second signal stops it without waiting.

Environment (flags win): BEACON_LAYOUT, BEACON_DISCOVERY_BACKEND (else Dynamo's
DYN_DISCOVERY_BACKEND=kubernetes|etcd|kv_store|file|mem, kv_store meaning etcd
and mem memory; Beacon's backends, keys and file format, not Dynamo's:
docs/store.md), ETCD_AUTH_USERNAME,
ETCD_AUTH_PASSWORD, ETCD_AUTH_CA, ETCD_AUTH_CLIENT_CERT, ETCD_AUTH_CLIENT_KEY,
BEACON_LOG_LEVEL, BEACON_LOG_FORMAT.`,
		Args: cobra.NoArgs,
		RunE: func(cmd *cobra.Command, _ []string) error {
			return runServe(cmd, cfg, etcdLogLevel, etcdAuth)
		},
	}
	addServeEtcdFlags(cmd.Flags(), &cfg, &etcdLogLevel)
	etcdAuth = addBackendFlags(cmd, "etcd-")
	addDiscoveryFlags(cmd, &cfg.Discovery)    // serve_discovery.go
	addPerfFlags(cmd, &cfg)                   // serve_perf.go
	addSecurityFlags(cmd, &cfg.Security)      // serve_security.go
	addDNSFlags(cmd, &cfg.DNS)                // serve_dns.go
	addXDSFlags(cmd, &cfg.XDS, &cfg.Security) // serve_xds.go
	addHealthFlags(cmd, &cfg.Health)          // serve_health.go
	cmd.Flags().StringVar(&etcdAuth.backend, "backend", backend.Etcd, "backend: etcd, memory, file, nats or kubernetes (env "+backend.EnvVar+")")
	addKubeFlags(cmd, etcdAuth) // backend_kube.go
	addLayoutFlag(cmd)          // layout.go
	return cmd
}

// addServeEtcdFlags declares the flags of the server's etcd member and
// listeners, of its v2 discovery service and of its shutdown.
func addServeEtcdFlags(f *pflag.FlagSet, cfg *server.Config, etcdLogLevel *string) {
	f.StringVar(&cfg.Name, "name", server.DefaultName, "etcd member name")
	f.StringVar(&cfg.DataDir, "data-dir", server.DefaultDataDir, "embedded etcd data directory (created if missing)")
	f.StringSliceVar(&cfg.ListenClientURLs, "listen-client-urls", []string{server.DefaultClientURL}, "URLs where embedded etcd serves clients")
	f.StringSliceVar(&cfg.AdvertiseClientURLs, "advertise-client-urls", nil, "client URLs advertised to the cluster (default: --listen-client-urls)")
	f.StringSliceVar(&cfg.ListenPeerURLs, "listen-peer-urls", []string{server.DefaultPeerURL}, "URLs where embedded etcd talks to other members")
	f.StringSliceVar(&cfg.AdvertisePeerURLs, "initial-advertise-peer-urls", nil, "peer URLs advertised to the cluster (default: --listen-peer-urls)")
	f.StringVar(&cfg.InitialCluster, "initial-cluster", "", "initial cluster, name=peerURL,... (default: this member alone)")
	f.StringVar(&cfg.InitialClusterState, "initial-cluster-state", "new", "new or existing")
	f.StringVar(&cfg.InitialClusterToken, "initial-cluster-token", "beacon", "initial cluster token")
	f.StringVar(&cfg.HTTPAddr, "http-addr", server.DefaultHTTPAddr, "HTTP API, health and metrics listener")
	f.StringSliceVar(&cfg.CORSAllowedOrigins, "cors-allowed-origins", nil, "origins whose browser pages may use the HTTP API, e.g. https://app.example.com, or * for any (default: none, CORS off)")
	f.StringVar(&cfg.V2BaseURL, "v2-base-url", "", "public URL of the v2 discovery service, the prefix of the token URLs /v2/discovery/new answers (default http://<--http-addr>/v2/discovery)")
	f.DurationVar(&cfg.V2TokenMaxAge, "v2-token-ttl", 0, "how long a v2 discovery token lives (default 168h)")
	f.StringSliceVar(&cfg.EtcdEndpoints, "etcd-endpoints", nil, "front this external etcd cluster instead of running embedded etcd")
	f.StringVar(etcdLogLevel, "etcd-log-level", "warn", "lowest level of embedded etcd's logs to show")
	f.DurationVar(&cfg.ShutdownTimeout, "shutdown-timeout", server.DefaultShutdownTimeout, "graceful shutdown bound")
	addCompactionFlag(f) // serve_compaction.go
}

// runServe runs beacon serve with cfg until the command's context ends.
func runServe(cmd *cobra.Command, cfg server.Config, etcdLogLevel string, etcdAuth *backendFlags) error {
	logger, err := newLogger(cmd.ErrOrStderr())
	if err != nil {
		return err
	}
	cfg.Logger, cfg.SettingName = logger, flagFor
	var lvl zapcore.Level
	if err := lvl.UnmarshalText([]byte(etcdLogLevel)); err != nil {
		return usagef("--etcd-log-level %q: must be debug, info, warn or error", etcdLogLevel)
	}
	cfg.EtcdLogLevel = &lvl
	if cfg.AutoCompactionRetention, err = compactionRetention(cmd.Flags()); err != nil {
		return err
	}
	be, err := backendSetting(cmd.Flags())
	if err != nil {
		return err
	}
	if err := backend.CheckName(be.val); err != nil {
		return usagef("%v: %v", be, err)
	}
	if be.val == backend.Kubernetes {
		if err := etcdAuth.checkKube(cmd.Flags()); err != nil {
			return err
		}
	}
	if len(cfg.EtcdEndpoints) > 0 {
		if err := etcdAuth.checkTLSFiles(cmd.Flags()); err != nil {
			return err
		}
	}
	if cfg.Registry.Layout, err = resolveLayout(cmd, be.val); err != nil {
		return err
	}
	cfg.Backend = etcdAuth.config()
	cfg.Backend.Name = be.val
	healthFlags(cmd, &cfg, be.val, os.Getenv, logger) // serve_health.go
	if err := dnsFlags(&cfg.DNS); err != nil {
		return err
	}
	if err := xdsFlags(cmd, &cfg.XDS); err != nil {
		return err
	}
	if err := securityFlags(cmd.Flags(), &cfg.Security); err != nil { // serve_security.go
		return err
	}
	srv, err := server.New(cfg)
	if err != nil {
		return usage(withFlagNames(err)) // New only checks the configuration
	}
	ctx := cmd.Context()
	if err := srv.Start(ctx); err != nil {
		return withFlagNames(err)
	}
	fmt.Fprint(cmd.OutOrStdout(), srv.Banner())
	stopping := context.AfterFunc(ctx, func() {
		logger.Info("stopping: open HTTP requests get up to --shutdown-timeout to finish; a second SIGINT or SIGTERM cuts it short",
			"shutdown-timeout", cfg.ShutdownTimeout)
	})
	defer stopping()
	cutShort := context.AfterFunc(urgent(ctx), func() {
		logger.Warn("second signal: shutdown cut short, requests in flight are not waited for")
		srv.Abort()
	})
	defer cutShort()
	if err := srv.Wait(ctx); err != nil {
		return withFlagNames(err)
	}
	fmt.Fprintln(cmd.OutOrStdout(), "beacon serve stopped")
	return nil
}
