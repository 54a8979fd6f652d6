package health

import (
	"fmt"
	"slices"
	"testing"

	"github.com/beaconplane/beacon"
	"github.com/beaconplane/beacon/registry"
)

func testRef(i int) beacon.Ref {
	return beacon.Ref{Namespace: "prod", Component: "api", Endpoint: "grpc", ID: fmt.Sprintf("%016x", i+1)}
}

// TestScoreIsStable: every checker of a cluster must compute the same
// owner, also across versions during a rolling upgrade: the rendezvous
// weight is pinned (computed apart: FNV-1a 64 of
// "prod/api/grpc/0000000000000001\x00node-a", then SplitMix64's
// finaliser).
func TestScoreIsStable(t *testing.T) {
	if got := score(testRef(0), "node-a"); got != 0x6542186a9a1c85a6 {
		t.Fatalf("score = %#x: the rendezvous weight changed, and checkers of two versions would disagree on owners", got)
	}
}

// TestOwnerSharesEvenly: three checkers own about a third each, whatever
// the order their IDs come in.
func TestOwnerSharesEvenly(t *testing.T) {
	ids := []string{"a", "b", "c"}
	counts := map[string]int{}
	for i := range 3000 {
		o := owner(testRef(i), ids)
		if o2 := owner(testRef(i), []string{"c", "a", "b"}); o2 != o {
			t.Fatalf("instance %d: owner %s or %s depending on the order of the IDs", i, o, o2)
		}
		counts[o]++
	}
	for _, id := range ids {
		if counts[id] < 850 || counts[id] > 1150 {
			t.Errorf("checker %s owns %d of 3000 instances, want about 1000 (%v)", id, counts[id], counts)
		}
	}
	if owner(testRef(0), nil) != "" {
		t.Error("an instance has an owner among no checkers")
	}
}

// TestOwnerMovesOnlyWhatChanges: a checker that leaves hands over only its
// own instances; one that joins takes only instances it wins.
func TestOwnerMovesOnlyWhatChanges(t *testing.T) {
	three, two := []string{"a", "b", "c"}, []string{"a", "b"}
	for i := range 1000 {
		before, after := owner(testRef(i), three), owner(testRef(i), two)
		if before != "c" && before != after {
			t.Fatalf("instance %d moved from %s to %s when c left", i, before, after)
		}
		if before != "c" && after != before || before == "c" && after == "c" {
			t.Fatalf("instance %d: owner %s with c, %s without", i, before, after)
		}
	}
}

// TestCheckerRef: a checker registers as beacon/health/checker/<16 hex
// digits from its ID>, a valid instance name, the same for the same ID.
func TestCheckerRef(t *testing.T) {
	a, b := CheckerRef("node-a"), CheckerRef("node-b")
	if err := a.Validate(); err != nil {
		t.Fatal(err)
	}
	if a != CheckerRef("node-a") || a == b {
		t.Fatalf("CheckerRef(node-a) = %s, CheckerRef(node-b) = %s", a, b)
	}
	if !CheckersQuery.Matches(a) {
		t.Fatalf("CheckersQuery %s does not select %s", CheckersQuery, a)
	}
}

// TestProbeAddress: host:port is probed as it is; a URL at its host and
// port, the scheme's port for http and https.
func TestProbeAddress(t *testing.T) {
	for in, want := range map[string]string{
		"10.0.0.1:8080":              "10.0.0.1:8080",
		"[::1]:80":                   "[::1]:80",
		"nats://nats.local:4222/sub": "nats.local:4222",
		"http://web.local/x":         "web.local:80",
		"https://[::1]/x":            "[::1]:443",
		"nats://nats.local/sub":      "nats.local",
	} {
		if got := probeAddress(in); got != want {
			t.Errorf("probeAddress(%q) = %q, want %q", in, got, want)
		}
	}
}

func checkerInstance(id, addr string) beacon.Instance {
	ref := CheckerRef(id)
	return beacon.Instance{Namespace: ref.Namespace, Component: ref.Component, Endpoint: ref.Endpoint, ID: ref.ID,
		Address: addr, Metadata: map[string]string{CheckerIDMetadata: id}}
}

func checkedInstance(i int, c *beacon.Check) beacon.Instance {
	r := testRef(i)
	return beacon.Instance{Namespace: r.Namespace, Component: r.Component, Endpoint: r.Endpoint, ID: r.ID,
		Address: fmt.Sprintf("10.0.0.%d:80", i+1), Check: c}
}

// TestFleetApply: the watch's batches make the fleet: checkers from their
// registrations (with an ID in their metadata), checked instances from
// those that declare a check; a snapshot replaces everything.
func TestFleetApply(t *testing.T) {
	tcp := &beacon.Check{Kind: beacon.CheckTCP}
	f := newFleet("a")
	touched, members := f.apply(registry.Batch{Kind: registry.Snapshot, Events: []beacon.Event{
		{Type: beacon.Added, Instance: checkerInstance("a", "127.0.0.1:1")},
		{Type: beacon.Added, Instance: checkerInstance("b", "127.0.0.1:2")},
		{Type: beacon.Added, Instance: checkedInstance(0, tcp)},
		{Type: beacon.Added, Instance: checkedInstance(1, nil)},
	}})
	if !members || !slices.Equal(f.ids, []string{"a", "b"}) || len(touched) != 1 || touched[0] != testRef(0) {
		t.Fatalf("after the snapshot: ids %v, touched %v, members changed %v", f.ids, touched, members)
	}
	if _, owns := f.owned(testRef(0)); f.live() || owns {
		t.Fatal("live, and owning instances, before its own registration succeeded")
	}
	f.registered = true
	if !f.live() || len(f.peers()) != 1 || f.peers()[0].id != "b" {
		t.Fatalf("live %v, peers %v", f.live(), f.peers())
	}
	// The check goes: the instance is touched and no longer checked; a
	// registration without an ID is no checker.
	bad := checkerInstance("c", "127.0.0.1:3")
	bad.Metadata = nil
	touched, members = f.apply(registry.Batch{Kind: registry.Changes, Events: []beacon.Event{
		{Type: beacon.Updated, Instance: checkedInstance(0, nil)},
		{Type: beacon.Added, Instance: bad},
	}})
	if members || len(touched) != 1 || len(f.checked) != 0 {
		t.Fatalf("touched %v, members changed %v, checked %v", touched, members, f.checked)
	}
	touched, members = f.apply(registry.Batch{Kind: registry.Changes, Events: []beacon.Event{
		{Type: beacon.Removed, Instance: checkerInstance("b", "127.0.0.1:2")},
		{Type: beacon.Updated, Instance: checkedInstance(1, tcp)},
	}})
	if !members || !slices.Equal(f.ids, []string{"a"}) || len(touched) != 1 {
		t.Fatalf("ids %v, touched %v, members changed %v", f.ids, touched, members)
	}
	if _, ok := f.owned(testRef(1)); !ok {
		t.Fatal("the only live checker does not own a checked instance")
	}
	// A snapshot replaces everything: what it lacks is gone.
	touched, members = f.apply(registry.Batch{Kind: registry.Snapshot, Events: []beacon.Event{
		{Type: beacon.Added, Instance: checkerInstance("b", "127.0.0.1:2")},
	}})
	if !members || !slices.Equal(f.ids, []string{"b"}) || len(f.checked) != 0 || len(touched) != 1 || touched[0] != testRef(1) {
		t.Fatalf("after a second snapshot: ids %v, checked %v, touched %v", f.ids, f.checked, touched)
	}
}
