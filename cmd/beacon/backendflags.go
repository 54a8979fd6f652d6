package main

import (
	"os"

	"github.com/beaconplane/beacon/backend"
	etcdstore "github.com/beaconplane/beacon/store/etcd"
	"github.com/spf13/cobra"
	"github.com/spf13/pflag"
)

// backendFlags are serve's flags that reach the external etcd it may front,
// with the "etcd-" prefix (--etcd-user, --etcd-cacert...). The client
// commands have etcdctl's unprefixed flags instead (conn.go).
type backendFlags struct {
	prefix   string
	backend  string
	user     string
	password string
	cacert   string
	cert     string
	key      string

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
	cfg.Etcd.Username, cfg.Etcd.Password = b.user, b.password
	cfg.Etcd.CA, cfg.Etcd.ClientCert, cfg.Etcd.ClientKey = b.cacert, b.cert, b.key
	cfg.DriverEnv = b.kubeEnv()
	return cfg
}

// checkTLSFiles checks the TLS files for the external etcd (conn.go),
// naming the flag or the variable each came from.
func (b *backendFlags) checkTLSFiles(f *pflag.FlagSet) error {
	return checkTLSFiles(lookup(f, b.prefix+"cacert", etcdstore.EnvCA), lookup(f, b.prefix+"cert", etcdstore.EnvClientCert),
		lookup(f, b.prefix+"key", etcdstore.EnvClientKey))
}

// backendSetting returns the backend the user chose: --backend, else
// BEACON_DISCOVERY_BACKEND, else Dynamo's DYN_DISCOVERY_BACKEND (as the
// Beacon backend of that kind, see backend.DynamoName), else etcd. A
// DYN_DISCOVERY_BACKEND value Dynamo does not accept either is bad usage.
func backendSetting(f *pflag.FlagSet) (setting, error) {
	be := lookup(f, "backend", backend.EnvVar)
	if be.env != "" || f.Changed("backend") {
		return be, nil
	}
	env := backend.FromEnv()
	if err := env.SelectorError(); err != nil {
		return be, usage(err)
	}
	if os.Getenv(backend.DynamoEnvVar) != "" {
		be = setting{flag: "backend", env: backend.DynamoEnvVar, val: env.BackendName()}
	}
	return be, nil
}
