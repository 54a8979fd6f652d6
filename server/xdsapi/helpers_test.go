package xdsapi

import (
	"context"
	"fmt"
	"log/slog"
	"net"
	"strings"
	"testing"
	"time"

	"github.com/beaconplane/beacon"
	"github.com/beaconplane/beacon/internal/testkit/healthtest"
	"github.com/beaconplane/beacon/registry"
	"github.com/prometheus/client_golang/prometheus"
)

// testDeadline bounds every wait of a test.
const testDeadline = 30 * time.Second

func testContext(t testing.TB) context.Context {
	ctx, cancel := context.WithTimeout(context.Background(), testDeadline)
	t.Cleanup(cancel)
	return ctx
}

// memRegistry is a registry over the memory backend, closed with the test.
func memRegistry(t testing.TB) *registry.StoreRegistry {
	t.Helper()
	return healthtest.NewRegistry(t).StoreRegistry
}

// startXDS serves d over ADS on a loopback port chosen by the kernel and
// returns the server and its address; it is closed with the test.
func startXDS(t testing.TB, d registry.Discoverer, cfg Config) (*Server, string) {
	t.Helper()
	if cfg.Metrics == nil {
		cfg.Metrics = prometheus.NewRegistry()
	}
	if cfg.Logger == nil {
		cfg.Logger = slog.New(slog.NewTextHandler(testWriter{t}, &slog.HandlerOptions{Level: slog.LevelWarn}))
	}
	s, err := New(d, cfg)
	if err != nil {
		t.Fatal(err)
	}
	ln, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	done := make(chan error, 1)
	go func() { done <- s.Serve(ln) }()
	t.Cleanup(func() {
		_ = s.Close()
		if err := <-done; err != nil {
			t.Errorf("Serve: %v", err)
		}
	})
	return s, ln.Addr().String()
}

// testWriter writes a server's log into the test's (shown when it fails).
type testWriter struct{ t testing.TB }

func (w testWriter) Write(p []byte) (int, error) {
	w.t.Log(strings.TrimSuffix(string(p), "\n"))
	return len(p), nil
}

// bootstrap is a GRPC_XDS_BOOTSTRAP document for a client of the server at
// addr, without credentials.
func bootstrap(addr, node string) []byte {
	b, err := Bootstrap(BootstrapConfig{Server: addr, NodeID: node})
	if err != nil {
		panic(err)
	}
	return b
}

// register registers an instance of demo/greeter/grpc at addr with the
// given metadata and deregisters it with the test.
func register(t testing.TB, r registry.Registrar, addr string, meta map[string]string) registry.Registration {
	t.Helper()
	reg, err := r.Register(testContext(t), beacon.Instance{
		Namespace: "demo", Component: "greeter", Endpoint: "grpc", Address: addr, Transport: "grpc", Metadata: meta,
	})
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { _ = reg.Close() })
	return reg
}

// waitIndexed waits until the server's index holds n instances of svc: a
// registration reaches it through the registry's watch, a moment after
// Register returns, so a test that needs the server to know it before a
// request waits here.
func waitIndexed(t testing.TB, s *Server, svc service, n int) {
	t.Helper()
	waitFor(t, s, fmt.Sprintf("%d instances of %v in the index", n, svc), func() bool {
		s.idx.mu.RLock()
		defer s.idx.mu.RUnlock()
		st := s.idx.services[svc]
		return st != nil && len(st.instances) == n
	})
}
