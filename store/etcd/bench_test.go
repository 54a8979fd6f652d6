package etcd_test

import (
	"context"
	"flag"
	"fmt"
	"runtime"
	"slices"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/beaconplane/beacon/store"
	"github.com/beaconplane/beacon/store/etcd"
	"github.com/beaconplane/beacon/store/storetest"
	clientv3 "go.etcd.io/etcd/client/v3"
)

// The benchmarks run against the shared in-process etcd (no fsync, so the
// server's share of each operation is as small as it gets and Beacon's
// overhead shows at its largest).
//
//	go test -run '^$' -bench . ./store/etcd/                      # everything
//	go test -run '^$' -bench EtcdVsRaw ./store/etcd/ -args -vs.rounds=5
//
// BenchmarkStore is the conformance benchmark every backend reports;
// BenchmarkRaw does the same work with clientv3 directly; BenchmarkEtcdVsRaw
// runs both, interleaved, and prints the table of ratios.

var vsRounds = flag.Int("vs.rounds", 3, "BenchmarkEtcdVsRaw: rounds of each (Beacon, raw) pair; the median counts")

func BenchmarkStore(b *testing.B) {
	storetest.Benchmark(b, func(tb testing.TB) store.Store { return newStore(tb, nil, etcd.Config{}) })
}

func BenchmarkRaw(b *testing.B) {
	cli := server.Client(b)
	f := newBenchFixture(b, newStore(b, nil, etcd.Config{}), cli)
	for _, op := range benchOps {
		b.Run(op, f.raw[op])
	}
}

var benchOps = []string{"Put", "Get", "List1k", "WatchDelivery"}

// benchFixture holds the shared data and both sides' benchmark functions.
// Both sides do exactly the work of storetest.Benchmark, on the same keys.
type benchFixture struct {
	beacon, raw map[string]func(*testing.B)
}

func newBenchFixture(tb testing.TB, s *etcd.Store, cli *clientv3.Client) *benchFixture {
	value := make([]byte, 256)
	sval := string(value)
	ctx := context.Background()
	p := prefix(tb)
	getKey, listPrefix := p+"get", p+"list/"
	if _, err := s.Put(ctx, getKey, value); err != nil {
		tb.Fatal(err)
	}
	storetest.Fill(tb, s, listPrefix, 1000, value)
	var seq sync.Mutex // gives each watch benchmark a fresh prefix
	n := 0
	fresh := func(what string) string {
		seq.Lock()
		defer seq.Unlock()
		n++
		return fmt.Sprintf("%s%s-%d/", p, what, n)
	}
	f := &benchFixture{beacon: map[string]func(*testing.B){}, raw: map[string]func(*testing.B){}}

	f.beacon["Put"] = func(b *testing.B) {
		b.ReportAllocs()
		pp := fresh("put")
		for i := 0; b.Loop(); i++ {
			if _, err := s.Put(ctx, fmt.Sprintf("%s%d", pp, i%1024), value); err != nil {
				b.Fatal(err)
			}
		}
	}
	f.raw["Put"] = func(b *testing.B) {
		b.ReportAllocs()
		pp := fresh("put")
		for i := 0; b.Loop(); i++ {
			if _, err := cli.Put(ctx, fmt.Sprintf("%s%d", pp, i%1024), sval); err != nil {
				b.Fatal(err)
			}
		}
	}
	f.beacon["Get"] = func(b *testing.B) {
		b.ReportAllocs()
		for b.Loop() {
			if _, err := s.Get(ctx, getKey); err != nil {
				b.Fatal(err)
			}
		}
	}
	f.raw["Get"] = func(b *testing.B) {
		b.ReportAllocs()
		for b.Loop() {
			resp, err := cli.Get(ctx, getKey)
			if err != nil || len(resp.Kvs) != 1 {
				b.Fatal(err)
			}
		}
	}
	f.beacon["List1k"] = func(b *testing.B) {
		b.ReportAllocs()
		for b.Loop() {
			kvs, _, err := s.List(ctx, listPrefix)
			if err != nil || len(kvs) != 1000 {
				b.Fatalf("List: %d keys, %v", len(kvs), err)
			}
		}
	}
	f.raw["List1k"] = func(b *testing.B) {
		b.ReportAllocs()
		for b.Loop() {
			resp, err := cli.Get(ctx, listPrefix, clientv3.WithPrefix())
			if err != nil || len(resp.Kvs) != 1000 {
				b.Fatalf("Get WithPrefix: %v", err)
			}
		}
	}
	f.beacon["WatchDelivery"] = func(b *testing.B) {
		b.ReportAllocs()
		wctx, cancel := context.WithCancel(ctx)
		defer cancel()
		wp := fresh("watch")
		_, rev, err := s.List(wctx, wp)
		if err != nil {
			b.Fatal(err)
		}
		w := s.Watch(wctx, wp, rev+1)
		for b.Loop() {
			wrote, err := s.Put(wctx, wp+"k", value)
			if err != nil {
				b.Fatal(err)
			}
			storetest.WaitRevision(b, w, wrote)
		}
	}
	f.raw["WatchDelivery"] = func(b *testing.B) {
		b.ReportAllocs()
		wctx, cancel := context.WithCancel(ctx)
		defer cancel()
		wp := fresh("watch")
		resp, err := cli.Get(wctx, wp, clientv3.WithPrefix())
		if err != nil {
			b.Fatal(err)
		}
		w := cli.Watch(wctx, wp, clientv3.WithPrefix(), clientv3.WithRev(resp.Header.Revision+1))
		for b.Loop() {
			put, err := cli.Put(wctx, wp+"k", sval)
			if err != nil {
				b.Fatal(err)
			}
			rawWaitRevision(b, w, put.Header.Revision)
		}
	}
	return f
}

