package etcdnaming_test

import (
	"context"
	"fmt"
	"net/url"
	"os"
	"testing"
	"time"

	"github.com/beaconplane/beacon/internal/testkit/etcdtest"
	"github.com/beaconplane/beacon/naming/etcdnaming"
	"github.com/beaconplane/beacon/naming/internal/cctest"
	"github.com/beaconplane/beacon/store"
	"github.com/beaconplane/beacon/store/memory"
	"github.com/prometheus/client_golang/prometheus"
	"go.uber.org/goleak"
	"google.golang.org/grpc/resolver"
)

// server is the etcd the tests share. Tests use disjoint targets.
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
		if err := goleak.Find(); err != nil {
			fmt.Fprintln(os.Stderr, "goleak: goroutines left after the tests:", err)
			return 1
		}
	}
	return code
}

const timeout = 20 * time.Second

func testContext(t *testing.T) context.Context {
	ctx, cancel := context.WithTimeout(context.Background(), timeout)
	t.Cleanup(cancel)
	return ctx
}

func memStore(t *testing.T) *memory.Store {
	t.Helper()
	st := memory.New(memory.Config{})
	t.Cleanup(func() { _ = st.Close() })
	return st
}

func newManager(t *testing.T, st store.Store, target string, opts ...etcdnaming.Option) *etcdnaming.Manager {
	t.Helper()
	m, err := etcdnaming.NewManager(st, target, opts...)
	if err != nil {
		t.Fatal(err)
	}
	return m
}

// buildResolver builds a resolver of target over st, recording what it
// tells gRPC.
func buildResolver(t *testing.T, st store.Store, target string, opts ...etcdnaming.Option) *cctest.ClientConn {
	t.Helper()
	b, err := etcdnaming.NewBuilder(st, opts...)
	if err != nil {
		t.Fatal(err)
	}
	u, err := url.Parse(target)
	if err != nil {
		t.Fatal(err)
	}
	cc := cctest.New()
	r, err := b.Build(resolver.Target{URL: *u}, cc, resolver.BuildOptions{})
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(r.Close)
	return cc
}

// counter returns the sum of the counter name's series with label reason.
func counter(t *testing.T, reg *prometheus.Registry, name, reason string) float64 {
	t.Helper()
	mfs, err := reg.Gather()
	if err != nil {
		t.Fatal(err)
	}
	sum := 0.0
	for _, mf := range mfs {
		if mf.GetName() != name {
			continue
		}
		for _, m := range mf.GetMetric() {
			for _, l := range m.GetLabel() {
				if l.GetName() == "reason" && l.GetValue() == reason {
					sum += m.GetCounter().GetValue()
				}
			}
		}
	}
	return sum
}
