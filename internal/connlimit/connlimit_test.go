package connlimit

import (
	"bufio"
	"bytes"
	"context"
	"crypto/tls"
	"errors"
	"fmt"
	"io"
	"log/slog"
	"net"
	"net/http"
	"strings"
	"sync"
	"syscall"
	"testing"
	"time"

	"go.uber.org/goleak"
)

func TestMain(m *testing.M) { goleak.VerifyTestMain(m) }

const testDeadline = 30 * time.Second

// echoServer is a server that does not mark requests: it answers each
// line with the same line (as a DNS-over-TCP server answers each query).
func echoServer(t *testing.T, opts Config) string {
	t.Helper()
	raw, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	ln := Listener(raw, opts)
	var wg sync.WaitGroup
	t.Cleanup(func() {
		_ = ln.Close()
		wg.Wait()
	})
	var mu sync.Mutex
	var open []net.Conn
	t.Cleanup(func() {
		mu.Lock()
		defer mu.Unlock()
		for _, c := range open {
			_ = c.Close()
		}
	})
	wg.Add(1)
	go func() {
		defer wg.Done()
		for {
			c, err := ln.Accept()
			if err != nil {
				return
			}
			mu.Lock()
			open = append(open, c)
			mu.Unlock()
			wg.Add(1)
			go func() {
				defer wg.Done()
				defer c.Close()
				r := bufio.NewReader(c)
				for {
					line, err := r.ReadString('\n')
					if err != nil {
						return
					}
					if _, err := io.WriteString(c, line); err != nil {
						return
					}
				}
			}()
		}
	}()
	return raw.Addr().String()
}

func dialFrom(t *testing.T, src, addr string) net.Conn {
	t.Helper()
	d := net.Dialer{LocalAddr: &net.TCPAddr{IP: net.ParseIP(src)}, Timeout: testDeadline}
	c, err := d.Dial("tcp", addr)
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { _ = c.Close() })
	return c
}

// ask sends a line and reads the answer.
func ask(c net.Conn, line string) error {
	_ = c.SetDeadline(time.Now().Add(testDeadline))
	if _, err := io.WriteString(c, line+"\n"); err != nil {
		return err
	}
	got, err := bufio.NewReader(c).ReadString('\n')
	if err != nil {
		return err
	}
	if got != line+"\n" {
		return errors.New("wrong answer " + got)
	}
	return nil
}

// closedByServer waits until the server closed c (a read ends with EOF
// or a reset), or fails at the deadline.
func closedByServer(t *testing.T, c net.Conn, what string) {
	t.Helper()
	_ = c.SetReadDeadline(time.Now().Add(testDeadline))
	if _, err := c.Read(make([]byte, 1)); err == nil {
		t.Fatalf("%s: read data, want the connection closed", what)
	} else if ne := net.Error(nil); errors.As(err, &ne) && ne.Timeout() {
		t.Fatalf("%s: still open after %v", what, testDeadline)
	}
}

// stillOpen checks that the server has not closed c: a question is still
// answered.
func stillOpen(t *testing.T, c net.Conn, what string) {
	t.Helper()
	if err := ask(c, "still there?"); err != nil {
		t.Fatalf("%s was closed: %v", what, err)
	}
}

// TestSilentConnectionsAreShedForNewOnes: one address at its cap with
// silent connections (opened, never a request) does not lock out a new
// connection from it: the oldest silent one is closed to make room, and
// connections that have been answered stay while a silent one is left.
func TestSilentConnectionsAreShedForNewOnes(t *testing.T) {
	addr := echoServer(t, Config{Max: 100, PerAddr: 4})
	answered := dialFrom(t, "127.0.0.2", addr)
	if err := ask(answered, "hello"); err != nil {
		t.Fatal(err)
	}
	var silent []net.Conn
	for range 3 {
		silent = append(silent, dialFrom(t, "127.0.0.2", addr))
	}
	// At the cap (1 answered + 3 silent): a 5th connection is served, the
	// oldest silent one is closed for it.
	fresh := dialFrom(t, "127.0.0.2", addr)
	if err := ask(fresh, "let me in"); err != nil {
		t.Fatalf("a new connection at its address's cap: %v", err)
	}
	closedByServer(t, silent[0], "the oldest silent connection")
	stillOpen(t, answered, "the answered connection")
	// And again: the next silent one goes, never the answered ones.
	if err := ask(dialFrom(t, "127.0.0.2", addr), "me too"); err != nil {
		t.Fatal(err)
	}
	closedByServer(t, silent[1], "the next silent connection")
	stillOpen(t, answered, "the answered connection")
	stillOpen(t, fresh, "the newer answered connection")
	// Another address is not concerned.
	if err := ask(dialFrom(t, "127.0.0.3", addr), "other"); err != nil {
		t.Fatal(err)
	}
	stillOpen(t, silent[2], "a silent connection of 127.0.0.2 while 127.0.0.3 connects")
}

