package registry

import (
	"context"
	"encoding/json"
	"log/slog"
	"slices"
	"strconv"
	"sync"
	"testing"
	"time"

	"github.com/beaconplane/beacon"
	"github.com/beaconplane/beacon/registry/internal/healthjoin"
	"github.com/beaconplane/beacon/store"
	"github.com/prometheus/client_golang/prometheus/testutil"
)

// The feed's health join, driven by hand (feedRig): verdicts are store
// keys beside their instances, and every change is checked in the batches
// a cursor gets.

// checked is instance id of the rig's service with address addr, declaring
// a TCP check.
func checked(id uint64, addr string) beacon.Instance {
	return beacon.Instance{Namespace: "feed", Component: "c", Endpoint: "e", ID: beacon.FormatID(id), Address: addr,
		Status: beacon.StatusServing, RegisteredAt: time.Unix(1, 0).UTC(), Check: &beacon.Check{Kind: beacon.CheckTCP}}
}

// kvOf is in's stored value.
func (g *feedRig) kvOf(in beacon.Instance, create, mod int64) store.KeyValue {
	g.t.Helper()
	val, err := json.Marshal(in) // what an other writer may store: health included
	if err != nil {
		g.t.Fatal(err)
	}
	return store.KeyValue{Key: g.r.ks.Key(in.Ref()), Value: appendTTL(val, time.Minute), CreateRevision: create, ModRevision: mod}
}

// verdict is a checker's verdict on instance id, written at mod.
func (g *feedRig) verdict(id uint64, s beacon.HealthStatus, mod int64) store.KeyValue {
	g.t.Helper()
	val, err := json.Marshal(beacon.Health{Status: s, Reason: "probe says " + string(s), Checker: "c1"})
	if err != nil {
		g.t.Fatal(err)
	}
	return store.KeyValue{Key: g.r.ks.HealthKey(checked(id, "").Ref()), Value: val, CreateRevision: mod, ModRevision: mod, Lease: 7}
}

func put(kv store.KeyValue) store.Event { return store.Event{Type: store.EventPut, KV: kv} }

func del(key string, rev int64) store.Event {
	return store.Event{Type: store.EventDelete, KV: store.KeyValue{Key: key, ModRevision: rev}}
}

// healthOf describes in's health: "-" for none, the status, "!" for panic.
func healthOf(in beacon.Instance) string {
	if in.Health == nil {
		return "-"
	}
	if in.Health.Panic {
		return string(in.Health.Status) + "!"
	}
	return string(in.Health.Status)
}

// withHealth lists the events as "type address health@revision".
func withHealth(b Batch) []string {
	var out []string
	for _, e := range b.Events {
		out = append(out, e.Type.String()+" "+e.Instance.Address+" "+healthOf(e.Instance)+"@"+strconv.FormatInt(e.Revision, 10))
	}
	return out
}

func wantHealth(t *testing.T, b Batch, kind BatchKind, want ...string) {
	t.Helper()
	if got := withHealth(b); b.Kind != kind || !slices.Equal(got, want) {
		t.Fatalf("batch %v %q, want %v %q", b.Kind, got, kind, want)
	}
}

// records is a slog handler that keeps every record's level and message.
type records struct {
	mu  sync.Mutex
	got []string
}

func (h *records) Enabled(context.Context, slog.Level) bool { return true }
func (h *records) Handle(_ context.Context, r slog.Record) error {
	h.mu.Lock()
	defer h.mu.Unlock()
	line := r.Level.String() + " " + r.Message
	r.Attrs(func(a slog.Attr) bool {
		if a.Key == "service" || a.Key == "failing" || a.Key == "checked" || a.Key == "key" {
			line += " " + a.Key + "=" + a.Value.String()
		}
		return true
	})
	h.got = append(h.got, line)
	return nil
}
func (h *records) WithAttrs([]slog.Attr) slog.Handler { return h }
func (h *records) WithGroup(string) slog.Handler      { return h }

func (h *records) lines() []string {
	h.mu.Lock()
	defer h.mu.Unlock()
	return slices.Clone(h.got)
}

