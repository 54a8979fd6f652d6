package server

import (
	"bufio"
	"context"
	"errors"
	"fmt"
	"io"
	"log/slog"
	"net"
	"net/http"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/beaconplane/beacon/backend"
	"github.com/beaconplane/beacon/internal/syncbuf"
	"github.com/beaconplane/beacon/server/registryapi"
)

// A flood of connections cannot take the process's file descriptors, and
// cannot lock others out either: at the HTTP listener's cap, a new
// connection takes the place of a silent one (closed for it); only when
// every connection holds a request in flight (watch streams here) does a
// new one wait until one closes, which is logged.
func TestHTTPConnectionCap(t *testing.T) {
	var logs syncbuf.Buffer
	cfg := Config{HTTPAddr: "127.0.0.1:0", Backend: backend.Config{Name: backend.Memory},
		Logger: slog.New(slog.NewTextHandler(&logs, nil))}
	cfg.Security.MaxConns = 3
	s := startServer(t, cfg)
	addr := s.Endpoints().HTTP[len("http://"):]
	var silent []net.Conn
	for range 3 {
		c, err := net.Dial("tcp", addr)
		if err != nil {
			t.Fatal(err)
		}
		t.Cleanup(func() { _ = c.Close() })
		silent = append(silent, c)
	}
	if code, _ := get(t, s.Endpoints().HTTP+"/healthz"); code != http.StatusOK {
		t.Fatalf("a request at the cap of silent connections: %d", code)
	}
	serverClosed(t, silent[0], "the oldest silent connection")
	waitLog(t, &logs, "closed the oldest idle connection to make room")

	// Three watch streams: every place holds a request in flight.
	ctx, cancel := context.WithCancel(context.Background())
	defer cancel()
	var streams []*http.Response
	for range 3 {
		streams = append(streams, openStream(t, ctx, http.DefaultClient, s.Endpoints().HTTP))
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
	waitLog(t, &logs, "and its client reading: new ones wait")
	select {
	case err := <-done:
		t.Fatalf("a request past the cap was answered (%v) while 3 streams held it", err)
	default:
	}
	_ = streams[0].Body.Close()
	if err := <-done; err != nil {
		t.Fatalf("after a stream closed: %v", err)
	}
}

// openStream opens a registry watch (a request that lasts) and reads its
// first event.
func openStream(t *testing.T, ctx context.Context, c *http.Client, base string) *http.Response {
	t.Helper()
	req, err := http.NewRequestWithContext(ctx, http.MethodGet, base+registryapi.WatchPath, nil)
	if err != nil {
		t.Fatal(err)
	}
	resp, err := c.Do(req)
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { _ = resp.Body.Close() })
	if resp.StatusCode != http.StatusOK {
		t.Fatalf("watch: %s", resp.Status)
	}
	if _, err := bufio.NewReader(resp.Body).ReadString('\n'); err != nil {
		t.Fatalf("watch: %v", err)
	}
	return resp
}

// serverClosed waits until the server closed c.
func serverClosed(t *testing.T, c net.Conn, what string) {
	t.Helper()
	_ = c.SetReadDeadline(time.Now().Add(30 * time.Second))
	if _, err := c.Read(make([]byte, 1)); err == nil {
		t.Fatalf("%s: read data, want it closed", what)
	} else if ne := net.Error(nil); errors.As(err, &ne) && ne.Timeout() {
		t.Fatalf("%s: still open", what)
	}
}

// TestHTTPConnectionsPerClient: one client address holds at most
// MaxConnsPerClient connections. A new one from it takes a silent one's
// place; with every one of them holding a request in flight, one past the
// bound is closed at once; other clients are served throughout.
func TestHTTPConnectionsPerClient(t *testing.T) {
	cfg := Config{HTTPAddr: "127.0.0.1:0", Backend: backend.Config{Name: backend.Memory}}
	cfg.Security.MaxConns = 10
	cfg.Security.MaxConnsPerClient = 2
	s := startServer(t, cfg)
	addr := s.Endpoints().HTTP[len("http://"):]
	from := func(src string) *http.Client {
		d := &net.Dialer{LocalAddr: &net.TCPAddr{IP: net.ParseIP(src)}}
		return &http.Client{Timeout: 30 * time.Second, Transport: &http.Transport{DialContext: d.DialContext, DisableKeepAlives: true}}
	}
	var silent []net.Conn
	for range 2 {
		c, err := (&net.Dialer{LocalAddr: &net.TCPAddr{IP: net.ParseIP("127.0.0.2")}}).Dial("tcp", addr)
		if err != nil {
			t.Fatal(err)
		}
		t.Cleanup(func() { _ = c.Close() })
		silent = append(silent, c)
	}
	resp, err := from("127.0.0.2").Get(s.Endpoints().HTTP + "/healthz")
	if err != nil {
		t.Fatalf("a 3rd connection of 127.0.0.2, two silent ones open: %v", err)
	}
	_ = resp.Body.Close()
	serverClosed(t, silent[0], "the oldest silent connection of 127.0.0.2")

	ctx, cancel := context.WithCancel(context.Background())
	defer cancel()
	for range 2 {
		openStream(t, ctx, from("127.0.0.2"), s.Endpoints().HTTP)
	}
	_, err = from("127.0.0.2").Get(s.Endpoints().HTTP + "/healthz")
	var ne net.Error
	if err == nil || (errors.As(err, &ne) && ne.Timeout()) {
		t.Fatalf("a 3rd connection of 127.0.0.2, two streams open: %v; want it closed at once", err)
	}
	resp, err = from("127.0.0.3").Get(s.Endpoints().HTTP + "/healthz")
	if err != nil {
		t.Fatalf("127.0.0.3 while 127.0.0.2 is at its bound: %v", err)
	}
	_ = resp.Body.Close()
}

