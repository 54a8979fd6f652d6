package proxy

import (
	"context"
	"fmt"
	"runtime"
	"slices"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/beaconplane/beacon/internal/etcdwatch"
	"github.com/beaconplane/beacon/internal/testkit/etcdtest"
	pb "go.etcd.io/etcd/api/v3/etcdserverpb"
	"go.etcd.io/etcd/api/v3/mvccpb"
	clientv3 "go.etcd.io/etcd/client/v3"
	"google.golang.org/grpc"
	"google.golang.org/grpc/credentials"
	"google.golang.org/grpc/credentials/insecure"
	"google.golang.org/protobuf/encoding/protowire"
)

// BenchmarkWatchFanout is the proxy's watch fan-out under a burst, end to
// end: watchers identical watches on one key, spread over 10 client
// streams (as etcd's `benchmark watch` spreads them), share one upstream
// watch; b.N puts are made to etcd as fast as 4 writers can, and the
// benchmark ends when every watcher has every event. The clients read raw
// frames and only count events, so the time is the proxy's (and etcd's).
func BenchmarkWatchFanout(b *testing.B) {
	srv := etcdtest.Start(b, etcdtest.Options{})
	for _, watchers := range []int{100, 1000} {
		b.Run(fmt.Sprintf("watchers=%d", watchers), func(b *testing.B) {
			benchFanout(b, srv, watchers, 10)
		})
	}
}

func benchFanout(b *testing.B, srv *etcdtest.Server, watchers, streams int) {
	p := startProxy(b, Config{Endpoints: srv.Endpoints()})
	ctx, cancel := context.WithCancel(context.Background())
	defer cancel()
	key := fmt.Sprintf("fanout/%d/%d", watchers, time.Now().UnixNano())
	var got atomic.Int64
	done := make(chan struct{})
	want := int64(watchers) * int64(b.N)
	var wg sync.WaitGroup
	defer wg.Wait()
	defer cancel()
	for s := range streams {
		conn, err := grpc.NewClient(p.Addr().String(), grpc.WithTransportCredentials(insecureCreds()), grpc.WithDefaultCallOptions(grpc.ForceCodecV2(newCodec())))
		if err != nil {
			b.Fatal(err)
		}
		defer conn.Close()
		ws, err := conn.NewStream(ctx, &grpc.StreamDesc{ServerStreams: true, ClientStreams: true}, "/etcdserverpb.Watch/Watch")
		if err != nil {
			b.Fatal(err)
		}
		n := watchers / streams
		if s < watchers%streams {
			n++
		}
		for range n {
			if err := ws.SendMsg(&pb.WatchRequest{RequestUnion: &pb.WatchRequest_CreateRequest{CreateRequest: &pb.WatchCreateRequest{Key: []byte(key)}}}); err != nil {
				b.Fatal(err)
			}
		}
		for range n { // the created responses
			if err := ws.RecvMsg(new(frame)); err != nil {
				b.Fatal(err)
			}
		}
		wg.Go(func() {
			for {
				f := new(frame)
				if err := ws.RecvMsg(f); err != nil {
					return
				}
				if got.Add(int64(countEvents(f.data))) == want {
					close(done)
				}
			}
		})
	}
	direct := srv.Client(b)
	val := string(make([]byte, 256))
	runtime.GC()
	b.ReportAllocs()
	b.ResetTimer()
	var next atomic.Int64
	var pw sync.WaitGroup
	for range 4 {
		pw.Go(func() {
			for next.Add(1) <= int64(b.N) {
				if _, err := direct.Put(ctx, key, val); err != nil {
					b.Error(err)
					return
				}
			}
		})
	}
	pw.Wait()
	select {
	case <-done:
	case <-time.After(2 * time.Minute):
		b.Fatalf("%d of %d events delivered", got.Load(), want)
	}
	b.StopTimer()
	b.ReportMetric(float64(want)/b.Elapsed().Seconds(), "events/s")
	b.ReportMetric(float64(b.Elapsed().Nanoseconds())/float64(want), "ns/event")
}

