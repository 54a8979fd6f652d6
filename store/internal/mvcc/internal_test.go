package mvcc

import (
	"context"
	"fmt"
	"testing"

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
