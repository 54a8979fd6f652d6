package etcdwatch

import (
	"errors"
	"testing"
	"time"

	"go.etcd.io/etcd/api/v3/mvccpb"
	clientv3 "go.etcd.io/etcd/client/v3"
)

// The pure tests drive State and Silence with a hand-moved clock; each is
// one transition or invariant of doc.go, with expected values worked out
// by hand (no production helper as the oracle).

const T = 8 * time.Second // a timeout whose eighths are whole seconds

var t0 = time.Date(2026, 1, 1, 0, 0, 0, 0, time.UTC)

func at(s int) time.Time { return t0.Add(time.Duration(s) * time.Second) }

func evs(revs ...int64) []*clientv3.Event {
	out := make([]*clientv3.Event, len(revs))
	for i, r := range revs {
		out[i] = &clientv3.Event{Type: mvccpb.PUT, Kv: &mvccpb.KeyValue{Key: []byte("k"), ModRevision: r}}
	}
	return out
}

func revsOf(es []*clientv3.Event) []int64 {
	var out []int64
	for _, e := range es {
		out = append(out, e.Kv.ModRevision)
	}
	return out
}

func equal(a, b []int64) bool {
	if len(a) != len(b) {
		return false
	}
	for i := range a {
		if a[i] != b[i] {
			return false
		}
	}
	return true
}

// watching returns a watch from rev, opened and created at created.
func watching(rev, created int64) *State {
	s := New(rev, T, at(0))
	s.Opened()
	s.Created(created)
	return s
}

func TestSilenceListeningBeforeHalfTheTimeout(t *testing.T) {
	s := Silence{Timeout: T}
	s.Start(at(0))
	if v := s.Check(at(3)); v != Listening {
		t.Fatalf("quiet 3s of 8s: %v, want listening", v)
	}
}

func TestSilenceAsksAtHalfTheTimeout(t *testing.T) {
	s := Silence{Timeout: T}
	s.Start(at(0))
	if v := s.Check(at(4)); v != Ask {
		t.Fatalf("quiet 4s of 8s: %v, want ask", v)
	}
}

func TestSilenceReplacesAheadAnEighthAfterAnUnansweredAsk(t *testing.T) {
	s := Silence{Timeout: T}
	s.Start(at(0))
	s.Check(at(4)) // ask
	if v := s.Check(at(4)); v != Listening {
		t.Fatalf("right after the ask: %v, want listening", v)
	}
	if v := s.Check(at(5)); v != ReplaceAhead {
		t.Fatalf("ask unanswered for T/8: %v, want replace-ahead", v)
	}
	if v := s.Check(at(5)); v != Listening {
		t.Fatalf("replace-ahead said twice in one quiet spell: %v", v)
	}
}

func TestSilenceAsksAgainAfterAQuarter(t *testing.T) {
	s := Silence{Timeout: T}
	s.Start(at(0))
	s.Check(at(4)) // ask
	s.Check(at(5)) // replace-ahead
	if v := s.Check(at(5).Add(999 * time.Millisecond)); v != Listening {
		t.Fatalf("before T/4 after the ask: %v, want listening", v)
	}
	if v := s.Check(at(6)); v != Ask {
		t.Fatalf("ask unanswered for T/4: %v, want ask again", v)
	}
	if v := s.Check(at(6).Add(500 * time.Millisecond)); v != Listening {
		t.Fatalf("half a second after asking again: %v, want listening", v)
	}
}

func TestSilenceSilentAtTheTimeout(t *testing.T) {
	s := Silence{Timeout: T}
	s.Start(at(0))
	s.Check(at(4))
	if v := s.Check(at(8).Add(-time.Millisecond)); v == Silent {
		t.Fatal("silent before the timeout")
	}
	if v := s.Check(at(8)); v != Silent {
		t.Fatalf("quiet for the timeout: %v, want silent", v)
	}
}

