package mvcc

import (
	"context"
	"errors"
	"fmt"
	"math/rand/v2"
	"testing"
	"time"

	"github.com/beaconplane/beacon/store"
)

func fill(t *testing.T, s *Store, n int) {
	t.Helper()
	for i := range n {
		if _, err := s.Commit(context.Background(), Put(fmt.Sprintf("k%d", i%7), []byte("v"), nil)); err != nil {
			t.Fatal(err)
		}
	}
}

// TestTrimmingTheWindowCopiesNothing: a commit that pushes one revision out
// of the window costs no more allocations than one without a window (the
// log is resliced, not copied).
func TestTrimmingTheWindowCopiesNothing(t *testing.T) {
	allocs := func(history int64) float64 {
		s := New(Config{History: history})
		defer s.Close()
		fill(t, s, 300)
		return testing.AllocsPerRun(500, func() {
			_, _ = s.Commit(context.Background(), Put("k0", []byte("v"), nil))
		})
	}
	if windowed, unbounded := allocs(100), allocs(0); windowed > unbounded {
		t.Fatalf("a commit trimming the window allocates %v times, one without %v", windowed, unbounded)
	}
}

// TestCompactFreesTheDroppedLog: a compaction that drops most of the log
// copies the rest, so the dropped events' memory can be freed.
func TestCompactFreesTheDroppedLog(t *testing.T) {
	s := New(Config{})
	defer s.Close()
	fill(t, s, 1000)
	if err := s.Compact(context.Background(), s.rev-2); err != nil {
		t.Fatal(err)
	}
	if len(s.log) != 3 || cap(s.log) > 16 {
		t.Fatalf("log of %d events keeps a capacity of %d", len(s.log), cap(s.log))
	}
}

// TestCommitKeepsNoValues: Commit's reused buffer holds no value after it
// returns, and does not stay large after a large change.
func TestCommitKeepsNoValues(t *testing.T) {
	s := New(Config{})
	defer s.Close()
	fill(t, s, 3)
	for _, e := range s.scratch.events[:cap(s.scratch.events)] {
		if e.KV.Value != nil || e.KV.Key != "" {
			t.Fatalf("the buffer keeps %+v", e)
		}
	}
	var ops []store.Op
	for i := range 100 {
		ops = append(ops, store.Op{Kind: store.OpPut, Key: fmt.Sprint(i)})
	}
	if _, err := s.Commit(context.Background(), Txn(ops)); err != nil {
		t.Fatal(err)
	}
	if c := cap(s.scratch.events); c > 64 {
		t.Fatalf("the buffer keeps a capacity of %d", c)
	}
}

// TestReplayKeepsNothingBelowTheWatermark: replaying revisions the state
// already holds adds to the log only those a watch may still ask for.
func TestReplayKeepsNothingBelowTheWatermark(t *testing.T) {
	s := New(Config{})
	defer s.Close()
	s.Install(5, 3, nil)
	for rev := int64(1); rev <= 5; rev++ {
		if err := s.Apply(rev, []store.Event{{Type: store.EventDelete, KV: store.KeyValue{Key: "k", ModRevision: rev}}}); err != nil {
			t.Fatal(err)
		}
	}
	if len(s.log) != 3 || s.log[0].KV.ModRevision != 3 {
		t.Fatalf("log after replay: %+v", s.log)
	}
}

// TestRewriteOnTheSameLeaseAllocatesNoMore: rewriting a key bound to a
// lease, to the same lease, does not rebuild the lease's key set (a
// registration's heartbeat does that at every write).
func TestRewriteOnTheSameLeaseAllocatesNoMore(t *testing.T) {
	allocs := func(lease store.LeaseID) float64 {
		s := New(Config{})
		defer s.Close()
		opts := []store.WriteOption{store.WithLease(lease)}
		return testing.AllocsPerRun(200, func() {
			_, _ = s.Commit(context.Background(), Put("k", []byte("v"), opts))
		})
	}
	if leased, plain := allocs(7), allocs(store.NoLease); leased > plain {
		t.Fatalf("a rewrite on the same lease allocates %v times, one without a lease %v", leased, plain)
	}
}

// TestEveryStateChangeWakesTheWatchers: a commit, an Apply and an Install
// close the channel waiting watchers block on.
func TestEveryStateChangeWakesTheWatchers(t *testing.T) {
	s := New(Config{})
	defer s.Close()
	for name, change := range map[string]func(){
		"commit": func() { fill(t, s, 1) },
		"apply": func() {
			_ = s.Apply(s.rev+1, []store.Event{{Type: store.EventDelete, KV: store.KeyValue{Key: "k", ModRevision: s.rev + 1}}})
		},
		"install": func() { s.Install(s.rev+1, s.rev+1, nil) },
		"reset":   func() { s.Reset(errors.New("replaced")) },
	} {
		s.mu.Lock()
		ch := s.changed
		s.mu.Unlock()
		change()
		select {
		case <-ch:
		default:
			t.Errorf("%s did not wake the watchers", name)
		}
	}
}

// checkLogSize fails unless logSize is what the log's events weigh.
func checkLogSize(t *testing.T, s *Store) {
	t.Helper()
	var want int64
	for _, e := range s.log {
		want += EventSize(e)
	}
	if s.logSize != want {
		t.Fatalf("logSize %d, the log's events weigh %d", s.logSize, want)
	}
}

// txnOf is a transaction that puts n keys with values of size bytes.
func txnOf(prefix string, n, size int) Change {
	ops := make([]store.Op, n)
	for i := range ops {
		ops[i] = store.Op{Kind: store.OpPut, Key: fmt.Sprintf("%s/%d", prefix, i), Value: make([]byte, size)}
	}
	return Txn(ops)
}

