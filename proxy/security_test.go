package proxy

import (
	"bytes"
	"crypto/tls"
	"crypto/x509"
	"encoding/base64"
	"encoding/json"
	"io"
	"log/slog"
	"net/http"
	"os"
	"strings"
	"testing"
	"time"

	"github.com/beaconplane/beacon/internal/syncbuf"
	"github.com/beaconplane/beacon/internal/testkit/etcdtest"
	"github.com/beaconplane/beacon/internal/testkit/testcerts"
	"github.com/beaconplane/beacon/internal/tlsfiles"
	pb "go.etcd.io/etcd/api/v3/etcdserverpb"
	clientv3 "go.etcd.io/etcd/client/v3"
	"go.etcd.io/etcd/server/v3/embed"
	"go.uber.org/zap"
	"golang.org/x/crypto/bcrypt"
	"google.golang.org/grpc/codes"
	"google.golang.org/grpc/status"
)

func clientTLS(t *testing.T, caFile string, leaf *testcerts.Leaf, serverName string) *tls.Config {
	t.Helper()
	pem, err := os.ReadFile(caFile)
	if err != nil {
		t.Fatal(err)
	}
	pool := x509.NewCertPool()
	pool.AppendCertsFromPEM(pem)
	c := &tls.Config{RootCAs: pool, ServerName: serverName, MinVersion: tls.VersionTLS12}
	if leaf != nil {
		cert, err := tls.LoadX509KeyPair(leaf.Cert, leaf.Key)
		if err != nil {
			t.Fatal(err)
		}
		c.GetClientCertificate = func(*tls.CertificateRequestInfo) (*tls.Certificate, error) { return &cert, nil }
	}
	return c
}

