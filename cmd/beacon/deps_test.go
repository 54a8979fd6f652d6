package main

import (
	"os/exec"
	"strings"
	"testing"
)

// TestBinaryLinksNoTestCode: the shipped binary links neither the testing
// package nor the test helpers (internal/etcdtest, internal/testpeer):
// benchmarks start etcd through the server package, as `beacon serve`
// does. Nor does it link grpc-go's xDS client (google.golang.org/grpc/xds,
// which the xDS tests use as a real client): serving xDS needs only the
// envoy API types.
func TestBinaryLinksNoTestCode(t *testing.T) {
	out, err := exec.Command("go", "list", "-deps", ".").Output()
	if err != nil {
		t.Fatalf("go list -deps: %v", err)
	}
	for _, pkg := range strings.Fields(string(out)) {
		if pkg == "testing" || strings.HasSuffix(pkg, "/internal/etcdtest") || strings.HasSuffix(pkg, "/internal/testpeer") ||
			pkg == "google.golang.org/grpc/xds" || strings.HasPrefix(pkg, "google.golang.org/grpc/internal/xds/") {
			t.Errorf("the beacon binary links %s", pkg)
		}
	}
}
