package main

import (
	"os/exec"
	"strings"
	"testing"
)

// TestBinaryLinksNoTestCode: the shipped binary links neither the testing
// package nor the test helpers (internal/testkit/...): benchmarks start
// etcd through the server package, as `beacon serve` does. Nor does it link
// grpc-go's xDS client (google.golang.org/grpc/xds, which the xDS tests use
// as a real client): serving xDS needs only the envoy API types.
func TestBinaryLinksNoTestCode(t *testing.T) {
	out, err := exec.Command("go", "list", "-deps", ".").Output()
	if err != nil {
		t.Fatalf("go list -deps: %v", err)
	}
	for _, pkg := range strings.Fields(string(out)) {
		if pkg == "testing" || strings.Contains(pkg, "/internal/testkit/") ||
			pkg == "google.golang.org/grpc/xds" || strings.HasPrefix(pkg, "google.golang.org/grpc/internal/xds/") {
			t.Errorf("the beacon binary links %s", pkg)
		}
	}
}

// TestLayout: the serving code (everything outside internal/lab and
// cmd/beacon) imports none of the tooling of `beacon bench`
// (internal/lab/...), and no production file imports a test helper
// (internal/testkit/...) — only _test.go files and the test helpers
// themselves do.
func TestLayout(t *testing.T) {
	out, err := exec.Command("go", "list", "-f", "{{.ImportPath}} {{join .Imports \" \"}}", "github.com/beaconplane/beacon/...").Output()
	if err != nil {
		t.Fatalf("go list: %v", err)
	}
	const mod = "github.com/beaconplane/beacon/"
	for line := range strings.Lines(string(out)) {
		fields := strings.Fields(line)
		pkg, imports := strings.TrimPrefix(fields[0], mod), fields[1:]
		for _, imp := range imports {
			imp, ok := strings.CutPrefix(imp, mod)
			if !ok {
				continue
			}
			tooling := strings.HasPrefix(pkg, "internal/lab/") || pkg == "cmd/beacon"
			switch {
			case strings.HasPrefix(imp, "internal/lab/") && !tooling && !strings.HasPrefix(pkg, "internal/testkit/"):
				t.Errorf("%s imports the bench tooling %s", pkg, imp)
			case strings.HasPrefix(imp, "internal/testkit/") && !strings.HasPrefix(pkg, "internal/testkit/"):
				t.Errorf("%s imports the test helper %s in a production file", pkg, imp)
			}
		}
	}
}
