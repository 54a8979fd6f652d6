package memory_test

import (
	"context"
	"errors"
	"fmt"
	"testing"
	"time"

	"github.com/beaconplane/beacon/store"
	"github.com/beaconplane/beacon/store/memory"
	"github.com/beaconplane/beacon/store/storetest"
	"go.uber.org/goleak"
)

func TestMain(m *testing.M) { goleak.VerifyTestMain(m) }

func TestConformance(t *testing.T) {
	storetest.Run(t, func(testing.TB) store.Store { return memory.New(memory.Config{}) }, storetest.Options{
		// Expiry is exact to the timer: no grace needed beyond scheduling.
		ExpiryGrace: 500 * time.Millisecond,
	})
}

func TestSlowWatcherNeverBlocksWriters(t *testing.T) {
	s := memory.New(memory.Config{})
	defer s.Close()
	ctx := context.Background()
	slow := s.Watch(ctx, "/k/", 1) // never read until the writes are done
	const n = 5000
	for i := range n {
		if _, err := s.Put(ctx, fmt.Sprintf("/k/%d", i%10), []byte("v")); err != nil {
			t.Fatal(err)
		}
	}
	got := 0
	last := int64(0)
	deadline := time.After(10 * time.Second)
	for got < n {
		select {
		case resp := <-slow:
			if resp.Err != nil {
				t.Fatal(resp.Err)
			}
			for _, e := range resp.Events {
				if e.Revision() <= last {
					t.Fatalf("out of order: %d after %d", e.Revision(), last)
				}
				last = e.Revision()
			}
			got += len(resp.Events)
		case <-deadline:
			t.Fatalf("slow watcher got %d of %d events", got, n)
		}
	}
}

func TestHistoryWindowCompactsOldRevisions(t *testing.T) {
	s := memory.New(memory.Config{History: 10})
	defer s.Close()
	ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second) // bounds every wait on a watch
	defer cancel()
	var revs []int64
	for i := range 30 {
		rev, err := s.Put(ctx, "/k", []byte(fmt.Sprint(i)))
		if err != nil {
			t.Fatal(err)
		}
		revs = append(revs, rev)
	}
	resp := <-s.Watch(ctx, "/k", revs[0])
	var ce *store.CompactedError
	if !errors.As(resp.Err, &ce) || ce.CompactRevision <= revs[0] {
		t.Fatalf("watch from an old revision: %v", resp.Err)
	}
	// The last 10 revisions are still available.
	resp = <-s.Watch(ctx, "/k", revs[20])
	if resp.Err != nil || resp.Events[0].Revision() != revs[20] {
		t.Fatalf("watch inside the window: %+v", resp)
	}
}

func BenchmarkMemory(b *testing.B) {
	storetest.Benchmark(b, func(testing.TB) store.Store { return memory.New(memory.Config{}) })
}

// putAll puts n keys under prefix with values of size bytes, in one
// transaction, and returns its revision.
func putAll(t *testing.T, s *memory.Store, prefix string, n, size int, lease store.LeaseID) int64 {
	t.Helper()
	ops := make([]store.Op, n)
	for i := range ops {
		ops[i] = store.Op{Kind: store.OpPut, Key: fmt.Sprintf("%s/%d", prefix, i), Value: make([]byte, size), Lease: lease}
	}
	rev, err := s.Txn(context.Background(), ops...)
	if err != nil {
		t.Fatal(err)
	}
	return rev
}

// TestHistoryBytesCompactsLargeRevisions: a few transactions of many keys
// push older revisions out of a history bounded in bytes long before the
// bound in revisions would, and a watch from them ends with
// *store.CompactedError; the newest revisions that fit still replay.
func TestHistoryBytesCompactsLargeRevisions(t *testing.T) {
	s := memory.New(memory.Config{History: 1000, HistoryBytes: 64 << 10})
	defer s.Close()
	ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second) // bounds every wait on a watch
	defer cancel()
	var revs []int64
	for i := range 8 {
		revs = append(revs, putAll(t, s, fmt.Sprintf("/t%d", i), 64, 200, store.NoLease)) // about 18 KiB each
	}
	resp := <-s.Watch(ctx, "/", revs[0])
	var ce *store.CompactedError
	if !errors.As(resp.Err, &ce) {
		t.Fatalf("watch from the first of 8 large revisions: %+v, want a *store.CompactedError", resp)
	}
	if ce.CompactRevision <= revs[0] || ce.CompactRevision > revs[len(revs)-3] {
		t.Fatalf("the watermark is %d; the bound should keep 2 or 3 of the revisions %v", ce.CompactRevision, revs)
	}
	resp = <-s.Watch(ctx, "/", revs[len(revs)-2])
	if resp.Err != nil || len(resp.Events) < 64 || resp.Events[0].Revision() != revs[len(revs)-2] {
		t.Fatalf("watch from the second newest revision: err %v, %d events", resp.Err, len(resp.Events))
	}
}

// TestHistoryBytesKeepsTheCurrentRevisionWhole: the end of a lease whose
// keys weigh more than the whole bound is one revision, and a watch from it
// receives every delete.
func TestHistoryBytesKeepsTheCurrentRevisionWhole(t *testing.T) {
	s := memory.New(memory.Config{HistoryBytes: 4 << 10})
	defer s.Close()
	ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
	defer cancel()
	l, err := s.Grant(ctx, time.Minute)
	if err != nil {
		t.Fatal(err)
	}
	const n = 300
	putAll(t, s, "/leased", n, 100, l.ID)
	if err := s.Revoke(ctx, l.ID); err != nil {
		t.Fatal(err)
	}
	_, rev, err := s.List(ctx, "/")
	if err != nil {
		t.Fatal(err)
	}
	deletes := 0
	for resp := range s.Watch(ctx, "/", rev) {
		if resp.Err != nil {
			t.Fatalf("watch from the revocation: %v", resp.Err)
		}
		deletes += len(resp.Events)
		if deletes >= n {
			break
		}
	}
	if deletes != n {
		t.Fatalf("the watch saw %d deletes of %d", deletes, n)
	}
}
