package server

import (
	"bufio"
	"context"
	"fmt"
	"io"
	"net"
	"net/http"
	"strings"
	"testing"
	"time"

	"github.com/beaconplane/beacon/server/registryapi"
)

// TestHostCheck: requests naming another host (DNS rebinding) get 421;
// IP addresses, localhost, the server's own names and --host-whitelist
// pass.
func TestHostCheck(t *testing.T) {
	cfg := testConfig(t)
	cfg.Security.HostWhitelist = []string{"beacon.internal"}
	s := startServer(t, cfg)
	addr := strings.TrimPrefix(s.Endpoints().HTTP, "http://")
	_, port, _ := net.SplitHostPort(addr)
	for host, want := range map[string]int{
		"attacker.example":              http.StatusMisdirectedRequest,
		"attacker.example:" + port:      http.StatusMisdirectedRequest,
		"127.0.0.1.attacker.example":    http.StatusMisdirectedRequest,
		"localhost.attacker.example":    http.StatusMisdirectedRequest,
		"beacon.internal:" + port:       200,
		"BEACON.INTERNAL.":              200,
		"localhost:" + port:             200,
		"127.0.0.1:" + port:             200,
		"[::1]:" + port:                 200,
		"10.1.2.3":                      200,
		"app.localhost":                 200,
		"beacon.internal.attacker.test": http.StatusMisdirectedRequest,
	} {
		req, _ := http.NewRequest("GET", "http://"+addr+"/v1/registry/instances", nil)
		req.Host = host
		resp, err := http.DefaultClient.Do(req)
		if err != nil {
			t.Fatal(err)
		}
		b, _ := io.ReadAll(resp.Body)
		resp.Body.Close()
		if resp.StatusCode != want {
			t.Errorf("Host %q: %d %s; want %d", host, resp.StatusCode, b, want)
		}
		if want == http.StatusMisdirectedRequest && !strings.Contains(string(b), "Config.Security.HostWhitelist") {
			t.Errorf("Host %q: the refusal does not say how to allow it: %s", host, b)
		}
	}
	// The embedded etcd's JSON gateway (plain HTTP) gets the same names.
	etcdAddr := strings.TrimPrefix(s.Endpoints().ClientURLs[0], "http://")
	_, etcdPort, _ := net.SplitHostPort(etcdAddr)
	for host, want := range map[string]int{
		"attacker.example:" + etcdPort: http.StatusMisdirectedRequest,
		"localhost:" + etcdPort:        200,
		"127.0.0.1:" + etcdPort:        200,
		"beacon.internal:" + etcdPort:  200,
	} {
		req, _ := http.NewRequest("POST", "http://"+etcdAddr+"/v3/kv/range", strings.NewReader(`{"key":"YQ=="}`))
		req.Host = host
		resp, err := http.DefaultClient.Do(req)
		if err != nil {
			t.Fatal(err)
		}
		b, _ := io.ReadAll(resp.Body)
		resp.Body.Close()
		if resp.StatusCode != want {
			t.Errorf("etcd gateway with Host %q: %d %s; want %d", host, resp.StatusCode, b, want)
		}
	}
}

