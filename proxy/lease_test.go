package proxy

import (
	"errors"
	"fmt"
	"io"
	"net/url"
	"slices"
	"strings"
	"testing"
	"time"

	"github.com/beaconplane/beacon/internal/lab/etcdproc"
	"github.com/beaconplane/beacon/internal/testkit/etcdtest"
	pb "go.etcd.io/etcd/api/v3/etcdserverpb"
	clientv3 "go.etcd.io/etcd/client/v3"
	"google.golang.org/grpc"
	"google.golang.org/grpc/codes"
	"google.golang.org/grpc/credentials/insecure"
	"google.golang.org/grpc/status"
)

// TestLeaseKeepAliveMultiplexed: keep-alive streams of several clients
// share one upstream stream, and leases kept alive through the proxy
// outlive their TTL.
func TestLeaseKeepAliveMultiplexed(t *testing.T) {
	t.Parallel()
	c := etcdtest.StartCluster(t, 3)
	p := startProxy(t, Config{PeerURLs: c.PeerURLs()})
	ctx := ctxT(t)
	const n = 5
	// etcd's client renews at a third of the TTL: with 5 s, a renewal
	// may take over 3 s end to end (proxy, follower, leader) before a
	// lease expires, which holds under -race on two busy cores; 2 s did
	// not always.
	const leaseTTL = 5
	var ids []clientv3.LeaseID
	var kas []<-chan *clientv3.LeaseKeepAliveResponse
	for range n {
		cli := proxyClient(t, p)
		g, err := cli.Grant(ctx, leaseTTL)
		if err != nil {
			t.Fatal(err)
		}
		if _, err := cli.Put(ctx, fmt.Sprintf("/lease/%x", g.ID), "x", clientv3.WithLease(g.ID)); err != nil {
			t.Fatal(err)
		}
		ka, err := cli.KeepAlive(ctx, g.ID)
		if err != nil {
			t.Fatal(err)
		}
		ids = append(ids, g.ID)
		kas = append(kas, ka)
	}
	for _, ka := range kas {
		if r := <-ka; r == nil || r.TTL <= 0 {
			t.Fatalf("keep-alive response %+v", r)
		}
	}
	if v := value(t, p.m.kaClientStreams); v != n {
		t.Errorf("keepalive_client_streams = %v, want %d", v, n)
	}
	if v := value(t, p.m.kaUpstreams); v != 1 {
		t.Errorf("keepalive_upstream_streams = %v, want 1", v)
	}
	// Past two TTLs the keys are still there.
	deadline := time.After(2*leaseTTL*time.Second + time.Second)
	for done := false; !done; {
		select {
		case <-deadline:
			done = true
		case r := <-kas[0]:
			if r == nil {
				t.Fatal("keep-alive channel closed")
			}
		}
	}
	direct := c.Client(t)
	resp, err := direct.Get(ctx, "/lease/", clientv3.WithPrefix(), clientv3.WithCountOnly())
	if err != nil || resp.Count != n {
		t.Fatalf("leased keys after 2 TTLs: %v %v", resp, err)
	}
	cli := proxyClient(t, p)
	if _, err := cli.Revoke(ctx, ids[0]); err != nil {
		t.Fatal(err)
	}
	ttl, err := direct.TimeToLive(ctx, ids[0])
	if err != nil || ttl.TTL != -1 {
		t.Fatalf("revoked lease TTL: %v %v", ttl, err)
	}
}

// keepAliveMember is the address of the member the upstream keep-alive
// stream runs on ("" if none is open).
func (p *Proxy) keepAliveMember() string {
	p.lease.mu.Lock()
	defer p.lease.mu.Unlock()
	for _, up := range p.lease.ups {
		up.mu.Lock()
		defer up.mu.Unlock()
		return up.member
	}
	return ""
}

