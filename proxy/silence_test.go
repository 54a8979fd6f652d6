package proxy

import (
	"context"
	"fmt"
	"net/http"
	"os/exec"
	"strconv"
	"strings"
	"syscall"
	"testing"
	"time"

	"github.com/beaconplane/beacon/internal/syncbuf"
	"github.com/beaconplane/beacon/internal/testkit/etcdtest"
	"github.com/beaconplane/beacon/internal/testkit/testpeer"
	pb "go.etcd.io/etcd/api/v3/etcdserverpb"
	clientv3 "go.etcd.io/etcd/client/v3"
	"go.uber.org/zap"
)

// etcdProc is an etcd 3.7 member running as its own process (the
// internal/lab/etcd binary), so that a test can pause it with SIGSTOP: it
// then accepts TCP connections and answers nothing, like a hung member.
type etcdProc struct {
	name, clientURL, peerURL string
	cmd                      *exec.Cmd
	out                      *syncbuf.Buffer
	exited                   chan struct{}
}

// startEtcdProcesses starts an n-member etcd cluster of processes and
// waits until every member reports a leader. They are killed when the
// test ends (paused ones too).
func startEtcdProcesses(t *testing.T, n int) []*etcdProc {
	t.Helper()
	bin := testpeer.GoBuild(t, "github.com/beaconplane/beacon/internal/lab/etcd")
	procs := make([]*etcdProc, n)
	var initial []string
	for i := range procs {
		cp, err1 := etcdtest.FreePort()
		pp, err2 := etcdtest.FreePort()
		if err1 != nil || err2 != nil {
			t.Fatalf("free ports: %v %v", err1, err2)
		}
		procs[i] = &etcdProc{name: fmt.Sprintf("p%d", i+1), clientURL: "http://127.0.0.1:" + strconv.Itoa(cp),
			peerURL: "http://127.0.0.1:" + strconv.Itoa(pp), out: &syncbuf.Buffer{}, exited: make(chan struct{})}
		initial = append(initial, procs[i].name+"="+procs[i].peerURL)
	}
	for _, p := range procs {
		p.cmd = testpeer.Command(bin, "--name", p.name, "--data-dir", t.TempDir(),
			"--listen-client-urls", p.clientURL, "--advertise-client-urls", p.clientURL,
			"--listen-peer-urls", p.peerURL, "--initial-advertise-peer-urls", p.peerURL,
			"--initial-cluster", strings.Join(initial, ","), "--initial-cluster-token", "silence-test",
			"--unsafe-no-fsync", "--log-level", "warn")
		p.cmd.Stdout, p.cmd.Stderr = p.out, p.out
		if err := p.cmd.Start(); err != nil {
			t.Fatalf("start etcd: %v", err)
		}
		go func() { _ = p.cmd.Wait(); close(p.exited) }()
		t.Cleanup(func() {
			_ = p.cmd.Process.Kill() // SIGKILL ends a stopped process too
			<-p.exited
			if t.Failed() {
				t.Logf("etcd %s output:\n%s", p.name, p.out.String())
			}
		})
	}
	client := &http.Client{Timeout: time.Second}
	for _, p := range procs {
		// An external process offers no event to wait on: poll /health.
		eventually(t, "etcd "+p.name+" healthy", func() bool {
			select {
			case <-p.exited:
				t.Fatalf("etcd %s exited:\n%s", p.name, p.out.String())
			default:
			}
			resp, err := client.Get(p.clientURL + "/health")
			if err != nil {
				return false
			}
			defer resp.Body.Close()
			return resp.StatusCode == http.StatusOK
		})
	}
	return procs
}

func (p *etcdProc) signal(t *testing.T, sig syscall.Signal) {
	t.Helper()
	if err := p.cmd.Process.Signal(sig); err != nil {
		t.Fatalf("signal %v to etcd %s: %v", sig, p.name, err)
	}
}

func directClient(t *testing.T, eps ...string) *clientv3.Client {
	t.Helper()
	cli, err := clientv3.New(clientv3.Config{Endpoints: eps, DialTimeout: 5 * time.Second, Logger: zap.NewNop()})
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { _ = cli.Close() })
	return cli
}

// watchMember is the member the proxy's upstream watches run on.
func (p *Proxy) watchMember() string {
	h := p.watchHub()
	h.mu.Lock()
	defer h.mu.Unlock()
	return h.member
}

