package server

import (
	"context"
	"encoding/json"
	"errors"
	"net/http"
	"slices"
	"strings"
	"testing"
	"time"

	"github.com/beaconplane/beacon"
	"github.com/beaconplane/beacon/registry"
	"github.com/beaconplane/beacon/server/registryapi"
	etcdstore "github.com/beaconplane/beacon/store/etcd"
)

// sessionAs is a registry session of another process, acting as an etcd
// user of s's embedded etcd.
func sessionAs(t *testing.T, s *Server, user, password string, verify time.Duration) *registry.StoreRegistry {
	t.Helper()
	ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
	defer cancel()
	st, err := etcdstore.Open(ctx, etcdstore.Config{Endpoints: s.Endpoints().ClientURLs, Username: user, Password: password})
	if err != nil {
		t.Fatal(err)
	}
	r, err := registry.New(st, registry.Config{LeaseTTL: 5 * time.Second, VerifyInterval: verify})
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { _ = r.Close(); _ = st.Close() })
	return r
}

// TestOperatorAuthorizationTable: operator actions (drain and deregister
// an instance someone else registered) over a real embedded etcd with
// authentication on, for every user × action × namespace × kind of
// registration (HTTP, with a secret; a Go session whose one lease holds
// instances in both namespaces). etcd's roles decide: readwrite on the
// namespace's instance prefix suffices (opal has nothing else: not the
// ownership records bound to an HTTP registration's lease, nor the other
// namespace whose instances share the session's lease); read is not
// enough (403 saying what to grant); no or wrong credentials 401. What is
// allowed happens (draining, or gone), what is refused changes nothing;
// whoami tells the dashboard who may.
func TestOperatorAuthorizationTable(t *testing.T) {
	s := startServer(t, authConfig(t))
	root := rootClient(t, s)
	grant(t, root, "alice", "alice-pw", "readwrite /services/team-a/", "readwrite /beacon-owners/team-a/")
	grant(t, root, "opal", "opal-pw", "readwrite /services/team-a/")
	grant(t, root, "bob", "bob-pw", "read /services/team-a/")
	grant(t, root, "carol", "carol-pw")
	base := s.Endpoints().HTTP
	users := map[string]string{
		"root":  basic("root", rootPassword),
		"alice": basic("alice", "alice-pw"),
		"opal":  basic("opal", "opal-pw"),
		"bob":   basic("bob", "bob-pw"),
		"carol": basic("carol", "carol-pw"),
		"anon":  "",
		"wrong": basic("alice", "not-her-password"),
	}
	rootAs := as{t: t, base: base, auth: users["root"]}
	// One process whose session holds instances of both namespaces on one
	// lease; it does not verify, so that what the table did stays put.
	proc := sessionAs(t, s, "root", rootPassword, -1)
	ctx, cancel := context.WithTimeout(context.Background(), 2*time.Minute)
	defer cancel()

	type target struct {
		ref    beacon.Ref
		secret string // HTTP registrations
	}
	newTarget := func(kind, ns string) target {
		t.Helper()
		if kind == "session" {
			reg, err := proc.Register(ctx, beacon.Instance{Namespace: ns, Component: "api", Endpoint: "http", Address: "10.0.0.9:80"})
			if err != nil {
				t.Fatal(err)
			}
			return target{ref: reg.Instance().Ref()}
		}
		r := rootAs.do("POST", registryapi.InstancesPath, `{"namespace":"`+ns+`","component":"api","endpoint":"http","address":"10.0.0.1:80","ttl":"1m"}`)
		var reg registryapi.RegisterResponse
		if r.code != http.StatusCreated || json.Unmarshal([]byte(r.body), &reg) != nil {
			t.Fatalf("root registers in %s: %d %s", ns, r.code, r.body)
		}
		return target{ref: reg.Instance.Ref(), secret: reg.Secret}
	}
	stored := func(ref beacon.Ref) (beacon.Instance, bool) {
		t.Helper()
		r := rootAs.do("GET", registryapi.InstancesPath+"/"+ref.String(), "")
		if r.code == http.StatusNotFound {
			return beacon.Instance{}, false
		}
		var in beacon.Instance
		if r.code != http.StatusOK || json.Unmarshal([]byte(r.body), &in) != nil {
			t.Fatalf("root gets %s: %d %s", ref, r.code, r.body)
		}
		return in, true
	}

	const ok, unauth, forbid = 200, 401, 403
	// user → action → [team-a, team-b] → status ("ok" covers 200 and 204).
	want := map[string]map[string][2]int{
		"root":  {"drain": {ok, ok}, "deregister": {ok, ok}},
		"alice": {"drain": {ok, forbid}, "deregister": {ok, forbid}},
		"opal":  {"drain": {ok, forbid}, "deregister": {ok, forbid}},
		"bob":   {"drain": {forbid, forbid}, "deregister": {forbid, forbid}},
		"carol": {"drain": {forbid, forbid}, "deregister": {forbid, forbid}},
		"anon":  {"drain": {unauth, unauth}, "deregister": {unauth, unauth}},
		"wrong": {"drain": {unauth, unauth}, "deregister": {unauth, unauth}},
	}
	for _, user := range []string{"root", "alice", "opal", "bob", "carol", "anon", "wrong"} {
		for _, action := range []string{"drain", "deregister"} {
			for i, ns := range []string{"team-a", "team-b"} {
				for _, kind := range []string{"http", "session"} {
					tg := newTarget(kind, ns)
					got := as{t: t, base: base, auth: users[user]}.do("POST", registryapi.InstancesPath+"/"+tg.ref.String()+"/"+action, "")
					w := want[user][action][i]
					what := user + " " + action + "s a " + kind + " instance in " + ns
					if (w == ok && got.code != 200 && got.code != 204) || (w != ok && got.code != w) {
						t.Errorf("%s: %d %s; want %d", what, got.code, got.body, w)
						continue
					}
					in, present := stored(tg.ref)
					switch {
					case w == ok && action == "drain":
						if !present || in.Status != beacon.StatusDraining {
							t.Errorf("%s: 200, but the instance is %+v (present %v)", what, in, present)
						}
						var answered beacon.Instance
						if json.Unmarshal([]byte(got.body), &answered) != nil || !answered.Equal(in) {
							t.Errorf("%s: answered %s, stored %+v", what, got.body, in)
						}
						if tg.secret != "" {
							if r := rootAs.do("POST", registryapi.InstancesPath+"/"+tg.ref.String()+"/heartbeat", "", registryapi.SecretHeader, tg.secret); r.code != http.StatusOK {
								t.Errorf("%s: the owner's heartbeat after the drain: %d %s", what, r.code, r.body)
							}
						}
					case w == ok:
						if present {
							t.Errorf("%s: 204, but the instance is still there: %+v", what, in)
						}
						if tg.secret != "" {
							if r := rootAs.do("POST", registryapi.InstancesPath+"/"+tg.ref.String()+"/heartbeat", "", registryapi.SecretHeader, tg.secret); r.code != http.StatusNotFound {
								t.Errorf("%s: the owner's heartbeat after the deregistration: %d %s, want 404", what, r.code, r.body)
							}
						}
					default:
						if !present || in.Status != beacon.StatusServing {
							t.Errorf("%s: refused (%d), but the instance is %+v (present %v)", what, got.code, in, present)
						}
					}
					switch got.code {
					case unauth:
						if got.header.Get("WWW-Authenticate") == "" || !strings.Contains(got.body, `"code":"unauthenticated"`) {
							t.Errorf("%s: 401 without a challenge or code: %v %s", what, got.header, got.body)
						}
					case forbid:
						for _, s := range []string{`"code":"permission_denied"`, "grant", "readwrite", ns, user} {
							if !strings.Contains(got.body, s) {
								t.Errorf("%s: the 403 does not say %q: %s", what, s, got.body)
							}
						}
					}
				}
			}
		}
	}

	// whoami tells the dashboard who may act on instances, per namespace.
	whoami := func(user string) WhoAmI {
		t.Helper()
		var who WhoAmI
		r := as{t: t, base: base, auth: users[user]}.do("GET", WhoAmIPath, "")
		if r.code != http.StatusOK || json.Unmarshal([]byte(r.body), &who) != nil {
			t.Fatalf("whoami %s: %d %s", user, r.code, r.body)
		}
		return who
	}
	if who := whoami("alice"); who.Namespaces["team-a"] != (Access{Read: true, Write: true, Operate: true}) || who.AllNamespaces.Operate {
		t.Errorf("whoami alice: %+v", who)
	}
	if who := whoami("opal"); who.Namespaces["team-a"] != (Access{Read: true, Operate: true}) {
		t.Errorf("whoami opal: %+v", who)
	}
	if who := whoami("bob"); who.Namespaces["team-a"] != (Access{Read: true}) {
		t.Errorf("whoami bob: %+v", who)
	}
	if who := whoami("root"); !who.AllNamespaces.Operate {
		t.Errorf("whoami root: %+v", who)
	}
}

