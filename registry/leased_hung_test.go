package registry_test

import (
	"context"
	"errors"
	"fmt"
	"testing"
	"time"

	"github.com/beaconplane/beacon"
	"github.com/beaconplane/beacon/internal/testkit/etcdtest"
	"github.com/beaconplane/beacon/registry"
	"github.com/beaconplane/beacon/store/etcd"
)

// TestHeartbeatPastAHungMember: the HTTP API's registrations (a lease of
// their own, renewed by the client's heartbeats through the server) keep
// their lease while one etcd member of three hangs (SIGSTOP: it accepts
// connections and answers nothing). Each heartbeat here is given TTL/3, as
// a client that heartbeats every TTL/3 and gives up on a slow answer does
// — its disconnect cancels the request, which is not a store timeout, so
// nothing made the store probe its members: every heartbeat whose calls
// reached the hung member waited on it until the client gave up, the
// lease ran out, and 18 of 20 registrations through a beacon serve
// fronting the cluster were deleted while two members were healthy.
func TestHeartbeatPastAHungMember(t *testing.T) {
	t.Parallel()
	if testing.Short() {
		t.Skip("runs a 3-member cluster of etcd processes")
	}
	c := etcdtest.StartProcessCluster(t, 3, etcdtest.ProcessClusterOptions{})
	ctx := within(t, 2*time.Minute)
	leader, err := c.WaitLeader(ctx)
	if err != nil {
		t.Fatal(err)
	}
	// Production settings: the store's RequestTimeout (5 s) is longer
	// than the lease.
	st := newEtcdStore(t, nil, etcd.Config{Endpoints: c.Endpoints()})
	r := newRegistry(t, st, registry.Config{})
	const ttl = 3 * time.Second
	const n = 5
	var owned []registry.Owned
	for i := range n {
		o, err := r.RegisterWithTTL(ctx, beacon.Instance{Namespace: uniqueNS(), Component: "api", Endpoint: "http",
			Address: "10.0.0.1:80" + string(rune('0'+i))}, ttl)
		if err != nil {
			t.Fatal(err)
		}
		owned = append(owned, o)
	}
	for _, m := range c.Members() {
		if m != leader {
			if err := m.Pause(); err != nil {
				t.Fatal(err)
			}
			t.Cleanup(func() { _ = m.Resume() })
			t.Logf("member %s hangs (SIGSTOP)", m.Name)
			break
		}
	}
	heartbeatThrough(t, ctx, r, owned, ttl)
	for _, o := range owned {
		if _, err := st.Get(ctx, "/services/"+o.Instance.Ref().String()); err != nil {
			t.Errorf("%s: %v", o.Instance.Ref(), err)
		}
	}
}

// heartbeatThrough heartbeats every registration as an HTTP client would:
// every TTL/3 for 3 TTLs, each heartbeat given TTL/3 before the client
// disconnects, tried again at once after a failure. It fails the test if
// a lease is lost.
func heartbeatThrough(t *testing.T, ctx context.Context, r *registry.StoreRegistry, owned []registry.Owned, ttl time.Duration) {
	t.Helper()
	type outcome struct {
		ok, failed int
		slowest    time.Duration
		lost       error
		first      error // the first failure
	}
	results := make(chan outcome, len(owned))
	for _, o := range owned {
		go func() {
			var out outcome
			defer func() { results <- out }()
			until := time.Now().Add(3 * ttl)
			for time.Now().Before(until) {
				next := time.NewTimer(ttl / 3)
				hctx, cancel := context.WithCancel(ctx)
				stop := time.AfterFunc(ttl/3, cancel) // the client disconnects
				start := time.Now()
				_, err := r.Heartbeat(hctx, o.Instance.Ref(), o.Secret)
				out.slowest = max(out.slowest, time.Since(start))
				stop.Stop()
				cancel()
				switch {
				case errors.Is(err, beacon.ErrNotFound):
					out.lost = err
					next.Stop()
					return
				case err != nil:
					out.failed++
					if out.first == nil {
						out.first = err
					}
					next.Stop()
					continue // at once
				}
				out.ok++
				select {
				case <-next.C:
				case <-ctx.Done():
					return
				}
			}
		}()
	}
	for range owned {
		out := <-results
		if out.lost != nil {
			t.Errorf("lease lost while two of three members were healthy: %v", out.lost)
		}
		t.Logf("%d heartbeats answered, %d failed; slowest %v", out.ok, out.failed, out.slowest.Round(time.Millisecond))
		if out.first != nil {
			t.Logf("the first failure: %v", out.first)
		}
	}
}

// TestHeartbeatPastASlowLeader: the same, with the leader's disk slow
// (every WAL sync waits 500 ms) under a steady write load. Linearizable
// reads then wait for the leader on every member (over a second), and the
// heartbeats, whose proof of ownership was read that way, timed out until
// 10 of 16 leases of 3 s expired (the lease drills). The proof is read
// locally now (a serializable read), and only the keep-alive goes to the
// leader.
func TestHeartbeatPastASlowLeader(t *testing.T) {
	t.Parallel()
	if testing.Short() {
		t.Skip("runs a 3-member cluster of etcd processes")
	}
	c := etcdtest.StartProcessCluster(t, 3, etcdtest.ProcessClusterOptions{SlowDisk: true})
	ctx := within(t, 2*time.Minute)
	leader, err := c.WaitLeader(ctx)
	if err != nil {
		t.Fatal(err)
	}
	st := newEtcdStore(t, nil, etcd.Config{Endpoints: c.Endpoints()})
	r := newRegistry(t, st, registry.Config{})
	const ttl = 3 * time.Second
	var owned []registry.Owned
	for i := range 8 {
		o, err := r.RegisterWithTTL(ctx, beacon.Instance{Namespace: uniqueNS(), Component: "api", Endpoint: "http",
			Address: fmt.Sprintf("10.0.0.%d:80", i+1)}, ttl)
		if err != nil {
			t.Fatal(err)
		}
		owned = append(owned, o)
	}
	// A steady write load: every write waits for the leader's slow sync.
	writer := newEtcdStore(t, nil, etcd.Config{Endpoints: c.Endpoints()})
	wctx, stopWrites := context.WithCancel(ctx)
	defer stopWrites()
	go func() {
		for wctx.Err() == nil {
			_, _ = writer.Put(wctx, "/slow-leader/load", []byte("x"))
		}
	}()
	if err := leader.SetFsyncDelay(500 * time.Millisecond); err != nil {
		t.Fatal(err)
	}
	defer func() { _ = leader.SetFsyncDelay(0) }()
	t.Logf("leader %s has a slow disk (500 ms per WAL sync)", leader.Name)
	heartbeatThrough(t, ctx, r, owned, ttl)
}
