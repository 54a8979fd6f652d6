package view

import (
	"context"
	"errors"
	"fmt"
	"math/rand/v2"
	"runtime"
	"slices"
	"sync"
	"testing"
	"time"

	"github.com/beaconplane/beacon"
)

// The tests' oracle is their own: a consumer's state is a map from key to
// address and status, compared with same (never beacon.Instance.Equal).

func inst(id, addr string) beacon.Instance {
	return beacon.Instance{Namespace: "ns", Component: "c", Endpoint: "e", ID: id, Address: addr}
}

func it(key, addr string, rev int64) *Item {
	return &Item{Key: key, Inst: inst(key, addr), Rev: rev}
}

func same(a, b beacon.Instance) bool {
	return a.Ref().String() == b.Ref().String() && a.Address == b.Address && a.Status == b.Status
}

// state is a consumer's state: ID -> instance.
type state map[string]beacon.Instance

func (s state) apply(t *testing.T, evs []beacon.Event) {
	t.Helper()
	for _, e := range evs {
		id := e.Instance.ID
		_, had := s[id]
		switch e.Type {
		case beacon.Added:
			if had {
				t.Fatalf("Added %s, which the consumer has", id)
			}
			s[id] = e.Instance
		case beacon.Updated:
			if !had {
				t.Fatalf("Updated %s, which the consumer lacks", id)
			}
			s[id] = e.Instance
		case beacon.Removed:
			if !had {
				t.Fatalf("Removed %s, which the consumer lacks", id)
			}
			delete(s, id)
		}
	}
}

func (s state) equals(v *Version) bool {
	if len(s) != v.Len() {
		return false
	}
	ok := true
	v.Ascend(func(it *Item) bool {
		got, has := s[it.Key]
		ok = has && same(got, it.Inst)
		return ok
	})
	return ok
}

func stateOf(v *Version) state {
	s := state{}
	v.Ascend(func(it *Item) bool { s[it.Key] = it.Inst; return true })
	return s
}

func TestSetLogsAChange(t *testing.T) {
	v := New()
	a := it("a", "1", 5)
	if old, logged := v.Set(a, 5); old != nil || !logged {
		t.Fatalf("Set of a new key = %v, %v", old, logged)
	}
	a2 := it("a", "2", 6)
	if old, logged := v.Set(a2, 6); old != a || !logged {
		t.Fatalf("Set of a changed instance = %v, %v", old, logged)
	}
	log, ok := v.Since(0)
	if !ok || len(log) != 2 || log[0].Seq != 1 || log[1].Seq != 2 || log[1].Before != a || log[1].After != a2 ||
		log[1].Rev != 6 || log[0].Before != nil || v.Seq() != 2 {
		t.Fatalf("log %+v, seq %d", log, v.Seq())
	}
}

func TestSetOfAnEqualInstanceReplacesButLogsNothing(t *testing.T) {
	v := New()
	v.Set(it("a", "1", 5), 5)
	b := it("a", "1", 9)
	if _, logged := v.Set(b, 9); logged || v.Seq() != 1 {
		t.Fatalf("Set of an equal instance logged (seq %d)", v.Seq())
	}
	if got, _ := v.Get("a"); got != b {
		t.Fatal("the item was not replaced")
	}
}

func TestDeleteLogsARemovalOfTheItemHeldOnly(t *testing.T) {
	v := New()
	a := it("a", "1", 5)
	v.Set(a, 5)
	if v.Delete(it("a", "1", 5), 6) || v.Len() != 1 {
		t.Fatal("Delete of an item the view does not hold removed the key")
	}
	if !v.Delete(a, 7) || v.Len() != 0 {
		t.Fatal("Delete of the item held did not remove it")
	}
	log, _ := v.Since(1)
	if len(log) != 1 || log[0].Before != a || log[0].After != nil || log[0].Rev != 7 || log[0].Late {
		t.Fatalf("log %+v", log)
	}
	if v.Delete(a, 8) {
		t.Fatal("Delete of an absent key")
	}
}

