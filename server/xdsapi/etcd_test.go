package xdsapi

import (
	"net"
	"strings"
	"syscall"
	"testing"
	"time"

	"github.com/beaconplane/beacon/internal/lab/netcut"
	"github.com/beaconplane/beacon/internal/testkit/etcdtest"
	"github.com/beaconplane/beacon/internal/testkit/testpeer"
	"github.com/beaconplane/beacon/naming/namingtest"
	"github.com/beaconplane/beacon/registry"
	"github.com/beaconplane/beacon/store/etcd"
)

// etcdRegistry is a registry over the etcd at endpoint, closed with the
// test.
func etcdRegistry(t testing.TB, endpoint string) *registry.StoreRegistry {
	t.Helper()
	st, err := etcd.Open(testContext(t), etcd.Config{Endpoints: []string{endpoint}, RequestTimeout: time.Second})
	if err != nil {
		t.Fatal(err)
	}
	r, err := registry.New(st, registry.Config{})
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() {
		_ = r.Close()
		_ = st.Close()
	})
	return r
}

// A worker killed with SIGKILL (`beacon register`, a process of its own)
// stops getting RPCs once its lease ends: etcd deletes its instance and
// Beacon pushes the assignment without it.
func TestClientsSIGKILLedWorkerGone(t *testing.T) {
	srv := etcdtest.Start(t, etcdtest.Options{})
	r := etcdRegistry(t, srv.Endpoint())
	_, addr := startXDS(t, r, Config{})
	one, two := namingtest.Start(t, "one"), namingtest.Start(t, "two")
	register(t, r, two.Addr(), nil)
	beaconBin := testpeer.GoBuild(t, "github.com/beaconplane/beacon/cmd/beacon")
	forEachClient(t, func(t *testing.T, k clientKind) {
		worker := testpeer.Command(beaconBin, "register", "demo/greeter/grpc", "--addr", one.Addr(), "--ttl", "2s", "--endpoints", srv.Endpoint())
		if err := worker.Start(); err != nil {
			t.Fatal(err)
		}
		t.Cleanup(func() { _ = worker.Process.Kill(); _ = worker.Wait() })
		c := k.start(t, addr, "xds:///grpc.greeter.demo")
		reachAll(t, c, "one", "two")
		if err := worker.Process.Signal(syscall.SIGKILL); err != nil {
			t.Fatal(err)
		}
		settleOn(t, c, 20, "two")
	})
}

// While the registry's store is cut off, clients keep routing to the last
// state Beacon sent (never an empty one); once it is back, new instances
// reach them.
func TestClientsKeepLastStateThroughStoreOutage(t *testing.T) {
	srv := etcdtest.Start(t, etcdtest.Options{})
	cut, err := netcut.Start(strings.TrimPrefix(srv.Endpoint(), "http://"))
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { _ = cut.Close() })
	workers := etcdRegistry(t, srv.Endpoint())
	x, addr := startXDS(t, etcdRegistry(t, cut.Endpoint()), Config{})
	one, two, three := namingtest.Start(t, "one"), namingtest.Start(t, "two"), namingtest.Start(t, "three")
	register(t, workers, one.Addr(), nil)
	register(t, workers, two.Addr(), nil)
	var clients []client
	for _, k := range clientKinds {
		c := k.start(t, addr, "xds:///grpc.greeter.demo")
		reachAll(t, c, "one", "two")
		clients = append(clients, c)
	}
	cut.Cut()
	waitFor(t, x, "the registry watch to go stale", func() bool { since, _ := x.Stale(); return !since.IsZero() })
	for i, c := range clients {
		t.Run(clientKinds[i].name+"/outage", func(t *testing.T) { settleOn(t, c, 10, "one", "two") })
	}
	cut.Restore()
	register(t, workers, three.Addr(), nil)
	for i, c := range clients {
		t.Run(clientKinds[i].name+"/back", func(t *testing.T) { reachAll(t, c, "one", "two", "three") })
	}
}

// Beacon restarted under connected clients: they keep routing while it is
// down, reconnect, and converge on what changed meanwhile.
func TestClientsConvergeAfterRestart(t *testing.T) {
	r := memRegistry(t)
	one, two := namingtest.Start(t, "one"), namingtest.Start(t, "two")
	reg1 := register(t, r, one.Addr(), nil)
	first, addr := startXDS(t, r, Config{})
	var clients []client
	for _, k := range clientKinds {
		c := k.start(t, addr, "xds:///grpc.greeter.demo")
		reachAll(t, c, "one")
		clients = append(clients, c)
	}
	if err := first.Close(); err != nil {
		t.Fatal(err)
	}
	register(t, r, two.Addr(), nil)
	if err := reg1.Close(); err != nil {
		t.Fatal(err)
	}
	startXDSAt(t, r, Config{}, addr)
	for i, c := range clients {
		t.Run(clientKinds[i].name, func(t *testing.T) { settleOn(t, c, 20, "two") })
	}
}

// startXDSAt is startXDS on a given address (a restarted server's).
func startXDSAt(t testing.TB, r registry.Discoverer, cfg Config, addr string) *Server {
	t.Helper()
	s, err := New(r, cfg)
	if err != nil {
		t.Fatal(err)
	}
	ln, err := net.Listen("tcp", addr)
	if err != nil {
		t.Fatal(err)
	}
	done := make(chan error, 1)
	go func() { done <- s.Serve(ln) }()
	t.Cleanup(func() {
		_ = s.Close()
		if err := <-done; err != nil {
			t.Errorf("Serve: %v", err)
		}
	})
	return s
}

// waitFor waits until cond holds, checking at each change of what the
// server serves.
func waitFor(t testing.TB, s *Server, what string, cond func() bool) {
	t.Helper()
	deadline := time.NewTimer(testDeadline)
	defer deadline.Stop()
	for {
		ch := s.Updated()
		if cond() {
			return
		}
		select {
		case <-ch:
		case <-deadline.C:
			t.Fatalf("timed out after %v waiting for %s", testDeadline, what)
		}
	}
}
