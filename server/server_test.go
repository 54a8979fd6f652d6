package server

import (
	"context"
	"encoding/json"
	"fmt"
	"io"
	"net"
	"net/http"
	"os"
	"path/filepath"
	"strings"
	"testing"
	"time"

	"github.com/beaconplane/beacon/backend"
	"github.com/beaconplane/beacon/internal/testkit/etcdtest"
	clientv3 "go.etcd.io/etcd/client/v3"
	"go.uber.org/goleak"
)

func TestMain(m *testing.M) {
	goleak.VerifyTestMain(m, etcdLeakOptions()...)
}

// etcdLeakOptions ignores goroutines the etcd server and gRPC leave behind
// for a moment after Close (they end on their own).
func etcdLeakOptions() []goleak.Option {
	return []goleak.Option{
		goleak.IgnoreTopFunction("go.opencensus.io/stats/view.(*worker).start"),
		goleak.IgnoreAnyFunction("github.com/golang/glog.(*fileSink).flushDaemon"),
		// Peer connections between embedded etcd members of one cluster
		// (discovery_test.go) outlive Close: etcd never closes the idle
		// connections of its peer transport.
		goleak.IgnoreAnyFunction("net/http.(*persistConn).readLoop"),
		goleak.IgnoreAnyFunction("net/http.(*persistConn).writeLoop"),
		goleak.IgnoreAnyFunction("net/http.(*connReader).backgroundRead"),
		goleak.IgnoreAnyFunction("net/http.(*connReader).abortPendingRead"),
		// grpc-go's xDS client (the real client of xds_test.go) never
		// stops the certificate file watcher of the TLS credentials its
		// bootstrap names, not even when its last channel closes.
		goleak.IgnoreAnyFunction("google.golang.org/grpc/credentials/tls/certprovider/pemfile.(*watcher).run"),
	}
}

// testConfig returns a config with free loopback ports and a temp data dir.
func testConfig(t testing.TB) Config {
	t.Helper()
	port := func() int {
		p, err := etcdtest.FreePort()
		if err != nil {
			t.Fatal(err)
		}
		return p
	}
	return Config{
		DataDir:          t.TempDir(),
		ListenClientURLs: []string{fmt.Sprintf("http://127.0.0.1:%d", port())},
		ListenPeerURLs:   []string{fmt.Sprintf("http://127.0.0.1:%d", port())},
		HTTPAddr:         "127.0.0.1:0",
	}
}

func startServer(t testing.TB, cfg Config) *Server {
	t.Helper()
	s, err := New(cfg)
	if err != nil {
		t.Fatal(err)
	}
	ctx, cancel := context.WithTimeout(context.Background(), 60*time.Second)
	defer cancel()
	if err := s.Start(ctx); err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { _ = s.Close() })
	return s
}

func get(t *testing.T, url string) (int, string) {
	t.Helper()
	resp, err := http.Get(url)
	if err != nil {
		t.Fatal(err)
	}
	defer resp.Body.Close()
	b, err := io.ReadAll(resp.Body)
	if err != nil {
		t.Fatal(err)
	}
	return resp.StatusCode, string(b)
}

func TestEmbeddedEtcdServesEtcdClientsAndHTTP(t *testing.T) {
	s := startServer(t, testConfig(t))
	ep := s.Endpoints()
	if len(ep.ClientURLs) != 1 || ep.HTTP == "" {
		t.Fatalf("endpoints: %+v", ep)
	}

	// Any etcd v3 client works against the embedded etcd unchanged.
	cli, err := clientv3.New(clientv3.Config{Endpoints: ep.ClientURLs, DialTimeout: 5 * time.Second})
	if err != nil {
		t.Fatal(err)
	}
	defer cli.Close()
	ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
	defer cancel()
	if _, err := cli.Put(ctx, "/hello", "world"); err != nil {
		t.Fatal(err)
	}
	// The server's own store sees the client's write.
	kv, err := s.Store().Get(ctx, "/hello")
	if err != nil || string(kv.Value) != "world" {
		t.Fatalf("store Get: %q, %v", kv.Value, err)
	}

	if code, body := get(t, ep.HTTP+"/healthz"); code != 200 || body != "ok\n" {
		t.Errorf("/healthz = %d %q", code, body)
	}
	code, body := get(t, ep.HTTP+"/readyz")
	var ready readiness
	if err := json.Unmarshal([]byte(body), &ready); err != nil || code != 200 || ready.Status != "ok" || ready.Checks["etcd"] != "ok" {
		t.Errorf("/readyz = %d %s", code, body)
	}
	code, body = get(t, ep.HTTP+"/metrics")
	for _, want := range []string{"etcd_server_has_leader 1", "go_goroutines"} {
		if code != 200 || !strings.Contains(body, want) {
			t.Errorf("/metrics (%d) lacks %q", code, want)
		}
	}
	if !strings.Contains(s.Banner(), ep.ClientURLs[0]) || !strings.Contains(s.Banner(), ep.HTTP) {
		t.Errorf("banner lacks the endpoints:\n%s", s.Banner())
	}
	if err := s.Close(); err != nil {
		t.Fatalf("Close: %v", err)
	}
	if err := s.Close(); err != nil {
		t.Fatalf("second Close: %v", err)
	}
}