func TestSilenceSilentOnlyHalfATimeoutAfterTheFirstAsk(t *testing.T) {
	s := Silence{Timeout: T}
	s.Start(at(0))
	if v := s.Check(at(6)); v != Ask { // the owner checked late
		t.Fatalf("first check, quiet 6s: %v, want ask", v)
	}
	s.Check(at(7)) // replace-ahead
	s.Check(at(8)) // ask again
	if v := s.Check(at(9)); v == Silent {
		t.Fatal("silent 3s after the first ask, want half the timeout")
	}
	if v := s.Check(at(10)); v != Silent {
		t.Fatalf("first ask unanswered for T/2: %v, want silent", v)
	}
}

func TestSilenceHeardAnswersTheAsk(t *testing.T) {
	s := Silence{Timeout: T}
	s.Start(at(0))
	s.Check(at(4)) // ask
	s.Check(at(5)) // replace-ahead
	s.Heard(at(6)) // answered
	if v := s.Check(at(9)); v != Listening {
		t.Fatalf("quiet 3s after the answer: %v, want listening", v)
	}
	if v := s.Check(at(10)); v != Ask {
		t.Fatalf("quiet T/2 after the answer: %v, want a new ask", v)
	}
	if v := s.Check(at(11)); v != ReplaceAhead {
		t.Fatalf("a new quiet spell: %v, want replace-ahead again", v)
	}
}

func TestSilenceHeardBeforeTheAskDoesNotAnswerIt(t *testing.T) {
	s := Silence{Timeout: T}
	s.Start(at(0))
	s.Check(at(4))                              // ask at 4
	s.Heard(at(1))                              // a late report of something heard at 1
	if v := s.Check(at(5)); v != ReplaceAhead { // the ask is still out
		t.Fatalf("after an older sign of life: %v, want replace-ahead", v)
	}
	if got := s.LastHeard(); !got.Equal(at(1)) {
		t.Fatalf("last heard %v, want %v", got, at(1))
	}
	s.Heard(at(0)) // heard never goes back
	if got := s.LastHeard(); !got.Equal(at(1)) {
		t.Fatalf("last heard went back to %v", got)
	}
}

func TestSilenceDisabled(t *testing.T) {
	s := Silence{}
	s.Start(at(0))
	if v := s.Check(at(1000)); v != Listening {
		t.Fatalf("no timeout: %v, want listening", v)
	}
}

func TestPositionWatchFromNowStartsAfterCreated(t *testing.T) {
	s := watching(0, 41)
	if s.Next != 42 || s.Known != 41 {
		t.Fatalf("from now, created at 41: next %d known %d, want 42 and 41", s.Next, s.Known)
	}
	s.Created(50) // a second created response (a reconnect) moves nothing
	if s.Next != 42 || s.Known != 50 {
		t.Fatalf("created again at 50: next %d known %d, want 42 and 50", s.Next, s.Known)
	}
}

func TestPositionWatchFromARevisionKeepsIt(t *testing.T) {
	s := watching(10, 41)
	if s.Next != 10 {
		t.Fatalf("from 10, created at 41: next %d, want 10", s.Next)
	}
}

func TestPositionProgressMovesNext(t *testing.T) {
	s := watching(10, 5)
	s.Progress(20)
	if s.Next != 21 || s.Known != 20 {
		t.Fatalf("progress at 20: next %d known %d, want 21 and 20", s.Next, s.Known)
	}
	s.Progress(15) // an older progress moves nothing back
	if s.Next != 21 || s.Known != 20 {
		t.Fatalf("progress at 15 after 20: next %d known %d", s.Next, s.Known)
	}
}