func TestDeliverIsLateOnlyOnceABatchWasGivenAtTheRevision(t *testing.T) {
	v := New()
	a, b, c := it("a", "1", 5), it("b", "1", 5), it("c", "1", 5)
	v.Load([]*Item{a, b, c}, 5)
	if !v.Deliver(a) {
		t.Fatal("Deliver of a held item")
	}
	v.Given(4)
	v.Deliver(b)
	v.Given(5)
	v.Given(4) // an earlier batch does not undo a later one
	v.Deliver(c)
	if v.Deliver(c) || v.Deliver(it("b", "1", 5)) {
		t.Fatal("Deliver of an item the view does not hold")
	}
	d, d2 := it("d", "1", 5), it("d", "2", 6)
	v.Set(d, 6)
	v.Set(d2, 6) // written again while its removal was held
	if v.Deliver(d) {
		t.Fatal("Deliver of an item replaced since")
	}
	if got, _ := v.Get("d"); got != d2 {
		t.Fatal("Deliver of a replaced item removed its successor")
	}
	log, _ := v.Since(0)
	if len(log) < 3 || log[0].Late || log[1].Late || !log[2].Late || log[2].Rev != 5 {
		t.Fatalf("log %+v", log)
	}
}

func TestLoadLogsNothing(t *testing.T) {
	v := New()
	v.Load([]*Item{it("a", "1", 3), it("b", "1", 4)}, 7)
	if v.Seq() != 0 || v.Rev() != 7 || v.Len() != 2 {
		t.Fatalf("after Load: seq %d rev %d len %d", v.Seq(), v.Rev(), v.Len())
	}
	if _, ok := v.After(6); ok {
		t.Fatal("resume from before the first listing")
	}
	if log, ok := v.After(7); !ok || len(log) != 0 {
		t.Fatalf("resume from the listing = %v, %v", log, ok)
	}
}

func TestVersionIsImmutableAndCachedUntilAChange(t *testing.T) {
	v := New()
	v.Set(it("a", "1", 1), 1)
	v.SetRev(1)
	v1 := v.Version()
	if v.Version() != v1 {
		t.Fatal("two versions of one state")
	}
	v.Set(it("a", "2", 2), 2)
	v.Set(it("b", "1", 2), 2)
	if got, _ := v1.Get("a"); got.Inst.Address != "1" || v1.Len() != 1 || v1.Seq != 1 || v1.Rev != 1 {
		t.Fatal("a change reached an earlier version")
	}
	if v2 := v.Version(); v2 == v1 || v2.Seq != 3 {
		t.Fatal("a change did not make a new version")
	}
	for name, change := range map[string]func(){"SetRev": func() { v.SetRev(9) }, "Relisted": v.Relisted} {
		before := v.Version()
		change()
		if after := v.Version(); after == before {
			t.Fatalf("%s did not make a new version", name)
		}
	}
	if got := v.Version(); got.Rev != 9 || got.Relists != 1 {
		t.Fatalf("version at rev %d relists %d", got.Rev, got.Relists)
	}
}

func TestSinceGivesTheChangesAfterASeqUntilTrimmed(t *testing.T) {
	v := New()
	n := 2*MinLogLen + 1
	for i := range n {
		if i == 2*MinLogLen {
			if _, ok := v.Since(0); !ok {
				t.Fatal("trimmed within twice the allowance")
			}
		}
		v.Set(it("a", fmt.Sprint(i), int64(i+1)), int64(i+1))
		v.SetRev(int64(i + 1))
		v.Trim()
	}
	if len(v.log) > 2*MinLogLen {
		t.Fatalf("log of %d changes, past twice its allowance", len(v.log))
	}
	if _, ok := v.Since(0); ok {
		t.Fatal("Since(0) after a trim")
	}
	log, ok := v.Since(uint64(n - 3))
	if !ok || len(log) != 3 || log[0].Seq != uint64(n-2) || log[2].Seq != uint64(n) {
		t.Fatalf("Since(%d) = %d entries, %v", n-3, len(log), ok)
	}
	if log, ok := v.Since(uint64(n)); !ok || len(log) != 0 {
		t.Fatal("Since(seq) is not empty")
	}
	// The first change kept is resumable from the revision before it.
	if _, ok := v.After(v.floorRev - 1); ok {
		t.Fatal("resume from a trimmed revision")
	}
	if _, ok := v.After(v.floorRev); !ok {
		t.Fatal("no resume from the floor revision")
	}
}