// A verdict's put and delete are each one update of its instance, at the
// verdict's revision: unknown until there is one, then the verdict, then
// unknown again.
func TestFeedVerdictIsAnUpdateOfItsInstance(t *testing.T) {
	g := newFeedRigWith(t, Config{RemovalHold: -1, HealthPanicThreshold: -1})
	g.f.applyListing([]store.KeyValue{g.kvOf(checked(1, "10.0.0.1:80"), 5, 5)}, 10)
	c := &cursor{}
	wantHealth(t, g.batch(c), Snapshot, "added 10.0.0.1:80 unknown@5")
	g.f.applyEvents([]store.Event{put(g.verdict(1, beacon.HealthFailing, 11))})
	b := g.batch(c)
	wantHealth(t, b, Changes, "updated 10.0.0.1:80 failing@11")
	if in := b.Events[0].Instance; in.Serving() || in.Health.Reason != "probe says failing" || in.Health.Checker != "c1" {
		t.Fatalf("a failing instance %+v (serving %v)", in.Health, in.Serving())
	}
	g.f.applyEvents([]store.Event{put(g.verdict(1, beacon.HealthFailing, 12))}) // the same verdict again
	g.idle(c)
	g.f.applyEvents([]store.Event{del(g.verdict(1, "", 0).Key, 13)})
	wantHealth(t, g.batch(c), Changes, "updated 10.0.0.1:80 unknown@13")
	// A snapshot carries the item's last change.
	g.f.applyEvents([]store.Event{put(g.verdict(1, beacon.HealthPassing, 14))})
	wantHealth(t, g.batch(&cursor{}), Snapshot, "added 10.0.0.1:80 passing@14")
}

// An instance without a check carries no health, whatever is stored: a
// verdict on it, or health in its own value. What a checked instance's
// value says of its health is replaced too.
func TestFeedHealthOnlyForDeclaredChecks(t *testing.T) {
	g := newFeedRig(t)
	plain := checked(1, "10.0.0.1:80")
	plain.Check = nil
	plain.Health = &beacon.Health{Status: beacon.HealthFailing}
	claims := checked(2, "10.0.0.2:80")
	claims.Health = &beacon.Health{Status: beacon.HealthPassing}
	g.f.applyListing([]store.KeyValue{g.kvOf(plain, 5, 5), g.kvOf(claims, 6, 6), g.verdict(1, beacon.HealthFailing, 7)}, 10)
	c := &cursor{}
	wantHealth(t, g.batch(c), Snapshot, "added 10.0.0.1:80 -@5", "added 10.0.0.2:80 unknown@6")
	g.f.applyEvents([]store.Event{put(g.verdict(1, beacon.HealthPassing, 11)), del(g.verdict(1, "", 0).Key, 12)})
	g.idle(c)
	if g.f.view.Rev() != 12 {
		t.Fatalf("the view is at revision %d, want 12", g.f.view.Rev())
	}
}

// A verdict whose instance is absent is kept aside and joined when the
// instance appears (with the same ID, after a lease loss).
func TestFeedKeepsAVerdictAsideUntilItsInstance(t *testing.T) {
	g := newFeedRig(t)
	a := g.kvOf(checked(1, "10.0.0.1:80"), 5, 5)
	g.f.applyListing([]store.KeyValue{a, g.verdict(1, beacon.HealthFailing, 6)}, 10)
	c := &cursor{}
	wantHealth(t, g.batch(c), Snapshot, "added 10.0.0.1:80 failing!@5") // one instance, failing: 1/1, panic
	g.f.applyEvents([]store.Event{del(a.Key, 11)})
	wantHealth(t, g.batch(c), Changes, "removed 10.0.0.1:80 failing!@11")
	g.f.applyEvents([]store.Event{put(g.kvOf(checked(1, "10.0.0.1:81"), 12, 12))})
	wantHealth(t, g.batch(c), Changes, "added 10.0.0.1:81 failing!@12")
	g.f.applyEvents([]store.Event{put(g.verdict(2, beacon.HealthPassing, 13))})
	g.idle(c)
	g.f.applyEvents([]store.Event{put(g.kvOf(checked(2, "10.0.0.2:80"), 14, 14))})
	// 1 of 2 failing: the panic ends at the same revision.
	wantHealth(t, g.batch(c), Changes, "updated 10.0.0.1:81 failing@14", "added 10.0.0.2:80 passing@14")
}

