package proxy

import (
	"bufio"
	"context"
	"io"
	"net/http"
	"strings"
	"testing"

	"github.com/beaconplane/beacon/internal/etcdtest"
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
