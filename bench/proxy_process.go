package bench

import (
	"bufio"
	"bytes"
	"context"
	"fmt"
	"io"
	"net"
	"net/http"
	"os/exec"

	"strconv"
	"strings"
	"sync"
	"syscall"
	"time"

	"github.com/beaconplane/beacon/internal/freeport"
	"github.com/beaconplane/beacon/proxy"
	"github.com/prometheus/client_golang/prometheus"
)

// proxyUnderTest is the proxy the scenario measures, in this process or in
// a child process.
type proxyUnderTest interface {
	addr() string
	stats(ctx context.Context) (proxy.Stats, error)
	// heap is the proxy's own heap in bytes (0 when it shares this
	// process's heap, which liveHeap already counts).
	heap(ctx context.Context) float64
	stop()
}

type inProcess struct {
	p    *proxy.Proxy
	errc chan error
}

func startProxyInProcess(ctx context.Context, eps []string) (proxyUnderTest, error) {
	p, err := proxy.New(proxy.Config{Endpoints: eps, Registry: prometheus.NewRegistry()})
	if err != nil {
		return nil, err
	}
	l, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		return nil, err
	}
	ip := &inProcess{p: p, errc: make(chan error, 1)}
	go func() { ip.errc <- p.Serve(ctx, l) }()
	select {
	case <-p.Ready():
		return ip, nil
	case err := <-ip.errc:
		return nil, err
	}
}

func (ip *inProcess) addr() string                               { return ip.p.Addr().String() }
func (ip *inProcess) stats(context.Context) (proxy.Stats, error) { return ip.p.Stats(), nil }
func (ip *inProcess) heap(context.Context) float64               { return 0 }
func (ip *inProcess) stop() {
	_ = ip.p.Close()
	<-ip.errc //nolint:errcheck // what Serve returns after Close is of no interest
}

// child is a proxy running as its own process.
type child struct {
	cmd    *exec.Cmd
	listen string
	done   chan struct{}
	stderr *syncBuf
	client *http.Client
}

func startProxyProcess(ctx context.Context, command []string, eps []string) (proxyUnderTest, error) {
	port, err := freeport.Port()
	if err != nil {
		return nil, err
	}
	listen := "127.0.0.1:" + strconv.Itoa(port)
	args := append(append([]string{}, command[1:]...), "--endpoints", strings.Join(eps, ","), "--listen-addr", listen, "--log-level", "warn")
	cmd := exec.Command(command[0], args...)
	out, err := cmd.StdoutPipe()
	if err != nil {
		return nil, err
	}
	c := &child{cmd: cmd, listen: listen, done: make(chan struct{}), stderr: &syncBuf{}, client: &http.Client{Timeout: 5 * time.Second}}
	cmd.Stderr = c.stderr
	if err := cmd.Start(); err != nil {
		return nil, err
	}
	ready := make(chan struct{})
	go func() {
		sc := bufio.NewScanner(out)
		signalled := false
		for sc.Scan() {
			if !signalled && strings.Contains(sc.Text(), "serving on") {
				close(ready)
				signalled = true
			}
		}
		_, _ = io.Copy(io.Discard, out)
	}()
	go func() { _ = cmd.Wait(); close(c.done) }()
	select {
	case <-ready:
		return c, nil
	case <-c.done:
		return nil, fmt.Errorf("proxy process exited: %s", strings.TrimSpace(c.stderr.String()))
	case <-time.After(30 * time.Second):
		c.stop()
		return nil, fmt.Errorf("proxy process not serving after 30s: %s", strings.TrimSpace(c.stderr.String()))
	case <-ctx.Done():
		c.stop()
		return nil, ctx.Err()
	}
}

func (c *child) addr() string { return c.listen }

// metric reads one unlabelled series from the child's /metrics.
func (c *child) metrics(ctx context.Context) (map[string]float64, error) {
	req, err := http.NewRequestWithContext(ctx, http.MethodGet, "http://"+c.listen+"/metrics", nil)
	if err != nil {
		return nil, err
	}
	resp, err := c.client.Do(req)
	if err != nil {
		return nil, err
	}
	defer resp.Body.Close()
	out := map[string]float64{}
	sc := bufio.NewScanner(resp.Body)
	sc.Buffer(make([]byte, 64<<10), 1<<20)
	for sc.Scan() {
		f := strings.Fields(sc.Text())
		if len(f) == 2 && !strings.HasPrefix(f[0], "#") {
			if v, err := strconv.ParseFloat(f[1], 64); err == nil {
				out[f[0]] = v
			}
		}
	}
	return out, sc.Err()
}

func (c *child) stats(ctx context.Context) (proxy.Stats, error) {
	m, err := c.metrics(ctx)
	if err != nil {
		return proxy.Stats{}, err
	}
	return proxy.Stats{
		ClientWatchers:  int(m["beacon_proxy_client_watchers"]),
		UpstreamWatches: int(m["beacon_proxy_upstream_watches"]),
	}, nil
}

func (c *child) heap(ctx context.Context) float64 {
	m, err := c.metrics(ctx)
	if err != nil {
		return 0
	}
	return m["go_memstats_heap_inuse_bytes"]
}

func (c *child) stop() {
	_ = c.cmd.Process.Signal(syscall.SIGTERM)
	select {
	case <-c.done:
	case <-time.After(10 * time.Second):
		_ = c.cmd.Process.Kill()
		<-c.done
	}
	c.client.CloseIdleConnections()
}

type syncBuf struct {
	mu sync.Mutex
	b  bytes.Buffer
}

func (s *syncBuf) Write(p []byte) (int, error) {
	s.mu.Lock()
	defer s.mu.Unlock()
	return s.b.Write(p)
}

func (s *syncBuf) String() string {
	s.mu.Lock()
	defer s.mu.Unlock()
	return s.b.String()
}