// TestKeepAliveLeavesAHungMember stops (SIGSTOP) the etcd member that the
// proxy's shared upstream keep-alive stream runs on, for twice the leases'
// TTL, while the other two keep the cluster going. A stopped member keeps
// its connection open and answers nothing, so every lease kept alive
// through the proxy used to expire (the stream stayed on it until gRPC's
// keep-alive gave up, 15 s). Now the first unanswered keep-alive moves the
// stream to another member: no client's keep-alive channel closes (etcd's
// client closes it when no answer came within the TTL), every lease is
// alive after the pause, and the silence is counted.
func TestKeepAliveLeavesAHungMember(t *testing.T) {
	t.Parallel()
	if testing.Short() {
		t.Skip("runs a 3-member cluster of etcd processes")
	}
	c := etcdtest.StartProcessCluster(t, 3, etcdtest.ProcessClusterOptions{})
	p := startProxy(t, Config{Endpoints: c.Endpoints()})
	ctx := ctxT(t)
	const n, ttl = 5, 3
	var ids []clientv3.LeaseID
	var kas []<-chan *clientv3.LeaseKeepAliveResponse
	for range n {
		cli := proxyClient(t, p)
		g, err := cli.Grant(ctx, ttl)
		if err != nil {
			t.Fatal(err)
		}
		ka, err := cli.KeepAlive(ctx, g.ID)
		if err != nil {
			t.Fatal(err)
		}
		if r := <-ka; r == nil {
			t.Fatal("keep-alive channel closed at once")
		}
		ids, kas = append(ids, g.ID), append(kas, ka)
	}
	member := p.keepAliveMember()
	var hung *etcdproc.Member
	var others []string
	for _, m := range c.Members() {
		if strings.TrimPrefix(m.ClientURL, "http://") == member {
			hung = m
		} else {
			others = append(others, m.ClientURL)
		}
	}
	if hung == nil {
		t.Fatalf("the keep-alive stream runs on %q, not a member of %v", member, c.Endpoints())
	}
	if err := hung.Pause(); err != nil {
		t.Fatal(err)
	}
	defer func() { _ = hung.Resume() }()
	// Two TTLs of keep-alives: every channel must stay open.
	until := time.After(2 * ttl * time.Second)
	for done := false; !done; {
		select {
		case <-until:
			done = true
		case <-ctx.Done():
			t.Fatal(ctx.Err())
		default:
		}
		for i, ka := range kas {
			select {
			case r, ok := <-ka:
				if !ok || r == nil {
					t.Fatalf("lease %d: the client gave up its keep-alive (no answer within the TTL) while %s hung on %s", i, member, hung.Name)
				}
			case <-time.After(10 * time.Millisecond):
			}
		}
	}
	direct := directClient(t, others...)
	for i, id := range ids {
		resp, err := direct.TimeToLive(ctx, id)
		if err != nil || resp.TTL <= 0 {
			t.Fatalf("lease %d after the pause: %+v %v", i, resp, err)
		}
	}
	if v := value(t, p.m.kaSilences); v < 1 {
		t.Errorf("upstream_keepalive_silences_total = %v, want at least 1", v)
	}
	if now := p.keepAliveMember(); now == member {
		t.Errorf("the keep-alive stream is still on the hung member %s", member)
	}
}

// TestSlowKeepAliveStream: a client keep-alive stream that sends requests
// but reads no answer is ended with ResourceExhausted once more than
// kaQueue answers wait for it — freed at once, not when the client next
// reads — and counted; the lease's other streams are not held up.
func TestSlowKeepAliveStream(t *testing.T) {
	t.Parallel()
	c := etcdtest.StartCluster(t, 1)
	p := startProxy(t, Config{Endpoints: c.Endpoints()})
	ctx := ctxT(t)
	// Requests go round many leases, so that answers come a few at a time
	// (requests for one lease in flight together are answered together):
	// the client's windows fill first, and then the answers wait.
	var leases []clientv3.LeaseID
	for range 64 {
		g, err := c.Client(t).Grant(ctx, 60)
		if err != nil {
			t.Fatal(err)
		}
		leases = append(leases, g.ID)
	}
	slow, err := pb.NewLeaseClient(grpcConn(t, p, fixedWindows...)).LeaseKeepAlive(ctx)
	if err != nil {
		t.Fatal(err)
	}
	// Answers of about 40 bytes: the windows take a few thousand, then
	// kaQueue more wait. The requests are paced (10 a millisecond, far
	// below what the proxy sends) so that answers wait only once the
	// client's windows are full and the proxy's sender is blocked on them.
	const most = 200_000
	pace := time.NewTicker(time.Millisecond)
	defer pace.Stop()
	for n := 0; value(t, p.m.kaDropped) == 0; n++ {
		if n == most {
			t.Fatalf("%d keep-alives unread and the stream is still served", n)
		}
		if n%10 == 0 {
			<-pace.C
		}
		if err := slow.Send(&pb.LeaseKeepAliveRequest{ID: int64(leases[n%len(leases)])}); err != nil {
			break // the proxy ended the stream
		}
	}
	eventually(t, "the slow keep-alive stream freed while its client reads nothing", func() bool {
		return value(t, p.m.kaClientStreams) == 0
	})
	ka, err := proxyClient(t, p).KeepAliveOnce(ctx, leases[0])
	if err != nil || ka.TTL <= 0 {
		t.Fatalf("another stream's keep-alive of the lease: %+v, %v", ka, err)
	}
	for {
		if _, err := slow.Recv(); err != nil {
			if status.Code(err) != codes.ResourceExhausted {
				t.Fatalf("slow stream ended with %v, want ResourceExhausted", err)
			}
			break
		}
	}
	if v := value(t, p.m.kaDropped); v != 1 {
		t.Errorf("keepalive_slow_streams_total = %v, want 1", v)
	}
}

