package health

import (
	"context"
	"fmt"
	"log/slog"
	"sync/atomic"
	"testing"
	"time"

	"github.com/beaconplane/beacon"
	"github.com/beaconplane/beacon/registry"
	"github.com/prometheus/client_golang/prometheus"
	"github.com/prometheus/client_golang/prometheus/testutil"
)

// warnCounter is a slog handler that counts warnings.
type warnCounter struct{ n atomic.Int64 }

func (h *warnCounter) Enabled(context.Context, slog.Level) bool { return true }
func (h *warnCounter) Handle(_ context.Context, r slog.Record) error {
	if r.Level == slog.LevelWarn {
		h.n.Add(1)
	}
	return nil
}
func (h *warnCounter) WithAttrs([]slog.Attr) slog.Handler { return h }
func (h *warnCounter) WithGroup(string) slog.Handler      { return h }

// TestCutOffReason: when an assessment says the checker is cut off.
func TestCutOffReason(t *testing.T) {
	low := map[string]float64{"b": 0.1, "c": 0.49}
	for _, tc := range []struct {
		name string
		a    assessment
		cut  bool
	}{
		{"no peers: a checker alone cannot tell", assessment{owned: 5, failing: 5}, false},
		{"no peer answers", assessment{peers: 2}, true},
		{"far more failures than every peer", assessment{owned: 4, failing: 3, peers: 2, reached: true, shares: low, sharesKnown: true}, true},
		{"a peer fails as much: the instances' outage", assessment{owned: 4, failing: 3, peers: 2, reached: true, shares: map[string]float64{"b": 0.1, "c": 0.5}, sharesKnown: true}, false},
		{"half failing is not more than half", assessment{owned: 4, failing: 2, peers: 2, reached: true, shares: low, sharesKnown: true}, false},
		{"fewer than three instances", assessment{owned: 2, failing: 2, peers: 2, reached: true, shares: low, sharesKnown: true}, false},
		{"the peers' shares could not be read", assessment{owned: 4, failing: 4, peers: 2, reached: true}, false},
	} {
		if got := tc.a.cutOffReason() != ""; got != tc.cut {
			t.Errorf("%s: cut off %v, want %v (%q)", tc.name, got, tc.cut, tc.a.cutOffReason())
		}
	}
}

func newTestDetector(t *testing.T) (*cutoffDetector, *warnCounter) {
	t.Helper()
	h := &warnCounter{}
	log := slog.New(h)
	w := newVerdictWriter(&storeVerdicts{id: "a"}, registry.DefaultLeaseTTL, log)
	return &cutoffDetector{w: w, gauge: prometheus.NewGauge(prometheus.GaugeOpts{Name: "g", Help: "g"}), log: log}, h
}

var (
	unreachable = assessment{peers: 1}
	fine        = assessment{owned: 4, peers: 1, reached: true}
	// alone: 3 of 4 fail while the one peer's share is low.
	alone = assessment{owned: 4, failing: 3, peers: 1, reached: true, shares: map[string]float64{"b": 0}, sharesKnown: true}
	// together: 3 of 4 fail, and the peer fails as much.
	together = assessment{owned: 4, failing: 3, peers: 1, reached: true, shares: map[string]float64{"b": 1}, sharesKnown: true}
)

func noRecheck() {}

// rechecks counts the calls of its recheck.
type rechecks int

func (r *rechecks) recheck() { *r++ }

func decisive(a assessment) assessment {
	a.decisive = true
	return a
}

// heldFailing gives d's writer a lease and one owned instance whose
// failing verdict is not yet written.
func heldFailing(d *cutoffDetector) *slot {
	d.w.lease = 7
	s := &slot{owned: true, wantGen: 1, want: beacon.Health{Status: beacon.HealthFailing}}
	d.w.slots[testRef(0)] = s
	return s
}

