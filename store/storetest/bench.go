package storetest

import (
	"context"
	"fmt"
	"testing"
	"time"

	"github.com/beaconplane/beacon/store"
)

// Benchmark runs the store benchmarks every backend reports: Put, Get, List
// of 1,000 keys and watch delivery (write → event received). Backends call
// it from their own Benchmark function; etcd also runs the raw client
// beside it (see store/etcd).
func Benchmark(b *testing.B, newStore Factory) {
	value := make([]byte, 256)
	b.Run("Put", func(b *testing.B) {
		s := newStore(b)
		defer s.Close()
		ctx := context.Background()
		p := uniquePrefix("bench-put")
		b.ResetTimer()
		for i := 0; b.Loop(); i++ {
			if _, err := s.Put(ctx, fmt.Sprintf("%s%d", p, i%1024), value); err != nil {
				b.Fatal(err)
			}
		}
	})
	b.Run("Get", func(b *testing.B) {
		s := newStore(b)
		defer s.Close()
		ctx := context.Background()
		k := uniquePrefix("bench-get") + "k"
		if _, err := s.Put(ctx, k, value); err != nil {
			b.Fatal(err)
		}
		for b.Loop() {
			if _, err := s.Get(ctx, k); err != nil {
				b.Fatal(err)
			}
		}
	})
	b.Run("List1k", func(b *testing.B) {
		s := newStore(b)
		defer s.Close()
		ctx := context.Background()
		p := uniquePrefix("bench-list")
		Fill(b, s, p, 1000, value)
		for b.Loop() {
			kvs, _, err := s.List(ctx, p)
			if err != nil || len(kvs) != 1000 {
				b.Fatalf("List: %d keys, %v", len(kvs), err)
			}
		}
	})
	b.Run("WatchDelivery", func(b *testing.B) {
		s := newStore(b)
		defer s.Close()
		ctx, cancel := context.WithCancel(context.Background())
		defer cancel()
		p := uniquePrefix("bench-watch")
		_, rev, err := s.List(ctx, p)
		if err != nil {
			b.Fatal(err)
		}
		w := s.Watch(ctx, p, rev+1)
		for i := 0; b.Loop(); i++ {
			wrote, err := s.Put(ctx, p+"k", value)
			if err != nil {
				b.Fatal(err)
			}
			WaitRevision(b, w, wrote)
		}
	})
}

// Fill writes n keys prefix0 … prefix{n-1} with value.
func Fill(tb testing.TB, s store.Store, prefix string, n int, value []byte) {
	tb.Helper()
	ctx := context.Background()
	for i := range n {
		if _, err := s.Put(ctx, fmt.Sprintf("%s%04d", prefix, i), value); err != nil {
			tb.Fatal(err)
		}
	}
}

// WaitRevision reads w until it delivers an event at rev or later.
func WaitRevision(tb testing.TB, w store.WatchChan, rev int64) {
	tb.Helper()
	timeout := time.After(30 * time.Second)
	for {
		select {
		case resp, ok := <-w:
			if !ok || resp.Err != nil {
				tb.Fatalf("watch ended: %v", resp.Err)
			}
			if n := len(resp.Events); n > 0 && resp.Events[n-1].Revision() >= rev {
				return
			}
		case <-timeout:
			tb.Fatalf("revision %d not delivered", rev)
		}
	}
}
