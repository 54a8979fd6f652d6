package main

import (
	"context"
	"testing"
	"time"

	"github.com/beaconplane/beacon/internal/testkit/etcdtest"
	"github.com/beaconplane/beacon/internal/testkit/testpeer"
	clientv3 "go.etcd.io/etcd/client/v3"
)

// TestBenchProxyTierInterrupted: Ctrl-C in the middle of `beacon bench
// proxy --proxies 2`, while the watches are open, stops all four proxy
// processes (two per side) and removes every key the benchmark wrote.
func TestBenchProxyTierInterrupted(t *testing.T) {
	if testing.Short() {
		t.Skip("builds beacon and etcd")
	}
	srv := etcdtest.Start(t, etcdtest.Options{})
	etcdBin := testpeer.GoBuild(t, "github.com/beaconplane/beacon/internal/lab/etcd")
	log := runUntilInterrupted(t, `msg="proxy: watches" side=beacon`, "bench", "proxy", "--endpoints", srv.Endpoint(), "--etcd-bin", etcdBin,
		"--proxies", "2", "--rounds", "50", "--duration", "100ms", "--watches", "20", "--streams", "2", "--latency-puts", "2000")
	checkChildrenGone(t, log, 4)
	checkNoBenchKeys(t, srv)
}

// checkNoBenchKeys checks that no key is left under bench/ in srv.
func checkNoBenchKeys(t *testing.T, srv *etcdtest.Server) {
	t.Helper()
	ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
	defer cancel()
	resp, err := srv.Client(t).Get(ctx, "bench/", clientv3.WithPrefix(), clientv3.WithCountOnly())
	if err != nil {
		t.Fatal(err)
	}
	if resp.Count != 0 {
		t.Fatalf("%d keys left under bench/ after the interrupt", resp.Count)
	}
}
