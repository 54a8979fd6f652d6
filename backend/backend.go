package backend

import (
	"cmp"
	"context"
	"errors"
	"fmt"
	"log/slog"
	"os"
	"strings"

	"github.com/beaconplane/beacon/registry"
	"github.com/beaconplane/beacon/store"
	"github.com/beaconplane/beacon/store/etcd"
	"github.com/beaconplane/beacon/store/file"
	"github.com/beaconplane/beacon/store/memory"
	"github.com/beaconplane/beacon/store/nats"
)

// Backend names, as BEACON_DISCOVERY_BACKEND spells them.
const (
	Etcd       = "etcd"
	Memory     = "memory"
	File       = "file"
	NATS       = "nats"
	Kubernetes = "kubernetes"
)

// EnvVar selects the backend.
const EnvVar = "BEACON_DISCOVERY_BACKEND"

// DynamoEnvVar is NVIDIA Dynamo's spelling of the selector, read when
// EnvVar is unset. Every value Dynamo accepts selects Beacon's backend of
// that kind (see DynamoName); any other value is refused by Validate.
const DynamoEnvVar = "DYN_DISCOVERY_BACKEND"

// dynamoNames maps each DYN_DISCOVERY_BACKEND value NVIDIA Dynamo accepts
// (kubernetes, etcd, file, mem; its older releases' kv_store is etcd) to
// Beacon's backend of that kind, in the order errors list them. The
// backends are Beacon's: its key layout (/services/...) and its file
// store's directory format are not Dynamo's (docs/store.md).
var dynamoNames = []struct{ dyn, name string }{
	{"kubernetes", Kubernetes},
	{"etcd", Etcd},
	{"kv_store", Etcd},
	{"file", File},
	{"mem", Memory},
}

// DynamoName returns the Beacon backend a DYN_DISCOVERY_BACKEND value
// selects, and whether Dynamo accepts the value at all.
func DynamoName(v string) (string, bool) {
	for _, d := range dynamoNames {
		if d.dyn == v {
			return d.name, true
		}
	}
	return "", false
}

// dynamoValues lists the accepted DYN_DISCOVERY_BACKEND values for errors.
func dynamoValues() string {
	var all []string
	for _, d := range dynamoNames {
		v := d.dyn
		if d.name != d.dyn {
			v += " (" + d.name + ")"
		}
		all = append(all, v)
	}
	return strings.Join(all[:len(all)-1], ", ") + " or " + all[len(all)-1]
}

// KubernetesImport is the package a program imports to link the
// kubernetes backend (it registers a registry driver).
const KubernetesImport = "github.com/beaconplane/beacon/registry/kube"

// Config selects and configures a backend. The zero value is etcd with its
// own defaults (http://localhost:2379).
type Config struct {
	// Name is the backend: etcd (default), memory, file, nats, or the name
	// of a registry driver (kubernetes).
	Name string
	// Etcd configures the etcd backend.
	Etcd etcd.Config
	// Memory configures the memory backend.
	Memory memory.Config
	// File configures the file backend (BEACON_FILE_DIR, ...).
	File file.Config
	// NATS configures the NATS backend (NATS_URL, ...).
	NATS nats.Config
	// DriverEnv overrides, for registry drivers (kubernetes), the
	// environment variables they read their settings from (KUBECONFIG,
	// BEACON_KUBE_NAMESPACES, ...): programs put their flags here.
	DriverEnv map[string]string

	aliasErr error  // a DYN_DISCOVERY_BACKEND value Beacon does not read
	alias    string // the DYN_DISCOVERY_BACKEND value Name came from, if it did
}

// FromEnv reads BEACON_DISCOVERY_BACKEND and each backend's own variables
// (ETCD_ENDPOINTS and ETCD_AUTH_* for etcd, ...).
func FromEnv() Config {
	fileCfg, _ := file.ConfigFromEnv() // errors are reported by Validate
	natsCfg, _ := nats.ConfigFromEnv()
	c := Config{
		Name: strings.TrimSpace(os.Getenv(EnvVar)),
		Etcd: etcd.ConfigFromEnv(),
		File: fileCfg,
		NATS: natsCfg,
	}
	if dyn := strings.TrimSpace(os.Getenv(DynamoEnvVar)); c.Name == "" && dyn != "" {
		if name, ok := DynamoName(dyn); ok {
			c.Name, c.alias = name, dyn
		} else {
			c.aliasErr = fmt.Errorf("%s=%q: unknown; use %s (or set %s to %s)",
				DynamoEnvVar, dyn, dynamoValues(), EnvVar, names())
		}
	}
	return c
}

// name returns the backend name with its default.
func (c Config) name() string {
	if c.Name == "" {
		return Etcd
	}
	return c.Name
}

// Names lists the backends this program can open: the stores, then the
// linked registry drivers (kubernetes).
func Names() []string {
	all := []string{Etcd, Memory, File, NATS}
	for _, d := range registry.Drivers() {
		if d != Etcd && d != Memory && d != File && d != NATS {
			all = append(all, d)
		}
	}
	return all
}

// names lists the backends for error messages.
func names() string {
	all := Names()
	return strings.Join(all[:len(all)-1], ", ") + " or " + all[len(all)-1]
}

// CheckName reports whether name (empty: etcd) is a backend this program
// can open (a store, or a linked registry driver); the error says what is
// wrong without naming where the name came from, so that callers can (a
// flag or BEACON_DISCOVERY_BACKEND).
func CheckName(name string) error {
	switch n := (Config{Name: name}).name(); n {
	case Etcd, Memory, File, NATS:
		return nil
	default:
		return checkDriver(n, fmt.Errorf("unknown backend %q: use %s", n, names()))
	}
}