// TestListenerMutualTLS serves the proxy over mutual TLS (its listener
// certificate and client CA re-read when they change) and checks the
// ways a client can get TLS wrong, each with a clear error on both sides.
func TestListenerMutualTLS(t *testing.T) {
	t.Parallel()
	dir := t.TempDir()
	ca, err := testcerts.NewCA(dir, "ca")
	if err != nil {
		t.Fatal(err)
	}
	other, err := testcerts.NewCA(dir, "other")
	if err != nil {
		t.Fatal(err)
	}
	srvLeaf, err := ca.Issue("proxy", testcerts.LeafOptions{Server: true})
	if err != nil {
		t.Fatal(err)
	}
	good, err := ca.Issue("client", testcerts.LeafOptions{CommonName: "app", Client: true})
	if err != nil {
		t.Fatal(err)
	}
	stranger, err := other.Issue("stranger", testcerts.LeafOptions{CommonName: "app", Client: true})
	if err != nil {
		t.Fatal(err)
	}
	expired, err := ca.Issue("expired", testcerts.LeafOptions{CommonName: "app", Client: true, NotBefore: time.Now().Add(-48 * time.Hour), NotAfter: time.Now().Add(-time.Hour)})
	if err != nil {
		t.Fatal(err)
	}
	r, err := tlsfiles.NewReloader(tlsfiles.Files{CertFile: srvLeaf.Cert, KeyFile: srvLeaf.Key, TrustedCAFile: ca.File, ClientCertAuth: true}, tlsfiles.Config{})
	if err != nil {
		t.Fatal(err)
	}
	upstream := etcdtest.Start(t, etcdtest.Options{})
	logs := &syncbuf.Buffer{}
	p := startProxy(t, Config{Endpoints: upstream.Endpoints(), ServerTLS: r.ServerConfig("h2", "http/1.1"),
		Logger: slog.New(slog.NewTextHandler(logs, nil))})
	addr := p.Addr().String()
	ctx := ctxT(t)

	dial := func(cfg *tls.Config) error {
		cli, err := clientv3.New(clientv3.Config{Endpoints: []string{"https://" + addr}, TLS: cfg, DialTimeout: 3 * time.Second, Logger: zap.NewNop()})
		if err != nil {
			return err
		}
		defer cli.Close()
		_, err = cli.Put(ctx, "k", "v")
		return err
	}
	if err := dial(clientTLS(t, ca.File, &good, "")); err != nil {
		t.Fatalf("mutual TLS with the right certificates: %v", err)
	}
	handshake := func(cfg *tls.Config) error {
		conn, err := tls.Dial("tcp", addr, cfg)
		if err != nil {
			return err
		}
		defer conn.Close()
		_ = conn.SetReadDeadline(time.Now().Add(3 * time.Second))
		_, err = conn.Read(make([]byte, 1))
		if err != nil && strings.Contains(err.Error(), "timeout") {
			return nil
		}
		return err
	}
	for _, c := range []struct {
		name, client, server string
		cfg                  *tls.Config
	}{
		{"untrusted proxy CA", "certificate signed by unknown authority", "bad certificate", clientTLS(t, other.File, &good, "")},
		{"client certificate from another CA", "tls:", "unknown authority", clientTLS(t, ca.File, &stranger, "")},
		{"expired client certificate", "tls:", "expired", clientTLS(t, ca.File, &expired, "")},
		{"no client certificate", "tls:", "didn't provide a certificate", clientTLS(t, ca.File, nil, "")},
		{"wrong server name", "not proxy.example.com", "", clientTLS(t, ca.File, &good, "proxy.example.com")},
	} {
		err := handshake(c.cfg)
		if err == nil || !strings.Contains(err.Error(), c.client) {
			t.Errorf("%s: %v, want an error saying %q", c.name, err, c.client)
		}
		if c.server != "" {
			eventually(t, "the proxy to log "+c.server, func() bool { return strings.Contains(logs.String(), c.server) })
		}
	}
	// Plain text to the TLS port: an HTTP client is told, the server logs.
	resp, err := http.Get("http://" + addr + "/health")
	if err != nil {
		t.Fatal(err)
	}
	b, _ := io.ReadAll(resp.Body)
	resp.Body.Close()
	if resp.StatusCode != http.StatusBadRequest || !strings.Contains(string(b), "HTTPS") {
		t.Fatalf("plain HTTP to the TLS port: %d %s", resp.StatusCode, b)
	}
	eventually(t, "the proxy to log plain HTTP", func() bool { return strings.Contains(logs.String(), "client sent an HTTP request to an HTTPS server") })

	// Rotation: a new certificate is served without a restart.
	before := serial(t, addr, clientTLS(t, ca.File, &good, ""))
	if _, err := ca.Issue("proxy", testcerts.LeafOptions{Server: true}); err != nil {
		t.Fatal(err)
	}
	eventually(t, "the rotated certificate", func() bool { return serial(t, addr, clientTLS(t, ca.File, &good, "")) != before })
	if err := dial(clientTLS(t, ca.File, &good, "")); err != nil {
		t.Fatalf("after rotation: %v", err)
	}
}

func serial(t *testing.T, addr string, cfg *tls.Config) string {
	t.Helper()
	conn, err := tls.Dial("tcp", addr, cfg)
	if err != nil {
		t.Fatal(err)
	}
	defer conn.Close()
	return conn.ConnectionState().PeerCertificates[0].SerialNumber.String()
}

