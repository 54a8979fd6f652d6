package xdsapi

import (
	"encoding/json"
	"errors"
	"fmt"
	"net"
	"strconv"
)

// BootstrapConfig describes a client of Beacon's xDS server, for Bootstrap.
type BootstrapConfig struct {
	// Server is the xDS server's host:port; DefaultAddr when empty.
	Server string
	// NodeID names the client in Beacon's logs and metrics (clients send
	// it with their first request); "beacon-xds-client" when empty.
	NodeID string
	// Cluster is the node's cluster, for the logs.
	Cluster string
	// Region, Zone and SubZone are the client's own locality.
	Region, Zone, SubZone string
	// CACertFile, when set, makes the client connect with TLS and verify
	// the server against this CA; CertFile and KeyFile add a client
	// certificate (mutual TLS: its common name is the client's etcd user).
	// TLS channel credentials in a bootstrap are read by grpc-go (gRFC
	// A65) and Envoy; gRPC C-core before 1.57 and @grpc/grpc-js-xds 1.14
	// accept only insecure ones.
	CACertFile, CertFile, KeyFile string
}

// Validate returns every problem with the configuration.
func (c BootstrapConfig) Validate() error {
	var errs []error
	if c.Server != "" {
		host, port, err := net.SplitHostPort(c.Server)
		if p, perr := strconv.Atoi(port); err != nil || host == "" || perr != nil || p < 1 || p > 65535 {
			errs = append(errs, fmt.Errorf("xdsapi.BootstrapConfig.Server %q: want the xDS server's host:port, e.g. %s", c.Server, DefaultAddr))
		}
	}
	if (c.CertFile == "") != (c.KeyFile == "") {
		errs = append(errs, errors.New("xdsapi.BootstrapConfig.CertFile and xdsapi.BootstrapConfig.KeyFile go together: give both for mutual TLS, or neither"))
	}
	if c.CertFile != "" && c.CACertFile == "" {
		errs = append(errs, errors.New("xdsapi.BootstrapConfig.CertFile needs xdsapi.BootstrapConfig.CACertFile: a client certificate is sent over TLS, which verifies the server against xdsapi.BootstrapConfig.CACertFile"))
	}
	return errors.Join(errs...)
}

// Bootstrap returns the GRPC_XDS_BOOTSTRAP document (JSON, gRFC A27) that
// points a proxyless gRPC client at Beacon's xDS server.
func Bootstrap(c BootstrapConfig) ([]byte, error) {
	if err := c.Validate(); err != nil {
		return nil, err
	}
	if c.Server == "" {
		c.Server = DefaultAddr
	}
	if c.NodeID == "" {
		c.NodeID = "beacon-xds-client"
	}
	type creds struct {
		Type   string            `json:"type"`
		Config map[string]string `json:"config,omitempty"`
	}
	channel := creds{Type: "insecure"}
	if c.CACertFile != "" {
		channel = creds{Type: "tls", Config: map[string]string{"ca_certificate_file": c.CACertFile}}
		if c.CertFile != "" {
			channel.Config["certificate_file"] = c.CertFile
			channel.Config["private_key_file"] = c.KeyFile
		}
	}
	doc := map[string]any{
		"xds_servers": []any{map[string]any{
			"server_uri":      c.Server,
			"channel_creds":   []creds{channel},
			"server_features": []string{"xds_v3"},
		}},
		"node": map[string]any{
			"id":      c.NodeID,
			"cluster": c.Cluster,
			// grpc-js-xds refuses a node without a locality.
			"locality": map[string]string{"region": c.Region, "zone": c.Zone, "sub_zone": c.SubZone},
		},
	}
	b, err := json.MarshalIndent(doc, "", "  ")
	if err != nil {
		return nil, err
	}
	return append(b, '\n'), nil
}
