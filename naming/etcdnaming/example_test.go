package etcdnaming_test

import (
	"context"
	"fmt"
	"time"

	"github.com/beaconplane/beacon/naming/etcdnaming"
	"github.com/beaconplane/beacon/naming/namingtest"
	"github.com/beaconplane/beacon/store/memory"
	"google.golang.org/grpc"
	"google.golang.org/grpc/credentials/insecure"
)

// Endpoints written in etcd's format and resolved through etcd:///. Over
// the etcd backend (etcd.NewFromClient(cli)) etcd's own naming packages
// read and write the same keys; the memory backend keeps the example
// self-contained.
func Example() {
	ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
	defer cancel()
	st := memory.New(memory.Config{})
	defer st.Close()

	backend, err := namingtest.NewBackend("hello-1")
	if err != nil {
		panic(err)
	}
	defer backend.Stop()

	m, err := etcdnaming.NewManager(st, "foo/bar/my-service")
	if err != nil {
		panic(err)
	}
	key := "foo/bar/my-service/" + backend.Addr()
	if err := m.AddEndpoint(ctx, key, etcdnaming.Endpoint{Addr: backend.Addr(), Metadata: map[string]any{"zone": "a"}}); err != nil {
		panic(err)
	}
	kv, err := st.Get(ctx, key)
	if err != nil {
		panic(err)
	}
	fmt.Println(string(kv.Value) == `{"Op":0,"Addr":"`+backend.Addr()+`","Metadata":{"zone":"a"}}`)

	b, err := etcdnaming.NewBuilder(st)
	if err != nil {
		panic(err)
	}
	cc, err := grpc.NewClient("etcd:///foo/bar/my-service", b.DialOption(),
		grpc.WithTransportCredentials(insecure.NewCredentials()))
	if err != nil {
		panic(err)
	}
	defer cc.Close()
	served, err := namingtest.Call(ctx, cc)
	if err != nil {
		panic(err)
	}
	fmt.Println("served by", served)
	// Output:
	// true
	// served by hello-1
}

func ExampleManager_Update() {
	ctx := context.Background()
	st := memory.New(memory.Config{})
	defer st.Close()
	m, err := etcdnaming.NewManager(st, "svc")
	if err != nil {
		panic(err)
	}
	// Replace one endpoint by another in one transaction: watchers never
	// see both, or neither.
	if err := m.AddEndpoint(ctx, "svc/old", etcdnaming.Endpoint{Addr: "10.0.0.1:50051"}); err != nil {
		panic(err)
	}
	err = m.Update(ctx,
		etcdnaming.NewDeleteUpdate("svc/old"),
		etcdnaming.NewAddUpdate("svc/new", etcdnaming.Endpoint{Addr: "10.0.0.2:50051"}))
	fmt.Println(err)
	eps, err := m.List(ctx)
	if err != nil {
		panic(err)
	}
	fmt.Println(eps["svc/new"].Addr, len(eps))

	// Keys must be under the target.
	fmt.Println(m.AddEndpoint(ctx, "other/x", etcdnaming.Endpoint{Addr: "10.0.0.3:50051"}))
	// Output:
	// <nil>
	// 10.0.0.2:50051 1
	// etcdnaming: key outside the target: key "other/x": endpoint keys of target "svc" must be "svc/" followed by a name, like "svc/10.0.0.1:50051"
}
