package proxy

import (
	"context"
	"log/slog"
	"net"
	"os"
	"testing"
	"time"

	"github.com/prometheus/client_golang/prometheus"
	dto "github.com/prometheus/client_model/go"
	clientv3 "go.etcd.io/etcd/client/v3"
	"go.uber.org/goleak"
	"go.uber.org/zap"
)

func TestMain(m *testing.M) {
	goleak.VerifyTestMain(m,
		// etcd's embedded server and clients keep process-wide goroutines.
		goleak.IgnoreTopFunction("go.opencensus.io/stats/view.(*worker).start"),
		goleak.IgnoreAnyFunction("go.etcd.io/etcd/pkg/v3/schedule.(*fifo).run"),
		goleak.IgnoreAnyFunction("github.com/golang/glog.(*fileSink).flushDaemon"),
		goleak.IgnoreAnyFunction("google.golang.org/grpc/internal/grpcsync.(*CallbackSerializer).run"),
		goleak.IgnoreAnyFunction("go.etcd.io/etcd/client/pkg/v3/logutil.(*MergeLogger).outputLoop"),
		// etcd's peer HTTP servers leave a background read behind briefly
		// after an embedded member is closed.
		goleak.IgnoreAnyFunction("net/http.(*connReader).backgroundRead"),
		// Peer connections between embedded etcd members (rafthttp) outlive
		// Close; a bare etcdtest.StartCluster + Close shows them too.
		goleak.IgnoreAnyFunction("net/http.(*persistConn).readLoop"),
		goleak.IgnoreAnyFunction("net/http.(*persistConn).writeLoop"),
		goleak.IgnoreAnyFunction("net/http.(*connReader).abortPendingRead"),
	)
}

// testTimeout bounds every wait in a test.
const testTimeout = 30 * time.Second

func testLogger(t testing.TB) *slog.Logger {
	if os.Getenv("BEACON_TEST_LOG") != "" {
		return slog.New(slog.NewTextHandler(os.Stderr, &slog.HandlerOptions{Level: slog.LevelDebug}))
	}
	return nil
}

// startProxy serves cfg on a loopback port until the test ends.
func startProxy(t testing.TB, cfg Config) *Proxy {
	t.Helper()
	return startProxyWith(t, cfg, nil)
}

// startProxyWith is startProxy; adjust changes the proxy before it
// serves.
func startProxyWith(t testing.TB, cfg Config, adjust func(*Proxy)) *Proxy {
	t.Helper()
	if cfg.Logger == nil {
		cfg.Logger = testLogger(t)
	}
	p, err := New(cfg)
	if err != nil {
		t.Fatalf("New: %v", err)
	}
	if adjust != nil {
		adjust(p)
	}
	l, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	errc := serveChecked(t, p, l)
	select {
	case <-p.Ready():
	case err := <-errc:
		t.Fatalf("Serve: %v", err)
	case <-time.After(testTimeout):
		t.Fatal("proxy not ready")
	}
	return p
}

// proxyClient is an etcd client of the proxy only.
func proxyClient(t testing.TB, p *Proxy) *clientv3.Client {
	t.Helper()
	cli, err := clientv3.New(clientv3.Config{Endpoints: []string{"http://" + p.Addr().String()}, DialTimeout: 5 * time.Second, Logger: zap.NewNop()})
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { _ = cli.Close() })
	return cli
}

func ctxT(t testing.TB) context.Context {
	ctx, cancel := context.WithTimeout(context.Background(), testTimeout)
	t.Cleanup(cancel)
	return ctx
}

// eventually polls cond until it holds (only where there is no event to
// wait on, such as a refresh of the member list).
func eventually(t testing.TB, what string, cond func() bool) {
	t.Helper()
	deadline := time.Now().Add(testTimeout)
	tick := time.NewTicker(20 * time.Millisecond)
	defer tick.Stop()
	for !cond() {
		if time.Now().After(deadline) {
			t.Fatalf("timed out waiting for %s", what)
		}
		<-tick.C
	}
}

// value reads a counter or gauge.
func value(t testing.TB, m prometheus.Metric) float64 {
	t.Helper()
	var d dto.Metric
	if err := m.Write(&d); err != nil {
		t.Fatal(err)
	}
	switch {
	case d.Counter != nil:
		return d.Counter.GetValue()
	case d.Gauge != nil:
		return d.Gauge.GetValue()
	}
	t.Fatalf("metric %v is neither counter nor gauge", m.Desc())
	return 0
}

func mustListen(t testing.TB) net.Listener {
	t.Helper()
	l, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	return l
}

// serveChecked serves p on l until the test ends, when Close and Serve
// must both succeed; it does not wait for the proxy to be ready. The
// channel gives Serve's error once, then is closed.
func serveChecked(t testing.TB, p *Proxy, l net.Listener) <-chan error {
	t.Helper()
	errc := make(chan error, 1)
	go func() {
		errc <- p.Serve(context.Background(), l)
		close(errc)
	}()
	t.Cleanup(func() {
		if err := p.Close(); err != nil {
			t.Errorf("Close: %v", err)
		}
		if err := <-errc; err != nil {
			t.Errorf("Serve: %v", err)
		}
	})
	return errc
}