// TestCutOffDoubtHolds: a connected checker most of whose instances fail
// for it holds their failing verdicts (doubtful) without concluding, until
// a decisive look (a Runner turned Failing, or the regular one) compares
// with its peers: failing alone, it is cut off.
func TestCutOffDoubtHolds(t *testing.T) {
	d, warns := newTestDetector(t)
	s := heldFailing(d)
	if got := d.observe(alone, noRecheck); got != doubtful {
		t.Fatalf("state %s when most fail, not decisive: want doubtful", got)
	}
	if o := d.w.nextLocked(s, time.Now()); o.kind != opNone || warns.n.Load() != 0 || testutil.ToFloat64(d.gauge) != 0 {
		t.Fatalf("doubtful: the failing verdict's next op is %d, %d warnings, gauge %v: want held, none, 0", o.kind, warns.n.Load(), testutil.ToFloat64(d.gauge))
	}
	if got := d.observe(decisive(alone), noRecheck); got != cutOff || warns.n.Load() != 1 {
		t.Fatalf("state %s, %d warnings on a decisive look failing alone: want cut off, 1", got, warns.n.Load())
	}
}

// TestCutOffDoubtConfirmed: a doubtful checker whose peer fails as much
// (the instances' outage) writes its failing verdicts as found at the
// decisive look, and stays confirmed — writing — while most still fail;
// once few fail it is connected.
func TestCutOffDoubtConfirmed(t *testing.T) {
	d, warns := newTestDetector(t)
	s := heldFailing(d)
	var r rechecks
	d.observe(together, r.recheck)
	if got := d.observe(decisive(together), r.recheck); got != confirmed || r != 0 {
		t.Fatalf("state %s, %d rechecks on a decisive look with a peer failing as much: want confirmed, none", got, r)
	}
	if o := d.w.nextLocked(s, time.Now()); o.kind != opPut || warns.n.Load() != 0 {
		t.Fatalf("confirmed: the failing verdict's next op is %d, %d warnings: want its write, none", o.kind, warns.n.Load())
	}
	if got := d.observe(together, noRecheck); got != confirmed || d.w.holding {
		t.Fatalf("state %s, holding %v on the next look: want confirmed, writing", got, d.w.holding)
	}
	if got := d.observe(fine, noRecheck); got != connected {
		t.Fatalf("state %s once few fail: want connected", got)
	}
}

// TestCutOffDoubtFades: a doubtful checker whose share of failures falls
// again checks the instances failing for it afresh (recheck), and writes
// failing verdicts again.
func TestCutOffDoubtFades(t *testing.T) {
	d, _ := newTestDetector(t)
	s := heldFailing(d)
	var r rechecks
	d.observe(alone, r.recheck)
	if got := d.observe(fine, r.recheck); got != connected || r != 1 {
		t.Fatalf("state %s, %d rechecks once few fail: want connected, 1", got, r)
	}
	if o := d.w.nextLocked(s, time.Now()); o.kind != opPut {
		t.Fatalf("released: the failing verdict's next op is %d, want its write", o.kind)
	}
}

// TestCutOffAloneHoldsNothing: a checker without peers, most of whose
// instances fail, holds nothing — it cannot be cut off, so holding would
// only delay its verdicts — and one left doubtful when its last peer
// goes writes what it held.
func TestCutOffAloneHoldsNothing(t *testing.T) {
	d, warns := newTestDetector(t)
	s := heldFailing(d)
	lonely := assessment{owned: 4, failing: 3}
	if got := d.observe(lonely, noRecheck); got != confirmed || d.w.holding {
		t.Fatalf("state %s, holding %v with no peers: want confirmed, writing", got, d.w.holding)
	}
	if o := d.w.nextLocked(s, time.Now()); o.kind != opPut {
		t.Fatalf("no peers: the failing verdict's next op is %d, want its write", o.kind)
	}
	if got := d.observe(decisive(lonely), noRecheck); got != confirmed || warns.n.Load() != 0 {
		t.Fatalf("state %s, %d warnings on a decisive look with no peers: want confirmed, none", got, warns.n.Load())
	}

	d, _ = newTestDetector(t)
	s = heldFailing(d)
	d.observe(alone, noRecheck)
	if got := d.observe(lonely, noRecheck); got != confirmed || d.w.holding {
		t.Fatalf("doubtful, then its peers gone: state %s, holding %v: want confirmed, writing", got, d.w.holding)
	}
	if o := d.w.nextLocked(s, time.Now()); o.kind != opPut {
		t.Fatalf("peers gone: the held failing verdict's next op is %d, want its write", o.kind)
	}
}