func TestPositionFreshDropsWhatWasDelivered(t *testing.T) {
	s := watching(10, 5)
	if got := revsOf(s.Fresh(12, evs(8, 9, 10, 11, 12))); !equal(got, []int64{10, 11, 12}) {
		t.Fatalf("from 10: delivered %v, want [10 11 12]", got)
	}
	if s.Next != 13 || s.Known != 12 {
		t.Fatalf("next %d known %d, want 13 and 12", s.Next, s.Known)
	}
	if got := s.Fresh(14, evs(11, 12)); len(got) != 0 {
		t.Fatalf("repeated events delivered again: %v", revsOf(got))
	}
	if s.Next != 13 || s.Known != 14 {
		t.Fatalf("after repeats: next %d known %d, want 13 and 14", s.Next, s.Known)
	}
}

func TestPositionAhead(t *testing.T) {
	for _, c := range []struct {
		openedAt, known int64
		want            bool
	}{
		{openedAt: 11, known: 10, want: true},
		{openedAt: 10, known: 10, want: false},
		{openedAt: 9, known: 10, want: false},
		{openedAt: 11, known: 0, want: false}, // etcd said nothing yet
	} {
		p := Position{OpenedAt: c.openedAt, Known: c.known}
		if got := p.Ahead(); got != c.want {
			t.Errorf("opened at %d, known %d: ahead %v, want %v", c.openedAt, c.known, got, c.want)
		}
	}
}

func TestPositionCompactedBelowNext(t *testing.T) {
	for _, c := range []struct {
		openedAt, next, compact int64
		want                    bool
	}{
		{openedAt: 5, next: 10, compact: 8, want: true},
		{openedAt: 5, next: 10, compact: 10, want: true}, // a watch from 10 has all it needs
		{openedAt: 5, next: 10, compact: 11, want: false},
		{openedAt: 10, next: 10, compact: 8, want: false}, // not opened below next: etcd would not say so
		{openedAt: 0, next: 10, compact: 8, want: false},  // from now
	} {
		p := Position{OpenedAt: c.openedAt, Next: c.next}
		if got := p.CompactedBelowNext(c.compact); got != c.want {
			t.Errorf("opened at %d, next %d, compacted at %d: %v, want %v", c.openedAt, c.next, c.compact, got, c.want)
		}
	}
}

// TestPositionReplaceFrom pins the replacement policy both the etcd store
// (State) and the proxy's upstream watches use: only a watch ahead of
// etcd is replaced, from the last revision etcd reported.
func TestPositionReplaceFrom(t *testing.T) {
	for _, c := range []struct {
		openedAt, known, want int64
	}{
		{openedAt: 11, known: 10, want: 10},
		{openedAt: 10, known: 10, want: 0},
		{openedAt: 11, known: 0, want: 0}, // etcd said nothing yet
	} {
		p := Position{OpenedAt: c.openedAt, Next: c.openedAt, Known: c.known}
		if got := p.ReplaceFrom(); got != c.want {
			t.Errorf("opened at %d, known %d: replace from %d, want %d", c.openedAt, c.known, got, c.want)
		}
	}
}

// TestPositionCompacted pins the compaction fall-back both users share:
// opened below Next and compacted only below it, the watch opens again
// from Next, or from Known when Next is ahead of etcd; anything else is a
// CompactedError for Next.
func TestPositionCompacted(t *testing.T) {
	for _, c := range []struct {
		openedAt, next, known, compact, header int64
		want                                   int64 // 0: a CompactedError
	}{
		{openedAt: 5, next: 10, known: 9, compact: 8, header: 12, want: 10},
		{openedAt: 5, next: 10, known: 9, compact: 10, header: 10, want: 10},
		{openedAt: 5, next: 20, known: 9, compact: 12, header: 15, want: 15}, // Next ahead: from Known
		{openedAt: 5, next: 20, known: 9, compact: 12, header: 19, want: 19},
		{openedAt: 5, next: 20, known: 9, compact: 12, header: 20, want: 20},
		{openedAt: 5, next: 10, known: 9, compact: 11, header: 12, want: 0},
		{openedAt: 10, next: 10, known: 9, compact: 8, header: 12, want: 0},
	} {
		p := Position{OpenedAt: c.openedAt, Next: c.next, Known: c.known}
		from, err := p.Compacted(c.compact, c.header)
		var ce *CompactedError
		switch {
		case c.want == 0 && (!errors.As(err, &ce) || ce.Requested != c.next || ce.CompactRevision != c.compact):
			t.Errorf("%+v: from %d, err %v, want a CompactedError for %d at %d", c, from, err, c.next, c.compact)
		case c.want != 0 && (err != nil || from != c.want || p.OpenedAt != c.want):
			t.Errorf("%+v: from %d (opened at %d), err %v, want from %d", c, from, p.OpenedAt, err, c.want)
		}
		if p.Known != max(c.known, c.header) {
			t.Errorf("%+v: known %d, want the header's %d", c, p.Known, c.header)
		}
	}
}