// TestRequestSizeLimits: the proxy does not buffer what etcd would refuse:
// a gRPC request over --max-request-bytes is ResourceExhausted and a
// gateway body over its limit 413, and memory stays bounded.
func TestRequestSizeLimits(t *testing.T) {
	t.Parallel()
	upstream := etcdtest.Start(t, etcdtest.Options{})
	p := startProxy(t, Config{Endpoints: upstream.Endpoints(), MaxRequestBytes: 64 << 10})
	ctx := ctxT(t)
	conn := grpcConn(t, p)
	_, err := pb.NewKVClient(conn).Put(ctx, &pb.PutRequest{Key: []byte("k"), Value: make([]byte, 1<<20)})
	if status.Code(err) != codes.ResourceExhausted {
		t.Fatalf("1 MiB put over a 64 KiB limit: %v", err)
	}
	if _, err := pb.NewKVClient(conn).Put(ctx, &pb.PutRequest{Key: []byte("k"), Value: make([]byte, 32<<10)}); err != nil {
		t.Fatalf("32 KiB put: %v", err)
	}
	body, _ := json.Marshal(map[string]string{"key": base64.StdEncoding.EncodeToString([]byte("k")), "value": base64.StdEncoding.EncodeToString(make([]byte, 2<<20))})
	resp, err := http.Post("http://"+p.Addr().String()+"/v3/kv/put", "application/json", bytes.NewReader(body))
	if err != nil {
		t.Fatal(err)
	}
	b, _ := io.ReadAll(resp.Body)
	resp.Body.Close()
	if resp.StatusCode == http.StatusOK {
		t.Fatalf("2 MiB gateway body accepted: %s", b)
	}
	small, _ := json.Marshal(map[string]string{"key": base64.StdEncoding.EncodeToString([]byte("k2"))})
	resp, err = http.Post("http://"+p.Addr().String()+"/v3/kv/put", "application/json", bytes.NewReader(small))
	if err != nil || resp.StatusCode != http.StatusOK {
		t.Fatalf("small gateway put: %v %v", resp, err)
	}
	resp.Body.Close()
}

// TestReadonlyWithAuthRefusesWrites: behind a readonly proxy, an etcd with
// authentication still refuses every write, for root as for anyone, and
// reads work with the caller's own credentials.
func TestReadonlyWithAuthRefusesWrites(t *testing.T) {
	t.Parallel()
	upstream := etcdtest.Start(t, etcdtest.Options{User: "root", Password: "rootpw",
		Configure: func(c *embed.Config) { c.BcryptCost = uint(bcrypt.MinCost) }})
	p := startProxy(t, Config{Mode: ReadOnly, Endpoints: upstream.Endpoints()})
	ctx := ctxT(t)
	cli, err := clientv3.New(clientv3.Config{Endpoints: []string{p.Addr().String()}, Username: "root", Password: "rootpw", DialTimeout: testTimeout, Logger: zap.NewNop()})
	if err != nil {
		t.Fatalf("authenticate through the readonly proxy: %v", err)
	}
	defer cli.Close()
	if _, err := cli.Get(ctx, "k"); err != nil {
		t.Fatalf("read as root through the readonly proxy: %v", err)
	}
	for name, write := range map[string]func() error{
		"put":      func() error { _, err := cli.Put(ctx, "k", "v"); return err },
		"delete":   func() error { _, err := cli.Delete(ctx, "k"); return err },
		"txn":      func() error { _, err := cli.Txn(ctx).Then(clientv3.OpPut("k", "v")).Commit(); return err },
		"grant":    func() error { _, err := cli.Grant(ctx, 10); return err },
		"user add": func() error { _, err := cli.UserAdd(ctx, "mallory", "x"); return err },
		"role grant": func() error {
			_, err := cli.RoleGrantPermission(ctx, "root", "", "\x00", clientv3.PermissionType(clientv3.PermReadWrite))
			return err
		},
		"auth disable":   func() error { _, err := cli.AuthDisable(ctx); return err },
		"compact":        func() error { _, err := cli.Compact(ctx, 1); return err },
		"member add":     func() error { _, err := cli.MemberAdd(ctx, []string{"http://127.0.0.1:1"}); return err },
		"password reset": func() error { _, err := cli.UserChangePassword(ctx, "root", "owned"); return err },
	} {
		err := write()
		if status.Code(err) != codes.Unimplemented || !strings.Contains(err.Error(), "readonly") {
			t.Errorf("%s as root through the readonly proxy: %v, want Unimplemented naming readonly", name, err)
		}
	}
	// The password did not change: root still authenticates directly.
	direct, err := clientv3.New(upstream.ClientConfig())
	if err != nil {
		t.Fatal(err)
	}
	defer direct.Close()
	if resp, err := direct.Get(ctx, "k"); err != nil || len(resp.Kvs) != 0 {
		t.Fatalf("upstream after the attempts: %v %v", resp, err)
	}
}
