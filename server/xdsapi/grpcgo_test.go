package xdsapi

import (
	"testing"

	"github.com/beaconplane/beacon/naming/namingtest"
	"google.golang.org/grpc"
	"google.golang.org/grpc/credentials/insecure"
	"google.golang.org/grpc/xds"
)

// goClient dials target through grpc-go's own xDS resolver and balancers
// (google.golang.org/grpc/xds), with a bootstrap that points at addr.
func goClient(t testing.TB, addr, target string) *grpc.ClientConn {
	t.Helper()
	b, err := xds.NewXDSResolverWithConfigForTesting(bootstrap(addr, "go-client"))
	if err != nil {
		t.Fatal(err)
	}
	cc, err := grpc.NewClient(target, grpc.WithResolvers(b), grpc.WithTransportCredentials(insecure.NewCredentials()))
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { _ = cc.Close() })
	return cc
}

// TestGoClientRoutes: grpc-go resolves xds:/// names of both forms through
// Beacon, and RPCs reach every registered backend.
func TestGoClientRoutes(t *testing.T) {
	r := memRegistry(t)
	_, addr := startXDS(t, r, Config{})
	one, two := namingtest.Start(t, "one"), namingtest.Start(t, "two")
	register(t, r, one.Addr(), nil)
	register(t, r, two.Addr(), nil)
	for _, target := range []string{"xds:///grpc.greeter.demo", "xds:///demo/greeter/grpc"} {
		t.Run(target, func(t *testing.T) {
			cc := goClient(t, addr, target)
			if err := namingtest.ReachAll(testContext(t), cc, "one", "two"); err != nil {
				t.Fatal(err)
			}
		})
	}
}
