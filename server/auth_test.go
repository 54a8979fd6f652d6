package server

import (
	"context"
	"encoding/base64"
	"encoding/json"
	"io"
	"net/http"
	"strings"
	"testing"
	"time"

	"github.com/beaconplane/beacon/server/registryapi"
	clientv3 "go.etcd.io/etcd/client/v3"
)

const rootPassword = "r00t-pw"

// authConfig is testConfig with etcd authentication on (cheap password
// hashes: every user the tests create authenticates many times).
func authConfig(t testing.TB) Config {
	cfg := testConfig(t)
	cfg.Security.Auth = true
	cfg.Security.RootPassword = rootPassword
	cfg.Security.BcryptCost = 4
	return cfg
}

// rootClient is an etcd client of s's embedded etcd as root.
func rootClient(t testing.TB, s *Server) *clientv3.Client {
	t.Helper()
	cli, err := clientv3.New(clientv3.Config{Endpoints: s.Endpoints().ClientURLs, Username: "root", Password: rootPassword, DialTimeout: 10 * time.Second})
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { _ = cli.Close() })
	return cli
}

// grant creates user with password and a role of its own holding perms,
// each "read|write|readwrite prefix".
func grant(t testing.TB, cli *clientv3.Client, user, password string, perms ...string) {
	t.Helper()
	ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
	defer cancel()
	if _, err := cli.UserAdd(ctx, user, password); err != nil {
		t.Fatal(err)
	}
	role := user + "-role"
	if _, err := cli.RoleAdd(ctx, role); err != nil {
		t.Fatal(err)
	}
	for _, p := range perms {
		kind, prefix, _ := strings.Cut(p, " ")
		typ := map[string]clientv3.PermissionType{"read": clientv3.PermissionType(clientv3.PermRead), "write": clientv3.PermissionType(clientv3.PermWrite), "readwrite": clientv3.PermissionType(clientv3.PermReadWrite)}[kind]
		if _, err := cli.RoleGrantPermission(ctx, role, prefix, clientv3.GetPrefixRangeEnd(prefix), typ); err != nil {
			t.Fatal(err)
		}
	}
	if _, err := cli.UserGrantRole(ctx, user, role); err != nil {
		t.Fatal(err)
	}
}

// as sends HTTP requests with credentials.
type as struct {
	t      *testing.T
	base   string
	auth   string // the Authorization header, or ""
	client *http.Client
}

func basic(user, password string) string {
	return "Basic " + base64.StdEncoding.EncodeToString([]byte(user+":"+password))
}

type httpAnswer struct {
	code   int
	body   string
	header http.Header
}

func (a as) do(method, path, body string, hdr ...string) httpAnswer {
	a.t.Helper()
	var rd io.Reader
	if body != "" {
		rd = strings.NewReader(body)
	}
	req, err := http.NewRequest(method, a.base+path, rd)
	if err != nil {
		a.t.Fatal(err)
	}
	if body != "" {
		req.Header.Set("Content-Type", "application/json")
	}
	if a.auth != "" {
		req.Header.Set("Authorization", a.auth)
	}
	for i := 0; i+1 < len(hdr); i += 2 {
		req.Header.Set(hdr[i], hdr[i+1])
	}
	c := a.client
	if c == nil {
		c = http.DefaultClient
	}
	resp, err := c.Do(req)
	if err != nil {
		a.t.Fatal(err)
	}
	defer resp.Body.Close()
	b, err := io.ReadAll(resp.Body)
	if err != nil {
		a.t.Fatal(err)
	}
	return httpAnswer{resp.StatusCode, string(b), resp.Header}
}

// stream opens a stream and returns its status (and, for an error, its
// body), closing it at once.
func (a as) stream(path string) httpAnswer {
	a.t.Helper()
	ctx, cancel := context.WithCancel(context.Background())
	defer cancel()
	req, err := http.NewRequestWithContext(ctx, "GET", a.base+path, nil)
	if err != nil {
		a.t.Fatal(err)
	}
	if a.auth != "" {
		req.Header.Set("Authorization", a.auth)
	}
	c := a.client
	if c == nil {
		c = http.DefaultClient
	}
	resp, err := c.Do(req)
	if err != nil {
		a.t.Fatal(err)
	}
	defer resp.Body.Close()
	out := httpAnswer{code: resp.StatusCode, header: resp.Header}
	if resp.StatusCode != http.StatusOK {
		b, _ := io.ReadAll(resp.Body)
		out.body = string(b)
	}
	return out
}

