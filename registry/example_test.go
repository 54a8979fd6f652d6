package registry_test

import (
	"context"
	"errors"
	"fmt"
	"time"

	"github.com/beaconplane/beacon"
	"github.com/beaconplane/beacon/registry"
	"github.com/beaconplane/beacon/store/memory"
)

// A worker registers itself; a frontend watches the endpoint: a snapshot
// first, then each change.
func Example() {
	ctx := context.Background()
	st := memory.New(memory.Config{})
	defer st.Close()
	r, err := registry.New(st, registry.Config{})
	if err != nil {
		panic(err)
	}
	defer r.Close()

	w, err := r.Watch(ctx, beacon.Query{Namespace: "prod", Component: "api", Endpoint: "http"})
	if err != nil {
		panic(err)
	}
	defer w.Close()
	b, err := w.Next(ctx)
	if err != nil {
		panic(err)
	}
	fmt.Println(b.Kind, len(b.Events))

	reg, err := r.Register(ctx, beacon.Instance{
		Namespace: "prod", Component: "api", Endpoint: "http",
		ID: "00000000000000a1", Address: "10.0.0.5:8080", Transport: "http",
	})
	if err != nil {
		panic(err)
	}
	show := func() {
		b, err := w.Next(ctx)
		if err != nil {
			panic(err)
		}
		for _, e := range b.Events {
			fmt.Println(b.Kind, e.Type, e.Instance.Ref(), e.Instance.Address, e.Instance.Status)
		}
	}
	show()

	if err := reg.Update(ctx, func(in *beacon.Instance) { in.Address = "10.0.0.5:8081" }); err != nil {
		panic(err)
	}
	show()

	if err := reg.Close(); err != nil {
		panic(err)
	}
	show()
	// Output:
	// snapshot 0
	// changes added prod/api/http/00000000000000a1 10.0.0.5:8080 serving
	// changes updated prod/api/http/00000000000000a1 10.0.0.5:8081 serving
	// changes removed prod/api/http/00000000000000a1 10.0.0.5:8081 serving
}

// The building blocks of an HTTP API: each remote client gets its own
// lease and a secret, keeps the registration alive with heartbeats that
// present the secret, and vanishes when it stops.
func ExampleStoreRegistry_RegisterWithTTL() {
	ctx := context.Background()
	st := memory.New(memory.Config{})
	defer st.Close()
	r, err := registry.New(st, registry.Config{})
	if err != nil {
		panic(err)
	}
	defer r.Close()

	o, err := r.RegisterWithTTL(ctx, beacon.Instance{
		Namespace: "prod", Component: "api", Endpoint: "http", Address: "10.0.0.7:8080",
	}, 15*time.Second)
	if err != nil {
		panic(err)
	}
	ref := o.Instance.Ref()
	ttl, err := r.Heartbeat(ctx, ref, o.Secret)
	fmt.Println("heartbeat:", ttl, err)
	_, err = r.Heartbeat(ctx, ref, registry.NewSecret())
	fmt.Println("with a guessed secret:", errors.Is(err, beacon.ErrNotFound))

	if err := r.DeregisterLeased(ctx, ref, o.Secret); err != nil {
		panic(err)
	}
	_, err = r.Heartbeat(ctx, ref, o.Secret)
	fmt.Println("after deregister:", errors.Is(err, beacon.ErrNotFound))
	// Output:
	// heartbeat: 15s <nil>
	// with a guessed secret: true
	// after deregister: true
}

// Pickers choose among the serving instances; draining ones are skipped.
func ExampleNewRoundRobin() {
	p := registry.NewRoundRobin([]beacon.Instance{
		{Address: "10.0.0.1:80"},
		{Address: "10.0.0.2:80", Status: beacon.StatusDraining},
		{Address: "10.0.0.3:80"},
	})
	for range 3 {
		in, err := p.Pick()
		if err != nil {
			panic(err)
		}
		fmt.Println(in.Address)
	}
	// Output:
	// 10.0.0.1:80
	// 10.0.0.3:80
	// 10.0.0.1:80
}

// An operator drains a worker's instance in the store (the HTTP API does
// this as the authenticated etcd user). The worker's session adopts the
// drain: its own Update keeps it draining unless it sets Status.
func ExampleStoreRegistry_DrainInstance() {
	ctx := context.Background()
	st := memory.New(memory.Config{})
	defer st.Close()
	worker, err := registry.New(st, registry.Config{})
	if err != nil {
		panic(err)
	}
	defer worker.Close()
	operator, err := registry.New(st, registry.Config{})
	if err != nil {
		panic(err)
	}
	defer operator.Close()

	reg, err := worker.Register(ctx, beacon.Instance{Namespace: "prod", Component: "api", Endpoint: "http",
		ID: "00000000000000a1", Address: "10.0.0.5:8080"})
	if err != nil {
		panic(err)
	}
	in, err := operator.DrainInstance(ctx, reg.Instance().Ref())
	if err != nil {
		panic(err)
	}
	fmt.Println("operator:", in.Ref(), in.Status)

	// The worker changes its metadata: the drain stays.
	if err := reg.Update(ctx, func(in *beacon.Instance) { in.Metadata = map[string]string{"v": "2"} }); err != nil {
		panic(err)
	}
	stored, err := operator.Get(ctx, reg.Instance().Ref())
	if err != nil {
		panic(err)
	}
	fmt.Println("stored:", stored.Status, stored.Metadata["v"], "worker:", reg.Instance().Status)
	// Output:
	// operator: prod/api/http/00000000000000a1 draining
	// stored: draining 2 worker: draining
}
