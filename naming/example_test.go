package naming_test

import (
	"context"
	"fmt"
	"time"

	"github.com/beaconplane/beacon"
	"github.com/beaconplane/beacon/naming"
	"github.com/beaconplane/beacon/naming/namingtest"
	"github.com/beaconplane/beacon/registry"
	"github.com/beaconplane/beacon/store/memory"
	"google.golang.org/grpc"
	"google.golang.org/grpc/credentials/insecure"
)

// A server registers itself; a client dials it by name. The registry here
// runs over the memory backend; with etcd, only the store changes.
func Example() {
	ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
	defer cancel()

	st := memory.New(memory.Config{})
	defer st.Close()
	reg, err := registry.New(st, registry.Config{})
	if err != nil {
		panic(err)
	}
	defer reg.Close()

	// A gRPC server (the standard health service) registers itself.
	backend, err := namingtest.NewBackend("api-1")
	if err != nil {
		panic(err)
	}
	defer backend.Stop()
	if _, err := reg.Register(ctx, beacon.Instance{
		Namespace: "prod", Component: "api", Endpoint: "grpc",
		Address: backend.Addr(), Transport: "grpc", Metadata: map[string]string{"zone": "eu-1"},
	}); err != nil {
		panic(err)
	}

	// A client dials beacon:///prod/api/grpc.
	resolver, err := naming.DialOption(reg)
	if err != nil {
		panic(err)
	}
	cc, err := grpc.NewClient("beacon:///prod/api/grpc", resolver,
		grpc.WithTransportCredentials(insecure.NewCredentials()),
		grpc.WithDefaultServiceConfig(`{"loadBalancingConfig":[{"round_robin":{}}]}`))
	if err != nil {
		panic(err)
	}
	defer cc.Close()
	served, err := namingtest.Call(ctx, cc)
	if err != nil {
		panic(err)
	}
	fmt.Println("served by", served)
	// Output: served by api-1
}

func ExampleParseTarget() {
	q, err := naming.ParseTarget("beacon:///prod/api/grpc")
	fmt.Println(q.Namespace, q.Component, q.Endpoint, err)

	_, err = naming.ParseTarget("beacon://prod/api/grpc")
	fmt.Println(err)
	// Output:
	// prod api grpc <nil>
	// naming: invalid target "beacon://prod/api/grpc": has authority "prod", but beacon targets have none: put all three names in the path, beacon:///prod/api/grpc (three slashes)
}

func ExampleTarget() {
	fmt.Println(naming.Target(beacon.Query{Namespace: "prod", Component: "api", Endpoint: "grpc"}))
	// Output: beacon:///prod/api/grpc
}
