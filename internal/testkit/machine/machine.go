// Package machine lets the tests that measure real processes against the
// clock take this machine to themselves.
//
// `go test ./...` runs two test binaries at once on two cores. A drill
// whose goal is a timing property of real etcd processes (a lease of 3 s
// survives a member's fault) cannot hold it while another package's
// benchmark scenario saturates both cores: etcd misses its heartbeats and
// elects, and the drill measures the machine instead of the code. Tests of
// that kind — the fault drills, and the benchmark scenarios that load the
// machine on purpose — call Exclusive first, and run one at a time across
// every test process on the machine. Everything else still runs beside
// them.
package machine

import (
	"os"
	"path/filepath"
	"testing"
	"time"
)

// lockName is the lock file, in the temporary directory every test process
// of this machine shares.
const lockName = "beacon-tests-exclusive.lock"

// Exclusive waits until no other test on this machine holds it, then holds
// it until t ends. It logs how long it waited, if at all; it fails t only
// if the lock file cannot be opened. Do not call it from a process a test
// holding it started (it would wait for its parent).
func Exclusive(t testing.TB) {
	t.Helper()
	path := filepath.Join(os.TempDir(), lockName)
	f, err := os.OpenFile(path, os.O_RDWR|os.O_CREATE, 0o666)
	if err != nil {
		t.Fatalf("machine: open %s: %v", path, err)
	}
	start := time.Now()
	if err := lock(f); err != nil {
		_ = f.Close()
		t.Fatalf("machine: lock %s: %v", path, err)
	}
	if waited := time.Since(start); waited > time.Second {
		t.Logf("machine: waited %v for another test that needs the machine to itself", waited.Round(time.Second))
	}
	t.Cleanup(func() { _ = f.Close() }) // closing the file releases the lock
}
