package v2_test

import (
	"context"
	"encoding/json"
	"errors"
	"io"
	"net/http"
	"net/http/httptest"
	"net/url"
	"strconv"
	"strings"
	"sync"
	"testing"
	"time"

	v2 "github.com/beaconplane/beacon/bootstrap/v2"
	"github.com/beaconplane/beacon/internal/testkit/etcdtest"
	"github.com/beaconplane/beacon/store"
	etcdstore "github.com/beaconplane/beacon/store/etcd"
	"github.com/beaconplane/beacon/store/memory"
	"go.uber.org/goleak"
)

func TestMain(m *testing.M) {
	goleak.VerifyTestMain(m, leakOptions()...)
}

// clock is a settable test clock.
type clock struct {
	mu  sync.Mutex
	now time.Time
}

func (c *clock) Now() time.Time { c.mu.Lock(); defer c.mu.Unlock(); return c.now }
func (c *clock) Add(d time.Duration) {
	c.mu.Lock()
	defer c.mu.Unlock()
	c.now = c.now.Add(d)
}

// env is a Service mounted at /disc on a real HTTP server.
type env struct {
	svc   *v2.Service
	st    store.Store
	srv   *httptest.Server
	base  string
	clock *clock
}

func newEnv(t *testing.T, st store.Store, mod func(*v2.Config)) *env {
	t.Helper()
	if st == nil {
		mem := memory.New(memory.Config{})
		t.Cleanup(func() { _ = mem.Close() })
		st = mem
	}
	e := &env{st: st, clock: &clock{now: time.Date(2026, 11, 22, 10, 0, 0, 0, time.UTC)}}
	mux := http.NewServeMux()
	e.srv = httptest.NewServer(mux)
	t.Cleanup(e.srv.Close)
	e.base = e.srv.URL + "/disc"
	cfg := v2.Config{Store: st, BaseURL: e.base, Now: e.clock.Now, WaitTimeout: 5 * time.Second}
	if mod != nil {
		mod(&cfg)
	}
	svc, err := v2.New(cfg)
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { _ = svc.Close() })
	e.svc = svc
	mux.Handle("/disc/", http.StripPrefix("/disc", svc))
	return e
}

// resp is a decoded answer.
type resp struct {
	status int
	index  int64
	body   string
	event  v2.Event
	err    v2.Error
}

func (e *env) do(t *testing.T, method, path string, form url.Values) resp {
	t.Helper()
	var body io.Reader
	if form != nil {
		body = strings.NewReader(form.Encode())
	}
	req, err := http.NewRequest(method, e.base+path, body)
	if err != nil {
		t.Fatal(err)
	}
	if form != nil {
		req.Header.Set("Content-Type", "application/x-www-form-urlencoded")
	}
	hr, err := http.DefaultClient.Do(req)
	if err != nil {
		t.Fatal(err)
	}
	defer hr.Body.Close()
	b, _ := io.ReadAll(hr.Body)
	r := resp{status: hr.StatusCode, body: string(b)}
	if x := hr.Header.Get("X-Etcd-Index"); x != "" {
		r.index, _ = strconv.ParseInt(x, 10, 64)
	}
	if strings.HasPrefix(hr.Header.Get("Content-Type"), "application/json") && len(b) > 0 {
		if hr.StatusCode < 300 {
			if err := json.Unmarshal(b, &r.event); err != nil {
				t.Fatalf("%s %s: bad JSON %q: %v", method, path, b, err)
			}
		} else if err := json.Unmarshal(b, &r.err); err != nil {
			t.Fatalf("%s %s: bad error JSON %q: %v", method, path, b, err)
		}
	}
	return r
}

func (e *env) newToken(t *testing.T, size int) string {
	t.Helper()
	r := e.do(t, "GET", "/new?size="+strconv.Itoa(size), nil)
	if r.status != 200 || !strings.HasPrefix(r.body, e.base+"/") {
		t.Fatalf("/new: %d %q", r.status, r.body)
	}
	return strings.TrimPrefix(r.body, e.base+"/")
}

