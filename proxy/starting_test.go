package proxy

import (
	"context"
	"encoding/json"
	"io"
	"log/slog"
	"net"
	"net/http"
	"strconv"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/beaconplane/beacon/internal/syncbuf"
	"github.com/beaconplane/beacon/internal/testkit/etcdtest"
	"github.com/beaconplane/beacon/internal/testkit/testcerts"
	"github.com/beaconplane/beacon/internal/tlsfiles"
	pb "go.etcd.io/etcd/api/v3/etcdserverpb"
	clientv3 "go.etcd.io/etcd/client/v3"
	"go.etcd.io/etcd/server/v3/etcdserver/api/v3election/v3electionpb"
	"google.golang.org/grpc"
	"google.golang.org/grpc/codes"
	"google.golang.org/grpc/connectivity"
	"google.golang.org/grpc/credentials"
	"google.golang.org/grpc/credentials/insecure"
	"google.golang.org/grpc/status"
)

// forwardTCP forwards every connection accepted on l to addr until the
// test ends.
func forwardTCP(t *testing.T, l net.Listener, addr string) {
	t.Helper()
	var wg sync.WaitGroup
	var mu sync.Mutex
	var conns []net.Conn
	t.Cleanup(func() {
		_ = l.Close()
		mu.Lock()
		for _, c := range conns {
			_ = c.Close()
		}
		mu.Unlock()
		wg.Wait()
	})
	wg.Go(func() {
		for {
			c, err := l.Accept()
			if err != nil {
				return
			}
			up, err := net.Dial("tcp", addr)
			if err != nil {
				_ = c.Close()
				continue
			}
			mu.Lock()
			conns = append(conns, c, up)
			mu.Unlock()
			wg.Go(func() { _, _ = io.Copy(up, c); _ = up.Close() })
			wg.Go(func() { _, _ = io.Copy(c, up); _ = c.Close() })
		}
	})
}

// TestAnswersWhileFindingTheCluster: from the moment it is given its
// listener, a proxy that has not found its cluster yet answers: /health
// 503 with the reason (no reachable member yet, and what it tried), every
// gRPC call Unavailable at once with that reason, every gateway request
// 503 JSON; its retries log a WARN once, not one per retry. It serves as
// soon as a member answers. Over plain TCP and TLS.
func TestAnswersWhileFindingTheCluster(t *testing.T) {
	t.Parallel()
	srv := etcdtest.Start(t, etcdtest.Options{})
	for _, useTLS := range []bool{false, true} {
		t.Run("tls="+strconv.FormatBool(useTLS), func(t *testing.T) {
			t.Parallel()
			testAnswersWhileFinding(t, srv, useTLS)
		})
	}
}