// TestIdleLongestIsShedWhenNoneIsSilent: with every connection of an
// address answered at least once, a new one takes the place of the one
// idle longest (the last to be answered stays).
func TestIdleLongestIsShedWhenNoneIsSilent(t *testing.T) {
	addr := echoServer(t, Config{Max: 100, PerAddr: 3})
	var cs []net.Conn
	for range 3 {
		c := dialFrom(t, "127.0.0.2", addr)
		if err := ask(c, "hi"); err != nil {
			t.Fatal(err)
		}
		cs = append(cs, c)
	}
	// cs[0] answered again: cs[1] is now the one idle longest.
	if err := ask(cs[0], "again"); err != nil {
		t.Fatal(err)
	}
	if err := ask(dialFrom(t, "127.0.0.2", addr), "new"); err != nil {
		t.Fatal(err)
	}
	closedByServer(t, cs[1], "the connection idle longest")
	stillOpen(t, cs[0], "the connection answered last but one")
}

// A marked server: requests in flight are never closed for a newcomer.
// At an address's cap with every connection in a request, a new one from
// it is refused (closed at once); at the listener's cap it waits until a
// connection closes; and silent connections are shed before either.
func TestRequestsInFlightAreNeverShed(t *testing.T) {
	raw, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	logs := &syncBuffer{}
	ln := Listener(raw, Config{Max: 3, PerAddr: 2, Marked: true, Log: slog.New(slog.NewTextHandler(logs, nil)), What: "test"})
	release := make(chan struct{})
	started := make(chan struct{}, 16)
	srv := &http.Server{
		ConnContext:       ConnContext,
		ReadHeaderTimeout: testDeadline,
		Handler: Handler(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
			if r.URL.Path == "/hold" {
				started <- struct{}{}
				select {
				case <-release:
				case <-r.Context().Done():
				}
			}
			_, _ = io.WriteString(w, "ok")
		})),
	}
	go func() { _ = srv.Serve(ln) }()
	t.Cleanup(func() { _ = srv.Close() })
	base := "http://" + raw.Addr().String()
	client := func(src string) *http.Client {
		d := &net.Dialer{LocalAddr: &net.TCPAddr{IP: net.ParseIP(src)}}
		return &http.Client{Timeout: testDeadline, Transport: &http.Transport{DialContext: d.DialContext, DisableKeepAlives: true}}
	}
	get := func(src, path string) error {
		resp, err := client(src).Get(base + path)
		if err != nil {
			return err
		}
		defer resp.Body.Close()
		_, err = io.Copy(io.Discard, resp.Body)
		return err
	}
	// A silent connection of 127.0.0.2, then two requests in flight from
	// it: the second takes the silent one's place.
	silent := dialFrom(t, "127.0.0.2", raw.Addr().String())
	held := make(chan error, 2)
	for range 2 {
		go func() { held <- get("127.0.0.2", "/hold") }()
		<-started
	}
	closedByServer(t, silent, "the silent connection")
	// Both of its places hold a request: a third connection from it is
	// refused at once.
	if err := get("127.0.0.2", "/"); err == nil {
		t.Fatal("a connection past its address's cap, every place holding a request, was served")
	} else if ne := net.Error(nil); errors.As(err, &ne) && ne.Timeout() {
		t.Fatalf("refused only at the deadline: %v", err)
	}
	// The listener's cap: a third request in flight from 127.0.0.3 fills
	// it; a fourth connection waits until one of them ends.
	go func() { held <- get("127.0.0.3", "/hold") }()
	<-started
	waited := make(chan error, 1)
	go func() { waited <- get("127.0.0.4", "/") }()
	logs.waitFor(t, "and its client reading: new ones wait")
	select {
	case err := <-waited:
		t.Fatalf("a connection past the listener's cap, every place holding a request, was served (%v)", err)
	default:
	}
	close(release)
	for range 3 {
		if err := <-held; err != nil {
			t.Fatalf("a held request: %v", err)
		}
	}
	if err := <-waited; err != nil {
		t.Fatalf("the waiting connection once places freed: %v", err)
	}
}

