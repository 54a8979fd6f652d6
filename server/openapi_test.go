package server

import (
	"bufio"
	"bytes"
	"context"
	"encoding/json"
	"fmt"
	"io"
	"net/http"
	"net/url"
	"regexp"
	"sort"
	"strings"
	"testing"
	"time"

	"github.com/beaconplane/beacon/backend"
	"github.com/beaconplane/beacon/internal/httpapi"
)

// TestOpenAPIMatchesServedRoutes keeps server/openapi.json and the running
// server in step, whatever routes are added:
//
//   - every route registered on the server's router (read from the router,
//     not from a list in this test) is documented, with its method, and
//     every documented route is served; /v1/openapi.json lists exactly the
//     routes the running server serves (the token API needs etcd: a server
//     on the memory backend does not list it);
//   - every operation documents the statuses every route can answer: 400
//     (a query it does not take), 405 (another method) and 503 (starting,
//     or the backend is unreachable);
//   - requests of every kind (a scenario through each API, and probes of
//     every route: unknown, repeated, malformed and too many query
//     parameters, another method, bad bodies) get only documented
//     statuses, and every JSON body, sent or answered, matches its schema.
//
// Adding a route means adding it to server/openapi.json, nothing more: the
// router answers unknown paths and methods with JSON errors, refuses what
// the documented parameters do not allow (queryRules), and this test
// finds the route by itself. When it fails, the message says what to add
// to server/openapi.json.
func TestOpenAPIMatchesServedRoutes(t *testing.T) {
	var doc apiDoc
	if err := json.Unmarshal(openAPI, &doc); err != nil {
		t.Fatalf("server/openapi.json: %v", err)
	}
	t.Run("embedded etcd", func(t *testing.T) {
		s := startServer(t, testConfig(t))
		checkRoutes(t, &doc, s)
		c := newAPIChecker(t, &doc, s)
		c.probeEveryRoute()
		c.registryScenario()
		c.tokenScenario()
		c.v2Scenario()
		c.healthScenario()
	})
	t.Run("memory backend", func(t *testing.T) {
		s := startServer(t, Config{HTTPAddr: "127.0.0.1:0", Backend: backend.Config{Name: backend.Memory}})
		checkRoutes(t, &doc, s)
		c := newAPIChecker(t, &doc, s)
		c.probeEveryRoute()
		c.registryScenario()
	})
	t.Run("starting", func(t *testing.T) {
		// While a member waits for its cluster, every route but health
		// answers 503 unavailable, as documented on every operation.
		rec := &recorder{header: http.Header{}}
		startingHandler(rec, httptestRequest(t))
		var e httpapi.Error
		if rec.code != http.StatusServiceUnavailable || json.Unmarshal(rec.body.Bytes(), &e) != nil || e.Code != "unavailable" {
			t.Fatalf("starting: %d %s", rec.code, rec.body.String())
		}
	})
}

const fixHint = "update server/openapi.json (paths, with every parameter and every status the route answers) and run this test again"

// goPattern splits a router pattern into method ("" for any) and path.
func goPattern(p string) (method, path string) {
	if m, rest, ok := strings.Cut(p, " "); ok {
		return m, rest
	}
	return "", p
}

// docPathOf turns a router path ({name...} wildcards, a final {$}) into an
// OpenAPI one.
func docPathOf(path string) string {
	return strings.ReplaceAll(strings.TrimSuffix(path, "{$}"), "...}", "}")
}

