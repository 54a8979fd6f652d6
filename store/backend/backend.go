package backend

import (
	"context"
	"fmt"
	"os"
	"strings"

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

// Config selects and configures a backend. The zero value is etcd with its
// own defaults (http://localhost:2379).
type Config struct {
	// Name is the backend: etcd (default), memory, file or nats.
	Name string
	// Etcd configures the etcd backend.
	Etcd etcd.Config
	// Memory configures the memory backend.
	Memory memory.Options
	// File configures the file backend (BEACON_FILE_DIR, ...).
	File file.Config
	// NATS configures the NATS backend (NATS_URL, ...).
	NATS nats.Config
}

// FromEnv reads BEACON_DISCOVERY_BACKEND and each backend's own variables
// (ETCD_ENDPOINTS and ETCD_AUTH_* for etcd, ...).
func FromEnv() Config {
	fileCfg, _ := file.ConfigFromEnv() // errors are reported by Validate
	natsCfg, _ := nats.ConfigFromEnv()
	return Config{
		Name: strings.TrimSpace(os.Getenv(EnvVar)),
		Etcd: etcd.ConfigFromEnv(),
		File: fileCfg,
		NATS: natsCfg,
	}
}

// name returns the backend name with its default.
func (c Config) name() string {
	if c.Name == "" {
		return Etcd
	}
	return c.Name
}

// CheckName reports whether name (empty: etcd) is a backend Open can
// open; the error says what is wrong without naming where the name came
// from, so that callers can (a flag or BEACON_DISCOVERY_BACKEND).
func CheckName(name string) error {
	switch n := (Config{Name: name}).name(); n {
	case Etcd, Memory, File, NATS:
		return nil
	case Kubernetes:
		return fmt.Errorf("backend %q: the Kubernetes-native registry is not part of this build; use etcd, memory, file or nats", n)
	default:
		return fmt.Errorf("unknown backend %q: use etcd, memory, file or nats", n)
	}
}

// Validate checks the name and the chosen backend's configuration.
func (c Config) Validate() error {
	switch n := c.name(); n {
	case Etcd:
		return c.Etcd.Validate()
	case Memory:
		return nil
	case File:
		return c.File.Validate()
	case NATS:
		return c.NATS.Validate()
	case Kubernetes:
		return fmt.Errorf("backend %q: the Kubernetes-native registry is not part of this build; use etcd, memory, file or nats", n)
	default:
		return fmt.Errorf("backend %q (%s): unknown; use etcd, memory, file or nats", n, EnvVar)
	}
}

// Open validates c and opens the store. For remote backends it checks that
// the backend is reachable, failing with a clear error after the backend's
// dial timeout.
func Open(ctx context.Context, c Config) (store.Store, error) {
	if err := c.Validate(); err != nil {
		return nil, err
	}
	switch c.name() {
	case Memory:
		return memory.New(c.Memory), nil
	case File:
		return file.Open(ctx, c.File)
	case NATS:
		return nats.Open(ctx, c.NATS)
	default:
		return etcd.New(ctx, c.Etcd)
	}
}

// BackendName returns the backend c selects (etcd when unset).
func (c Config) BackendName() string { return c.name() }