// TestSettleTimeIgnoresPassingInstances: a doubtful checker holds for the
// longest interval of the instances failing for it, not of every
// instance it owns (one team's slow check must not delay every other
// failure), and never longer than maxSettle.
func TestSettleTimeIgnoresPassingInstances(t *testing.T) {
	runner := func(iv time.Duration, failing bool) *running {
		return &running{target: target{check: beacon.Check{Kind: beacon.CheckTCP, Interval: iv}}, doubt: failing}
	}
	c := &Checker{runners: map[beacon.Ref]*running{
		testRef(0): runner(3*time.Minute, false),
		testRef(1): runner(time.Second, true),
		testRef(2): runner(2*time.Second, true),
	}}
	if got := c.settleTime(); got != 2*time.Second {
		t.Fatalf("settle %v with a passing 3m check and failing 1s and 2s ones: want 2s", got)
	}
	c.runners[testRef(3)] = runner(beacon.MaxCheckInterval, true)
	if got := c.settleTime(); got != maxSettle {
		t.Fatalf("settle %v with a failing %v check: want the cap %v", got, beacon.MaxCheckInterval, maxSettle)
	}
}

// TestCutOffEnter: connected → cut off: the gauge is 1, failing verdicts
// stop being written (and those written are withdrawn), and the checker
// warns once, however long it stays cut off.
func TestCutOffEnter(t *testing.T) {
	d, warns := newTestDetector(t)
	d.w.lease = 7
	ref := testRef(0)
	d.w.slots[ref] = &slot{owned: true, failing: true, under: 7, haveGen: 1, wantGen: 1,
		want: beacon.Health{Status: beacon.HealthFailing}}
	if got := d.observe(unreachable, noRecheck); got != cutOff {
		t.Fatalf("state %s after no peer answered, want cut off", got)
	}
	if g := testutil.ToFloat64(d.gauge); g != 1 || !d.w.holding || !d.w.slots[ref].withdraw {
		t.Fatalf("gauge %v, writer holding %v, withdraw %v", g, d.w.holding, d.w.slots[ref].withdraw)
	}
	if o := d.w.nextLocked(d.w.slots[ref], time.Now()); o.kind != opWithdraw {
		t.Fatalf("the failing verdict's next op is %d, want a withdrawal", o.kind)
	}
	d.observe(unreachable, noRecheck) // cut off stays cut off
	if warns.n.Load() != 1 {
		t.Fatalf("%d warnings, want 1", warns.n.Load())
	}
}

// TestCutOffRecover: cut off → connected: the gauge is 0 and the current
// failing verdicts are written again.
func TestCutOffRecover(t *testing.T) {
	d, _ := newTestDetector(t)
	d.w.lease = 7
	ref := testRef(0)
	d.w.slots[ref] = &slot{owned: true, wantGen: 1, want: beacon.Health{Status: beacon.HealthFailing}}
	d.observe(unreachable, noRecheck)
	if o := d.w.nextLocked(d.w.slots[ref], time.Now()); o.kind != opNone {
		t.Fatalf("a failing verdict is written while cut off (op %d)", o.kind)
	}
	var r rechecks
	if got := d.observe(fine, r.recheck); got != connected || r != 1 {
		t.Fatalf("state %s, %d rechecks once a peer answered: want connected, 1", got, r)
	}
	if g := testutil.ToFloat64(d.gauge); g != 0 || d.w.holding {
		t.Fatalf("gauge %v, writer holding %v", g, d.w.holding)
	}
	if o := d.w.nextLocked(d.w.slots[ref], time.Now()); o.kind != opPut || o.h.Status != beacon.HealthFailing {
		t.Fatalf("after recovery the failing verdict's next op is %+v, want its write", o)
	}
}

