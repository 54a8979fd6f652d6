package view

import (
	"sync"
	"sync/atomic"
	"testing"

	"github.com/beaconplane/beacon"
)

// memoRig is a view with two changes applied one at a time, and the
// versions before, between and after them.
func memoRig(t *testing.T) (v0, v1, v2 *Version, diff func(old, cur *Version) []beacon.Event) {
	t.Helper()
	v := New()
	v0 = v.Version()
	a := it("a", "1", 5)
	a.Inst.Metadata = map[string]string{"zone": "x"}
	v.Set(a, 5)
	v.SetRev(5)
	v1 = v.Version()
	v.Set(it("b", "2", 6), 6)
	v.SetRev(6)
	v2 = v.Version()
	diff = func(old, cur *Version) []beacon.Event {
		entries, ok := v.Since(old.Seq)
		if !ok {
			t.Fatal("log trimmed")
		}
		var in []Change
		for _, c := range entries {
			if c.Seq <= cur.Seq {
				in = append(in, c)
			}
		}
		return DiffLog(old, cur, in, nil)
	}
	return v0, v1, v2, diff
}

// TestMemoComputesOncePerPair: watchers asking for the same two versions
// at once share one computation, and each gets the same events.
func TestMemoComputesOncePerPair(t *testing.T) {
	v0, _, v2, diff := memoRig(t)
	var m Memo
	var computed atomic.Int32
	compute := func() []beacon.Event { computed.Add(1); return diff(v0, v2) }
	const watchers = 64
	got := make([][]beacon.Event, watchers)
	var wg sync.WaitGroup
	for i := range watchers {
		wg.Go(func() { got[i] = m.Events(v0, v2, compute) })
	}
	wg.Wait()
	if n := computed.Load(); n != 1 {
		t.Fatalf("computed %d times for one pair, want once", n)
	}
	for i, evs := range got {
		if len(evs) != 2 || evs[0].Instance.ID != "a" || evs[1].Instance.ID != "b" || evs[0].Type != beacon.Added {
			t.Fatalf("watcher %d got %+v, want a and b added", i, evs)
		}
	}
}

// TestMemoCopiesAreIndependent: each caller owns its events — changing one
// batch's slice or an instance's metadata changes no other caller's, nor
// what later callers get.
func TestMemoCopiesAreIndependent(t *testing.T) {
	v0, v1, _, diff := memoRig(t)
	var m Memo
	compute := func() []beacon.Event { return diff(v0, v1) }
	first := m.Events(v0, v1, compute)
	second := m.Events(v0, v1, compute)
	first[0].Instance.Metadata["zone"] = "changed"
	first[0].Instance.Address = "changed"
	first[0].Type = beacon.Removed
	third := m.Events(v0, v1, compute)
	for name, evs := range map[string][]beacon.Event{"second": second, "third": third} {
		e := evs[0]
		if e.Type != beacon.Added || e.Instance.Address != "1" || e.Instance.Metadata["zone"] != "x" {
			t.Fatalf("%s caller's event changed with the first's: %+v", name, e)
		}
	}
}

// TestMemoNewPairRecomputes: a pair other than the remembered one is
// computed (never answered with another pair's events), and becomes the
// one remembered.
func TestMemoNewPairRecomputes(t *testing.T) {
	v0, v1, v2, diff := memoRig(t)
	var m Memo
	var computed atomic.Int32
	ask := func(old, cur *Version) []beacon.Event {
		return m.Events(old, cur, func() []beacon.Event { computed.Add(1); return diff(old, cur) })
	}
	ask(v0, v1)
	if evs := ask(v1, v2); len(evs) != 1 || evs[0].Instance.ID != "b" {
		t.Fatalf("v1→v2 gave %+v, want b added alone", evs)
	}
	if evs := ask(v0, v2); len(evs) != 2 { // same cur, other old
		t.Fatalf("v0→v2 gave %+v, want a and b", evs)
	}
	ask(v0, v2)
	if n := computed.Load(); n != 3 {
		t.Fatalf("computed %d times for three pairs (the last asked twice), want 3", n)
	}
}
