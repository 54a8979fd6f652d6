package server

import (
	"context"
	"encoding/json"
	"net/http"
	"strings"
	"testing"
	"time"

	"github.com/beaconplane/beacon/backend"
	"github.com/beaconplane/beacon/internal/testkit/etcdtest"
	"github.com/beaconplane/beacon/internal/testkit/testcerts"
	"github.com/beaconplane/beacon/server/registryapi"
	etcdstore "github.com/beaconplane/beacon/store/etcd"
	clientv3 "go.etcd.io/etcd/client/v3"
	"go.etcd.io/etcd/server/v3/embed"
	"golang.org/x/crypto/bcrypt"
)

// TestAuthenticationMethods: the HTTP API accepts what etcd accepts —
// Basic credentials, an etcd token as Bearer, a verified client
// certificate whose CN is the user — and refuses every malformed or
// foreign credential with 401 and a message, never a 500.
func TestAuthenticationMethods(t *testing.T) {
	p := newPKI(t)
	alice, err := p.ca.Issue("alice", testcerts.LeafOptions{CommonName: "alice", Client: true})
	if err != nil {
		t.Fatal(err)
	}
	mallory, err := p.ca.Issue("mallory", testcerts.LeafOptions{CommonName: "mallory", Client: true})
	if err != nil {
		t.Fatal(err)
	}
	cfg := authConfig(t)
	cfg.Security.AuthToken = "jwt" // to act as a certificate's user
	cfg.Security.HTTPTLS = TLSFiles{CertFile: p.server.Cert, KeyFile: p.server.Key, TrustedCAFile: p.ca.File}
	s := startServer(t, cfg)
	grant(t, rootClient(t, s), "alice", "alice-pw", "readwrite /services/team-a/", "readwrite /beacon-owners/team-a/")
	base := s.Endpoints().HTTP
	anonTLS := httpsClient(tlsClient(t, p.ca.File, nil, ""))
	register := `{"namespace":"team-a","component":"api","endpoint":"http","address":"10.0.0.1:80"}`

	// A client certificate names the user.
	certAs := as{t: t, base: base, client: httpsClient(tlsClient(t, p.ca.File, &alice, ""))}
	if r := certAs.do("POST", registryapi.InstancesPath, register); r.code != http.StatusCreated {
		t.Fatalf("register as the certificate's user: %d %s", r.code, r.body)
	}
	if r := certAs.do("POST", registryapi.InstancesPath, strings.Replace(register, "team-a", "team-b", 1)); r.code != http.StatusForbidden {
		t.Fatalf("certificate user outside its namespace: %d %s", r.code, r.body)
	}
	var who WhoAmI
	r := certAs.do("GET", WhoAmIPath, "")
	if err := json.Unmarshal([]byte(r.body), &who); err != nil || who.User != "alice" || who.Method != "certificate" {
		t.Fatalf("whoami with a certificate: %d %s", r.code, r.body)
	}
	if r := (as{t: t, base: base, client: httpsClient(tlsClient(t, p.ca.File, &mallory, ""))}).do("GET", registryapi.InstancesPath, ""); r.code != http.StatusUnauthorized || !strings.Contains(r.body, "not an etcd user") {
		t.Fatalf("certificate of an unknown user: %d %s", r.code, r.body)
	}

	// A token from POST /v1/auth/token works as Bearer.
	r = as{t: t, base: base, client: anonTLS, auth: basic("alice", "alice-pw")}.do("POST", TokenPath, "")
	var tok TokenResponse
	if err := json.Unmarshal([]byte(r.body), &tok); err != nil || r.code != 200 || tok.Token == "" || tok.User != "alice" {
		t.Fatalf("token: %d %s", r.code, r.body)
	}
	bearer := as{t: t, base: base, client: anonTLS, auth: "Bearer " + tok.Token}
	if r := bearer.do("GET", registryapi.InstancesPath+"?namespace=team-a", ""); r.code != 200 {
		t.Fatalf("list with a bearer token: %d %s", r.code, r.body)
	}
	r = bearer.do("GET", WhoAmIPath, "")
	who = WhoAmI{}
	if err := json.Unmarshal([]byte(r.body), &who); err != nil || who.User != "alice" || who.Method != "bearer" {
		t.Fatalf("whoami with a token: %d %s", r.code, r.body)
	}

	// A token of another cluster (other JWT keys) is refused.
	other := startServer(t, authConfig(t))
	r = as{t: t, base: other.Endpoints().HTTP, auth: basic("root", rootPassword)}.do("POST", TokenPath, "")
	var foreign TokenResponse
	if err := json.Unmarshal([]byte(r.body), &foreign); err != nil || foreign.Token == "" {
		t.Fatalf("token of the other cluster: %d %s", r.code, r.body)
	}

	for name, header := range map[string]string{
		"token of another cluster": "Bearer " + foreign.Token,
		"garbage token":            "Bearer not-a-token",
		"empty bearer":             "Bearer ",
		"token with spaces":        "Bearer a b",
		"basic not base64":         "Basic !!!",
		"basic without colon":      "Basic " + "YWxpY2U=",
		"basic empty user":         basic("", "x"),
		"basic wrong password":     basic("alice", "nope"),
		"basic unknown user":       basic("nobody", "nope"),
		"unknown scheme":           "Digest username=alice",
		"scheme only":              "Basic",
		"non-UTF-8 user":           basic("\xff\xfe", "x"),
	} {
		r := as{t: t, base: base, client: anonTLS, auth: header}.do("GET", registryapi.InstancesPath+"?namespace=team-a", "")
		var e registryapi.ErrorResponse
		if r.code != http.StatusUnauthorized || json.Unmarshal([]byte(r.body), &e) != nil || e.Code != "unauthenticated" || len(e.Message) < 20 {
			t.Errorf("%s: %d %s; want 401 with a message", name, r.code, r.body)
		}
	}
	// No credentials at all (and no client certificate).
	r = as{t: t, base: base, client: anonTLS}.do("GET", registryapi.InstancesPath, "")
	if r.code != http.StatusUnauthorized || !strings.Contains(r.body, "Basic") {
		t.Fatalf("no credentials: %d %s", r.code, r.body)
	}
	// Nothing was written by the refused requests.
	var list registryapi.ListResponse
	r = as{t: t, base: base, client: anonTLS, auth: basic("root", rootPassword)}.do("GET", registryapi.InstancesPath, "")
	if err := json.Unmarshal([]byte(r.body), &list); err != nil || len(list.Instances) != 1 {
		t.Fatalf("after the refusals: %s", r.body)
	}

	// A changed password ends the cached view: the old password gets 401.
	oldPw := as{t: t, base: base, client: anonTLS, auth: basic("alice", "alice-pw")}
	if r := oldPw.do("GET", registryapi.InstancesPath+"?namespace=team-a", ""); r.code != 200 {
		t.Fatalf("before the change: %d %s", r.code, r.body)
	}
	ctx, cancel := context.WithTimeout(context.Background(), 20*time.Second)
	defer cancel()
	if r := oldPw.do("GET", WhoAmIPath, ""); r.code != 200 || !strings.Contains(r.body, `"authenticated":true`) {
		t.Fatalf("whoami before the change: %d %s", r.code, r.body)
	}
	if _, err := rootClient(t, s).UserChangePassword(ctx, "alice", "new-pw"); err != nil {
		t.Fatal(err)
	}
	// First a route that reads nothing from etcd as the user: the cached
	// view must not vouch for the old password (whoami said
	// "authenticated":true with it).
	if r := oldPw.do("GET", WhoAmIPath, ""); r.code != http.StatusUnauthorized {
		t.Fatalf("whoami with the old password after the change: %d %s", r.code, r.body)
	}
	if r := oldPw.do("GET", registryapi.InstancesPath+"?namespace=team-a", ""); r.code != http.StatusUnauthorized {
		t.Fatalf("old password after the change: %d %s", r.code, r.body)
	}
	if r := (as{t: t, base: base, client: anonTLS, auth: basic("alice", "new-pw")}).do("GET", registryapi.InstancesPath+"?namespace=team-a", ""); r.code != 200 {
		t.Fatalf("new password: %d %s", r.code, r.body)
	}
}

