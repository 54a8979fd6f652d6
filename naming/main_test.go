package naming_test

import (
	"context"
	"fmt"
	"log/slog"
	"os"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/beaconplane/beacon"
	"github.com/beaconplane/beacon/internal/testkit/etcdtest"
	"github.com/beaconplane/beacon/naming"
	"github.com/beaconplane/beacon/registry"
	"github.com/beaconplane/beacon/store"
	"github.com/beaconplane/beacon/store/etcd"
	"go.uber.org/goleak"
	"google.golang.org/grpc"
	"google.golang.org/grpc/credentials/insecure"
)

// server is the etcd the tests share unless they need their own (stop and
// restart). Tests use disjoint namespaces.
var server *etcdtest.Server

func TestMain(m *testing.M) {
	os.Exit(run(m))
}

func run(m *testing.M) int {
	var err error
	server, err = etcdtest.New(etcdtest.Options{})
	if err != nil {
		fmt.Fprintln(os.Stderr, "start etcd:", err)
		return 1
	}
	code := m.Run()
	server.Close()
	if code == 0 {
		if err := goleak.Find(); err != nil {
			fmt.Fprintln(os.Stderr, "goleak: goroutines left after the tests:", err)
			return 1
		}
	}
	return code
}

// timeout bounds every wait of a test.
const timeout = 20 * time.Second

func testContext(t *testing.T) context.Context {
	ctx, cancel := context.WithTimeout(context.Background(), timeout)
	t.Cleanup(cancel)
	return ctx
}

// newEtcdStore connects a new client (a new "process") to srv, or to the
// shared server if srv is nil.
func newEtcdStore(t *testing.T, srv *etcdtest.Server) *etcd.Store {
	t.Helper()
	if srv == nil {
		srv = server
	}
	ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
	defer cancel()
	s, err := etcd.Open(ctx, etcd.Config{Endpoints: srv.Endpoints()})
	if err != nil {
		t.Fatalf("etcd.New: %v", err)
	}
	t.Cleanup(func() { _ = s.Close() })
	return s
}

// newRegistry returns a registry over st, closed when the test ends
// (before st, which the caller registered first).
func newRegistry(t *testing.T, st store.Store, cfg registry.Config) *registry.StoreRegistry {
	t.Helper()
	r, err := registry.New(st, cfg)
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { _ = r.Close() })
	return r
}

func register(t *testing.T, r registry.Registrar, q beacon.Query, addr string, md map[string]string) registry.Registration {
	t.Helper()
	ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
	defer cancel()
	reg, err := r.Register(ctx, beacon.Instance{
		Namespace: q.Namespace, Component: q.Component, Endpoint: q.Endpoint,
		Address: addr, Transport: "grpc", Metadata: md,
	})
	if err != nil {
		t.Fatal(err)
	}
	return reg
}

// dial opens a channel to target with the builder b and the load
// balancing policy: a name, or a JSON object {"name":{config}}.
func dial(t *testing.T, b *naming.Builder, target, policy string, opts ...grpc.DialOption) *grpc.ClientConn {
	t.Helper()
	if !strings.HasPrefix(policy, "{") {
		policy = `{"` + policy + `":{}}`
	}
	opts = append(opts,
		b.DialOption(),
		grpc.WithTransportCredentials(insecure.NewCredentials()),
		grpc.WithDefaultServiceConfig(`{"loadBalancingConfig":[`+policy+`]}`))
	cc, err := grpc.NewClient(target, opts...)
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { _ = cc.Close() })
	return cc
}

// logRecorder is a slog.Handler that hands every record to the test.
type logRecorder struct {
	mu      sync.Mutex
	records []slog.Record
	wake    chan struct{}
}

func newLogRecorder() *logRecorder { return &logRecorder{wake: make(chan struct{})} }

func (h *logRecorder) Enabled(context.Context, slog.Level) bool { return true }
func (h *logRecorder) WithAttrs([]slog.Attr) slog.Handler       { return h }
func (h *logRecorder) WithGroup(string) slog.Handler            { return h }
func (h *logRecorder) Handle(_ context.Context, r slog.Record) error {
	h.mu.Lock()
	defer h.mu.Unlock()
	h.records = append(h.records, r.Clone())
	close(h.wake)
	h.wake = make(chan struct{})
	return nil
}

// wait waits for a record whose message contains substr, after index from,
// and returns the index after it.
func (h *logRecorder) wait(t *testing.T, from int, substr string) int {
	t.Helper()
	deadline := time.After(timeout)
	for {
		h.mu.Lock()
		recs, wake := h.records, h.wake
		h.mu.Unlock()
		for i := from; i < len(recs); i++ {
			if strings.Contains(recs[i].Message, substr) {
				return i + 1
			}
		}
		select {
		case <-wake:
		case <-deadline:
			t.Fatalf("no log %q after %v", substr, timeout)
		}
	}
}