func TestOpenedEntersWatching(t *testing.T) {
	s := New(10, T, at(0))
	if s.Phase() != Opening {
		t.Fatalf("new watch: %v, want opening", s.Phase())
	}
	s.Opened()
	if s.Phase() != Watching {
		t.Fatalf("opened: %v, want watching", s.Phase())
	}
}

func TestTickAsksOnlyAWatchThatIsOpen(t *testing.T) {
	s := New(10, T, at(0)) // clientv3's Watch has not returned
	if tk := s.OnTick(at(4)); tk.Ask || tk.ReplaceFrom != 0 {
		t.Fatalf("opening: %+v, want nothing", tk)
	}
	s = watching(10, 12)
	if tk := s.OnTick(at(4)); !tk.Ask {
		t.Fatalf("watching, quiet T/2: %+v, want ask", tk)
	}
}

func TestTickReplacesAWatchAheadOfEtcd(t *testing.T) {
	s := watching(11, 10) // from the revision after a listing at 10
	s.OnTick(at(4))       // ask: never answered
	tk := s.OnTick(at(5))
	if tk.ReplaceFrom != 10 || s.Phase() != Replacing {
		t.Fatalf("ahead, ask unanswered: %+v in %v, want a replacement from 10, replacing", tk, s.Phase())
	}
	if tk := s.OnTick(at(6)); tk.Ask || tk.ReplaceFrom != 0 || tk.AskReplacement {
		t.Fatalf("replacement requested, not created: %+v, want nothing", tk)
	}
}

func TestTickDoesNotReplaceAWatchNotAhead(t *testing.T) {
	s := watching(10, 12)
	s.OnTick(at(4))
	if tk := s.OnTick(at(5)); tk.ReplaceFrom != 0 || s.Phase() != Watching {
		t.Fatalf("not ahead: %+v in %v, want no replacement", tk, s.Phase())
	}
}

func TestTickSilent(t *testing.T) {
	s := watching(10, 12)
	s.OnTick(at(4)) // ask
	if tk := s.OnTick(at(8)); tk.Silent != T {
		t.Fatalf("quiet for T: %+v, want silent for %v", tk, T)
	}
}

func TestHeardPutsOffTheVerdict(t *testing.T) {
	s := watching(10, 12)
	s.OnHeard(at(6)) // e.g. the consumer took 6 s to take a response
	if tk := s.OnTick(at(9)); tk.Ask || tk.Silent != 0 {
		t.Fatalf("quiet 3s: %+v, want nothing", tk)
	}
	s.OnTick(at(10)) // ask
	if tk := s.OnTick(at(14)); tk.Silent != T {
		t.Fatalf("quiet 8s: %+v, want silent", tk)
	}
}

// replacing returns a watch ahead of etcd (from 11, etcd at 10) whose
// replacement from 10 was requested at 5.
func replacing(t *testing.T) *State {
	t.Helper()
	s := watching(11, 10)
	s.OnTick(at(4))
	if tk := s.OnTick(at(5)); tk.ReplaceFrom != 10 {
		t.Fatalf("no replacement: %+v", tk)
	}
	return s
}

