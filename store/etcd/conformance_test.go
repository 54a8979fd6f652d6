package etcd_test

import (
	"testing"
	"time"

	"github.com/beaconplane/beacon/store"
	"github.com/beaconplane/beacon/store/etcd"
	"github.com/beaconplane/beacon/store/storetest"
	clientv3 "go.etcd.io/etcd/client/v3"
)

// suiteOptions adapt the conformance suite to etcd.
var suiteOptions = storetest.Options{
	// etcd's minimum lease TTL is 1.5 election timeouts, rounded up to
	// whole seconds: 2 s with the default 1 s election timeout.
	LeaseTTL: 2 * time.Second,
	// etcd's lessor checks expiry every 500 ms, then the revoke goes
	// through raft.
	ExpiryGrace: time.Second,
	// No LeakOptions: the embedded server's long-lived goroutines predate
	// the leak check, and those serving a connection end, within goleak's
	// retries, once the client closes it.
}

func TestConformance(t *testing.T) {
	storetest.Run(t, factory(nil, etcd.Config{}), suiteOptions)
}

// TestConformanceFromClient runs the suite on stores over a client the
// caller made, whose transactions go through the client's KV rather than
// Open's direct path.
func TestConformanceFromClient(t *testing.T) {
	storetest.Run(t, func(tb testing.TB) store.Store {
		cli, err := clientv3.New(server.ClientConfig())
		if err != nil {
			tb.Fatal(err)
		}
		s := etcd.NewFromClient(cli, etcd.CloseClient())
		tb.Cleanup(func() { _ = s.Close() })
		return s
	}, suiteOptions)
}
