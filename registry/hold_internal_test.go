package registry

import (
	"fmt"
	"slices"
	"strings"
	"testing"
	"time"

	"github.com/beaconplane/beacon"
	"github.com/beaconplane/beacon/store"
)

// TestRegistrantHold: the hold a registrant's lease TTL allows is what a
// session with that TTL takes to write its instances again after losing
// its lease, and never more than the TTL + 1 s.
func TestRegistrantHold(t *testing.T) {
	s := time.Second
	for _, c := range []struct{ ttl, want time.Duration }{
		{0, 0},
		{1 * s, 2 * s},                // 1/3 s + 1 s + 1 s, capped at TTL + 1 s
		{2 * s, 2*s/3 + 2*s},          // 2/3 s + 1 s + 1 s
		{3 * s, 3 * s},                // 1 s + 1 s + 1 s
		{10 * s, 10*s/3 + 10*s/3 + s}, // 7.67 s
		{60 * s, 20*s + 5*s + s},      // the recovery call's bound is 5 s at most
		{store.MaxLeaseTTL, store.MaxLeaseTTL/3 + 6*s}, // far below TTL + 1 s
	} {
		got := registrantHold(c.ttl)
		if got != c.want {
			t.Errorf("registrantHold(%v) = %v, want %v", c.ttl, got, c.want)
		}
		if c.ttl > 0 && got > c.ttl+s {
			t.Errorf("registrantHold(%v) = %v, more than TTL + 1 s", c.ttl, got)
		}
	}
}

// holdStep is one thing that happens to a feed's holds, at a time after
// the test's start.
type holdStep struct {
	at  time.Duration
	op  string // "remove", "drain" (removal of a draining instance), "rewrite", "back" (store back from an outage)
	key string
	ttl time.Duration // the lease TTL the removed instance's value declares
	who int64         // its lease (0: none, then the revision counts)
	rev int64
}