// backends runs fn against every store the service is used with: the
// memory backend and Beacon's etcd backend over a real etcd.
func backends(t *testing.T, fn func(t *testing.T, st store.Store)) {
	t.Run("memory", func(t *testing.T) {
		mem := memory.New(memory.Config{})
		t.Cleanup(func() { _ = mem.Close() })
		fn(t, mem)
	})
	t.Run("etcd", func(t *testing.T) {
		srv := etcdtest.Start(t, etcdtest.Options{Name: "v2-store"})
		st := etcdstore.NewFromClient(srv.Client(t))
		t.Cleanup(func() { _ = st.Close() })
		fn(t, st)
	})
}

func TestTokenLifecycle(t *testing.T) { backends(t, testTokenLifecycle) }

func testTokenLifecycle(t *testing.T, st store.Store) {
	e := newEnv(t, st, nil)
	tok := e.newToken(t, 2)
	if len(tok) != 32 || strings.Trim(tok, "0123456789abcdef") != "" {
		t.Fatalf("token %q is not 32 lower-case hex digits", tok)
	}
	regKey := "/_etcd/registry/" + tok

	size := e.do(t, "GET", "/"+tok+"/_config/size?quorum=false&recursive=false&sorted=false", nil)
	if size.status != 200 || size.event.Action != "get" || *size.event.Node.Value != "2" || size.event.Node.Key != regKey+"/_config/size" {
		t.Fatalf("size: %+v", size)
	}
	list := e.do(t, "GET", "/"+tok+"?quorum=false&recursive=false&sorted=false", nil)
	if list.status != 200 || !list.event.Node.Dir || len(list.event.Node.Nodes) != 0 || list.index == 0 {
		t.Fatalf("empty listing: %+v", list)
	}

	// Register as etcd's client does.
	put := e.do(t, "PUT", "/"+tok+"/8e9e05c52164694d?prevExist=false", url.Values{"value": {"infra0=http://10.0.1.10:2380"}})
	if put.status != http.StatusCreated || put.event.Action != "create" ||
		put.event.Node.Key != regKey+"/8e9e05c52164694d" || put.event.Node.CreatedIndex != put.index ||
		put.event.Node.CreatedIndex <= list.index {
		t.Fatalf("create: %+v", put)
	}
	dup := e.do(t, "PUT", "/"+tok+"/8e9e05c52164694d?prevExist=false", url.Values{"value": {"other=http://x:1"}})
	if dup.status != http.StatusPreconditionFailed || dup.err.ErrorCode != 105 || dup.err.Message != "Key already exists" ||
		dup.err.Cause != regKey+"/8e9e05c52164694d" {
		t.Fatalf("duplicate: %+v", dup)
	}
	// The wait etcd's client makes on its own key finds the write.
	self := e.do(t, "GET", "/"+tok+"/8e9e05c52164694d?wait=true&waitIndex="+strconv.FormatInt(put.event.Node.CreatedIndex, 10)+"&recursive=false", nil)
	if self.status != 200 || self.event.Node.ModifiedIndex != put.event.Node.CreatedIndex {
		t.Fatalf("self wait: %+v", self)
	}

	// The listing shows members, never _config, sorted by key.
	e.do(t, "PUT", "/"+tok+"/1", url.Values{"value": {"infra1=http://10.0.1.11:2380"}})
	list = e.do(t, "GET", "/"+tok+"/", nil)
	if n := list.event.Node.Nodes; len(n) != 2 || n[0].Key != regKey+"/1" || n[1].Key != regKey+"/8e9e05c52164694d" {
		t.Fatalf("listing: %s", list.body)
	}
	if strings.Contains(list.body, "_config") || strings.Contains(list.body, "_meta") {
		t.Fatalf("hidden keys listed: %s", list.body)
	}
	recursive := e.do(t, "GET", "/"+tok+"?recursive=true", nil)
	if strings.Contains(recursive.body, "_config") || len(recursive.event.Node.Nodes) != 2 {
		t.Fatalf("recursive listing: %s", recursive.body)
	}

	// Update with a plain PUT returns the previous node.
	set := e.do(t, "PUT", "/"+tok+"/1", url.Values{"value": {"infra1=http://10.0.1.12:2380"}})
	if set.status != 200 || set.event.Action != "set" || set.event.PrevNode == nil || *set.event.PrevNode.Value != "infra1=http://10.0.1.11:2380" {
		t.Fatalf("set: %+v", set)
	}
	del := e.do(t, "DELETE", "/"+tok+"/1", nil)
	if del.status != 200 || del.event.Action != "delete" || del.event.PrevNode == nil {
		t.Fatalf("delete: %+v", del)
	}
	if r := e.do(t, "GET", "/"+tok+"/1", nil); r.status != 404 || r.err.ErrorCode != 100 || r.err.Cause != regKey+"/1" {
		t.Fatalf("deleted key: %+v", r)
	}
	// Writes to reserved keys are refused.
	for _, p := range []string{"/_config/size", "/_meta", "/_x"} {
		if r := e.do(t, "PUT", "/"+tok+p, url.Values{"value": {"9"}}); r.status != 400 || r.err.ErrorCode != 106 {
			t.Fatalf("PUT %s: %+v", p, r)
		}
	}
	if r := e.do(t, "PUT", "/"+tok+"/a/b", url.Values{"value": {"x"}}); r.status != 400 || r.err.ErrorCode != 209 {
		t.Fatalf("nested PUT: %+v", r)
	}

	// Removing the token needs recursive=true.
	if r := e.do(t, "DELETE", "/"+tok, nil); r.status != 403 || r.err.ErrorCode != 102 {
		t.Fatalf("non-recursive token delete: %+v", r)
	}
	if r := e.do(t, "DELETE", "/"+tok+"?recursive=true", nil); r.status != 200 || !r.event.Node.Dir {
		t.Fatalf("token delete: %+v", r)
	}
	if r := e.do(t, "GET", "/"+tok, nil); r.status != 404 || r.err.ErrorCode != 100 {
		t.Fatalf("removed token: %+v", r)
	}
	kvs, _, err := e.st.List(context.Background(), v2.DefaultPrefix)
	if err != nil || len(kvs) != 0 {
		t.Fatalf("keys left after removal: %v, %v", kvs, err)
	}
}

