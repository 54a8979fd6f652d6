package xdsapi

import (
	"context"
	"testing"

	"github.com/beaconplane/beacon"
	"github.com/beaconplane/beacon/naming/namingtest"
)

// Every scenario runs against the three client implementations.

// TestClientsRouteToRegistrations: register → RPCs reach every instance,
// in every client; grpc-go also resolves the slash form.
func TestClientsRouteToRegistrations(t *testing.T) {
	r := memRegistry(t)
	_, addr := startXDS(t, r, Config{})
	one, two := namingtest.Start(t, "one"), namingtest.Start(t, "two")
	register(t, r, one.Addr(), nil)
	register(t, r, two.Addr(), nil)
	forEachClient(t, func(t *testing.T, k clientKind) {
		reachAll(t, k.start(t, addr, "xds:///grpc.greeter.demo"), "one", "two")
	})
	t.Run("grpc-go/slash-form", func(t *testing.T) {
		reachAll(t, startGoClient(t, addr, "xds:///demo/greeter/grpc"), "one", "two")
	})
}

// TestClientsFollowDrain: a drained instance gets no new RPCs; serving again,
// it gets them again.
func TestClientsFollowDrain(t *testing.T) {
	r := memRegistry(t)
	_, addr := startXDS(t, r, Config{})
	one, two := namingtest.Start(t, "one"), namingtest.Start(t, "two")
	register(t, r, one.Addr(), nil)
	reg2 := register(t, r, two.Addr(), nil)
	forEachClient(t, func(t *testing.T, k clientKind) {
		c := k.start(t, addr, "xds:///grpc.greeter.demo")
		reachAll(t, c, "one", "two")
		setStatus(t, reg2, beacon.StatusDraining)
		settleOn(t, c, 20, "one")
		setStatus(t, reg2, beacon.StatusServing)
		reachAll(t, c, "one", "two")
	})
}

func setStatus(t testing.TB, reg interface {
	Update(ctx context.Context, mutate func(*beacon.Instance)) error
}, s beacon.Status) {
	t.Helper()
	if err := reg.Update(testContext(t), func(in *beacon.Instance) { in.Status = s }); err != nil {
		t.Fatal(err)
	}
}