// TestLeastPrivilegeFront: beacon serve in front of an external etcd with
// auth, as a user that may only touch the registry's prefixes, becomes
// ready and serves (the readiness read stays inside /services/).
func TestLeastPrivilegeFront(t *testing.T) {
	srv := etcdtest.Start(t, etcdtest.Options{User: "root", Password: "rootpw",
		Configure: func(c *embed.Config) { c.BcryptCost = uint(bcrypt.MinCost) }})
	root, err := clientv3.New(srv.ClientConfig())
	if err != nil {
		t.Fatal(err)
	}
	defer root.Close()
	grant(t, root, "svc", "svc-pw", "readwrite /services/", "readwrite /beacon-owners/")
	s := startServer(t, Config{HTTPAddr: "127.0.0.1:0", EtcdEndpoints: srv.Endpoints(),
		Backend: backend.Config{Name: backend.Etcd, Etcd: etcdstore.Config{Username: "svc", Password: "svc-pw"}}})
	base := s.Endpoints().HTTP
	if code, body := get(t, base+"/readyz"); code != 200 {
		t.Fatalf("/readyz as a least-privilege user: %d %s", code, body)
	}
	// The external cluster has auth on: the HTTP API requires credentials
	// and acts as each user.
	if r := (as{t: t, base: base}).do("GET", registryapi.InstancesPath, ""); r.code != http.StatusUnauthorized {
		t.Fatalf("no credentials in front of an etcd with auth: %d %s", r.code, r.body)
	}
	svc := as{t: t, base: base, auth: basic("svc", "svc-pw")}
	if r := svc.do("POST", registryapi.InstancesPath, `{"namespace":"prod","component":"api","endpoint":"http","address":"10.0.0.1:80"}`); r.code != http.StatusCreated {
		t.Fatalf("register as svc: %d %s", r.code, r.body)
	}
	grant(t, root, "reader", "reader-pw", "read /services/prod/")
	if r := (as{t: t, base: base, auth: basic("reader", "reader-pw")}).do("POST", registryapi.InstancesPath, `{"namespace":"prod","component":"api","endpoint":"http","address":"10.0.0.2:80"}`); r.code != http.StatusForbidden {
		t.Fatalf("register as a reader: %d %s", r.code, r.body)
	}
	// A reader's watch, served from the server's registry (as svc) once
	// the external etcd said the reader may read prod, ends when it no
	// longer may: the server reads the external cluster's auth revision.
	ctx, cancel := context.WithTimeout(context.Background(), time.Minute)
	defer cancel()
	reader := openSSEAs(t, ctx, base, "prod", basic("reader", "reader-pw"))
	reader.waitFor(t, "the reader's snapshot", func() bool { return reader.snapshots == 1 && len(reader.live) == 1 })
	if _, err := root.RoleRevokePermission(ctx, "reader-role", "/services/prod/", clientv3.GetPrefixRangeEnd("/services/prod/")); err != nil {
		t.Fatal(err)
	}
	reader.waitFor(t, "the reader's stream to end", func() bool { return strings.Contains(reader.failure, "permission_denied") })
	// The tokens API needs its own permission, which svc lacks: 403, not 500.
	if r := svc.do("POST", "/v1/tokens", `{"size":3}`); r.code != http.StatusForbidden {
		t.Fatalf("tokens as svc: %d %s", r.code, r.body)
	}
	// A caller with that permission, through a server whose own user
	// lacks it (the server does the work): 403 saying what to grant the
	// server's user, never a 500 or etcd's bare "permission denied".
	grant(t, root, "boot", "boot-pw", "readwrite /_etcd/registry/", "readwrite "+v2Prefix)
	boot := as{t: t, base: base, auth: basic("boot", "boot-pw")}
	for _, req := range [][2]string{{"POST", "/v1/tokens"}, {"GET", "/v1/tokens"}, {"GET", V2Path + "/new?size=3"}, {"GET", V2Path + "/0123456789abcdef0123456789abcdef"}} {
		body := ""
		if req[0] == "POST" {
			body = `{"size":3}`
		}
		r := boot.do(req[0], req[1], body)
		if r.code != http.StatusForbidden || !strings.Contains(r.body, `own etcd user (\"svc\"`) || !strings.Contains(r.body, "grant") {
			t.Errorf("%s %s by a bootstrap user through a least-privilege server: %d %s", req[0], req[1], r.code, r.body)
		}
	}
}