func TestRestartKeepsData(t *testing.T) {
	cfg := testConfig(t)
	s := startServer(t, cfg)
	ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
	defer cancel()
	if _, err := s.Store().Put(ctx, "/k", []byte("v")); err != nil {
		t.Fatal(err)
	}
	if err := s.Close(); err != nil {
		t.Fatal(err)
	}
	s2 := startServer(t, cfg)
	if kv, err := s2.Store().Get(ctx, "/k"); err != nil || string(kv.Value) != "v" {
		t.Fatalf("after restart: %q, %v", kv.Value, err)
	}
}

func TestMemoryBackendRunsWithoutEtcd(t *testing.T) {
	cfg := Config{HTTPAddr: "127.0.0.1:0", Backend: backend.Config{Name: backend.Memory}}
	s := startServer(t, cfg)
	if ep := s.Endpoints(); len(ep.ClientURLs) != 0 || ep.Backend != "memory" {
		t.Fatalf("endpoints: %+v", ep)
	}
	if code, body := get(t, s.Endpoints().HTTP+"/readyz"); code != 200 {
		t.Fatalf("/readyz = %d %s", code, body)
	}
	if strings.Contains(s.Banner(), "etcd clients") {
		t.Errorf("banner mentions etcd without etcd:\n%s", s.Banner())
	}
}

func TestStartErrors(t *testing.T) {
	t.Run("http port in use", func(t *testing.T) {
		ln, err := net.Listen("tcp", "127.0.0.1:0")
		if err != nil {
			t.Fatal(err)
		}
		defer ln.Close()
		cfg := testConfig(t)
		cfg.HTTPAddr = ln.Addr().String()
		err = startErr(t, cfg)
		if !strings.Contains(err.Error(), "address already in use") || !strings.Contains(err.Error(), "Config.HTTPAddr") {
			t.Fatalf("error %q does not explain the port in use", err)
		}
	})
	t.Run("etcd client port in use", func(t *testing.T) {
		ln, err := net.Listen("tcp", "127.0.0.1:0")
		if err != nil {
			t.Fatal(err)
		}
		defer ln.Close()
		cfg := testConfig(t)
		cfg.ListenClientURLs = []string{"http://" + ln.Addr().String()}
		err = startErr(t, cfg)
		if !strings.Contains(err.Error(), "in use") || !strings.Contains(err.Error(), "Config.ListenClientURLs") {
			t.Fatalf("error %q does not explain the port in use", err)
		}
	})
	t.Run("data dir is a file", func(t *testing.T) {
		cfg := testConfig(t)
		cfg.DataDir = filepath.Join(t.TempDir(), "file")
		if err := os.WriteFile(cfg.DataDir, nil, 0o600); err != nil {
			t.Fatal(err)
		}
		err := startErr(t, cfg)
		if !strings.Contains(err.Error(), "Config.DataDir") || !strings.Contains(err.Error(), "not a directory") {
			t.Fatalf("error %q does not explain the data dir", err)
		}
	})
	t.Run("data dir under a file", func(t *testing.T) {
		cfg := testConfig(t)
		f := filepath.Join(t.TempDir(), "file")
		if err := os.WriteFile(f, nil, 0o600); err != nil {
			t.Fatal(err)
		}
		cfg.DataDir = filepath.Join(f, "data")
		if err := startErr(t, cfg); !strings.Contains(err.Error(), "cannot be created") {
			t.Fatalf("error %q does not explain the data dir", err)
		}
	})
	t.Run("external etcd unreachable", func(t *testing.T) {
		port, _ := etcdtest.FreePort()
		cfg := Config{HTTPAddr: "127.0.0.1:0", EtcdEndpoints: []string{fmt.Sprintf("http://127.0.0.1:%d", port)}}
		cfg.Backend.Etcd.DialTimeout = time.Second
		start := time.Now()
		err := startErr(t, cfg)
		if !strings.Contains(err.Error(), fmt.Sprint(port)) {
			t.Fatalf("error %q does not name the endpoint", err)
		}
		if took := time.Since(start); took > 10*time.Second {
			t.Fatalf("unreachable etcd took %v to fail", took)
		}
	})
}

