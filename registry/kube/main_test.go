package kube_test

import (
	"os"
	"testing"

	"github.com/beaconplane/beacon/internal/testkit/kubetest"
)

// TestMain shares one control plane (kube-apiserver, kube-controller-manager
// and etcd) among the package's tests; each test works in a namespace of
// its own.
func TestMain(m *testing.M) {
	code := m.Run()
	kubetest.StopShared()
	os.Exit(code)
}
