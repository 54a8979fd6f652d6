package main

import (
	"fmt"
	"log/slog"
	"net"

	"github.com/beaconplane/beacon/internal/tlsfiles"
	"github.com/beaconplane/beacon/proxy"
	"github.com/spf13/cobra"
)

// proxyListenTLS are `beacon proxy`'s flags for its client-facing
// listener, with etcd grpc-proxy's names (--cert-file, --key-file,
// --trusted-ca-file) plus etcd's --client-cert-auth; --listen-cert and
// --listen-key remain as older names of the first two.
type proxyListenTLS struct {
	files                 tlsfiles.Files
	listenCert, listenKey string
}

func addProxyTLSFlags(cmd *cobra.Command) *proxyListenTLS {
	t := &proxyListenTLS{}
	f := cmd.Flags()
	f.StringVar(&t.files.CertFile, "cert-file", "", "serve clients over TLS with this certificate (re-read when it changes)")
	f.StringVar(&t.files.KeyFile, "key-file", "", "key of --cert-file")
	f.StringVar(&t.files.TrustedCAFile, "trusted-ca-file", "", "verify client certificates against this CA bundle (re-read when it changes)")
	f.BoolVar(&t.files.ClientCertAuth, "client-cert-auth", false, "require a client certificate signed by --trusted-ca-file (mutual TLS)")
	f.StringVar(&t.listenCert, "listen-cert", "", "older name of --cert-file")
	f.StringVar(&t.listenKey, "listen-key", "", "older name of --key-file")
	return t
}

// apply sets cfg.ServerTLS from the flags.
func (t *proxyListenTLS) apply(cfg *proxy.Config, log *slog.Logger) error {
	if t.files.CertFile == "" {
		t.files.CertFile = t.listenCert
	}
	if t.files.KeyFile == "" {
		t.files.KeyFile = t.listenKey
	}
	if !t.files.Enabled() {
		return nil
	}
	if err := t.files.Validate(tlsFlag("")); err != nil {
		return err
	}
	// A rotated certificate must still cover the listen address (unless
	// it is a wildcard one: then, some name of the previous certificate).
	r, err := tlsfiles.NewReloader(t.files, tlsfiles.Config{Logger: log.With("component", "proxy-tls"), Listener: "proxy",
		Names: tlsfiles.ListenerNames(cfg.ListenAddr), Metrics: cfg.Registry})
	if err != nil {
		return fmt.Errorf("--cert-file/--key-file: %w", err)
	}
	cfg.ServerTLS = r.ServerConfig("h2", "http/1.1")
	return nil
}

// proxyExposureWarning says why a proxy listener reachable from other
// machines is exposed: plain text on a non-loopback address (tokens and
// passwords cross the network in the clear). Empty when it is not.
func proxyExposureWarning(addr net.Addr, tls bool) string {
	if addr == nil || tls {
		return ""
	}
	host, _, err := net.SplitHostPort(addr.String())
	if err != nil {
		return ""
	}
	if ip := net.ParseIP(host); host == "localhost" || ip != nil && ip.IsLoopback() {
		return ""
	}
	return fmt.Sprintf("the proxy on %s is plain text on a non-loopback address: anyone on the network can read its clients' etcd tokens and passwords and the data; give --cert-file and --key-file (and --trusted-ca-file with --client-cert-auth)", addr)
}