func TestReplacementCreatedIsAskedEveryTick(t *testing.T) {
	s := replacing(t)
	s.OnHeard(at(6))
	s.OnReplacementCreated(12) // etcd moved on to 12 meanwhile
	if s.Phase() != Syncing || s.Known != 12 {
		t.Fatalf("replacement created at 12: %v known %d, want syncing, 12", s.Phase(), s.Known)
	}
	if tk := s.OnTick(at(7)); !tk.AskReplacement || tk.Ask {
		t.Fatalf("syncing, quiet 1s: %+v, want the replacement asked, not the current watch", tk)
	}
}

func TestTickNoSecondReplacementWhileOneIsInFlight(t *testing.T) {
	s := replacing(t)
	s.OnHeard(at(6))
	s.OnReplacementCreated(10) // Syncing; etcd has not synced it for long
	s.OnTick(at(10))           // ask (a new quiet spell)
	if tk := s.OnTick(at(11)); tk.ReplaceFrom != 0 || s.Phase() != Syncing {
		t.Fatalf("replacement in flight, ask unanswered: %+v in %v, want no second replacement", tk, s.Phase())
	}
}

func TestReplacementSyncedTakesOver(t *testing.T) {
	s := replacing(t)
	s.OnReplacementCreated(10)
	s.OnReplacementSynced()
	if s.Phase() != Watching || s.OpenedAt != 10 {
		t.Fatalf("synced: %v opened at %d, want watching from 10", s.Phase(), s.OpenedAt)
	}
	if s.Ahead() {
		t.Fatal("the watch that took over is still ahead")
	}
	s.Progress(10)
	if s.Next != 11 {
		t.Fatalf("progress at 10 after take-over: next %d, want 11 (never back)", s.Next)
	}
	if got := s.Fresh(11, evs(10, 11)); !equal(revsOf(got), []int64{11}) {
		t.Fatalf("replacement's events: delivered %v, want [11] (10 was before the start)", revsOf(got))
	}
}

func TestReplacementCompactedKeepsTheCurrentWatch(t *testing.T) {
	s := replacing(t)
	s.OnReplacementCreated(10)
	// Other keys were written up to 15 and compacted: etcd is past the
	// current watch's start, which now stays.
	if from := s.OnReplacementCompacted(15); from != 0 {
		t.Fatalf("compacted replacement, etcd at 15 past the start 11: new replacement from %d, want none", from)
	}
	if s.Phase() != Watching || s.OpenedAt != 11 || s.Next != 11 || s.Known != 15 {
		t.Fatalf("after: %v opened at %d next %d known %d, want watching, 11, 11, 15", s.Phase(), s.OpenedAt, s.Next, s.Known)
	}
}

func TestReplacementCompactedStillAheadReplacesAgain(t *testing.T) {
	s := watching(20, 10) // a watch from a future revision
	s.OnTick(at(4))
	s.OnTick(at(5)) // replacement from 10
	s.OnReplacementCreated(10)
	if from := s.OnReplacementCompacted(15); from != 15 || s.Phase() != Replacing {
		t.Fatalf("compacted, etcd at 15 still below the start 20: replacement from %d in %v, want 15, replacing", from, s.Phase())
	}
	s.OnReplacementCreated(15)
	s.OnReplacementSynced()
	if s.OpenedAt != 15 || s.Next != 20 {
		t.Fatalf("took over: opened at %d next %d, want 15 and 20", s.OpenedAt, s.Next)
	}
}

func TestCompactedBelowNextReopensFromNext(t *testing.T) {
	s := replacing(t)
	s.OnReplacementCreated(10)
	s.OnReplacementSynced() // opened at 10, next 11
	from, err := s.OnCompacted(11, 11)
	if err != nil || from != 11 || s.Phase() != Opening || s.OpenedAt != 11 {
		t.Fatalf("compacted at 11 (next 11): reopen from %d (%v) in %v opened at %d, want 11 from opening", from, err, s.Phase(), s.OpenedAt)
	}
}