// checkDriver checks n, a name that is none of the store backends: nil for
// a registry driver linked into this program, what to import for the
// Kubernetes-native registry when it is not, else unknown.
func checkDriver(n string, unknown error) error {
	if registry.HasDriver(n) {
		return nil
	}
	if n == Kubernetes {
		return fmt.Errorf("backend %q: the Kubernetes-native registry is not linked into this program: "+
			"import _ %q (the beacon command does); or use %s", n, KubernetesImport, names())
	}
	return unknown
}

// Validate checks the name and the chosen backend's configuration (a
// registry driver checks its own settings when it opens).
func (c Config) Validate() error {
	if c.aliasErr != nil && c.Name == "" {
		// Only while the backend is still the variables' choice: a
		// program that sets Name (from its own flag) overrides them.
		return c.aliasErr
	}
	switch n := c.name(); n {
	case Etcd:
		return c.Etcd.Validate()
	case Memory:
		return nil
	case File:
		err := c.File.Validate()
		if dyn, _ := DynamoName(c.alias); err != nil && dyn == File {
			// Dynamo's file store lives elsewhere (DYN_FILE_KV), in a
			// format of its own: Beacon's needs a directory of its own.
			err = fmt.Errorf("%w (%s=%s selects Beacon's file store, whose directory format is not Dynamo's: "+
				"give it a directory of its own in %s, not Dynamo's DYN_FILE_KV)", err, DynamoEnvVar, c.alias, file.EnvDir)
		}
		return err
	case NATS:
		return c.NATS.Validate()
	default:
		return checkDriver(n, fmt.Errorf("backend %q (%s): unknown; use %s", n, EnvVar, names()))
	}
}

// IsRegistry reports whether the backend is a registry of its own (a
// registry driver, such as kubernetes) rather than a store: open it with
// OpenRegistry.
func (c Config) IsRegistry() bool {
	switch c.name() {
	case Etcd, Memory, File, NATS:
		return false
	}
	return registry.HasDriver(c.name())
}

// ErrNotAStore reports a backend that is a registry, not a store.
var ErrNotAStore = errors.New("backend: not a store")

// WithLogger returns c with log as the logger of each store's
// configuration that has none (etcd, file, NATS): their warnings (a file
// store's directory replaced under the process, a long wait for its lock;
// NATS connection events) go where the caller's go.
func (c Config) WithLogger(log *slog.Logger) Config {
	c.Etcd.Logger = cmp.Or(c.Etcd.Logger, log)
	c.File.Logger = cmp.Or(c.File.Logger, log)
	c.NATS.Logger = cmp.Or(c.NATS.Logger, log)
	return c
}

// Open validates c and opens the store. For remote backends it checks that
// the backend is reachable, failing with a clear error after the backend's
// dial timeout. A registry backend (kubernetes) has no store: it gives an
// error matching ErrNotAStore (use OpenRegistry).
func Open(ctx context.Context, c Config) (store.Store, error) {
	if err := c.Validate(); err != nil {
		return nil, err
	}
	if c.IsRegistry() {
		return nil, fmt.Errorf("%w: backend %q keeps no key/value store (it is a registry of its own): "+
			"it serves registration and discovery, not the store, bootstrap and proxy features", ErrNotAStore, c.name())
	}
	switch c.name() {
	case Memory:
		// A process's memory store is a history of its own: one that
		// starts at 1 again after a restart told clients resuming from
		// the previous life's revisions the wrong changes.
		mc := c.Memory
		if mc.FirstRevision <= 0 {
			mc.FirstRevision = memory.FirstRevisionNow()
		}
		return memory.New(mc), nil
	case File:
		return file.Open(ctx, c.File)
	case NATS:
		return nats.Open(ctx, c.NATS)
	default:
		return etcd.Open(ctx, c.Etcd)
	}
}

// BackendName returns the backend c selects (etcd when unset).
func (c Config) BackendName() string { return c.name() }

// SelectorError reports a selector variable FromEnv could not use (a
// DYN_DISCOVERY_BACKEND value Dynamo does not accept either), naming it;
// Validate reports it too while Name is empty. Programs with a flag that
// overrides the variables check it only when the flag is not given.
func (c Config) SelectorError() error { return c.aliasErr }

// OpenRegistry opens the registry of the backend c selects: the registry
// driver of that name (kubernetes), or a registry.StoreRegistry over the
// store Open opens. Closing the returned registry closes the store too; a
// store registry keeps its optional capabilities (registry.LeasedRegistrar,
// registry.SessionReporter, Lease...). rc configures the registry; a driver
// refuses settings it cannot honour (a key root on Kubernetes).
func OpenRegistry(ctx context.Context, c Config, rc registry.Config) (registry.Registry, error) {
	if err := c.Validate(); err != nil {
		return nil, err
	}
	if c.IsRegistry() {
		env := c.DriverEnv
		return registry.OpenDriver(ctx, c.name(), registry.DriverConfig{
			Registry: rc,
			Getenv: func(k string) string {
				if v, ok := env[k]; ok {
					return v
				}
				return os.Getenv(k)
			},
		})
	}
	st, err := Open(ctx, c)
	if err != nil {
		return nil, err
	}
	r, err := registry.New(st, rc)
	if err != nil {
		_ = st.Close()
		return nil, err
	}
	return &StoreRegistry{StoreRegistry: r, st: st}, nil
}

// StoreRegistry is a registry.StoreRegistry over a store that
// OpenRegistry opened: Close closes both.
type StoreRegistry struct {
	*registry.StoreRegistry
	st store.Store
}

// Store returns the store under the registry.
func (r *StoreRegistry) Store() store.Store { return r.st }

// Close closes the registry (revoking its lease), then the store.
func (r *StoreRegistry) Close() error {
	return errors.Join(r.StoreRegistry.Close(), r.st.Close())
}
