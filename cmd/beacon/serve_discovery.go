package main

import (
	"strconv"

	"github.com/beaconplane/beacon/bootstrap"
	"github.com/beaconplane/beacon/server"
	"github.com/spf13/cobra"
)

// addDiscoveryFlags registers etcd's --discovery-* flags on `beacon serve`:
// a new member joins its cluster through a v3 discovery token (see `beacon
// token`).
func addDiscoveryFlags(cmd *cobra.Command, d *server.DiscoveryConfig) {
	f := cmd.Flags()
	f.StringVar(&d.Token, "discovery-token", "", "v3 discovery: token of the cluster to bootstrap (from beacon token new); the registry gives the initial cluster")
	f.StringSliceVar(&d.Endpoints, "discovery-endpoints", nil, "v3 discovery: client URLs of the discovery registry (an etcd, e.g. another beacon serve)")
	f.DurationVar(&d.DialTimeout, "discovery-dial-timeout", bootstrap.DefaultDialTimeout, "v3 discovery: dial timeout")
	f.DurationVar(&d.RequestTimeout, "discovery-request-timeout", bootstrap.DefaultRequestTimeout, "v3 discovery: timeout of each request (not of the wait for peers)")
	f.DurationVar(&d.KeepAliveTime, "discovery-keepalive-time", bootstrap.DefaultKeepAliveTime, "v3 discovery: keep-alive time")
	f.DurationVar(&d.KeepAliveTimeout, "discovery-keepalive-timeout", bootstrap.DefaultKeepAliveTimeout, "v3 discovery: keep-alive timeout")
	f.Var(insecureFlag{&d.SecureTransport}, "discovery-insecure-transport", "v3 discovery: no TLS to registry endpoints without a scheme (https:// endpoints always use TLS)")
	f.Lookup("discovery-insecure-transport").NoOptDefVal = "true"
	f.BoolVar(&d.InsecureSkipTLSVerify, "discovery-insecure-skip-tls-verify", false, "v3 discovery: skip the registry's certificate verification (testing only)")
	f.StringVar(&d.CertFile, "discovery-cert", "", "v3 discovery: client certificate file")
	f.StringVar(&d.KeyFile, "discovery-key", "", "v3 discovery: client key file")
	f.StringVar(&d.CACertFile, "discovery-cacert", "", "v3 discovery: CA bundle to verify the registry")
	f.StringVar(&d.User, "discovery-user", "", "v3 discovery: user name, or user:password")
	f.StringVar(&d.Password, "discovery-password", "", "v3 discovery: password")
	f.StringVar(&d.Fallback, "discovery-fallback", server.FallbackExit, "when the token's cluster is already full: exit, or proxy (serve a readwrite proxy of that cluster on the client URL)")
	f.DurationVar(&d.Timeout, "discovery-timeout", 0, "give up waiting for the other members after this long (0, the default: wait until interrupted, as etcd)")
	allowZero(cmd, "discovery-timeout", "wait until interrupted")
}

// insecureFlag is etcd's --discovery-insecure-transport (default true),
// stored as its negation, DiscoveryConfig.SecureTransport.
type insecureFlag struct{ secure *bool }

func (f insecureFlag) String() string {
	if f.secure == nil {
		return "true"
	}
	return strconv.FormatBool(!*f.secure)
}

func (f insecureFlag) Set(s string) error {
	v, err := strconv.ParseBool(s)
	if err != nil {
		return err
	}
	*f.secure = !v
	return nil
}

func (insecureFlag) Type() string     { return "bool" }
func (insecureFlag) IsBoolFlag() bool { return true }
