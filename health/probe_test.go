package health

import (
	"context"
	"crypto/tls"
	"errors"
	"io"
	"log"
	"net"
	"net/http"
	"net/http/httptest"
	"strings"
	"testing"
	"time"

	"github.com/beaconplane/beacon"
	"google.golang.org/grpc"
	"google.golang.org/grpc/health"
	healthpb "google.golang.org/grpc/health/grpc_health_v1"
)

// grpcServer starts a real grpc-go server on a loopback port, with the
// standard health service unless bare.
func grpcServer(t *testing.T, bare bool) (*health.Server, string) {
	t.Helper()
	lis, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	srv := grpc.NewServer()
	hs := health.NewServer()
	if !bare {
		healthpb.RegisterHealthServer(srv, hs)
	}
	go func() { _ = srv.Serve(lis) }()
	t.Cleanup(srv.Stop)
	return hs, lis.Addr().String()
}

// httpServer starts a real HTTP server answering /ok with 200, /down with
// 503, /moved with a redirect to /ok and /slow never (until the test ends).
func httpServer(t *testing.T) string {
	t.Helper()
	lis, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	done := make(chan struct{})
	mux := http.NewServeMux()
	mux.HandleFunc("/ok", func(http.ResponseWriter, *http.Request) {})
	mux.HandleFunc("/down", func(w http.ResponseWriter, _ *http.Request) { w.WriteHeader(http.StatusServiceUnavailable) })
	mux.HandleFunc("/moved", func(w http.ResponseWriter, r *http.Request) { http.Redirect(w, r, "/ok", http.StatusFound) })
	mux.HandleFunc("/slow", func(http.ResponseWriter, *http.Request) { <-done })
	srv := &http.Server{Handler: mux}
	go func() { _ = srv.Serve(lis) }()
	t.Cleanup(func() { close(done); _ = srv.Close() })
	return lis.Addr().String()
}

// closedAddr is a loopback address where nothing listens.
func closedAddr(t *testing.T) string {
	t.Helper()
	lis, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	addr := lis.Addr().String()
	_ = lis.Close()
	return addr
}

func TestProbe(t *testing.T) {
	hs, grpcAddr := grpcServer(t, false)
	hs.SetServingStatus("up", healthpb.HealthCheckResponse_SERVING)
	hs.SetServingStatus("down", healthpb.HealthCheckResponse_NOT_SERVING)
	_, bareAddr := grpcServer(t, true)
	hung, hungAddr := scriptedServer(t)
	hung.stall()
	httpAddr, closed := httpServer(t), closedAddr(t)
	tlsSrv := httptest.NewUnstartedServer(http.HandlerFunc(func(http.ResponseWriter, *http.Request) {}))
	tlsSrv.Config.ErrorLog = log.New(io.Discard, "", 0) // the handshake errors are the test
	tlsSrv.StartTLS()
	t.Cleanup(tlsSrv.Close)
	tlsAddr := tlsSrv.Listener.Addr().String()
	fast := func(c beacon.Check) beacon.Check { c.Interval, c.Timeout = time.Second, 300*time.Millisecond; return c }
	for _, tc := range []struct {
		name  string
		check beacon.Check
		addr  string
		says  string // "" for a pass
	}{
		{"GRPCServing", beacon.Check{Kind: beacon.CheckGRPC}, grpcAddr, ""},
		{"GRPCServiceServing", beacon.Check{Kind: beacon.CheckGRPC, Service: "up"}, grpcAddr, ""},
		{"GRPCNotServing", beacon.Check{Kind: beacon.CheckGRPC, Service: "down"}, grpcAddr, "NOT_SERVING"},
		{"GRPCServiceUnknown", beacon.Check{Kind: beacon.CheckGRPC, Service: "nope"}, grpcAddr, `does not know the service "nope"`},
		{"GRPCNoHealthService", beacon.Check{Kind: beacon.CheckGRPC}, bareAddr, "does not serve grpc.health.v1.Health"},
		{"GRPCRefused", beacon.Check{Kind: beacon.CheckGRPC}, closed, "connection refused"},
		{"GRPCHung", fast(beacon.Check{Kind: beacon.CheckGRPC}), hungAddr, "no answer within the check's timeout (300ms)"},
		{"GRPCAgainstHTTP", beacon.Check{Kind: beacon.CheckGRPC}, httpAddr, ""},
		{"HTTPOK", beacon.Check{Kind: beacon.CheckHTTP, Path: "/ok"}, httpAddr, ""},
		{"HTTP503", beacon.Check{Kind: beacon.CheckHTTP, Path: "/down"}, httpAddr, "GET /down answered 503 Service Unavailable"},
		{"HTTPRedirectNotFollowed", beacon.Check{Kind: beacon.CheckHTTP, Path: "/moved"}, httpAddr, "answered 302"},
		{"HTTPHung", fast(beacon.Check{Kind: beacon.CheckHTTP, Path: "/slow"}), httpAddr, "no answer within the check's timeout (300ms)"},
		{"HTTPRefused", beacon.Check{Kind: beacon.CheckHTTP, Path: "/ok"}, closed, "connection refused"},
		{"HTTPAgainstGRPC", beacon.Check{Kind: beacon.CheckHTTP, Path: "/ok"}, grpcAddr, ""},
		{"HTTPAgainstTLS", beacon.Check{Kind: beacon.CheckHTTP, Path: "/ok"}, tlsAddr, "speaks TLS only"},
		{"GRPCAgainstTLS", beacon.Check{Kind: beacon.CheckGRPC}, tlsAddr, "may be TLS-only"},
		{"TCPOpen", beacon.Check{Kind: beacon.CheckTCP}, httpAddr, ""},
		{"TCPRefused", beacon.Check{Kind: beacon.CheckTCP}, closed, "connection refused"},
	} {
		t.Run(tc.name, func(t *testing.T) {
			err := (&Prober{}).Probe(context.Background(), tc.check, tc.addr)
			switch {
			case tc.name == "GRPCAgainstHTTP" || tc.name == "HTTPAgainstGRPC":
				if err == nil {
					t.Fatal("a probe in the wrong protocol passed")
				}
			case tc.says == "" && err != nil:
				t.Fatalf("failed: %v", err)
			case tc.says != "" && (err == nil || !strings.Contains(err.Error(), tc.says)):
				t.Fatalf("got %v, want a failure saying %q", err, tc.says)
			}
		})
	}
}

