package etcd_test

import (
	"context"
	"fmt"
	"runtime"
	"slices"
	"strings"
	"testing"
	"time"

	"github.com/beaconplane/beacon/internal/testkit/etcdtest"
	"github.com/beaconplane/beacon/store"
	"github.com/beaconplane/beacon/store/etcd"
	"github.com/beaconplane/beacon/store/storetest"
	clientv3 "go.etcd.io/etcd/client/v3"
)

// The benchmarks run against the shared in-process etcd (no fsync, so the
// server's share of each operation is as small as it gets and Beacon's
// overhead shows at its largest).
//
//	go test -run '^$' -bench . ./store/etcd/
//
// BenchmarkStore is the conformance benchmark every backend reports;
// BenchmarkRaw does the same work with clientv3 directly (compare the two
// with benchstat); BenchmarkEtcdVsRaw runs both side by side and prints
// the ratios.

func BenchmarkStore(b *testing.B) {
	storetest.Benchmark(b, func(tb testing.TB) store.Store { return newStore(tb, nil, etcd.Config{}) })
}

// BenchmarkRaw is storetest.Benchmark done with clientv3 directly.
func BenchmarkRaw(b *testing.B) {
	value := string(make([]byte, 256))
	ctx := context.Background()
	cli := server.Client(b)
	b.Run("Put", func(b *testing.B) {
		p := prefix(b)
		for i := 0; b.Loop(); i++ {
			if _, err := cli.Put(ctx, fmt.Sprintf("%s%d", p, i%1024), value); err != nil {
				b.Fatal(err)
			}
		}
	})
	b.Run("Get", func(b *testing.B) {
		k := prefix(b) + "k"
		if _, err := cli.Put(ctx, k, value); err != nil {
			b.Fatal(err)
		}
		for b.Loop() {
			if resp, err := cli.Get(ctx, k); err != nil || len(resp.Kvs) != 1 {
				b.Fatal(err)
			}
		}
	})
	b.Run("List1k", func(b *testing.B) {
		p := prefix(b)
		for i := range 1000 {
			if _, err := cli.Put(ctx, fmt.Sprintf("%s%04d", p, i), value); err != nil {
				b.Fatal(err)
			}
		}
		for b.Loop() {
			if resp, err := cli.Get(ctx, p, clientv3.WithPrefix()); err != nil || len(resp.Kvs) != 1000 {
				b.Fatal(err)
			}
		}
	})
	b.Run("WatchDelivery", func(b *testing.B) {
		wctx, cancel := context.WithCancel(ctx)
		defer cancel()
		p := prefix(b)
		resp, err := cli.Get(wctx, p, clientv3.WithPrefix())
		if err != nil {
			b.Fatal(err)
		}
		w := cli.Watch(wctx, p, clientv3.WithPrefix(), clientv3.WithRev(resp.Header.Revision+1))
		for b.Loop() {
			put, err := cli.Put(wctx, p+"k", value)
			if err != nil {
				b.Fatal(err)
			}
			rawWaitRevision(b, w, put.Header.Revision)
		}
	})
}

var benchOps = []string{"Put", "Get", "List1k", "WatchDelivery"}

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