// checkRoutes compares the router's patterns, the document, and the
// document the server serves.
func checkRoutes(t *testing.T, doc *apiDoc, s *Server) {
	t.Helper()
	served := map[string]bool{} // "get /path"
	var prefixes []string
	for _, p := range s.http.routes.Patterns() {
		method, path := goPattern(p)
		if method == "" {
			if !strings.HasSuffix(path, "/") {
				t.Errorf("route %q takes every method: give it one (\"GET %s\"), or document why not; %s", p, path, fixHint)
				continue
			}
			prefixes = append(prefixes, path)
			continue
		}
		dp := docPathOf(path)
		m := strings.ToLower(method)
		if _, ok := doc.operation(dp, m); !ok {
			t.Errorf("route %q is served but server/openapi.json has no paths[%q].%s: %s", p, dp, m, fixHint)
		}
		served[m+" "+dp] = true
	}
	for _, prefix := range prefixes {
		n := 0
		for dp, item := range doc.Paths {
			if !strings.HasPrefix(dp, prefix) {
				continue
			}
			for m := range item {
				if m != "parameters" {
					served[m+" "+dp] = true
					n++
				}
			}
		}
		if n == 0 {
			t.Errorf("routes under %q are served but server/openapi.json has no path under it: %s", prefix, fixHint)
		}
	}
	// What the running server documents: exactly what it serves.
	code, body := get(t, s.Endpoints().HTTP+"/v1/openapi.json")
	var servedDoc apiDoc
	if err := json.Unmarshal([]byte(body), &servedDoc); code != 200 || err != nil {
		t.Fatalf("/v1/openapi.json: %d %v", code, err)
	}
	listed := map[string]bool{}
	for dp, item := range servedDoc.Paths {
		for m := range item {
			if m != "parameters" {
				listed[m+" "+dp] = true
			}
		}
	}
	for op := range served {
		if !listed[op] {
			t.Errorf("%s is served but /v1/openapi.json does not list it", op)
		}
	}
	for op := range listed {
		if !served[op] {
			t.Errorf("/v1/openapi.json lists %s but this server does not serve it", op)
		}
	}
	// Statuses every route of Beacon's own APIs can answer.
	for op := range served {
		m, dp, _ := strings.Cut(op, " ")
		if strings.HasPrefix(dp, "/v2/") {
			continue // the discovery.etcd.io protocol's own answers
		}
		o, _ := doc.operation(dp, m)
		for _, status := range []string{"400", "405", "503"} {
			if _, ok := doc.response(o, status); !ok {
				t.Errorf("paths[%q].%s does not document %s, which every route can answer: %s", dp, m, status, fixHint)
			}
		}
	}
}

// apiChecker sends requests and checks each answer against the document.
type apiChecker struct {
	t     *testing.T
	doc   *apiDoc
	s     *Server
	base  string
	paths []string // documented paths, most specific first
}

func newAPIChecker(t *testing.T, doc *apiDoc, s *Server) *apiChecker {
	c := &apiChecker{t: t, doc: doc, s: s, base: s.Endpoints().HTTP}
	for p := range doc.Paths {
		c.paths = append(c.paths, p)
	}
	// Literal segments before wildcards: /v2/discovery/new before
	// /v2/discovery/{token}.
	sort.Slice(c.paths, func(i, j int) bool {
		wi, wj := strings.Count(c.paths[i], "{"), strings.Count(c.paths[j], "{")
		if wi != wj {
			return wi < wj
		}
		return c.paths[i] < c.paths[j]
	})
	return c
}

// docPath finds the documented path a request path matches.
func (c *apiChecker) docPath(path string) (string, bool) {
	for _, p := range c.paths {
		re := "^" + regexp.MustCompile(`\\\{[^}]+\\\}`).ReplaceAllString(regexp.QuoteMeta(p), `[^/]+`) + "$"
		if regexp.MustCompile(re).MatchString(path) {
			return p, true
		}
	}
	return "", false
}

// answer is a response, read (a stream only to its first event).
type answer struct {
	code   int
	header http.Header
	body   []byte
}

// do sends a request and checks the answer: its status is documented for
// the operation, and its body (and, for a 2xx, the request's JSON body)
// matches the documented schemas.
func (c *apiChecker) do(method, target, contentType, body string) answer {
	c.t.Helper()
	return c.doHeader(method, target, contentType, body, nil)
}