// TestOperatorActionsOnLiveOwners: an operator (opal, readwrite on her
// namespace only) drains a live Go session's instance through the HTTP
// API; the session adopts the drain across its verifications (the
// registration shows draining, a state change says who-knows-what
// happened) and its own Update keeps it. Her deregistration of it does not
// last (the session writes it again, draining); her deregistration of an
// HTTP registration does, and its owner's heartbeat then gets 404.
func TestOperatorActionsOnLiveOwners(t *testing.T) {
	s := startServer(t, authConfig(t))
	root := rootClient(t, s)
	grant(t, root, "opal", "opal-pw", "readwrite /services/team-a/")
	base := s.Endpoints().HTTP
	opal := as{t: t, base: base, auth: basic("opal", "opal-pw")}
	proc := sessionAs(t, s, "root", rootPassword, 200*time.Millisecond)
	ctx, cancel := context.WithTimeout(context.Background(), time.Minute)
	defer cancel()
	reg, err := proc.Register(ctx, beacon.Instance{Namespace: "team-a", Component: "api", Endpoint: "http", Address: "10.0.0.1:80"})
	if err != nil {
		t.Fatal(err)
	}
	if _, err := proc.Register(ctx, beacon.Instance{Namespace: "team-b", Component: "api", Endpoint: "http", Address: "10.0.0.2:80"}); err != nil {
		t.Fatal(err)
	}
	ref := reg.Instance().Ref()
	path := registryapi.InstancesPath + "/" + ref.String()
	if r := opal.do("POST", path+"/drain", ""); r.code != http.StatusOK {
		t.Fatalf("opal drains: %d %s", r.code, r.body)
	}
	waitFor := func(what string, cond func() bool) {
		t.Helper()
		for !cond() {
			select {
			case c, ok := <-proc.States():
				if !ok {
					t.Fatalf("waiting for %s: the session closed", what)
				}
				if slices.Contains(c.Drained, ref) && !errors.Is(c.Err, registry.ErrDrainedElsewhere) {
					t.Fatalf("state change %+v does not say why", c)
				}
			case <-ctx.Done():
				t.Fatalf("waiting for %s: %v", what, ctx.Err())
			}
		}
	}
	waitFor("the session to adopt the drain", func() bool { return reg.Instance().Status == beacon.StatusDraining })
	get := func() (beacon.Instance, int) {
		r := opal.do("GET", path, "")
		var in beacon.Instance
		_ = json.Unmarshal([]byte(r.body), &in)
		return in, r.code
	}
	if err := reg.Update(ctx, func(in *beacon.Instance) { in.Metadata = map[string]string{"v": "2"} }); err != nil {
		t.Fatal(err)
	}
	if in, code := get(); code != http.StatusOK || in.Status != beacon.StatusDraining || in.Metadata["v"] != "2" {
		t.Fatalf("after the owner's Update: %d %+v", code, in)
	}

	// Deregistering a live session's instance does not last: watchers see
	// it go and come back, still draining.
	w, err := proc.Watch(ctx, beacon.Query{Namespace: "team-a"})
	if err != nil {
		t.Fatal(err)
	}
	defer w.Close()
	if b, err := w.Next(ctx); err != nil || b.Kind != registry.Snapshot {
		t.Fatalf("first batch: %+v, %v", b, err)
	}
	if r := opal.do("POST", path+"/deregister", ""); r.code != http.StatusNoContent {
		t.Fatalf("opal deregisters: %d %s", r.code, r.body)
	}
	for gone, back := false, false; !back; {
		b, err := w.Next(ctx)
		if err != nil {
			t.Fatalf("waiting for the session to write its instance again: %v", err)
		}
		for _, ev := range b.Events {
			switch {
			case ev.Instance.Ref() != ref:
			case ev.Type == beacon.Removed:
				gone = true
			case ev.Instance.Status != beacon.StatusDraining:
				t.Fatalf("watchers saw the drained instance %s again: %+v", ev.Instance.Status, ev)
			case gone:
				back = true
			}
		}
	}
	if in, code := get(); code != http.StatusOK || in.Status != beacon.StatusDraining {
		t.Fatalf("after the re-registration: %d %+v", code, in)
	}

	// An HTTP registration's deregistration lasts.
	r := as{t: t, base: base, auth: basic("root", rootPassword)}.do("POST", registryapi.InstancesPath,
		`{"namespace":"team-a","component":"web","endpoint":"http","address":"10.0.0.3:80","ttl":"1m"}`)
	var owned registryapi.RegisterResponse
	if r.code != http.StatusCreated || json.Unmarshal([]byte(r.body), &owned) != nil {
		t.Fatalf("register: %d %s", r.code, r.body)
	}
	opath := registryapi.InstancesPath + "/" + owned.Instance.Ref().String()
	if r := opal.do("POST", opath+"/deregister", ""); r.code != http.StatusNoContent {
		t.Fatalf("opal deregisters the HTTP registration: %d %s", r.code, r.body)
	}
	rootAs := as{t: t, base: base, auth: basic("root", rootPassword)}
	if r := rootAs.do("POST", opath+"/heartbeat", "", registryapi.SecretHeader, owned.Secret); r.code != http.StatusNotFound {
		t.Fatalf("the owner's heartbeat after the deregistration: %d %s, want 404", r.code, r.body)
	}
	if r := rootAs.do("GET", opath, ""); r.code != http.StatusNotFound {
		t.Fatalf("the HTTP registration came back: %d %s", r.code, r.body)
	}
}

