package proxy

import (
	"bufio"
	"bytes"
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"net"
	"net/http"
	"os"
	"strings"
	"syscall"
	"testing"
	"time"

	"github.com/beaconplane/beacon/internal/testkit/etcdtest"
	clientv3 "go.etcd.io/etcd/client/v3"
)

// TestHTTPGatewayWatchAndMetrics: the JSON gateway's streaming watch works
// through the proxy, and /metrics shows client watchers against upstream
// watches.
func TestHTTPGatewayWatchAndMetrics(t *testing.T) {
	t.Parallel()
	c := etcdtest.StartCluster(t, 3)
	p := startProxy(t, Config{PeerURLs: c.PeerURLs()})
	base := "http://" + p.Addr().String()
	hc := httpClient(t)
	ctx, cancel := context.WithCancel(ctxT(t))
	defer cancel()
	var bodies []io.ReadCloser
	var readers []*bufio.Reader
	for range 2 {
		req, _ := http.NewRequestWithContext(ctx, http.MethodPost, base+"/v3/watch", strings.NewReader(`{"create_request":{"key":"dw=="}}`))
		resp, err := hc.Do(req)
		if err != nil {
			t.Fatal(err)
		}
		bodies = append(bodies, resp.Body)
		r := bufio.NewReader(resp.Body)
		line, err := r.ReadString('\n')
		if err != nil || !strings.Contains(line, `"created":true`) {
			t.Fatalf("watch created: %q %v", line, err)
		}
		readers = append(readers, r)
	}
	defer func() {
		for _, b := range bodies {
			b.Close()
		}
	}()
	if code, body := post(t, base+"/v3/kv/put", `{"key":"dw==","value":"eA=="}`); code != http.StatusOK {
		t.Fatalf("put: %d %s", code, body)
	}
	for _, r := range readers {
		line, err := r.ReadString('\n')
		if err != nil || !strings.Contains(line, `"kv":{"key":"dw=="`) {
			t.Fatalf("watch event: %q %v", line, err)
		}
	}
	resp, err := hc.Get(base + "/metrics")
	if err != nil {
		t.Fatal(err)
	}
	b, _ := io.ReadAll(resp.Body)
	resp.Body.Close()
	for _, want := range []string{"beacon_proxy_client_watchers 2", "beacon_proxy_upstream_watches 1", `beacon_proxy_endpoints{state="available"} 3`} {
		if !strings.Contains(string(b), want) {
			t.Errorf("/metrics lacks %q", want)
		}
	}
	resp, err = hc.Get(base + "/health")
	if err != nil {
		t.Fatal(err)
	}
	b, _ = io.ReadAll(resp.Body)
	resp.Body.Close()
	if resp.StatusCode != http.StatusOK || !strings.Contains(string(b), `"health":"true"`) {
		t.Fatalf("/health: %d %s", resp.StatusCode, b)
	}
}

// TestProxyPprof: EnablePprof (--pprof) serves Go's profiles on the
// proxy's listener, and only then.
func TestProxyPprof(t *testing.T) {
	t.Parallel()
	srv := etcdtest.Start(t, etcdtest.Options{})
	on := startProxy(t, Config{Endpoints: srv.Endpoints(), EnablePprof: true})
	off := startProxy(t, Config{Endpoints: srv.Endpoints()})
	for _, tc := range []struct {
		p    *Proxy
		want int
	}{{on, http.StatusOK}, {off, http.StatusNotFound}} {
		resp, err := http.Get("http://" + tc.p.Addr().String() + "/debug/pprof/")
		if err != nil {
			t.Fatal(err)
		}
		resp.Body.Close()
		if resp.StatusCode != tc.want {
			t.Errorf("/debug/pprof/ (EnablePprof %v): %d, want %d", tc.p.cfg.EnablePprof, resp.StatusCode, tc.want)
		}
	}
}