func TestWait(t *testing.T) { backends(t, testWait) }

func testWait(t *testing.T, st store.Store) {
	e := newEnv(t, st, func(c *v2.Config) { c.WaitTimeout = 300 * time.Millisecond })
	tok := e.newToken(t, 3)
	list := e.do(t, "GET", "/"+tok, nil)

	// A recursive wait from X-Etcd-Index+1 sees the next registration.
	got := make(chan resp, 1)
	var wg sync.WaitGroup
	wg.Add(1)
	go func() {
		defer wg.Done()
		for { // etcd's client polls again after an empty answer
			r := e.do(t, "GET", "/"+tok+"?wait=true&recursive=true&waitIndex="+strconv.FormatInt(list.index+1, 10), nil)
			if r.status == 200 && r.body == "" {
				continue
			}
			got <- r
			return
		}
	}()
	t.Cleanup(wg.Wait)
	put := e.do(t, "PUT", "/"+tok+"/a1?prevExist=false", url.Values{"value": {"a=http://a:1"}})
	select {
	case r := <-got:
		if r.event.Node == nil || r.event.Node.Key != put.event.Node.Key || r.event.Node.ModifiedIndex != put.index {
			t.Fatalf("wait answer: %+v", r)
		}
	case <-time.After(10 * time.Second):
		t.Fatal("wait did not see the registration")
	}

	// A wait that sees nothing is answered 200 with an empty body.
	start := time.Now()
	r := e.do(t, "GET", "/"+tok+"?wait=true&recursive=true", nil)
	if r.status != 200 || r.body != "" || r.index == 0 {
		t.Fatalf("timed-out wait: %+v", r)
	}
	if d := time.Since(start); d < 250*time.Millisecond {
		t.Fatalf("wait returned after %v", d)
	}

	// Changes to hidden keys do not answer recursive waits; a past index
	// answers at once from history.
	r = e.do(t, "GET", "/"+tok+"?wait=true&recursive=true&waitIndex=1", nil)
	if r.status != 200 || r.event.Node == nil || r.event.Node.Key != put.event.Node.Key {
		t.Fatalf("wait from history: %+v", r)
	}

	// A compacted index is etcd's error 401.
	if err := e.st.(store.Compactor).Compact(context.Background(), put.index); err != nil {
		t.Fatal(err)
	}
	r = e.do(t, "GET", "/"+tok+"?wait=true&recursive=true&waitIndex=1", nil)
	if r.status != 400 || r.err.ErrorCode != 401 || !strings.Contains(r.err.Cause, "the requested history has been cleared") {
		t.Fatalf("compacted wait: %+v", r)
	}
}