// doHeader is do with extra request headers.
func (c *apiChecker) doHeader(method, target, contentType, body string, hdr http.Header) answer {
	c.t.Helper()
	ctx, cancel := context.WithTimeout(context.Background(), 20*time.Second)
	defer cancel()
	req, err := http.NewRequestWithContext(ctx, method, c.base+target, strings.NewReader(body))
	if err != nil {
		c.t.Fatal(err)
	}
	if contentType != "" {
		req.Header.Set("Content-Type", contentType)
	}
	for k, v := range hdr {
		req.Header[k] = v
	}
	// The route's own answer: a redirect (GET / to the dashboard) is not
	// followed.
	client := &http.Client{CheckRedirect: func(*http.Request, []*http.Request) error { return http.ErrUseLastResponse }}
	resp, err := client.Do(req)
	if err != nil {
		c.t.Fatalf("%s %s: %v", method, target, err)
	}
	defer resp.Body.Close()
	a := answer{code: resp.StatusCode, header: resp.Header}
	if strings.HasPrefix(resp.Header.Get("Content-Type"), "text/event-stream") {
		br := bufio.NewReader(resp.Body)
		for {
			line, err := br.ReadString('\n')
			if err != nil || strings.HasPrefix(line, "data: ") {
				a.body = []byte(strings.TrimPrefix(line, "data: "))
				break
			}
		}
	} else {
		a.body, _ = io.ReadAll(resp.Body)
	}
	c.check(method, target, body, a)
	return a
}

// servesAny reports whether the server serves dp with any method.
func (c *apiChecker) servesAny(dp string) bool {
	for _, m := range []string{"GET", "POST", "PUT", "PATCH", "DELETE"} {
		if c.s.http.routes.Serves(m, dp) {
			return true
		}
	}
	return false
}

func (c *apiChecker) check(method, target, reqBody string, a answer) {
	c.t.Helper()
	u, _ := url.Parse(target)
	dp, ok := c.docPath(u.Path)
	m := strings.ToLower(method)
	if m == "head" {
		m = "get"
	}
	if !ok {
		if a.code != http.StatusNotFound {
			c.t.Errorf("%s %s: %d, but server/openapi.json has no such path: %s", method, target, a.code, fixHint)
		}
		c.checkErrorBody(method, target, a)
		return
	}
	if !c.s.http.routes.Serves(method, dp) && !c.s.http.routes.Serves(http.MethodOptions, dp) && !c.servesAny(dp) {
		// Documented, but not served by this server (the token API
		// without etcd): a 404 like any unknown path.
		if a.code != http.StatusNotFound {
			c.t.Errorf("%s %s: %d, want 404 from a server that does not serve %s", method, target, a.code, dp)
		}
		c.checkErrorBody(method, target, a)
		return
	}
	op, ok := c.doc.operation(dp, m)
	if !ok {
		if a.code != http.StatusMethodNotAllowed {
			c.t.Errorf("%s %s: %d, but paths[%q] documents no %s: %s", method, target, a.code, dp, m, fixHint)
			return
		}
		if a.header.Get("Allow") == "" {
			c.t.Errorf("%s %s: 405 without Allow", method, target)
		}
		if !strings.HasPrefix(dp, "/v2/") {
			c.checkErrorBody(method, target, a)
		}
		return
	}
	status := fmt.Sprint(a.code)
	resp, ok := c.doc.response(op, status)
	if !ok {
		c.t.Errorf("%s %s answered %d (%s), which paths[%q].%s does not document: %s", method, target, a.code, bytes.TrimSpace(a.body), dp, m, fixHint)
		return
	}
	ct := a.header.Get("Content-Type")
	mt, _, _ := strings.Cut(ct, ";")
	if len(resp.Content) > 0 && len(a.body) > 0 {
		media, ok := resp.Content[mt]
		if !ok {
			c.t.Errorf("%s %s: %d with Content-Type %q, documented %v", method, target, a.code, ct, keys(resp.Content))
		} else if mt == "application/json" {
			var v any
			if err := json.Unmarshal(a.body, &v); err != nil {
				c.t.Errorf("%s %s: %d: body is not JSON: %v: %s", method, target, a.code, err, a.body)
			} else if probs := c.doc.validate(media.Schema, v, "response"); len(probs) > 0 {
				c.t.Errorf("%s %s: %d: the body does not match paths[%q].%s.responses[%s]: %s: %s", method, target, a.code, dp, m, status,
					strings.Join(probs, "; "), fixHint)
			}
		}
	}
	if a.code < 300 && op.RequestBody != nil && reqBody != "" {
		if media, ok := op.RequestBody.Content["application/json"]; ok {
			var v any
			if json.Unmarshal([]byte(reqBody), &v) == nil {
				if probs := c.doc.validate(media.Schema, v, "request"); len(probs) > 0 {
					c.t.Errorf("%s %s: the server accepted a body its schema refuses: %s: %s", method, target, strings.Join(probs, "; "), fixHint)
				}
			}
		}
	}
	if a.code >= 400 && !strings.HasPrefix(dp, "/v2/") {
		c.checkErrorBody(method, target, a)
	}
}

