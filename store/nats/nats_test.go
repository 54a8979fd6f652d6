package nats_test

import (
	"testing"
	"time"

	"github.com/beaconplane/beacon/internal/testkit/natstest"
	"github.com/beaconplane/beacon/store"
	bnats "github.com/beaconplane/beacon/store/nats"
	"github.com/beaconplane/beacon/store/storetest"
	"go.uber.org/goleak"
)

func TestMain(m *testing.M) {
	goleak.VerifyTestMain(m, natstest.LeakOptions()...)
}

func TestConformance(t *testing.T) {
	srv := natstest.Start(t, natstest.Options{})
	storetest.Run(t, func(tb testing.TB) store.Store {
		return natstest.Open(tb, bnats.Config{URL: srv.ClientURL()})
	}, storetest.Options{
		// The server expires TTLs on its own timer, up to about a second
		// late.
		ExpiryGrace: 3 * time.Second,
		LeakOptions: natstest.LeakOptions(),
	})
}

func BenchmarkNATS(b *testing.B) {
	srv := natstest.Start(b, natstest.Options{})
	storetest.Benchmark(b, func(tb testing.TB) store.Store { return natstest.Open(tb, bnats.Config{URL: srv.ClientURL()}) })
}
