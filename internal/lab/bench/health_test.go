package bench

import (
	"context"
	"testing"
	"time"

	"github.com/beaconplane/beacon"
	"github.com/beaconplane/beacon/internal/testkit/machine"
	"github.com/beaconplane/beacon/internal/testkit/testpeer"
)

// TestRunHealthSmall runs the health scenario at a small size with two
// beacon serve processes: every row is there; no instance is probed by
// both checkers (at most one probe per interval, jitter aside), before
// and after one is killed; every instance taken out and brought back; the
// killed checker's verdicts went with its lease.
func TestRunHealthSmall(t *testing.T) {
	if testing.Short() {
		t.Skip("builds beacon, starts two beacon serve processes")
	}
	machine.Exclusive(t)
	beaconBin := testpeer.GoBuild(t, "github.com/beaconplane/beacon/cmd/beacon")
	ctx, cancel := context.WithTimeout(context.Background(), 4*time.Minute)
	defer cancel()
	r, err := RunHealth(ctx, HealthConfig{BeaconCommand: []string{beaconBin}, Nodes: 2, Instances: 30, Trials: 2, Window: 3})
	if err != nil {
		t.Fatal(err)
	}
	seen := rowsByMetric(t, r,
		"probes per instance per interval, 2 nodes", "probes per instance per interval, 1 nodes",
		"NOT_SERVING → out of the registry's view, p99", "SERVING again → back in the view, p99",
		"checker killed → those instances marked failing again by the others",
	)
	for _, m := range []string{"probes per instance per interval, 2 nodes", "probes per instance per interval, 1 nodes"} {
		// Two checkers probing one instance would make about 2.
		if v := seen[m].Beacon; v <= 0 || v >= 1.5 {
			t.Errorf("%s: %v, want about 1", m, v)
		}
	}
}

// Bad sizes are refused before anything starts.
func TestHealthConfigValidate(t *testing.T) {
	cmd := []string{"beacon"}
	for _, c := range []HealthConfig{{}, {BeaconCommand: cmd, Instances: MaxHealthInstances + 1}, {BeaconCommand: cmd, Trials: -1},
		{BeaconCommand: cmd, Instances: 5, Trials: 5}, {BeaconCommand: cmd, Interval: time.Millisecond}} {
		if err := c.Validate(); err == nil {
			t.Errorf("%+v: accepted", c)
		}
	}
}

// The instances failed while a checker is killed are fewer than half of
// every checker's share, however skewed the shares: more would make the
// checker conclude that it is cut off and hold its verdicts back.
func TestPickFailingStaysUnderHalfOfEveryShare(t *testing.T) {
	for _, shares := range [][2]int{{15, 15}, {22, 8}, {27, 3}, {30, 0}} {
		st := map[string]beacon.Instance{}
		for i := range shares[0] + shares[1] {
			c := "node1"
			if i >= shares[0] {
				c = "node2"
			}
			st[targetService(i)] = beacon.Instance{Health: &beacon.Health{Status: beacon.HealthPassing, Checker: c}}
		}
		owned, taken := map[string]int{}, map[string]int{}
		for _, in := range st {
			owned[in.Health.Checker]++
		}
		picked := pickFailing(st, 2)
		for _, svc := range picked {
			taken[st[svc].Health.Checker]++
		}
		for c, n := range taken {
			if 2*n >= owned[c] {
				t.Errorf("shares %v: %d of %s's %d instances picked", shares, n, c, owned[c])
			}
		}
		if len(picked) == 0 || len(picked) > killedFailing {
			t.Errorf("shares %v: %d picked, want 1..%d", shares, len(picked), killedFailing)
		}
	}
}