// checkErrorBody: errors of Beacon's own routes are JSON with a code.
func (c *apiChecker) checkErrorBody(method, target string, a answer) {
	c.t.Helper()
	var e httpapi.Error
	if err := json.Unmarshal(a.body, &e); err != nil || e.Code == "" || e.Message == "" || !strings.HasPrefix(a.header.Get("Content-Type"), "application/json") {
		c.t.Errorf("%s %s: %d error is not JSON {code, message}: %q %s", method, target, a.code, a.header.Get("Content-Type"), a.body)
	}
}

func keys[V any](m map[string]V) []string {
	out := make([]string, 0, len(m))
	for k := range m {
		out = append(out, k)
	}
	sort.Strings(out)
	return out
}

// probeEveryRoute sends, to every documented operation this server
// serves, the requests every route must handle alike.
func (c *apiChecker) probeEveryRoute() {
	many := make([]string, httpapi.MaxQueryParams+8)
	for i := range many {
		many[i] = fmt.Sprintf("p%d=1", i)
	}
	for _, dp := range c.paths {
		item := c.doc.Paths[dp]
		target := httpapi.FillPath(dp)
		if !c.servesAny(dp) {
			if a := c.do(http.MethodGet, target, "", ""); a.code != http.StatusNotFound {
				c.t.Errorf("GET %s is not served but answered %d", target, a.code)
			}
			continue
		}
		own := !strings.HasPrefix(dp, "/v2/")
		for m := range item {
			if m == "parameters" {
				continue
			}
			method := strings.ToUpper(m)
			op, _ := c.doc.operation(dp, m)
			if !c.s.http.routes.Serves(method, dp) {
				continue
			}
			body, ct := "", ""
			if op.RequestBody != nil {
				if _, ok := op.RequestBody.Content["application/json"]; ok {
					body, ct = "{}", "application/json"
				}
			}
			if m == "get" && dp == "/v1/registry/watch" {
				// A stream: only the probes that end it at once.
			} else {
				c.do(method, target, ct, body)
			}
			if !own {
				continue
			}
			for _, q := range []string{"bogus=1", "bogus=1&bogus=2", "%zz", strings.Join(many, "&")} {
				want := http.StatusBadRequest
				if op.XQuery == "open" && strings.HasPrefix(q, "bogus") {
					want = 0 // a page: unknown parameters are ignored
				}
				if a := c.do(method, target+"?"+q, ct, body); (want != 0 && a.code != want) || (want == 0 && a.code == http.StatusBadRequest) {
					c.t.Errorf("%s %s?%.40s: %d, want %v", method, target, q, a.code, map[bool]string{true: "400", false: "not 400"}[want != 0])
				}
			}
			for _, p := range op.Parameters {
				if p.In != "query" || op.XQuery == "open" {
					continue
				}
				q := url.Values{p.Name: {"1", "2"}}.Encode()
				if a := c.do(method, target+"?"+q, ct, body); a.code != http.StatusBadRequest {
					c.t.Errorf("%s %s?%s (given twice): %d, want 400", method, target, q, a.code)
				}
				// An empty value is not "no filter": ?namespace= once
				// listed every namespace.
				for _, q := range []string{p.Name + "=", p.Name} {
					a := c.do(method, target+"?"+q, ct, body)
					if a.code != http.StatusBadRequest || !strings.Contains(string(a.body), "is empty") {
						c.t.Errorf("%s %s?%s (empty): %d %s, want 400 saying the value is empty", method, target, q, a.code, a.body)
					}
				}
			}
			if ct != "" {
				c.do(method, target, "text/plain", body)
				c.do(method, target, "application/JSON; charset=UTF-8", body)
				c.do(method, target, ct, "")
				c.do(method, target, ct, `{"bogus": 1}`)
				c.do(method, target, ct, `{} {}`)
				c.do(method, target, ct, `{"x":"`+strings.Repeat("x", 70<<10)+`"}`)
			}
		}
		// Every method the path does not take.
		for _, m := range []string{"GET", "POST", "PUT", "PATCH", "DELETE"} {
			if _, ok := item[strings.ToLower(m)]; ok {
				continue
			}
			if a := c.do(m, target, "", ""); a.code != http.StatusMethodNotAllowed {
				c.t.Errorf("%s %s: %d, want 405", m, target, a.code)
			}
		}
	}
	// Paths nobody serves.
	for _, p := range []string{"/nope", "/v1/nope", "/v1/registry/instances/a/b"} {
		if a := c.do(http.MethodGet, p, "", ""); a.code != http.StatusNotFound {
			c.t.Errorf("GET %s: %d, want 404", p, a.code)
		}
	}
}