// TestCompactedBelowNextAheadReopensFromKnown: a watch from a future
// revision, replaced and taken over, then compacted below Next while
// etcd is still below Next, opens again from etcd's revision, not from
// Next (a watch etcd would answer no progress request of).
func TestCompactedBelowNextAheadReopensFromKnown(t *testing.T) {
	s := watching(20, 10)
	s.OnTick(at(4))
	s.OnTick(at(5)) // replacement from 10
	s.OnReplacementCreated(10)
	s.OnReplacementSynced() // opened at 10, next 20
	from, err := s.OnCompacted(12, 15)
	if err != nil || from != 15 || s.Phase() != Opening || s.OpenedAt != 15 || s.Ahead() {
		t.Fatalf("compacted at 12, etcd at 15, next 20: reopen from %d (%v) in %v opened at %d, want 15 from opening", from, err, s.Phase(), s.OpenedAt)
	}
}

func TestCompactedAboveNextEnds(t *testing.T) {
	s := watching(10, 12)
	_, err := s.OnCompacted(12, 12)
	var ce *CompactedError
	if !errors.As(err, &ce) || ce.Requested != 10 || ce.CompactRevision != 12 {
		t.Fatalf("compacted at 12, next 10: %v, want a CompactedError for 10 at 12", err)
	}
}

func TestReopenEntersOpening(t *testing.T) {
	s := watching(10, 12)
	s.Reopen(13)
	if s.Phase() != Opening || s.OpenedAt != 13 {
		t.Fatalf("reopen: %v opened at %d, want opening at 13", s.Phase(), s.OpenedAt)
	}
}

func TestNames(t *testing.T) {
	for v, want := range map[Verdict]string{Listening: "listening", Ask: "ask", ReplaceAhead: "replace-ahead", Silent: "silent", Verdict(9): "verdict(?)"} {
		if v.String() != want {
			t.Errorf("%d: %q, want %q", v, v.String(), want)
		}
	}
	for p, want := range map[Phase]string{Opening: "opening", Watching: "watching", Replacing: "replacing", Syncing: "syncing", Phase(9): "phase(?)"} {
		if p.String() != want {
			t.Errorf("%d: %q, want %q", p, p.String(), want)
		}
	}
	if e := (&CompactedError{Requested: 3, CompactRevision: 5}); e.Error() == "" {
		t.Error("empty CompactedError message")
	}
	if e := (&SilentError{Quiet: time.Second}); !errors.Is(e, ErrSilent) {
		t.Error("SilentError is not ErrSilent")
	}
}

// TestLaggedMeasuresSilenceAgainAndIsBounded: a silence taken for lag
// starts the silence over (no verdict for half a timeout), MaxLagged times
// in a row; then the silence stands.
func TestLaggedMeasuresSilenceAgainAndIsBounded(t *testing.T) {
	s := New(1, T, at(0))
	s.Opened()
	for i := range MaxLagged {
		if !s.Lagged(at(10 * (i + 1))) {
			t.Fatalf("lag %d refused; want %d in a row taken", i+1, MaxLagged)
		}
		if tk := s.OnTick(at(10*(i+1) + 3)); tk != (Tick{}) {
			t.Fatalf("3 s after lag %d: %+v; want nothing (quiet for less than half the timeout)", i+1, tk)
		}
	}
	if s.Lagged(at(100)) {
		t.Fatalf("lag %d taken; want the silence to stand after %d", MaxLagged+1, MaxLagged)
	}
}

// TestHeardEndsALagStreak: hearing from etcd ends a streak of lags, so
// that a later silence may again be taken for lag MaxLagged times.
func TestHeardEndsALagStreak(t *testing.T) {
	s := New(1, T, at(0))
	s.Opened()
	for i := range MaxLagged {
		s.Lagged(at(i + 1))
	}
	s.OnHeard(at(20))
	for i := range MaxLagged {
		if !s.Lagged(at(30 + i)) {
			t.Fatalf("lag %d after etcd was heard refused", i+1)
		}
	}
}
