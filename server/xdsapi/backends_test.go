package xdsapi

import (
	"slices"
	"testing"

	"github.com/beaconplane/beacon"
	"github.com/beaconplane/beacon/internal/testkit/backendtest"
)

// xDS works over every store backend: an instance registered by one
// registry (another process, for the shared backends) is pushed by an xDS
// server over another, and its removal too.
func TestEveryBackend(t *testing.T) {
	for _, b := range backendtest.Kinds {
		t.Run(b.Name, func(t *testing.T) {
			open := b.Start(t)
			server, registrant := backendtest.Registry(t, open), backendtest.Registry(t, open)
			_, addr := startXDS(t, server, Config{})
			a := dialADS(t, addr, "raw")
			a.request(EndpointType, []string{"grpc.greeter.demo"}, nil, "")
			resp := a.recv()
			reg, err := registrant.Register(testContext(t), beacon.Instance{Namespace: "demo", Component: "greeter", Endpoint: "grpc", Address: "10.0.0.1:80"})
			if err != nil {
				t.Fatal(err)
			}
			a.request(EndpointType, []string{"grpc.greeter.demo"}, resp, "")
			resp = a.recv()
			if got := addresses(assignments(t, resp)["grpc.greeter.demo"]); !slices.Equal(got, []string{"10.0.0.1:80/HEALTHY"}) {
				t.Fatalf("after the registration: %v", got)
			}
			if err := reg.Close(); err != nil {
				t.Fatal(err)
			}
			a.request(EndpointType, []string{"grpc.greeter.demo"}, resp, "")
			if got := addresses(assignments(t, a.recv())["grpc.greeter.demo"]); len(got) != 0 {
				t.Fatalf("after the deregistration: %v", got)
			}
		})
	}
}
