package proxy

import (
	"context"
	"crypto/tls"
	"crypto/x509"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"net/http"
	"os"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/beaconplane/beacon/internal/testkit/etcdtest"
	"go.etcd.io/etcd/api/v3/v3rpc/rpctypes"
	clientv3 "go.etcd.io/etcd/client/v3"
	"go.uber.org/zap"
	"google.golang.org/grpc/metadata"
)

// TestAuthPassthrough: with etcd authentication on, each client's own
// token goes through the proxy (unary calls, watches, keep-alives); a
// client without credentials is refused by etcd, not served by the proxy's
// identity (etcd#10008).
func TestAuthPassthrough(t *testing.T) {
	t.Parallel()
	srv := etcdtest.Start(t, etcdtest.Options{User: "alice", Password: "secret"})
	p := startProxy(t, Config{Endpoints: srv.Endpoints()})
	ctx := ctxT(t)
	cli, err := clientv3.New(clientv3.Config{Endpoints: []string{p.Addr().String()}, Username: "alice", Password: "secret",
		DialTimeout: testTimeout, Logger: zap.NewNop()})
	if err != nil {
		t.Fatalf("authenticate through the proxy: %v", err)
	}
	defer cli.Close()
	if _, err := cli.Put(ctx, "secret", "1"); err != nil {
		t.Fatal(err)
	}
	wch := cli.Watch(ctx, "secret", clientv3.WithCreatedNotify())
	if wr := <-wch; !wr.Created || wr.Err() != nil {
		t.Fatalf("authenticated watch: %+v", wr)
	}
	if _, err := cli.Put(ctx, "secret", "2"); err != nil {
		t.Fatal(err)
	}
	if wr := <-wch; len(wr.Events) != 1 {
		t.Fatalf("authenticated watch event: %+v", wr)
	}
	g, err := cli.Grant(ctx, 5)
	if err != nil {
		t.Fatal(err)
	}
	if _, err := cli.KeepAliveOnce(ctx, g.ID); err != nil {
		t.Fatalf("keep-alive with auth: %v", err)
	}

	anon := proxyClient(t, p)
	if _, err := anon.Get(ctx, "secret"); err == nil || !strings.Contains(err.Error(), rpctypes.ErrUserEmpty.Error()) {
		t.Fatalf("anonymous get through the proxy: %v, want etcd's %q", err, rpctypes.ErrUserEmpty)
	}
	wr := <-anon.Watch(ctx, "secret")
	if !wr.Canceled {
		t.Fatalf("anonymous watch through the proxy was not refused: %+v", wr)
	}
	// The proxy's own health check has no credentials: etcd refusing it
	// still means the cluster is up.
	if err := p.CheckHealth(ctx); err != nil {
		t.Fatalf("health with authentication on: %v", err)
	}
}

// TestTLSBothSides: the proxy reaches a TLS etcd with a client certificate
// and serves its own clients over TLS (gRPC and HTTP on one port).
func TestTLSBothSides(t *testing.T) {
	t.Parallel()
	srv := etcdtest.Start(t, etcdtest.Options{TLS: true})
	certs := srv.Certs()
	serverCert, err := tls.LoadX509KeyPair(certs.ServerCert, certs.ServerKey)
	if err != nil {
		t.Fatal(err)
	}
	p := startProxy(t, Config{Endpoints: srv.Endpoints(), ClientTLS: srv.TLSConfig(),
		ServerTLS: &tls.Config{Certificates: []tls.Certificate{serverCert}, MinVersion: tls.VersionTLS12}})
	caPEM, err := os.ReadFile(certs.CA)
	if err != nil {
		t.Fatal(err)
	}
	roots := x509.NewCertPool()
	roots.AppendCertsFromPEM(caPEM)
	clientTLS := &tls.Config{RootCAs: roots, ServerName: "127.0.0.1", MinVersion: tls.VersionTLS12}
	cli, err := clientv3.New(clientv3.Config{Endpoints: []string{"https://" + p.Addr().String()}, TLS: clientTLS,
		DialTimeout: 5 * time.Second, Logger: zap.NewNop()})
	if err != nil {
		t.Fatal(err)
	}
	defer cli.Close()
	ctx := ctxT(t)
	if _, err := cli.Put(ctx, "k", "v"); err != nil {
		t.Fatalf("put over TLS through the proxy: %v", err)
	}
	hc := &http.Client{Transport: &http.Transport{TLSClientConfig: clientTLS}}
	defer hc.CloseIdleConnections()
	resp, err := hc.Post("https://"+p.Addr().String()+"/v3/kv/range", "application/json", strings.NewReader(`{"key":"aw=="}`))
	if err != nil {
		t.Fatal(err)
	}
	defer resp.Body.Close()
	var out struct {
		Kvs []struct{ Value []byte } `json:"kvs"`
	}
	b, _ := io.ReadAll(resp.Body)
	if err := json.Unmarshal(b, &out); err != nil || len(out.Kvs) != 1 || string(out.Kvs[0].Value) != "v" {
		t.Fatalf("HTTPS gateway range: %d %s %v", resp.StatusCode, b, err)
	}
}