// TestHoldTable: removals at these times, of instances whose values
// declare these lease TTLs, are delivered at these times — with the
// holds' own clock (each call is given the time), so that the bounds are
// exact. The watcher's settings (its limit) never lengthen a hold: a
// registrant's removal is held at most registrantHold(its TTL) after it
// was seen, whatever the watcher's own TTL.
func TestHoldTable(t *testing.T) {
	ms := time.Millisecond
	s := time.Second
	// A fleet of n registrants with lease TTL ttl, each on its own lease,
	// removed from start on, gap apart.
	fleet := func(n int, prefix string, ttl, start, gap time.Duration) []holdStep {
		var out []holdStep
		for i := range n {
			out = append(out, holdStep{at: start + time.Duration(i)*gap, op: "remove", key: fmt.Sprintf("%s%d", prefix, i),
				ttl: ttl, who: int64(prefix[0])*1000 + int64(i) + 1})
		}
		return out
	}
	draining := func(steps []holdStep) []holdStep {
		for i := range steps {
			steps[i].op = "drain"
		}
		return steps
	}
	deliveredAt := func(d time.Duration, keys ...string) map[string]time.Duration {
		out := map[string]time.Duration{}
		for _, k := range keys {
			out[k] = d
		}
		return out
	}
	keys := func(prefix string, n int) []string {
		var out []string
		for i := range n {
			out = append(out, fmt.Sprintf("%s%d", prefix, i))
		}
		return out
	}
	merge := func(ms ...map[string]time.Duration) map[string]time.Duration {
		out := map[string]time.Duration{}
		for _, m := range ms {
			for k, v := range m {
				out[k] = v
			}
		}
		return out
	}
	cases := []struct {
		name  string
		limit time.Duration // Config.RemovalHold
		steps []holdStep
		want  map[string]time.Duration // key → when it is delivered; absent: never
	}{
		{
			name:  "one serving removal waits the coalescing only",
			steps: []holdStep{{at: 0, op: "remove", key: "a", ttl: 3 * s, who: 1}},
			want:  map[string]time.Duration{"a": 50 * ms},
		},
		{
			name:  "a draining instance's removal is delivered at once",
			steps: []holdStep{{at: 0, op: "drain", key: "a", ttl: 3 * s, who: 1}},
			want:  map[string]time.Duration{"a": 0},
		},
		{
			// The promise the package doc makes: removals of draining
			// instances are delivered at once — also while a burst or
			// an outage holds every serving removal back — and count
			// towards no burst (a fleet draining on purpose is no
			// mass lease loss).
			name:  "a draining instance's removal is delivered at once in a burst",
			steps: append(fleet(5, "r", 3*s, 0, 0), holdStep{at: 10 * ms, op: "drain", key: "d", ttl: 3 * s, who: 99}),
			want:  merge(deliveredAt(3*s, keys("r", 5)...), deliveredAt(10*ms, "d")),
		},
		{
			name: "a draining instance's removal is delivered at once after an outage",
			steps: []holdStep{
				{at: 0, op: "back"},
				{at: 100 * ms, op: "drain", key: "d", ttl: 3 * s, who: 1},
				{at: 100 * ms, op: "remove", key: "a", ttl: 3 * s, who: 2},
			},
			want: map[string]time.Duration{"d": 100 * ms, "a": 100*ms + 3*s},
		},
		{
			name:  "draining removals make no burst",
			steps: append(draining(fleet(3, "d", 3*s, 0, 0)), fleet(4, "f", 3*s, 10*ms, 0)...),
			want:  merge(deliveredAt(60*ms, keys("f", 4)...), deliveredAt(0, keys("d", 3)...)),
		},
		{
			name:  "a value that declares no TTL is not held",
			steps: fleet(6, "n", 0, 0, 0),
			want:  deliveredAt(0, keys("n", 6)...),
		},
		{
			name:  "four leases at once are no burst",
			steps: fleet(4, "f", 3*s, 0, 10*ms),
			want:  map[string]time.Duration{"f0": 50 * ms, "f1": 60 * ms, "f2": 70 * ms, "f3": 80 * ms},
		},
		{
			name:  "five registrants at TTL 3 s dying together: held 3 s each from its own removal",
			steps: fleet(5, "r", 3*s, 0, 10*ms),
			want:  map[string]time.Duration{"r0": 3 * s, "r1": 3*s + 10*ms, "r2": 3*s + 20*ms, "r3": 3*s + 30*ms, "r4": 3*s + 40*ms},
		},
		{
			name:  "the watcher's limit shortens holds",
			limit: time.Second,
			steps: fleet(5, "r", 3*s, 0, 0),
			want:  deliveredAt(s, keys("r", 5)...),
		},
		{
			name:  "a limit longer than the registrants allow lengthens nothing",
			limit: time.Hour,
			steps: fleet(5, "r", 3*s, 0, 0),
			want:  deliveredAt(3*s, keys("r", 5)...),
		},
		{
			name:  "registrants of different TTLs in one burst: each held by its own",
			steps: append(fleet(3, "a", 2*s, 0, 0), fleet(3, "b", 10*s, 0, 0)...),
			want:  merge(deliveredAt(2*s/3+2*s, keys("a", 3)...), deliveredAt(10*s/3+10*s/3+s, keys("b", 3)...)),
		},
		{
			name: "the lease's own keys share its fate: one lease is one registrant",
			steps: []holdStep{
				{at: 0, op: "remove", key: "x0", ttl: 3 * s, who: 7}, {at: 0, op: "remove", key: "x1", ttl: 3 * s, who: 7},
				{at: 0, op: "remove", key: "x2", ttl: 3 * s, who: 7}, {at: 0, op: "remove", key: "x3", ttl: 3 * s, who: 7},
				{at: 0, op: "remove", key: "x4", ttl: 3 * s, who: 7}, {at: 0, op: "remove", key: "x5", ttl: 3 * s, who: 7},
			},
			want: deliveredAt(50*ms, keys("x", 6)...),
		},
		{
			name: "a re-registration during the hold cancels the removal",
			steps: append(fleet(5, "r", 3*s, 0, 0),
				holdStep{at: 1200 * ms, op: "rewrite", key: "r0"}, holdStep{at: 2 * s, op: "rewrite", key: "r1"}),
			want: deliveredAt(3*s, "r2", "r3", "r4"),
		},
		{
			name: "removals just after the store came back are held by their own TTLs",
			steps: []holdStep{
				{at: 0, op: "back"},
				{at: 100 * ms, op: "remove", key: "a", ttl: 2 * s, who: 1},
				{at: 100 * ms, op: "remove", key: "b", ttl: 10 * s, who: 2},
			},
			want: map[string]time.Duration{"a": 100*ms + 2*s/3 + 2*s, "b": 100*ms + 10*s/3 + 10*s/3 + s},
		},
		{
			name: "the window after an outage is the removed instance's own hold",
			steps: []holdStep{
				{at: 0, op: "back"},
				{at: 4 * s, op: "remove", key: "short", ttl: 2 * s, who: 1}, // its hold (2.67 s) has passed
				{at: 5 * s, op: "remove", key: "long", ttl: 10 * s, who: 2}, // within its 7.67 s
			},
			want: map[string]time.Duration{"short": 4*s + 50*ms, "long": 5*s + 10*s/3 + 10*s/3 + s},
		},
		{
			// The window after an outage is open: a removal exactly its
			// own hold (3 s at TTL 3 s) after the store came back is no
			// longer held.
			name: "a removal exactly its hold after the store came back is not held",
			steps: []holdStep{
				{at: 0, op: "back"},
				{at: 3 * s, op: "remove", key: "a", ttl: 3 * s, who: 1},
			},
			want: map[string]time.Duration{"a": 3*s + 50*ms},
		},
		{
			// The burst window is open too: removals exactly 250 ms
			// apart are not in one burst.
			name:  "removals exactly the burst window apart are no burst",
			steps: append(fleet(3, "t", 3*s, 0, 0), fleet(2, "u", 3*s, 250*ms, 0)...),
			want:  merge(deliveredAt(50*ms, keys("t", 3)...), deliveredAt(300*ms, keys("u", 2)...)),
		},
		{
			name: "removals without a lease count by revision",
			steps: []holdStep{
				{at: 0, op: "remove", key: "k0", ttl: 3 * s, rev: -1}, {at: 0, op: "remove", key: "k1", ttl: 3 * s, rev: -2},
				{at: 0, op: "remove", key: "k2", ttl: 3 * s, rev: -3}, {at: 0, op: "remove", key: "k3", ttl: 3 * s, rev: -4},
				{at: 0, op: "remove", key: "k4", ttl: 3 * s, rev: -5},
			},
			want: deliveredAt(3*s, keys("k", 5)...),
		},
		{
			name:  "a negative limit delivers everything at once",
			limit: -1,
			steps: fleet(6, "r", 3*s, 0, 0),
			want:  deliveredAt(0, keys("r", 6)...),
		},
		{
			name:  "two lessor ticks apart do not add up to a burst",
			steps: append(fleet(3, "t", 3*s, 0, 0), fleet(3, "u", 3*s, 500*ms, 0)...),
			want:  merge(deliveredAt(50*ms, keys("t", 3)...), deliveredAt(550*ms, keys("u", 3)...)),
		},
	}
	for _, c := range cases {
		t.Run(c.name, func(t *testing.T) {
			got := runHolds(t, c.limit, c.steps)
			if !mapsEqual(got, c.want) {
				t.Fatalf("delivered %v\nwant      %v", fmtDeliveries(got), fmtDeliveries(c.want))
			}
			// Whatever happened, no removal was held past its own
			// registrant's TTL + 1 s.
			for _, st := range c.steps {
				if d, ok := got[st.key]; ok && st.op == "remove" && st.ttl > 0 && d-st.at > st.ttl+s {
					t.Errorf("%s removed at %v with TTL %v delivered at %v: more than TTL + 1 s", st.key, st.at, st.ttl, d)
				}
			}
		})
	}
}

