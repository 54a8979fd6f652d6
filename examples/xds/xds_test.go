// Package xds_test runs the xDS example clients (Go, Python on gRPC C-core,
// Node) against Beacon's xDS server and the greeter example's server, as
// docs/xds.md tells a reader to: the examples are tested as written.
package xds_test

import (
	"context"
	"net"
	"os"
	"path/filepath"
	"strings"
	"testing"
	"time"

	"github.com/beaconplane/beacon"
	"github.com/beaconplane/beacon/examples/greeter"
	"github.com/beaconplane/beacon/internal/testkit/etcdtest"
	"github.com/beaconplane/beacon/internal/testkit/testpeer"
	"github.com/beaconplane/beacon/registry"
	"github.com/beaconplane/beacon/server/xdsapi"
	"github.com/beaconplane/beacon/store/etcd"
)

func TestExampleClients(t *testing.T) {
	srv := etcdtest.Start(t, etcdtest.Options{})
	ctx, cancel := context.WithTimeout(context.Background(), 2*time.Minute)
	defer cancel()
	xdsAddr := startXDS(t, ctx, srv.Endpoint())

	// The greeter example's server, registering itself over etcd.
	gctx, stop := context.WithCancel(ctx)
	ready := make(chan beacon.Instance, 1)
	done := make(chan error, 1)
	go func() {
		done <- greeter.RunServer(gctx, greeter.ServerConfig{Name: "one", Etcd: etcd.Config{Endpoints: srv.Endpoints()},
			DrainGrace: time.Millisecond, Ready: func(in beacon.Instance) { ready <- in }})
	}()
	t.Cleanup(func() {
		stop()
		if err := <-done; err != nil {
			t.Errorf("greeter server: %v", err)
		}
	})
	select {
	case <-ready:
	case err := <-done:
		t.Fatalf("greeter server: %v", err)
	}

	boot, err := xdsapi.Bootstrap(xdsapi.BootstrapConfig{Server: xdsAddr})
	if err != nil {
		t.Fatal(err)
	}
	bootFile := filepath.Join(t.TempDir(), "xds-bootstrap.json")
	if err := os.WriteFile(bootFile, boot, 0o600); err != nil {
		t.Fatal(err)
	}
	for _, c := range []struct {
		name string
		argv func(t *testing.T) []string
	}{
		{"go", func(t *testing.T) []string {
			return []string{testpeer.GoBuild(t, "github.com/beaconplane/beacon/examples/xds/client"), "--count", "2", "--interval", "1ms"}
		}},
		{"python", func(t *testing.T) []string {
			return []string{testpeer.PythonGRPC(t), filepath.Join("python", "client.py"), "--count", "2", "--interval", "0.001"}
		}},
		{"node", func(t *testing.T) []string {
			return []string{testpeer.Node(t, "node"), filepath.Join("node", "client.js"), "--count", "2", "--interval", "1"}
		}},
	} {
		t.Run(c.name, func(t *testing.T) {
			argv := c.argv(t)
			cctx, cancel := context.WithTimeout(ctx, time.Minute)
			defer cancel()
			cmd := testpeer.CommandContext(cctx, argv[0], argv[1:]...)
			cmd.Env = append(os.Environ(), "GRPC_XDS_BOOTSTRAP="+bootFile)
			cmd.WaitDelay = time.Second
			out, err := cmd.CombinedOutput()
			if err != nil || strings.Count(string(out), "reply from one: Hello, xds-") != 2 {
				t.Fatalf("%v: %v\n%s", cmd.Args, err, out)
			}
		})
	}
}

// startXDS serves the registry of the etcd at endpoint over xDS, as beacon
// serve does, until the test ends; it returns the address.
func startXDS(t *testing.T, ctx context.Context, endpoint string) string {
	t.Helper()
	st, err := etcd.Open(ctx, etcd.Config{Endpoints: []string{endpoint}})
	if err != nil {
		t.Fatal(err)
	}
	reg, err := registry.New(st, registry.Config{})
	if err != nil {
		t.Fatal(err)
	}
	x, err := xdsapi.New(reg, xdsapi.Config{})
	if err != nil {
		t.Fatal(err)
	}
	ln, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	served := make(chan error, 1)
	go func() { served <- x.Serve(ln) }()
	t.Cleanup(func() {
		_ = x.Close()
		<-served
		_ = reg.Close()
		_ = st.Close()
	})
	return ln.Addr().String()
}