// TestNoIdentityLent: etcd takes the common name of a client certificate
// as the user of a request without a token (--client-cert-auth). The
// proxy's certificate here names an etcd root user; a client of the proxy
// without credentials must still be refused — over gRPC, as a watch, and
// through the JSON gateway — and write nothing, while a client with its
// own credentials works and anonymous clients may still authenticate.
func TestNoIdentityLent(t *testing.T) {
	t.Parallel()
	srv := etcdtest.Start(t, etcdtest.Options{TLS: true, User: "beacon-client", Password: "pw"}) // the client certificate's CN
	p := startProxy(t, Config{Endpoints: srv.Endpoints(), ClientTLS: srv.TLSConfig()})
	ctx := ctxT(t)

	anon := proxyClient(t, p)
	if _, err := anon.Put(ctx, "/services/pwn", "x"); err == nil || !errors.Is(rpctypes.Error(err), rpctypes.ErrUserEmpty) {
		t.Fatalf("anonymous put through a proxy with a root certificate: %v, want %v", err, rpctypes.ErrUserEmpty)
	}
	if _, err := anon.Get(ctx, "/"); err == nil || !errors.Is(rpctypes.Error(err), rpctypes.ErrUserEmpty) {
		t.Fatalf("anonymous get: %v, want %v", err, rpctypes.ErrUserEmpty)
	}
	if _, err := anon.Get(ctx, "/", clientv3.WithSerializable()); err == nil {
		t.Fatal("anonymous serializable get (the cache) was served")
	}
	if _, err := anon.UserList(ctx); err == nil {
		t.Fatal("anonymous user list was served")
	}
	wctx, cancel := context.WithTimeout(ctx, 10*time.Second)
	defer cancel()
	if wr := <-anon.Watch(wctx, "/", clientv3.WithPrefix()); !wr.Canceled && wr.Err() == nil {
		t.Fatalf("anonymous watch was served: %+v", wr)
	}
	if code, b := anonymousGatewayPut(t, p); code == http.StatusOK {
		t.Fatalf("anonymous JSON gateway put: %d %s", code, b)
	}
	// What etcd serves to anyone still works.
	if _, err := anon.AuthStatus(ctx); err != nil {
		t.Fatalf("auth status: %v", err)
	}
	if _, err := anon.MemberList(ctx); err != nil {
		t.Fatalf("member list: %v", err)
	}
	// A client with its own credentials authenticates through the proxy.
	cli, err := clientv3.New(clientv3.Config{Endpoints: []string{p.Addr().String()}, Username: "beacon-client", Password: "pw",
		DialTimeout: testTimeout, Logger: zap.NewNop()})
	if err != nil {
		t.Fatal(err)
	}
	defer cli.Close()
	if _, err := cli.Put(ctx, "/services/ok", "1"); err != nil {
		t.Fatalf("authenticated put: %v", err)
	}
	got, err := srv.Client(t).Get(ctx, "/services/", clientv3.WithPrefix(), clientv3.WithKeysOnly())
	if err != nil {
		t.Fatal(err)
	}
	if len(got.Kvs) != 1 || string(got.Kvs[0].Key) != "/services/ok" {
		t.Fatalf("keys written: %v, want only /services/ok", got.Kvs)
	}
}

