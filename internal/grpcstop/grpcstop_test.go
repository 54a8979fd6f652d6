package grpcstop

import (
	"context"
	"net"
	"testing"
	"time"

	"go.uber.org/goleak"
	"google.golang.org/grpc"
	"google.golang.org/grpc/codes"
	"google.golang.org/grpc/credentials/insecure"
	"google.golang.org/grpc/health"
	healthpb "google.golang.org/grpc/health/grpc_health_v1"
	"google.golang.org/grpc/status"
)

func TestMain(m *testing.M) { goleak.VerifyTestMain(m) }

// serve starts a gRPC server whose health Watch streams end, with
// Unavailable and a reason, once stopping is closed (nil: they never end
// by themselves), and returns it with a client connection.
func serve(t *testing.T, stopping <-chan struct{}) (*grpc.Server, *grpc.ClientConn) {
	t.Helper()
	ln, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	gs := grpc.NewServer()
	healthpb.RegisterHealthServer(gs, endingHealth{health.NewServer(), stopping})
	go func() { _ = gs.Serve(ln) }()
	t.Cleanup(gs.Stop)
	conn, err := grpc.NewClient(ln.Addr().String(), grpc.WithTransportCredentials(insecure.NewCredentials()))
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { _ = conn.Close() })
	return gs, conn
}

type endingHealth struct {
	*health.Server
	stopping <-chan struct{}
}

func (h endingHealth) Watch(req *healthpb.HealthCheckRequest, ss healthpb.Health_WatchServer) error {
	if err := ss.Send(&healthpb.HealthCheckResponse{Status: healthpb.HealthCheckResponse_SERVING}); err != nil {
		return err
	}
	select {
	case <-h.stopping:
		return status.Error(codes.Unavailable, "the server is shutting down: connect again")
	case <-ss.Context().Done():
		return ss.Context().Err()
	}
}

// watch opens a stream and returns what ends it.
func watch(t *testing.T, conn *grpc.ClientConn) <-chan error {
	t.Helper()
	ws, err := healthpb.NewHealthClient(conn).Watch(t.Context(), &healthpb.HealthCheckRequest{})
	if err != nil {
		t.Fatal(err)
	}
	if _, err := ws.Recv(); err != nil {
		t.Fatal(err)
	}
	ended := make(chan error, 1)
	go func() {
		for {
			if _, err := ws.Recv(); err != nil {
				ended <- err
				return
			}
		}
	}()
	return ended
}

// TestStreamsThatEndKeepTheirStatus: streams whose handlers return within
// the grace end with the handlers' status, reason and all (a Stop alone
// cut the connection first: the client saw "EOF"), and nothing is cut.
func TestStreamsThatEndKeepTheirStatus(t *testing.T) {
	stopping := make(chan struct{})
	gs, conn := serve(t, stopping)
	ended := watch(t, conn)
	close(stopping)
	if cut := Stop(context.Background(), time.Hour, gs); cut {
		t.Error("Stop cut calls that had ended")
	}
	if err := <-ended; status.Code(err) != codes.Unavailable || status.Convert(err).Message() != "the server is shutting down: connect again" {
		t.Fatalf("the stream ended with %v, want the handler's status", err)
	}
}

// TestStreamsLeftOpenAreCutAfterTheGrace: a stream that does not end by
// itself holds the stop for the grace, not forever.
func TestStreamsLeftOpenAreCutAfterTheGrace(t *testing.T) {
	gs, conn := serve(t, nil)
	ended := watch(t, conn)
	if cut := Stop(context.Background(), 50*time.Millisecond, gs); !cut {
		t.Error("Stop reported nothing cut with a stream open")
	}
	if err := <-ended; err == nil {
		t.Fatal("the stream did not end")
	}
}

// TestAbortCutsAtOnce: a done abort context ends the grace at once.
func TestAbortCutsAtOnce(t *testing.T) {
	gs, conn := serve(t, nil)
	ended := watch(t, conn)
	abort, cancel := context.WithCancel(context.Background())
	cancel()
	if cut := Stop(abort, time.Hour, gs); !cut {
		t.Error("Stop reported nothing cut with a stream open")
	}
	if err := <-ended; err == nil {
		t.Fatal("the stream did not end")
	}
}