// TestWatchesLeaveAHungMember pauses (SIGSTOP) the etcd member the
// proxy's upstream watches run on, while the other two keep the cluster
// going: the proxy notices the silence within its bound, moves the
// watches to another member, and every client watcher gets every event,
// in order, exactly once, including those written while the member hung.
func TestWatchesLeaveAHungMember(t *testing.T) {
	t.Parallel()
	if testing.Short() {
		t.Skip("builds and runs etcd processes")
	}
	procs := startEtcdProcesses(t, 3)
	var eps []string
	for _, p := range procs {
		eps = append(eps, p.clientURL)
	}
	const silence = 2 * time.Second
	p := startProxy(t, Config{Endpoints: eps, WatchSilenceTimeout: silence})
	ctx := ctxT(t)
	cli := proxyClient(t, p)
	const watchers = 20
	var chans []clientv3.WatchChan
	for range watchers {
		wch := cli.Watch(ctx, "/hung/", clientv3.WithPrefix(), clientv3.WithCreatedNotify())
		if wr := <-wch; !wr.Created {
			t.Fatalf("not created: %+v", wr)
		}
		chans = append(chans, wch)
	}
	member := p.watchMember()
	var hung *etcdProc
	var others []string
	for _, pr := range procs {
		if pr.clientURL == member {
			hung = pr
		} else {
			others = append(others, pr.clientURL)
		}
	}
	if hung == nil {
		t.Fatalf("watch member %q is none of %v", member, eps)
	}
	writer := directClient(t, others...)
	// When the hung member is the leader, writes time out until the other
	// two elect a new one: retry as a client would, and take a write the
	// cluster applied although its answer was lost as done (each value is
	// unique), so that every value is written exactly once.
	put := func(v string) {
		t.Helper()
		for {
			pctx, cancel := context.WithTimeout(ctx, 2*time.Second)
			_, err := writer.Put(pctx, "/hung/k", v)
			cancel()
			if err == nil {
				return
			}
			if ctx.Err() != nil {
				t.Fatalf("put %q: %v", v, err)
			}
			gctx, cancel := context.WithTimeout(ctx, 2*time.Second)
			resp, gerr := writer.Get(gctx, "/hung/k")
			cancel()
			if gerr == nil && len(resp.Kvs) == 1 && string(resp.Kvs[0].Value) == v {
				return
			}
		}
	}
	put("before")
	hung.signal(t, syscall.SIGSTOP)
	t.Cleanup(func() { _ = hung.cmd.Process.Signal(syscall.SIGCONT) })
	stopped := time.Now()
	for i := range 5 {
		put(fmt.Sprint("during-", i))
	}
	want := []string{"before", "during-0", "during-1", "during-2", "during-3", "during-4"}
	var last time.Duration
	for n, wch := range chans {
		var got []string
		for len(got) < len(want) {
			select {
			case wr := <-wch:
				if err := wr.Err(); err != nil {
					t.Fatalf("watcher %d: %v", n, err)
				}
				for _, ev := range wr.Events {
					got = append(got, string(ev.Kv.Value))
				}
			case <-ctx.Done():
				t.Fatalf("watcher %d got %v of %v; silences %v, moves %v", n, got, want, value(t, p.m.watchSilences), value(t, p.m.watchMoves))
			}
		}
		if fmt.Sprint(got) != fmt.Sprint(want) {
			t.Fatalf("watcher %d got %v, want %v", n, got, want)
		}
		last = time.Since(stopped)
	}
	if value(t, p.m.watchSilences) < 1 || value(t, p.m.watchMoves) < 1 {
		t.Errorf("silences %v, moves %v; want at least 1 each", value(t, p.m.watchSilences), value(t, p.m.watchMoves))
	}
	if m := p.watchMember(); m == member {
		t.Errorf("watches still on the hung member %s", m)
	}
	// The bound is the silence timeout plus the check's tick; the rest is
	// scheduling slack on a loaded machine.
	t.Logf("every watcher had the events written while the member hung %v after SIGSTOP (silence bound %v)", last.Round(time.Millisecond), silence)
	if last > silence+10*time.Second {
		t.Errorf("events reached the watchers %v after the member hung; bound %v", last, silence)
	}
	// No duplicate later: a new event arrives alone.
	put("after")
	for n, wch := range chans {
		wr := <-wch
		if len(wr.Events) != 1 || string(wr.Events[0].Kv.Value) != "after" {
			t.Fatalf("watcher %d after the move: %+v", n, wr.Events)
		}
	}
}

