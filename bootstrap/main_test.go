package bootstrap_test

import (
	"context"
	"fmt"
	"os"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/beaconplane/beacon/bootstrap"
	"github.com/beaconplane/beacon/internal/testkit/etcdtest"
	clientv3 "go.etcd.io/etcd/client/v3"
	"go.uber.org/goleak"
	"go.uber.org/zap"
)

// One real etcd serves the registries of every test that does not need its
// own (tokens are unique per test), which keeps the suite fast.
var (
	sharedOnce sync.Once
	shared     *etcdtest.Server
	sharedErr  error
	tokenSeq   atomic.Int64
)

func TestMain(m *testing.M) {
	code := m.Run()
	if shared != nil {
		shared.Close()
	}
	if code == 0 {
		if err := goleak.Find(leakOptions()...); err != nil {
			fmt.Fprintln(os.Stderr, "goleak:", err)
			code = 1
		}
	}
	os.Exit(code)
}

// leakOptions ignores the process-wide goroutines the etcd server and
// client libraries start once and never stop, and the peer connections
// between embedded etcd members, which outlive their Close (etcd never
// closes the idle connections of its peer transport).
func leakOptions() []goleak.Option {
	return []goleak.Option{
		goleak.IgnoreTopFunction("go.opencensus.io/stats/view.(*worker).start"),
		goleak.IgnoreAnyFunction("go.etcd.io/etcd/pkg/v3/schedule.(*fifo).run"),
		goleak.IgnoreAnyFunction("github.com/golang/glog.(*fileSink).flushDaemon"),
		goleak.IgnoreAnyFunction("google.golang.org/grpc/internal/grpcsync.(*CallbackSerializer).run"),
		goleak.IgnoreAnyFunction("go.etcd.io/etcd/client/pkg/v3/logutil.(*MergeLogger).outputLoop"),
		goleak.IgnoreAnyFunction("net/http.(*connReader).backgroundRead"),
		goleak.IgnoreAnyFunction("net/http.(*persistConn).readLoop"),
		goleak.IgnoreAnyFunction("net/http.(*persistConn).writeLoop"),
		goleak.IgnoreAnyFunction("net/http.(*connReader).abortPendingRead"),
	}
}

// registryServer returns the shared discovery registry (a real embedded
// etcd 3.7).
func registryServer(t testing.TB) *etcdtest.Server {
	t.Helper()
	sharedOnce.Do(func() { shared, sharedErr = etcdtest.New(etcdtest.Options{Name: "registry"}) })
	if sharedErr != nil {
		t.Fatalf("start registry etcd: %v", sharedErr)
	}
	return shared
}

func newToken(t testing.TB) string {
	return fmt.Sprintf("test-%d-%d", os.Getpid(), tokenSeq.Add(1))
}

// client returns an etcd client of the registry, closed with the test.
func client(t testing.TB, s *etcdtest.Server) *clientv3.Client {
	t.Helper()
	cfg := s.ClientConfig()
	cfg.Logger = zap.NewNop()
	cli, err := clientv3.New(cfg)
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { _ = cli.Close() })
	return cli
}

// createToken makes a token of the given size on the shared registry.
func createToken(t testing.TB, size int) (string, *clientv3.Client) {
	t.Helper()
	cli := client(t, registryServer(t))
	tok := newToken(t)
	if _, err := bootstrap.CreateToken(testCtx(t, 10*time.Second), cli, tok, size); err != nil {
		t.Fatal(err)
	}
	return tok, cli
}

func config(s *etcdtest.Server, token string) bootstrap.Config {
	return bootstrap.Config{
		Token:           token,
		Endpoints:       s.Endpoints(),
		RetryBackoff:    50 * time.Millisecond,
		MaxRetryBackoff: 200 * time.Millisecond,
	}
}

// testCtx is a context with a deadline, cancelled with the test.
func testCtx(t testing.TB, d time.Duration) context.Context {
	ctx, cancel := context.WithTimeout(context.Background(), d)
	t.Cleanup(cancel)
	return ctx
}

func peerURL(i int) string { return fmt.Sprintf("http://127.0.0.1:%d", 12380+i) }

// joinResult is what a background Join returned.
type joinResult struct {
	cluster bootstrap.Cluster
	err     error
}

// joinAsync runs Join in a goroutine owned by the test.
func joinAsync(t *testing.T, ctx context.Context, cfg bootstrap.Config, name, url string, opts ...bootstrap.Option) <-chan joinResult {
	t.Helper()
	ch := make(chan joinResult, 1)
	var wg sync.WaitGroup
	wg.Add(1)
	go func() {
		defer wg.Done()
		c, err := bootstrap.Join(ctx, cfg, name, []string{url}, opts...)
		ch <- joinResult{c, err}
	}()
	t.Cleanup(wg.Wait)
	return ch
}

func await[T any](t *testing.T, ch <-chan T, what string) T {
	t.Helper()
	select {
	case v := <-ch:
		return v
	case <-time.After(20 * time.Second):
		t.Fatalf("timed out waiting for %s", what)
	}
	var zero T
	return zero
}
