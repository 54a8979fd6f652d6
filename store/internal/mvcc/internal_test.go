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
		s := New(Options{History: history})
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
	s := New(Options{})
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
	s := New(Options{})
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
