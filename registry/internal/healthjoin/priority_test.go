package healthjoin

import (
	"bytes"
	"fmt"
	"log/slog"
	"maps"
	"slices"
	"strings"
	"testing"

	"github.com/beaconplane/beacon"
	"github.com/beaconplane/beacon/registry/internal/view"
)

const (
	pass = beacon.HealthPassing
	fail = beacon.HealthFailing
)

// levelStep is one batch of changes to a rig, then settle.
type levelStep struct {
	do      func(g *joinRig)
	changes []string // what settle reports (joinRig.settle)
	health  string   // every instance afterwards (joinRig.health)
}

// runLevelSteps runs steps on a new rig and checks, after each, what
// settle reports, every instance's health, and that the counts kept
// incrementally decide as a join of the same instances from scratch does.
func runLevelSteps(t *testing.T, threshold float64, steps []levelStep) *joinRig {
	t.Helper()
	g := newJoinRig(t, threshold)
	for i, s := range steps {
		s.do(g)
		if got := g.settle(); !slices.Equal(got, s.changes) {
			t.Fatalf("step %d: settle = %q, want %q", i, got, s.changes)
		}
		if got := g.health(); got != s.health {
			t.Fatalf("step %d: health %q, want %q", i, got, s.health)
		}
		if fresh := g.fromScratch(); fresh != s.health {
			t.Fatalf("step %d: a join from scratch says %q, the incremental one %q", i, fresh, s.health)
		}
	}
	return g
}

// fromScratch joins the rig's instances and verdicts in a new Join, as a
// listing is joined, and describes their health.
func (g *joinRig) fromScratch() string {
	fresh := newJoinRig(g.t, g.j.threshold)
	fresh.j.ReplaceVerdicts(maps.Clone(g.j.stored))
	var items []*view.Item
	for key, in := range g.insts {
		in = in.Clone()
		in.Health = nil
		items = append(items, &view.Item{Key: key, Inst: in})
	}
	fresh.j.JoinAll(items)
	for _, it := range items {
		fresh.insts[it.Key] = it.Inst
	}
	return fresh.health()
}

// primaryDown is the outside tester's service: p1, p2, p3 at the default
// priority and b4, b5 at priority 20, all checked; the primaries fail.
func primaryDown(g *joinRig) {
	for _, id := range []string{"p1", "p2", "p3"} {
		g.put(id, true)
		g.verdict(id, fail)
	}
	for _, id := range []string{"b4", "b5"} {
		g.putAt(id, true, "20", "")
		g.verdict(id, pass)
	}
}

// The outside tester's case: a whole primary tier failing, its backup
// passing, is no panic. The primaries are left out (not Panic) so that
// clients fail over, as they would if the backup tier were the only one.
func TestPanicFailsOverToALaterPriority(t *testing.T) {
	runLevelSteps(t, 0.5, []levelStep{
		{primaryDown, nil, "b4:passing b5:passing p1:failing p2:failing p3:failing"},
	})
}

// A backup tier failing beyond the threshold too: no level has an
// instance that takes work, so every level over the threshold is in
// panic. A level with one relieves the others, even in panic itself.
func TestPanicAtTheLastPriorityWithoutFailover(t *testing.T) {
	runLevelSteps(t, 0.5, []levelStep{
		{primaryDown, nil, "b4:passing b5:passing p1:failing p2:failing p3:failing"},
		{func(g *joinRig) { g.verdict("b4", fail); g.verdict("b5", fail) },
			[]string{"enter ns/c/e 3/3 3", "enter ns/c/e@20 2/2 2"},
			"b4:failing! b5:failing! p1:failing! p2:failing! p3:failing!"},
		// b6 passes, 2 of 3 still fail: the backup stays in panic, but
		// b6 takes work, so the primaries are left out for it.
		{func(g *joinRig) { g.putAt("b6", true, "20", ""); g.verdict("b6", pass) },
			[]string{"leave ns/c/e 3/3 3"},
			"b4:failing! b5:failing! b6:passing p1:failing p2:failing p3:failing"},
	})
}

// Draining instances take no new work: a later level of them only is no
// failover, and an instance that starts draining can put another level in
// panic.
func TestPanicDrainingLaterPriorityIsNoFailover(t *testing.T) {
	runLevelSteps(t, 0.5, []levelStep{
		{func(g *joinRig) {
			g.put("p1", true)
			g.verdict("p1", fail)
			g.putAt("b2", true, "20", beacon.StatusDraining)
			g.verdict("b2", pass)
		}, []string{"enter ns/c/e 1/1 1"}, "b2:passing p1:failing!"},
		{func(g *joinRig) { g.putAt("b2", true, "20", beacon.StatusServing) }, []string{"leave ns/c/e 1/1 1"}, "b2:passing p1:failing"},
		{func(g *joinRig) { g.putAt("b2", true, "20", beacon.StatusDraining) }, []string{"enter ns/c/e 1/1 1"}, "b2:passing p1:failing!"},
	})
}

