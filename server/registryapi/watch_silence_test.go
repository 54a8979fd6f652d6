package registryapi

import (
	"bufio"
	"context"
	"encoding/json"
	"fmt"
	"io"
	"log/slog"
	"net"
	"net/http"
	"net/http/httptest"
	"strings"
	"sync"
	"syscall"
	"testing"
	"time"

	"github.com/beaconplane/beacon"
	"github.com/beaconplane/beacon/registry"
	"github.com/beaconplane/beacon/store/memory"
	"github.com/prometheus/client_golang/prometheus"
	"github.com/prometheus/client_golang/prometheus/testutil"
)

// signalHandler closes seen at the first record whose message contains
// want, and drops every record.
type signalHandler struct {
	want string
	once *sync.Once
	seen chan struct{}
}

func (signalHandler) Enabled(context.Context, slog.Level) bool { return true }
func (h signalHandler) WithAttrs([]slog.Attr) slog.Handler     { return h }
func (h signalHandler) WithGroup(string) slog.Handler          { return h }

func (h signalHandler) Handle(ctx context.Context, r slog.Record) error {
	if strings.Contains(r.Message, h.want) {
		h.once.Do(func() { close(h.seen) })
	}
	return nil
}

// TestWatchDropsClientThatStopsReading: a watch client that stops reading
// (its socket buffers fill) is dropped once a write has waited one
// keep-alive interval and streamWriteTimeout (30 s), with a log line, and its registry watcher is
// released, instead of the handler blocking on it forever.
func TestWatchDropsClientThatStopsReading(t *testing.T) {
	t.Parallel()
	st := memory.New(memory.Config{})
	metrics := prometheus.NewRegistry()
	reg, err := registry.New(st, registry.Config{Metrics: metrics})
	if err != nil {
		t.Fatal(err)
	}
	const interval = 200 * time.Millisecond
	dropped := signalHandler{want: "did not take a write in time",
		once: new(sync.Once), seen: make(chan struct{})}
	h, err := New(reg, Config{KeepAliveInterval: interval, Metrics: metrics, Logger: slog.New(dropped)})
	if err != nil {
		t.Fatal(err)
	}
	srv := httptest.NewServer(h)
	defer func() {
		srv.Close()
		_ = reg.Close()
		_ = st.Close()
	}()
	ctx, cancel := context.WithTimeout(context.Background(), 90*time.Second)
	defer cancel()
	// A snapshot of several megabytes: far more than socket buffers hold.
	registerBig(ctx, t, reg, 1500)
	// A client with a tiny receive buffer that sends its request and
	// never reads.
	conn := dialSmallBuffer(ctx, t, srv.Listener.Addr().String(), 4096)
	defer conn.Close()
	fmt.Fprintf(conn, "GET %s?namespace=big HTTP/1.1\r\nHost: x\r\n\r\n", WatchPath)
	// The stream blocks on the full socket and is dropped with a log line.
	select {
	case <-dropped.seen:
	case <-ctx.Done():
		t.Fatal("the stream of a client that stopped reading was not dropped")
	}
	// Its handler returned (Close waits for active requests), releasing
	// its registry watcher.
	srv.Close()
	if n := testutil.ToFloat64(h.m.watches); n != 0 {
		t.Fatalf("%v watch streams open", n)
	}
	if n, err := testutil.GatherAndCount(metrics, "beacon_registry_watchers"); err != nil || n != 1 {
		t.Fatalf("watchers gauge: %d series, %v", n, err)
	}
	mfs, err := metrics.Gather()
	if err != nil {
		t.Fatal(err)
	}
	for _, mf := range mfs {
		if mf.GetName() == "beacon_registry_watchers" && mf.GetMetric()[0].GetGauge().GetValue() != 0 {
			t.Fatalf("registry watchers still open: %v", mf.GetMetric()[0].GetGauge().GetValue())
		}
	}
}

// registerBig registers n instances of big/api/http with 3.5 KB of
// metadata each: a snapshot of n × 3.6 KB.
func registerBig(ctx context.Context, t *testing.T, reg *registry.StoreRegistry, n int) {
	t.Helper()
	md := map[string]string{"pad": strings.Repeat("x", 3500)}
	for i := range n {
		if _, err := reg.Register(ctx, beacon.Instance{Namespace: "big", Component: "api", Endpoint: "http",
			Address: fmt.Sprintf("10.%d.%d.1:80", i/250, i%250), Metadata: md}); err != nil {
			t.Fatal(err)
		}
	}
}

// smallSendBuffers gives every accepted connection a small kernel send
// buffer, so that what a client has not read stays in the server.
type smallSendBuffers struct{ net.Listener }

func (l smallSendBuffers) Accept() (net.Conn, error) {
	c, err := l.Listener.Accept()
	if tc, ok := c.(*net.TCPConn); ok {
		_ = tc.SetWriteBuffer(16 << 10)
	}
	return c, err
}

// pacedReader reads at most n bytes per tick: a client on a slow link.
type pacedReader struct {
	r    io.Reader
	n    int
	tick <-chan time.Time
}

func (p pacedReader) Read(b []byte) (int, error) {
	<-p.tick
	return p.r.Read(b[:min(len(b), p.n)])
}