// TestBoundedRequests: bodies over the limit are refused, a client that
// sends its body too slowly or idles on a keep-alive connection is cut
// off, and a watch stream outlives the per-request deadline.
func TestBoundedRequests(t *testing.T) {
	cfg := testConfig(t)
	cfg.Security.MaxBodyBytes = 2048
	cfg.Security.RequestTimeout = time.Second
	cfg.Security.IdleTimeout = time.Second
	s := startServer(t, cfg)
	base := s.Endpoints().HTTP
	addr := strings.TrimPrefix(base, "http://")

	// A watch stream, opened first, must outlive the deadlines.
	ctx, cancel := context.WithCancel(context.Background())
	defer cancel()
	req, _ := http.NewRequestWithContext(ctx, "GET", base+registryapi.WatchPath, nil)
	resp, err := http.DefaultClient.Do(req)
	if err != nil || resp.StatusCode != 200 {
		t.Fatalf("watch: %v %v", resp, err)
	}
	defer resp.Body.Close()
	events := make(chan string, 16)
	go func() {
		sc := bufio.NewScanner(resp.Body)
		for sc.Scan() {
			if line := sc.Text(); strings.HasPrefix(line, "event: ") {
				events <- strings.TrimPrefix(line, "event: ")
			}
		}
		close(events)
	}()
	if ev := <-events; ev != "snapshot" {
		t.Fatalf("first event %q", ev)
	}

	// Over the body limit: 413.
	big := `{"namespace":"prod","component":"api","endpoint":"http","address":"10.0.0.1:80","metadata":{"k":"` + strings.Repeat("v", 3000) + `"}}`
	r := as{t: t, base: base}.do("POST", registryapi.InstancesPath, big)
	if r.code != http.StatusRequestEntityTooLarge {
		t.Fatalf("body over --max-body-bytes: %d %s", r.code, r.body)
	}

	// A body that never finishes: once the request timeout passes, the
	// client is told so (408) and the connection closed (it was closed
	// without a word).
	conn, err := net.Dial("tcp", addr)
	if err != nil {
		t.Fatal(err)
	}
	defer conn.Close()
	start := time.Now()
	fmt.Fprintf(conn, "POST %s HTTP/1.1\r\nHost: %s\r\nContent-Type: application/json\r\nContent-Length: 100\r\n\r\n{\"names", registryapi.InstancesPath, addr)
	_ = conn.SetReadDeadline(time.Now().Add(15 * time.Second))
	slow, err := io.ReadAll(conn)
	if err != nil && !strings.Contains(err.Error(), "reset") {
		t.Fatalf("slow body: the server held the connection: %v", err)
	}
	if took := time.Since(start); took > 10*time.Second {
		t.Fatalf("slow body cut after %v with a 1 s request timeout", took)
	}
	if !strings.HasPrefix(string(slow), "HTTP/1.1 408") || !strings.Contains(string(slow), "did not arrive within the server's request timeout") {
		t.Fatalf("slow body: answered %q, want 408 saying why", slow)
	}

	// A v2 discovery long poll outlives the request timeout: it is held
	// until something changes (it ended, empty, at the request timeout).
	tokURL := func() string {
		resp, err := http.Get(base + V2Path + "/new?size=3")
		if err != nil {
			t.Fatal(err)
		}
		defer resp.Body.Close()
		b, _ := io.ReadAll(resp.Body)
		return strings.TrimSpace(string(b))
	}()
	waited := make(chan string, 1)
	waitStart := time.Now()
	go func() {
		resp, err := http.Get(tokURL + "?wait=true&recursive=true")
		if err != nil {
			waited <- err.Error()
			return
		}
		defer resp.Body.Close()
		b, _ := io.ReadAll(resp.Body)
		waited <- fmt.Sprintf("%d %s", resp.StatusCode, b)
	}()

	// An idle keep-alive connection is closed.
	idle, err := net.Dial("tcp", addr)
	if err != nil {
		t.Fatal(err)
	}
	defer idle.Close()
	fmt.Fprintf(idle, "GET /healthz HTTP/1.1\r\nHost: %s\r\n\r\n", addr)
	br := bufio.NewReader(idle)
	if resp, err := http.ReadResponse(br, nil); err != nil || resp.StatusCode != 200 {
		t.Fatalf("healthz on a keep-alive connection: %v %v", resp, err)
	} else {
		_, _ = io.Copy(io.Discard, resp.Body)
		resp.Body.Close()
	}
	_ = idle.SetReadDeadline(time.Now().Add(15 * time.Second))
	if _, err := br.ReadByte(); err != io.EOF {
		t.Fatalf("idle connection: %v, want the server to close it", err)
	}

	// Past two request timeouts (the idle check above took one), the
	// wait gets the registration it waited for.
	if d := 2*time.Second - time.Since(waitStart); d > 0 {
		select {
		case got := <-waited:
			t.Fatalf("v2 wait ended after %v, before anything changed: %s", time.Since(waitStart), got)
		case <-time.After(d):
		}
	}
	put, _ := http.NewRequest("PUT", tokURL+"/m1", strings.NewReader("value=m1%3Dhttp%3A%2F%2F10.0.0.1%3A2380"))
	put.Header.Set("Content-Type", "application/x-www-form-urlencoded")
	if resp, err := http.DefaultClient.Do(put); err != nil || resp.StatusCode != http.StatusCreated {
		t.Fatalf("v2 register: %v %v", resp, err)
	} else {
		resp.Body.Close()
	}
	select {
	case got := <-waited:
		if !strings.HasPrefix(got, "200 ") || !strings.Contains(got, `"action":"create"`) {
			t.Fatalf("v2 wait: %s, want the registration", got)
		}
	case <-time.After(10 * time.Second):
		t.Fatal("v2 wait: no answer after the registration")
	}

	// The stream opened before all this is still served.
	register := `{"namespace":"prod","component":"api","endpoint":"http","address":"10.0.0.1:80"}`
	if r := (as{t: t, base: base}).do("POST", registryapi.InstancesPath, register); r.code != http.StatusCreated {
		t.Fatalf("register: %d %s", r.code, r.body)
	}
	select {
	case ev, ok := <-events:
		if !ok || ev != "added" {
			t.Fatalf("watch stream after the deadlines passed: %q (open %v)", ev, ok)
		}
	case <-time.After(10 * time.Second):
		t.Fatal("no event on the watch stream")
	}
}