// TestAuthorizationTable checks every pair of user and action, in two
// namespaces, over a real embedded etcd with auth on: etcd's roles decide,
// through the HTTP API acting as each user. Refusals are 401 (who are you)
// or 403 (you may not), with messages that say what to do, never 500;
// nothing is written by a refused request.
func TestAuthorizationTable(t *testing.T) {
	s := startServer(t, authConfig(t))
	root := rootClient(t, s)
	grant(t, root, "alice", "alice-pw", "readwrite /services/team-a/", "readwrite /beacon-owners/team-a/")
	grant(t, root, "bob", "bob-pw", "read /services/team-a/")
	grant(t, root, "carol", "carol-pw")
	// Dave may write instances but was not granted the ownership prefix.
	grant(t, root, "dave", "dave-pw", "readwrite /services/team-b/")
	grant(t, root, "erin", "erin-pw", "readwrite /_etcd/registry/", "readwrite "+v2Prefix)
	// Frank may read discovery tokens, not create them.
	grant(t, root, "frank", "frank-pw", "read /_etcd/registry/", "read "+v2Prefix)
	base := s.Endpoints().HTTP

	users := map[string]string{
		"root":  basic("root", rootPassword),
		"alice": basic("alice", "alice-pw"),
		"bob":   basic("bob", "bob-pw"),
		"carol": basic("carol", "carol-pw"),
		"dave":  basic("dave", "dave-pw"),
		"erin":  basic("erin", "erin-pw"),
		"frank": basic("frank", "frank-pw"),
		"anon":  "",
		"wrong": basic("alice", "not-her-password"),
		"ghost": basic("nobody", "x"),
	}
	// One live registration per namespace, made by root, to act on.
	rootAs := as{t: t, base: base, auth: users["root"]}
	target := map[string]registryapi.RegisterResponse{}
	for _, ns := range []string{"team-a", "team-b"} {
		r := rootAs.do("POST", registryapi.InstancesPath, `{"namespace":"`+ns+`","component":"api","endpoint":"http","address":"10.0.0.1:80","ttl":"1m"}`)
		if r.code != http.StatusCreated {
			t.Fatalf("root registers in %s: %d %s", ns, r.code, r.body)
		}
		var reg registryapi.RegisterResponse
		if err := json.Unmarshal([]byte(r.body), &reg); err != nil {
			t.Fatal(err)
		}
		target[ns] = reg
	}

	type action struct {
		name string
		do   func(a as, user, ns string) httpAnswer
	}
	actions := []action{
		{"list", func(a as, _, ns string) httpAnswer {
			return a.do("GET", registryapi.InstancesPath+"?namespace="+ns, "")
		}},
		{"get", func(a as, _, ns string) httpAnswer {
			return a.do("GET", registryapi.InstancesPath+"/"+target[ns].Instance.Ref().String(), "")
		}},
		{"watch", func(a as, _, ns string) httpAnswer { return a.stream(registryapi.WatchPath + "?namespace=" + ns) }},
		{"register", func(a as, _, ns string) httpAnswer {
			return a.do("POST", registryapi.InstancesPath, `{"namespace":"`+ns+`","component":"api","endpoint":"http","address":"10.0.0.2:80","ttl":"1m"}`)
		}},
		{"heartbeat", func(a as, _, ns string) httpAnswer {
			return a.do("POST", registryapi.InstancesPath+"/"+target[ns].Instance.Ref().String()+"/heartbeat", "", registryapi.SecretHeader, target[ns].Secret)
		}},
		{"update", func(a as, user, ns string) httpAnswer {
			return a.do("PATCH", registryapi.InstancesPath+"/"+target[ns].Instance.Ref().String(), `{"metadata":{"by":"`+user+`"}}`, registryapi.SecretHeader, target[ns].Secret)
		}},
	}
	const ok, unauth, forbid = 200, 401, 403
	// user → action → namespace → status ("ok" covers 200 and 201).
	want := map[string]map[string][2]int{
		"root":  {"list": {ok, ok}, "get": {ok, ok}, "watch": {ok, ok}, "register": {ok, ok}, "heartbeat": {ok, ok}, "update": {ok, ok}},
		"alice": {"list": {ok, forbid}, "get": {ok, forbid}, "watch": {ok, forbid}, "register": {ok, forbid}, "heartbeat": {ok, forbid}, "update": {ok, forbid}},
		"bob":   {"list": {ok, forbid}, "get": {ok, forbid}, "watch": {ok, forbid}, "register": {forbid, forbid}, "heartbeat": {forbid, forbid}, "update": {forbid, forbid}},
		"carol": {"list": {forbid, forbid}, "get": {forbid, forbid}, "watch": {forbid, forbid}, "register": {forbid, forbid}, "heartbeat": {forbid, forbid}, "update": {forbid, forbid}},
		// dave may write team-b's instances but not its ownership records:
		// registration is refused (and says what to grant); the secret of
		// root's registration lives where dave may not read it.
		"dave":  {"list": {forbid, ok}, "get": {forbid, ok}, "watch": {forbid, ok}, "register": {forbid, forbid}, "heartbeat": {forbid, forbid}, "update": {forbid, forbid}},
		"erin":  {"list": {forbid, forbid}, "get": {forbid, forbid}, "watch": {forbid, forbid}, "register": {forbid, forbid}, "heartbeat": {forbid, forbid}, "update": {forbid, forbid}},
		"anon":  {"list": {unauth, unauth}, "get": {unauth, unauth}, "watch": {unauth, unauth}, "register": {unauth, unauth}, "heartbeat": {unauth, unauth}, "update": {unauth, unauth}},
		"wrong": {"list": {unauth, unauth}, "get": {unauth, unauth}, "watch": {unauth, unauth}, "register": {unauth, unauth}, "heartbeat": {unauth, unauth}, "update": {unauth, unauth}},
		"ghost": {"list": {unauth, unauth}, "get": {unauth, unauth}, "watch": {unauth, unauth}, "register": {unauth, unauth}, "heartbeat": {unauth, unauth}, "update": {unauth, unauth}},
	}
	for _, user := range []string{"root", "alice", "bob", "carol", "dave", "erin", "anon", "wrong", "ghost"} {
		for _, act := range actions {
			for i, ns := range []string{"team-a", "team-b"} {
				got := act.do(as{t: t, base: base, auth: users[user]}, user, ns)
				w := want[user][act.name][i]
				if (w == ok && got.code != 200 && got.code != 201) || (w != ok && got.code != w) {
					t.Errorf("%s %s in %s: %d %s; want %d", user, act.name, ns, got.code, got.body, w)
					continue
				}
				switch got.code {
				case unauth:
					if got.header.Get("WWW-Authenticate") == "" || !strings.Contains(got.body, `"code":"unauthenticated"`) {
						t.Errorf("%s %s: 401 without a challenge or code: %v %s", user, act.name, got.header, got.body)
					}
				case forbid:
					if !strings.Contains(got.body, `"code":"permission_denied"`) || !strings.Contains(got.body, "grant") {
						t.Errorf("%s %s in %s: 403 does not say what to grant: %s", user, act.name, ns, got.body)
					}
					if !strings.Contains(got.body, ns) || !strings.Contains(got.body, user) {
						t.Errorf("%s %s in %s: 403 does not name the user and the namespace: %s", user, act.name, ns, got.body)
					}
					// ... and names the action refused.
					verb := map[string]string{"list": "may not read", "get": "may not read", "watch": "may not read",
						"register": "may not register in", "heartbeat": "may not renew (heartbeat) instances in", "update": "may not update instances in"}[act.name]
					if !strings.Contains(got.body, verb) {
						t.Errorf("%s %s in %s: 403 does not say %q: %s", user, act.name, ns, verb, got.body)
					}
				}
			}
		}
	}

	// A deregistration refused says so (it once said "register in").
	if got := (as{t: t, base: base, auth: users["bob"]}).do("DELETE", registryapi.InstancesPath+"/"+target["team-a"].Instance.Ref().String(), "",
		registryapi.SecretHeader, target["team-a"].Secret); got.code != forbid || !strings.Contains(got.body, `user \"bob\" may not deregister instances in namespace \"team-a\"`) {
		t.Errorf("bob deregisters in team-a: %d %s, want 403 saying he may not deregister", got.code, got.body)
	}

	// Nothing refused was written: each namespace holds root's instance,
	// plus the registrations the table allowed (root's and alice's).
	var list registryapi.ListResponse
	r := rootAs.do("GET", registryapi.InstancesPath, "")
	if err := json.Unmarshal([]byte(r.body), &list); err != nil {
		t.Fatal(r.body)
	}
	count := map[string]int{}
	for _, in := range list.Instances {
		count[in.Namespace]++
		if by := in.Metadata["by"]; by != "" && by != "root" && !(by == "alice" && in.Namespace == "team-a") {
			t.Errorf("a refused update changed %s: %v", in.Ref(), in.Metadata)
		}
	}
	if count["team-a"] != 3 || count["team-b"] != 2 {
		t.Errorf("instances per namespace %v, want team-a 3 (root's, root's and alice's registrations) and team-b 2", count)
	}

	// whoami says what the table found.
	var who WhoAmI
	r = as{t: t, base: base, auth: users["alice"]}.do("GET", WhoAmIPath, "")
	if err := json.Unmarshal([]byte(r.body), &who); err != nil || r.code != 200 {
		t.Fatalf("whoami: %d %s", r.code, r.body)
	}
	if who.User != "alice" || who.Method != "basic" || who.Root || who.AllNamespaces.Read || who.AllNamespaces.Write ||
		who.Namespaces["team-a"] != (Access{Read: true, Write: true, Operate: true}) || len(who.Namespaces) != 1 || who.BootstrapTokens.Write {
		t.Errorf("whoami alice: %+v", who)
	}
	r = as{t: t, base: base, auth: users["bob"]}.do("GET", WhoAmIPath, "")
	who = WhoAmI{}
	if err := json.Unmarshal([]byte(r.body), &who); err != nil || who.Namespaces["team-a"] != (Access{Read: true}) {
		t.Errorf("whoami bob: %d %s", r.code, r.body)
	}
	r = as{t: t, base: base}.do("GET", WhoAmIPath, "")
	who = WhoAmI{}
	if err := json.Unmarshal([]byte(r.body), &who); err != nil || r.code != 200 || !who.AuthEnabled || who.Authenticated {
		t.Errorf("whoami without credentials: %d %s", r.code, r.body)
	}
	r = as{t: t, base: base, auth: users["root"]}.do("GET", WhoAmIPath, "")
	who = WhoAmI{}
	if err := json.Unmarshal([]byte(r.body), &who); err != nil || !who.Root || !who.AllNamespaces.Write || !who.BootstrapTokens.Write {
		t.Errorf("whoami root: %d %s", r.code, r.body)
	}

	// The tokens API and v2 discovery have permissions of their own.
	for user, code := range map[string]int{"erin": 201, "frank": 403, "alice": 403, "anon": 401} {
		r := as{t: t, base: base, auth: users[user]}.do("POST", "/v1/tokens", `{"size":3}`)
		if r.code != code {
			t.Errorf("%s creates a v3 discovery token: %d %s; want %d", user, r.code, r.body, code)
		}
	}
	// GET /new creates a token (discovery.etcd.io's protocol): a write,
	// whatever its method.
	for user, code := range map[string]int{"erin": 200, "frank": 403, "alice": 403, "anon": 401} {
		r := as{t: t, base: base, auth: users[user]}.do("GET", V2Path+"/new?size=3", "")
		if r.code != code {
			t.Errorf("%s creates a v2 discovery token: %d %s; want %d", user, r.code, r.body, code)
		}
	}
	for user, code := range map[string]int{"erin": 200, "frank": 200, "alice": 403} {
		if r := (as{t: t, base: base, auth: users[user]}).do("GET", "/v1/tokens", ""); r.code != code {
			t.Errorf("%s lists the v3 discovery tokens: %d %s; want %d", user, r.code, r.body, code)
		}
	}
	// Health, readiness and metrics stay public.
	for _, p := range []string{"/healthz", "/readyz", "/metrics"} {
		if r := (as{t: t, base: base}).do("GET", p, ""); r.code != 200 {
			t.Errorf("%s without credentials: %d %s", p, r.code, r.body)
		}
	}
}