// An instance without a check takes work: a later level of them only is
// failover, as is one whose check has no verdict yet.
func TestPanicUncheckedLaterPriorityIsFailover(t *testing.T) {
	runLevelSteps(t, 0.5, []levelStep{
		{func(g *joinRig) {
			g.put("p1", true)
			g.verdict("p1", fail)
			g.putAt("b2", false, "20", "")
		}, nil, "b2:- p1:failing"},
		{func(g *joinRig) { g.remove("b2") }, []string{"enter ns/c/e 1/1 1"}, "p1:failing!"},
		{func(g *joinRig) { g.putAt("b3", true, "20", "") }, []string{"leave ns/c/e 1/1 1"}, "b3:unknown p1:failing"},
	})
}

// An instance that changes its priority (a metadata PATCH) leaves one
// level's counts and joins the other's: both are decided again.
func TestPanicInstanceMovingBetweenPriorities(t *testing.T) {
	runLevelSteps(t, 0.5, []levelStep{
		{func(g *joinRig) {
			for _, id := range []string{"p1", "p2"} {
				g.put(id, true)
				g.verdict(id, fail)
			}
			g.putAt("b3", true, "20", "")
			g.verdict("b3", fail)
			g.putAt("b4", true, "20", "")
			g.verdict("b4", pass)
		}, nil, "b3:failing b4:passing p1:failing p2:failing"},
		// b4 moves up: the primaries have no failover left, 2 of 3
		// failing; the backup is b3 alone, failing, but b4 keeps the
		// clients at the primaries.
		{func(g *joinRig) { g.putAt("b4", true, "", "") }, []string{"enter ns/c/e 2/3 2"},
			"b3:failing b4:passing p1:failing! p2:failing!"},
		{func(g *joinRig) { g.putAt("b4", true, "20", "") }, []string{"leave ns/c/e 2/2 2"},
			"b3:failing b4:passing p1:failing p2:failing"},
		// A failing instance moving into a level in panic joins it at
		// once; moving out, it is left out at once.
		{func(g *joinRig) { g.verdict("b4", fail) }, []string{"enter ns/c/e 2/2 2", "enter ns/c/e@20 2/2 2"},
			"b3:failing! b4:failing! p1:failing! p2:failing!"},
		{func(g *joinRig) { g.putAt("p1", true, "20", "") }, nil, "b3:failing! b4:failing! p1:failing! p2:failing!"},
		// A new last level, failing: in panic; passing, it is failover
		// for every level before it.
		{func(g *joinRig) { g.putAt("b4", true, "30", "") }, []string{"enter ns/c/e@30 1/1 1"},
			"b3:failing! b4:failing! p1:failing! p2:failing!"},
		{func(g *joinRig) { g.verdict("b4", pass) }, []string{"leave ns/c/e 1/1 1", "leave ns/c/e@20 2/2 2", "leave ns/c/e@30 0/1 0"},
			"b3:failing b4:passing p1:failing p2:failing"},
	})
}

// A failing backup tier behind primaries that take work is no panic: the
// clients stay at the primaries, and consumers blind to priorities (DNS A
// records, the beacon:/// resolver, pickers) must not get the failing
// backups mixed in. Only when no primary takes work is the backup tier
// where clients go, and in panic.
func TestPanicNotAtALevelBehindOneThatTakesWork(t *testing.T) {
	runLevelSteps(t, 0.5, []levelStep{
		{func(g *joinRig) {
			for _, id := range []string{"p1", "p2", "p3"} {
				g.put(id, true)
				g.verdict(id, pass)
			}
			g.putAt("b4", true, "20", "")
			g.verdict("b4", fail)
		}, nil, "b4:failing p1:passing p2:passing p3:passing"},
		{func(g *joinRig) {
			for _, id := range []string{"p1", "p2", "p3"} {
				g.verdict(id, fail)
			}
		}, []string{"enter ns/c/e 3/3 3", "enter ns/c/e@20 1/1 1"},
			"b4:failing! p1:failing! p2:failing! p3:failing!"},
		{func(g *joinRig) { g.put("p5", false) }, []string{"leave ns/c/e@20 1/1 1"},
			"b4:failing p1:failing! p2:failing! p3:failing! p5:-"},
	})
}

// Priority is read by the one rule DNS and xDS route with
// (beacon.Uint16Meta): an unreadable one is the default priority.
func TestPanicUnreadablePriorityIsTheDefault(t *testing.T) {
	runLevelSteps(t, 0.5, []levelStep{
		{func(g *joinRig) {
			g.put("p1", true)
			g.verdict("p1", fail)
			g.putAt("p2", true, "high", "")
			g.verdict("p2", fail)
			g.putAt("p3", true, "10", "")
		}, []string{"enter ns/c/e 2/3 2"}, "p1:failing! p2:failing! p3:unknown"},
	})
}

