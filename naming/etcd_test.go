package naming_test

import (
	"log/slog"
	"strings"
	"testing"
	"time"

	"github.com/beaconplane/beacon"
	"github.com/beaconplane/beacon/internal/lab/netcut"
	"github.com/beaconplane/beacon/naming"
	"github.com/beaconplane/beacon/naming/namingtest"
	"github.com/beaconplane/beacon/registry"
	"github.com/beaconplane/beacon/store/etcd"
	"github.com/prometheus/client_golang/prometheus"
)

// Over a real etcd: each backend is its own "process" (its own etcd client
// and registry, so its own lease), the client another.
func TestOverEtcdLeaseRevokeMovesTraffic(t *testing.T) {
	ctx := testContext(t)
	q := beacon.Query{Namespace: "etcd-rr", Component: "api", Endpoint: "grpc"}
	b1, b2 := namingtest.Start(t, "b1"), namingtest.Start(t, "b2")
	r1 := newRegistry(t, newEtcdStore(t, nil), registry.Config{})
	r2 := newRegistry(t, newEtcdStore(t, nil), registry.Config{})
	register(t, r1, q, b1.Addr(), map[string]string{"zone": "a"})
	register(t, r2, q, b2.Addr(), map[string]string{"zone": "b"})

	client := newRegistry(t, newEtcdStore(t, nil), registry.Config{})
	cc := dial(t, memBuilder(t, client), naming.Target(q), "round_robin")
	untilAll(ctx, t, cc, "b1", "b2")

	// b1's process ends: closing its registry revokes its lease.
	if err := r1.Close(); err != nil {
		t.Fatal(err)
	}
	untilOnly(ctx, t, cc, 20, "b2")
}

// While etcd is unreachable the resolver reports the stale view to gRPC
// (calls keep going to the known backends), and when etcd answers again it
// pushes the full state and follows new instances.
func TestStaleWhileEtcdUnreachableThenRecovers(t *testing.T) {
	ctx := testContext(t)
	q := beacon.Query{Namespace: "etcd-down", Component: "api", Endpoint: "grpc"}
	b1, b2, b3 := namingtest.Start(t, "b1"), namingtest.Start(t, "b2"), namingtest.Start(t, "b3")
	backends := newRegistry(t, newEtcdStore(t, nil), registry.Config{})
	register(t, backends, q, b1.Addr(), nil)
	register(t, backends, q, b2.Addr(), nil)

	// The client reaches etcd through a connection we can cut; its
	// registry probes the store every second (a third of a 3 s TTL).
	cut, err := netcut.Start(strings.TrimPrefix(server.Endpoint(), "http://"))
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { _ = cut.Close() })
	st, err := etcd.Open(ctx, etcd.Config{Endpoints: []string{cut.Addr()}, RequestTimeout: time.Second})
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { _ = st.Close() })
	client := newRegistry(t, st, registry.Config{LeaseTTL: 3 * time.Second})
	logs := newLogRecorder()
	metrics := prometheus.NewRegistry()
	b := memBuilder(t, client, naming.WithLogger(slog.New(logs)), naming.WithMetrics(metrics))
	cc := dial(t, b, naming.Target(q), "round_robin")
	untilAll(ctx, t, cc, "b1", "b2")

	cut.Cut()
	i := logs.wait(t, 0, "registry watch is stale")
	if got := counter(t, metrics, "beacon_naming_resolver_errors_total", "stale"); got < 1 {
		t.Errorf("stale errors counted: %v", got)
	}
	// The channel keeps the last known backends, and misses b3 for now.
	register(t, backends, q, b3.Addr(), nil)
	untilAll(ctx, t, cc, "b1", "b2")

	cut.Restore()
	logs.wait(t, i, "resolver state pushed")
	untilAll(ctx, t, cc, "b1", "b2", "b3")
}
