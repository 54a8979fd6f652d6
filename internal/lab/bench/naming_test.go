package bench

import (
	"context"
	"strings"
	"testing"
	"time"

	"github.com/beaconplane/beacon/internal/testkit/machine"
)

// TestNamingScenarioSmall runs the naming scenario with a few trials on an
// embedded etcd.
func TestNamingScenarioSmall(t *testing.T) {
	if testing.Short() {
		t.Skip("starts etcd and gRPC servers")
	}
	machine.Exclusive(t)
	ctx, cancel := context.WithTimeout(context.Background(), time.Minute)
	defer cancel()
	// A drained backend is stopped after DrainGrace: a generous one keeps
	// "0 failed calls" true on a slow, loaded machine (the resolvers drop
	// a backend within milliseconds; seconds only under extreme load).
	rep, err := RunNaming(ctx, NamingConfig{Backends: 2, Trials: 3, Callers: 2, Quiet: 50 * time.Millisecond, DrainGrace: time.Second})
	if err != nil {
		t.Fatal(err)
	}
	if len(rep.Rows) != 8 {
		t.Fatalf("%d rows: %+v", len(rep.Rows), rep.Rows)
	}
	for _, r := range rep.Rows {
		if strings.Contains(r.Metric, "drain first: failed calls") && (r.Beacon != 0 || r.Baseline != 0) {
			t.Errorf("%s: Beacon %v, etcd %v; want 0", r.Metric, r.Beacon, r.Baseline)
		}
		if strings.HasSuffix(r.Metric, "p50") && (r.Beacon > 1000 || r.Baseline > 1000) {
			t.Errorf("%s: Beacon %v ms, etcd %v ms", r.Metric, r.Beacon, r.Baseline)
		}
	}
}

func TestNamingConfigValidate(t *testing.T) {
	for _, c := range []NamingConfig{{Backends: -1}, {Backends: 1}, {Trials: -3}, {Callers: -1}, {Pace: -time.Millisecond}, {Quiet: -1}, {DrainGrace: -time.Second}} {
		if err := c.Validate(); err == nil {
			t.Errorf("%+v: no error", c)
		}
	}
	if err := (NamingConfig{}).Validate(); err != nil {
		t.Errorf("zero config: %v", err)
	}
}