// runHolds plays steps (in time order) on a holds, asking it what is due
// at each step and at each deadline it names, and returns when each key's
// removal was delivered (relative to the start).
func runHolds(t *testing.T, limit time.Duration, steps []holdStep) map[string]time.Duration {
	t.Helper()
	t0 := time.Date(2026, 1, 1, 0, 0, 0, 0, time.UTC)
	h := newHolds(limit)
	steps = slices.Clone(steps)
	slices.SortStableFunc(steps, func(a, b holdStep) int { return int(a.at - b.at) })
	got := map[string]time.Duration{}
	collect := func(now time.Time) time.Duration {
		ready, next := h.due(now)
		for _, p := range ready {
			got[p.it.Key] = now.Sub(t0)
		}
		return next
	}
	next := time.Duration(-1)
	last := t0
	for _, st := range steps {
		now := t0.Add(st.at)
		// Deliver what fell due before this step, at its due time.
		for next >= 0 && !last.Add(next).After(now) {
			last = last.Add(next)
			next = collect(last)
		}
		last = now
		switch st.op {
		case "remove", "drain":
			status := beacon.StatusServing
			if st.op == "drain" {
				status = beacon.StatusDraining
			}
			it := &item{Key: st.key, Inst: beacon.Instance{Status: status}, Lease: store.LeaseID(st.who), TTL: st.ttl}
			who := burstID{rev: st.rev}
			if st.who != 0 {
				who = burstID{lease: store.LeaseID(st.who)}
			}
			if pending, _ := h.remove(it, who, now); !pending {
				got[st.key] = st.at
			}
		case "rewrite":
			h.rewritten(st.key)
		case "back":
			h.cameBack(now)
		default:
			t.Fatalf("unknown op %q", st.op)
		}
		next = collect(now)
	}
	for next >= 0 {
		last = last.Add(next)
		next = collect(last)
	}
	return got
}

