package proxy

import (
	"bufio"
	"context"
	"encoding/json"
	"fmt"
	"net"
	"net/http"
	"strings"
	"testing"

	"github.com/beaconplane/beacon/internal/testkit/etcdtest"
	"github.com/prometheus/client_golang/prometheus"
	pb "go.etcd.io/etcd/api/v3/etcdserverpb"
	clientv3 "go.etcd.io/etcd/client/v3"
	"google.golang.org/grpc"
	"google.golang.org/grpc/codes"
	"google.golang.org/grpc/credentials/insecure"
	"google.golang.org/grpc/status"
)

// TestWatchCoalescing opens many identical watches from several clients:
// they share one upstream watch, each sees every event exactly once, and
// cancelling them all ends the upstream watch.
func TestWatchCoalescing(t *testing.T) {
	t.Parallel()
	c := etcdtest.StartCluster(t, 3)
	p := startProxy(t, Config{PeerURLs: c.PeerURLs()})
	ctx := ctxT(t)
	const clients, perClient = 5, 40
	var chans []clientv3.WatchChan
	var clis []*clientv3.Client
	for range clients {
		cli := proxyClient(t, p)
		clis = append(clis, cli)
		for range perClient {
			wch := cli.Watch(ctx, "/svc/a", clientv3.WithCreatedNotify())
			if wr := <-wch; !wr.Created {
				t.Fatalf("not created: %+v", wr)
			}
			chans = append(chans, wch)
		}
	}
	if n := value(t, p.m.clientWatchers); n != clients*perClient {
		t.Fatalf("client_watchers = %v, want %d", n, clients*perClient)
	}
	if n := value(t, p.m.upstreamWatches); n != 1 {
		t.Fatalf("upstream_watches = %v, want 1 for %d identical watches", n, clients*perClient)
	}
	direct := c.Client(t)
	for i := range 3 {
		if _, err := direct.Put(ctx, "/svc/a", fmt.Sprint(i)); err != nil {
			t.Fatal(err)
		}
	}
	for n, wch := range chans {
		var got []string
		for len(got) < 3 {
			wr := <-wch
			if wr.Err() != nil {
				t.Fatalf("watch %d: %v", n, wr.Err())
			}
			for _, ev := range wr.Events {
				got = append(got, string(ev.Kv.Value))
			}
		}
		if fmt.Sprint(got) != "[0 1 2]" {
			t.Fatalf("watch %d got %v", n, got)
		}
	}

	// A watcher from an old revision replays history on its own upstream,
	// then joins the shared one.
	hist := clis[0].Watch(ctx, "/svc/a", clientv3.WithRev(1))
	var got []string
	for len(got) < 3 {
		wr := <-hist
		for _, ev := range wr.Events {
			got = append(got, string(ev.Kv.Value))
		}
	}
	if fmt.Sprint(got) != "[0 1 2]" {
		t.Fatalf("history watch got %v", got)
	}
	if _, err := direct.Put(ctx, "/svc/a", "3"); err != nil {
		t.Fatal(err)
	}
	if wr := <-hist; len(wr.Events) != 1 || string(wr.Events[0].Kv.Value) != "3" {
		t.Fatalf("history watch after catch-up: %+v", wr)
	}
	eventually(t, "history upstream merged", func() bool { return value(t, p.m.upstreamWatches) == 1 })

	// Progress requests are answered (etcd#19710).
	if err := clis[1].RequestProgress(ctx); err != nil {
		t.Fatal(err)
	}
	wch := chans[perClient]
	for {
		wr := <-wch
		if len(wr.Events) > 0 {
			continue // the put of "3"
		}
		if !wr.IsProgressNotify() || wr.Header.Revision < 5 {
			t.Fatalf("want a progress notification, got %+v", wr)
		}
		break
	}

	for _, cli := range clis {
		if err := cli.Close(); err != nil {
			t.Fatal(err)
		}
	}
	eventually(t, "upstream watches ended", func() bool {
		return value(t, p.m.upstreamWatches) == 0 && value(t, p.m.clientWatchers) == 0
	})
}

