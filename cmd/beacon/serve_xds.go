package main

import (
	"fmt"

	"github.com/beaconplane/beacon/server"
	"github.com/beaconplane/beacon/server/xdsapi"
	"github.com/spf13/cobra"
)

// addXDSFlags registers the xDS interface's flags on `beacon serve`
// (docs/xds.md).
func addXDSFlags(cmd *cobra.Command, x *server.XDSConfig, s *server.Security) {
	f := cmd.Flags()
	f.StringVar(&x.Addr, "xds-addr", xdsapi.DefaultAddr, "xDS listener (gRPC ADS, state of the world) for proxyless gRPC clients and Envoy: xds:///<endpoint>.<component>.<namespace> (empty, --xds-addr=, disables xDS)")
	f.IntVar(&x.MaxStreams, "xds-max-streams", xdsapi.DefaultMaxStreams, "ADS streams open at once; further ones are refused (RESOURCE_EXHAUSTED)")
	f.IntVar(&x.MaxStreamsPerClient, "xds-max-streams-per-client", xdsapi.DefaultMaxStreamsPerClient, "ADS streams (and connections) one client address may have open at once (-1: no limit); a process needs one stream")
	f.IntVar(&x.MaxNamesPerClient, "xds-max-names-per-client", xdsapi.DefaultMaxNamesPerClient, "resource names the ADS streams of one client address may subscribe to together (-1: no limit); a client that wants every service subscribes to the wildcard")
	f.StringVar(&s.XDSTLS.CertFile, "xds-cert-file", "", "xDS listener: certificate file (PEM); re-read when it changes")
	f.StringVar(&s.XDSTLS.KeyFile, "xds-key-file", "", "xDS listener: key file (PEM)")
	f.StringVar(&s.XDSTLS.TrustedCAFile, "xds-trusted-ca-file", "", "xDS listener: CA bundle that signs client certificates (a verified client certificate's CN is its etcd user)")
	f.BoolVar(&s.XDSTLS.ClientCertAuth, "xds-client-cert-auth", false, "xDS listener: require a client certificate signed by --xds-trusted-ca-file")
	allowEmpty(cmd, "xds-addr", "no xDS")
}

// xdsFlags checks the xDS flags: a zero bound is a mistake to report, not
// the default to apply silently.
func xdsFlags(cmd *cobra.Command, x *server.XDSConfig) error {
	if x.Addr == "" {
		return nil
	}
	if x.MaxStreams <= 0 {
		return usagef("--xds-max-streams %d: must be at least 1 (to disable xDS, use --xds-addr=)", x.MaxStreams)
	}
	if x.MaxStreamsPerClient == 0 || x.MaxStreamsPerClient < -1 {
		return usage(fmt.Errorf("--xds-max-streams-per-client %d: must be at least 1, or -1 for no limit", x.MaxStreamsPerClient))
	}
	if x.MaxNamesPerClient == 0 || x.MaxNamesPerClient < -1 {
		return usage(fmt.Errorf("--xds-max-names-per-client %d: must be at least 1, or -1 for no limit", x.MaxNamesPerClient))
	}
	return nil
}