// A TTL check's report key is the checker's: the view ignores it without
// reporting it as an invalid value, and its revision moves the view on.
func TestFeedIgnoresReportsSilently(t *testing.T) {
	logs := &records{}
	g := newFeedRigWith(t, Config{RemovalHold: -1, Logger: slog.New(logs)})
	g.f.applyListing([]store.KeyValue{g.kvOf(checked(1, "10.0.0.1:80"), 5, 5),
		{Key: ReportKey(g.r.ks, checked(1, "").Ref()), Value: []byte(`{"at":"2026-01-02T03:04:05Z"}`), ModRevision: 6}}, 10)
	c := &cursor{}
	wantHealth(t, g.batch(c), Snapshot, "added 10.0.0.1:80 unknown@5")
	report := store.KeyValue{Key: ReportKey(g.r.ks, checked(1, "").Ref()), Value: []byte(`garbage`), ModRevision: 11}
	g.f.applyEvents([]store.Event{put(report), del(report.Key, 12)})
	g.idle(c)
	if g.f.view.Rev() != 12 || len(logs.lines()) != 0 || testutil.ToFloat64(g.r.m.invalid) != 0 {
		t.Fatalf("view at %d, logs %q, invalid values %v: want 12, none, 0", g.f.view.Rev(), logs.lines(), testutil.ToFloat64(g.r.m.invalid))
	}
}

// A malformed verdict is read as none (health unknown), and reported once
// with its key: not again when a re-listing finds the same value.
func TestFeedMalformedVerdictReportedOnce(t *testing.T) {
	logs := &records{}
	g := newFeedRigWith(t, Config{RemovalHold: -1, Logger: slog.New(logs), HealthPanicThreshold: -1})
	a := g.kvOf(checked(1, "10.0.0.1:80"), 5, 5)
	g.f.applyListing([]store.KeyValue{a, g.verdict(1, beacon.HealthFailing, 6)}, 10)
	c := &cursor{}
	wantHealth(t, g.batch(c), Snapshot, "added 10.0.0.1:80 failing@5")
	bad := g.verdict(1, "", 11)
	bad.Value = []byte(`{"status":"sick"}`)
	g.f.applyEvents([]store.Event{put(bad)})
	wantHealth(t, g.batch(c), Changes, "updated 10.0.0.1:80 unknown@11")
	g.f.applyListing([]store.KeyValue{a, bad}, 12)
	g.idle(c) // nothing changed
	want := []string{"WARN a stored health verdict is not valid; reading it as no verdict (health unknown) key=" + bad.Key}
	if got := logs.lines(); !slices.Equal(got, want) || testutil.ToFloat64(g.r.m.invalid) != 1 {
		t.Fatalf("logs %q (invalid values %v), want %q once", got, testutil.ToFloat64(g.r.m.invalid), want)
	}
	bad.ModRevision = 13 // written again: reported again
	g.f.applyEvents([]store.Event{put(bad)})
	if n := len(logs.lines()); n != 2 {
		t.Fatalf("%d reports after a second malformed write, want 2", n)
	}
}

// A re-listing reconciles verdicts as it does instances: those deleted,
// written or changed while the feed was away are delivered in its Resync;
// an unchanged instance keeps its item.
func TestFeedRelistReconcilesVerdicts(t *testing.T) {
	g := newFeedRigWith(t, Config{RemovalHold: -1, HealthPanicThreshold: -1})
	a, b, d := g.kvOf(checked(1, "10.0.0.1:80"), 5, 5), g.kvOf(checked(2, "10.0.0.2:80"), 6, 6), g.kvOf(checked(3, "10.0.0.3:80"), 7, 7)
	g.f.applyListing([]store.KeyValue{a, g.verdict(1, beacon.HealthFailing, 8), b, d, g.verdict(3, beacon.HealthPassing, 9)}, 10)
	c := &cursor{}
	wantHealth(t, g.batch(c), Snapshot, "added 10.0.0.1:80 failing@5", "added 10.0.0.2:80 unknown@6", "added 10.0.0.3:80 passing@7")
	kept, _ := g.f.view.Get(d.Key)
	g.f.applyListing([]store.KeyValue{a, b, g.verdict(2, beacon.HealthPassing, 11), d, g.verdict(3, beacon.HealthPassing, 9)}, 12)
	wantHealth(t, g.batch(c), Resync, "updated 10.0.0.1:80 unknown@12", "updated 10.0.0.2:80 passing@12")
	if now, _ := g.f.view.Get(d.Key); now != kept {
		t.Fatal("a re-listing replaced the item of an unchanged instance")
	}
}