func TestTrimKeepsAtLeastOneChangePerItem(t *testing.T) {
	v := New()
	items := 3 * MinLogLen
	for i := range items {
		v.Set(it(fmt.Sprint(i), "1", 1), 1)
	}
	v.Trim()
	if len(v.log) != items {
		t.Fatalf("trimmed to %d below the number of items %d", len(v.log), items)
	}
}

func TestAfterGivesLaterChangesAndLateOnesAtTheRevision(t *testing.T) {
	v := New()
	a, b, c := it("a", "1", 1), it("b", "1", 1), it("c", "1", 2)
	v.Load([]*Item{a, b}, 1)
	v.Set(c, 2)
	v.SetRev(2)
	v.Given(2)
	v.Deliver(a) // late at 2
	v.Set(it("d", "1", 3), 3)
	v.SetRev(3)
	log, ok := v.After(2)
	if !ok || len(log) != 2 || log[0].Key != "a" || log[1].Key != "d" {
		t.Fatalf("After(2) = %+v, %v", log, ok)
	}
	log, ok = v.After(1)
	if !ok || len(log) != 3 {
		t.Fatalf("After(1) = %+v, %v", log, ok)
	}
	for _, rev := range []int64{0, -1, 4} {
		if _, ok := v.After(rev); ok {
			t.Fatalf("After(%d) resumed", rev)
		}
	}
}

func TestAfterNoRevisionIsNoResume(t *testing.T) {
	v := New()
	v.Set(it("a", "1", 1), 1)
	v.SetRev(1)
	if _, ok := v.After(0); ok {
		t.Fatal("a watch without a revision resumed (it gets a snapshot)")
	}
}

func TestRebaseForgetsTheLog(t *testing.T) {
	v := New()
	v.Load(nil, 10)
	v.Set(it("a", "1", 11), 11)
	v.SetRev(11)
	v.Rebase(5)
	v.SetRev(5)
	if _, ok := v.Since(0); ok {
		t.Fatal("Since(0) after a rebase")
	}
	if _, ok := v.After(4); ok {
		t.Fatal("resume from before the rebase")
	}
	if log, ok := v.After(5); !ok || len(log) != 0 {
		t.Fatal("no resume from the rebase revision")
	}
}

func TestSnapshotListsSelectedItemsInKeyOrderAtTheirRevisions(t *testing.T) {
	v := New()
	v.Load([]*Item{it("b", "1", 4), it("a", "1", 7), it("c", "1", 2)}, 9)
	evs := Snapshot(v.Version(), func(it *Item) bool { return it.Key != "c" })
	if len(evs) != 2 || evs[0].Instance.ID != "a" || evs[0].Revision != 7 || evs[1].Instance.ID != "b" ||
		evs[1].Revision != 4 || evs[0].Type != beacon.Added {
		t.Fatalf("snapshot %+v", evs)
	}
	if evs := Snapshot(New().Version(), nil); evs == nil || len(evs) != 0 {
		t.Fatal("the snapshot of nothing is not an empty list")
	}
}

func TestDiffTreesRevisions(t *testing.T) {
	v := New()
	v.Load([]*Item{it("a", "1", 1), it("b", "1", 1), it("c", "1", 1)}, 1)
	old := v.Version()
	v.Delete(mustGet(v, "a"), 2)
	v.Set(it("b", "2", 3), 3)
	v.Set(it("d", "1", 4), 4)
	v.Set(it("c", "1", 5), 5) // rewritten, same instance
	v.SetRev(6)
	evs := DiffTrees(old, v.Version(), nil)
	want := []string{"updated b 3", "added d 4", "removed a 6"}
	if got := describe(evs); !slices.Equal(got, want) {
		t.Fatalf("DiffTrees = %v, want %v", got, want)
	}
	evs = DiffTrees(old, v.Version(), func(it *Item) bool { return it.Key != "b" })
	if got := describe(evs); !slices.Equal(got, []string{"added d 4", "removed a 6"}) {
		t.Fatalf("DiffTrees without b = %v", got)
	}
}