// BenchmarkEtcdVsRaw measures the overhead of the etcd backend over the raw
// client with paired operations: every iteration does the operation once
// through each (alternating which goes first) and times each, so both see
// the same moment of a shared, noisy machine. Each sub-benchmark reports
// the median time of one raw and one Beacon operation and their ratio (the
// goal is ≤ 1.05; medians because a burst of other work on the machine
// skews a mean); the table at the end adds the means.
//
//	go test -run '^$' -bench EtcdVsRaw -benchtime 5s -count 3 ./store/etcd/
func BenchmarkEtcdVsRaw(b *testing.B) {
	cli := server.Client(b)
	s := newStore(b, nil, etcd.Config{})
	value := make([]byte, 256)
	sval := string(value)
	ctx := context.Background()
	p := prefix(b)
	getKey, listPrefix := p+"get", p+"list/"
	if _, err := s.Put(ctx, getKey, value); err != nil {
		b.Fatal(err)
	}
	storetest.Fill(b, s, listPrefix, 1000, value)

	// pair returns one operation of each side for the iteration i.
	type pair struct{ raw, beacon func(b *testing.B, i int) }
	pairs := map[string]func(b *testing.B) pair{
		"Put": func(b *testing.B) pair {
			rp, bp := prefix(b), prefix(b)
			return pair{
				raw: func(b *testing.B, i int) {
					if _, err := cli.Put(ctx, fmt.Sprintf("%s%d", rp, i%1024), sval); err != nil {
						b.Fatal(err)
					}
				},
				beacon: func(b *testing.B, i int) {
					if _, err := s.Put(ctx, fmt.Sprintf("%s%d", bp, i%1024), value); err != nil {
						b.Fatal(err)
					}
				},
			}
		},
		"Get": func(b *testing.B) pair {
			return pair{
				raw: func(b *testing.B, _ int) {
					if resp, err := cli.Get(ctx, getKey); err != nil || len(resp.Kvs) != 1 {
						b.Fatal(err)
					}
				},
				beacon: func(b *testing.B, _ int) {
					if _, err := s.Get(ctx, getKey); err != nil {
						b.Fatal(err)
					}
				},
			}
		},
		"List1k": func(b *testing.B) pair {
			return pair{
				raw: func(b *testing.B, _ int) {
					if resp, err := cli.Get(ctx, listPrefix, clientv3.WithPrefix()); err != nil || len(resp.Kvs) != 1000 {
						b.Fatal(err)
					}
				},
				beacon: func(b *testing.B, _ int) {
					if kvs, _, err := s.List(ctx, listPrefix); err != nil || len(kvs) != 1000 {
						b.Fatalf("List: %d keys, %v", len(kvs), err)
					}
				},
			}
		},
		"WatchDelivery": func(b *testing.B) pair {
			wctx, cancel := context.WithCancel(ctx)
			b.Cleanup(cancel)
			rp, bp := prefix(b), prefix(b)
			resp, err := cli.Get(wctx, rp, clientv3.WithPrefix())
			if err != nil {
				b.Fatal(err)
			}
			rw := cli.Watch(wctx, rp, clientv3.WithPrefix(), clientv3.WithRev(resp.Header.Revision+1))
			bw := s.Watch(wctx, bp, resp.Header.Revision+1)
			return pair{
				raw: func(b *testing.B, _ int) {
					put, err := cli.Put(wctx, rp+"k", sval)
					if err != nil {
						b.Fatal(err)
					}
					rawWaitRevision(b, rw, put.Header.Revision)
				},
				beacon: func(b *testing.B, _ int) {
					wrote, err := s.Put(wctx, bp+"k", value)
					if err != nil {
						b.Fatal(err)
					}
					storetest.WaitRevision(b, bw, wrote)
				},
			}
		},
	}

	type row struct {
		op                  string
		rawMed, beaconMed   float64 // median ns of one operation
		rawMean, beaconMean float64
	}
	var rows []row
	for _, op := range benchOps {
		var last row
		b.Run(op, func(b *testing.B) {
			pr := pairs[op](b)
			var raw, beacon []time.Duration
			i := 0
			for b.Loop() {
				t0 := time.Now()
				if i%2 == 0 {
					pr.raw(b, i)
					t1 := time.Now()
					pr.beacon(b, i)
					raw, beacon = append(raw, t1.Sub(t0)), append(beacon, time.Since(t1))
				} else {
					pr.beacon(b, i)
					t1 := time.Now()
					pr.raw(b, i)
					beacon, raw = append(beacon, t1.Sub(t0)), append(raw, time.Since(t1))
				}
				i++
			}
			last = row{op: op, rawMed: medianNs(raw), beaconMed: medianNs(beacon), rawMean: meanNs(raw), beaconMean: meanNs(beacon)}
			b.ReportMetric(last.rawMed, "raw-ns/op")
			b.ReportMetric(last.beaconMed, "beacon-ns/op")
			b.ReportMetric(last.beaconMed/last.rawMed, "beacon/raw")
		})
		rows = append(rows, last) // from the final run of b.Loop
	}
	// The parent of sub-benchmarks prints no log: write the table out.
	var t strings.Builder
	fmt.Fprintf(&t, "etcd backend vs raw clientv3, paired operations, GOMAXPROCS=%d\n", runtime.GOMAXPROCS(0))
	fmt.Fprintf(&t, "%-14s %13s %13s %7s   %11s %11s %7s\n", "op", "raw median ns", "beacon median", "ratio", "raw mean", "beacon mean", "ratio")
	for _, r := range rows {
		fmt.Fprintf(&t, "%-14s %13.0f %13.0f %7.3f   %11.0f %11.0f %7.3f\n", r.op, r.rawMed, r.beaconMed, r.beaconMed/r.rawMed,
			r.rawMean, r.beaconMean, r.beaconMean/r.rawMean)
	}
	fmt.Print(t.String())
}