// TestV2AndUnknownPathsAnswered: the etcd v2 keys API through the proxy
// got a plain-text "404 page not found"; now 501 in etcd v2's error shape
// saying the v2 API is not proxied and why, in both modes and for every
// method. Other unknown paths get a JSON 404 naming what is served.
func TestV2AndUnknownPathsAnswered(t *testing.T) {
	t.Parallel()
	srv := etcdtest.Start(t, etcdtest.Options{})
	for _, mode := range []Mode{ReadWrite, ReadOnly} {
		p := startProxy(t, Config{Endpoints: srv.Endpoints(), Mode: mode})
		base := "http://" + p.Addr().String()
		for _, tc := range []struct{ method, path string }{
			{"GET", "/v2/keys/foo"}, {"PUT", "/v2/keys/foo?value=bar"}, {"GET", "/v2/members"}, {"DELETE", "/v2/keys/_etcd/registry/x"},
		} {
			req, err := http.NewRequest(tc.method, base+tc.path, nil)
			if err != nil {
				t.Fatal(err)
			}
			resp, err := http.DefaultClient.Do(req)
			if err != nil {
				t.Fatal(err)
			}
			var body struct {
				Message string `json:"message"`
				Cause   string `json:"cause"`
			}
			err = json.NewDecoder(resp.Body).Decode(&body)
			resp.Body.Close()
			if err != nil || resp.StatusCode != http.StatusNotImplemented || body.Message != V2NotProxied ||
				!strings.HasPrefix(tc.path, body.Cause) || resp.Header.Get("Content-Type") != "application/json" {
				t.Errorf("%s %s %s: %d %+v %v", mode, tc.method, tc.path, resp.StatusCode, body, err)
			}
		}
		resp, err := http.Get(base + "/nope")
		if err != nil {
			t.Fatal(err)
		}
		b, _ := io.ReadAll(resp.Body)
		resp.Body.Close()
		if resp.StatusCode != http.StatusNotFound || !strings.Contains(string(b), "no such path /nope: this listener serves etcd's v3 gRPC API") {
			t.Errorf("%s GET /nope: %d %s", mode, resp.StatusCode, b)
		}
		// A path with an empty, '.' or '..' segment: a JSON 400 naming
		// the clean path, where ServeMux answered a bodyless 307.
		noRedirects := &http.Client{CheckRedirect: func(*http.Request, []*http.Request) error { return http.ErrUseLastResponse }}
		for _, path := range []string{"//v3/kv/range", "/v3/./kv/range", "/v3/kv/../kv/range", "//health"} {
			resp, err := noRedirects.Post(base+path, "application/json", strings.NewReader(`{"key":"Zm9v"}`))
			if err != nil {
				t.Fatal(err)
			}
			b, _ := io.ReadAll(resp.Body)
			resp.Body.Close()
			if resp.StatusCode != http.StatusBadRequest || !strings.Contains(string(b), "has an empty, '.' or '..' segment: request /") {
				t.Errorf("%s POST %s: %d %s", mode, path, resp.StatusCode, b)
			}
		}
		// Two etcd tokens: etcd would read one of them.
		req, err := http.NewRequest("POST", base+"/v3/kv/range", strings.NewReader(`{"key":"Zm9v"}`))
		if err != nil {
			t.Fatal(err)
		}
		req.Header.Add("Authorization", "token-a")
		req.Header.Add("Authorization", "token-b")
		resp, err = http.DefaultClient.Do(req)
		if err != nil {
			t.Fatal(err)
		}
		b, _ = io.ReadAll(resp.Body)
		resp.Body.Close()
		if resp.StatusCode != http.StatusBadRequest || !strings.Contains(string(b), "the Authorization header is given 2 times: send it once") {
			t.Errorf("%s two Authorization headers: %d %s", mode, resp.StatusCode, b)
		}
	}
}