func TestDiffLogGivesOneEventPerKeyAtItsLastChange(t *testing.T) {
	v := New()
	v.Load([]*Item{it("a", "1", 1), it("b", "1", 1)}, 1)
	old := v.Version()
	v.Set(it("a", "2", 2), 2)
	v.Set(it("a", "3", 3), 3)
	v.Set(it("c", "1", 3), 3)
	v.Delete(mustGet(v, "c"), 4) // added and removed: nothing
	v.Set(it("b", "2", 5), 5)
	v.Set(it("b", "1", 6), 6) // back to what the consumer has: nothing
	v.Delete(mustGet(v, "b"), 7)
	v.SetRev(7)
	log, _ := v.Since(old.Seq)
	got := describe(DiffLog(old, v.Version(), log, nil))
	if want := []string{"updated a 3", "removed b 7"}; !slices.Equal(got, want) {
		t.Fatalf("DiffLog = %v, want %v", got, want)
	}
	got = describe(DiffLog(old, v.Version(), log, func(it *Item) bool { return it.Key != "a" }))
	if want := []string{"removed b 7"}; !slices.Equal(got, want) {
		t.Fatalf("DiffLog without a = %v, want %v", got, want)
	}
}

func TestResumeStartsFromEachKeysFirstEntry(t *testing.T) {
	v := New()
	v.Load([]*Item{it("a", "1", 1), it("b", "1", 1), it("c", "1", 1)}, 1)
	v.Set(it("a", "2", 2), 2)
	v.Delete(mustGet(v, "b"), 3)
	v.Set(it("d", "1", 4), 4)
	v.Set(it("c", "2", 5), 5)
	v.Set(it("c", "1", 6), 6) // back: nothing for a consumer at 1
	v.SetRev(6)
	log, _ := v.After(1)
	got := describe(Resume(log, v.Version()))
	if want := []string{"updated a 2", "removed b 3", "added d 4"}; !slices.Equal(got, want) {
		t.Fatalf("Resume = %v, want %v", got, want)
	}
}

func TestSortEventsByRevisionThenInstance(t *testing.T) {
	evs := []beacon.Event{
		{Instance: inst("b", ""), Revision: 2}, {Instance: inst("a", ""), Revision: 2}, {Instance: inst("c", ""), Revision: 1},
	}
	SortEvents(evs)
	if evs[0].Instance.ID != "c" || evs[1].Instance.ID != "a" || evs[2].Instance.ID != "b" {
		t.Fatalf("sorted %v", describe(evs))
	}
}

func TestWakeNotifiesEveryWaiterAndKeepsTheFirstError(t *testing.T) {
	var w Wake
	c1 := w.C()
	if w.C() != c1 {
		t.Fatal("two channels before a Notify")
	}
	w.Notify()
	select {
	case <-c1:
	default:
		t.Fatal("Notify did not close the channel")
	}
	c2 := w.C()
	select {
	case <-c2:
		t.Fatal("a new channel is closed")
	default:
	}
	first := errors.New("first")
	w.Fail(first)
	w.Fail(errors.New("second"))
	if !errors.Is(w.Err(), first) {
		t.Fatalf("Err = %v", w.Err())
	}
	select {
	case <-c2:
	default:
		t.Fatal("Fail did not wake the waiters")
	}
}

// TestWakeHasTheNextChannelReadyAfterNotify: once C was called, Notify
// makes the next channel itself, so that C only reads (the registry's
// watchers call it under a shared read lock, where making it would race).
func TestWakeHasTheNextChannelReadyAfterNotify(t *testing.T) {
	var w Wake
	w.C()
	w.Notify()
	if w.ch == nil {
		t.Fatal("Notify left no channel: the next C would make one")
	}
	w.Fail(errors.New("end"))
	if w.ch == nil {
		t.Fatal("Fail left no channel")
	}
}

// TestGivenConcurrentKeepsTheHighest: Given runs under the owner's read
// lock, many at once; the highest revision stays, and a Deliver at it
// afterwards is Late.
func TestGivenConcurrentKeepsTheHighest(t *testing.T) {
	v := New()
	a := it("a", "1", 64)
	v.Load([]*Item{a}, 64)
	var wg sync.WaitGroup
	for rev := range int64(65) {
		wg.Go(func() { v.Given(rev) })
	}
	wg.Wait()
	if g := v.given.Load(); g != 64 {
		t.Fatalf("given %d after Given(0..64), want 64", g)
	}
	v.Deliver(a)
	if log, _ := v.Since(0); len(log) != 1 || !log[0].Late {
		t.Fatalf("a removal delivered at the revision given: log %+v, want one Late change", log)
	}
}

