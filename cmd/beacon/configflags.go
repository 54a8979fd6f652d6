package main

import (
	"regexp"
)

// Libraries name the configuration field an error is about
// ("Config.HTTPAddr", "dnsapi.Config.TTL"), never a flag; the commands
// here set those fields from flags, and say which flag to change instead.

// configFlags names the flag that sets each configuration field libraries
// name in their errors: server.Config (beacon serve), dnsapi.Config (its
// DNS) and xdsapi.BootstrapConfig (beacon xds bootstrap).
var configFlags = map[string]string{
	"Config.AdvertisePeerURLs":       "--initial-advertise-peer-urls",
	"Config.InitialClusterState":     "--initial-cluster-state",
	"Config.InitialCluster":          "--initial-cluster",
	"Config.ListenClientURLs":        "--listen-client-urls",
	"Config.ListenPeerURLs":          "--listen-peer-urls",
	"Config.EtcdEndpoints":           "--etcd-endpoints",
	"Config.HTTPAddr":                "--http-addr",
	"Config.ShutdownTimeout":         "--shutdown-timeout",
	"Config.V2BaseURL":               "--v2-base-url",
	"Config.V2TokenMaxAge":           "--v2-token-ttl",
	"Config.CORSAllowedOrigins":      "--cors-allowed-origins",
	"Config.Name":                    "--name",
	"Config.DataDir":                 "--data-dir",
	"Config.AutoCompactionRetention": "--auto-compaction-retention",
	"Config.Backend":                 "--backend",
	"Config.Layout":                  "--layout",

	"Config.Discovery":           "--discovery-*",
	"Config.Discovery.Fallback":  "--discovery-fallback",
	"Config.Discovery.Timeout":   "--discovery-timeout",
	"Config.Discovery.Token":     "--discovery-token",
	"Config.Discovery.Endpoints": "--discovery-endpoints",

	"Config.DNS.Addr":       "--dns-addr",
	"dnsapi.Config.Domain":  "--dns-domain",
	"dnsapi.Config.TTL":     "--dns-ttl",
	"Config.XDS.Addr":       "--xds-addr",
	"Config.XDS.MaxStreams": "--xds-max-streams",

	"Config.Health.Enabled":   "--health-checks",
	"Config.Health.CheckerID": "--health-checker-id",

	"Config.Security.Auth":             "--auth",
	"Config.Security.RootPasswordFile": "--auth-root-password-file",
	"Config.Security.AuthToken":        "--auth-token",
	"Config.Security.AuthTokenTTL":     "--auth-token-ttl",
	"Config.Security.HostWhitelist":    "--host-whitelist",
	"Config.Security.MaxBodyBytes":     "--max-body-bytes",
	"Config.Security.MaxAuthClients":   "--max-auth-clients",
	"Config.Security.MaxConns":         "--http-max-connections",
	"Config.Security.BcryptCost":       "--bcrypt-cost",
	"Config.Security.RequestTimeout":   "--http-request-timeout",
	"Config.Security.IdleTimeout":      "--http-idle-timeout",

	"Config.Backend.Etcd.Username":   "--etcd-user",
	"Config.Backend.Etcd.Password":   "--etcd-password",
	"Config.Backend.Etcd.CA":         "--etcd-cacert",
	"Config.Backend.Etcd.ClientCert": "--etcd-cert",
	"Config.Backend.Etcd.ClientKey":  "--etcd-key",

	// Named in what beacon serve says while it runs (server.Config.SettingName).
	"dnsapi.Config.MaxStale":            "--dns-max-stale",
	"xdsapi.Config.MaxStreams":          "--xds-max-streams",
	"xdsapi.Config.MaxStreamsPerClient": "--xds-max-streams-per-client",
	"xdsapi.Config.MaxNamesPerClient":   "--xds-max-names-per-client",
	"registryapi.Config.Operators":      "--auth",

	// The kubernetes backend of every registry command.
	"kube.Config.Kubeconfig": "--kubeconfig",

	// beacon proxy (proxy.Config).
	"proxy.Config.Discovery":               "--discovery-*",
	"proxy.Config.DiscoveryToken":          "--discovery-token",
	"proxy.Config.DiscoveryEndpoints":      "--discovery-endpoints",
	"proxy.Config.DiscoveryURL":            "--discovery",
	"proxy.Config.DiscoverySRV":            "--discovery-srv",
	"proxy.Config.DNSServer":               "--discovery-dns-server",
	"proxy.Config.InitialCluster":          "--initial-cluster",
	"proxy.Config.Endpoints":               "--endpoints",
	"proxy.Config.ListenAddr":              "--listen-addr",
	"proxy.Config.FailureWait":             "--proxy-failure-wait",
	"proxy.Config.RefreshInterval":         "--proxy-refresh-interval",
	"proxy.Config.DialTimeout":             "--proxy-dial-timeout",
	"proxy.Config.ReadTimeout":             "--proxy-read-timeout",
	"proxy.Config.CacheMaxBytes":           "--cache-max-bytes",
	"proxy.Config.MaxStreams":              "--max-streams",
	"proxy.Config.MaxStreamsPerClient":     "--max-streams-per-client",
	"proxy.Config.MaxConns":                "--max-connections",
	"proxy.Config.MaxConnsPerClient":       "--max-connections-per-client",
	"proxy.Config.MaxWatchers":             "--max-watchers",
	"proxy.Config.MaxWatchersPerStream":    "--max-watchers-per-stream",
	"proxy.Config.MaxWatchWaitingBytes":    "--max-watch-waiting-bytes",
	"proxy.Config.WatchSilenceTimeout":     "--watch-silence-timeout",
	"proxy.Config.KeepAliveSilenceTimeout": "--keepalive-silence-timeout",

	"xdsapi.BootstrapConfig.Server":     "--server",
	"xdsapi.BootstrapConfig.CertFile":   "--cert",
	"xdsapi.BootstrapConfig.KeyFile":    "--key",
	"xdsapi.BootstrapConfig.CACertFile": "--cacert",
}

