package backend_test

import (
	"os"
	"path/filepath"
	"regexp"
	"strings"
	"testing"

	"github.com/beaconplane/beacon/store/backend"
)

// TestDocsNameOnlyBackendsOfThisBuild: while the Kubernetes backend is not
// part of the build, no page (docs/, the README, a package comment) may
// offer it among the backends or speak of a Kubernetes registry, except to
// say it is not there. Kubernetes as a place Beacon's clients run (a
// CoreDNS stub domain, pods) is fine.
func TestDocsNameOnlyBackendsOfThisBuild(t *testing.T) {
	if backend.CheckName(backend.Kubernetes) == nil {
		t.Skip("the Kubernetes backend is part of this build")
	}
	claims := []*regexp.Regexp{
		regexp.MustCompile(`(?i)\b(etcd|memory|file|nats)\b[^.\n|]{0,30}\bkubernetes\b`), // a list of backends with it
		regexp.MustCompile(`(?i)\bkubernetes(-native)? (registry|backend)`),
		regexp.MustCompile(`registry/kube\b`),
	}
	allowed := regexp.MustCompile(`(?i)not part of this build|not started|reserved|refused`)
	var files []string
	for _, pattern := range []string{"../../*.md", "../../docs/*.md", "../../*/doc.go", "../../*/*/doc.go", "../../*/*/*/doc.go", "../../naming/*.go"} {
		m, err := filepath.Glob(pattern)
		if err != nil {
			t.Fatal(err)
		}
		files = append(files, m...)
	}
	if len(files) < 10 {
		t.Fatalf("only %d files to read", len(files))
	}
	for _, f := range files {
		if strings.HasSuffix(f, "_test.go") {
			continue
		}
		b, err := os.ReadFile(f)
		if err != nil {
			t.Fatal(err)
		}
		for i, line := range strings.Split(string(b), "\n") {
			if allowed.MatchString(line) {
				continue
			}
			for _, re := range claims {
				if re.MatchString(line) {
					t.Errorf("%s:%d offers a Kubernetes backend this build does not have: %s", strings.TrimPrefix(f, "../../"), i+1, strings.TrimSpace(line))
				}
			}
		}
	}
}