func mapsEqual(a, b map[string]time.Duration) bool {
	if len(a) != len(b) {
		return false
	}
	for k, v := range a {
		if w, ok := b[k]; !ok || w != v {
			return false
		}
	}
	return true
}

func fmtDeliveries(m map[string]time.Duration) string {
	var parts []string
	for k, v := range m {
		parts = append(parts, fmt.Sprintf("%s@%v", k, v))
	}
	slices.Sort(parts)
	return strings.Join(parts, " ")
}

// A hold episode is reported once (one log line): the removal that starts
// it reports it, with the longest hold; removals held while it lasts do
// not; one after it ended starts another.
func TestHoldEpisodeReportedOnce(t *testing.T) {
	t0 := time.Date(2026, 1, 1, 0, 0, 0, 0, time.UTC)
	h := newHolds(0)
	remove := func(key string, lease int, at time.Duration) *episode {
		it := &item{Key: key, Inst: beacon.Instance{Status: beacon.StatusServing}, Lease: store.LeaseID(lease), TTL: 3 * time.Second}
		_, ep := h.remove(it, burstID{lease: store.LeaseID(lease)}, t0.Add(at))
		return ep
	}
	for i := range 4 {
		if ep := remove(fmt.Sprint("a", i), i+1, 0); ep != nil {
			t.Fatalf("removal %d reported an episode before a burst: %+v", i, ep)
		}
	}
	ep := remove("a4", 5, 0)
	if ep == nil || ep.why != "a burst of removals" || ep.longest != 3*time.Second {
		t.Fatalf("fifth removal at once: episode %+v, want a burst with the longest hold 3s", ep)
	}
	if ep := remove("a5", 6, 100*time.Millisecond); ep != nil {
		t.Fatalf("a removal held during the episode reported it again: %+v", ep)
	}
	for i := range 5 {
		if i == 4 {
			if ep := remove(fmt.Sprint("b", i), 20+i, 5*time.Second); ep == nil {
				t.Fatal("a burst after the first episode ended reported no episode")
			}
			continue
		}
		remove(fmt.Sprint("b", i), 20+i, 5*time.Second)
	}
}

// rewritten cancels a pending removal and says whether it was held (the
// "cancelled" count of held removals): not for one only coalescing, nor
// for a key with nothing pending.
func TestHoldRewrittenCountsHeldOnly(t *testing.T) {
	t0 := time.Date(2026, 1, 1, 0, 0, 0, 0, time.UTC)
	h := newHolds(0)
	remove := func(key string, lease int) {
		it := &item{Key: key, Inst: beacon.Instance{Status: beacon.StatusServing}, Lease: store.LeaseID(lease), TTL: 3 * time.Second}
		if pending, _ := h.remove(it, burstID{lease: store.LeaseID(lease)}, t0); !pending {
			t.Fatalf("removal of %s not pending", key)
		}
	}
	remove("coalescing", 1)
	if h.rewritten("coalescing") {
		t.Fatal("a removal only coalescing counted as held")
	}
	if h.rewritten("coalescing") || h.rewritten("unknown") {
		t.Fatal("a key with nothing pending counted as held")
	}
	for i := range 5 {
		remove(fmt.Sprint("burst", i), 10+i)
	}
	if !h.rewritten("burst0") {
		t.Fatal("a removal held in a burst not counted as held")
	}
	if ready, _ := h.due(t0.Add(time.Hour)); len(ready) != 4 {
		t.Fatalf("%d removals delivered, want the 4 not rewritten", len(ready))
	}
}