// TestWatchesCancelledWhenTheOnlyMemberHangs: with a single member, which
// hangs, there is nowhere to move the watches: within the bound the client
// watchers are cancelled with a reason (a raw gRPC client reads it; an
// etcd client's watch channel closes) instead of staying silently stale.
func TestWatchesCancelledWhenTheOnlyMemberHangs(t *testing.T) {
	t.Parallel()
	if testing.Short() {
		t.Skip("builds and runs an etcd process")
	}
	procs := startEtcdProcesses(t, 1)
	const silence = 2 * time.Second
	p := startProxy(t, Config{Endpoints: []string{procs[0].clientURL}, WatchSilenceTimeout: silence})
	ctx := ctxT(t)
	wch := proxyClient(t, p).Watch(ctx, "/only", clientv3.WithCreatedNotify())
	if wr := <-wch; !wr.Created {
		t.Fatalf("not created: %+v", wr)
	}
	raw, err := pb.NewWatchClient(grpcConn(t, p)).Watch(ctx)
	if err != nil {
		t.Fatal(err)
	}
	if err := raw.Send(&pb.WatchRequest{RequestUnion: &pb.WatchRequest_CreateRequest{CreateRequest: &pb.WatchCreateRequest{Key: []byte("/only")}}}); err != nil {
		t.Fatal(err)
	}
	if r, err := raw.Recv(); err != nil || !r.Created {
		t.Fatalf("created: %v %v", r, err)
	}
	procs[0].signal(t, syscall.SIGSTOP)
	t.Cleanup(func() { _ = procs[0].cmd.Process.Signal(syscall.SIGCONT) })
	stopped := time.Now()
	r, err := raw.Recv()
	if err != nil || !r.Canceled || !strings.Contains(r.CancelReason, "no other etcd member") {
		t.Fatalf("want a cancel naming the silence, got %v (err %v)", r, err)
	}
	t.Logf("cancelled %v after SIGSTOP: %s", time.Since(stopped).Round(time.Millisecond), r.CancelReason)
	select {
	case wr, ok := <-wch:
		if ok {
			t.Fatalf("etcd client's watch: want its channel closed, got %+v", wr)
		}
	case <-ctx.Done():
		t.Fatal("the etcd client's watcher was left silent")
	}
}

// TestWatchFromNextRevisionOnQuietCluster: a client's watch from the
// revision after its listing (the list-then-watch of every informer and
// cache), on a cluster nobody writes to, stays open through the proxy, and
// so does a watch of the same stream from the current revision. etcd
// answers no progress request on a stream while its revision is below one
// of the stream's watches' start, so the proxy took the member for silent
// after WatchSilenceTimeout and, with nowhere to move the watches,
// cancelled them all ("no other etcd member is available").
func TestWatchFromNextRevisionOnQuietCluster(t *testing.T) {
	t.Parallel()
	srv := etcdtest.Start(t, etcdtest.Options{}) // nobody else writes here
	const silence = time.Second
	p := startProxy(t, Config{Endpoints: srv.Endpoints(), WatchSilenceTimeout: silence})
	ctx := ctxT(t)
	cli := proxyClient(t, p)
	g, err := cli.Get(ctx, "/quiet/", clientv3.WithPrefix())
	if err != nil {
		t.Fatal(err)
	}
	ahead := cli.Watch(ctx, "/quiet/", clientv3.WithPrefix(), clientv3.WithRev(g.Header.Revision+1), clientv3.WithCreatedNotify())
	now := cli.Watch(ctx, "/other/", clientv3.WithPrefix(), clientv3.WithCreatedNotify())
	for _, wch := range []clientv3.WatchChan{ahead, now} {
		if wr := <-wch; !wr.Created {
			t.Fatalf("not created: %+v", wr)
		}
	}
	quiet := time.NewTimer(4 * silence)
	defer quiet.Stop()
	select {
	case wr, ok := <-ahead:
		t.Fatalf("watch from revision %d (cluster at %d) before any write: %+v (open %v); silences %v", g.Header.Revision+1, g.Header.Revision, wr, ok, value(t, p.m.watchSilences))
	case wr, ok := <-now:
		t.Fatalf("watch from the current revision before any write: %+v (open %v); silences %v", wr, ok, value(t, p.m.watchSilences))
	case <-quiet.C:
	}
	if n := value(t, p.m.watchSilences); n != 0 {
		t.Fatalf("%v silences on a quiet cluster", n)
	}
	if _, err := cli.Put(ctx, "/quiet/k", "v"); err != nil {
		t.Fatal(err)
	}
	select {
	case wr := <-ahead:
		if wr.Err() != nil || len(wr.Events) != 1 || string(wr.Events[0].Kv.Key) != "/quiet/k" {
			t.Fatalf("after the write: %+v", wr)
		}
	case <-ctx.Done():
		t.Fatal("the write was not delivered")
	}
}