// tlsListener serves TLS as crypto/tls does for any protocol (a gRPC
// server with TLS credentials does so): a connection whose first bytes
// are no TLS handshake fails it, and is closed without a word. With
// alert, it answers every connection with a TLS alert record first, as
// OpenSSL-based servers do.
func tlsListener(t *testing.T, alert bool) string {
	t.Helper()
	certs := httptest.NewTLSServer(http.NotFoundHandler()) // for its certificate
	certs.Close()
	lis, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { _ = lis.Close() })
	ln := tls.NewListener(lis, &tls.Config{Certificates: certs.TLS.Certificates})
	go func() {
		for {
			c, err := ln.Accept()
			if err != nil {
				return
			}
			if raw := c.(*tls.Conn).NetConn(); alert {
				// Once a record header is read that is none: level fatal
				// (2), protocol_version (70), TLS 1.2's record version.
				_, _ = io.ReadFull(raw, make([]byte, 5))
				_, _ = raw.Write([]byte{21, 3, 3, 0, 2, 2, 70})
			} else {
				_ = c.(*tls.Conn).Handshake()
			}
			_ = c.Close()
		}
	}()
	return lis.Addr().String()
}

// TestProbeSaysTLS: checks speak plaintext; an HTTP check against a TLS
// server says that the server seems TLS-only, whether it answers with a
// TLS alert record (for certain) or closes the connection without an
// answer (maybe) — as the gRPC check does. A TCP check only connects: it
// passes.
func TestProbeSaysTLS(t *testing.T) {
	closes, alerts := tlsListener(t, false), tlsListener(t, true)
	for _, tc := range []struct {
		name  string
		check beacon.Check
		addr  string
		says  string
	}{
		{"HTTPClosed", beacon.Check{Kind: beacon.CheckHTTP, Path: "/ok"}, closes, "may be TLS-only"},
		{"HTTPAlert", beacon.Check{Kind: beacon.CheckHTTP, Path: "/ok"}, alerts, "the server answered with a TLS record"},
		{"GRPCClosed", beacon.Check{Kind: beacon.CheckGRPC}, closes, "may be TLS-only"},
		{"TCP", beacon.Check{Kind: beacon.CheckTCP}, closes, ""},
	} {
		t.Run(tc.name, func(t *testing.T) {
			err := (&Prober{}).Probe(context.Background(), tc.check, tc.addr)
			switch {
			case tc.says == "" && err != nil:
				t.Fatalf("failed: %v", err)
			case tc.says != "" && (!errors.Is(err, errTLSOnly) || !strings.Contains(err.Error(), tc.says)):
				t.Fatalf("got %v, want a failure saying %q and that checks speak plaintext", err, tc.says)
			}
		})
	}
}

func TestProbeRefusesTTL(t *testing.T) {
	if err := (&Prober{}).Probe(context.Background(), beacon.Check{Kind: beacon.CheckTTL, TTL: time.Minute}, "127.0.0.1:1"); err == nil {
		t.Fatal("a TTL check was probed")
	}
}
