package proxy

import (
	"context"
	"fmt"
	"runtime"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/beaconplane/beacon/internal/etcdtest"
	pb "go.etcd.io/etcd/api/v3/etcdserverpb"
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
