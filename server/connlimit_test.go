package server

import (
	"errors"
	"io"
	"log/slog"
	"net"
	"net/http"
	"testing"
	"time"

	"github.com/beaconplane/beacon/store/backend"
)

// A flood of connections waits at the HTTP listener's cap instead of
// taking the process's file descriptors: with the cap reached a new
// request is answered only once a connection closes, and the cap is
// logged.
func TestHTTPConnectionCap(t *testing.T) {
	var logs syncBuffer
	cfg := Config{HTTPAddr: "127.0.0.1:0", Backend: backend.Config{Name: backend.Memory},
		Logger: slog.New(slog.NewTextHandler(&logs, nil))}
	cfg.Security.MaxConns = 3
	s := startServer(t, cfg)
	addr := s.Endpoints().HTTP[len("http://"):]
	var idle []net.Conn
	for range 3 {
		c, err := net.Dial("tcp", addr)
		if err != nil {
			t.Fatal(err)
		}
		t.Cleanup(func() { _ = c.Close() })
		idle = append(idle, c)
	}
	done := make(chan error, 1)
	go func() {
		resp, err := (&http.Client{Timeout: 30 * time.Second}).Get(s.Endpoints().HTTP + "/healthz")
		if err == nil {
			_, _ = io.Copy(io.Discard, resp.Body)
			resp.Body.Close()
		}
		done <- err
	}()
	waitLog(t, &logs, "connections at their cap")
	select {
	case err := <-done:
		t.Fatalf("a request past the cap was answered (%v) while 3 connections held it", err)
	default:
	}
	_ = idle[0].Close()
	if err := <-done; err != nil {
		t.Fatalf("after a connection closed: %v", err)
	}
}

func TestDefaultMaxConns(t *testing.T) {
	if n := defaultMaxConns(); n < 256 {
		t.Errorf("defaultMaxConns() = %d, want at least 256", n)
	}
}

// TestHTTPConnectionsPerClient: one client address holds at most
// MaxConnsPerClient connections; one past it is closed at once, and other
// clients are served. One client reopening 5,200 silent connections as the
// header timeout closed them held every place of the default cap (5,000),
// and the HTTP API (heartbeats included) answered nobody else.
func TestHTTPConnectionsPerClient(t *testing.T) {
	cfg := Config{HTTPAddr: "127.0.0.1:0", Backend: backend.Config{Name: backend.Memory}}
	cfg.Security.MaxConns = 10
	cfg.Security.MaxConnsPerClient = 2
	s := startServer(t, cfg)
	addr := s.Endpoints().HTTP[len("http://"):]
	from := func(src string) *http.Client {
		d := &net.Dialer{LocalAddr: &net.TCPAddr{IP: net.ParseIP(src)}}
		c := &http.Client{Timeout: 30 * time.Second, Transport: &http.Transport{DialContext: d.DialContext, DisableKeepAlives: true}}
		return c
	}
	for range 2 {
		c, err := (&net.Dialer{LocalAddr: &net.TCPAddr{IP: net.ParseIP("127.0.0.2")}}).Dial("tcp", addr)
		if err != nil {
			t.Fatal(err)
		}
		t.Cleanup(func() { _ = c.Close() })
	}
	_, err := from("127.0.0.2").Get(s.Endpoints().HTTP + "/healthz")
	var ne net.Error
	if err == nil || (errors.As(err, &ne) && ne.Timeout()) {
		t.Fatalf("a 3rd connection of 127.0.0.2: %v; want it closed at once", err)
	}
	resp, err := from("127.0.0.3").Get(s.Endpoints().HTTP + "/healthz")
	if err != nil {
		t.Fatalf("127.0.0.3 while 127.0.0.2 is at its bound: %v", err)
	}
	_ = resp.Body.Close()
}
