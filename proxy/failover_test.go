package proxy

import (
	"log/slog"
	"net"
	"net/http"
	"net/url"
	"strconv"
	"strings"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/beaconplane/beacon/internal/syncbuf"
	"github.com/beaconplane/beacon/internal/testkit/etcdtest"
	clientv3 "go.etcd.io/etcd/client/v3"
	"go.etcd.io/etcd/server/v3/embed"
	"go.uber.org/zap"
	"google.golang.org/grpc/codes"
	"google.golang.org/grpc/status"
)

// TestFailoverUnderLoad kills a member while clients read and write
// through the proxy: no read fails, the dead endpoint is benched, and it
// comes back into use after it restarts.
func TestFailoverUnderLoad(t *testing.T) {
	t.Parallel()
	c := etcdtest.StartCluster(t, 3)
	p := startProxy(t, Config{PeerURLs: c.PeerURLs(), FailureWait: 500 * time.Millisecond, RefreshInterval: 300 * time.Millisecond})
	cli := proxyClient(t, p)
	ctx := ctxT(t)
	if _, err := cli.Put(ctx, "k", "v"); err != nil {
		t.Fatal(err)
	}
	// Kill a follower: the cluster keeps its leader, so every failed read
	// would be the proxy's fault.
	victim := follower(t, c)

	var reads, failed atomic.Int64
	var firstErr atomic.Value
	stop := make(chan struct{})
	var wg sync.WaitGroup
	for range 4 {
		wg.Go(func() {
			for {
				select {
				case <-stop:
					return
				default:
				}
				if _, err := cli.Get(ctx, "k"); err != nil {
					failed.Add(1)
					firstErr.CompareAndSwap(nil, err.Error())
				}
				reads.Add(1)
			}
		})
	}
	eventually(t, "reads before the kill", func() bool { return reads.Load() > 200 })
	victim.Stop()
	before := reads.Load()
	eventually(t, "the dead endpoint benched", func() bool { return endpointState(p, victim.ClientURL()) == "failed" })
	eventually(t, "reads after the kill", func() bool { return reads.Load() > before+500 })
	close(stop)
	wg.Wait()
	if n := failed.Load(); n != 0 {
		t.Fatalf("%d of %d reads failed through the proxy during fail-over; first: %v", n, reads.Load(), firstErr.Load())
	}
	if _, err := cli.Put(ctx, "k", "after"); err != nil {
		t.Fatalf("write after fail-over: %v", err)
	}
	if err := restart(c, victim); err != nil {
		t.Fatal(err)
	}
	eventually(t, "the restarted endpoint back in use", func() bool { return endpointState(p, victim.ClientURL()) == "available" })
}

func restart(c *etcdtest.Cluster, m *etcdtest.Member) error { return c.Restart(m) }

func endpointState(p *Proxy, url string) string {
	for _, e := range p.Endpoints() {
		if e.URL == url {
			return e.State
		}
	}
	return "absent"
}

// TestAllMembersDown: with every member stopped, requests fail at once
// with Unavailable (gRPC) / 503 (HTTP) and a message saying no member is
// reachable; the proxy stays up and recovers when members return.
func TestAllMembersDown(t *testing.T) {
	t.Parallel()
	c := etcdtest.StartCluster(t, 3)
	// The watch below rides out the outage only within the silence bound
	// (then it is cancelled, TestWatchesCancelledWhenTheOnlyMemberHangs):
	// a bound longer than stopping and restarting three members takes
	// under load.
	p := startProxy(t, Config{PeerURLs: c.PeerURLs(), FailureWait: 200 * time.Millisecond, WatchSilenceTimeout: 2 * testTimeout})
	cli := proxyClient(t, p)
	ctx := ctxT(t)
	if _, err := cli.Put(ctx, "k", "v"); err != nil {
		t.Fatal(err)
	}
	wch := cli.Watch(ctx, "w", clientv3.WithCreatedNotify())
	if wr := <-wch; !wr.Created {
		t.Fatalf("watch: %+v", wr)
	}
	// (etcd waits up to its request timeout for the proxy's watch stream
	// before each member stops: this takes a few seconds.)
	c.StopAll()
	_, err := cli.Get(ctx, "k", clientv3.WithSerializable())
	if status.Code(err) != codes.Unavailable || !strings.Contains(err.Error(), "no etcd member reachable") {
		t.Fatalf("get with all members down: %v; want Unavailable saying no member is reachable", err)
	}
	code, body := post(t, "http://"+p.Addr().String()+"/v3/kv/range", `{"key":"aw=="}`)
	if code != http.StatusServiceUnavailable || !strings.Contains(body, "no etcd member reachable") {
		t.Fatalf("HTTP range with all members down: %d %s", code, body)
	}
	resp, err := httpClient(t).Get("http://" + p.Addr().String() + "/health")
	if err != nil {
		t.Fatal(err)
	}
	resp.Body.Close()
	if resp.StatusCode != http.StatusServiceUnavailable {
		t.Fatalf("/health with all members down: %d", resp.StatusCode)
	}
	var wg sync.WaitGroup
	for _, m := range c.Members() {
		wg.Go(func() {
			if err := restart(c, m); err != nil {
				t.Error(err)
			}
		})
	}
	wg.Wait()
	eventually(t, "reads through the proxy again", func() bool {
		_, err := cli.Get(ctx, "k")
		return err == nil
	})
	// The watch opened before the outage resumes: it sees a later put.
	if _, err := c.Client(t).Put(ctx, "w", "after"); err != nil {
		t.Fatal(err)
	}
	select {
	case wr := <-wch:
		if wr.Err() != nil || len(wr.Events) != 1 || string(wr.Events[0].Kv.Value) != "after" {
			t.Fatalf("watch after the outage: %+v %v", wr, wr.Err())
		}
	case <-ctx.Done():
		t.Fatal("the watch opened before the outage saw nothing after it")
	}
}

