package kube_test

import (
	"context"
	"errors"
	"strings"
	"testing"

	"github.com/beaconplane/beacon/registry"
	"github.com/beaconplane/beacon/registry/kube"
)

// The dynamo layout is not read from Kubernetes (DynamoWorkerMetadata)
// yet: the driver refuses it before reaching any cluster, saying what to
// do instead.
func TestDriverRefusesTheDynamoLayout(t *testing.T) {
	_, err := registry.OpenDriver(context.Background(), kube.BackendName, registry.DriverConfig{
		Registry: registry.Config{Layout: registry.LayoutDynamo},
		Getenv:   func(string) string { return "" },
	})
	if !errors.Is(err, kube.ErrInvalidConfig) || !strings.Contains(err.Error(), "DYN_DISCOVERY_BACKEND=etcd") {
		t.Fatalf("OpenDriver with the dynamo layout: %v", err)
	}
}