// TestGatewayDeadlines: a gateway request whose body does not arrive
// within the request timeout is answered (it was cut without a word), a
// profile longer than the request timeout is not cut, and a watch over
// the gateway outlives it.
func TestGatewayDeadlines(t *testing.T) {
	t.Parallel()
	srv := etcdtest.Start(t, etcdtest.Options{})
	p := startProxyWith(t, Config{Endpoints: srv.Endpoints(), EnablePprof: true}, func(p *Proxy) { p.httpTimeout = time.Second })
	addr := p.Addr().String()

	conn, err := net.Dial("tcp", addr)
	if err != nil {
		t.Fatal(err)
	}
	defer conn.Close()
	start := time.Now()
	fmt.Fprintf(conn, "POST /v3/kv/put HTTP/1.1\r\nHost: %s\r\nContent-Type: application/json\r\nContent-Length: 100\r\n\r\n{\"key", addr)
	_ = conn.SetReadDeadline(time.Now().Add(15 * time.Second))
	slow, err := io.ReadAll(conn)
	if err != nil && !strings.Contains(err.Error(), "reset") {
		t.Fatalf("slow body: the proxy held the connection: %v", err)
	}
	if took := time.Since(start); took > 10*time.Second || !strings.HasPrefix(string(slow), "HTTP/1.1 4") {
		t.Fatalf("slow body: after %v answered %q, want a 4xx", took, slow)
	}

	// A watch over the gateway, past the request timeout.
	ctx, cancel := context.WithCancel(context.Background())
	defer cancel()
	req, _ := http.NewRequestWithContext(ctx, "POST", "http://"+addr+"/v3/watch", strings.NewReader(`{"create_request":{"key":"L3c="}}`))
	resp, err := http.DefaultClient.Do(req)
	if err != nil || resp.StatusCode != http.StatusOK {
		t.Fatalf("gateway watch: %v %v", resp, err)
	}
	defer resp.Body.Close()
	lines := make(chan string, 4)
	go func() {
		sc := bufio.NewScanner(resp.Body)
		for sc.Scan() {
			lines <- sc.Text()
		}
		close(lines)
	}()
	if l := <-lines; !strings.Contains(l, `"created":true`) {
		t.Fatalf("gateway watch: %s", l)
	}

	start = time.Now()
	presp, err := http.Get("http://" + addr + "/debug/pprof/profile?seconds=2")
	if err != nil {
		t.Fatalf("a 2 s profile with a 1 s request timeout: %v", err)
	}
	b, _ := io.ReadAll(presp.Body)
	presp.Body.Close()
	if presp.StatusCode != http.StatusOK || len(b) == 0 || time.Since(start) < 2*time.Second {
		t.Fatalf("a 2 s profile with a 1 s request timeout: %d, %d bytes after %v", presp.StatusCode, len(b), time.Since(start))
	}

	if _, err := srv.Client(t).Put(context.Background(), "/w", "after"); err != nil {
		t.Fatal(err)
	}
	select {
	case l, ok := <-lines:
		if !ok || !strings.Contains(l, `"events"`) {
			t.Fatalf("gateway watch after the request timeout: %q (open %v)", l, ok)
		}
	case <-time.After(testTimeout):
		t.Fatal("gateway watch: no event after the request timeout")
	}
}

// TestIdleConnectionsClosed: a gRPC connection without calls is closed
// after the idle time (it was held until a keep-alive two hours later, so
// one client could hold any number of them); clients reconnect at their
// next call, and a connection with a watch open is not idle.
func TestIdleConnectionsClosed(t *testing.T) {
	t.Parallel()
	srv := etcdtest.Start(t, etcdtest.Options{})
	// (No silence check: this test is about idle client connections.)
	p := startProxyWith(t, Config{Endpoints: srv.Endpoints(), WatchSilenceTimeout: -1}, func(p *Proxy) { p.idleTimeout = time.Second })
	ctx := ctxT(t)
	cli := proxyClient(t, p)
	if _, err := cli.Put(ctx, "/a", "1"); err != nil {
		t.Fatal(err)
	}
	wch := cli.Watch(ctx, "/w", clientv3.WithCreatedNotify())
	if wr := <-wch; !wr.Created {
		t.Fatalf("watch: %+v", wr)
	}

	// An HTTP/2 connection that completes its handshake and makes no call.
	conn, err := net.Dial("tcp", p.Addr().String())
	if err != nil {
		t.Fatal(err)
	}
	defer conn.Close()
	start := time.Now()
	if _, err := conn.Write([]byte("PRI * HTTP/2.0\r\n\r\nSM\r\n\r\n\x00\x00\x00\x04\x00\x00\x00\x00\x00")); err != nil {
		t.Fatal(err)
	}
	_ = conn.SetReadDeadline(time.Now().Add(testTimeout))
	var got []byte
	buf := make([]byte, 4096)
	goaway := []byte{0x07, 0x00, 0x00, 0x00, 0x00, 0x00} // a GOAWAY frame header (type 7, no flags, stream 0)
	for !bytes.Contains(got, goaway) {
		n, err := conn.Read(buf)
		got = append(got, buf[:n]...)
		if errors.Is(err, os.ErrDeadlineExceeded) {
			t.Fatalf("an idle gRPC connection is still open after %v", time.Since(start))
		}
		if err != nil && !bytes.Contains(got, goaway) {
			t.Fatalf("the idle connection was closed without a GOAWAY (%v): % x", err, got)
		}
	}

	// The client with a watch open was not idle: it still works, and its
	// watch still delivers.
	if _, err := cli.Put(ctx, "/w", "after"); err != nil {
		t.Fatalf("put after the idle time: %v", err)
	}
	select {
	case wr := <-wch:
		if len(wr.Events) != 1 || string(wr.Events[0].Kv.Value) != "after" {
			t.Fatalf("watch after the idle time: %+v", wr)
		}
	case <-ctx.Done():
		t.Fatal("the watch got nothing after the idle time")
	}
}