// TestWatchSlowSteadyClientGetsLargeSnapshot: a snapshot far larger than
// what a slow client reads within one write deadline still reaches a
// client that keeps reading: the stream is ended for a client that stops
// taking data, not for one whose event is larger than one deadline covers.
func TestWatchSlowSteadyClientGetsLargeSnapshot(t *testing.T) {
	t.Parallel()
	st := memory.New(memory.Config{})
	reg, err := registry.New(st, registry.Config{})
	if err != nil {
		t.Fatal(err)
	}
	dropped := signalHandler{want: "did not take a write in time", once: new(sync.Once), seen: make(chan struct{})}
	h, err := New(reg, Config{KeepAliveInterval: 200 * time.Millisecond, Logger: slog.New(dropped)})
	if err != nil {
		t.Fatal(err)
	}
	// One write may wait 0.5 s; the snapshot takes about 2 s to read.
	h.writeTimeout = 300 * time.Millisecond
	srv := httptest.NewUnstartedServer(h)
	srv.Listener = smallSendBuffers{srv.Listener}
	srv.Start()
	defer func() {
		srv.Close()
		_ = reg.Close()
		_ = st.Close()
	}()
	ctx, cancel := context.WithTimeout(context.Background(), 60*time.Second)
	defer cancel()
	const n = 850 // about 3 MB
	registerBig(ctx, t, reg, n)
	conn := dialSmallBuffer(ctx, t, srv.Listener.Addr().String(), 32<<10)
	defer conn.Close()
	_ = conn.SetDeadline(time.Now().Add(50 * time.Second))
	fmt.Fprintf(conn, "GET %s?namespace=big HTTP/1.1\r\nHost: x\r\n\r\n", WatchPath)
	tick := time.NewTicker(20 * time.Millisecond)
	defer tick.Stop()
	br := bufio.NewReaderSize(pacedReader{r: conn, n: 32 << 10, tick: tick.C}, 32<<10)
	resp, err := http.ReadResponse(br, nil)
	if err != nil {
		t.Fatal(err)
	}
	// The stream never ends by itself: closing the connection ends the
	// body, which Close alone would drain.
	defer func() { _ = conn.Close(); _ = resp.Body.Close() }()
	body := bufio.NewReaderSize(resp.Body, 64<<10)
	start := time.Now()
	for {
		line, err := body.ReadString('\n')
		if err != nil {
			t.Fatalf("stream ended before the snapshot, after %v: %v", time.Since(start), err)
		}
		if !strings.HasPrefix(line, "data: ") {
			continue
		}
		var snap SnapshotMessage
		if err := json.Unmarshal([]byte(line[len("data: "):]), &snap); err != nil {
			t.Fatalf("snapshot data (%d bytes): %v", len(line), err)
		}
		if len(snap.Instances) != n {
			t.Fatalf("snapshot of %d instances, want %d", len(snap.Instances), n)
		}
		t.Logf("a snapshot of %d bytes read in %v", len(line), time.Since(start))
		break
	}
	select {
	case <-dropped.seen:
		t.Fatal("the stream of a client that kept reading was dropped")
	default:
	}
}

// dialSmallBuffer connects to addr with a receive buffer of rcvbuf bytes,
// so that a server writing to a client that reads slowly (or not at all)
// blocks soon.
func dialSmallBuffer(ctx context.Context, t *testing.T, addr string, rcvbuf int) net.Conn {
	t.Helper()
	d := net.Dialer{Control: func(_, _ string, c syscall.RawConn) error {
		var serr error
		err := c.Control(func(fd uintptr) { serr = syscall.SetsockoptInt(int(fd), syscall.SOL_SOCKET, syscall.SO_RCVBUF, rcvbuf) })
		if err != nil {
			return err
		}
		return serr
	}}
	conn, err := d.DialContext(ctx, "tcp", addr)
	if err != nil {
		t.Fatal(err)
	}
	return conn
}

// TestWatchBlockedOnAClientThatDoesNotReadEndsWhenTheServerCloses: a
// stream blocked writing to a client that does not read ends within
// httpapi.EndGrace once the server closes (its base context canceled with
// http.ErrServerClosed), however long its own write deadline: a shutdown
// does not wait for a client that does not read. Here each write may wait
// an hour, so only the server's closing can end it.
func TestWatchBlockedOnAClientThatDoesNotReadEndsWhenTheServerCloses(t *testing.T) {
	t.Parallel()
	st := memory.New(memory.Config{})
	reg, err := registry.New(st, registry.Config{})
	if err != nil {
		t.Fatal(err)
	}
	defer func() { _ = reg.Close(); _ = st.Close() }()
	h, err := New(reg, Config{KeepAliveInterval: time.Hour})
	if err != nil {
		t.Fatal(err)
	}
	h.writeTimeout = time.Hour
	ctx, cancel := context.WithTimeout(context.Background(), 90*time.Second)
	defer cancel()
	registerBig(ctx, t, reg, 1500)
	base, closeServer := context.WithCancelCause(context.Background())
	defer closeServer(nil)
	returned := make(chan struct{})
	srv := httptest.NewUnstartedServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		defer close(returned)
		h.ServeHTTP(w, r)
	}))
	srv.Config.BaseContext = func(net.Listener) context.Context { return base }
	srv.Listener = smallSendBuffers{srv.Listener}
	srv.Start()
	defer srv.Close()

	conn := dialSmallBuffer(ctx, t, srv.Listener.Addr().String(), 4096)
	defer conn.Close()
	fmt.Fprintf(conn, "GET %s?namespace=big HTTP/1.1\r\nHost: x\r\n\r\n", WatchPath)
	// The stream's header arrives; then the client reads nothing more,
	// and the handler blocks writing the snapshot of megabytes.
	resp, err := http.ReadResponse(bufio.NewReader(conn), nil)
	if err != nil || resp.StatusCode != http.StatusOK {
		t.Fatalf("the watch: %v, %v", resp, err)
	}
	closeServer(http.ErrServerClosed)
	select {
	case <-returned:
	case <-ctx.Done():
		t.Fatal("the stream blocked on a client that does not read did not end when the server closed")
	}
}