// TestWatchFiltersAndCompaction: per-watcher options apply on a shared
// upstream, and a compacted start revision cancels with the compact
// revision like etcd.
func TestWatchFiltersAndCompaction(t *testing.T) {
	t.Parallel()
	c := etcdtest.StartCluster(t, 3)
	p := startProxy(t, Config{Endpoints: c.Endpoints()})
	cli := proxyClient(t, p)
	ctx := ctxT(t)
	all := cli.Watch(ctx, "/k", clientv3.WithPrefix(), clientv3.WithPrevKV(), clientv3.WithCreatedNotify())
	noPut := cli.Watch(ctx, "/k", clientv3.WithPrefix(), clientv3.WithPrevKV(), clientv3.WithFilterPut(), clientv3.WithCreatedNotify())
	// Without prev-kv: another upstream watch (etcd then reads no previous
	// values for it).
	plain := cli.Watch(ctx, "/k", clientv3.WithPrefix(), clientv3.WithCreatedNotify())
	<-all
	<-noPut
	<-plain
	direct := c.Client(t)
	if _, err := direct.Put(ctx, "/k/1", "a"); err != nil {
		t.Fatal(err)
	}
	if _, err := direct.Put(ctx, "/k/1", "b"); err != nil {
		t.Fatal(err)
	}
	if _, err := direct.Delete(ctx, "/k/1"); err != nil {
		t.Fatal(err)
	}
	var types []string
	for len(types) < 3 {
		wr := <-all
		for _, ev := range wr.Events {
			types = append(types, ev.Type.String())
			if ev.Type == clientv3.EventTypeDelete && (ev.PrevKv == nil || string(ev.PrevKv.Value) != "b") {
				t.Errorf("delete without prev kv: %+v", ev)
			}
		}
	}
	wr := <-noPut
	if len(wr.Events) != 1 || wr.Events[0].Type != clientv3.EventTypeDelete || wr.Events[0].PrevKv == nil {
		t.Fatalf("NOPUT watcher got %+v", wr.Events)
	}
	var plainEvents []*clientv3.Event
	for len(plainEvents) < 3 {
		wr := <-plain
		plainEvents = append(plainEvents, wr.Events...)
	}
	for _, ev := range plainEvents {
		if ev.PrevKv != nil {
			t.Errorf("watcher without prev-kv got one: %+v", ev)
		}
	}
	if value(t, p.m.upstreamWatches) != 2 {
		t.Errorf("upstream_watches = %v, want 2 (with and without prev-kv)", value(t, p.m.upstreamWatches))
	}
	resp, err := direct.Put(ctx, "/k/2", "x")
	if err != nil {
		t.Fatal(err)
	}
	if _, err := direct.Compact(ctx, resp.Header.Revision); err != nil {
		t.Fatal(err)
	}
	old := cli.Watch(ctx, "/k", clientv3.WithPrefix(), clientv3.WithRev(2))
	wr = <-old
	if wr.CompactRevision != resp.Header.Revision || !wr.Canceled {
		t.Fatalf("watch from a compacted revision: %+v", wr)
	}
}

// TestSlowWatchStream: a client stream that stops reading is ended with
// ResourceExhausted once what waits for it is past its bound — its watchers
// freed at once, not when the client next reads — and does not hold up
// other watchers of the same upstream watch, which get every event.
//
// What a stream that does not read absorbs before its queue grows depends
// on gRPC flow control and on how etcd batches revisions (under load, many
// in one response): so the slow client has fixed windows (no BDP
// estimation, which grows them with the measured round trip), and the test
// writes until the proxy gives up on it, not a fixed count. The fast
// watcher's margin is the bound: about 128 writes it may fall behind.
func TestSlowWatchStream(t *testing.T) {
	t.Parallel()
	c := etcdtest.StartCluster(t, 3)
	p, err := New(Config{PeerURLs: c.PeerURLs(), Logger: testLogger(t)})
	if err != nil {
		t.Fatal(err)
	}
	p.watchQueueBytes = 1 << 20 // 128 events of 8 KiB
	serveOn(t, p, mustListen(t))
	// The slow stream absorbs its windows (128 KiB), what its sender took,
	// and the bound (1 MiB) plus one response: a few hundred writes.
	n, err := slowBesideFast(t, c, p, p.m.watchDropped, func() {
		// The stream ended as slow goes at once, though its client still
		// reads nothing and its sender is blocked on the client's window:
		// its watcher and its place among the streams are freed.
		eventually(t, "the slow stream's watcher detached while its client reads nothing", func() bool {
			return p.watch.watchers.Load() == 1 && value(t, p.m.watchStreams) == 1
		})
	})
	if status.Code(err) != codes.ResourceExhausted {
		t.Fatalf("slow stream ended with %v, want ResourceExhausted", err)
	}
	if v := value(t, p.m.watchDropped); v != 1 {
		t.Errorf("watch_slow_streams_total = %v, want 1", v)
	}
	t.Logf("the stream that did not read was ended after %d writes", n)
}

