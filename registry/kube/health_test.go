package kube_test

import (
	"errors"
	"strings"
	"testing"

	"github.com/beaconplane/beacon"
	"github.com/beaconplane/beacon/internal/testkit/kubetest"
	"github.com/beaconplane/beacon/registry/kube"
)

// On Kubernetes the pod's readiness is the health check: a registration
// or an update that declares a check is refused, saying to use a
// readinessProbe, and writes nothing; no instance carries Health, whatever
// its registrant set.
func TestHealthCheckRefused(t *testing.T) {
	cp := kubetest.Shared(t)
	ns := cp.Namespace(t)
	r := cp.Registry(t, ns, cp.ReadyPod(t, ns, "checked"), nil)
	ctx := kubetest.Ctx(t)
	checked := inst("10.12.0.1:80")
	checked.Check = &beacon.Check{Kind: beacon.CheckHTTP, Path: "/healthz"}
	_, err := r.Register(ctx, checked)
	if !errors.Is(err, kube.ErrHealthCheck) || !errors.Is(err, beacon.ErrInvalid) || !strings.Contains(err.Error(), "readinessProbe") {
		t.Fatalf("Register with a check: %v, want ErrHealthCheck (and ErrInvalid) naming the readinessProbe", err)
	}
	plain := inst("10.12.0.2:80")
	plain.Health = &beacon.Health{Status: beacon.HealthFailing}
	reg := register(t, r, plain)
	if h := reg.Instance().Health; h != nil {
		t.Fatalf("a registration carries health %+v", h)
	}
	err = reg.Update(ctx, func(in *beacon.Instance) { in.Check = &beacon.Check{Kind: beacon.CheckTCP} })
	if !errors.Is(err, kube.ErrHealthCheck) {
		t.Fatalf("Update adding a check: %v, want ErrHealthCheck", err)
	}
	if in := reg.Instance(); in.Check != nil {
		t.Fatalf("a refused update changed the instance: %+v", in.Check)
	}
	if err := reg.Update(ctx, func(in *beacon.Instance) { in.Health = &beacon.Health{Status: beacon.HealthFailing} }); err != nil {
		t.Fatal(err)
	}
	if h := reg.Instance().Health; h != nil {
		t.Fatalf("an update set health %+v", h)
	}
	got, _, err := r.List(ctx, beacon.Query{Namespace: "demo"})
	if err != nil || len(got) != 1 || got[0].Address != plain.Address || got[0].Check != nil || got[0].Health != nil {
		t.Fatalf("List = %+v, %v; want the unchecked instance alone, without health", got, err)
	}
}
