package testpeer

import (
	"fmt"
	"testing"
)

// recorder is a testing.TB that records Skip and Fatal instead of ending
// the test.
type recorder struct {
	testing.TB
	skipped, failed string
}

func (r *recorder) Helper()           {}
func (r *recorder) Skip(args ...any)  { r.skipped = fmt.Sprint(args...) }
func (r *recorder) Fatal(args ...any) { r.failed = fmt.Sprint(args...) }

// TestMissing: a test that cannot run skips with the reason, or fails
// under BEACON_REQUIRE_PEERS; it never just passes.
func TestMissing(t *testing.T) {
	t.Setenv(RequireEnv, "")
	r := &recorder{TB: t}
	Missing(r, "not root")
	if r.skipped != "not root" || r.failed != "" {
		t.Fatalf("without %s: skipped %q, failed %q", RequireEnv, r.skipped, r.failed)
	}
	t.Setenv(RequireEnv, "1")
	r = &recorder{TB: t}
	Missing(r, "not root")
	if r.failed == "" || r.skipped != "" {
		t.Fatalf("with %s: skipped %q, failed %q", RequireEnv, r.skipped, r.failed)
	}
}