func TestWaitEndsWhenTokenRemoved(t *testing.T) {
	e := newEnv(t, nil, nil)
	tok := e.newToken(t, 3)
	got := make(chan resp, 1)
	var wg sync.WaitGroup
	wg.Add(1)
	go func() {
		defer wg.Done()
		got <- e.do(t, "GET", "/"+tok+"?wait=true&recursive=true", nil)
	}()
	t.Cleanup(wg.Wait)
	// Whether the removal lands before the wait reads the token or while
	// it holds its watch, the answer is the same 404.
	if err := e.svc.RemoveToken(context.Background(), tok); err != nil {
		t.Fatal(err)
	}
	select {
	case r := <-got:
		if r.status != 404 || r.err.ErrorCode != 100 {
			t.Fatalf("wait on removed token: %+v", r)
		}
	case <-time.After(10 * time.Second):
		t.Fatal("wait on a removed token did not end")
	}
}

func TestTokensExpire(t *testing.T) {
	e := newEnv(t, nil, func(c *v2.Config) { c.MaxAge = time.Hour; c.GCInterval = 10 * time.Millisecond })
	old := e.newToken(t, 1)
	e.clock.Add(30 * time.Minute)
	fresh := e.newToken(t, 1)
	if r := e.do(t, "PUT", "/"+old+"/1", url.Values{"value": {"a=http://a:1"}}); r.status != 201 {
		t.Fatalf("register: %+v", r)
	}
	// Watch the store for the collection's deletions: the event to wait on.
	ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
	defer cancel()
	_, rev, err := e.st.List(ctx, v2.DefaultPrefix)
	if err != nil {
		t.Fatal(err)
	}
	w := e.st.Watch(ctx, v2.DefaultPrefix, rev+1)
	e.clock.Add(31 * time.Minute) // old is 61 minutes old, fresh 31
	if r := e.do(t, "GET", "/"+old, nil); r.status != 404 {
		t.Fatalf("expired token answers %d", r.status)
	}
	deleted := map[string]bool{}
	for len(deleted) < 3 { // _meta, _config/size, 1
		select {
		case wr := <-w:
			if wr.Err != nil {
				t.Fatal(wr.Err)
			}
			for _, ev := range wr.Events {
				if ev.Type != store.EventDelete || !strings.Contains(ev.KV.Key, old) {
					t.Fatalf("unexpected change %v %s", ev.Type, ev.KV.Key)
				}
				deleted[ev.KV.Key] = true
			}
		case <-ctx.Done():
			t.Fatalf("collection deleted only %v", deleted)
		}
	}
	if r := e.do(t, "GET", "/"+fresh, nil); r.status != 200 {
		t.Fatalf("fresh token: %+v", r)
	}
}

