package bench

import (
	"context"
	"testing"
	"time"

	"github.com/beaconplane/beacon/internal/testkit/machine"
	"github.com/beaconplane/beacon/internal/testkit/testpeer"
)

// TestRunXDSSmall runs the xds scenario at a small size, with beacon serve
// and the xDS client (xdsprobe) in processes of their own: every row is
// there, both clients reached the backends, every stream received every
// change, and each change was encoded once for all of them.
func TestRunXDSSmall(t *testing.T) {
	if testing.Short() {
		t.Skip("builds beacon and xdsprobe, starts beacon serve")
	}
	machine.Exclusive(t)
	beaconBin := testpeer.GoBuild(t, "github.com/beaconplane/beacon/cmd/beacon")
	probe := testpeer.GoBuild(t, "github.com/beaconplane/beacon/internal/lab/xdsprobe")
	ctx, cancel := context.WithTimeout(context.Background(), 3*time.Minute)
	defer cancel()
	r, err := RunXDS(ctx, XDSConfig{BeaconCommand: []string{beaconBin}, ProbeBin: probe, Trials: 3, Streams: 50, Changes: 3})
	if err != nil {
		t.Fatal(err)
	}
	seen := rowsByMetric(t, r,
		"register → first call to the new backend, p50", "drain → last call to the drained backend, p99",
		"one change → 50 ADS streams updated, p99", "assignments encoded per change (for all streams)",
		"beacon serve memory per idle ADS stream (heap + stacks)",
	)
	if row := seen["register → first call to the new backend, p50"]; row.Beacon <= 0 || row.Baseline <= 0 {
		t.Errorf("a client never reached a new backend: %+v", row)
	}
	if row := seen["assignments encoded per change (for all streams)"]; row.Beacon != 1 {
		t.Errorf("each change was encoded %v times for the streams, want once", row.Beacon)
	}
}

// Bad sizes are refused before anything starts.
func TestXDSConfigValidate(t *testing.T) {
	cmd := []string{"beacon"}
	for _, c := range []XDSConfig{{}, {BeaconCommand: cmd, Streams: MaxXDSStreams + 1}, {BeaconCommand: cmd, Trials: -1},
		{BeaconCommand: cmd, Pace: -time.Second}} {
		if err := c.Validate(); err == nil {
			t.Errorf("%+v: accepted", c)
		}
	}
	if err := (XDSConfig{BeaconCommand: cmd}).Validate(); err != nil {
		t.Error(err)
	}
}