// Entering and leaving panic: the failing instances of the service are
// updated (Panic, so Serving), at the revision that moved the service;
// each transition is logged once and counted in the gauge.
func TestFeedPanicEnterAndLeave(t *testing.T) {
	logs := &records{}
	g := newFeedRigWith(t, Config{RemovalHold: -1, Logger: slog.New(logs)})
	g.f.applyListing([]store.KeyValue{g.kvOf(checked(1, "10.0.0.1:80"), 5, 5), g.kvOf(checked(2, "10.0.0.2:80"), 5, 5),
		g.kvOf(checked(3, "10.0.0.3:80"), 5, 5)}, 10)
	c := &cursor{}
	g.batch(c)
	g.f.applyEvents([]store.Event{put(g.verdict(1, beacon.HealthFailing, 11)), put(g.verdict(2, beacon.HealthFailing, 12))})
	b := g.batch(c)
	wantHealth(t, b, Changes, "updated 10.0.0.1:80 failing!@12", "updated 10.0.0.2:80 failing!@12")
	for _, e := range b.Events {
		if !e.Instance.Serving() {
			t.Fatalf("%s fails in a service in panic, and is not served", e.Instance.Address)
		}
	}
	if n := testutil.ToFloat64(g.r.m.healthPanics); n != 1 {
		t.Fatalf("gauge %v in panic, want 1", n)
	}
	g.f.applyEvents([]store.Event{put(g.verdict(3, beacon.HealthFailing, 13))}) // stays
	wantHealth(t, g.batch(c), Changes, "updated 10.0.0.3:80 failing!@13")
	g.f.applyEvents([]store.Event{put(g.verdict(3, beacon.HealthPassing, 14)), put(g.verdict(2, beacon.HealthPassing, 15))})
	wantHealth(t, g.batch(c), Changes, "updated 10.0.0.3:80 passing@14", "updated 10.0.0.1:80 failing@15", "updated 10.0.0.2:80 passing@15")
	if n := testutil.ToFloat64(g.r.m.healthPanics); n != 0 {
		t.Fatalf("gauge %v in panic after it ended, want 0", n)
	}
	want := []string{
		"WARN service in health panic: more of the checked instances of a priority are failing than the panic threshold allows, " +
			"and no other priority has an instance that takes work; serving its failing instances too service=feed/c/e failing=2 checked=3",
		"INFO service out of health panic: its failing instances are left out again service=feed/c/e failing=1 checked=3",
	}
	if got := logs.lines(); !slices.Equal(got, want) {
		t.Fatalf("logs %q, want %q", got, want)
	}
}

