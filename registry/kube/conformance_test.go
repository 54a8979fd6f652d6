package kube_test

import (
	"fmt"
	"sync/atomic"
	"testing"
	"time"

	"github.com/beaconplane/beacon/internal/testkit/kubetest"
	"github.com/beaconplane/beacon/registry"
	"github.com/beaconplane/beacon/registry/registrytest"
)

// TestConformance runs the Registry conformance suite on a real control
// plane: every simulated process is a pod of its own (created, made Ready
// as a kubelet would, and listed by the real EndpointSlice controller
// before its registry is used), in one Kubernetes namespace.
func TestConformance(t *testing.T) {
	cp := kubetest.Shared(t)
	ns := cp.Namespace(t)
	var n atomic.Int64
	registrytest.Run(t, func(tb testing.TB) registry.Registry {
		pod := cp.ReadyPod(tb, ns, fmt.Sprintf("p%d", n.Add(1)))
		return cp.Registry(tb, ns, pod, nil)
	}, registrytest.Options{Timeout: 45 * time.Second})
}