// A consumer that applies what the diffs say reaches every version, from
// any earlier one, whether the log covers the gap or not: random changes
// against a model.
func TestDiffsTakeAnyVersionToAnyLaterOne(t *testing.T) {
	rng := rand.New(rand.NewPCG(1, 2))
	v := New()
	v.Load(nil, 1)
	var versions []*Version
	rev := int64(1)
	for step := range 3000 {
		rev++
		key := fmt.Sprint(rng.IntN(40))
		switch cur, ok := v.Get(key); {
		case ok && rng.IntN(3) == 0:
			v.Delete(cur, rev)
		case ok && rng.IntN(4) == 0:
			v.Given(v.Rev())
			v.Amend(it(key, fmt.Sprint(rng.IntN(3)), v.Rev())) // at the revision already given
		default:
			v.Set(it(key, fmt.Sprint(rng.IntN(3)), rev), rev)
		}
		v.SetRev(rev)
		v.Trim()
		if step%50 == 0 {
			versions = append(versions, v.Version())
		}
	}
	cur := v.Version()
	for _, old := range versions {
		s := stateOf(old)
		s.apply(t, DiffTrees(old, cur, nil))
		if !s.equals(cur) {
			t.Fatalf("DiffTrees from seq %d does not reach the current version", old.Seq)
		}
		if log, ok := v.Since(old.Seq); ok {
			s := stateOf(old)
			s.apply(t, DiffLog(old, cur, log, nil))
			if !s.equals(cur) {
				t.Fatalf("DiffLog from seq %d does not reach the current version", old.Seq)
			}
		}
		if log, ok := v.After(old.Rev); ok {
			s := stateOf(old)
			s.apply(t, Resume(log, cur))
			if !s.equals(cur) {
				t.Fatalf("Resume from rev %d does not reach the current version", old.Rev)
			}
		}
	}
}

func mustGet(v *View, key string) *Item {
	it, _ := v.Get(key)
	return it
}

func describe(evs []beacon.Event) []string {
	var out []string
	for _, e := range evs {
		out = append(out, fmt.Sprintf("%v %s %d", e.Type, e.Instance.ID, e.Revision))
	}
	return out
}

func TestWaitAsksAgainAfterEachWakeUntilABatch(t *testing.T) {
	ended := errors.New("ended")
	life := Begin(context.Background(), func() {})
	wake := make(chan struct{})
	close(wake)
	asked := 0
	b, err := Wait(context.Background(), life, func() error { return ended }, func() (int, bool, <-chan struct{}, error) {
		asked++
		switch asked {
		case 1:
			return 0, false, nil, nil // ask again at once
		case 2:
			return 0, false, wake, nil // wait, then ask again
		}
		return 7, true, nil, nil
	})
	if b != 7 || err != nil || asked != 3 {
		t.Fatalf("Wait = %d, %v after %d asks", b, err, asked)
	}
	boom := errors.New("boom")
	if _, err := Wait(context.Background(), life, nil, func() (int, bool, <-chan struct{}, error) { return 1, true, nil, boom }); !errors.Is(err, boom) {
		t.Fatalf("an error from ask: %v", err)
	}
	never := make(chan struct{})
	ctx, cancel := context.WithCancel(context.Background())
	cancel()
	if _, err := Wait(ctx, life, nil, func() (int, bool, <-chan struct{}, error) { return 0, false, never, nil }); !errors.Is(err, context.Canceled) {
		t.Fatalf("a done context: %v", err)
	}
	life.End()
	if _, err := Wait(context.Background(), life, func() error { return ended }, func() (int, bool, <-chan struct{}, error) {
		t.Fatal("asked after the watcher ended")
		return 0, false, nil, nil
	}); !errors.Is(err, ended) {
		t.Fatalf("an ended watcher: %v", err)
	}
}