// TestOperatorActionsWithoutAuth: without etcd authentication there is no
// operator identity: drain and deregister are 403 with a message saying
// what is needed, and whoami offers them to nobody.
func TestOperatorActionsWithoutAuth(t *testing.T) {
	s := startServer(t, testConfig(t))
	base := s.Endpoints().HTTP
	anon := as{t: t, base: base}
	r := anon.do("POST", registryapi.InstancesPath, `{"namespace":"prod","component":"api","endpoint":"http","address":"10.0.0.1:80","ttl":"1m"}`)
	var owned registryapi.RegisterResponse
	if r.code != http.StatusCreated || json.Unmarshal([]byte(r.body), &owned) != nil {
		t.Fatalf("register: %d %s", r.code, r.body)
	}
	path := registryapi.InstancesPath + "/" + owned.Instance.Ref().String()
	for _, action := range []string{"drain", "deregister"} {
		r := anon.do("POST", path+"/"+action, "")
		if r.code != http.StatusForbidden || !strings.Contains(r.body, "registryapi.Config.Operators") || !strings.Contains(r.body, "readwrite") {
			t.Errorf("%s without auth: %d %s", action, r.code, r.body)
		}
	}
	var in beacon.Instance
	if r := anon.do("GET", path, ""); r.code != http.StatusOK || json.Unmarshal([]byte(r.body), &in) != nil || in.Status != beacon.StatusServing {
		t.Errorf("after the refusals: %d %s", r.code, r.body)
	}
	var who WhoAmI
	if r := anon.do("GET", WhoAmIPath, ""); json.Unmarshal([]byte(r.body), &who) != nil || who.AuthEnabled || !who.AllNamespaces.Write || who.AllNamespaces.Operate {
		t.Errorf("whoami without auth: %d %s", r.code, r.body)
	}
}
