package proxy

import (
	"context"
	"encoding/json"
	"errors"
	"net"
	"net/http"
	"net/http/httptest"
	"strings"
	"testing"
	"time"

	"github.com/beaconplane/beacon/internal/testkit/etcdtest"
	"google.golang.org/grpc"
)

// notEtcd starts three listeners that are not etcd: an HTTP server, a gRPC
// server without etcd's services, and a port that accepts connections and
// never answers. It returns their client URLs.
func notEtcd(t *testing.T) []string {
	t.Helper()
	web := httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, _ *http.Request) {
		http.Error(w, "not etcd", http.StatusNotFound)
	}))
	t.Cleanup(web.Close)

	gl := mustListen(t)
	gs := grpc.NewServer()
	go func() { _ = gs.Serve(gl) }()
	t.Cleanup(gs.Stop)

	silent := mustListen(t)
	done := make(chan struct{})
	t.Cleanup(func() { close(done); _ = silent.Close() })
	go func() {
		var conns []net.Conn
		defer func() {
			for _, c := range conns {
				_ = c.Close()
			}
		}()
		for {
			c, err := silent.Accept()
			if err != nil {
				return
			}
			conns = append(conns, c)
		}
	}()
	return []string{web.URL, "http://" + gl.Addr().String(), "http://" + silent.Addr().String()}
}

// TestNotEtcdIsNeverAvailable: a listener that accepts connections but is
// not etcd is never an available endpoint: a proxy pointed only at such
// listeners does not start (it says why), and beside a real member it is
// reported failed, with the reason, while the member serves.
func TestNotEtcdIsNeverAvailable(t *testing.T) {
	t.Parallel()
	others := notEtcd(t)

	p, err := New(Config{Endpoints: others, StartTimeout: 3 * time.Second, Logger: testLogger(t)})
	if err != nil {
		t.Fatal(err)
	}
	err = p.Serve(context.Background(), mustListen(t))
	if !errors.Is(err, ErrNoMembers) || !strings.Contains(err.Error(), "not etcd") || !strings.Contains(err.Error(), "did not answer as etcd") {
		t.Fatalf("proxy of listeners that are not etcd: Serve = %v", err)
	}

	srv := etcdtest.Start(t, etcdtest.Options{})
	p = startProxy(t, Config{Endpoints: append([]string{srv.Endpoint()}, others...)})
	for _, e := range p.Endpoints() {
		want := "failed"
		if e.URL == srv.Endpoint() {
			want = "available"
		}
		if e.State != want {
			t.Errorf("endpoint %s: state %s (%s), want %s", e.URL, e.State, e.LastError, want)
		}
	}
	hc := httpClient(t)
	resp, err := hc.Get("http://" + p.Addr().String() + PathEndpoints)
	if err != nil {
		t.Fatal(err)
	}
	var body struct {
		Endpoints []EndpointStatus `json:"endpoints"`
	}
	err = json.NewDecoder(resp.Body).Decode(&body)
	resp.Body.Close()
	if err != nil {
		t.Fatal(err)
	}
	eps := body.Endpoints
	available := 0
	for _, e := range eps {
		if e.State == "available" {
			available++
			if e.URL != srv.Endpoint() {
				t.Errorf("%s reported available: %+v", e.URL, e)
			}
		} else if e.LastError == "" {
			t.Errorf("%s is %s without a reason", e.URL, e.State)
		}
	}
	if available != 1 {
		t.Errorf("%s: %d available, want 1: %+v", PathEndpoints, available, eps)
	}
	if _, err := proxyClient(t, p).Put(ctxT(t), "k", "v"); err != nil {
		t.Fatalf("put through the proxy: %v", err)
	}
}