// Panic is judged per priority: a level that leaves panic while another
// stays in it updates exactly its own failing instances, the service
// stays counted in panic, and the log names the level that left.
func TestFeedPanicLevelLeavesWhileAnotherStays(t *testing.T) {
	logs := &records{}
	g := newFeedRigWith(t, Config{RemovalHold: -1, Logger: slog.New(logs)})
	backup := func(id uint64, addr string) beacon.Instance {
		in := checked(id, addr)
		in.Metadata = map[string]string{beacon.MetaPriority: "20"}
		return in
	}
	g.f.applyListing([]store.KeyValue{g.kvOf(checked(1, "10.0.0.1:80"), 5, 5), g.kvOf(checked(2, "10.0.0.2:80"), 5, 5),
		g.kvOf(backup(3, "10.0.0.3:80"), 5, 5), g.kvOf(backup(4, "10.0.0.4:80"), 5, 5)}, 10)
	c := &cursor{}
	g.batch(c)
	g.f.applyEvents([]store.Event{put(g.verdict(1, beacon.HealthFailing, 11)), put(g.verdict(2, beacon.HealthFailing, 11)),
		put(g.verdict(3, beacon.HealthFailing, 11)), put(g.verdict(4, beacon.HealthFailing, 11))})
	wantHealth(t, g.batch(c), Changes, "updated 10.0.0.1:80 failing!@11", "updated 10.0.0.2:80 failing!@11",
		"updated 10.0.0.3:80 failing!@11", "updated 10.0.0.4:80 failing!@11")
	// A passing backup: the backups stay in panic (2 of 3), the primaries
	// can fail over to it and leave.
	g.f.applyEvents([]store.Event{put(g.verdict(5, beacon.HealthPassing, 12)), put(g.kvOf(backup(5, "10.0.0.5:80"), 12, 12))})
	wantHealth(t, g.batch(c), Changes, "updated 10.0.0.1:80 failing@12", "updated 10.0.0.2:80 failing@12", "added 10.0.0.5:80 passing@12")
	if n := testutil.ToFloat64(g.r.m.healthPanics); n != 1 {
		t.Fatalf("gauge %v in panic, want 1: the backups still are", n)
	}
	want := []string{
		"WARN service in health panic: more of the checked instances of a priority are failing than the panic threshold allows, " +
			"and no other priority has an instance that takes work; serving its failing instances too service=feed/c/e failing=2 checked=2",
		"WARN another priority of a service in health panic: more of its checked instances are failing than the panic threshold allows, " +
			"and no other priority has an instance that takes work; serving its failing instances too service=feed/c/e failing=2 checked=2",
		"INFO a priority of a service out of health panic, others still in it: its failing instances are left out again service=feed/c/e failing=2 checked=2",
	}
	if got := logs.lines(); !slices.Equal(got, want) {
		t.Fatalf("logs %q, want %q", got, want)
	}
}

// A registry counts and logs a service's panic once, however many of its
// feeds (watched prefixes) see it.
func TestHealthBoardCountsAServiceOnce(t *testing.T) {
	logs := &records{}
	m, err := newMetrics(nil)
	if err != nil {
		t.Fatal(err)
	}
	b := newHealthBoard(slog.New(logs), m, 0.5)
	enter := healthjoin.PanicChange{Service: "ns/c/e", Enter: true, Checked: 2, Failing: 2}
	leave := healthjoin.PanicChange{Service: "ns/c/e", Checked: 2, Failing: 0}
	b.Report(enter)
	b.Report(enter)
	b.Report(healthjoin.PanicChange{Service: "ns/c/f", Enter: true, Checked: 1, Failing: 1})
	if n := testutil.ToFloat64(m.healthPanics); n != 2 {
		t.Fatalf("gauge %v, want 2 services", n)
	}
	b.Report(leave)
	if n := testutil.ToFloat64(m.healthPanics); n != 2 || len(logs.lines()) != 2 {
		t.Fatalf("one feed of two left: gauge %v, logs %q", n, logs.lines())
	}
	b.Report(leave)
	b.Report(leave) // a feed that never saw it enter: nothing
	if n := testutil.ToFloat64(m.healthPanics); n != 1 || len(logs.lines()) != 3 {
		t.Fatalf("every feed left: gauge %v, logs %q", n, logs.lines())
	}
}

// A verdict that changes while its instance's removal is held back
// replaces the held item: the removal is still delivered when due.
func TestFeedVerdictOfAHeldRemovalKeepsItsDelivery(t *testing.T) {
	g := newFeedRigWith(t, Config{HealthPanicThreshold: -1})
	a := g.kvOf(checked(1, "10.0.0.1:80"), 5, 5)
	g.f.applyListing([]store.KeyValue{a, g.verdict(1, beacon.HealthPassing, 6)}, 10)
	c := &cursor{}
	g.batch(c)
	g.f.applyEvents([]store.Event{del(a.Key, 11)}) // a serving instance: held (coalescing)
	g.f.applyEvents([]store.Event{del(g.verdict(1, "", 0).Key, 12)})
	wantHealth(t, g.batch(c), Changes, "updated 10.0.0.1:80 unknown@12")
	if next := g.f.deliverDue(time.Now().Add(time.Hour)); next >= 0 {
		t.Fatalf("a removal still pending (next in %v)", next)
	}
	wantHealth(t, g.batch(c), Changes, "removed 10.0.0.1:80 unknown@12")
}

