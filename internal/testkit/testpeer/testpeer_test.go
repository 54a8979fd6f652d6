package testpeer

import (
	"fmt"
	"os"
	"runtime"
	"strconv"
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

// The build directory of a test process that has ended is removed by the
// next process's first build; a live process's is kept.
func TestSweepRemovesTheBuildDirsOfEndedProcesses(t *testing.T) {
	if runtime.GOOS == "windows" {
		t.Skip("no signal 0 to tell a live process")
	}
	ended := Command("true")
	if err := ended.Run(); err != nil {
		t.Skip("no true(1):", err)
	}
	dead, err := os.MkdirTemp("", buildDirPrefix+strconv.Itoa(ended.Process.Pid)+"-")
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { _ = os.RemoveAll(dead) })
	live, err := os.MkdirTemp("", buildDirPrefix+strconv.Itoa(os.Getppid())+"-")
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { _ = os.RemoveAll(live) })
	sweepBuildDirs()
	if _, err := os.Stat(dead); !os.IsNotExist(err) {
		t.Errorf("%s of an ended process: still there (%v)", dead, err)
	}
	if _, err := os.Stat(live); err != nil {
		t.Errorf("%s of a live process: %v", live, err)
	}
}