func startErr(t *testing.T, cfg Config) error {
	t.Helper()
	s, err := New(cfg)
	if err != nil {
		return err
	}
	ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
	defer cancel()
	err = s.Start(ctx)
	if err == nil {
		_ = s.Close()
		t.Fatal("Start succeeded")
	}
	return err
}

func TestValidate(t *testing.T) {
	tests := []struct {
		name string
		cfg  Config
		want string
	}{
		{"defaults", Config{}, ""},
		{"bad scheme", Config{ListenClientURLs: []string{"tcp://127.0.0.1:2379"}}, "scheme must be http or https"},
		{"no port", Config{ListenPeerURLs: []string{"http://127.0.0.1"}}, "host and a port"},
		{"unspecified advertise", Config{ListenClientURLs: []string{"http://0.0.0.0:2379"}}, "advertised URL must be reachable"},
		{"listen on all is fine", Config{ListenClientURLs: []string{"http://0.0.0.0:2379"}, AdvertiseClientURLs: []string{"http://10.0.0.1:2379"}}, ""},
		{"cluster state", Config{InitialClusterState: "old"}, "must be new or existing"},
		{"name", Config{Name: "a b"}, "Config.Name"},
		{"http addr", Config{HTTPAddr: "9379"}, "Config.HTTPAddr"},
		{"backend", Config{Backend: backend.Config{Name: "zookeeper"}}, "unknown"},
		{"kubernetes", Config{Backend: backend.Config{Name: "kubernetes"}}, "not linked into this program"},
		{"endpoints with memory", Config{EtcdEndpoints: []string{"http://h:2379"}, Backend: backend.Config{Name: "memory"}}, "choose one"},
	}
	for _, tt := range tests {
		err := tt.cfg.Validate()
		if tt.want == "" {
			if err != nil {
				t.Errorf("%s: %v", tt.name, err)
			}
			continue
		}
		if err == nil || !strings.Contains(err.Error(), tt.want) {
			t.Errorf("%s: error %v, want %q", tt.name, err, tt.want)
		}
	}
}

func TestRegistryAPIOverEmbeddedEtcd(t *testing.T) {
	s := startServer(t, testConfig(t))
	base := s.Endpoints().HTTP
	resp, err := http.Post(base+"/v1/registry/instances", "application/json",
		strings.NewReader(`{"namespace":"prod","component":"api","endpoint":"http","id":"00000000000000a1","address":"10.0.0.1:80","ttl":"20s"}`))
	if err != nil {
		t.Fatal(err)
	}
	b, _ := io.ReadAll(resp.Body)
	resp.Body.Close()
	if resp.StatusCode != 201 {
		t.Fatalf("register: %d %s", resp.StatusCode, b)
	}
	// Any etcd client sees the instance at its documented key, bound to a
	// lease of the requested TTL.
	cli, err := clientv3.New(clientv3.Config{Endpoints: s.Endpoints().ClientURLs, DialTimeout: 5 * time.Second})
	if err != nil {
		t.Fatal(err)
	}
	defer cli.Close()
	ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
	defer cancel()
	gr, err := cli.Get(ctx, "/services/prod/api/http/00000000000000a1")
	if err != nil || len(gr.Kvs) != 1 || !strings.Contains(string(gr.Kvs[0].Value), `"address":"10.0.0.1:80"`) {
		t.Fatalf("etcd Get: %v %v", gr, err)
	}
	ttl, err := cli.TimeToLive(ctx, clientv3.LeaseID(gr.Kvs[0].Lease))
	if err != nil || ttl.GrantedTTL != 20 {
		t.Fatalf("lease: %+v %v", ttl, err)
	}
}

// TestListenersNeedTheirOwnAddresses: two listeners given one address
// are refused when the config is checked, naming both: the second failed
// at start as "address already in use (is another beacon serve
// running?)", which it was not.
func TestListenersNeedTheirOwnAddresses(t *testing.T) {
	cfg := testConfig(t)
	cfg.HTTPAddr = "127.0.0.1:31998"
	cfg.XDS.Addr = "127.0.0.1:31998"
	err := cfg.Validate()
	if err == nil || !strings.Contains(err.Error(), "Config.HTTPAddr and Config.XDS.Addr are both 127.0.0.1:31998") {
		t.Fatalf("Validate: %v", err)
	}
	cfg.XDS.Addr = "127.0.0.1:0"
	cfg.HTTPAddr = "127.0.0.1:0"
	if err := cfg.Validate(); err != nil {
		t.Fatalf("two listeners on port 0: %v", err)
	}
}
