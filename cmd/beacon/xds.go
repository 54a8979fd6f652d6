package main

import (
	"github.com/beaconplane/beacon/server/xdsapi"
	"github.com/spf13/cobra"
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
See docs/xds.md.`,
	}
	cmd.AddCommand(newXDSBootstrapCmd())
	return cmd
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
				return usage(err)
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
