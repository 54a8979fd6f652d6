// Package backendtest gives the tests of the registry's consumers (DNS,
// xDS, ...) every store backend, each a real server (embedded etcd,
// in-process NATS with JetStream, a file store directory, the memory
// store), so that a consumer is tested over each as it runs in production.
package backendtest

import (
	"context"
	"testing"
	"time"

	"github.com/beaconplane/beacon/internal/testkit/etcdtest"
	"github.com/beaconplane/beacon/internal/testkit/natstest"
	"github.com/beaconplane/beacon/registry"
	"github.com/beaconplane/beacon/store"
	"github.com/beaconplane/beacon/store/etcd"
	"github.com/beaconplane/beacon/store/file"
	"github.com/beaconplane/beacon/store/memory"
	bnats "github.com/beaconplane/beacon/store/nats"
)

// Opener opens a new client of a backend's data: each call is another
// process's store.
type Opener func(ctx context.Context) (store.Store, error)

// Kind is one store backend.
type Kind struct {
	Name string
	// Start starts the backend's server (if it has one) for the test and
	// returns how to open clients of it.
	Start func(t testing.TB) Opener
}

// Kinds are the store backends, each started per test.
var Kinds = []Kind{
	{"memory", func(t testing.TB) Opener {
		mem := memory.New(memory.Config{})
		t.Cleanup(func() { _ = mem.Close() })
		// One store, shared: the memory backend lives in one process
		// (closing it is idempotent; the test's end closes it).
		return func(context.Context) (store.Store, error) { return mem, nil }
	}},
	{"etcd", func(t testing.TB) Opener {
		e := etcdtest.Start(t, etcdtest.Options{})
		return func(ctx context.Context) (store.Store, error) {
			return etcd.Open(ctx, etcd.Config{Endpoints: e.Endpoints()})
		}
	}},
	{"file", func(t testing.TB) Opener {
		dir := t.TempDir()
		return func(ctx context.Context) (store.Store, error) { return file.Open(ctx, file.Config{Dir: dir}) }
	}},
	{"nats", func(t testing.TB) Opener {
		srv := natstest.Start(t, natstest.Options{})
		return func(ctx context.Context) (store.Store, error) {
			return bnats.Open(ctx, bnats.Config{URL: srv.ClientURL()})
		}
	}},
}

// Registry opens a store with open and a registry over it (leases of
// registry.MinLeaseTTL, so that a test's removals are quick), both closed
// with the test.
func Registry(t testing.TB, open Opener) registry.Registry {
	t.Helper()
	ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
	defer cancel()
	st, err := open(ctx)
	if err != nil {
		t.Fatal(err)
	}
	r, err := registry.New(st, registry.Config{LeaseTTL: registry.MinLeaseTTL})
	if err != nil {
		_ = st.Close()
		t.Fatal(err)
	}
	t.Cleanup(func() {
		_ = r.Close()
		_ = st.Close()
	})
	return r
}
