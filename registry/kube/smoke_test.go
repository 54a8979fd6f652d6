package kube_test

import (
	"context"
	"testing"
	"time"

	"github.com/beaconplane/beacon"
	"github.com/beaconplane/beacon/internal/kubetest"
	"github.com/beaconplane/beacon/registry/registrytest"
)

func TestSmoke(t *testing.T) {
	cp := kubetest.Shared(t)
	ns := cp.Namespace(t)
	pod := cp.ReadyPod(t, ns, "w1")
	r := cp.Registry(t, ns, pod, nil)
	reader := cp.Registry(t, ns, nil, nil)
	ctx, cancel := context.WithTimeout(context.Background(), 60*time.Second)
	defer cancel()
	w, err := reader.Watch(ctx, beacon.Query{Namespace: "demo"})
	if err != nil {
		t.Fatal(err)
	}
	v := registrytest.NewView()
	b, err := w.Next(ctx)
	if err != nil {
		t.Fatal(err)
	}
	if err := v.Apply(b); err != nil {
		t.Fatal(err)
	}
	reg, err := r.Register(ctx, beacon.Instance{Namespace: "demo", Component: "api", Endpoint: "http", Address: "10.0.0.1:80"})
	if err != nil {
		t.Fatal(err)
	}
	for v.Len() == 0 {
		b, err := w.Next(ctx)
		if err != nil {
			t.Fatal(err)
		}
		t.Logf("batch %v %v", b.Kind, b.Events)
		if err := v.Apply(b); err != nil {
			t.Fatal(err)
		}
	}
	ins, rev, err := reader.List(ctx, beacon.Query{Namespace: "demo"})
	t.Logf("list %v rev %d err %v", ins, rev, err)
	cp.SetReady(t, pod, false)
	for v.Len() == 1 {
		b, err := w.Next(ctx)
		if err != nil {
			t.Fatal(err)
		}
		t.Logf("batch %v %v", b.Kind, b.Events)
		if err := v.Apply(b); err != nil {
			t.Fatal(err)
		}
	}
	_ = reg
}