func testAnswersWhileFinding(t *testing.T, srv *etcdtest.Server, useTLS bool) {
	port, err := etcdtest.FreePort()
	if err != nil {
		t.Fatal(err)
	}
	gate := "127.0.0.1:" + strconv.Itoa(port) // nothing listens there yet
	logs := &syncbuf.Buffer{}
	cfg := Config{Endpoints: []string{"http://" + gate}, StartTimeout: 2 * testTimeout,
		Logger: slog.New(slog.NewTextHandler(logs, &slog.HandlerOptions{Level: slog.LevelInfo}))}
	scheme, creds := "http", insecure.NewCredentials()
	hc := httpClient(t)
	if useTLS {
		dir := t.TempDir()
		ca, err := testcerts.NewCA(dir, "ca")
		if err != nil {
			t.Fatal(err)
		}
		leaf, err := ca.Issue("proxy", testcerts.LeafOptions{Server: true})
		if err != nil {
			t.Fatal(err)
		}
		r, err := tlsfiles.NewReloader(tlsfiles.Files{CertFile: leaf.Cert, KeyFile: leaf.Key}, tlsfiles.Config{})
		if err != nil {
			t.Fatal(err)
		}
		cfg.ServerTLS = r.ServerConfig("h2", "http/1.1")
		ctls := clientTLS(t, ca.File, nil, "")
		scheme, creds = "https", credentials.NewTLS(ctls)
		hc.Transport = &http.Transport{TLSClientConfig: ctls}
	}
	p, err := New(cfg)
	if err != nil {
		t.Fatal(err)
	}
	l := mustListen(t)
	errc := serveChecked(t, p, l)
	base := scheme + "://" + l.Addr().String()
	ctx := ctxT(t)

	// Until the proxy has tried at least four times (its retries come at
	// 0.1, 0.2, 0.4, 0.8 s...).
	eventually(t, "four attempts to find the cluster", func() bool {
		p.finding.mu.Lock()
		defer p.finding.mu.Unlock()
		return p.finding.attempts >= 4
	})
	select {
	case <-p.Ready():
		t.Fatal("ready without a reachable member")
	default:
	}
	reason := func(what, msg string) {
		t.Helper()
		for _, want := range []string{"proxy: not ready: no reachable etcd member found yet", "attempts", "http://" + gate, "refused"} {
			if !strings.Contains(msg, want) {
				t.Errorf("%s: %q does not say %q", what, msg, want)
			}
		}
	}

	get := func(path string) (int, []byte) {
		t.Helper()
		req, _ := http.NewRequestWithContext(ctx, http.MethodGet, base+path, nil)
		resp, err := hc.Do(req)
		if err != nil {
			t.Fatalf("GET %s: %v", path, err)
		}
		defer resp.Body.Close()
		b, _ := io.ReadAll(resp.Body)
		if ct := resp.Header.Get("Content-Type"); !strings.HasPrefix(ct, "application/json") {
			t.Errorf("GET %s: Content-Type %q", path, ct)
		}
		return resp.StatusCode, b
	}
	code, body := get(PathHealth)
	var h Health
	if err := json.Unmarshal(body, &h); err != nil || code != http.StatusServiceUnavailable || h.Health != "false" {
		t.Fatalf("/health while finding the cluster: %d %s (%v)", code, body, err)
	}
	reason("/health", h.Reason)
	code, body = get(PathEndpoints)
	var eps struct {
		Ready     bool             `json:"ready"`
		Reason    string           `json:"reason"`
		Endpoints []EndpointStatus `json:"endpoints"`
	}
	if err := json.Unmarshal(body, &eps); err != nil || code != http.StatusOK || eps.Ready ||
		len(eps.Endpoints) != 1 || eps.Endpoints[0].State != "failed" || !strings.Contains(eps.Endpoints[0].LastError, "refused") {
		t.Fatalf("/proxy/endpoints while finding the cluster: %d %s (%v)", code, body, err)
	}
	reason("/proxy/endpoints", eps.Reason)

	req, _ := http.NewRequestWithContext(ctx, http.MethodPost, base+"/v3/kv/range", strings.NewReader(`{"key":"YQ=="}`))
	resp, err := hc.Do(req)
	if err != nil {
		t.Fatal(err)
	}
	body, _ = io.ReadAll(resp.Body)
	resp.Body.Close()
	var gwErr struct {
		Code    int    `json:"code"`
		Message string `json:"message"`
	}
	if err := json.Unmarshal(body, &gwErr); err != nil || resp.StatusCode != http.StatusServiceUnavailable || gwErr.Code != int(codes.Unavailable) {
		t.Fatalf("gateway range while finding the cluster: %d %s (%v)", resp.StatusCode, body, err)
	}
	reason("gateway range", gwErr.Message)
	// A streaming call of the gateway: the error comes as the stream's
	// first (and only) message.
	req, _ = http.NewRequestWithContext(ctx, http.MethodPost, base+"/v3/watch", strings.NewReader(`{"create_request":{"key":"YQ=="}}`))
	resp, err = hc.Do(req)
	if err != nil {
		t.Fatal(err)
	}
	body, _ = io.ReadAll(resp.Body)
	resp.Body.Close()
	var gwStreamErr struct {
		Error struct {
			Code    int    `json:"code"`
			Message string `json:"message"`
		} `json:"error"`
	}
	if err := json.Unmarshal(body, &gwStreamErr); err != nil || resp.StatusCode != http.StatusServiceUnavailable || gwStreamErr.Error.Code != int(codes.Unavailable) {
		t.Fatalf("gateway watch while finding the cluster: %d %s (%v)", resp.StatusCode, body, err)
	}
	reason("gateway watch", gwStreamErr.Error.Message)

	conn, err := grpc.NewClient(l.Addr().String(), grpc.WithTransportCredentials(creds))
	if err != nil {
		t.Fatal(err)
	}
	defer conn.Close()
	// Each answer within the deadline, so Unavailable and not
	// DeadlineExceeded: the proxy answers, it does not hang.
	rctx, cancel := context.WithTimeout(ctx, 5*time.Second)
	defer cancel()
	grpcErr := func(what string, err error) {
		t.Helper()
		if status.Code(err) != codes.Unavailable {
			t.Fatalf("%s while finding the cluster: %v, want Unavailable", what, err)
		}
		reason(what, status.Convert(err).Message())
	}
	_, err = pb.NewKVClient(conn).Range(rctx, &pb.RangeRequest{Key: []byte("a")})
	grpcErr("Range", err)
	_, err = pb.NewKVClient(conn).Put(rctx, &pb.PutRequest{Key: []byte("a"), Value: []byte("b")})
	grpcErr("Put", err)
	_, err = pb.NewMaintenanceClient(conn).Status(rctx, &pb.StatusRequest{})
	grpcErr("Status", err)
	ws, err := pb.NewWatchClient(conn).Watch(rctx)
	if err == nil {
		_ = ws.Send(&pb.WatchRequest{RequestUnion: &pb.WatchRequest_CreateRequest{CreateRequest: &pb.WatchCreateRequest{Key: []byte("a")}}})
		_, err = ws.Recv()
	}
	grpcErr("Watch", err)
	ka, err := pb.NewLeaseClient(conn).LeaseKeepAlive(rctx)
	if err == nil {
		_ = ka.Send(&pb.LeaseKeepAliveRequest{ID: 1})
		_, err = ka.Recv()
	}
	grpcErr("LeaseKeepAlive", err)
	// A stream whose client sends nothing is refused too, after at most
	// firstMessageWait.
	ws, err = pb.NewWatchClient(conn).Watch(rctx)
	if err == nil {
		_, err = ws.Recv()
	}
	grpcErr("Watch without a request", err)
	// A stream the proxy forwards without handling it itself.
	obs, err := v3electionpb.NewElectionClient(conn).Observe(rctx, &v3electionpb.LeaderRequest{Name: []byte("e")})
	if err == nil {
		_, err = obs.Recv()
	}
	grpcErr("Observe", err)

	// Retries are logged at a bounded rate: the first WARN, then a
	// summary every failLogEvery.
	warns := strings.Count(logs.String(), "level=WARN msg=\"cluster not reachable yet")
	p.finding.mu.Lock()
	attempts, since := p.finding.attempts, p.finding.since
	p.finding.mu.Unlock()
	if most := 1 + int(time.Since(since)/failLogEvery); warns < 1 || warns > most {
		t.Errorf("%d WARN lines for %d attempts in %v, want 1 to %d:\n%s", warns, attempts, time.Since(since), most, logs.String())
	}

	// A member answers: the proxy serves.
	gl, err := net.Listen("tcp", gate)
	if err != nil {
		t.Fatal(err)
	}
	forwardTCP(t, gl, strings.TrimPrefix(srv.Endpoint(), "http://"))
	select {
	case <-p.Ready():
	case err := <-errc:
		t.Fatalf("Serve: %v", err)
	case <-ctx.Done():
		t.Fatal("not ready once a member answers")
	}
	if code, body := get(PathHealth); code != http.StatusOK {
		t.Fatalf("/health once ready: %d %s", code, body)
	}
	if _, err := pb.NewKVClient(conn).Range(ctx, &pb.RangeRequest{Key: []byte("a")}); err != nil {
		t.Fatalf("Range once ready: %v", err)
	}
	if out := logs.String(); !strings.Contains(out, `msg="cluster reachable"`) || !strings.Contains(out, "failures=") {
		t.Errorf("no line saying the cluster is reachable after the failures:\n%s", logs.String())
	}
}

