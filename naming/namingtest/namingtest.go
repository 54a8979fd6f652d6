// Package namingtest provides a real gRPC backend for tests and benchmarks
// of name resolution: a server on a loopback port serving the standard
// grpc.health.v1.Health service, which counts the calls it receives (per
// client tag, with the time of the last one) and names itself in a
// response header, so that a caller knows which backend served each call.
package namingtest

import (
	"context"
	"errors"
	"fmt"
	"net"
	"sync"
	"time"

	"google.golang.org/grpc"
	"google.golang.org/grpc/health"
	healthpb "google.golang.org/grpc/health/grpc_health_v1"
	"google.golang.org/grpc/metadata"
)

// Metadata keys: the request header that tags a client and the response
// header that names the backend.
const (
	ClientTagKey = "x-beacon-client"
	BackendKey   = "x-beacon-backend"
)

// Backend is a running gRPC server. Its methods are safe for concurrent use.
type Backend struct {
	name string
	addr string
	srv  *grpc.Server
	hs   *health.Server
	done chan struct{}

	mu    sync.Mutex
	calls map[string]int
	first map[string]time.Time
	last  map[string]time.Time
	total int
	wake  chan struct{} // closed and replaced at every call
}

// NewBackend starts a backend on 127.0.0.1 (a free port). The caller must
// Stop it.
func NewBackend(name string) (*Backend, error) {
	return NewBackendAt(name, "127.0.0.1:0")
}

// NewBackendAt starts a backend listening on addr.
func NewBackendAt(name, addr string) (*Backend, error) {
	lis, err := net.Listen("tcp", addr)
	if err != nil {
		return nil, fmt.Errorf("namingtest: listen %s: %w", addr, err)
	}
	b := &Backend{
		name:  name,
		addr:  lis.Addr().String(),
		hs:    health.NewServer(),
		done:  make(chan struct{}),
		calls: make(map[string]int),
		first: make(map[string]time.Time),
		last:  make(map[string]time.Time),
		wake:  make(chan struct{}),
	}
	b.srv = grpc.NewServer(grpc.UnaryInterceptor(b.count))
	healthpb.RegisterHealthServer(b.srv, b.hs)
	go func() {
		defer close(b.done)
		_ = b.srv.Serve(lis)
	}()
	return b, nil
}

// TB is the part of testing.TB that Start uses; taking it instead of
// testing.TB keeps the testing package out of the beacon binary, whose
// `bench naming` scenario runs these backends.
type TB interface {
	Helper()
	Fatal(args ...any)
	Cleanup(func())
}

// Start starts a backend and stops it when the test ends.
func Start(tb TB, name string) *Backend {
	tb.Helper()
	b, err := NewBackend(name)
	if err != nil {
		tb.Fatal(err)
	}
	tb.Cleanup(b.Stop)
	return b
}

func (b *Backend) count(ctx context.Context, req any, _ *grpc.UnaryServerInfo, h grpc.UnaryHandler) (any, error) {
	now := time.Now()
	tag := ""
	if md, ok := metadata.FromIncomingContext(ctx); ok {
		if v := md.Get(ClientTagKey); len(v) > 0 {
			tag = v[0]
		}
	}
	b.mu.Lock()
	b.calls[tag]++
	if _, ok := b.first[tag]; !ok {
		b.first[tag] = now
	}
	b.last[tag] = now
	b.total++
	close(b.wake)
	b.wake = make(chan struct{})
	b.mu.Unlock()
	_ = grpc.SetHeader(ctx, metadata.Pairs(BackendKey, b.name))
	return h(ctx, req)
}

// Name returns the backend's name.
func (b *Backend) Name() string { return b.name }

// Addr returns host:port.
func (b *Backend) Addr() string { return b.addr }

// Health returns the health service, to make the backend report
// NOT_SERVING.
func (b *Backend) Health() *health.Server { return b.hs }

// Calls returns the number of calls served.
func (b *Backend) Calls() int {
	b.mu.Lock()
	defer b.mu.Unlock()
	return b.total
}

// CallsFrom returns the number of calls served for clients tagged tag
// ("" for untagged ones).
func (b *Backend) CallsFrom(tag string) int {
	b.mu.Lock()
	defer b.mu.Unlock()
	return b.calls[tag]
}

// LastCall returns when the last call tagged tag arrived (zero if none).
func (b *Backend) LastCall(tag string) time.Time {
	b.mu.Lock()
	defer b.mu.Unlock()
	return b.last[tag]
}

// FirstCall returns when the first call tagged tag arrived (zero if none).
func (b *Backend) FirstCall(tag string) time.Time {
	b.mu.Lock()
	defer b.mu.Unlock()
	return b.first[tag]
}

// Reset forgets every count.
func (b *Backend) Reset() {
	b.mu.Lock()
	defer b.mu.Unlock()
	clear(b.calls)
	clear(b.first)
	clear(b.last)
	b.total = 0
}