// registryScenario goes through the registry API's life cycle.
func (c *apiChecker) registryScenario() {
	t := c.t
	const coll = "/v1/registry/instances"
	reg := c.do("POST", coll, "application/json", `{"namespace":"prod","component":"api","endpoint":"http","id":"","address":"10.0.0.1:80","ttl":"20s","metadata":{"zone":"a"}}`)
	if reg.code != 201 {
		t.Fatalf("register: %d %s", reg.code, reg.body)
	}
	var rr struct {
		Instance struct{ ID string } `json:"instance"`
		Lease    string              `json:"lease"`
		Secret   string              `json:"secret"`
	}
	_ = json.Unmarshal(reg.body, &rr)
	owner := http.Header{"Beacon-Secret": {rr.Secret}}
	one := coll + "/prod/api/http/" + rr.Instance.ID
	c.do("POST", coll, "application/json", `{"namespace":"prod","component":"api","endpoint":"http","id":"`+rr.Instance.ID+`","address":"10.0.0.2:80"}`) // 409
	c.do("POST", coll, "application/json", `{"namespace":"Prod","component":"api","endpoint":"http","address":"10.0.0.2:80","ttl":15}`)                  // 400
	c.do("GET", one, "", "")
	c.do("GET", coll+"/prod/api/http/00000000000000ff", "", "") // 404
	c.do("GET", coll+"/prod/api/http/nothex", "", "")           // 400
	c.do("GET", coll+"?namespace=prod&status=serving", "", "")
	c.do("GET", coll+"?component=api", "", "")                                        // 400: component without namespace
	c.do("GET", coll+"?status=resting", "", "")                                       // 400
	c.do("GET", coll+"?namespace=&status=", "", "")                                   // empty filters: none
	c.doHeader("POST", one+"/heartbeat", "", "", owner)                               // 200
	c.doHeader("POST", one+"/heartbeat", "application/json", `{}`, owner)             // 200
	c.do("POST", one+"/heartbeat", "application/json", `{}`)                          // 404: no secret
	c.doHeader("POST", one+"/heartbeat", "", "", http.Header{"Beacon-Secret": {"x"}}) // 404: a wrong one
	c.do("POST", one+"/heartbeat", "application/json", `{"lease":"`+rr.Lease+`"}`)    // 400: a lease
	c.doHeader("POST", one+"/report", "", "", owner)                                  // 204, or 501 without ReportLeased
	c.do("POST", one+"/report", "application/json", `{}`)                             // 404: no secret (or 501)
	c.do("POST", coll, "application/json", `{"namespace":"prod","component":"api","endpoint":"http","address":"10.0.0.3:80","check":{"kind":"http","path":"/healthz","interval":"5s","timeout":"1s","rise":1,"fall":2}}`)
	c.do("POST", coll, "application/json", `{"namespace":"prod","component":"api","endpoint":"http","address":"10.0.0.3:80","check":{"kind":"http","path":"healthz"}}`) // 400
	c.doHeader("PATCH", one, "application/json", `{"status":"draining","metadata":{"zone":"b"}}`, owner)
	c.doHeader("PATCH", one, "application/json", `{"status":"resting"}`, owner)           // 400
	c.do("PATCH", one, "application/json", `{"lease":"`+rr.Lease+`","status":"serving"}`) // 400: a lease
	c.do("DELETE", one, "", "")                                                           // 404: no secret
	c.do("DELETE", one+"?lease="+rr.Lease, "", "")                                        // 400: a lease
	c.do("POST", one+"/drain", "", "")                                                    // 403: no operator without authentication
	c.do("POST", one+"/deregister", "application/json", `{}`)                             // 403
	c.doHeader("POST", one+"/drain", "", "", owner)                                       // 400: operators send no secret
	c.doHeader("DELETE", one, "", "", owner)                                              // 204
	c.doHeader("DELETE", one, "", "", owner)                                              // 404
	c.do("GET", "/v1/registry/watch?namespace=prod", "", "")
	c.do("GET", "/v1/registry/watch?since=x", "", "") // 400
}

