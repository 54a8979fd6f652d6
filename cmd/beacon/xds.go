package main

import (
	"bytes"
	"context"
	"crypto/tls"
	"crypto/x509"
	"encoding/base64"
	"encoding/json"
	"fmt"
	"os"
	"time"

	"github.com/beaconplane/beacon/server/xdsapi"
	"github.com/spf13/cobra"
	"google.golang.org/grpc"
	"google.golang.org/grpc/credentials"
	"google.golang.org/grpc/credentials/insecure"
	"google.golang.org/grpc/metadata"
	"google.golang.org/protobuf/encoding/protojson"
)

func init() { rootCmd.AddCommand(newXDSCmd()) }

func newXDSCmd() *cobra.Command {
	cmd := &cobra.Command{
		Use:   "xds",
		Short: "Help gRPC clients in any language and Envoy route through Beacon's xDS server",
		Long: `beacon serve serves the registry over xDS (--xds-addr, default ` + xdsapi.DefaultAddr + `):
every namespace/component/endpoint is a Listener, a Cluster and a
ClusterLoadAssignment that proxyless gRPC clients (Go, C++, Python, Ruby,
PHP, Java, Node) resolve with the target
xds:///<endpoint>.<component>.<namespace>, and Envoy with cds_config: ads.
bootstrap prints a client's bootstrap file; get prints what the server sends
for a name. See docs/xds.md.`,
	}
	cmd.AddCommand(newXDSBootstrapCmd(), newXDSGetCmd())
	return cmd
}

func newXDSGetCmd() *cobra.Command {
	var (
		server, typ, user, password, cacert, cert, key string
		timeout                                        time.Duration
	)
	cmd := &cobra.Command{
		Use:   "get [NAME...]",
		Short: "Print what Beacon's xDS server sends a client for resource names (JSON)",
		Long: `Ask Beacon's xDS server once, as a client would, for the resources of --type
(listener, cluster or endpoint) named NAME (e.g. grpc.greeter.demo; none: every
service) and print its answer as JSON: what a gRPC client or Envoy gets. A name
that is no Beacon service, or that the user may not read, is absent.

  beacon xds get --type endpoint grpc.greeter.demo

Under beacon serve --auth give --user and the password in ETCD_AUTH_PASSWORD
(or --password), or a client certificate (--cacert --cert --key) whose CN is
the user.`,
		RunE: func(cmd *cobra.Command, names []string) error {
			url, ok := xdsapi.TypeURLs[typ]
			if !ok {
				return usagef("--type %q: want listener, cluster or endpoint", typ)
			}
			creds, err := xdsCredentials(cacert, cert, key)
			if err != nil {
				return err
			}
			cc, err := grpc.NewClient(server, grpc.WithTransportCredentials(creds))
			if err != nil {
				return usagef("--server %q: %v", server, err)
			}
			defer cc.Close()
			ctx, cancel := context.WithTimeout(cmd.Context(), timeout)
			defer cancel()
			if password == "" {
				password = os.Getenv("ETCD_AUTH_PASSWORD")
			}
			if user != "" {
				raw := base64.StdEncoding.EncodeToString([]byte(user + ":" + password))
				ctx = metadata.AppendToOutgoingContext(ctx, "authorization", "Basic "+raw)
			}
			resp, err := xdsapi.Fetch(ctx, cc, url, names...)
			if err != nil {
				return fmt.Errorf("xds get from %s: %w", server, err)
			}
			raw, err := protojson.Marshal(resp)
			if err != nil {
				return err
			}
			// protojson varies its spacing on purpose; print it stable.
			var compact, out bytes.Buffer
			if err := json.Compact(&compact, raw); err != nil {
				return err
			}
			if err := json.Indent(&out, compact.Bytes(), "", "  "); err != nil {
				return err
			}
			_, err = fmt.Fprintln(cmd.OutOrStdout(), out.String())
			return err
		},
	}
	f := cmd.Flags()
	f.StringVar(&server, "server", xdsapi.DefaultAddr, "Beacon's xDS server, host:port")
	f.StringVar(&typ, "type", "endpoint", "listener, cluster or endpoint")
	f.StringVar(&user, "user", os.Getenv("ETCD_AUTH_USERNAME"), "etcd user, under --auth (env ETCD_AUTH_USERNAME)")
	f.StringVar(&password, "password", "", "etcd password (env ETCD_AUTH_PASSWORD)")
	f.StringVar(&cacert, "cacert", "", "CA file that verifies the xDS server's certificate (connect over TLS)")
	f.StringVar(&cert, "cert", "", "client certificate file for mutual TLS (its CN is the etcd user)")
	f.StringVar(&key, "key", "", "client key file for mutual TLS")
	f.DurationVar(&timeout, "timeout", 10*time.Second, "bound on the answer")
	return cmd
}