// WaitCalls waits until the backend has served at least n calls in total,
// or ctx is done.
func (b *Backend) WaitCalls(ctx context.Context, n int) error {
	for {
		b.mu.Lock()
		total, wake := b.total, b.wake
		b.mu.Unlock()
		if total >= n {
			return nil
		}
		select {
		case <-wake:
		case <-ctx.Done():
			return fmt.Errorf("namingtest: backend %s served %d of %d calls: %w", b.name, total, n, ctx.Err())
		}
	}
}

// ListenMore serves the backend on n more loopback ports chosen by the
// kernel, and returns their addresses: one server that a service sees as n
// more instances. They stop with the backend.
func (b *Backend) ListenMore(n int) ([]string, error) {
	addrs := make([]string, 0, n)
	for range n {
		lis, err := net.Listen("tcp", "127.0.0.1:0")
		if err != nil {
			return addrs, fmt.Errorf("namingtest: listen: %w", err)
		}
		addrs = append(addrs, lis.Addr().String())
		go func() { _ = b.srv.Serve(lis) }()
	}
	return addrs, nil
}

// Stop stops the server at once, failing calls in flight. It is
// idempotent.
func (b *Backend) Stop() {
	b.srv.Stop()
	<-b.done
}

// GracefulStop stops accepting calls and waits for those in flight.
func (b *Backend) GracefulStop() {
	b.srv.GracefulStop()
	<-b.done
}

// Call makes one health check on cc and returns the name of the backend
// that served it.
func Call(ctx context.Context, cc grpc.ClientConnInterface, opts ...grpc.CallOption) (string, error) {
	var md metadata.MD
	opts = append(opts, grpc.Header(&md))
	resp, err := healthpb.NewHealthClient(cc).Check(ctx, &healthpb.HealthCheckRequest{}, opts...)
	if err != nil {
		return "", err
	}
	if resp.GetStatus() != healthpb.HealthCheckResponse_SERVING {
		return "", fmt.Errorf("namingtest: backend reports %v", resp.GetStatus())
	}
	v := md.Get(BackendKey)
	if len(v) == 0 {
		return "", errors.New("namingtest: the server is not a namingtest backend (no " + BackendKey + " header)")
	}
	return v[0], nil
}

// Tag returns ctx with the client tag that backends count calls under.
func Tag(ctx context.Context, tag string) context.Context {
	return metadata.AppendToOutgoingContext(ctx, ClientTagKey, tag)
}

// CallUntil calls cc until done returns true for the backend that served
// a call (errors are passed to done as well, with an empty name), or ctx
// ends. It returns the number of calls made.
func CallUntil(ctx context.Context, cc grpc.ClientConnInterface, done func(backend string, err error) bool) (int, error) {
	for n := 1; ; n++ {
		if err := ctx.Err(); err != nil {
			return n - 1, err
		}
		cctx, cancel := context.WithTimeout(ctx, 5*time.Second)
		name, err := Call(cctx, cc)
		cancel()
		if done(name, err) {
			return n, nil
		}
	}
}

// ReachAll calls cc until every backend in names has served a call. A call
// served by a backend not in names is an error.
func ReachAll(ctx context.Context, cc grpc.ClientConnInterface, names ...string) error {
	want := make(map[string]bool, len(names))
	for _, n := range names {
		want[n] = true
	}
	seen := map[string]bool{}
	var last, stray error
	_, err := CallUntil(ctx, cc, func(name string, err error) bool {
		switch {
		case err != nil:
			last = err
			return false
		case !want[name]:
			stray = fmt.Errorf("namingtest: call served by %s; want only %v", name, names)
			return true
		}
		seen[name] = true
		return len(seen) == len(want)
	})
	if stray != nil {
		return stray
	}
	if err != nil {
		return fmt.Errorf("namingtest: backends %v not all reached (saw %v): %w", names, seen, errors.Join(err, last))
	}
	return nil
}

// SettleOn calls cc until n calls in a row were served by backends in
// names, then makes n more and fails if any of them goes elsewhere.
func SettleOn(ctx context.Context, cc grpc.ClientConnInterface, n int, names ...string) error {
	allowed := make(map[string]bool, len(names))
	for _, name := range names {
		allowed[name] = true
	}
	run := 0
	var last string
	if _, err := CallUntil(ctx, cc, func(name string, err error) bool {
		last = name
		if err != nil || !allowed[name] {
			run = 0
			return false
		}
		run++
		return run == n
	}); err != nil {
		return fmt.Errorf("namingtest: calls never settled on %v (last served by %q): %w", names, last, err)
	}
	for range n {
		name, err := Call(ctx, cc)
		if err != nil {
			return fmt.Errorf("namingtest: after settling on %v, a call failed: %w", names, err)
		}
		if !allowed[name] {
			return fmt.Errorf("namingtest: after settling on %v, a call went to %q", names, name)
		}
	}
	return nil
}