// TestCutOffStaysConnected: an assessment without reason changes nothing.
func TestCutOffStaysConnected(t *testing.T) {
	d, warns := newTestDetector(t)
	if got := d.observe(fine, noRecheck); got != connected || d.w.holding || warns.n.Load() != 0 || testutil.ToFloat64(d.gauge) != 0 {
		t.Fatalf("state %s, writer holding %v, %d warnings", got, d.w.holding, warns.n.Load())
	}
}

// TestPeerShares: a peer's failing share counts the failing verdicts it
// wrote on the instances it owns, over those instances; a verdict another
// checker wrote (left from a handover) does not count.
func TestPeerShares(t *testing.T) {
	tcp := &beacon.Check{Kind: beacon.CheckTCP}
	f := fleetOf([]string{"a", "b", "c"}, 30, tcp)
	var updates []beacon.Event // the verdicts, as the registry's view joins them
	owned := map[string]int{}
	failingB := 0
	for i := range 30 {
		o := f.owner(testRef(i))
		owned[o]++
		in := checkedInstance(i, tcp)
		switch {
		case o == "b" && failingB < 2:
			failingB++
			in.Health = &beacon.Health{Status: beacon.HealthFailing, Checker: "b"}
		case o == "c":
			in.Health = &beacon.Health{Status: beacon.HealthFailing, Checker: "a"} // not c's
		default:
			continue
		}
		updates = append(updates, beacon.Event{Type: beacon.Updated, Instance: in})
	}
	f.apply(registry.Batch{Kind: registry.Changes, Events: updates})
	got := peerShares(f)
	if len(got) != 2 || got["b"] != float64(2)/float64(owned["b"]) || got["c"] != 0 {
		t.Fatalf("shares %v, want b %v and c 0 (owned %v)", got, float64(2)/float64(owned["b"]), owned)
	}
}

// TestPeerSuspect: a peer whose registration says that most of its
// instances fail for it (CheckerSuspectMetadata) counts as failing all of
// its own; the flag changes no owner (no re-share), but is noticed.
func TestPeerSuspect(t *testing.T) {
	f := fleetOf([]string{"a", "b"}, 10, &beacon.Check{Kind: beacon.CheckTCP})
	f.suspectsChanged = false
	b := checkerInstance("b", "127.0.0.1:2")
	b.Metadata[CheckerSuspectMetadata] = "true"
	_, members := f.apply(registry.Batch{Kind: registry.Changes, Events: []beacon.Event{{Type: beacon.Updated, Instance: b}}})
	if members || !f.suspectsChanged {
		t.Fatalf("b turned suspect: members changed %v (want false), suspects changed %v (want true)", members, f.suspectsChanged)
	}
	if got := peerShares(f); got["b"] != 1 {
		t.Fatalf("shares %v, want b 1 (suspect, no failing verdict written)", got)
	}
}

// fleetOf is the fleet of checker ids[0] after a snapshot of the checkers
// ids (checker i at 127.0.0.1:i+1) and n instances checked with c.
func fleetOf(ids []string, n int, c *beacon.Check) *fleet {
	f := newFleet(ids[0])
	var events []beacon.Event
	for i, id := range ids {
		events = append(events, beacon.Event{Type: beacon.Added, Instance: checkerInstance(id, fmt.Sprintf("127.0.0.1:%d", i+1))})
	}
	for i := range n {
		events = append(events, beacon.Event{Type: beacon.Added, Instance: checkedInstance(i, c)})
	}
	f.apply(registry.Batch{Kind: registry.Snapshot, Events: events})
	return f
}