// TestCORSPreflightUnderAuth: a browser page of an allowed origin (the
// dashboard) can use the API with credentials: its preflight, which
// carries none, is answered, and it may send Authorization and
// Beacon-Secret.
func TestCORSPreflightUnderAuth(t *testing.T) {
	cfg := authConfig(t)
	cfg.CORSAllowedOrigins = []string{"https://dash.example"}
	s := startServer(t, cfg)
	base := s.Endpoints().HTTP
	r := as{t: t, base: base}.do("OPTIONS", "/v1/registry/instances", "", "Origin", "https://dash.example",
		"Access-Control-Request-Method", "POST", "Access-Control-Request-Headers", "authorization, beacon-secret, content-type")
	if r.code != http.StatusNoContent || !strings.Contains(r.header.Get("Access-Control-Allow-Headers"), "Beacon-Secret") ||
		!strings.Contains(r.header.Get("Access-Control-Allow-Headers"), "Authorization") {
		t.Fatalf("preflight under auth: %d %v %s", r.code, r.header, r.body)
	}
	r = as{t: t, base: base, auth: basic("root", rootPassword)}.do("GET", "/v1/registry/instances", "", "Origin", "https://dash.example")
	if r.code != 200 || r.header.Get("Access-Control-Allow-Origin") != "https://dash.example" {
		t.Fatalf("GET with credentials from the allowed origin: %d %v", r.code, r.header)
	}
	r = as{t: t, base: base}.do("GET", "/v1/registry/instances", "", "Origin", "https://dash.example")
	if r.code != http.StatusUnauthorized || !strings.Contains(r.header.Get("Access-Control-Expose-Headers"), "WWW-Authenticate") {
		t.Fatalf("GET without credentials from the allowed origin: %d %v", r.code, r.header)
	}
}