// TestMembershipChangePickedUpAtRefresh adds and removes a member; the
// proxy's endpoints follow at the next refresh.
func TestMembershipChangePickedUpAtRefresh(t *testing.T) {
	t.Parallel()
	c := etcdtest.StartCluster(t, 3)
	p := startProxy(t, Config{InitialCluster: c.InitialCluster(), RefreshInterval: 200 * time.Millisecond})
	// The same with client URLs, refreshed through MemberList.
	q := startProxy(t, Config{Endpoints: c.Endpoints(), RefreshInterval: 200 * time.Millisecond})
	m4 := c.AddMember(t)
	eventually(t, "the new member's endpoint", func() bool { return endpointState(p, m4.ClientURL()) == "available" })
	eventually(t, "the new member's endpoint (MemberList)", func() bool { return endpointState(q, m4.ClientURL()) == "available" })

	ctx := ctxT(t)
	first := follower(t, c) // removing the leader would stall writes for an election
	// Stop it first, as an operator removes a dead member: a removed etcd
	// 3.7 member that is still running panics ("failed to find local ID in
	// cluster members") when asked for its status until it has stopped
	// itself, and this member runs in the test's own process, where the
	// proxy's probes would take the whole test binary down with it.
	first.Stop()
	// Ask another member to remove it.
	var others []string
	for _, m := range c.Members() {
		if m != first && m.Running() {
			others = append(others, m.ClientURL())
		}
	}
	direct, err := clientv3.New(clientv3.Config{Endpoints: others, DialTimeout: 5 * time.Second, Logger: zap.NewNop()})
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { _ = direct.Close() })
	list, err := direct.MemberList(ctx)
	if err != nil {
		t.Fatal(err)
	}
	for _, m := range list.Members {
		if m.Name == first.Name {
			if _, err := direct.MemberRemove(ctx, m.ID); err != nil {
				t.Fatal(err)
			}
		}
	}
	eventually(t, "the removed member's endpoint gone", func() bool { return endpointState(p, first.ClientURL()) == "absent" })
	eventually(t, "the removed member's endpoint gone (MemberList)", func() bool { return endpointState(q, first.ClientURL()) == "absent" })
	cli := proxyClient(t, p)
	if _, err := cli.Put(ctx, "k", "v"); err != nil {
		t.Fatal(err)
	}
}