// slowBesideFast watches key s on p through a raw stream whose client
// never reads (fixed flow-control windows: no BDP estimation grows them)
// and through a clientv3 watcher that does, writes 8 KiB values to c until
// counter counts (the proxy gave up on the slow stream; at most 2,000
// writes), calls ended, checks that the reader got every event in order,
// and returns the number of writes and the error the slow stream ended
// with.
func slowBesideFast(t *testing.T, c *etcdtest.Cluster, p *Proxy, counter prometheus.Metric, ended func()) (int, error) {
	t.Helper()
	ctx := ctxT(t)
	slow, err := pb.NewWatchClient(grpcConn(t, p, fixedWindows...)).Watch(ctx)
	if err != nil {
		t.Fatal(err)
	}
	if err := slow.Send(&pb.WatchRequest{RequestUnion: &pb.WatchRequest_CreateRequest{CreateRequest: &pb.WatchCreateRequest{Key: []byte("s")}}}); err != nil {
		t.Fatal(err)
	}
	if r, err := slow.Recv(); err != nil || !r.Created {
		t.Fatalf("created: %v %v", r, err)
	}
	fast := proxyClient(t, p).Watch(ctx, "s")
	direct := c.Client(t)
	const size, most = 8 << 10, 2000
	val := strings.Repeat("x", size)
	var last int64
	n := 0
	for value(t, counter) == 0 {
		if n == most {
			t.Fatalf("%d writes of %d bytes and the stream that does not read is still served", n, size)
		}
		resp, err := direct.Put(ctx, "s", val)
		if err != nil {
			t.Fatal(err)
		}
		last, n = resp.Header.Revision, n+1
	}
	ended()
	got := 0
	for got < n {
		wr, ok := <-fast
		if !ok || wr.Err() != nil {
			t.Fatalf("the watcher that reads, after %d of %d events: %v (closed: %v)", got, n, wr.Err(), !ok)
		}
		for _, ev := range wr.Events {
			if got++; ev.Kv.ModRevision == last && got != n {
				t.Fatalf("the watcher that reads: revision %d was event %d of %d", last, got, n)
			}
		}
	}
	for {
		if _, err := slow.Recv(); err != nil {
			return n, err
		}
	}
}

// TestWatchStreamsShedPastTheProxysBound: what waits for all client
// streams together is bounded apart from each stream's own bound: a
// stream whose client stops reading, within its own bound, is ended
// (ResourceExhausted, naming the setting) once what waits for the streams
// passes the proxy's, as the one that waited longest; the watcher that
// reads gets every event, and once it has, nothing waits.
func TestWatchStreamsShedPastTheProxysBound(t *testing.T) {
	t.Parallel()
	c := etcdtest.StartCluster(t, 1)
	p, err := New(Config{Endpoints: c.Endpoints(), Logger: testLogger(t), MaxWatchWaitingBytes: 1 << 20})
	if err != nil {
		t.Fatal(err)
	}
	serveOn(t, p, mustListen(t))
	// The slow stream absorbs its windows (128 KiB) and the proxy's bound
	// (1 MiB) plus one response: a few hundred writes, far below its own
	// bound (64 MiB).
	n, err := slowBesideFast(t, c, p, p.m.watchShed, func() {})
	if status.Code(err) != codes.ResourceExhausted || !strings.Contains(err.Error(), "MaxWatchWaitingBytes") {
		t.Fatalf("the stream that does not read ended with %v, want ResourceExhausted naming the bound", err)
	}
	eventually(t, "nothing waits once the reader has everything and the other stream is gone", func() bool {
		return p.m.watchWaiting.Load() == 0 && p.watch.watchers.Load() == 1
	})
	if v := value(t, p.m.watchDropped); v != 0 {
		t.Errorf("watch_slow_streams_total = %v, want 0 (the stream was within its own bound)", v)
	}
	t.Logf("the stream that did not read was shed after %d writes", n)
}

