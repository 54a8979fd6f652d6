package natstest

import (
	"context"
	"errors"
	"testing"
	"time"

	"github.com/beaconplane/beacon/internal/wait"
	"github.com/beaconplane/beacon/store"
	bnats "github.com/beaconplane/beacon/store/nats"
)

// Open opens a store with cfg and closes it when the test ends. It keeps
// trying for up to 20 s while the store says the server is unavailable:
// under the race detector on a loaded machine JetStream's first answer
// came after the store's 5 s request timeout (CI, 2026-12-02), a server
// not yet ready rather than a store that failed.
func Open(tb testing.TB, cfg bnats.Config) *bnats.Store {
	tb.Helper()
	ctx, cancel := context.WithTimeout(context.Background(), 20*time.Second)
	defer cancel()
	for {
		s, err := bnats.Open(ctx, cfg)
		if err == nil {
			tb.Cleanup(func() { _ = s.Close() })
			return s
		}
		if !errors.Is(err, store.ErrUnavailable) || !wait.Sleep(ctx, 200*time.Millisecond) {
			tb.Fatalf("open the NATS store: %v", err)
		}
		tb.Logf("the NATS store is not ready yet; trying again: %v", err)
	}
}