// TestHistoryBytesBoundsTheLog: after every commit the log keeps exactly
// the newest revisions that fit in HistoryBytes — no more (the bound
// holds) and no fewer (the revision below the watermark would not fit) —
// and the current revision whole even when it alone does not fit.
func TestHistoryBytesBoundsTheLog(t *testing.T) {
	const bound = 20_000
	s := New(Config{HistoryBytes: bound})
	defer s.Close()
	weight := map[int64]int64{} // revision → what its events weigh
	rng := rand.New(rand.NewPCG(1, 2))
	for i := range 300 {
		n := 1 + rng.IntN(40)
		if i%50 == 49 {
			n = 200 // a revision larger than the bound
		}
		rev, err := s.Commit(context.Background(), txnOf(fmt.Sprint(i%5), n, rng.IntN(100)))
		if err != nil {
			t.Fatal(err)
		}
		for _, e := range s.log {
			if e.KV.ModRevision == rev {
				weight[rev] += EventSize(e)
			}
		}
		checkLogSize(t, s)
		// The expected watermark: the oldest revision from which on the
		// events fit, or the current one.
		want, sum := rev, weight[rev]
		for r := rev - 1; r >= 1 && sum+weight[r] <= bound; r-- { // revision 1 has no events
			want, sum = r, sum+weight[r]
		}
		if s.compact != want {
			t.Fatalf("after revision %d the watermark is %d, want %d (the log weighs %d)", rev, s.compact, want, s.logSize)
		}
	}
}

// TestHistoryBytesAndRevisionsBothBound: with both bounds set, the tighter
// one decides.
func TestHistoryBytesAndRevisionsBothBound(t *testing.T) {
	for _, tc := range []struct {
		name        string
		revs, bytes int64
		wantRevs    int64
	}{
		{"revisions tighter", 3, 1 << 20, 3},
		{"bytes tighter", 100, 5 * (eventOverhead + 3), 5}, // keys "k0".."k6", values "v"
	} {
		s := New(Config{History: tc.revs, HistoryBytes: tc.bytes})
		fill(t, s, 50)
		if revs, _ := s.HistorySize(); revs != tc.wantRevs {
			t.Errorf("%s: the log holds %d revisions, want %d", tc.name, revs, tc.wantRevs)
		}
		s.Close()
	}
}

// TestCompactClearsTheDroppedEvents: a compaction that keeps most of the
// log reslices it, and clears the events it drops, so that their keys and
// values are not kept until the log next grows.
func TestCompactClearsTheDroppedEvents(t *testing.T) {
	s := New(Config{})
	defer s.Close()
	fill(t, s, 100)
	before := s.log
	if err := s.Compact(context.Background(), s.log[10].KV.ModRevision); err != nil {
		t.Fatal(err)
	}
	if &s.log[0] != &before[10] {
		t.Fatal("the log was copied; this test needs a compaction that reslices it")
	}
	for i, e := range before[:10] {
		if e.KV.Key != "" || e.KV.Value != nil {
			t.Fatalf("dropped event %d is kept: %+v", i, e)
		}
	}
	checkLogSize(t, s)
}

// TestLogSizeFollowsEveryChange: applying, replaying, compacting and
// installing keep logSize what the log weighs.
func TestLogSizeFollowsEveryChange(t *testing.T) {
	s := New(Config{})
	defer s.Close()
	fill(t, s, 20)
	checkLogSize(t, s)
	ev := func(rev int64) []store.Event {
		return []store.Event{{Type: store.EventPut, KV: store.KeyValue{Key: "a", Value: []byte("xyz"), ModRevision: rev}}}
	}
	if err := s.Apply(s.rev+1, ev(s.rev+1)); err != nil {
		t.Fatal(err)
	}
	checkLogSize(t, s)
	s.CompactTo(s.rev - 5)
	checkLogSize(t, s)
	s.Install(40, 38, nil)
	checkLogSize(t, s)
	for rev := int64(38); rev <= 40; rev++ {
		if err := s.Apply(rev, ev(rev)); err != nil { // a replay over the snapshot
			t.Fatal(err)
		}
	}
	checkLogSize(t, s)
	if len(s.log) != 3 {
		t.Fatalf("the replay logged %d events, want 3", len(s.log))
	}
}

// TestResetEndsEveryWatchWithItsReason: after a Reset the revisions start
// again, so a watch started before it, whatever revision it waits for,
// ends with the Reset's error instead of waiting (or reading the new
// history as if it were the old one); a watch started after it follows
// the new history.
func TestResetEndsEveryWatchWithItsReason(t *testing.T) {
	s := New(Config{})
	defer s.Close()
	ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
	defer cancel()
	fill(t, s, 5)
	waiting := s.Watch(ctx, "", 0) // waits for revision 7
	behind := s.Watch(ctx, "", 2)  // has events to read
	reason := errors.New("the key space was replaced")
	s.Reset(reason)
	if rev, compact := s.Revisions(); rev != 1 || compact != 1 || s.data.Len() != 0 {
		t.Fatalf("after Reset: revision %d, watermark %d, %d keys; want 1, 1, none", rev, compact, s.data.Len())
	}
	for name, ch := range map[string]store.WatchChan{"waiting": waiting, "behind": behind} {
		var last store.WatchResponse
		for resp := range ch {
			last = resp
		}
		if !errors.Is(last.Err, reason) {
			t.Fatalf("%s watch ended with %v, want the Reset's reason", name, last.Err)
		}
	}
	after := s.Watch(ctx, "", 0)
	fill(t, s, 1)
	if resp := <-after; resp.Err != nil || len(resp.Events) != 1 || resp.Events[0].KV.ModRevision != 2 {
		t.Fatalf("a watch after Reset got %+v, want the new history's revision 2", resp)
	}
}
