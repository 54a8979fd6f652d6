package registry_test

import (
	"context"
	"testing"
	"time"

	"github.com/beaconplane/beacon/internal/testkit/natstest"
	"github.com/beaconplane/beacon/store"
	"github.com/beaconplane/beacon/store/file"
	bnats "github.com/beaconplane/beacon/store/nats"

	"github.com/beaconplane/beacon/registry"
	"github.com/beaconplane/beacon/registry/registrytest"
	"github.com/beaconplane/beacon/store/etcd"
)

// TestConformance runs the Registry conformance suite over every store
// backend in this module: memory (one store shared by the simulated
// processes), etcd and NATS (one client per process, on one server), file
// (one Store per process on one directory, as processes on one host). The
// health checks' checker is one more such process.
func TestConformance(t *testing.T) {
	run := func(t *testing.T, ttl time.Duration, newStore func(tb testing.TB) store.Store) {
		registrytest.Run(t, func(tb testing.TB) registry.Registry {
			r, err := registry.New(newStore(tb), registry.Config{LeaseTTL: ttl})
			if err != nil {
				tb.Fatal(err)
			}
			return r
		}, registrytest.Options{Store: newStore})
	}
	t.Run("memory", func(t *testing.T) {
		st := newMemoryStore(t)
		run(t, registry.MinLeaseTTL, func(testing.TB) store.Store { return st })
	})
	t.Run("etcd", func(t *testing.T) {
		run(t, etcdTTL, func(tb testing.TB) store.Store { return newEtcdStore(tb, nil, etcd.Config{}) })
	})
	t.Run("file", func(t *testing.T) {
		dir := t.TempDir()
		run(t, registry.MinLeaseTTL, func(tb testing.TB) store.Store {
			ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
			defer cancel()
			st, err := file.Open(ctx, file.Config{Dir: dir})
			if err != nil {
				tb.Fatal(err)
			}
			tb.Cleanup(func() { _ = st.Close() })
			return st
		})
	})
	t.Run("nats", func(t *testing.T) {
		srv := natstest.Start(t, natstest.Options{})
		run(t, registry.MinLeaseTTL, func(tb testing.TB) store.Store {
			return natstest.Open(tb, bnats.Config{URL: srv.ClientURL()})
		})
	})
}