// countEvents counts the events (field 11) of an encoded WatchResponse.
func countEvents(b []byte) int {
	n := 0
	for len(b) > 0 {
		num, typ, l := protowire.ConsumeTag(b)
		if l < 0 {
			return n
		}
		b = b[l:]
		l = protowire.ConsumeFieldValue(num, typ, b)
		if l < 0 {
			return n
		}
		if num == 11 {
			n++
		}
		b = b[l:]
	}
	return n
}

func insecureCreds() credentials.TransportCredentials { return insecure.NewCredentials() }

// BenchmarkWatchLatency is the time from a put until every one of 200
// watchers (over 10 client streams) has it through the proxy, one put at a
// time; ns/op is that time.
func BenchmarkWatchLatency(b *testing.B) {
	srv := etcdtest.Start(b, etcdtest.Options{})
	p := startProxy(b, Config{Endpoints: srv.Endpoints()})
	ctx, cancel := context.WithCancel(context.Background())
	defer cancel()
	const watchers, streams = 200, 10
	key := fmt.Sprintf("latency/%d", time.Now().UnixNano())
	got := make(chan struct{}, watchers)
	var wg sync.WaitGroup
	defer wg.Wait()
	defer cancel()
	for s := range streams {
		cli := proxyClient(b, p)
		for range watchers / streams {
			wch := cli.Watch(ctx, key, clientv3.WithCreatedNotify())
			<-wch
			wg.Go(func() {
				for wr := range wch {
					for range wr.Events {
						got <- struct{}{}
					}
				}
			})
		}
		_ = s
	}
	direct := srv.Client(b)
	b.ResetTimer()
	for range b.N {
		if _, err := direct.Put(ctx, key, "x"); err != nil {
			b.Fatal(err)
		}
		for range watchers {
			<-got
		}
	}
}

// discardStream is the server side of a client Watch stream that writes
// every response into a buffer, as gRPC's transport copies it, counts its
// events, and forgets it.
type discardStream struct {
	grpc.ServerStream
	ctx    context.Context
	codec  codec
	buf    []byte
	events atomic.Int64
}

func (d *discardStream) Context() context.Context { return d.ctx }

func (d *discardStream) SendMsg(m any) error {
	data, err := d.codec.Marshal(m)
	if err != nil {
		return err
	}
	d.buf = d.buf[:0]
	for _, b := range data {
		d.buf = append(d.buf, b.ReadOnlyData()...)
	}
	data.Free() // as gRPC does once it has written a message
	d.events.Add(int64(countEvents(d.buf)))
	return nil
}

// BenchmarkDispatch is the proxy's fan-out hot path alone, without
// network or etcd: one upstream response of one event handed to watchers
// identical watchers over 10 client streams, queued, spliced and written
// by each stream's sender (ns/op is per upstream event, ns/event per
// client event). The reuse of scratch memory is measured by switching it
// off: reuse=nospare drops each stream's spare queue, as if there were
// none (it takes the streams' locks, as reuse=all does too, so that only
// the reuse differs).
func BenchmarkDispatch(b *testing.B) {
	for _, watchers := range []int{100, 1000} {
		for _, reuse := range []string{"all", "nospare"} {
			b.Run(fmt.Sprintf("watchers=%d/reuse=%s", watchers, reuse), func(b *testing.B) { benchDispatch(b, watchers, reuse) })
		}
	}
	// Past the caches: each watcher's own memory is a miss per event.
	b.Run("watchers=100000/reuse=all", func(b *testing.B) { benchDispatch(b, 100_000, "all") })
}

// dispatchAhead is how far BenchmarkDispatch's upstream may run ahead of
// its senders, in upstream events, with watchers over 10 streams: enough
// that a lagging stream merges, as a real one does, and about 16 MiB of
// events queued per stream at most, a quarter of a stream's bound.
func dispatchAhead(watchers int) int {
	return min(16, max(2, 16<<20/(watchers/10*400)))
}