// TestWatchResponseLargerThanBound: one upstream response larger than a
// client stream's bounds on its own (a transaction of many large puts: one
// revision) reaches every client that keeps up, whole, over gRPC and the
// JSON gateway; a stream is ended as slow only when what already waits for
// it is past the bounds, never because of the size of the next response.
func TestWatchResponseLargerThanBound(t *testing.T) {
	t.Parallel()
	c := etcdtest.StartCluster(t, 1)
	p, err := New(Config{Endpoints: c.Endpoints(), Logger: testLogger(t)})
	if err != nil {
		t.Fatal(err)
	}
	p.watchQueueBytes = 64 << 10
	p.watchQueue = 4
	serveOn(t, p, mustListen(t))
	ctx := ctxT(t)

	// A clientv3 watcher, a raw stream with more watchers of the key than
	// the bound on responses, and a watch over the JSON gateway.
	cw := proxyClient(t, p).Watch(ctx, "big/", clientv3.WithPrefix(), clientv3.WithCreatedNotify())
	if wr := <-cw; !wr.Created {
		t.Fatalf("clientv3 watch: %+v", wr)
	}
	const watchers = 10
	raw, err := pb.NewWatchClient(grpcConn(t, p)).Watch(ctx)
	if err != nil {
		t.Fatal(err)
	}
	for range watchers {
		if err := raw.Send(&pb.WatchRequest{RequestUnion: &pb.WatchRequest_CreateRequest{CreateRequest: &pb.WatchCreateRequest{Key: []byte("big/"), RangeEnd: []byte("big0")}}}); err != nil {
			t.Fatal(err)
		}
		if r, err := raw.Recv(); err != nil || !r.Created {
			t.Fatalf("created: %v %v", r, err)
		}
	}
	req, _ := http.NewRequestWithContext(ctx, http.MethodPost, "http://"+p.Addr().String()+"/v3/watch",
		strings.NewReader(`{"create_request":{"key":"YmlnLw==","range_end":"YmlnMA=="}}`))
	hresp, err := httpClient(t).Do(req)
	if err != nil {
		t.Fatal(err)
	}
	defer hresp.Body.Close()
	dec := json.NewDecoder(hresp.Body)
	var created struct {
		Result struct {
			Created bool `json:"created"`
		} `json:"result"`
	}
	if err := dec.Decode(&created); err != nil || !created.Result.Created {
		t.Fatalf("gateway watch: %+v %v", created, err)
	}

	// 64 puts of 4 KiB in one transaction: one response of 256 KiB of
	// events, four times the byte bound.
	const puts, size = 64, 4 << 10
	val := strings.Repeat("v", size)
	var ops []clientv3.Op
	for i := range puts {
		ops = append(ops, clientv3.OpPut(fmt.Sprintf("big/%02d", i), val))
	}
	if _, err := c.Client(t).Txn(ctx).Then(ops...).Commit(); err != nil {
		t.Fatal(err)
	}

	for got := 0; got < puts; {
		wr := <-cw
		if wr.Err() != nil || wr.Canceled {
			t.Fatalf("clientv3 watcher after %d of %d events: %v", got, puts, wr.Err())
		}
		got += len(wr.Events)
	}
	got := map[int64]int{}
	for n := 0; n < watchers; {
		r, err := raw.Recv()
		if err != nil || r.Canceled {
			t.Fatalf("raw stream after %v: %v %v", got, err, r)
		}
		if got[r.WatchId] += len(r.Events); got[r.WatchId] == puts {
			n++
		}
	}
	for n := 0; n < puts; {
		var m struct {
			Result struct {
				Events   []json.RawMessage `json:"events"`
				Canceled bool              `json:"canceled"`
			} `json:"result"`
			Error any `json:"error"`
		}
		if err := dec.Decode(&m); err != nil || m.Error != nil || m.Result.Canceled {
			t.Fatalf("gateway watch after %d of %d events: %v %+v", n, puts, err, m)
		}
		n += len(m.Result.Events)
	}
	if v := value(t, p.m.watchDropped); v != 0 {
		t.Errorf("watch_slow_streams_total = %v, want 0", v)
	}
}