// TestNoIdentityLentWhileAuthTurnsOn: the proxy asks whether the cluster
// has authentication on at most once per authStatusTTL, so right after
// `auth enable` it may still believe it off. Even then, a request without
// credentials does not act as the proxy's certificate (here issued for a
// user with the root role): etcd refuses the token the proxy puts on it,
// and the client gets etcd's answer to an anonymous request. With
// authentication off the same requests work.
func TestNoIdentityLentWhileAuthTurnsOn(t *testing.T) {
	t.Parallel()
	srv := etcdtest.Start(t, etcdtest.Options{TLS: true})
	p := startProxy(t, Config{Endpoints: srv.Endpoints(), ClientTLS: srv.TLSConfig()})
	ctx := ctxT(t)
	anon := proxyClient(t, p)
	if _, err := anon.Put(ctx, "/services/before", "x"); err != nil {
		t.Fatalf("authentication off: anonymous put: %v", err)
	}
	if _, err := anon.Get(ctx, "/services/", clientv3.WithPrefix()); err != nil {
		t.Fatalf("authentication off: anonymous get: %v", err)
	}
	wctx, cancel := context.WithTimeout(ctx, 10*time.Second)
	defer cancel()
	wch := anon.Watch(wctx, "/services/", clientv3.WithPrefix(), clientv3.WithCreatedNotify())
	if wr := <-wch; !wr.Created {
		t.Fatalf("authentication off: anonymous watch: %+v", wr)
	}

	admin := srv.Client(t) // its certificate's CN, beacon-client, becomes a root user
	for _, step := range []func() error{
		func() error { _, err := admin.UserAdd(ctx, "root", "root-pw"); return err },
		func() error { _, err := admin.UserGrantRole(ctx, "root", "root"); return err },
		func() error {
			_, err := admin.UserAddWithOptions(ctx, "beacon-client", "", &clientv3.UserAddOptions{NoPassword: true})
			return err
		},
		func() error { _, err := admin.UserGrantRole(ctx, "beacon-client", "root"); return err },
		func() error { _, err := admin.AuthEnable(ctx); return err },
	} {
		if err := step(); err != nil {
			t.Fatal(err)
		}
	}
	// The proxy still believes authentication off, as it may for up to
	// authStatusTTL after the switch.
	stale := func() {
		p.anon.mu.Lock()
		p.anon.on, p.anon.checked = false, time.Now().Add(time.Hour)
		p.anon.mu.Unlock()
	}
	for name, call := range map[string]func() error{
		"put":    func() error { _, err := anon.Put(ctx, "/services/pwn", "x"); return err },
		"get":    func() error { _, err := anon.Get(ctx, "/services/", clientv3.WithPrefix()); return err },
		"delete": func() error { _, err := anon.Delete(ctx, "/services/before"); return err },
		"txn": func() error {
			_, err := anon.Txn(ctx).Then(clientv3.OpPut("/services/txn", "x")).Commit()
			return err
		},
		"user list": func() error { _, err := anon.UserList(ctx); return err },
	} {
		stale()
		if err := call(); !errors.Is(rpctypes.Error(err), rpctypes.ErrUserEmpty) {
			t.Errorf("anonymous %s while the proxy believes authentication off: %v, want %v", name, err, rpctypes.ErrUserEmpty)
		}
	}
	stale()
	if wr := <-anon.Watch(wctx, "/services/", clientv3.WithPrefix()); !wr.Canceled && wr.Err() == nil {
		t.Errorf("anonymous watch while the proxy believes authentication off: %+v", wr)
	}
	stale()
	if code, b := anonymousGatewayPut(t, p); code == http.StatusOK {
		t.Errorf("anonymous JSON gateway put while the proxy believes authentication off: %d %s", code, b)
	}
	// The watch opened before the switch carries the proxy's token too:
	// it sees nothing of what root writes now.
	if _, err := admin.Put(ctx, "/services/after", "secret"); err != nil {
		t.Fatal(err)
	}
	got, err := admin.Get(ctx, "/services/", clientv3.WithPrefix(), clientv3.WithKeysOnly())
	if err != nil {
		t.Fatal(err)
	}
	if len(got.Kvs) != 2 || string(got.Kvs[0].Key) != "/services/after" || string(got.Kvs[1].Key) != "/services/before" {
		t.Fatalf("keys: %v, want /services/after and /services/before (nothing written or deleted anonymously)", got.Kvs)
	}
}

// anonymousGatewayPut puts /services/gw through the proxy's JSON gateway
// without credentials and returns the answer's status and body.
func anonymousGatewayPut(t *testing.T, p *Proxy) (int, []byte) {
	t.Helper()
	resp, err := http.Post("http://"+p.Addr().String()+"/v3/kv/put", "application/json", strings.NewReader(`{"key":"L3NlcnZpY2VzL2d3","value":"eA=="}`))
	if err != nil {
		t.Fatal(err)
	}
	defer resp.Body.Close()
	b, _ := io.ReadAll(resp.Body)
	return resp.StatusCode, b
}

