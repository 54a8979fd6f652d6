package registry_test

import (
	"context"
	"errors"
	"fmt"
	"slices"
	"sync/atomic"
	"testing"
	"time"

	"github.com/beaconplane/beacon/registry"
	"github.com/beaconplane/beacon/store/memory"
)

// driverRuns names each run's test driver apart: drivers register for the
// life of the process, and -count=2 runs a test twice in one.
var driverRuns atomic.Int64

// A registry driver registers itself by name and is opened by it, with
// its settings read through DriverConfig.Getenv.
func TestDrivers(t *testing.T) {
	var got registry.DriverConfig
	st := memory.New(memory.Config{})
	t.Cleanup(func() { _ = st.Close() })
	name := fmt.Sprintf("test-memory-%d", driverRuns.Add(1))
	registry.RegisterDriver(name, func(_ context.Context, dc registry.DriverConfig) (registry.Registry, error) {
		got = dc
		return registry.New(st, dc.Registry)
	})
	if !registry.HasDriver(name) || !slices.Contains(registry.Drivers(), name) {
		t.Fatalf("driver not listed: %v", registry.Drivers())
	}
	env := map[string]string{"X": "1"}
	r, err := registry.OpenDriver(context.Background(), name, registry.DriverConfig{
		Registry: registry.Config{DrainGrace: time.Second},
		Getenv:   func(k string) string { return env[k] },
	})
	if err != nil {
		t.Fatal(err)
	}
	defer r.Close()
	if got.Registry.DrainGrace != time.Second || got.Env()("X") != "1" {
		t.Fatalf("driver got %+v", got)
	}
	if (registry.DriverConfig{}).Env()("PATH") == "" {
		t.Error("a nil Getenv does not read the environment")
	}
	if _, err := registry.OpenDriver(context.Background(), "nope", registry.DriverConfig{}); !errors.Is(err, registry.ErrUnknownDriver) {
		t.Fatalf("OpenDriver of an unknown name: %v", err)
	}
	defer func() {
		if recover() == nil {
			t.Fatal("registering a name twice did not panic")
		}
	}()
	registry.RegisterDriver(name, func(context.Context, registry.DriverConfig) (registry.Registry, error) { return nil, nil })
}

func TestOptionAccessors(t *testing.T) {
	if d, ok := registry.DrainGraceOf(registry.DrainGrace(3 * time.Second)); !ok || d != 3*time.Second {
		t.Fatalf("DrainGraceOf = %v, %v", d, ok)
	}
	if _, ok := registry.DrainGraceOf(); ok {
		t.Fatal("DrainGraceOf with no option says set")
	}
	if rev := registry.FromRevisionOf(registry.FromRevision(42)); rev != 42 {
		t.Fatalf("FromRevisionOf = %d", rev)
	}
}