// TestRepeatedHeadersRefused: two Authorization headers were resolved to
// the first without a word (a proxy in front may read the last: two
// readers, two users); now any header that carries one value, given
// twice, is answered 400 saying to send it once, before authentication.
func TestRepeatedHeadersRefused(t *testing.T) {
	s := startServer(t, authConfig(t))
	base := s.Endpoints().HTTP
	for _, tc := range []struct {
		name   string
		values []string
	}{
		{"Authorization", []string{basic("root", rootPassword), basic("nobody", "x")}},
		{"Authorization", []string{basic("root", rootPassword), basic("root", rootPassword)}},
		{"Beacon-Secret", []string{"a", "b"}},
		{"Last-Event-ID", []string{"1", "2"}},
	} {
		req, err := http.NewRequest("GET", base+"/v1/registry/instances", nil)
		if err != nil {
			t.Fatal(err)
		}
		for _, v := range tc.values {
			req.Header.Add(tc.name, v)
		}
		if tc.name != "Authorization" {
			req.Header.Set("Authorization", basic("root", rootPassword))
		}
		resp, err := http.DefaultClient.Do(req)
		if err != nil {
			t.Fatal(err)
		}
		b, _ := io.ReadAll(resp.Body)
		resp.Body.Close()
		if resp.StatusCode != http.StatusBadRequest || !strings.Contains(string(b), "the "+tc.name+" header is given 2 times: send it once") {
			t.Errorf("%s twice: %d %s", tc.name, resp.StatusCode, b)
		}
	}
	if a := (as{t: t, base: base, auth: basic("root", rootPassword)}).do("GET", "/v1/registry/instances", ""); a.code != http.StatusOK {
		t.Fatalf("one Authorization header: %d %s", a.code, a.body)
	}
}
