package kube_test

import (
	"path/filepath"
	"testing"

	"github.com/beaconplane/beacon/internal/testkit/kubetest"
	"github.com/beaconplane/beacon/registry"
	"github.com/beaconplane/beacon/registry/kube"
)

// The kubernetes backend opened with the dynamo layout (what
// `--backend kubernetes --layout dynamo` opens) is the read-only registry
// of DynamoWorkerMetadata resources, configured from the environment as
// the InstanceSet registry is.
func TestDriverOpensTheDynamoLayout(t *testing.T) {
	cp := kubetest.Shared(t)
	installDynamoCRD(t, cp)
	ns := cp.Namespace(t)
	kc := filepath.Join(t.TempDir(), "kubeconfig")
	if err := kubetest.WriteKubeconfig(kc, cp.Admin(), ns); err != nil {
		t.Fatal(err)
	}
	env := map[string]string{kube.EnvKubeconfig: kc, kube.EnvNamespaces: ns}
	r, err := registry.OpenDriver(kubetest.Ctx(t), kube.BackendName, registry.DriverConfig{
		Registry: registry.Config{Layout: registry.LayoutDynamo},
		Getenv:   func(k string) string { return env[k] },
	})
	if err != nil {
		t.Fatalf("OpenDriver with the dynamo layout: %v", err)
	}
	defer r.Close()
	if _, ok := r.(*kube.Dynamo); !ok {
		t.Fatalf("OpenDriver with the dynamo layout opened a %T, want *kube.Dynamo", r)
	}
}
