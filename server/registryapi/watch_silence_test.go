package registryapi

import (
	"context"
	"fmt"
	"log/slog"
	"net"
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
	st := memory.New(memory.Options{})
	metrics := prometheus.NewRegistry()
	reg, err := registry.New(st, registry.Config{Metrics: metrics})
	if err != nil {
		t.Fatal(err)
	}
	const interval = 200 * time.Millisecond
	dropped := signalHandler{want: "did not take a write in time",
		once: new(sync.Once), seen: make(chan struct{})}
	h, err := New(reg, Options{KeepAliveInterval: interval, Metrics: metrics, Logger: slog.New(dropped)})
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
	md := map[string]string{"pad": strings.Repeat("x", 3500)}
	for i := range 1500 {
		if _, err := reg.Register(ctx, beacon.Instance{Namespace: "big", Component: "api", Endpoint: "http",
			Address: fmt.Sprintf("10.%d.%d.1:80", i/250, i%250), Metadata: md}); err != nil {
			t.Fatal(err)
		}
	}
	// A client with a tiny receive buffer that sends its request and
	// never reads.
	d := net.Dialer{Control: func(_, _ string, c syscall.RawConn) error {
		var serr error
		err := c.Control(func(fd uintptr) { serr = syscall.SetsockoptInt(int(fd), syscall.SOL_SOCKET, syscall.SO_RCVBUF, 4096) })
		if err != nil {
			return err
		}
		return serr
	}}
	conn, err := d.DialContext(ctx, "tcp", srv.Listener.Addr().String())
	if err != nil {
		t.Fatal(err)
	}
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