// TestMarkedIdleKeepAliveOutlivesSilentFlood: a client's keep-alive
// connection, idle between its requests, is not shed while the same
// address keeps opening silent connections: the silent ones make room for
// each other.
func TestMarkedIdleKeepAliveOutlivesSilentFlood(t *testing.T) {
	raw, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	ln := Listener(raw, Config{Max: 100, PerAddr: 8, Marked: true})
	srv := &http.Server{ConnContext: ConnContext, ReadHeaderTimeout: testDeadline,
		Handler: Handler(http.HandlerFunc(func(w http.ResponseWriter, _ *http.Request) { _, _ = io.WriteString(w, "ok") }))}
	go func() { _ = srv.Serve(ln) }()
	t.Cleanup(func() { _ = srv.Close() })
	var dials sync.Mutex
	dialed := 0
	d := &net.Dialer{LocalAddr: &net.TCPAddr{IP: net.ParseIP("127.0.0.2")}}
	tr := &http.Transport{DialContext: func(ctx context.Context, network, addr string) (net.Conn, error) {
		dials.Lock()
		dialed++
		dials.Unlock()
		return d.DialContext(ctx, network, addr)
	}}
	t.Cleanup(tr.CloseIdleConnections)
	client := &http.Client{Timeout: testDeadline, Transport: tr}
	for i := range 20 {
		resp, err := client.Get("http://" + raw.Addr().String() + "/")
		if err != nil {
			t.Fatalf("request %d: %v", i, err)
		}
		_, _ = io.Copy(io.Discard, resp.Body)
		_ = resp.Body.Close()
		// Between requests, the same address opens more silent
		// connections than its cap.
		for range 10 {
			dialFrom(t, "127.0.0.2", raw.Addr().String())
		}
	}
	dials.Lock()
	defer dials.Unlock()
	if dialed != 1 {
		t.Fatalf("the client dialed %d times: its idle keep-alive connection was closed for silent ones", dialed)
	}
}

func TestOurs(t *testing.T) {
	c := &conn{}
	if ours(c) != c || ours(tls.Server(c, &tls.Config{})) != c || ours(nil) != nil || ours(strings.NewReader("")) != nil {
		t.Fatal("ours does not find the listener's connection")
	}
}

// syncBuffer collects log lines; waitFor waits for one (on each write,
// not on a clock).
type syncBuffer struct {
	mu      sync.Mutex
	buf     bytes.Buffer
	written chan struct{}
}

func (b *syncBuffer) Write(p []byte) (int, error) {
	b.mu.Lock()
	defer b.mu.Unlock()
	if b.written != nil {
		close(b.written)
		b.written = nil
	}
	return b.buf.Write(p)
}

func (b *syncBuffer) waitFor(t *testing.T, sub string) {
	t.Helper()
	deadline := time.After(testDeadline)
	for {
		b.mu.Lock()
		if strings.Contains(b.buf.String(), sub) {
			b.mu.Unlock()
			return
		}
		if b.written == nil {
			b.written = make(chan struct{})
		}
		w := b.written
		b.mu.Unlock()
		select {
		case <-w:
		case <-deadline:
			t.Fatalf("no log line %q; logs:\n%s", sub, b.buf.String())
		}
	}
}

// TestBodyStillComingIsNoRequestInFlight: a request whose body has not
// arrived (a byte of a hundred, then nothing) holds its connection no
// more than a silent connection does: at the address's cap a new
// connection takes the place of the one stalled longest, where before it
// was refused, so one local process trickling bodies locked every other
// out of the server. A request whose body has arrived is in flight, and
// kept.
func TestBodyStillComingIsNoRequestInFlight(t *testing.T) {
	raw, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	ln := Listener(raw, Config{Max: 10, PerAddr: 2, Marked: true})
	reading, held := make(chan struct{}, 16), make(chan struct{}, 1)
	release := make(chan struct{})
	srv := &http.Server{ConnContext: ConnContext, ReadHeaderTimeout: testDeadline,
		Handler: Handler(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
			if r.Method == http.MethodPost {
				reading <- struct{}{}
			}
			if _, err := io.ReadAll(r.Body); err != nil {
				return // the connection was shed
			}
			if r.URL.Path == "/hold" {
				held <- struct{}{}
				<-release
			}
			_, _ = io.WriteString(w, "ok")
		}))}
	go func() { _ = srv.Serve(ln) }()
	t.Cleanup(func() { _ = srv.Close() })
	addr := raw.Addr().String()
	// send writes a request's header and the first part of its body, and
	// waits until its handler reads the body.
	send := func(path, part string, length int) net.Conn {
		c := dialFrom(t, "127.0.0.2", addr)
		if _, err := fmt.Fprintf(c, "POST %s HTTP/1.1\r\nHost: x\r\nContent-Length: %d\r\n\r\n%s", path, length, part); err != nil {
			t.Fatal(err)
		}
		<-reading
		return c
	}
	answered := func(c net.Conn, rest, what string) {
		t.Helper()
		_ = c.SetDeadline(time.Now().Add(testDeadline))
		if _, err := io.WriteString(c, rest); err != nil {
			t.Fatalf("%s: %v", what, err)
		}
		resp, err := http.ReadResponse(bufio.NewReader(c), nil)
		if err != nil {
			t.Fatalf("%s: %v", what, err)
		}
		_ = resp.Body.Close()
	}
	get := func(what string) { answered(dialFrom(t, "127.0.0.2", addr), "GET / HTTP/1.1\r\nHost: x\r\n\r\n", what) }

	first := send("/", "{", 100)
	second := send("/", "{", 100)
	get("a request from an address whose places both hold bodies that never end")
	closedByServer(t, first, "the connection whose body stalled longest")
	get("another")
	closedByServer(t, second, "the other stalled connection")
	// A request whose body arrived whole is in flight: kept, though
	// older than the stalled one that makes room instead.
	released := false
	defer func() {
		if !released {
			close(release)
		}
	}()
	whole := send("/hold", "{}", 2)
	<-held
	stalled := send("/", "{", 100)
	get("a request beside one in flight and one stalled")
	closedByServer(t, stalled, "the stalled connection, for the newcomer")
	close(release)
	released = true
	answered(whole, "", "the request that arrived whole")
	// One that gets the rest of its body is answered.
	late := send("/", "{", 2)
	answered(late, "}", "a request whose body ended late")
}