// TestEtcdGatewayRefusesRebindingByDefault: with every client listener on
// loopback (the default), the embedded etcd's JSON gateway answers only
// loopback names, without any flag.
func TestEtcdGatewayRefusesRebindingByDefault(t *testing.T) {
	s := startServer(t, testConfig(t))
	etcdAddr := strings.TrimPrefix(s.Endpoints().ClientURLs[0], "http://")
	for host, want := range map[string]int{"attacker.example": http.StatusMisdirectedRequest, "localhost": 200, etcdAddr: 200} {
		req, _ := http.NewRequest("POST", "http://"+etcdAddr+"/v3/kv/range", strings.NewReader(`{"key":"YQ=="}`))
		req.Host = host
		resp, err := http.DefaultClient.Do(req)
		if err != nil {
			t.Fatal(err)
		}
		resp.Body.Close()
		if resp.StatusCode != want {
			t.Errorf("Host %q: %d, want %d", host, resp.StatusCode, want)
		}
	}
}

// TestManyQueryParametersRefused: more than 10,000 query parameters made
// url.Query drop every filter, so that ?namespace=nothere&... listed and
// streamed every namespace; now any query the route cannot take is a 400.
func TestManyQueryParametersRefused(t *testing.T) {
	s := startServer(t, testConfig(t))
	base := s.Endpoints().HTTP
	if r := (as{t: t, base: base}).do("POST", registryapi.InstancesPath, `{"namespace":"secret-ns","component":"api","endpoint":"http","address":"10.0.0.1:80"}`); r.code != 201 {
		t.Fatalf("register: %d %s", r.code, r.body)
	}
	short := "?namespace=nothere" + strings.Repeat("&a", 10_001)              // fits the 64 KiB header limit: 400
	long := "?namespace=nothere" + strings.Repeat("&namespace=x0000", 10_001) // does not: 431
	for _, path := range []string{registryapi.InstancesPath, registryapi.WatchPath} {
		for q, want := range map[string]int{short: http.StatusBadRequest, long: http.StatusRequestHeaderFieldsTooLarge} {
			r := as{t: t, base: base}.stream(path + q)
			if r.code != want || strings.Contains(r.body, "secret-ns") {
				t.Errorf("%s with 10,002 parameters (%d bytes): %d %s; want %d", path, len(q), r.code, r.body, want)
			}
		}
	}
}

// TestV2WaitsCountAsWatchStreams: a v2 discovery long poll holds a store
// watch for up to a minute, so it counts against the caps of watch
// streams (3000 concurrent waits from one address once took the server
// from 51 to 321 MB, none refused). wait is read as etcd reads it
// ("wait=1" too).
func TestV2WaitsCountAsWatchStreams(t *testing.T) {
	cfg := testConfig(t)
	cfg.Security.Limits.MaxWatchesPerClient = 2
	s := startServer(t, cfg)
	base := s.Endpoints().HTTP
	code, tokenURL := get(t, base+V2Path+"/new?size=3")
	if code != 200 {
		t.Fatalf("new token: %d %s", code, tokenURL)
	}
	tokenURL = strings.TrimSpace(tokenURL)
	ctx, cancel := context.WithCancel(context.Background())
	defer cancel()
	open := func(url string) *http.Response {
		t.Helper()
		req, _ := http.NewRequestWithContext(ctx, "GET", url, nil)
		resp, err := http.DefaultClient.Do(req)
		if err != nil {
			t.Fatal(err)
		}
		return resp
	}
	// Two SSE streams fill the client's two slots: a wait is refused.
	for range 2 {
		r := open(base + registryapi.WatchPath)
		defer r.Body.Close()
		if r.StatusCode != 200 {
			t.Fatalf("watch stream: %d", r.StatusCode)
		}
	}
	for _, wait := range []string{"true", "1", "t"} {
		r := open(tokenURL + "?wait=" + wait)
		b, _ := io.ReadAll(r.Body)
		r.Body.Close()
		if r.StatusCode != http.StatusTooManyRequests || r.Header.Get("Retry-After") == "" || !strings.Contains(string(b), "resource_exhausted") {
			t.Fatalf("wait=%s of a client whose slots are full: %d %v %s", wait, r.StatusCode, r.Header, b)
		}
	}
	// A plain read of the token is no stream and is served.
	if code, body := get(t, tokenURL); code != 200 {
		t.Fatalf("read of the token while the slots are full: %d %s", code, body)
	}
}
