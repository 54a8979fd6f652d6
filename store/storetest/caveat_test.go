package storetest_test

import (
	"testing"

	"github.com/beaconplane/beacon/store"
	"github.com/beaconplane/beacon/store/memory"
	"github.com/beaconplane/beacon/store/storetest"
	"go.uber.org/goleak"
)

func TestMain(m *testing.M) { goleak.VerifyTestMain(m) }

// plain hides the optional capabilities of the store it wraps, as a
// backend without transactions or compaction would be.
type plain struct{ store.Store }

// A backend without the optional capabilities passes once it declares them
// as caveats: the suite reports the reasons instead of failing.
func TestCaveatsForMissingCapabilities(t *testing.T) {
	storetest.Run(t, func(testing.TB) store.Store { return plain{memory.New(memory.Config{})} }, storetest.Options{
		Caveats: map[string]string{
			"Txn/Atomic":      "this wrapper hides store.Transactor",
			"Watch/Compacted": "this wrapper hides store.Compactor",
		},
	})
}
