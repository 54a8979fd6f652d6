package connlimit

import (
	"context"
	"errors"
	"io"
	"net"
	"testing"
	"time"

	"google.golang.org/grpc"
	"google.golang.org/grpc/credentials/insecure"
	"google.golang.org/grpc/health"
	healthpb "google.golang.org/grpc/health/grpc_health_v1"
)

// grpcServer serves the standard health service on a Listener with
// GRPCMarks, and returns its address and the health server.
func grpcServer(t *testing.T, opts Config) (string, *health.Server) {
	t.Helper()
	raw, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	ln := Listener(raw, opts)
	marks := GRPCMarks(ln)
	if marks == nil {
		t.Fatal("GRPCMarks of a marked listener is nil")
	}
	srv := grpc.NewServer(grpc.StatsHandler(marks))
	hs := health.NewServer()
	healthpb.RegisterHealthServer(srv, hs)
	done := make(chan struct{})
	go func() {
		defer close(done)
		_ = srv.Serve(ln)
	}()
	t.Cleanup(func() {
		srv.Stop()
		<-done
	})
	return raw.Addr().String(), hs
}

// grpcClientFrom is a gRPC client connection from source address src.
func grpcClientFrom(t *testing.T, src, addr string) healthpb.HealthClient {
	t.Helper()
	d := net.Dialer{LocalAddr: &net.TCPAddr{IP: net.ParseIP(src)}, Timeout: testDeadline}
	cc, err := grpc.NewClient("passthrough:///"+addr, grpc.WithTransportCredentials(insecure.NewCredentials()),
		grpc.WithContextDialer(func(ctx context.Context, a string) (net.Conn, error) { return d.DialContext(ctx, "tcp", a) }))
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { _ = cc.Close() })
	return healthpb.NewHealthClient(cc)
}

// watching opens a health Watch stream on c and waits for its first
// answer: a connection with a stream open.
func watching(t *testing.T, ctx context.Context, c healthpb.HealthClient) healthpb.Health_WatchClient {
	t.Helper()
	w, err := c.Watch(ctx, &healthpb.HealthCheckRequest{}, grpc.WaitForReady(true))
	if err != nil {
		t.Fatal(err)
	}
	if _, err := w.Recv(); err != nil {
		t.Fatal(err)
	}
	return w
}

// TestGRPCStreamsHoldTheirConnections: on a gRPC server (GRPCMarks), a
// connection with a stream open is never closed to make room; one that
// never carried an RPC (a flood of idle connections) is, first, then one
// whose RPCs all ended; an address whose every connection has a stream
// open is refused a further one, and its streams live on.
func TestGRPCStreamsHoldTheirConnections(t *testing.T) {
	addr, hs := grpcServer(t, Config{Max: 100, PerAddr: 3, Marked: true})
	ctx, cancel := context.WithTimeout(context.Background(), testDeadline)
	defer cancel()
	w1 := watching(t, ctx, grpcClientFrom(t, "127.0.0.2", addr))
	w2 := watching(t, ctx, grpcClientFrom(t, "127.0.0.2", addr))
	silent := dialFrom(t, "127.0.0.2", addr)

	// At the cap: a new client's call gets the silent connection's place.
	checker := grpcClientFrom(t, "127.0.0.2", addr)
	if _, err := checker.Check(ctx, &healthpb.HealthCheckRequest{}, grpc.WaitForReady(true)); err != nil {
		t.Fatalf("a call past the cap, with a silent connection to make room: %v", err)
	}
	drainedClosed(t, silent, "the connection that never carried an RPC")

	// Its call ended: idle, it makes room for the next, not a watcher.
	w3 := watching(t, ctx, grpcClientFrom(t, "127.0.0.2", addr))

	// Every connection has a stream open: a further one is refused.
	drainedClosed(t, dialFrom(t, "127.0.0.2", addr), "a connection past the cap of an address whose connections all stream")
	hs.SetServingStatus("", healthpb.HealthCheckResponse_NOT_SERVING)
	for i, w := range []healthpb.Health_WatchClient{w1, w2, w3} {
		got, err := w.Recv()
		if err != nil || got.GetStatus() != healthpb.HealthCheckResponse_NOT_SERVING {
			t.Fatalf("watcher %d after the refusals: %v, %v; want NOT_SERVING", i+1, got, err)
		}
	}
}

// TestGRPCMarksNeedsAMarkedListener: no stats handler for a listener that
// is not one, or whose requests are counted by its writes.
func TestGRPCMarksNeedsAMarkedListener(t *testing.T) {
	raw, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	defer raw.Close()
	if GRPCMarks(raw) != nil || GRPCMarks(Listener(raw, Config{Max: 1})) != nil {
		t.Fatal("GRPCMarks of an unmarked listener is not nil")
	}
}

// drainedClosed reads what the server sent on c (a gRPC server sends its
// settings at once) until the server closes it, or fails at the deadline.
func drainedClosed(t *testing.T, c net.Conn, what string) {
	t.Helper()
	_ = c.SetReadDeadline(time.Now().Add(testDeadline))
	_, err := io.Copy(io.Discard, c)
	if ne := net.Error(nil); errors.As(err, &ne) && ne.Timeout() {
		t.Fatalf("%s: still open after %v", what, testDeadline)
	}
}
