package main

import (
	"github.com/beaconplane/beacon/store/backend"
	"github.com/spf13/cobra"
)

// backendFlags are the flags that choose and reach a store backend. Client
// commands (register, ls, watch, token...) use them without a prefix, like
// etcdctl (--endpoints, --user, --cacert...); serve uses the "etcd-" prefix
// for the external cluster it may front.
type backendFlags struct {
	prefix    string
	backend   string
	endpoints []string
	user      string
	password  string
	cacert    string
	cert      string
	key       string

	kubeconfig     string   // backend_kube.go
	kubeNamespaces []string // backend_kube.go
}

// addBackendFlags registers the flags on cmd. Defaults come from the
// environment (BEACON_DISCOVERY_BACKEND, ETCD_ENDPOINTS, ETCD_AUTH_*);
// flags win.
func addBackendFlags(cmd *cobra.Command, prefix string) *backendFlags {
	env := backend.FromEnv()
	b := &backendFlags{prefix: prefix}
	f := cmd.Flags()
	if prefix == "" {
		f.StringVar(&b.backend, "backend", env.BackendName(), "backend: etcd, memory, file, nats or kubernetes (env "+backend.EnvVar+")")
		f.StringSliceVar(&b.endpoints, "endpoints", env.Etcd.Endpoints, "etcd endpoints (env ETCD_ENDPOINTS)")
	}
	f.StringVar(&b.user, prefix+"user", env.Etcd.Username, "etcd user name (env ETCD_AUTH_USERNAME)")
	f.StringVar(&b.password, prefix+"password", env.Etcd.Password, "etcd password (env ETCD_AUTH_PASSWORD)")
	f.StringVar(&b.cacert, prefix+"cacert", env.Etcd.CA, "CA file to verify etcd's certificate (env ETCD_AUTH_CA)")
	f.StringVar(&b.cert, prefix+"cert", env.Etcd.ClientCert, "client certificate file for etcd (env ETCD_AUTH_CLIENT_CERT)")
	f.StringVar(&b.key, prefix+"key", env.Etcd.ClientKey, "client key file for etcd (env ETCD_AUTH_CLIENT_KEY)")
	return b
}

// config returns the backend configuration the environment and flags
// describe.
func (b *backendFlags) config() backend.Config {
	cfg := backend.FromEnv()
	if b.backend != "" {
		cfg.Name = b.backend
	}
	if len(b.endpoints) > 0 {
		cfg.Etcd.Endpoints = b.endpoints
	}
	cfg.Etcd.Username, cfg.Etcd.Password = b.user, b.password
	cfg.Etcd.CA, cfg.Etcd.ClientCert, cfg.Etcd.ClientKey = b.cacert, b.cert, b.key
	cfg.DriverEnv = b.kubeEnv()
	return cfg
}