func TestBadRequests(t *testing.T) {
	e := newEnv(t, nil, func(c *v2.Config) { c.MaxMembers = 1 })
	for _, q := range []string{"size=0", "size=-1", "size=abc", "size=1001", "size=3.5", "size=3&size=4", "size=%2B3"} {
		r := e.do(t, "GET", "/new?"+q, nil)
		if r.status != 400 || !strings.Contains(r.body, "size") {
			t.Errorf("/new?%s: %d %q", q, r.status, r.body)
		}
	}
	// An empty size is the default, 3, as on discovery.etcd.io.
	if r := e.do(t, "GET", "/new?size=", nil); r.status != 200 {
		t.Errorf("/new?size=: %d %q", r.status, r.body)
	}
	tok := e.newToken(t, 3)
	for q, code := range map[string]int{
		"waitIndex=abc":   203,
		"recursive=maybe": 209,
		"wait=yes":        209,
		"sorted=2":        209,
		"ttl=5":           209,
		"prevValue=x":     209,
		"waitIndex=-1":    203,
		"prevExist=sorta": 209,
		// An empty value is refused, as etcd's v2 API refuses it (it
		// parses booleans and indexes strictly), not read as absent.
		"wait=":      209,
		"wait":       209,
		"recursive=": 209,
		"waitIndex=": 203,
		"sorted=":    209,
		"quorum=":    209,
		"prevExist=": 209,
	} {
		r := e.do(t, "GET", "/"+tok+"?"+q, nil)
		if r.status != 400 || r.err.ErrorCode != code || r.err.Message == "" {
			t.Errorf("?%s: %+v, want errorCode %d", q, r, code)
		}
	}
	if r := e.do(t, "PUT", "/"+tok+"/x?wait=true", url.Values{"value": {"v"}}); r.err.ErrorCode != 209 {
		t.Errorf("wait on PUT: %+v", r)
	}
	if r := e.do(t, "PUT", "/"+tok+"/x", url.Values{"value": {strings.Repeat("v", 17<<10)}}); r.err.ErrorCode != 209 {
		t.Errorf("huge value: %+v", r)
	}
	e.do(t, "PUT", "/"+tok+"/x", url.Values{"value": {"a=http://a:1"}})
	if r := e.do(t, "PUT", "/"+tok+"/y", url.Values{"value": {"b=http://b:1"}}); r.err.ErrorCode != 103 {
		t.Errorf("too many members: %+v", r)
	}
	if r := e.do(t, "GET", "/"+strings.Repeat("f", 32), nil); r.status != 404 || r.err.ErrorCode != 100 {
		t.Errorf("unknown token: %+v", r)
	}
	// A path that cannot be a token is a key that does not exist: etcd's
	// JSON error, like any other unknown key.
	if r := e.do(t, "GET", "/not%20a%20token", nil); r.status != 404 || r.err.ErrorCode != 100 || r.err.Cause != "/_etcd/registry/not a token" {
		t.Errorf("bad token path: %+v", r)
	}
	if r := e.do(t, "PATCH", "/"+tok, nil); r.status != 405 {
		t.Errorf("PATCH: %+v", r)
	}
	if r := e.do(t, "GET", "/health", nil); r.status != 200 || r.body != "OK" {
		t.Errorf("health: %+v", r)
	}
}

func TestConfigValidate(t *testing.T) {
	mem := memory.New(memory.Config{})
	defer mem.Close()
	for name, cfg := range map[string]v2.Config{
		"no store":       {BaseURL: "http://a:1"},
		"no base":        {Store: mem},
		"trailing slash": {Store: mem, BaseURL: "http://a:1/"},
		"bad scheme":     {Store: mem, BaseURL: "ftp://a:1"},
		"bad prefix":     {Store: mem, BaseURL: "http://a:1", Prefix: "/x"},
		"negative":       {Store: mem, BaseURL: "http://a:1", MaxAge: -1},
	} {
		if _, err := v2.New(cfg); err == nil {
			t.Errorf("%s: accepted", name)
		}
	}
}

func TestClosedServiceRefuses(t *testing.T) {
	e := newEnv(t, nil, nil)
	if err := e.svc.Close(); err != nil {
		t.Fatal(err)
	}
	if r := e.do(t, "GET", "/new", nil); r.status != 503 {
		t.Fatalf("after Close: %+v", r)
	}
	if _, err := e.svc.CreateToken(context.Background(), 3); !errors.Is(err, v2.ErrClosed) {
		t.Fatalf("CreateToken after Close: %v", err)
	}
	_ = e.svc.Close() // idempotent
}

// /new creates tokens on GET and POST only (bootstrap.md); PUT, like any
// other method, is answered 405 and creates nothing.
func TestNewRefusesPut(t *testing.T) {
	e := newEnv(t, nil, nil)
	for _, m := range []string{"PUT", "DELETE", "PATCH"} {
		r := e.do(t, m, "/new?size=2", nil)
		if r.status != http.StatusMethodNotAllowed || strings.Contains(r.body, e.base) {
			t.Errorf("%s /new: %d %q, want 405", m, r.status, r.body)
		}
	}
	for _, m := range []string{"GET", "POST"} {
		if r := e.do(t, m, "/new?size=2", nil); r.status != 200 {
			t.Errorf("%s /new: %d %q", m, r.status, r.body)
		}
	}
}
