package xdsapi

import (
	"context"
	"fmt"
	"sync"
	"testing"

	"github.com/beaconplane/beacon"
	discoveryv3 "github.com/envoyproxy/go-control-plane/envoy/service/discovery/v3"
	"google.golang.org/grpc"
	"google.golang.org/grpc/credentials/insecure"
)

// BenchmarkFanOut: one change of a service followed by many ADS streams,
// until every stream has the new assignment (and has acknowledged it).
// The streams run in this process, 100 to a connection.
func BenchmarkFanOut(b *testing.B) {
	for _, streams := range []int{100, 1000, 10000} {
		b.Run(fmt.Sprintf("streams=%d", streams), func(b *testing.B) { benchFanOut(b, streams) })
	}
}

func benchFanOut(b *testing.B, streams int) {
	r := memRegistry(b)
	_, addr := startXDS(b, r, Config{MaxStreamsPerClient: -1})
	ctx, cancel := context.WithCancel(context.Background())
	defer cancel()
	var conns []*grpc.ClientConn
	for range (streams + 99) / 100 {
		cc, err := grpc.NewClient(addr, grpc.WithTransportCredentials(insecure.NewCredentials()))
		if err != nil {
			b.Fatal(err)
		}
		defer cc.Close()
		conns = append(conns, cc)
	}
	got := make(chan struct{}, streams)
	var wg sync.WaitGroup
	defer wg.Wait()
	defer cancel()
	for i := range streams {
		wg.Go(func() {
			st, err := discoveryv3.NewAggregatedDiscoveryServiceClient(conns[i/100]).StreamAggregatedResources(ctx)
			if err != nil {
				return
			}
			req := &discoveryv3.DiscoveryRequest{TypeUrl: EndpointType, ResourceNames: []string{"grpc.greeter.demo"}}
			for st.Send(req) == nil {
				resp, err := st.Recv()
				if err != nil {
					return
				}
				req = &discoveryv3.DiscoveryRequest{TypeUrl: EndpointType, ResourceNames: req.ResourceNames,
					VersionInfo: resp.GetVersionInfo(), ResponseNonce: resp.GetNonce()}
				got <- struct{}{}
			}
		})
	}
	for range streams {
		<-got
	}
	b.ResetTimer()
	for i := range b.N {
		reg, err := r.Register(ctx, beacon.Instance{Namespace: "demo", Component: "greeter", Endpoint: "grpc",
			Address: fmt.Sprintf("10.%d.%d.%d:80", i>>16&255, i>>8&255, i&255)})
		if err != nil {
			b.Fatal(err)
		}
		defer reg.Close()
		for range streams {
			<-got
		}
	}
}

// BenchmarkSubscribe: one request subscribing to n names, applied to a
// stream (the receiving goroutine's part: the index's bookkeeping, no
// response); ns/name stays flat as n grows.
func BenchmarkSubscribe(b *testing.B) {
	for _, n := range []int{1_000, 10_000, 100_000} {
		b.Run(fmt.Sprintf("names=%d", n), func(b *testing.B) {
			srv, _ := startXDS(b, memRegistry(b), Config{MaxNamesPerClient: -1})
			req := &discoveryv3.DiscoveryRequest{TypeUrl: ClusterType, ResourceNames: manyNames(n)}
			empty := &discoveryv3.DiscoveryRequest{TypeUrl: ClusterType, ResourceNames: []string{"none.c.ns"}}
			for b.Loop() {
				st := &stream{srv: srv, peer: "bench", wake: make(chan struct{}, 1), types: map[string]*typeState{},
					refs: map[service]*[numTypes]int{}, visible: map[string]bool{}}
				st.mu.Lock()
				if err := st.handle(req); err != nil {
					b.Fatal(err)
				}
				if err := st.handle(empty); err != nil { // drops them all
					b.Fatal(err)
				}
				st.mu.Unlock()
			}
			b.ReportMetric(float64(b.Elapsed().Nanoseconds())/float64(b.N*n), "ns/name")
		})
	}
}