// tokenScenario goes through the token API.
func (c *apiChecker) tokenScenario() {
	t := c.t
	c.do("GET", "/v1/tokens", "", "")
	created := c.do("POST", "/v1/tokens", "application/json", `{"size": 1}`)
	if created.code != 201 {
		t.Fatalf("create token: %d %s", created.code, created.body)
	}
	var ct struct{ Token string }
	_ = json.Unmarshal(created.body, &ct)
	c.do("POST", "/v1/tokens", "application/json", `{"token":"`+ct.Token+`"}`) // 409
	c.do("POST", "/v1/tokens", "application/json", `{"size": 0}`)              // 400
	c.do("GET", "/v1/tokens", "", "")
	c.do("GET", "/v1/tokens/"+ct.Token, "", "")
	c.do("GET", "/v1/tokens/no-such-token", "", "") // 404
	c.do("GET", "/v1/tokens/bad%20token", "", "")   // 400
	c.do("DELETE", "/v1/tokens/"+ct.Token, "", "")  // 200
	c.do("DELETE", "/v1/tokens/"+ct.Token, "", "")  // 404
}

// v2Scenario goes through the discovery.etcd.io protocol.
func (c *apiChecker) v2Scenario() {
	t := c.t
	c.do("GET", "/v2/discovery/", "", "")
	c.do("GET", "/v2/discovery/health", "", "")
	c.do("GET", "/v2/discovery/new?size=0", "", "") // 400
	a := c.do("GET", "/v2/discovery/new?size=1", "", "")
	if a.code != 200 {
		t.Fatalf("v2 new: %d %s", a.code, a.body)
	}
	tok := string(a.body[bytes.LastIndexByte(a.body, '/')+1:])
	base := "/v2/discovery/" + tok
	c.do("GET", base, "", "")
	c.do("GET", base+"/_config/size", "", "")
	c.do("PUT", base+"/m1?prevExist=false&value="+url.QueryEscape("m1=http://10.0.0.1:2380"), "", "") // 201
	c.do("PUT", base+"/m1?prevExist=false&value="+url.QueryEscape("m1=http://10.0.0.1:2380"), "", "") // 412
	c.do("GET", base+"/m1", "", "")
	c.do("GET", base+"?recursive=maybe", "", "") // 400
	c.do("DELETE", base, "", "")                 // 403: a directory
	c.do("DELETE", base+"/m1", "", "")
	c.do("DELETE", base+"?recursive=true", "", "")
	c.do("GET", base, "", "")   // 404
	c.do("PATCH", base, "", "") // 405
}

// healthScenario reads health, readiness, metrics and the document.
func (c *apiChecker) healthScenario() {
	for _, p := range []string{"/healthz", "/readyz", "/metrics", "/v1/openapi.json"} {
		if a := c.do("GET", p, "", ""); a.code != 200 {
			c.t.Errorf("GET %s: %d", p, a.code)
		}
	}
	// The dashboard's errors are JSON too (an unknown asset was a
	// text/plain 404).
	if a := c.do("GET", "/ui/assets/nope.js", "", ""); a.code != http.StatusNotFound {
		c.t.Errorf("GET /ui/assets/nope.js: %d, want 404", a.code)
	}
}

// recorder is a minimal http.ResponseWriter.
type recorder struct {
	header http.Header
	code   int
	body   bytes.Buffer
}

func (r *recorder) Header() http.Header { return r.header }
func (r *recorder) WriteHeader(code int) {
	if r.code == 0 {
		r.code = code
	}
}
func (r *recorder) Write(b []byte) (int, error) {
	if r.code == 0 {
		r.code = 200
	}
	return r.body.Write(b)
}

func httptestRequest(t *testing.T) *http.Request {
	req, err := http.NewRequest(http.MethodGet, "http://beacon/v1/registry/instances", nil)
	if err != nil {
		t.Fatal(err)
	}
	return req
}
