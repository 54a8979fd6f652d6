package kube_test

import (
	"strings"
	"testing"

	"github.com/beaconplane/beacon/internal/testkit/testpeer"
)

// Only registry/kube (and what wires it: cmd/beacon, the test harness)
// links client-go: the client-facing packages, the store backends and the
// server do not, so a program that does not import registry/kube never
// links it (DESIGN.md: client-facing packages stay light).
func TestClientGoStaysOptIn(t *testing.T) {
	if testing.Short() {
		t.Skip("runs go list")
	}
	pkgs := []string{".", "./store", "./backend", "./registry", "./naming", "./bootstrap", "./server", "./server/registryapi"}
	cmd := testpeer.Command("go", append([]string{"list", "-deps", "-f", "{{.ImportPath}}"}, pkgs...)...)
	cmd.Dir = "../.."
	out, err := cmd.CombinedOutput()
	if err != nil {
		t.Fatalf("go list: %v\n%s", err, out)
	}
	for _, p := range strings.Fields(string(out)) {
		if strings.HasPrefix(p, "k8s.io/client-go") || strings.HasPrefix(p, "k8s.io/api/") ||
			p == "github.com/beaconplane/beacon/registry/kube" {
			t.Errorf("%s is linked by one of %v", p, pkgs)
		}
	}
}