// TestWatcherBounds: a watch stream holds at most MaxWatchersPerStream
// watchers and the proxy MaxWatchers; a watch past either is answered
// canceled with the reason (one client once created 100,000, each an
// upstream watch, and took the proxy to 1.6 GB); a canceled watch frees
// its place.
func TestWatcherBounds(t *testing.T) {
	t.Parallel()
	srv := etcdtest.Start(t, etcdtest.Options{})
	p := startProxy(t, Config{Endpoints: srv.Endpoints(), MaxWatchers: 5, MaxWatchersPerStream: 3})
	ctx := ctxT(t)
	conn := grpcConn(t, p)
	stream := func() pb.Watch_WatchClient {
		ws, err := pb.NewWatchClient(conn).Watch(ctx)
		if err != nil {
			t.Fatal(err)
		}
		return ws
	}
	create := func(ws pb.Watch_WatchClient, key string) *pb.WatchResponse {
		t.Helper()
		if err := ws.Send(&pb.WatchRequest{RequestUnion: &pb.WatchRequest_CreateRequest{CreateRequest: &pb.WatchCreateRequest{Key: []byte(key)}}}); err != nil {
			t.Fatal(err)
		}
		r, err := ws.Recv()
		if err != nil {
			t.Fatal(err)
		}
		return r
	}
	a := stream()
	var ids []int64
	for i := range 3 {
		r := create(a, fmt.Sprintf("/a/%d", i))
		if !r.Created || r.Canceled {
			t.Fatalf("watcher %d of 3 on a stream: %+v", i, r)
		}
		ids = append(ids, r.WatchId)
	}
	if r := create(a, "/a/3"); !r.Canceled || !strings.Contains(r.CancelReason, "this watch stream has 3 watchers") || !strings.Contains(r.CancelReason, "proxy.Config.MaxWatchersPerStream") {
		t.Fatalf("a 4th watcher on the stream: %+v, want it canceled saying why", r)
	}
	b := stream()
	for i := range 2 {
		if r := create(b, fmt.Sprintf("/b/%d", i)); !r.Created || r.Canceled {
			t.Fatalf("watcher %d on a second stream: %+v", i, r)
		}
	}
	if r := create(b, "/b/2"); !r.Canceled || !strings.Contains(r.CancelReason, "5 watchers are open on this proxy") {
		t.Fatalf("a 6th watcher on the proxy: %+v, want it canceled saying why", r)
	}
	// Canceling one frees its place.
	if err := a.Send(&pb.WatchRequest{RequestUnion: &pb.WatchRequest_CancelRequest{CancelRequest: &pb.WatchCancelRequest{WatchId: ids[0]}}}); err != nil {
		t.Fatal(err)
	}
	if r, err := a.Recv(); err != nil || !r.Canceled || r.WatchId != ids[0] {
		t.Fatalf("cancel: %+v %v", r, err)
	}
	if r := create(b, "/b/3"); !r.Created || r.Canceled {
		t.Fatalf("a watcher after one was canceled: %+v", r)
	}
}

// openWatch opens a watch stream on conn with one watch of key and returns
// the first response (or the stream's error).
func openWatch(ctx context.Context, conn *grpc.ClientConn, key string) (*pb.WatchResponse, error) {
	ws, err := pb.NewWatchClient(conn).Watch(ctx)
	if err != nil {
		return nil, err
	}
	if err := ws.Send(&pb.WatchRequest{RequestUnion: &pb.WatchRequest_CreateRequest{CreateRequest: &pb.WatchCreateRequest{Key: []byte(key)}}}); err != nil {
		return nil, err
	}
	return ws.Recv()
}

// TestStreamBound: at most MaxStreams client streams (watch and lease
// keep-alive alike) are open at once; one past it ends with
// ResourceExhausted saying what to do, and a closed stream frees its place
// (nothing bounded empty watch streams: about 20 KiB each on the proxy).
func TestStreamBound(t *testing.T) {
	t.Parallel()
	srv := etcdtest.Start(t, etcdtest.Options{})
	p := startProxy(t, Config{Endpoints: srv.Endpoints(), MaxStreams: 3})
	ctx := ctxT(t)
	conn := grpcConn(t, p)
	watch := func(ctx context.Context) (*pb.WatchResponse, error) { return openWatch(ctx, conn, "/k") }
	actx, closeA := context.WithCancel(ctx)
	defer closeA()
	for i, c := range []context.Context{actx, ctx} {
		if r, err := watch(c); err != nil || !r.Created {
			t.Fatalf("watch stream %d of 3: %+v %v", i+1, r, err)
		}
	}
	lease, err := pb.NewLeaseClient(conn).LeaseGrant(ctx, &pb.LeaseGrantRequest{TTL: 60})
	if err != nil {
		t.Fatal(err)
	}
	ka, err := pb.NewLeaseClient(conn).LeaseKeepAlive(ctx)
	if err != nil {
		t.Fatal(err)
	}
	if err := ka.Send(&pb.LeaseKeepAliveRequest{ID: lease.ID}); err != nil {
		t.Fatal(err)
	}
	if r, err := ka.Recv(); err != nil || r.TTL <= 0 {
		t.Fatalf("keep-alive stream, the 3rd: %+v %v", r, err)
	}
	if n := value(t, p.m.clientStreams); n != 3 {
		t.Fatalf("client_streams = %v, want 3", n)
	}
	_, err = watch(ctx)
	if status.Code(err) != codes.ResourceExhausted || !strings.Contains(err.Error(), "3 client streams are open") || !strings.Contains(err.Error(), "proxy.Config.MaxStreams") {
		t.Fatalf("a 4th stream: %v, want ResourceExhausted saying why", err)
	}
	closeA()
	eventually(t, "the closed stream's place to free", func() bool { return value(t, p.m.clientStreams) == 2 })
	if r, err := watch(ctx); err != nil || !r.Created {
		t.Fatalf("a stream after one closed: %+v %v", r, err)
	}
}

