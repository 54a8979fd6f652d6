package etcd_test

import (
	"context"
	"fmt"
	"os"
	"testing"
	"time"

	"github.com/beaconplane/beacon/internal/testkit/etcdtest"
	"github.com/beaconplane/beacon/store"
	"github.com/beaconplane/beacon/store/etcd"
	"go.uber.org/goleak"
)

// server is the etcd every test shares unless it needs its own (TLS,
// authentication, stop and restart). Tests use disjoint key prefixes.
var server *etcdtest.Server

func TestMain(m *testing.M) {
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
		// With the server stopped, no goroutine of ours or of etcd's may
		// remain.
		if err := goleak.Find(); err != nil {
			fmt.Fprintln(os.Stderr, "goleak: goroutines left after the tests:", err)
			return 1
		}
	}
	return code
}

// newStore connects a new Store to srv (the shared server if nil) and
// closes it when the test ends.
func newStore(tb testing.TB, srv *etcdtest.Server, cfg etcd.Config) *etcd.Store {
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

func factory(srv *etcdtest.Server, cfg etcd.Config) func(testing.TB) store.Store {
	return func(tb testing.TB) store.Store { return newStore(tb, srv, cfg) }
}