// A level entering or leaving panic while another stays in it is
// reported with exactly its own failing instances: theirs are the items
// whose Panic flips, and the level in panic throughout is left alone.
func TestPanicLevelFlipRefreshesExactlyItsItems(t *testing.T) {
	g := runLevelSteps(t, 0.5, []levelStep{
		{func(g *joinRig) {
			for _, id := range []string{"p1", "p2"} {
				g.put(id, true)
				g.verdict(id, fail)
			}
			for _, id := range []string{"b3", "b4"} {
				g.putAt(id, true, "20", "")
				g.verdict(id, fail)
			}
		}, []string{"enter ns/c/e 2/2 2", "enter ns/c/e@20 2/2 2"}, "b3:failing! b4:failing! p1:failing! p2:failing!"},
	})
	wantKeys := func(what string, got []PanicChange, service string, prio uint16, enter bool, keys ...string) {
		t.Helper()
		if len(got) != 1 || got[0].Service != service || got[0].Priority != prio || got[0].Enter != enter || !slices.Equal(got[0].Keys, keys) {
			t.Fatalf("%s: settle = %+v, want level %s@%d enter=%v with keys %q", what, got, service, prio, enter, keys)
		}
	}
	// b5 passes at 20: the backup stays in panic (2 of 3), the primaries
	// leave it.
	g.putAt("b5", true, "20", "")
	g.verdict("b5", pass)
	wantKeys("a passing backup comes", g.j.Settle(), "ns/c/e", beacon.DefaultPriority, false, joinKey("p1"), joinKey("p2"))
	g.remove("b5")
	wantKeys("the passing backup goes", g.j.Settle(), "ns/c/e", beacon.DefaultPriority, true, joinKey("p1"), joinKey("p2"))
}

// A service at one priority, whichever, decides its panic on the whole
// service, as before priorities counted.
func TestPanicSinglePriorityIsTheWholeService(t *testing.T) {
	for _, prio := range []string{"", "0", "20", "65535"} {
		t.Run("priority="+prio, func(t *testing.T) {
			runLevelSteps(t, 0.5, []levelStep{
				{func(g *joinRig) {
					for _, id := range []string{"a", "b", "c"} {
						g.putAt(id, true, prio, "")
					}
					g.putAt("d", false, prio, "")
				}, nil, "a:unknown b:unknown c:unknown d:-"},
				{func(g *joinRig) { g.verdict("a", fail) }, nil, "a:failing b:unknown c:unknown d:-"},
				{func(g *joinRig) { g.verdict("b", fail) }, []string{"enter " + levelName("ns/c/e", prio) + " 2/3 2"},
					"a:failing! b:failing! c:unknown d:-"},
			})
		})
	}
}

// levelName is how joinRig.settle names the level prio of service.
func levelName(service, prio string) string {
	if prio == "" || prio == "10" {
		return service
	}
	return service + "@" + prio
}

// The Board counts a service in panic while any of its levels is, once
// however many joins see it, and logs each level entering and leaving,
// naming its priority.
func TestBoardCountsAServiceOnceAcrossItsLevels(t *testing.T) {
	var buf bytes.Buffer
	log := slog.New(slog.NewTextHandler(&buf, &slog.HandlerOptions{ReplaceAttr: func(_ []string, a slog.Attr) slog.Attr {
		if a.Key == slog.TimeKey || a.Key == "threshold" || a.Key == "failing" || a.Key == "checked" {
			return slog.Attr{}
		}
		return a
	}}))
	gauge := 0
	b := NewBoard(log, func(d int) { gauge += d }, 0.5)
	lvl := func(prio uint16, enter bool) PanicChange {
		return PanicChange{Service: "ns/c/e", Priority: prio, Enter: enter}
	}
	steps := []struct {
		c     PanicChange
		gauge int
		log   string // the message logged, "" for none
	}{
		{lvl(20, true), 1, "service in health panic"},
		{lvl(20, true), 1, ""}, // a second join
		{lvl(10, true), 1, "another priority of a service in health panic"},
		{lvl(20, false), 1, ""}, // one join of two
		{lvl(20, false), 1, "a priority of a service out of health panic, others still in it"},
		{lvl(20, false), 1, ""}, // a join that never saw it enter
		{lvl(10, false), 0, "service out of health panic"},
	}
	for i, s := range steps {
		buf.Reset()
		b.Report(s.c)
		if gauge != s.gauge {
			t.Fatalf("step %d: gauge %d, want %d", i, gauge, s.gauge)
		}
		line := buf.String()
		if s.log == "" && line != "" || s.log != "" && !strings.Contains(line, `msg="`+s.log+":") {
			t.Fatalf("step %d: logged %q, want %q", i, line, s.log)
		}
		if s.log != "" && !strings.Contains(line, fmt.Sprintf(" service=ns/c/e priority=%d", s.c.Priority)) {
			t.Fatalf("step %d: logged %q, want the service and its priority", i, line)
		}
	}
}