func benchDispatch(b *testing.B, watchers int, reuse string) {
	p, err := New(Config{Endpoints: []string{"http://127.0.0.1:1"}})
	if err != nil {
		b.Fatal(err)
	}
	h := newWatchHub(p)
	ctx, cancel := context.WithCancel(context.Background())
	defer cancel()
	u := &upstream{hub: h, key: watchKey{key: "k"}, pos: etcdwatch.Position{Next: 1}, gen: 1, ctx: ctx, cancel: cancel, recv: newReceivers()}
	var streams []*discardStream
	var css []*cstream
	var wg sync.WaitGroup
	defer wg.Wait()
	defer cancel()
	for s := range 10 {
		ds := &discardStream{ctx: ctx, codec: newCodec()}
		streams = append(streams, ds)
		cctx, ccancel := context.WithCancelCause(ctx)
		cs := &cstream{hub: h, ss: ds, ctx: cctx, cancel: ccancel, watchers: map[int64]*cwatcher{},
			signal: make(chan struct{}, 1), pending: map[*upstream]bool{}}
		css = append(css, cs)
		wg.Go(func() { _ = cs.sendLoop() })
		for i := range watchers / 10 {
			id := int64(s*watchers + i)
			w := &cwatcher{id: id, s: cs, up: u}
			cs.watchers[id] = w
			u.recv.add(w, 1)
		}
	}
	val := make([]byte, 256)
	want := int64(watchers) * int64(b.N)
	ahead := dispatchAhead(watchers)
	// waitFor waits until the senders delivered n events. A stream whose
	// queue outgrew its bound is ended, as a client that does not read
	// would be: the benchmark fails then rather than wait forever.
	waitFor := func(n int64) {
		for {
			var got int64
			for _, ds := range streams {
				got += ds.events.Load()
			}
			if got >= n {
				return
			}
			for _, cs := range css {
				if err := context.Cause(cs.ctx); err != nil {
					b.Fatalf("%d of %d events delivered: a stream ended: %v", got, n, err)
				}
			}
			runtime.Gosched() // the senders drain in their goroutines
		}
	}
	b.ReportAllocs()
	b.ResetTimer()
	for i := range b.N {
		rev := int64(i + 1)
		ev := &clientv3.Event{Type: clientv3.EventTypePut, Kv: &mvccpb.KeyValue{Key: []byte("k"), Value: val, CreateRevision: 1, ModRevision: rev, Version: rev}}
		u.dispatch(&clientv3.WatchResponse{Header: &pb.ResponseHeader{ClusterId: 1, MemberId: 2, Revision: rev, RaftTerm: 3}, Events: []*clientv3.Event{ev}}, 1)
		for _, cs := range css {
			cs.mu.Lock()
			if reuse == "nospare" {
				cs.spare = nil
			}
			cs.mu.Unlock()
		}
		if i >= ahead {
			waitFor(int64(i+1-ahead) * int64(watchers))
		}
	}
	waitFor(want)
	b.StopTimer()
	b.ReportMetric(float64(b.Elapsed().Nanoseconds())/float64(want), "ns/event")
}

// BenchmarkFirstEventThroughProxy measures what
// TestFirstEventThroughProxyIsNotDelayed checks works: the time from a put
// to the first event of a watch created through the proxy right before
// it. It reports the median and its ratio to firstEventGoal
// (first-event/goal: at most 1).
func BenchmarkFirstEventThroughProxy(b *testing.B) {
	srv := etcdtest.Start(b, etcdtest.Options{})
	p := startProxy(b, Config{Endpoints: srv.Endpoints()})
	cli, direct := proxyClient(b, p), srv.Client(b)
	ctx := ctxT(b)
	var took []time.Duration
	for b.Loop() {
		took = append(took, firstEventsThroughProxy(ctx, b, cli, direct, 1)...)
	}
	slices.Sort(took)
	median := took[len(took)/2]
	b.ReportMetric(float64(median.Microseconds())/1000, "first-event-median-ms")
	b.ReportMetric(float64(median)/float64(firstEventGoal), "first-event/goal")
}