// TestClientThatStopsReadingMakesRoom: a connection with a request in
// flight whose client has stopped taking the answer (its write waits on
// full buffers) makes room for a newcomer once a write has waited
// stuckWrite, as a silent one does at once. Before, a process that sent
// requests on every place of its address and never read its answers
// (pipelined GETs of the OpenAPI document) refused every other local
// client until their registrations expired. A request in flight whose
// client reads is never shed (TestRequestsInFlightAreNeverShed).
func TestClientThatStopsReadingMakesRoom(t *testing.T) {
	raw, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	ln := Listener(raw, Config{Max: 10, PerAddr: 2, Marked: true})
	writing := make(chan struct{}, 4)
	srv := &http.Server{ConnContext: ConnContext, ReadHeaderTimeout: testDeadline,
		Handler: Handler(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
			if r.URL.Path != "/endless" {
				_, _ = io.WriteString(w, "ok")
				return
			}
			writing <- struct{}{}
			chunk := make([]byte, 64<<10)
			for { // until the connection is closed
				if _, err := w.Write(chunk); err != nil {
					return
				}
			}
		}))}
	go func() { _ = srv.Serve(ln) }()
	t.Cleanup(func() { _ = srv.Close() })
	addr := raw.Addr().String()
	for range 2 {
		c := dialFrom(t, "127.0.0.2", addr)
		if _, err := io.WriteString(c, "GET /endless HTTP/1.1\r\nHost: x\r\n\r\n"); err != nil {
			t.Fatal(err)
		}
		<-writing // and never read
	}
	// Both places hold a request whose client does not read: the
	// newcomer is refused until a write has waited stuckWrite, then
	// takes the place of the one stuck longest.
	tick := time.NewTicker(stuckWrite / 4)
	defer tick.Stop()
	deadline := time.After(testDeadline)
	for attempt := 1; ; attempt++ {
		c := dialFrom(t, "127.0.0.2", addr)
		_ = c.SetDeadline(time.Now().Add(testDeadline))
		_, _ = io.WriteString(c, "GET / HTTP/1.1\r\nHost: x\r\n\r\n")
		resp, err := http.ReadResponse(bufio.NewReader(c), nil)
		if err == nil {
			_ = resp.Body.Close()
			t.Logf("served on attempt %d", attempt)
			return
		}
		select {
		case <-tick.C:
		case <-deadline:
			t.Fatalf("a newcomer beside two clients that stopped reading was still refused after %v: %v", testDeadline, err)
		}
	}
}

// TestDefaultMax leaves most file descriptors to the rest of the process,
// and is never below 256.
func TestDefaultMax(t *testing.T) {
	var rl syscall.Rlimit
	if err := syscall.Getrlimit(syscall.RLIMIT_NOFILE, &rl); err != nil {
		t.Fatal(err)
	}
	n := DefaultMax()
	if n < 256 || (rl.Cur >= 1024 && uint64(n) > rl.Cur/4) {
		t.Errorf("DefaultMax() = %d with an open-file limit of %d; want a quarter of it, at least 256", n, rl.Cur)
	}
}
