package proxy

import (
	"fmt"
	"testing"
	"time"

	"github.com/beaconplane/beacon/internal/etcdtest"
	clientv3 "go.etcd.io/etcd/client/v3"
)

// TestLeaseKeepAliveMultiplexed: keep-alive streams of several clients
// share one upstream stream, and leases kept alive through the proxy
// outlive their TTL.
func TestLeaseKeepAliveMultiplexed(t *testing.T) {
	t.Parallel()
	c := etcdtest.StartCluster(t, 3)
	p := startProxy(t, Config{PeerURLs: c.PeerURLs()})
	ctx := ctxT(t)
	const n = 5
	// etcd's client renews at a third of the TTL: with 5 s, a renewal
	// may take over 3 s end to end (proxy, follower, leader) before a
	// lease expires, which holds under -race on two busy cores; 2 s did
	// not always.
	const leaseTTL = 5
	var ids []clientv3.LeaseID
	var kas []<-chan *clientv3.LeaseKeepAliveResponse
	for range n {
		cli := proxyClient(t, p)
		g, err := cli.Grant(ctx, leaseTTL)
		if err != nil {
			t.Fatal(err)
		}
		if _, err := cli.Put(ctx, fmt.Sprintf("/lease/%x", g.ID), "x", clientv3.WithLease(g.ID)); err != nil {
			t.Fatal(err)
		}
		ka, err := cli.KeepAlive(ctx, g.ID)
		if err != nil {
			t.Fatal(err)
		}
		ids = append(ids, g.ID)
		kas = append(kas, ka)
	}
	for _, ka := range kas {
		if r := <-ka; r == nil || r.TTL <= 0 {
			t.Fatalf("keep-alive response %+v", r)
		}
	}
	if v := value(t, p.m.kaClientStreams); v != n {
		t.Errorf("keepalive_client_streams = %v, want %d", v, n)
	}
	if v := value(t, p.m.kaUpstreams); v != 1 {
		t.Errorf("keepalive_upstream_streams = %v, want 1", v)
	}
	// Past two TTLs the keys are still there.
	deadline := time.After(2*leaseTTL*time.Second + time.Second)
	for done := false; !done; {
		select {
		case <-deadline:
			done = true
		case r := <-kas[0]:
			if r == nil {
				t.Fatal("keep-alive channel closed")
			}
		}
	}
	direct := c.Client(t)
	resp, err := direct.Get(ctx, "/lease/", clientv3.WithPrefix(), clientv3.WithCountOnly())
	if err != nil || resp.Count != n {
		t.Fatalf("leased keys after 2 TTLs: %v %v", resp, err)
	}
	cli := proxyClient(t, p)
	if _, err := cli.Revoke(ctx, ids[0]); err != nil {
		t.Fatal(err)
	}
	ttl, err := direct.TimeToLive(ctx, ids[0])
	if err != nil || ttl.TTL != -1 {
		t.Fatalf("revoked lease TTL: %v %v", ttl, err)
	}
}