// waitUpstreamReady waits, on gRPC's connectivity state changes, until
// every connection the proxy forwards over is ready.
func waitUpstreamReady(ctx context.Context, t *testing.T, p *Proxy) {
	t.Helper()
	for i, c := range p.conns {
		for st := c.GetState(); st != connectivity.Ready; st = c.GetState() {
			c.Connect()
			if !c.WaitForStateChange(ctx, st) {
				t.Fatalf("upstream connection %d still %v: %v", i, st, ctx.Err())
			}
		}
	}
}

// TestLostClusterIsReported: when the only member goes down after start,
// the first request that fails to connect makes the proxy check its
// endpoints at once: /proxy/endpoints reports the member failed, with the
// reason, as /health does, instead of "available" until the next refresh
// (a minute here); when it is back, the proxy serves again, and a watch
// opened before rides out the restart (within the silence bound, long
// here) without a lost event.
func TestLostClusterIsReported(t *testing.T) {
	t.Parallel()
	srv := etcdtest.Start(t, etcdtest.Options{})
	p := startProxy(t, Config{Endpoints: srv.Endpoints(), RefreshInterval: time.Minute, FailureWait: 500 * time.Millisecond,
		WatchSilenceTimeout: 2 * testTimeout})
	conn := grpcConn(t, p)
	kv := pb.NewKVClient(conn)
	ctx := ctxT(t)
	if _, err := kv.Range(ctx, &pb.RangeRequest{Key: []byte("a")}); err != nil {
		t.Fatal(err)
	}
	wch := proxyClient(t, p).Watch(ctx, "w", clientv3.WithCreatedNotify())
	if wr := <-wch; !wr.Created {
		t.Fatalf("watch: %+v", wr)
	}
	srv.Stop()
	_, err := kv.Range(ctx, &pb.RangeRequest{Key: []byte("a")})
	if status.Code(err) != codes.Unavailable {
		t.Fatalf("Range with the member down: %v, want Unavailable", err)
	}
	eventually(t, "the member reported failed", func() bool {
		eps := p.Endpoints()
		return len(eps) == 1 && eps[0].State == "failed" && eps[0].LastError != ""
	})
	if err := p.CheckHealth(ctx); status.Code(err) != codes.Unavailable || !strings.Contains(status.Convert(err).Message(), srv.Endpoint()) {
		t.Fatalf("health with the member down: %v", err)
	}
	if err := srv.Restart(); err != nil {
		t.Fatal(err)
	}
	eventually(t, "the proxy to serve again", func() bool { return p.CheckHealth(ctx) == nil })
	// The health check went through one upstream connection; a Range may
	// take another, still waiting out its reconnection backoff (it was
	// answered Unavailable on a busy machine): wait for that event, every
	// upstream connection ready again, rather than assume it.
	waitUpstreamReady(ctx, t, p)
	if _, err := kv.Range(ctx, &pb.RangeRequest{Key: []byte("a")}); err != nil {
		t.Fatalf("Range once the member is back and every upstream connection is ready: %v", err)
	}
	if _, err := srv.Client(t).Put(ctx, "w", "after"); err != nil {
		t.Fatal(err)
	}
	select {
	case wr, ok := <-wch:
		if !ok || wr.Err() != nil || len(wr.Events) != 1 || string(wr.Events[0].Kv.Value) != "after" {
			t.Fatalf("watch after the restart: %+v %v (open %v)", wr, wr.Err(), ok)
		}
	case <-ctx.Done():
		t.Fatal("the watch opened before the restart saw nothing after it")
	}
}
