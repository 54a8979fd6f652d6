package kube_test

import (
	"context"
	"fmt"
	"log"

	"github.com/beaconplane/beacon"
	"github.com/beaconplane/beacon/backend"
	"github.com/beaconplane/beacon/registry"
	"github.com/beaconplane/beacon/registry/kube"
)

// A worker in a pod registers itself; the pod's identity comes from the
// Downward API (POD_NAME, POD_NAMESPACE, POD_UID), the cluster from the
// in-cluster service account. (Not run: it needs a cluster.)
func ExampleOpen() {
	ctx := context.Background()
	r, err := kube.Open(ctx, kube.ConfigFromEnv(nil))
	if err != nil {
		log.Fatal(err) // no cluster, no CRD, ...: the error says which, and what to do
	}
	defer r.Close() // deletes this process's InstanceSet

	reg, err := r.Register(ctx, beacon.Instance{Namespace: "prod", Component: "api", Endpoint: "http", Address: "10.0.0.5:8080"})
	if err != nil {
		log.Fatal(err) // missing POD_* variables, RBAC, ...
	}
	vis, err := r.Visibility(ctx)
	if err == nil && !vis.Visible {
		log.Printf("registered %s, but not visible yet: %s", reg.Instance().Ref(), vis.Reason)
	}
}

// Programs that choose their backend by name link the kubernetes backend by
// importing this package; BEACON_DISCOVERY_BACKEND=kubernetes (or
// DYN_DISCOVERY_BACKEND=kubernetes) then selects it. (Not run: it needs a
// cluster.)
func Example_byName() {
	ctx := context.Background()
	r, err := backend.OpenRegistry(ctx, backend.FromEnv(), registry.Config{})
	if err != nil {
		log.Fatal(err)
	}
	defer r.Close()
	w, err := r.Watch(ctx, beacon.Query{Namespace: "prod", Component: "api"})
	if err != nil {
		log.Fatal(err)
	}
	for {
		b, err := w.Next(ctx)
		if err != nil {
			log.Fatal(err)
		}
		for _, e := range b.Events {
			fmt.Println(b.Kind, e.Type, e.Instance.Ref(), e.Instance.Address)
		}
	}
}
