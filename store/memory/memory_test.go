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
