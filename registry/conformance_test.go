package registry_test

import (
	"testing"

	"github.com/beaconplane/beacon/registry"
	"github.com/beaconplane/beacon/registry/registrytest"
	"github.com/beaconplane/beacon/store/etcd"
)

// TestConformance runs the Registry conformance suite over every store
// backend in this module: memory (one store shared by the simulated
// processes) and etcd (one client per process, on the shared server).
func TestConformance(t *testing.T) {
	t.Run("memory", func(t *testing.T) {
		st := newMemoryStore(t)
		registrytest.Run(t, func(tb testing.TB) registry.Registry {
			r, err := registry.New(st, registry.Config{LeaseTTL: registry.MinLeaseTTL})
			if err != nil {
				tb.Fatal(err)
			}
			return r
		}, registrytest.Options{})
	})
	t.Run("etcd", func(t *testing.T) {
		registrytest.Run(t, func(tb testing.TB) registry.Registry {
			r, err := registry.New(newEtcdStore(tb, nil, etcd.Config{}), registry.Config{LeaseTTL: etcdTTL})
			if err != nil {
				tb.Fatal(err)
			}
			return r
		}, registrytest.Options{})
	})
}
