package main

import (
	"go/ast"
	"go/parser"
	"go/token"
	"io/fs"
	"path/filepath"
	"strings"
	"testing"

	"github.com/beaconplane/beacon/internal/testkit/testpeer"
)

// TestBinaryLinksNoTestCode: the shipped binary links neither the testing
// package nor the test helpers (internal/testkit/...): benchmarks start
// etcd through the server package, as `beacon serve` does. Nor does it link
// grpc-go's xDS client (google.golang.org/grpc/xds, which the xDS tests use
// as a real client): serving xDS needs only the envoy API types.
func TestBinaryLinksNoTestCode(t *testing.T) {
	out, err := testpeer.Command("go", "list", "-deps", ".").Output()
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
	out, err := testpeer.Command("go", "list", "-f", "{{.ImportPath}} {{join .Imports \" \"}}", "github.com/beaconplane/beacon/...").Output()
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

// TestTestsStartProcessesThroughTestpeer: every process a test or a test
// helper starts is made by testpeer.Command (or CommandContext), which
// makes it die with the test process, so a test binary that is killed (a
// timeout, CI's end) leaves no etcd, nats-server or beacon running; and no
// test replaces the SysProcAttr that carries that, it sets its fields.
// (internal/lab's benchmarks and drills start theirs with the same signal
// themselves: they run as `beacon bench`, without testpeer.)
func TestTestsStartProcessesThroughTestpeer(t *testing.T) {
	root, err := filepath.Abs(filepath.Join("..", ".."))
	if err != nil {
		t.Fatal(err)
	}
	fset := token.NewFileSet()
	err = filepath.WalkDir(root, func(path string, d fs.DirEntry, err error) error {
		if err != nil {
			return err
		}
		rel, _ := filepath.Rel(root, path)
		if d.IsDir() {
			if rel != "." && (strings.HasPrefix(d.Name(), ".") || d.Name() == "testdata" || d.Name() == "node_modules") {
				return filepath.SkipDir
			}
			return nil
		}
		testCode := strings.HasSuffix(rel, "_test.go") ||
			strings.HasPrefix(rel, "internal/testkit/") && strings.HasSuffix(rel, ".go")
		if !testCode || rel == "internal/testkit/testpeer/command.go" {
			return nil
		}
		f, err := parser.ParseFile(fset, path, nil, parser.SkipObjectResolution)
		if err != nil {
			return err
		}
		for _, bad := range unboundSpawns(f) {
			t.Errorf("%s:%d: %s", rel, fset.Position(bad.Pos()).Line, describeSpawn(bad))
		}
		return nil
	})
	if err != nil {
		t.Fatal(err)
	}
}

// unboundSpawns returns the calls of os/exec's Command or CommandContext
// in f, and the assignments that replace a SysProcAttr.
func unboundSpawns(f *ast.File) []ast.Node {
	execName := ""
	for _, imp := range f.Imports {
		if imp.Path.Value == `"os/exec"` {
			execName = "exec"
			if imp.Name != nil {
				execName = imp.Name.Name
			}
		}
	}
	var bad []ast.Node
	ast.Inspect(f, func(n ast.Node) bool {
		switch n := n.(type) {
		case *ast.SelectorExpr:
			if id, ok := n.X.(*ast.Ident); ok && execName != "" && id.Name == execName &&
				(n.Sel.Name == "Command" || n.Sel.Name == "CommandContext") {
				bad = append(bad, n)
			}
		case *ast.AssignStmt:
			for _, lhs := range n.Lhs {
				if sel, ok := lhs.(*ast.SelectorExpr); ok && sel.Sel.Name == "SysProcAttr" {
					bad = append(bad, n)
				}
			}
		}
		return true
	})
	return bad
}

func describeSpawn(n ast.Node) string {
	if sel, ok := n.(*ast.SelectorExpr); ok {
		return "exec." + sel.Sel.Name + " starts a process that outlives a killed test binary: use testpeer." + sel.Sel.Name
	}
	return "replacing SysProcAttr drops testpeer.Command's parent-death signal: set its fields instead"
}