// TestKeepAliveRefusedIsAnswered: etcd refuses a keep-alive of a lease
// whose keys the user may not write (PermissionDenied, ending the stream).
// Through the proxy the client got no answer at all, and the proxy reopened
// the upstream stream and resent the request at once, forever: 10 requests
// of one read-only user became 32,386 keep-alives in 5 s, half a core of
// etcd. Now the client gets etcd's error, the proxy backs off, and other
// clients' keep-alives go on.
func TestKeepAliveRefusedIsAnswered(t *testing.T) {
	t.Parallel()
	srv, admin := startRootEtcd(t)
	ctx := ctxT(t)
	if _, err := admin.UserAdd(ctx, "bob", "bob-pw"); err != nil {
		t.Fatal(err)
	}
	p := startProxy(t, Config{Endpoints: srv.Endpoints()})
	as := func(user, pw string) *clientv3.Client {
		cli, err := clientv3.New(clientv3.Config{Endpoints: []string{p.Addr().String()}, Username: user, Password: pw,
			DialTimeout: testTimeout, Logger: zap.NewNop()})
		if err != nil {
			t.Fatal(err)
		}
		t.Cleanup(func() { _ = cli.Close() })
		return cli
	}
	root, bob := as("root", "root-pw"), as("bob", "bob-pw")
	g, err := root.Grant(ctx, 60)
	if err != nil {
		t.Fatal(err)
	}
	if _, err := root.Put(ctx, "/team-a/x", "v", clientv3.WithLease(g.ID)); err != nil {
		t.Fatal(err)
	}
	before := value(t, p.m.kaForwarded)
	_, err = bob.KeepAliveOnce(ctx, g.ID)
	if !errors.Is(err, rpctypes.ErrPermissionDenied) {
		t.Fatalf("bob's keep-alive of root's lease: %v, want etcd's %v", err, rpctypes.ErrPermissionDenied)
	}
	if n := value(t, p.m.kaForwarded) - before; n > 5 {
		t.Fatalf("one refused keep-alive was forwarded %v times", n)
	}
	if r, err := root.KeepAliveOnce(ctx, g.ID); err != nil || r.TTL <= 0 {
		t.Fatalf("root's keep-alive after bob's was refused: %+v %v", r, err)
	}
}

// TestWatchCreateChecksTheRange: a watch created through the proxy is
// checked against the client's own permissions over its whole range —
// bob may read /team-a/ alone: his watch of it is created at the current
// revision, his watches of /team-b/ and of the wider /team are refused
// with etcd's error. The check reads no key (a transaction whose range is
// in the branch not taken: no response, the current revision): a Range of
// the range made etcd count every key under it for each watch created.
func TestWatchCreateChecksTheRange(t *testing.T) {
	t.Parallel()
	srv, admin := startRootEtcd(t)
	ctx := ctxT(t)
	addTeamA(ctx, t, admin, "bob")
	p := startProxy(t, Config{Endpoints: srv.Endpoints()})
	bob, err := clientv3.New(clientv3.Config{Endpoints: []string{p.Addr().String()}, Username: "bob", Password: "bob-pw",
		DialTimeout: testTimeout, Logger: zap.NewNop()})
	if err != nil {
		t.Fatal(err)
	}
	defer bob.Close()
	put, err := admin.Put(ctx, "/team-a/x", "v")
	if err != nil {
		t.Fatal(err)
	}
	wr := <-bob.Watch(ctx, "/team-a/", clientv3.WithPrefix(), clientv3.WithCreatedNotify())
	if !wr.Created || wr.Err() != nil || wr.Header.Revision < put.Header.Revision {
		t.Fatalf("bob's watch of /team-a/: %+v (header %+v), want created at revision %d or later", wr, wr.Header, put.Header.Revision)
	}
	for _, prefix := range []string{"/team-b/", "/team"} {
		wr := <-bob.Watch(ctx, prefix, clientv3.WithPrefix(), clientv3.WithCreatedNotify())
		if !wr.Canceled || !strings.Contains(wr.Err().Error(), rpctypes.ErrPermissionDenied.Error()) {
			t.Fatalf("bob's watch of %s: %+v (%v), want refused with etcd's %v", prefix, wr, wr.Err(), rpctypes.ErrPermissionDenied)
		}
	}

	auth, err := admin.Authenticate(ctx, "root", "root-pw")
	if err != nil {
		t.Fatal(err)
	}
	rctx := metadata.NewOutgoingContext(ctx, metadata.Pairs(rpctypes.TokenFieldNameGRPC, auth.Token))
	resp, err := p.mayWatch(rctx, []byte("/team-a/"), []byte(clientv3.GetPrefixRangeEnd("/team-a/")))
	if err != nil || !resp.Succeeded || len(resp.Responses) != 0 || resp.Header.Revision < put.Header.Revision {
		t.Fatalf("mayWatch = %+v, %v: want the taken branch empty (no key read) at revision %d or later", resp, err, put.Header.Revision)
	}
}

