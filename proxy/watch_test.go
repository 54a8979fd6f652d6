package proxy

import (
	"context"
	"fmt"
	"strings"
	"testing"

	"github.com/beaconplane/beacon/internal/etcdtest"
	pb "go.etcd.io/etcd/api/v3/etcdserverpb"
	clientv3 "go.etcd.io/etcd/client/v3"
	"google.golang.org/grpc/codes"
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
// ResourceExhausted once its queue is full, and does not hold up other
// watchers of the same upstream watch.
func TestSlowWatchStream(t *testing.T) {
	t.Parallel()
	c := etcdtest.StartCluster(t, 3)
	p, err := New(Config{PeerURLs: c.PeerURLs()})
	if err != nil {
		t.Fatal(err)
	}
	p.watchQueueBytes = 100 << 10 // 50 events of 2 KiB
	serveOn(t, p, mustListen(t))
	ctx := ctxT(t)
	slow, err := pb.NewWatchClient(grpcConn(t, p)).Watch(ctx)
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
	const n = 400
	val := strings.Repeat("x", 2048)
	for range n {
		if _, err := direct.Put(ctx, "s", val); err != nil {
			t.Fatal(err)
		}
	}
	got := 0
	for got < n {
		wr := <-fast
		if wr.Err() != nil {
			t.Fatalf("fast watcher: %v", wr.Err())
		}
		got += len(wr.Events)
	}
	for {
		_, err := slow.Recv()
		if err != nil {
			if status.Code(err) != codes.ResourceExhausted {
				t.Fatalf("slow stream ended with %v, want ResourceExhausted", err)
			}
			break
		}
	}
	if value(t, p.m.watchDropped) != 1 {
		t.Errorf("watch_slow_streams_total = %v", value(t, p.m.watchDropped))
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
	if r := create(a, "/a/3"); !r.Canceled || !strings.Contains(r.CancelReason, "this watch stream has 3 watchers") || !strings.Contains(r.CancelReason, "--max-watchers-per-stream") {
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