// TestWatcherCountSurvivesRaces: the count behind MaxWatchers returns to
// zero when streams end while their upstream watch ends too (it leaked
// every watcher whose stream dropped it before the upstream's end counted
// it: 4,452 of 20,000 streams, which would have filled MaxWatchers for
// good).
func TestWatcherCountSurvivesRaces(t *testing.T) {
	t.Parallel()
	srv := etcdtest.Start(t, etcdtest.Options{})
	p := startProxy(t, Config{Endpoints: srv.Endpoints()})
	conn := grpcConn(t, p)
	for round := range 5 {
		ctx, cancel := context.WithCancel(ctxT(t))
		for range 100 {
			ws, err := pb.NewWatchClient(conn).Watch(ctx)
			if err != nil {
				t.Fatal(err)
			}
			if err := ws.Send(&pb.WatchRequest{RequestUnion: &pb.WatchRequest_CreateRequest{CreateRequest: &pb.WatchCreateRequest{Key: []byte("/race")}}}); err != nil {
				t.Fatal(err)
			}
			if r, err := ws.Recv(); err != nil || !r.Created {
				t.Fatalf("create: %+v %v", r, err)
			}
		}
		h := p.watchHub()
		h.mu.Lock()
		var ups []*upstream
		for _, g := range h.groups {
			ups = append(ups, g...)
		}
		h.mu.Unlock()
		// The streams end while their upstream ends.
		done := make(chan struct{})
		go func() {
			defer close(done)
			for _, u := range ups {
				if u.key.stream == "" {
					u.end(nil, 0, "test: the upstream ends")
				}
			}
		}()
		cancel()
		<-done
		eventually(t, fmt.Sprintf("round %d: the watcher count back to 0", round), func() bool { return h.watchers.Load() == 0 })
	}
}

// TestStreamBoundPerClient: one client address may have at most
// MaxStreamsPerClient streams open, so that it cannot take MaxStreams from
// the others (one client held all 10,000 and every other was refused).
// The JSON gateway's streams count for their HTTP client's address, not
// for the in-memory connection they all share.
func TestStreamBoundPerClient(t *testing.T) {
	t.Parallel()
	srv := etcdtest.Start(t, etcdtest.Options{})
	p := startProxy(t, Config{Endpoints: srv.Endpoints(), MaxStreams: 100, MaxStreamsPerClient: 2})
	ctx := ctxT(t)
	watch := func(conn *grpc.ClientConn) (*pb.WatchResponse, error) { return openWatch(ctx, conn, "/k") }
	greedy, other := dialFrom(t, p, "127.0.0.2"), dialFrom(t, p, "127.0.0.3")
	for i := range 2 {
		if r, err := watch(greedy); err != nil || !r.Created {
			t.Fatalf("stream %d of 127.0.0.2: %+v %v", i+1, r, err)
		}
	}
	_, err := watch(greedy)
	if status.Code(err) != codes.ResourceExhausted || !strings.Contains(err.Error(), "127.0.0.2 has 2 watch streams") || !strings.Contains(err.Error(), "proxy.Config.MaxStreamsPerClient") {
		t.Fatalf("a 3rd stream of 127.0.0.2: %v, want ResourceExhausted saying why", err)
	}
	if r, err := watch(other); err != nil || !r.Created {
		t.Fatalf("a stream of 127.0.0.3 while 127.0.0.2 is at its bound: %+v %v", r, err)
	}

	// Gateway watches: per HTTP client address.
	gateway := func(src string) (int, string) {
		return gatewayStream(t, p, src, "/v3/watch", `{"create_request":{"key":"L2s="}}`)
	}
	for i := range 2 {
		if code, line := gateway("127.0.0.4"); code != 200 || !strings.Contains(line, `"created":true`) {
			t.Fatalf("gateway stream %d of 127.0.0.4: %d %s", i+1, code, line)
		}
	}
	if _, line := gateway("127.0.0.4"); !strings.Contains(line, "127.0.0.4 has 2 watch streams") {
		t.Fatalf("a 3rd gateway stream of 127.0.0.4: %s, want the per-client refusal", line)
	}
	if code, line := gateway("127.0.0.5"); code != 200 || !strings.Contains(line, `"created":true`) {
		t.Fatalf("a gateway stream of 127.0.0.5: %d %s", code, line)
	}
}