func medianNs(ds []time.Duration) float64 {
	s := slices.Clone(ds)
	slices.Sort(s)
	return float64(s[len(s)/2].Nanoseconds())
}

func meanNs(ds []time.Duration) float64 {
	var sum time.Duration
	for _, d := range ds {
		sum += d
	}
	return float64(sum.Nanoseconds()) / float64(len(ds))
}

// BenchmarkFirstEventOfAWatch measures what TestFirstEventOfAWatchIsNotDelayed
// checks works: the time from a put to the first event of a watch opened
// (from the revision after a listing) right before it. It reports the
// median and its ratio to firstEventGoal (first-event/goal: at most 1).
func BenchmarkFirstEventOfAWatch(b *testing.B) {
	srv := etcdtest.Start(b, etcdtest.Options{})
	s := newStore(b, srv, etcd.Config{})
	ctx, cancel := context.WithTimeout(context.Background(), 10*time.Minute)
	defer cancel()
	var took []time.Duration
	for b.Loop() {
		took = append(took, firstEvents(ctx, b, s, "/first/", 1)...)
	}
	slices.Sort(took)
	median := took[len(took)/2]
	b.ReportMetric(float64(median.Microseconds())/1000, "first-event-median-ms")
	b.ReportMetric(float64(median)/float64(firstEventGoal), "first-event/goal")
}

// BenchmarkPutDeadline is the guard of the watchdog (timeout.go): paired
// Puts through the Store, one whose context has no deadline (the watchdog
// bounds it) and one given a deadline of its own with context.WithTimeout
// (what every call would cost without the watchdog: a timer on the
// client, a grpc-timeout header, a timer in the server), alternating which
// goes first. It reports the medians and deadline/watchdog: above 1 is the
// watchdog's gain.
//
//	go test -run '^$' -bench PutDeadline -benchtime 20000x -count 5 ./store/etcd/
func BenchmarkPutDeadline(b *testing.B) {
	s := newStore(b, nil, etcd.Config{})
	value := make([]byte, 256)
	ctx := context.Background()
	wp, dp := prefix(b), prefix(b)
	viaWatchdog := func(i int) {
		if _, err := s.Put(ctx, fmt.Sprintf("%s%d", wp, i%1024), value); err != nil {
			b.Fatal(err)
		}
	}
	withDeadline := func(i int) {
		c, cancel := context.WithTimeout(ctx, etcd.DefaultRequestTimeout)
		defer cancel()
		if _, err := s.Put(c, fmt.Sprintf("%s%d", dp, i%1024), value); err != nil {
			b.Fatal(err)
		}
	}
	var wd, dl []time.Duration
	for i := 0; b.Loop(); i++ {
		first, second := viaWatchdog, withDeadline
		if i%2 == 1 {
			first, second = withDeadline, viaWatchdog
		}
		t0 := time.Now()
		first(i)
		t1 := time.Now()
		second(i)
		d0, d1 := t1.Sub(t0), time.Since(t1)
		if i%2 == 1 {
			d0, d1 = d1, d0
		}
		wd, dl = append(wd, d0), append(dl, d1)
	}
	b.ReportMetric(medianNs(wd), "watchdog-ns/op")
	b.ReportMetric(medianNs(dl), "deadline-ns/op")
	b.ReportMetric(medianNs(dl)/medianNs(wd), "deadline/watchdog")
}
