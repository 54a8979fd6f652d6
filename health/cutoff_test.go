package health

import (
	"context"
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
)

// TestCutOffEnter: connected → cut off: the gauge is 1, failing verdicts
// stop being written (and those written are withdrawn), and the checker
// warns once, however long it stays cut off.
func TestCutOffEnter(t *testing.T) {
	d, warns := newTestDetector(t)
	d.w.lease = 7
	ref := testRef(0)
	d.w.slots[ref] = &slot{owned: true, failing: true, under: 7, haveGen: 1, wantGen: 1,
		want: beacon.Health{Status: beacon.HealthFailing}}
	if got := d.observe(unreachable); got != cutOff {
		t.Fatalf("state %s after no peer answered, want cut off", got)
	}
	if g := testutil.ToFloat64(d.gauge); g != 1 || !d.w.cutOff || !d.w.slots[ref].withdraw {
		t.Fatalf("gauge %v, writer cut off %v, withdraw %v", g, d.w.cutOff, d.w.slots[ref].withdraw)
	}
	if o := d.w.nextLocked(d.w.slots[ref], time.Now()); o.kind != opWithdraw {
		t.Fatalf("the failing verdict's next op is %d, want a withdrawal", o.kind)
	}
	d.observe(unreachable) // cut off stays cut off
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
	d.observe(unreachable)
	if o := d.w.nextLocked(d.w.slots[ref], time.Now()); o.kind != opNone {
		t.Fatalf("a failing verdict is written while cut off (op %d)", o.kind)
	}
	if got := d.observe(fine); got != connected {
		t.Fatalf("state %s once a peer answered, want connected", got)
	}
	if g := testutil.ToFloat64(d.gauge); g != 0 || d.w.cutOff {
		t.Fatalf("gauge %v, writer cut off %v", g, d.w.cutOff)
	}
	if o := d.w.nextLocked(d.w.slots[ref], time.Now()); o.kind != opPut || o.h.Status != beacon.HealthFailing {
		t.Fatalf("after recovery the failing verdict's next op is %+v, want its write", o)
	}
}

// TestCutOffStaysConnected: an assessment without reason changes nothing.
func TestCutOffStaysConnected(t *testing.T) {
	d, warns := newTestDetector(t)
	if got := d.observe(fine); got != connected || d.w.cutOff || warns.n.Load() != 0 || testutil.ToFloat64(d.gauge) != 0 {
		t.Fatalf("state %s, writer cut off %v, %d warnings", got, d.w.cutOff, warns.n.Load())
	}
}

// TestPeerShares: a peer's failing share counts the failing verdicts it
// wrote on the instances it owns, over those instances; a verdict another
// checker wrote (left from a handover) does not count.
func TestPeerShares(t *testing.T) {
	tcp := &beacon.Check{Kind: beacon.CheckTCP}
	f := newFleet("a")
	events := []beacon.Event{
		{Type: beacon.Added, Instance: checkerInstance("a", "127.0.0.1:1")},
		{Type: beacon.Added, Instance: checkerInstance("b", "127.0.0.1:2")},
		{Type: beacon.Added, Instance: checkerInstance("c", "127.0.0.1:3")},
	}
	for i := range 30 {
		events = append(events, beacon.Event{Type: beacon.Added, Instance: checkedInstance(i, tcp)})
	}
	f.apply(registry.Batch{Kind: registry.Snapshot, Events: events})
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