// A Wait on the very context its Life began with (not waited on apart:
// the Life ends with it) returns that context's error when it ends while
// waiting, as a Wait on another context does; a Life ended by End while
// its context goes on gives ended().
func TestWaitOnTheLifesContextReturnsItsError(t *testing.T) {
	ended := errors.New("ended")
	for _, tc := range []struct {
		name      string
		sameCtx   bool
		endByLife bool
		want      error
	}{
		{"the Life's context ends", true, false, context.Canceled},
		{"another context ends", false, false, context.Canceled},
		{"the Life ends, its context goes on", true, true, ended},
	} {
		t.Run(tc.name, func(t *testing.T) {
			lifeCtx, cancelLife := context.WithCancel(context.Background())
			defer cancelLife()
			life := Begin(lifeCtx, func() {})
			ctx, cancel := lifeCtx, cancelLife
			if !tc.sameCtx {
				ctx, cancel = context.WithCancel(context.Background())
				defer cancel()
			}
			waiting := make(chan struct{})
			never := make(chan struct{})
			res := make(chan error, 1)
			go func() {
				_, err := Wait(ctx, life, func() error { return ended }, func() (int, bool, <-chan struct{}, error) {
					close(waiting)
					return 0, false, never, nil
				})
				res <- err
			}()
			select {
			case <-waiting:
			case <-time.After(time.Minute):
				t.Fatal("Wait did not ask within a minute")
			}
			if tc.endByLife {
				life.End()
			} else {
				cancel()
			}
			select {
			case err := <-res:
				if !errors.Is(err, tc.want) {
					t.Fatalf("Wait = %v, want %v", err, tc.want)
				}
			case <-time.After(time.Minute):
				t.Fatal("Wait did not return within a minute")
			}
			if !tc.sameCtx {
				select {
				case <-life.Done():
					t.Fatal("the Life ended with another context")
				default:
				}
			}
		})
	}
}

// A Life ends once: by End or by its context, whichever is first; release
// runs once, and Done is closed from then on.
func TestLifeEndsOnceByEndOrContext(t *testing.T) {
	for _, byContext := range []bool{false, true} {
		ctx, cancel := context.WithCancel(context.Background())
		released := make(chan struct{}, 2)
		l := Begin(ctx, func() { released <- struct{}{} })
		select {
		case <-l.Done():
			t.Fatal("Done closed before the Life ended")
		default:
		}
		if byContext {
			cancel()
		} else {
			l.End()
		}
		select {
		case <-l.Done():
		case <-time.After(time.Minute):
			t.Fatalf("byContext=%v: Done not closed within a minute", byContext)
		}
		<-released
		l.End()
		cancel()
		l.End()
		if n := len(released); n != 0 {
			t.Fatalf("byContext=%v: release ran %d more times, want once in all", byContext, n)
		}
	}
}

func TestAmendReplacesAtTheCurrentRevisionLateOnceGiven(t *testing.T) {
	v := New()
	a, b := it("a", "1", 5), it("b", "1", 5)
	v.Load([]*Item{a, b}, 5)
	if v.Amend(it("c", "1", 5)) || v.Len() != 2 {
		t.Fatal("Amend of an absent key added it")
	}
	a2 := it("a", "2", 5)
	if !v.Amend(a2) {
		t.Fatal("Amend of a changed instance logged nothing")
	}
	v.Given(5)
	b2 := it("b", "2", 5)
	v.Amend(b2)
	b3 := it("b", "2", 5)
	if v.Amend(b3) {
		t.Fatal("Amend of an equal instance logged a change")
	}
	if got, _ := v.Get("b"); got != b3 {
		t.Fatal("Amend of an equal instance did not replace the item")
	}
	log, _ := v.Since(0)
	if len(log) != 2 || log[0].Late || log[0].Before != a || log[0].After != a2 || log[0].Rev != 5 ||
		!log[1].Late || log[1].Before != b || log[1].After != b2 || log[1].Rev != 5 {
		t.Fatalf("log %+v", log)
	}
	// A watcher resuming from the revision it was given gets the late one.
	if log, ok := v.After(5); !ok || len(log) != 1 || log[0].Key != "b" {
		t.Fatalf("After(5) = %+v, %v", log, ok)
	}
}

// big is an item whose metadata weighs about size bytes.
func big(key, addr string, rev int64, size int) *Item {
	i := it(key, addr, rev)
	i.Inst.Metadata = map[string]string{"blob": string(make([]byte, size))}
	return i
}