// TestSilentStreamsMakeRoomPerClient: every process of a host shares its
// address, so streams one of them opens and leaves silent must not lock
// the others out at MaxStreamsPerClient: a new stream takes the place of
// the oldest silent one of its address (which ends with
// ResourceExhausted saying why). Streams that have carried a request are
// never shed.
func TestSilentStreamsMakeRoomPerClient(t *testing.T) {
	t.Parallel()
	srv := etcdtest.Start(t, etcdtest.Options{})
	p := startProxy(t, Config{Endpoints: srv.Endpoints(), MaxStreams: 100, MaxStreamsPerClient: 4})
	ctx := ctxT(t)
	// One process of 127.0.0.2 opens the address's four watch places,
	// silent.
	flood := dialFrom(t, p, "127.0.0.2")
	var silent []pb.Watch_WatchClient
	for range 4 {
		ws, err := pb.NewWatchClient(flood).Watch(ctx)
		if err != nil {
			t.Fatal(err)
		}
		silent = append(silent, ws)
	}
	eventually(t, "the four silent streams open", func() bool { return value(t, p.m.clientStreams) == 4 })
	ended := make(chan error, len(silent))
	for _, ws := range silent {
		go func() {
			_, err := ws.Recv()
			ended <- err
		}()
	}
	// Another process of the same address: its watch is served in place
	// of a silent stream; its lease keep-alive, a kind of its own, beside
	// them.
	legit := dialFrom(t, p, "127.0.0.2")
	if r, err := openWatch(ctx, legit, "/k"); err != nil || !r.Created {
		t.Fatalf("a watch of another process of 127.0.0.2: %+v %v", r, err)
	}
	lease, err := pb.NewLeaseClient(legit).LeaseGrant(ctx, &pb.LeaseGrantRequest{TTL: 10})
	if err != nil {
		t.Fatal(err)
	}
	ka, err := pb.NewLeaseClient(legit).LeaseKeepAlive(ctx)
	if err != nil {
		t.Fatal(err)
	}
	if err := ka.Send(&pb.LeaseKeepAliveRequest{ID: lease.ID}); err != nil {
		t.Fatal(err)
	}
	if r, err := ka.Recv(); err != nil || r.TTL <= 0 {
		t.Fatalf("a keep-alive of another process of 127.0.0.2: %+v %v", r, err)
	}
	// One silent stream made room (the oldest the proxy admitted), and
	// says why.
	shed := func(n int) {
		t.Helper()
		for range n {
			err := <-ended
			if status.Code(err) != codes.ResourceExhausted || !strings.Contains(err.Error(), "closed to make room") ||
				!strings.Contains(err.Error(), "proxy.Config.MaxStreamsPerClient") {
				t.Fatalf("a silent stream: %v, want it ended with ResourceExhausted saying why", err)
			}
		}
	}
	shed(1)
	if n := value(t, p.m.shedStreams); n != 1 {
		t.Fatalf("shed_streams_total = %v, want 1", n)
	}
	// The remaining watch places hold three silent streams and one that
	// carries requests: three more newcomers take the silent ones' places,
	// then the next is refused — the streams in use are never shed.
	for range 3 {
		if r, err := openWatch(ctx, legit, "/k"); err != nil || !r.Created {
			t.Fatalf("a watch in place of a silent stream: %+v %v", r, err)
		}
	}
	shed(3)
	if _, err := openWatch(ctx, legit, "/k"); status.Code(err) != codes.ResourceExhausted || !strings.Contains(err.Error(), "each carrying requests") {
		t.Fatalf("a stream past the bound with none silent: %v, want ResourceExhausted", err)
	}
	if err := ka.Send(&pb.LeaseKeepAliveRequest{ID: lease.ID}); err != nil {
		t.Fatal(err)
	}
	if r, err := ka.Recv(); err != nil || r.TTL <= 0 {
		t.Fatalf("the keep-alive stream after the bound was reached: %+v %v", r, err)
	}
}

