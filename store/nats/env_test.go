package nats_test

import (
	"strings"
	"testing"
	"time"

	"github.com/beaconplane/beacon/backend"
	"github.com/beaconplane/beacon/internal/testkit/natstest"
	bnats "github.com/beaconplane/beacon/store/nats"
)

// BEACON_DISCOVERY_BACKEND=nats opens this store through backend,
// configured from NATS_URL and the BEACON_NATS_* variables.
func TestBackendFromEnv(t *testing.T) {
	srv := natstest.Start(t, natstest.Options{User: "u", Password: "p"})
	ctx := ctxT(t, 10*time.Second)
	t.Setenv(backend.EnvVar, backend.NATS)
	t.Setenv(bnats.EnvURL, srv.ClientURL())
	t.Setenv(bnats.EnvUser, "u")
	t.Setenv(bnats.EnvPassword, "p")
	t.Setenv(bnats.EnvBucket, "from-env")
	s, err := backend.Open(ctx, backend.FromEnv())
	if err != nil {
		t.Fatal(err)
	}
	defer s.Close()
	if _, ok := s.(*bnats.Store); !ok {
		t.Fatalf("backend %q opened a %T", backend.NATS, s)
	}
	if _, err := s.Put(ctx, "/k", []byte("v")); err != nil {
		t.Fatal(err)
	}
	t.Setenv(bnats.EnvReplicas, "x")
	if _, err := backend.Open(ctx, backend.FromEnv()); err == nil || !strings.Contains(err.Error(), bnats.EnvReplicas) {
		t.Fatalf("bad %s: %v", bnats.EnvReplicas, err)
	}
}