// TestSilentFloodDoesNotStarveHeartbeats: a local process holds the
// default 256 connections per client address open from 127.0.0.1 without
// a word, reopening each as the server closes it; a legitimate
// registration from 127.0.0.1 (every local process shares the address)
// heartbeats on a new connection each time, and on a kept-alive one.
// Before, 15 of 16 heartbeats were refused and the registration expired;
// now every one is answered.
func TestSilentFloodDoesNotStarveHeartbeats(t *testing.T) {
	floodHeartbeats(t, "")
}

// TestStalledBodyFloodDoesNotStarveHeartbeats: as above, each connection
// of the flood sending a registration's header and the first byte of its
// body of 100, then nothing. Before, every heartbeat was refused (a
// request whose body had not come counted as in flight, never closed for
// another) and the registration expired.
func TestStalledBodyFloodDoesNotStarveHeartbeats(t *testing.T) {
	floodHeartbeats(t, "POST "+registryapi.InstancesPath+" HTTP/1.1\r\nHost: 127.0.0.1\r\nContent-Type: application/json\r\nContent-Length: 100\r\n\r\n{")
}

// floodHeartbeats heartbeats a registration over HTTP while a flood from
// the same address holds every place it may, each connection opening
// with opening (nothing: silent).
func floodHeartbeats(t *testing.T, opening string) {
	cfg := Config{HTTPAddr: "127.0.0.1:0", Backend: backend.Config{Name: backend.Memory}}
	s := startServer(t, cfg)
	base := s.Endpoints().HTTP
	addr := base[len("http://"):]
	ctx, cancel := context.WithTimeout(context.Background(), 60*time.Second)
	defer cancel()

	// The flood: DefaultMaxConnsPerClient silent connections, each
	// reopened when the server closes it.
	fctx, stop := context.WithCancel(ctx)
	var flood sync.WaitGroup
	var reopened sync.Map
	defer func() {
		stop()
		flood.Wait()
	}()
	ready := make(chan struct{}, DefaultMaxConnsPerClient)
	for i := range DefaultMaxConnsPerClient {
		flood.Add(1)
		go func() {
			defer flood.Done()
			first := true
			for fctx.Err() == nil {
				c, err := (&net.Dialer{}).DialContext(fctx, "tcp", addr)
				if err != nil {
					continue
				}
				if _, err := io.WriteString(c, opening); err != nil {
					_ = c.Close()
					continue
				}
				if first {
					ready <- struct{}{}
					first = false
				} else {
					reopened.Store(i, true)
				}
				go func() {
					<-fctx.Done()
					_ = c.Close()
				}()
				_, _ = c.Read(make([]byte, 1)) // until the server closes it
				_ = c.Close()
			}
		}()
	}
	for range DefaultMaxConnsPerClient {
		<-ready
	}

	reg := registerHTTP(t, ctx, base, "flood", 1)[0]
	heartbeat := func(c *http.Client) error {
		req, err := http.NewRequestWithContext(ctx, http.MethodPost, base+registryapi.InstancesPath+"/"+reg.ref+"/heartbeat", nil)
		if err != nil {
			return err
		}
		req.Header.Set(registryapi.SecretHeader, reg.secret)
		resp, err := c.Do(req)
		if err != nil {
			return err
		}
		defer resp.Body.Close()
		_, _ = io.Copy(io.Discard, resp.Body)
		if resp.StatusCode != http.StatusOK {
			return fmt.Errorf("heartbeat: %s", resp.Status)
		}
		return nil
	}
	fresh := &http.Client{Timeout: 30 * time.Second, Transport: &http.Transport{DisableKeepAlives: true}}
	kept := &http.Client{Timeout: 30 * time.Second, Transport: &http.Transport{}}
	defer kept.CloseIdleConnections()
	failed := 0
	for i := range 16 {
		if err := heartbeat(fresh); err != nil {
			failed++
			t.Errorf("heartbeat %d on a new connection: %v", i+1, err)
		}
		if err := heartbeat(kept); err != nil {
			failed++
			t.Errorf("heartbeat %d on a kept-alive connection: %v", i+1, err)
		}
	}
	n := 0
	reopened.Range(func(any, any) bool { n++; return true })
	t.Logf("32 heartbeats under a flood of %d connections: %d failed; %d flood connections were closed and reopened",
		DefaultMaxConnsPerClient, failed, n)
	if n == 0 {
		t.Fatal("no flood connection was closed: the flood did not reach the cap")
	}
	if code, body := get(t, base+registryapi.InstancesPath+"/"+reg.ref); code != http.StatusOK {
		t.Fatalf("the registration after the heartbeats: %d %s", code, strings.TrimSpace(body))
	}
}