// TestEmbeddedHonoursCredentials: auth enabled on the embedded etcd behind
// beacon serve's back (etcdctl auth enable) no longer breaks it when it
// has credentials (--etcd-user/--etcd-password), and readiness says what
// is missing when it has none.
func TestEmbeddedHonoursCredentials(t *testing.T) {
	cfg := testConfig(t)
	s := startServer(t, cfg)
	cli, err := clientv3.New(clientv3.Config{Endpoints: s.Endpoints().ClientURLs, DialTimeout: 5 * time.Second})
	if err != nil {
		t.Fatal(err)
	}
	defer cli.Close()
	ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
	defer cancel()
	for _, step := range []func() error{
		func() error { _, err := cli.UserAdd(ctx, "root", "rootpw"); return err },
		func() error { _, err := cli.RoleAdd(ctx, "root"); return err },
		func() error { _, err := cli.UserGrantRole(ctx, "root", "root"); return err },
		func() error { _, err := cli.UserAdd(ctx, "beacon", "beacon-pw"); return err },
		func() error { _, err := cli.RoleAdd(ctx, "registry"); return err },
		func() error {
			_, err := cli.RoleGrantPermission(ctx, "registry", "/services/", clientv3.GetPrefixRangeEnd("/services/"), clientv3.PermissionType(clientv3.PermReadWrite))
			return err
		},
		func() error { _, err := cli.UserGrantRole(ctx, "beacon", "registry"); return err },
		func() error { _, err := cli.AuthEnable(ctx); return err },
	} {
		if err := step(); err != nil {
			t.Fatal(err)
		}
	}
	// Without credentials: not ready, and the reason says what to give.
	code, body := get(t, s.Endpoints().HTTP+"/readyz")
	if code != http.StatusServiceUnavailable || !strings.Contains(body, "Config.Backend.Etcd.Username") {
		t.Fatalf("/readyz without credentials once auth is on: %d %s", code, body)
	}
	if err := s.Close(); err != nil {
		t.Fatal(err)
	}
	cfg.Backend.Etcd.Username, cfg.Backend.Etcd.Password = "beacon", "beacon-pw"
	s2 := startServer(t, cfg)
	// Ready once its first authenticated read is answered: etcd checks the
	// password with bcrypt, which a loaded machine under -race can make
	// slower than one probe's budget, so the probe is asked again (as a
	// kubelet does) until a deadline.
	deadline := time.Now().Add(30 * time.Second)
	for {
		code, body := get(t, s2.Endpoints().HTTP+"/readyz")
		if code == 200 {
			break
		}
		if time.Now().After(deadline) {
			t.Fatalf("/readyz with --etcd-user: %d %s", code, body)
		}
		pollPause()
	}
}