// TestLoopDetection: an endpoint that is the proxy itself (by another
// name) is never used; two proxies forwarding to each other detect the
// loop from the via metadata instead of forwarding forever.
func TestLoopDetection(t *testing.T) {
	t.Parallel()
	c := etcdtest.StartCluster(t, 3)
	l, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	port := l.Addr().(*net.TCPAddr).Port
	self := "http://localhost:" + itoaT(port)
	var logs syncbuf.Buffer
	p, err := New(Config{Endpoints: append(c.Endpoints(), self), Logger: slog.New(slog.NewTextHandler(&logs, nil))})
	if err != nil {
		t.Fatal(err)
	}
	serveOn(t, p, l)
	if st := endpointState(p, self); st != "self" {
		t.Fatalf("own address %s is %q, want self", self, st)
	}
	if !strings.Contains(logs.String(), "this proxy's own address") {
		t.Errorf("no warning logged about the loop: %s", logs.String())
	}
	cli := proxyClient(t, p)
	ctx := ctxT(t)
	for range 20 {
		if _, err := cli.Put(ctx, "k", "v"); err != nil {
			t.Fatal(err)
		}
	}

	// A -> B -> A: B forwards to the cluster and to A, A to B. A proxy
	// is used only once it answers as etcd, so B starts with A benched
	// (A is not serving yet), A starts through B, and B takes A in once
	// its bench is over and A answers (through B, from the cluster).
	// Requests through A that B sends back to A go round a loop: A
	// refuses them and B excludes A.
	la, _ := net.Listen("tcp", "127.0.0.1:0")
	lb, _ := net.Listen("tcp", "127.0.0.1:0")
	aURL := "http://" + la.Addr().String()
	b, err := New(Config{Endpoints: append(c.Endpoints(), aURL), FailureWait: 100 * time.Millisecond, Logger: testLogger(t)})
	if err != nil {
		t.Fatal(err)
	}
	a, err := New(Config{Endpoints: []string{"http://" + lb.Addr().String()}, Logger: testLogger(t)})
	if err != nil {
		t.Fatal(err)
	}
	serveOn(t, b, lb)
	serveOn(t, a, la)
	eventually(t, "B to take A in once it answers as etcd", func() bool { return endpointState(b, aURL) == "available" })
	acli := proxyClient(t, a)
	for i := 0; endpointState(b, aURL) != "loop"; i++ {
		if i == 500 {
			t.Fatal("no request went round the loop A -> B -> A")
		}
		// A request B sent back to A is refused there as a loop; B may
		// answer it from another endpoint.
		if _, err := acli.Get(ctx, "k"); err != nil && !strings.Contains(err.Error(), "loop") {
			t.Fatalf("request through A: %v", err)
		}
	}
	if n := value(t, a.m.loops) + value(t, b.m.loops); n == 0 {
		t.Error("loops_detected_total is 0")
	}
	for range 20 {
		if _, err := acli.Get(ctx, "k"); err != nil {
			t.Fatalf("request through A once B excluded it: %v", err)
		}
	}
}

func itoaT(i int) string { return strconv.Itoa(i) }

// serveOn serves p on l until the test ends.
func serveOn(t *testing.T, p *Proxy, l net.Listener) {
	t.Helper()
	errc := make(chan error, 1)
	go func() { errc <- p.Serve(t.Context(), l) }()
	t.Cleanup(func() {
		_ = p.Close()
		<-errc
	})
	select {
	case <-p.Ready():
	case err := <-errc:
		errc <- err
		t.Fatalf("Serve: %v", err)
	case <-time.After(testTimeout):
		t.Fatal("proxy not ready")
	}
}

// follower returns a member that is not the leader.
func follower(t *testing.T, c *etcdtest.Cluster) *etcdtest.Member {
	t.Helper()
	direct := c.Client(t)
	ctx := ctxT(t)
	for _, m := range c.Members() {
		s, err := direct.Status(ctx, m.ClientURL())
		if err != nil {
			t.Fatal(err)
		}
		if s.Header.MemberId != s.Leader {
			return m
		}
	}
	t.Fatal("no follower")
	return nil
}

// TestRefreshLeavesOutPortZero: a member listening on a port chosen at
// start that was told no advertise URL advertises port 0. The proxy's
// member list refresh replaced its working endpoint with that URL and was
// left with none ("zero endpoints currently available" 30 s into a long
// bench run); it now leaves such URLs out and keeps what works.
func TestRefreshLeavesOutPortZero(t *testing.T) {
	t.Parallel()
	srv := etcdtest.Start(t, etcdtest.Options{Configure: func(c *embed.Config) {
		c.AdvertiseClientUrls = []url.URL{{Scheme: "http", Host: "127.0.0.1:0"}}
	}})
	p := startProxy(t, Config{Endpoints: srv.Endpoints(), RefreshInterval: 50 * time.Millisecond})
	cli := proxyClient(t, p)
	ctx := ctxT(t)
	eventually(t, "two member list refreshes", func() bool {
		return value(t, p.m.refreshes.WithLabelValues("ok"))+value(t, p.m.refreshes.WithLabelValues("error")) >= 2
	})
	if _, err := cli.Put(ctx, "k", "v"); err != nil {
		t.Fatalf("put through the proxy after refreshes over a port-0 member URL: %v", err)
	}
	if known := p.dir.known(); len(known) != 1 || strings.HasSuffix(known[0], ":0") {
		t.Fatalf("known endpoints %v, want the working one", known)
	}
}