// xdsCredentials are the transport credentials of beacon xds get.
func xdsCredentials(cacert, cert, key string) (credentials.TransportCredentials, error) {
	if cacert == "" {
		if cert != "" || key != "" {
			return nil, usagef("--cert and --key need --cacert: a client certificate is sent over TLS, which verifies the server against --cacert")
		}
		return insecure.NewCredentials(), nil
	}
	pem, err := os.ReadFile(cacert)
	if err != nil {
		return nil, usagef("--cacert: %v", err)
	}
	pool := x509.NewCertPool()
	if !pool.AppendCertsFromPEM(pem) {
		return nil, usagef("--cacert %q holds no PEM certificate", cacert)
	}
	cfg := &tls.Config{RootCAs: pool, MinVersion: tls.VersionTLS12}
	if cert != "" || key != "" {
		pair, err := tls.LoadX509KeyPair(cert, key)
		if err != nil {
			return nil, usagef("--cert/--key: %v", err)
		}
		cfg.Certificates = []tls.Certificate{pair}
	}
	return credentials.NewTLS(cfg), nil
}

func newXDSBootstrapCmd() *cobra.Command {
	var c xdsapi.BootstrapConfig
	cmd := &cobra.Command{
		Use:   "bootstrap",
		Short: "Print a GRPC_XDS_BOOTSTRAP file that points gRPC clients at Beacon",
		Long: `Print the bootstrap document (JSON) a proxyless gRPC client reads from the file
named by GRPC_XDS_BOOTSTRAP, so that xds:/// targets resolve through Beacon:

  beacon xds bootstrap --server 127.0.0.1:9380 > xds-bootstrap.json
  GRPC_XDS_BOOTSTRAP=$PWD/xds-bootstrap.json ./my-client   # dials xds:///grpc.greeter.demo

With --cacert the client connects over TLS (and with --cert/--key, mutual TLS:
the certificate's common name is its etcd user under beacon serve --auth).
TLS in a bootstrap is read by grpc-go and Envoy; @grpc/grpc-js-xds 1.14 and
gRPC C-core before 1.57 (Python, C++, Ruby, PHP) connect only without TLS.`,
		Args: cobra.NoArgs,
		RunE: func(cmd *cobra.Command, _ []string) error {
			b, err := xdsapi.Bootstrap(c)
			if err != nil {
				return usage(withFlagNames(err))
			}
			_, err = cmd.OutOrStdout().Write(b)
			return err
		},
	}
	f := cmd.Flags()
	f.StringVar(&c.Server, "server", xdsapi.DefaultAddr, "Beacon's xDS server, host:port (beacon serve --xds-addr)")
	f.StringVar(&c.NodeID, "node-id", "beacon-xds-client", "the client's name in Beacon's logs and metrics")
	f.StringVar(&c.Cluster, "node-cluster", "", "the client's cluster, for the logs")
	f.StringVar(&c.Region, "region", "", "the client's region")
	f.StringVar(&c.Zone, "zone", "", "the client's zone")
	f.StringVar(&c.SubZone, "sub-zone", "", "the client's sub-zone")
	f.StringVar(&c.CACertFile, "cacert", "", "CA file that verifies the xDS server's certificate (connect over TLS)")
	f.StringVar(&c.CertFile, "cert", "", "client certificate file for mutual TLS (its CN is the etcd user)")
	f.StringVar(&c.KeyFile, "key", "", "client key file for mutual TLS")
	return cmd
}
