package proxy

import (
	"testing"

	"github.com/beaconplane/beacon/internal/testkit/etcdtest"
	clientv3 "go.etcd.io/etcd/client/v3"
)

func TestReadWriteWatchThroughProxy(t *testing.T) {
	t.Parallel()
	c := etcdtest.StartCluster(t, 3)
	p := startProxy(t, Config{PeerURLs: c.PeerURLs()})
	cli := proxyClient(t, p)
	ctx := ctxT(t)

	if _, err := cli.Put(ctx, "/a", "1"); err != nil {
		t.Fatalf("put: %v", err)
	}
	resp, err := cli.Get(ctx, "/a")
	if err != nil || len(resp.Kvs) != 1 || string(resp.Kvs[0].Value) != "1" {
		t.Fatalf("get: %v %v", resp, err)
	}
	wch := cli.Watch(ctx, "/w", clientv3.WithPrefix(), clientv3.WithCreatedNotify())
	if wr := <-wch; !wr.Created {
		t.Fatalf("first watch response not created: %+v", wr)
	}
	direct := c.Client(t)
	if _, err := direct.Put(ctx, "/w/x", "v"); err != nil {
		t.Fatal(err)
	}
	wr := <-wch
	if len(wr.Events) != 1 || string(wr.Events[0].Kv.Key) != "/w/x" {
		t.Fatalf("watch: %+v", wr)
	}
}