// TestGatewayWatchClientThatStopsReading: a watch over the JSON gateway,
// plain HTTP or a websocket, whose client stops reading is dropped once a
// write to it has waited for the request timeout: its watch and stream go,
// though what waits for it is far below the watch queue's bound (it is not
// ended as slow).
func TestGatewayWatchClientThatStopsReading(t *testing.T) {
	t.Parallel()
	body := `{"create_request":{"key":"L3Mv","range_end":"L3Mw"}}` // /s/ to /s0
	for name, open := range map[string]func(t *testing.T, conn net.Conn, addr string){
		"http": func(_ *testing.T, conn net.Conn, addr string) {
			fmt.Fprintf(conn, "POST /v3/watch HTTP/1.1\r\nHost: %s\r\nContent-Type: application/json\r\nContent-Length: %d\r\n\r\n%s", addr, len(body), body)
		},
		"websocket": func(t *testing.T, conn net.Conn, addr string) {
			fmt.Fprintf(conn, "GET /v3/watch HTTP/1.1\r\nHost: %s\r\nUpgrade: websocket\r\nConnection: Upgrade\r\n"+
				"Sec-WebSocket-Key: dGhlIHNhbXBsZSBub25jZQ==\r\nSec-WebSocket-Version: 13\r\n\r\n", addr)
			resp, err := http.ReadResponse(bufio.NewReader(conn), nil)
			if err != nil || resp.StatusCode != http.StatusSwitchingProtocols {
				t.Fatalf("websocket upgrade: %v %v", resp, err)
			}
			// One masked text frame (RFC 6455 5.2): the create request.
			mask := [4]byte{1, 2, 3, 4}
			frame := append([]byte{0x81, 0x80 | byte(len(body))}, mask[:]...)
			for i := range len(body) {
				frame = append(frame, body[i]^mask[i%4])
			}
			if _, err := conn.Write(frame); err != nil {
				t.Fatal(err)
			}
		},
	} {
		t.Run(name, func(t *testing.T) {
			t.Parallel()
			srv := etcdtest.Start(t, etcdtest.Options{})
			p := startProxyWith(t, Config{Endpoints: srv.Endpoints()}, func(p *Proxy) { p.httpTimeout = time.Second })
			addr := p.Addr().String()
			d := net.Dialer{Control: func(_, _ string, c syscall.RawConn) error {
				return c.Control(func(fd uintptr) { _ = syscall.SetsockoptInt(int(fd), syscall.SOL_SOCKET, syscall.SO_RCVBUF, 4096) })
			}}
			conn, err := d.Dial("tcp", addr)
			if err != nil {
				t.Fatal(err)
			}
			defer conn.Close()
			open(t, conn, addr)
			eventually(t, "the gateway's watch", func() bool { return p.watch.watchers.Load() == 1 })
			// About 10 MiB of events, past what the sockets between take,
			// far below the watch queue's 64 MiB; the client reads none.
			cli := srv.Client(t)
			val := strings.Repeat("x", 256<<10)
			for i := range 40 {
				if _, err := cli.Put(context.Background(), fmt.Sprintf("/s/%d", i), val); err != nil {
					t.Fatal(err)
				}
			}
			eventually(t, "the watch of the client that stopped reading ended", func() bool {
				return p.watch.watchers.Load() == 0 && value(t, p.m.watchStreams) == 0
			})
			if v := value(t, p.m.watchDropped); v != 0 {
				t.Errorf("watch_slow_streams_total = %v: the stream was ended by the queue's bound, not the write deadline", v)
			}
		})
	}
}