// A held removal delivered late can put its service in panic: the
// change is at the revision watchers were given already, and one resuming
// from that revision gets it too (view.Amend's Late).
func TestFeedPanicFromALateRemovalReachesResumers(t *testing.T) {
	g := newFeedRigWith(t, Config{})
	a, b := g.kvOf(checked(1, "10.0.0.1:80"), 5, 5), g.kvOf(checked(2, "10.0.0.2:80"), 6, 6)
	g.f.applyListing([]store.KeyValue{a, g.verdict(1, beacon.HealthFailing, 7), b, g.verdict(2, beacon.HealthPassing, 8)}, 10)
	c := &cursor{}
	wantHealth(t, g.batch(c), Snapshot, "added 10.0.0.1:80 failing@5", "added 10.0.0.2:80 passing@6") // 1 of 2: no panic
	plain := checked(3, "10.0.0.3:80")
	plain.Check = nil
	g.f.applyEvents([]store.Event{del(b.Key, 11), put(g.kvOf(plain, 11, 11))}) // b's removal held
	wantHealth(t, g.batch(c), Changes, "added 10.0.0.3:80 -@11")
	g.f.deliverDue(time.Now().Add(time.Hour))
	wantHealth(t, g.batch(c), Changes, "updated 10.0.0.1:80 failing!@11", "removed 10.0.0.2:80 passing@11")
	resumer := &cursor{from: 11, fromChecked: true}
	wantHealth(t, g.batch(resumer), Changes, "updated 10.0.0.1:80 failing!@11", "removed 10.0.0.2:80 passing@11")
}

// A re-listing joins verdicts to every instance the view holds, also one
// whose value is no longer valid (its last valid value is kept), and
// settles panics: a service that entered panic while the feed was away
// has its failing instances updated in the Resync.
func TestFeedRelistJoinsKeptInstancesAndSettlesPanic(t *testing.T) {
	g := newFeedRig(t)
	a, b := g.kvOf(checked(1, "10.0.0.1:80"), 5, 5), g.kvOf(checked(2, "10.0.0.2:80"), 6, 6)
	g.f.applyListing([]store.KeyValue{a, b}, 10)
	c := &cursor{}
	wantHealth(t, g.batch(c), Snapshot, "added 10.0.0.1:80 unknown@5", "added 10.0.0.2:80 unknown@6")
	garbage := a
	garbage.Value, garbage.ModRevision = []byte(`{"not":"an instance"}`), 11
	g.f.applyListing([]store.KeyValue{garbage, g.verdict(1, beacon.HealthFailing, 12), b, g.verdict(2, beacon.HealthFailing, 13)}, 14)
	wantHealth(t, g.batch(c), Resync, "updated 10.0.0.1:80 failing!@14", "updated 10.0.0.2:80 failing!@14")
}

// A re-listed key written again with the same value (a session taking
// over its key under a new lease, compare-and-swap) delivers nothing, but
// its item takes the new lease, which the removal hold counts bursts by.
// So does one created again at the same revision.
func TestFeedRelistTakesTheLeaseOfAnEqualRewrite(t *testing.T) {
	g := newFeedRig(t)
	a := g.kvOf(checked(1, "10.0.0.1:80"), 5, 5)
	a.Lease = 1
	g.f.applyListing([]store.KeyValue{a}, 10)
	c := &cursor{}
	g.batch(c)
	a.Lease, a.ModRevision = 2, 11
	g.f.applyListing([]store.KeyValue{a}, 12)
	g.idle(c)
	if it, _ := g.f.view.Get(a.Key); it.Lease != 2 || it.Mod != 11 {
		t.Fatalf("item on lease %d at mod revision %d, want lease 2 at 11", it.Lease, it.Mod)
	}
	// The same revision, created at another (a store restored from a
	// backup): another write, on another lease.
	a.Lease, a.CreateRevision = 3, 9
	g.f.applyListing([]store.KeyValue{a}, 12)
	g.idle(c)
	if it, _ := g.f.view.Get(a.Key); it.Lease != 3 || it.Create != 9 {
		t.Fatalf("item on lease %d created at %d, want lease 3 created at 9", it.Lease, it.Create)
	}
}
