package registry_test

import (
	"context"
	"fmt"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/beaconplane/beacon"
	"github.com/beaconplane/beacon/registry"
	"github.com/beaconplane/beacon/store"
	"github.com/beaconplane/beacon/store/etcd"
	"github.com/beaconplane/beacon/store/memory"
)

// The in-process costs of the registry, on the memory store (no network):
// `beacon bench` measures the same paths against etcd beside the raw client.

func BenchmarkRegister(b *testing.B) {
	st := memory.New(memory.Config{})
	defer st.Close()
	r, err := registry.New(st, registry.Config{})
	if err != nil {
		b.Fatal(err)
	}
	defer r.Close()
	ctx := context.Background()
	b.ReportAllocs()
	b.RunParallel(func(pb *testing.PB) {
		i := 0
		for pb.Next() {
			i++
			if _, err := r.Register(ctx, inst("bench", fmt.Sprintf("10.0.%d.%d:80", i/250%250, i%250))); err != nil {
				b.Fatal(err)
			}
		}
	})
}

// BenchmarkGroupCommit measures concurrent registrations through one
// session, whose creates the batcher folds into shared transactions: the
// path `beacon bench register` compares with etcd's batched-write
// ceiling. On the memory store it is the registry's own CPU; on etcd (the
// tests' in-process server, no fsync) the whole path.
func BenchmarkGroupCommit(b *testing.B) {
	stores := []struct {
		name string
		st   func(b *testing.B) store.Store
	}{
		{"memory", func(b *testing.B) store.Store { return newMemoryStore(b) }},
		{"etcd", func(b *testing.B) store.Store { return newEtcdStore(b, nil, etcd.Config{}) }},
	}
	run := 0
	for _, sb := range stores {
		for _, workers := range []int{64, 256} {
			b.Run(fmt.Sprintf("%s/workers=%d", sb.name, workers), func(b *testing.B) {
				run++
				r, err := registry.New(sb.st(b), registry.Config{})
				if err != nil {
					b.Fatal(err)
				}
				defer r.Close()
				ctx := context.Background()
				ns := fmt.Sprintf("gc%d", run)
				var next atomic.Int64
				var failed atomic.Pointer[error]
				b.ReportAllocs()
				b.ResetTimer()
				var wg sync.WaitGroup
				for range workers {
					wg.Go(func() {
						for {
							i := next.Add(1)
							if i > int64(b.N) || failed.Load() != nil {
								return
							}
							in := inst(ns, fmt.Sprintf("10.%d.%d.%d:80", i>>16&255, i>>8&255, i&255))
							if _, err := r.Register(ctx, in); err != nil {
								failed.Store(&err)
								return
							}
						}
					})
				}
				wg.Wait()
				b.StopTimer()
				if err := failed.Load(); err != nil {
					b.Fatal(*err)
				}
				b.ReportMetric(float64(b.N)/b.Elapsed().Seconds(), "registrations/s")
			})
		}
	}
}

// BenchmarkWatchDelivery measures one change reaching every one of n
// watchers of one shared feed (time per change). The watchers count what
// they got on one atomic counter; the last one of a change signals it, so
// that the harness adds no channel send or timer per watcher.
func BenchmarkWatchDelivery(b *testing.B) {
	for _, n := range []int{1, 100, 1000, 10000} {
		b.Run(fmt.Sprintf("watchers=%d", n), func(b *testing.B) {
			b.ReportAllocs()
			st := memory.New(memory.Config{})
			defer st.Close()
			r, err := registry.New(st, registry.Config{})
			if err != nil {
				b.Fatal(err)
			}
			defer r.Close()
			ctx, cancel := context.WithCancel(context.Background())
			defer cancel()
			q := beacon.Query{Namespace: "bench"}
			reg, err := r.Register(ctx, inst("bench", "10.0.0.1:80"))
			if err != nil {
				b.Fatal(err)
			}
			var got atomic.Int64
			all := make(chan struct{}, 1) // the n-th event of a change
			var wg sync.WaitGroup
			for range n {
				w, err := r.Watch(ctx, q)
				if err != nil {
					b.Fatal(err)
				}
				if _, err := w.Next(ctx); err != nil {
					b.Fatal(err)
				}
				wg.Go(func() {
					for {
						bt, err := w.Next(ctx)
						if err != nil {
							return
						}
						if got.Add(int64(len(bt.Events)))%int64(n) == 0 {
							all <- struct{}{}
						}
					}
				})
			}
			b.ResetTimer()
			for i := range b.N {
				if err := reg.Update(ctx, func(in *beacon.Instance) { in.Address = fmt.Sprintf("10.1.%d.%d:80", i/250%250, i%250) }); err != nil {
					b.Fatal(err)
				}
				select {
				case <-all:
				case <-time.After(10 * time.Second):
					b.Fatalf("change %d reached %d of %d watchers", i, got.Load()-int64(i*n), n)
				}
			}
			b.StopTimer()
			cancel()
			wg.Wait()
		})
	}
}

func BenchmarkList1000(b *testing.B) {
	st := memory.New(memory.Config{})
	defer st.Close()
	r, err := registry.New(st, registry.Config{})
	if err != nil {
		b.Fatal(err)
	}
	defer r.Close()
	ctx := context.Background()
	for i := range 1000 {
		if _, err := r.Register(ctx, inst("bench", fmt.Sprintf("10.0.%d.%d:80", i/250, i%250))); err != nil {
			b.Fatal(err)
		}
	}
	b.ReportAllocs()
	b.ResetTimer()
	for range b.N {
		if _, _, err := r.List(ctx, beacon.Query{Namespace: "bench"}); err != nil {
			b.Fatal(err)
		}
	}
}

// BenchmarkHeartbeat measures HTTP registrations' heartbeats through the
// registry that made them (their secrets proven: each heartbeat reads the
// instance while the lease is renewed), on the tests' etcd server.
func BenchmarkHeartbeat(b *testing.B) {
	st := newEtcdStore(b, nil, etcd.Config{})
	maker, err := registry.New(st, registry.Config{})
	if err != nil {
		b.Fatal(err)
	}
	defer maker.Close()
	ctx := context.Background()
	const n = 64
	var owned []registry.Owned
	for i := range n {
		o, err := maker.RegisterWithTTL(ctx, inst(uniqueNS(), fmt.Sprintf("10.0.0.%d:80", i+1)), time.Minute)
		if err != nil {
			b.Fatal(err)
		}
		owned = append(owned, o)
	}
	b.ReportAllocs()
	var next atomic.Int64
	b.RunParallel(func(pb *testing.PB) {
		for pb.Next() {
			o := owned[next.Add(1)%n]
			if _, err := maker.Heartbeat(ctx, o.Instance.Ref(), o.Secret); err != nil {
				b.Fatal(err)
			}
		}
	})
}