// rawWaitRevision is storetest.WaitRevision for a clientv3 watch.
func rawWaitRevision(tb testing.TB, w clientv3.WatchChan, rev int64) {
	tb.Helper()
	timeout := time.After(30 * time.Second)
	for {
		select {
		case resp, ok := <-w:
			if !ok || resp.Err() != nil {
				tb.Fatalf("watch ended: %v", resp.Err())
			}
			if n := len(resp.Events); n > 0 && resp.Events[n-1].Kv.ModRevision >= rev {
				return
			}
		case <-timeout:
			tb.Fatalf("revision %d not delivered", rev)
		}
	}
}

// measured is what one sub-benchmark measured in its final run.
type measured struct {
	n       int
	elapsed time.Duration
}

func (m measured) nsPerOp() float64 { return float64(m.elapsed.Nanoseconds()) / float64(max(m.n, 1)) }

// BenchmarkEtcdVsRaw runs each operation through the raw client and through
// Beacon as sub-benchmarks (op/round/raw, op/round/beacon), alternating
// which goes first, -vs.rounds times, then logs a table of the medians and
// their ratio (Beacon/raw; the goal is ≤ 1.05).
func BenchmarkEtcdVsRaw(b *testing.B) {
	cli := server.Client(b)
	f := newBenchFixture(b, newStore(b, nil, etcd.Config{}), cli)
	run := func(name string, fn func(*testing.B)) measured {
		var m measured
		b.Run(name, func(b *testing.B) {
			fn(b)
			m = measured{n: b.N, elapsed: b.Elapsed()} // the last run is the final one
		})
		return m
	}
	var t strings.Builder
	fmt.Fprintf(&t, "etcd backend vs raw clientv3: median of %d rounds, -benchtime per run, GOMAXPROCS=%d\n", *vsRounds, runtime.GOMAXPROCS(0))
	fmt.Fprintf(&t, "%-14s %12s %12s %7s   %s\n", "op", "raw ns/op", "beacon ns/op", "ratio", "beacon/raw per round")
	for _, op := range benchOps {
		var raw, beacon, ratios []float64
		var rounds []string
		for round := range *vsRounds {
			name := fmt.Sprintf("%s/round%d/", op, round+1)
			var r, bc measured
			if round%2 == 0 {
				r, bc = run(name+"raw", f.raw[op]), run(name+"beacon", f.beacon[op])
			} else {
				bc, r = run(name+"beacon", f.beacon[op]), run(name+"raw", f.raw[op])
			}
			raw, beacon = append(raw, r.nsPerOp()), append(beacon, bc.nsPerOp())
			ratios = append(ratios, bc.nsPerOp()/r.nsPerOp())
			rounds = append(rounds, fmt.Sprintf("%.3f", bc.nsPerOp()/r.nsPerOp()))
		}
		mr, mb := median(raw), median(beacon)
		fmt.Fprintf(&t, "%-14s %12.0f %12.0f %7.3f   %s (median %.3f)\n", op, mr, mb, mb/mr, strings.Join(rounds, " "), median(ratios))
	}
	// The parent of sub-benchmarks prints no log: write the table out.
	fmt.Print(t.String())
}

func median(xs []float64) float64 {
	s := slices.Clone(xs)
	slices.Sort(s)
	if len(s)%2 == 0 {
		return (s[len(s)/2-1] + s[len(s)/2]) / 2
	}
	return s[len(s)/2]
}
