package registry

import (
	"testing"
	"time"

	"github.com/beaconplane/beacon"
	"github.com/beaconplane/beacon/store"
)

// TestLeasedTrackerForgetsPassedDeadlinesUnscraped: the leases whose
// clients stopped heartbeating are forgotten as new ones are recorded,
// whether or not anyone scrapes the metric (a server whose clients crash
// and never come back must not keep an entry for each).
func TestLeasedTrackerForgetsPassedDeadlinesUnscraped(t *testing.T) {
	tr := newLeasedTracker(10 * time.Second)
	ref := beacon.Ref{Namespace: "ns", Component: "api", Endpoint: "http", ID: "gone"}
	tr.granted(1, time.Second)
	tr.registered(1, ref)
	tr.mu.Lock()
	tr.leases[1].deadline = time.Now().Add(-time.Second) // its client stopped
	tr.swept = time.Now().Add(-sweepEvery)
	tr.mu.Unlock()
	tr.granted(2, time.Second)
	tr.mu.Lock()
	defer tr.mu.Unlock()
	if _, ok := tr.leases[1]; ok || len(tr.byRef) != 0 {
		t.Fatalf("lease 1, past its deadline, still tracked after a sweep: %d leases, %d instances", len(tr.leases), len(tr.byRef))
	}
	if _, ok := tr.leases[2]; !ok {
		t.Fatal("the lease just granted is not tracked")
	}
}

// TestLeasedTrackerHeartbeatGivesTheLeaseTTL: an instance this registry
// did not register (a restarted server) has its calls bounded by its own
// lease's TTL once a heartbeat renewed it here, not by the fallback.
func TestLeasedTrackerHeartbeatGivesTheLeaseTTL(t *testing.T) {
	tr := newLeasedTracker(10 * time.Second)
	ref := beacon.Ref{Namespace: "ns", Component: "api", Endpoint: "http", ID: "a"}
	if got := tr.ttl(ref); got != 10*time.Second {
		t.Fatalf("ttl of an unknown instance = %v, want the fallback 10s", got)
	}
	tr.heartbeat(store.LeaseID(7), ref, 3*time.Second)
	if got := tr.ttl(ref); got != 3*time.Second {
		t.Fatalf("ttl after a heartbeat renewed its lease for 3s = %v", got)
	}
}