// addTeamA adds user (password user-pw) with role team-a, which may read
// /team-a/.
func addTeamA(ctx context.Context, t *testing.T, admin *clientv3.Client, user string) {
	t.Helper()
	for _, step := range []func() error{
		func() error { _, err := admin.UserAdd(ctx, user, user+"-pw"); return err },
		func() error { _, err := admin.RoleAdd(ctx, "team-a"); return err },
		func() error {
			_, err := admin.RoleGrantPermission(ctx, "team-a", "/team-a/", clientv3.GetPrefixRangeEnd("/team-a/"), clientv3.PermissionType(clientv3.PermRead))
			return err
		},
		func() error { _, err := admin.UserGrantRole(ctx, user, "team-a"); return err },
	} {
		if err := step(); err != nil {
			t.Fatal(err)
		}
	}
}

// startRootEtcd starts etcd with authentication on (user root, password
// root-pw) and returns it with a client of root's.
func startRootEtcd(t *testing.T) (*etcdtest.Server, *clientv3.Client) {
	t.Helper()
	srv := etcdtest.Start(t, etcdtest.Options{User: "root", Password: "root-pw"})
	admin, err := clientv3.New(srv.ClientConfig())
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { _ = admin.Close() })
	return srv, admin
}

// TestWatchChecksAreSharedOnlyByTheSameCredentials: creates checked at
// once by several users, some allowed and some not, each get the answer
// of their own credentials (a check in flight is shared only by the same
// range and metadata), and a check's key tells every credential and
// range apart.
func TestWatchChecksAreSharedOnlyByTheSameCredentials(t *testing.T) {
	t.Parallel()
	srv, admin := startRootEtcd(t)
	ctx := ctxT(t)
	addTeamA(ctx, t, admin, "bob")
	if _, err := admin.UserAdd(ctx, "eve", "eve-pw"); err != nil { // no role
		t.Fatal(err)
	}
	p := startProxy(t, Config{Endpoints: srv.Endpoints()})
	users := map[string]bool{"root": true, "bob": true, "eve": false} // may read /team-a/
	tokens := map[string]context.Context{}
	for u := range users {
		auth, err := admin.Authenticate(ctx, u, u+"-pw")
		if err != nil {
			t.Fatal(err)
		}
		tokens[u] = metadata.NewOutgoingContext(ctx, metadata.Pairs(rpctypes.TokenFieldNameGRPC, auth.Token))
	}
	key, end := []byte("/team-a/"), []byte(clientv3.GetPrefixRangeEnd("/team-a/"))
	var wg sync.WaitGroup
	errs := make(chan error, 300)
	for i := range 300 {
		u := []string{"root", "bob", "eve"}[i%3]
		wg.Go(func() {
			_, err := p.mayWatch(tokens[u], key, end)
			if allowed := users[u]; allowed != (err == nil) {
				errs <- fmt.Errorf("%s: check answered %v, want allowed %v", u, err, allowed)
			}
		})
	}
	wg.Wait()
	close(errs)
	for err := range errs {
		t.Error(err)
	}
	keys := map[string]bool{}
	for u := range users {
		keys[checkKey(tokens[u], key, end)] = true
	}
	keys[checkKey(tokens["bob"], key, []byte("/team-b"))] = true
	keys[checkKey(tokens["bob"], []byte("/team-a"), []byte("/team-b/"))] = true
	keys[checkKey(tokens["bob"], []byte("a\x00b"), []byte("c"))] = true // key and end may hold any byte
	keys[checkKey(tokens["bob"], []byte("a"), []byte("b\x00c"))] = true
	keys[checkKey(metadata.NewOutgoingContext(ctx, metadata.Pairs(rpctypes.TokenFieldNameGRPC, "x", viaKey, "p1")), key, end)] = true
	keys[checkKey(metadata.NewOutgoingContext(ctx, metadata.Pairs(rpctypes.TokenFieldNameGRPC, "x", viaKey, "p2")), key, end)] = true
	if len(keys) != 9 {
		t.Errorf("9 different credentials and ranges gave %d check keys", len(keys))
	}
}