// TestStreamKindsHoldPlacesOfTheirOwn: MaxStreamsPerClient bounds each
// kind of stream of an address on its own. Every process of a host shares
// its address: one process holding the address's places with watch
// streams, each carrying a request, got another process's lease
// keep-alive stream refused, and that process lost its lease. Now the
// watches are refused past the bound and keep-alives are not, and the
// other way round, over gRPC and through the JSON gateway alike.
func TestStreamKindsHoldPlacesOfTheirOwn(t *testing.T) {
	t.Parallel()
	srv := etcdtest.Start(t, etcdtest.Options{})
	p := startProxy(t, Config{Endpoints: srv.Endpoints(), MaxStreams: 100, MaxStreamsPerClient: 2})
	ctx := ctxT(t)
	flood, other := dialFrom(t, p, "127.0.0.2"), dialFrom(t, p, "127.0.0.2")
	for i := range 2 {
		if r, err := openWatch(ctx, flood, "/k"); err != nil || !r.Created {
			t.Fatalf("watch stream %d of 127.0.0.2: %+v %v", i+1, r, err)
		}
	}
	if _, err := openWatch(ctx, other, "/k"); status.Code(err) != codes.ResourceExhausted || !strings.Contains(err.Error(), "127.0.0.2 has 2 watch streams") {
		t.Fatalf("a 3rd watch stream of 127.0.0.2: %v, want ResourceExhausted naming the kind", err)
	}
	lease, err := pb.NewLeaseClient(other).LeaseGrant(ctx, &pb.LeaseGrantRequest{TTL: 10})
	if err != nil {
		t.Fatal(err)
	}
	keepAlive := func(conn *grpc.ClientConn) error {
		ka, err := pb.NewLeaseClient(conn).LeaseKeepAlive(ctx)
		if err != nil {
			return err
		}
		if err := ka.Send(&pb.LeaseKeepAliveRequest{ID: lease.ID}); err != nil {
			return err
		}
		r, err := ka.Recv()
		if err == nil && r.TTL <= 0 {
			return fmt.Errorf("TTL %d", r.TTL)
		}
		return err
	}
	for i := range 2 {
		if err := keepAlive(other); err != nil {
			t.Fatalf("keep-alive stream %d of 127.0.0.2, its watch places all taken: %v", i+1, err)
		}
	}
	if err := keepAlive(flood); status.Code(err) != codes.ResourceExhausted || !strings.Contains(err.Error(), "127.0.0.2 has 2 lease keep-alive streams") {
		t.Fatalf("a 3rd keep-alive stream of 127.0.0.2: %v, want ResourceExhausted naming the kind", err)
	}

	// Through the gateway: an HTTP client's watches do not take its
	// keep-alives' places.
	for i := range 2 {
		if code, line := gatewayStream(t, p, "127.0.0.4", "/v3/watch", `{"create_request":{"key":"L2s="}}`); code != 200 || !strings.Contains(line, `"created":true`) {
			t.Fatalf("gateway watch stream %d of 127.0.0.4: %d %s", i+1, code, line)
		}
	}
	body := fmt.Sprintf(`{"ID":"%d"}`, lease.ID)
	if code, line := gatewayStream(t, p, "127.0.0.4", "/v3/lease/keepalive", body); code != 200 || !strings.Contains(line, `"TTL"`) {
		t.Fatalf("a gateway keep-alive of 127.0.0.4, its watch places all taken: %d %s", code, line)
	}
}

// dialFrom dials p from the loopback source address src, as a process of
// another host would.
func dialFrom(t *testing.T, p *Proxy, src string) *grpc.ClientConn {
	t.Helper()
	d := net.Dialer{LocalAddr: &net.TCPAddr{IP: net.ParseIP(src)}}
	conn, err := grpc.NewClient(p.Addr().String(), grpc.WithTransportCredentials(insecure.NewCredentials()),
		grpc.WithContextDialer(func(ctx context.Context, addr string) (net.Conn, error) { return d.DialContext(ctx, "tcp", addr) }))
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { _ = conn.Close() })
	return conn
}

// gatewayStream opens a JSON gateway stream from the loopback source
// address src and returns its status and first line; the stream stays
// open until the test ends.
func gatewayStream(t *testing.T, p *Proxy, src, path, body string) (int, string) {
	t.Helper()
	c := &http.Client{Transport: &http.Transport{DialContext: (&net.Dialer{LocalAddr: &net.TCPAddr{IP: net.ParseIP(src)}}).DialContext}}
	t.Cleanup(c.CloseIdleConnections)
	req, _ := http.NewRequestWithContext(ctxT(t), http.MethodPost, "http://"+p.Addr().String()+path, strings.NewReader(body))
	// A client naming another address for itself is not believed.
	req.Header.Set("Grpc-Metadata-"+gatewayClientKey, "192.0.2.1")
	resp, err := c.Do(req)
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { _ = resp.Body.Close() })
	line, _ := bufio.NewReader(resp.Body).ReadString('\n')
	return resp.StatusCode, line
}