// checkWeights fails unless treeBytes and logBytes are what the items in
// the tree and the log's Before items weigh.
func checkWeights(t *testing.T, v *View) {
	t.Helper()
	var tree, log int64
	v.tree.Ascend(func(i *Item) bool { tree += i.weight(); return true })
	for _, c := range v.log {
		if c.Before != nil {
			log += c.Before.weight()
		}
	}
	if v.treeBytes != tree || v.logBytes != log {
		t.Fatalf("treeBytes %d, logBytes %d; the items weigh %d and %d", v.treeBytes, v.logBytes, tree, log)
	}
}

func TestTrimBoundsTheLogInBytes(t *testing.T) {
	v := New()
	const size = 64 << 10 // 10 items of 64 KiB: the state weighs far less than MinLogBytes
	for i := range 10 {
		v.Set(big(fmt.Sprint(i), "0", 1, size), 1)
	}
	for i := range 1000 {
		rev := int64(i + 2)
		v.Set(big(fmt.Sprint(i%10), fmt.Sprint(i), rev, size), rev)
		v.SetRev(rev)
		v.Trim()
		if v.logBytes > 2*MinLogBytes {
			t.Fatalf("after %d updates the log holds %d bytes of replaced items, past twice MinLogBytes", i+1, v.logBytes)
		}
	}
	if len(v.log) >= MinLogLen/8 {
		t.Fatalf("the log keeps %d changes of 64 KiB items", len(v.log))
	}
	if _, ok := v.Since(0); ok {
		t.Fatal("Since(0) after a trim")
	}
	checkWeights(t, v)
}

func TestTrimKeepsAFullTurnoverInBytes(t *testing.T) {
	v := New()
	const n, size = 64, 64 << 10 // the state weighs twice MinLogBytes
	for i := range n {
		v.Set(big(fmt.Sprint(i), "0", 1, size), 1)
	}
	v.SetRev(1)
	v.Trim()
	seq := v.Seq()
	for i := range n { // every item replaced once
		v.Set(big(fmt.Sprint(i), "1", 2, size), 2)
	}
	v.SetRev(2)
	v.Trim()
	if log, ok := v.Since(seq); !ok || len(log) != n {
		t.Fatalf("after a turnover of the whole state, Since gives %d changes, %v; want all %d", len(log), ok, n)
	}
}

func TestWeightsFollowEveryChange(t *testing.T) {
	v := New()
	rng := rand.New(rand.NewPCG(3, 4))
	v.Load([]*Item{big("a", "0", 1, 100), it("b", "0", 1)}, 1)
	checkWeights(t, v)
	for i := range 3000 {
		rev := v.Rev() + 1
		key := fmt.Sprint(rng.IntN(20))
		switch rng.IntN(6) {
		case 0, 1:
			v.Set(big(key, fmt.Sprint(i), rev, rng.IntN(4000)), rev)
			v.SetRev(rev)
		case 2:
			if cur, ok := v.Get(key); ok {
				v.Delete(cur, rev)
				v.SetRev(rev)
			}
		case 3:
			if cur, ok := v.Get(key); ok {
				v.Deliver(cur)
			}
		case 4:
			v.Amend(big(key, fmt.Sprint(i), v.Rev(), rng.IntN(4000)))
		case 5:
			if rng.IntN(100) == 0 {
				v.Rebase(v.Rev())
			}
		}
		v.Trim()
		checkWeights(t, v)
	}
}

// BenchmarkLogOfLargeItems updates 10 instances 8,000 times, trimming as
// the feeds do, and reports the heap the view keeps, for 4 KiB (the
// default limit) and 64 KiB of metadata per instance.
func BenchmarkLogOfLargeItems(b *testing.B) {
	for _, size := range []int{4 << 10, 64 << 10} {
		b.Run(fmt.Sprintf("metadata=%dKiB", size>>10), func(b *testing.B) {
			for b.Loop() {
				v := New()
				for i := range 8000 {
					rev := int64(i + 1)
					v.Set(big(fmt.Sprint(i%10), fmt.Sprint(i), rev, size), rev)
					v.SetRev(rev)
					v.Trim()
				}
				runtime.GC()
				var ms runtime.MemStats
				runtime.ReadMemStats(&ms)
				b.ReportMetric(float64(ms.HeapInuse)/(1<<20), "heap-MiB")
				runtime.KeepAlive(v)
			}
		})
	}
}
