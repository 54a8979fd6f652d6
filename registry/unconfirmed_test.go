package registry_test

import (
	"errors"
	"net/url"
	"testing"
	"time"

	"github.com/beaconplane/beacon/internal/testkit/etcdtest"
	"github.com/beaconplane/beacon/registry"
	"github.com/beaconplane/beacon/store"
	"github.com/beaconplane/beacon/store/etcd"
	"github.com/prometheus/client_golang/prometheus"
	"github.com/prometheus/client_golang/prometheus/testutil"
)

// A session declares its lease lost only when the store says it ended:
// its own clock running out (no keep-alive answered for a TTL) makes the
// lease unconfirmed, and it keeps renewing it.

// TestSessionLeaseKeptByRestartedEtcd: the only etcd member is killed for
// 2 × TTL and restarted; a restarted member extends every lease as it
// becomes leader, so etcd kept the session's lease. The session reports it
// unconfirmed during the outage, never lost, and confirmed once etcd
// renews it: the same lease, nothing re-registered. (It used to report it
// lost by its own clock after a TTL and re-register everything under a new
// lease, for nothing: "kept" in the drills.)
func TestSessionLeaseKeptByRestartedEtcd(t *testing.T) {
	t.Parallel()
	if testing.Short() {
		t.Skip("runs an etcd process")
	}
	c := etcdtest.StartProcessCluster(t, 1, etcdtest.ProcessClusterOptions{})
	st := newEtcdStore(t, nil, etcd.Config{Endpoints: c.Endpoints(), Configure: fastReconnect})
	metrics := prometheus.NewPedanticRegistry()
	r := newRegistry(t, st, registry.Config{LeaseTTL: etcdTTL, Metrics: metrics})
	ctx := within(t, time.Minute)
	if _, err := r.Register(ctx, inst(uniqueNS(), "10.0.0.1:80")); err != nil {
		t.Fatal(err)
	}
	waitState(t, r, 5*time.Second, registry.StateActive)
	held := r.Lease()
	m := c.Members()[0]
	if err := m.Kill(); err != nil {
		t.Fatal(err)
	}
	// Unconfirmed, not lost, while etcd is away.
	for unconfirmed := false; !unconfirmed; {
		c := waitState(t, r, 3*etcdTTL, registry.StateActive, registry.StateLost)
		if c.State == registry.StateLost {
			t.Fatalf("lease reported lost while etcd was away: %v", c.Err)
		}
		unconfirmed = errors.Is(c.Err, registry.ErrLeaseUnconfirmed)
	}
	if got := testutil.ToFloat64(collector(t, metrics, "beacon_registry_lease_unconfirmed")); got != 1 {
		t.Fatalf("beacon_registry_lease_unconfirmed %v while unconfirmed", got)
	}
	if err := m.Restart(); err != nil {
		t.Fatal(err)
	}
	c2 := waitState(t, r, 30*time.Second, registry.StateActive, registry.StateLost)
	if c2.State != registry.StateActive || c2.Err != nil || c2.Lease != held || c2.Registered != 1 {
		t.Fatalf("after etcd's return: %+v, want active, no error, lease %x, 1 registered", c2, held)
	}
	if got := testutil.ToFloat64(collector(t, metrics, "beacon_registry_lease_unconfirmed")); got != 0 {
		t.Fatalf("beacon_registry_lease_unconfirmed %v once confirmed", got)
	}
	if got := testutil.ToFloat64(collector(t, metrics, "beacon_registry_lease_losses_total")); got != 0 {
		t.Fatalf("beacon_registry_lease_losses_total %v", got)
	}
}

// TestSessionLostOnlyWhenEtcdSaysSo: the session's connection to a healthy
// etcd is cut for 2 × TTL, so etcd expires the lease. The session cannot
// know: it reports the lease unconfirmed, never lost, while cut off; once
// the connection is back, etcd answers that the lease ended, and only then
// is it lost — and recovered under a new lease, every instance with its ID.
func TestSessionLostOnlyWhenEtcdSaysSo(t *testing.T) {
	t.Parallel()
	u, err := url.Parse(server.Endpoint())
	if err != nil {
		t.Fatal(err)
	}
	proxy := startProxy(t, u.Host)
	st := newEtcdStore(t, nil, etcd.Config{Endpoints: []string{proxy.Endpoint()}, RequestTimeout: 500 * time.Millisecond, Configure: fastReconnect})
	r := newRegistry(t, st, registry.Config{LeaseTTL: etcdTTL})
	ctx := within(t, time.Minute)
	reg, err := r.Register(ctx, inst(uniqueNS(), "10.0.0.1:80"))
	if err != nil {
		t.Fatal(err)
	}
	waitState(t, r, 5*time.Second, registry.StateActive)
	held := r.Lease()
	proxy.Cut()
	for unconfirmed := false; !unconfirmed; {
		c := waitState(t, r, 3*etcdTTL, registry.StateActive, registry.StateLost)
		if c.State == registry.StateLost {
			t.Fatalf("lease reported lost while etcd could not be asked: %v", c.Err)
		}
		unconfirmed = errors.Is(c.Err, registry.ErrLeaseUnconfirmed)
	}
	// Stay cut off until etcd has expired the lease (its instance is
	// deleted with it; a keep-alive here would renew it), watching that
	// nothing is reported lost.
	direct := newEtcdStore(t, nil, etcd.Config{})
	key := "/services/" + reg.Instance().Ref().String()
	kvs, rev, err := direct.List(ctx, key)
	if err != nil {
		t.Fatal(err)
	}
	w := direct.Watch(ctx, key, rev+1)
	for expired := len(kvs) == 0; !expired; {
		select {
		case resp := <-w:
			if resp.Err != nil {
				t.Fatal(resp.Err)
			}
			for _, e := range resp.Events {
				expired = expired || e.Type == store.EventDelete
			}
		case c := <-r.States():
			if c.State == registry.StateLost {
				t.Fatalf("lease reported lost while etcd could not be asked: %v", c.Err)
			}
		case <-time.After(3 * etcdTTL):
			t.Fatalf("etcd did not expire lease %x within %v of the cut", held, 3*etcdTTL)
		}
	}
	if got := r.State(); got != registry.StateActive {
		t.Fatalf("state %v while cut off, want active (unconfirmed)", got)
	}
	proxy.Restore()
	lost := waitState(t, r, 10*time.Second, registry.StateLost)
	if !errors.Is(lost.Err, store.ErrLeaseNotFound) {
		t.Fatalf("lost without etcd saying the lease ended: %v", lost.Err)
	}
	rec := waitState(t, r, 10*time.Second, registry.StateRecovered)
	if rec.Lease == held || rec.Registered != 1 || reg.Err() != nil {
		t.Fatalf("recovered %+v (registration error %v), want a new lease and 1 registered", rec, reg.Err())
	}
}