// TestKeepAliveBurstForOneLease: a client that sends many keep-alives for
// one lease at once, and reads, gets an answer to each; requests in flight
// together are answered together upstream, and their answers wait as one,
// so the burst is not taken for a slow client.
func TestKeepAliveBurstForOneLease(t *testing.T) {
	t.Parallel()
	c := etcdtest.StartCluster(t, 1)
	p := startProxy(t, Config{Endpoints: c.Endpoints()})
	ctx := ctxT(t)
	g, err := c.Client(t).Grant(ctx, 60)
	if err != nil {
		t.Fatal(err)
	}
	ka, err := pb.NewLeaseClient(grpcConn(t, p)).LeaseKeepAlive(ctx)
	if err != nil {
		t.Fatal(err)
	}
	const n = 4 * kaQueue
	answers := make(chan error, 1)
	go func() {
		for range n {
			r, err := ka.Recv()
			if err == nil && r.TTL <= 0 {
				err = fmt.Errorf("answer %+v", r)
			}
			if err != nil {
				answers <- err
				return
			}
		}
		answers <- nil
	}()
	for range n {
		if err := ka.Send(&pb.LeaseKeepAliveRequest{ID: int64(g.ID)}); err != nil {
			t.Fatal(err)
		}
	}
	if err := <-answers; err != nil {
		t.Fatalf("a burst of %d keep-alives for one lease: %v", n, err)
	}
	if v := value(t, p.m.kaDropped); v != 0 {
		t.Errorf("keepalive_slow_streams_total = %v, want 0", v)
	}
}

// TestKeepAliveAnsweredAfterTheClientClosesItsSide: a client that sends
// its keep-alives and closes its side of the stream (the JSON gateway does
// after the request body: `curl -d '{"ID":…}' …/v3/lease/keepalive`) gets
// an answer to each, then the end of the stream, as from etcd, which
// answers each request before it reads the next. The proxy ended such a
// stream at once, with no answer.
func TestKeepAliveAnsweredAfterTheClientClosesItsSide(t *testing.T) {
	t.Parallel()
	srv := etcdtest.Start(t, etcdtest.Options{})
	p := startProxy(t, Config{Endpoints: srv.Endpoints()})
	ctx := ctxT(t)
	g, err := srv.Client(t).Grant(ctx, 60)
	if err != nil {
		t.Fatal(err)
	}
	member, err := url.Parse(srv.Endpoint())
	if err != nil {
		t.Fatal(err)
	}
	// Three keep-alives of one lease (answered together upstream) and one
	// of a lease that does not exist (TTL 0).
	ids := []int64{int64(g.ID), int64(g.ID), 1, int64(g.ID)}
	answers := func(target string) []string {
		conn, err := grpc.NewClient(target, grpc.WithTransportCredentials(insecure.NewCredentials()))
		if err != nil {
			t.Fatal(err)
		}
		defer conn.Close()
		ka, err := pb.NewLeaseClient(conn).LeaseKeepAlive(ctx)
		if err != nil {
			t.Fatal(err)
		}
		for _, id := range ids {
			if err := ka.Send(&pb.LeaseKeepAliveRequest{ID: id}); err != nil {
				t.Fatal(err)
			}
		}
		if err := ka.CloseSend(); err != nil {
			t.Fatal(err)
		}
		var got []string
		for {
			r, err := ka.Recv()
			if errors.Is(err, io.EOF) {
				slices.Sort(got)
				return got
			}
			if err != nil {
				t.Fatalf("%s: after %d answers: %v", target, len(got), err)
			}
			got = append(got, fmt.Sprintf("lease %x ttl>0=%v", r.ID, r.TTL > 0))
		}
	}
	want := answers(member.Host)
	if len(want) != len(ids) {
		t.Fatalf("etcd answered %q, want %d answers", want, len(ids))
	}
	if got := answers(p.Addr().String()); !slices.Equal(got, want) {
		t.Fatalf("through the proxy: %q, want what etcd answers: %q", got, want)
	}
}
