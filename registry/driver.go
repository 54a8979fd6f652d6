package registry

import (
	"context"
	"errors"
	"fmt"
	"os"
	"slices"
	"sort"
	"sync"
)

// Drivers: registries that do not sit on a store.Store.
//
// Most backends are stores, and a StoreRegistry serves them all. A backend
// that is a registry of its own (the Kubernetes-native registry,
// github.com/beaconplane/beacon/registry/kube) registers itself here under
// its backend name from an init function, as a database/sql driver does.
// A program opts in by importing that package, usually for its side effect
// only:
//
//	import _ "github.com/beaconplane/beacon/registry/kube" // BEACON_DISCOVERY_BACKEND=kubernetes
//
// so that a program that does not import it never links its dependencies
// (client-go). backend.OpenRegistry is the one place that maps a
// backend name (BEACON_DISCOVERY_BACKEND) to a store or to a driver.

// Driver opens a registry of one backend.
type Driver func(ctx context.Context, cfg DriverConfig) (Registry, error)

// DriverConfig is what a Driver is opened with.
type DriverConfig struct {
	// Registry carries the settings that apply to every registry
	// (MaxMetadataSize, DrainGrace, Logger, Metrics). A driver refuses, with
	// an error naming it, a setting it cannot honour (for example a key
	// Root for a registry that has no keys).
	Registry Config
	// Getenv reads the driver's own settings, which it documents as
	// environment variables (KUBECONFIG, POD_NAME, ...). Nil means
	// os.Getenv; programs that also take flags pass a function that
	// answers flags first.
	Getenv func(string) string
}

// Env returns c.Getenv, or os.Getenv when it is nil.
func (c DriverConfig) Env() func(string) string {
	if c.Getenv != nil {
		return c.Getenv
	}
	return os.Getenv
}

// ErrUnknownDriver reports a backend name no linked driver registered.
var ErrUnknownDriver = errors.New("registry: no such registry driver")

var (
	driversMu sync.RWMutex
	drivers   = map[string]Driver{}
)

// RegisterDriver makes a driver available under name. It panics if name is
// empty, d is nil, or name is already registered (two packages claiming one
// backend name is a programming error).
func RegisterDriver(name string, d Driver) {
	driversMu.Lock()
	defer driversMu.Unlock()
	if name == "" || d == nil {
		panic("registry: RegisterDriver with an empty name or a nil driver")
	}
	if _, dup := drivers[name]; dup {
		panic(fmt.Sprintf("registry: RegisterDriver called twice for %q", name))
	}
	drivers[name] = d
}

// HasDriver reports whether a driver is registered under name.
func HasDriver(name string) bool {
	driversMu.RLock()
	defer driversMu.RUnlock()
	_, ok := drivers[name]
	return ok
}

// Drivers returns the names of the registered drivers, sorted.
func Drivers() []string {
	driversMu.RLock()
	defer driversMu.RUnlock()
	out := make([]string, 0, len(drivers))
	for n := range drivers {
		out = append(out, n)
	}
	sort.Strings(out)
	return slices.Clip(out)
}

// OpenDriver opens a registry with the driver registered under name. An
// unregistered name gives an error matching ErrUnknownDriver.
func OpenDriver(ctx context.Context, name string, cfg DriverConfig) (Registry, error) {
	driversMu.RLock()
	d := drivers[name]
	driversMu.RUnlock()
	if d == nil {
		return nil, fmt.Errorf("%w %q (registered: %v)", ErrUnknownDriver, name, Drivers())
	}
	return d(ctx, cfg)
}
