package server

import (
	"context"
	"testing"
	"time"

	"github.com/beaconplane/beacon"
	"github.com/beaconplane/beacon/registry"
	etcdstore "github.com/beaconplane/beacon/store/etcd"
	clientv3 "go.etcd.io/etcd/client/v3"
)

// TestStopWithAWatchOpenKeepsLeases: a graceful stop of a single member
// while an etcd client keeps a watch open (beacon watch, a resolver,
// etcdctl watch) leaves the leases of its clients alone. etcd's own Close
// waits its request timeout (7 s) for client streams to end, while its
// raft and lessor run on and a registry's keep-alives (each a new stream)
// are refused: a session lease of 5 s expired during the stop, and every
// registration under it went. The member now ends its clients' streams
// after a grace, so the lease is alive when the member starts again.
func TestStopWithAWatchOpenKeepsLeases(t *testing.T) {
	cfg := testConfig(t)
	s := startServer(t, cfg)
	ctx, cancel := context.WithTimeout(context.Background(), time.Minute)
	defer cancel()
	st, err := etcdstore.Open(ctx, etcdstore.Config{Endpoints: s.Endpoints().ClientURLs})
	if err != nil {
		t.Fatal(err)
	}
	defer st.Close()
	r, err := registry.New(st, registry.Config{LeaseTTL: 5 * time.Second})
	if err != nil {
		t.Fatal(err)
	}
	defer r.Close()
	if _, err := r.Register(ctx, beacon.Instance{Namespace: "ns", Component: "web", Endpoint: "http", Address: "127.0.0.1:80"}); err != nil {
		t.Fatal(err)
	}
	cli, err := clientv3.New(clientv3.Config{Endpoints: s.Endpoints().ClientURLs, DialTimeout: 5 * time.Second})
	if err != nil {
		t.Fatal(err)
	}
	defer cli.Close()
	got, err := cli.Get(ctx, "/", clientv3.WithPrefix())
	if err != nil || len(got.Kvs) == 0 || got.Kvs[0].Lease == 0 {
		t.Fatalf("the registration's key: %v", err)
	}
	lease := clientv3.LeaseID(got.Kvs[0].Lease)
	wch := cli.Watch(ctx, "/watched", clientv3.WithCreatedNotify())
	if resp := <-wch; !resp.Created {
		t.Fatalf("watch not created: %v", resp.Err())
	}

	if err := s.Close(); err != nil {
		t.Fatalf("Close: %v", err)
	}
	s2 := startServer(t, cfg)
	cli2, err := clientv3.New(clientv3.Config{Endpoints: s2.Endpoints().ClientURLs, DialTimeout: 5 * time.Second})
	if err != nil {
		t.Fatal(err)
	}
	defer cli2.Close()
	ttl, err := cli2.TimeToLive(ctx, lease)
	if err != nil || ttl.TTL <= 0 {
		t.Fatalf("the session's 5 s lease after a graceful restart with a watch open: TTL %d, %v (it expired while the member stopped)", ttl.TTL, err)
	}
}