func init() {
	// The TLS files of each listener: Config.Security.HTTPTLS.CertFile
	// is --http-cert-file.
	for field, prefix := range map[string]string{"ClientTLS": "", "PeerTLS": "peer-", "HTTPTLS": "http-", "XDSTLS": "xds-"} {
		name := tlsFlag(prefix)
		for _, f := range []string{"CertFile", "KeyFile", "TrustedCAFile", "ClientCertAuth"} {
			configFlags["Config.Security."+field+"."+f] = name(f)
		}
	}
}

// tlsFlag names the flags of a tlsfiles.Files with the flag prefix
// prefix ("", "peer-", "http-"...), for tlsfiles.Files.Validate.
func tlsFlag(prefix string) func(field string) string {
	return func(field string) string {
		return "--" + prefix + map[string]string{"CertFile": "cert-file", "KeyFile": "key-file",
			"TrustedCAFile": "trusted-ca-file", "ClientCertAuth": "client-cert-auth"}[field]
	}
}

// configField matches a configuration field as libraries name it: an
// optional package, a type ending in Config, and the field's path.
var configField = regexp.MustCompile(`\b(?:[a-z]+\.)?[A-Za-z]*Config(?:\.[A-Z][A-Za-z0-9]*)+`)

// flagError is an error whose message names flags where the library's
// named configuration fields; errors.Is and errors.As see the original.
type flagError struct {
	msg string
	err error
}

func (e *flagError) Error() string { return e.msg }
func (e *flagError) Unwrap() error { return e.err }

// flagFor is the SettingName of the configurations commands build: the
// flag that sets field, or "" (the library then names the field).
func flagFor(field string) string { return configFlags[field] }

// withFlagNames returns err with every configuration field it names (and
// that a flag sets) replaced by the flag.
func withFlagNames(err error) error {
	if err == nil {
		return nil
	}
	msg := err.Error()
	out := configField.ReplaceAllStringFunc(msg, func(field string) string {
		if flag, ok := configFlags[field]; ok {
			return flag
		}
		return field
	})
	if out == msg {
		return err
	}
	return &flagError{msg: out, err: err}
}
