package main

import (
	"os/exec"
	"strings"
	"testing"
)

// TestBinaryLinksNoTestCode: the shipped binary links neither the testing
// package nor the test helpers (internal/etcdtest, internal/testpeer):
// benchmarks start etcd through the server package, as `beacon serve`
// does.
func TestBinaryLinksNoTestCode(t *testing.T) {
	out, err := exec.Command("go", "list", "-deps", ".").Output()
	if err != nil {
		t.Fatalf("go list -deps: %v", err)
	}
	for _, pkg := range strings.Fields(string(out)) {
		if pkg == "testing" || strings.HasSuffix(pkg, "/internal/etcdtest") || strings.HasSuffix(pkg, "/internal/testpeer") {
			t.Errorf("the beacon binary links %s", pkg)
		}
	}
}
