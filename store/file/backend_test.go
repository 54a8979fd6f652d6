package file_test

import (
	"context"
	"strings"
	"testing"
	"time"

	"github.com/beaconplane/beacon/backend"
	"github.com/beaconplane/beacon/store/file"
)

// BEACON_DISCOVERY_BACKEND=file opens this store through backend.
func TestBackendFromEnv(t *testing.T) {
	ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
	defer cancel()
	t.Setenv(backend.EnvVar, backend.File)
	t.Setenv(file.EnvDir, t.TempDir())
	s, err := backend.Open(ctx, backend.FromEnv())
	if err != nil {
		t.Fatal(err)
	}
	defer s.Close()
	if _, ok := s.(*file.Store); !ok {
		t.Fatalf("backend %q opened a %T", backend.File, s)
	}
	if _, err := s.Put(ctx, "/k", []byte("v")); err != nil {
		t.Fatal(err)
	}
	t.Setenv(file.EnvHistory, "lots")
	if _, err := backend.Open(ctx, backend.FromEnv()); err == nil || !strings.Contains(err.Error(), file.EnvHistory) {
		t.Fatalf("bad %s: %v", file.EnvHistory, err)
	}
	t.Setenv(file.EnvDir, "")
	t.Setenv(file.EnvHistory, "")
	if _, err := backend.Open(ctx, backend.FromEnv()); err == nil || !strings.Contains(err.Error(), file.EnvDir) {
		t.Fatalf("no %s: %v", file.EnvDir, err)
	}
}
