package registry_test

import (
	"context"
	"fmt"
	"os"
	"testing"
	"time"

	"github.com/beaconplane/beacon/internal/testkit/etcdtest"
	"github.com/beaconplane/beacon/internal/testkit/natstest"
	"github.com/beaconplane/beacon/registry"
	"github.com/beaconplane/beacon/store"
	"github.com/beaconplane/beacon/store/etcd"
	"github.com/beaconplane/beacon/store/memory"
	"go.uber.org/goleak"
)

// server is the etcd the tests share unless they need their own (stop and
// restart drills). Tests use disjoint namespaces.
var server *etcdtest.Server

func TestMain(m *testing.M) {
	if os.Getenv(childEnv) != "" {
		os.Exit(runChild())
	}
	os.Exit(run(m))
}

func run(m *testing.M) int {
	var err error
	server, err = etcdtest.New(etcdtest.Options{})
	if err != nil {
		fmt.Fprintln(os.Stderr, "start etcd:", err)
		return 1
	}
	code := m.Run()
	server.Close()
	if code == 0 {
		if err := goleak.Find(natstest.LeakOptions()...); err != nil {
			fmt.Fprintln(os.Stderr, "goleak: goroutines left after the tests:", err)
			return 1
		}
	}
	return code
}

// etcdTTL is the shortest lease etcd grants with its default election
// timeout.
const etcdTTL = 2 * time.Second

// newEtcdStore connects a new client (a new "process") to srv, or to the
// shared server if srv is nil, and closes it when the test ends.
func newEtcdStore(tb testing.TB, srv *etcdtest.Server, cfg etcd.Config) *etcd.Store {
	tb.Helper()
	if srv == nil {
		srv = server
	}
	if cfg.Endpoints == nil {
		cfg.Endpoints = srv.Endpoints()
	}
	ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
	defer cancel()
	s, err := etcd.Open(ctx, cfg)
	if err != nil {
		tb.Fatalf("etcd.New: %v", err)
	}
	tb.Cleanup(func() { _ = s.Close() })
	return s
}

func newMemoryStore(tb testing.TB) *memory.Store {
	s := memory.New(memory.Config{})
	tb.Cleanup(func() { _ = s.Close() })
	return s
}

// newRegistry returns a registry over st, closed when the test ends.
func newRegistry(tb testing.TB, st store.Store, cfg registry.Config) *registry.StoreRegistry {
	tb.Helper()
	r, err := registry.New(st, cfg)
	if err != nil {
		tb.Fatalf("registry.New: %v", err)
	}
	tb.Cleanup(func() { _ = r.Close() })
	return r
}

// backend is a store backend the registry tests run against.
type backend struct {
	name string
	ttl  time.Duration
	// store returns a store for one simulated process; processes of one
	// test share the backend.
	store func(tb testing.TB) store.Store
}

// backends returns memory (one store shared by the test's processes) and
// etcd (one client per process).
func backends(t *testing.T) []backend {
	mem := newMemoryStore(t)
	return []backend{
		{name: "memory", ttl: time.Second, store: func(testing.TB) store.Store { return mem }},
		{name: "etcd", ttl: etcdTTL, store: func(tb testing.TB) store.Store { return newEtcdStore(tb, nil, etcd.Config{}) }},
	}
}

// within returns a context for one test step.
func within(tb testing.TB, d time.Duration) context.Context {
	ctx, cancel := context.WithTimeout(context.Background(), d)
	tb.Cleanup(cancel)
	return ctx
}
