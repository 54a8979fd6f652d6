package server

import (
	"context"
	"encoding/json"
	"net/http"
	"strings"
	"testing"

	"github.com/beaconplane/beacon/server/registryapi"
)

// TestCrossSiteRequestsRefused: a browser sends the credentials it holds
// for the server (an operator signed in to the dashboard) with requests
// that pages of other origins make, and a POST needs no preflight. Such
// requests are refused before anything is done (403, saying why): a
// drain, a registration, a token; the same requests from the server's own
// origin, from a CORS-allowed origin and from clients that are not
// browsers (no Origin, no Sec-Fetch-Site) work, and reads stay allowed.
func TestCrossSiteRequestsRefused(t *testing.T) {
	cfg := authConfig(t)
	cfg.CORSAllowedOrigins = []string{"https://dash.example"}
	s := startServer(t, cfg)
	root := rootClient(t, s)
	grant(t, root, "opal", "opal-pw", "readwrite /services/team-a/", "readwrite /beacon-owners/team-a/")
	base := s.Endpoints().HTTP
	opal := as{t: t, base: base, auth: basic("opal", "opal-pw")}
	r := opal.do("POST", registryapi.InstancesPath, `{"namespace":"team-a","component":"api","endpoint":"http","address":"10.0.0.1:80","ttl":"1m"}`)
	var owned registryapi.RegisterResponse
	if r.code != http.StatusCreated || json.Unmarshal([]byte(r.body), &owned) != nil {
		t.Fatalf("register: %d %s", r.code, r.body)
	}
	drain := registryapi.InstancesPath + "/" + owned.Instance.Ref().String() + "/drain"
	status := func() string {
		t.Helper()
		var in struct{ Status string }
		r := opal.do("GET", registryapi.InstancesPath+"/"+owned.Instance.Ref().String(), "")
		_ = json.Unmarshal([]byte(r.body), &in)
		return in.Status
	}
	self := strings.TrimSuffix(base, "/")

	// A page of another site, as Chromium sends it (a form's POST, or a
	// no-cors fetch), and as an older browser does (Origin only).
	for _, hdr := range [][]string{
		{"Origin", "https://evil.example", "Sec-Fetch-Site", "cross-site"},
		{"Origin", "null", "Sec-Fetch-Site", "cross-site"},
		{"Sec-Fetch-Site", "same-site"},
		{"Origin", "https://evil.example"},
	} {
		for _, req := range []struct{ method, path, body string }{
			{"POST", drain, ""},
			{"POST", registryapi.InstancesPath, `{"namespace":"team-a","component":"api","endpoint":"http","address":"10.6.6.6:80"}`},
			{"POST", "/v1/tokens", `{"size":3}`},
		} {
			r := opal.do(req.method, req.path, req.body, hdr...)
			if r.code != http.StatusForbidden || !strings.Contains(r.body, "cross-site request forgery") || !strings.Contains(r.body, "Config.CORSAllowedOrigins") {
				t.Errorf("%s %s with %v: %d %s, want 403 saying why", req.method, req.path, hdr, r.code, r.body)
			}
		}
		if got := opal.do("GET", registryapi.InstancesPath+"?namespace=team-a", "", hdr...); got.code != http.StatusOK {
			t.Errorf("a cross-site read with %v: %d %s", hdr, got.code, got.body)
		}
	}
	if st := status(); st != "serving" {
		t.Fatalf("a refused cross-site drain changed the instance: %s", st)
	}
	var list registryapi.ListResponse
	if r := opal.do("GET", registryapi.InstancesPath+"?namespace=team-a", ""); json.Unmarshal([]byte(r.body), &list) != nil || len(list.Instances) != 1 {
		t.Fatalf("a refused cross-site registration was written: %s", r.body)
	}

	// The server's own pages, an allowed origin, and non-browser clients.
	for _, hdr := range [][]string{
		{"Origin", self, "Sec-Fetch-Site", "same-origin"},
		{"Origin", self},
		{"Origin", "https://dash.example", "Sec-Fetch-Site", "cross-site"},
		nil,
	} {
		if r := opal.do("POST", drain, "", hdr...); r.code != http.StatusOK {
			t.Errorf("drain with %v: %d %s", hdr, r.code, r.body)
		}
	}
	if st := status(); st != "draining" {
		t.Fatalf("after the allowed drains: %s", st)
	}
}

// TestStateChangingGETsRefusedCrossSite: GET /v2/discovery/new?size=3
// creates a token (discovery.etcd.io's protocol uses GET) and was outside
// the CSRF check, which lets every GET through: a page of another site
// could create tokens with an image tag. Every request that writes is now
// checked whatever its method (writesDespiteMethod): refused cross-site,
// with no token created, while the server's own pages, allowed origins,
// and clients that are not browsers — curl, etcd's discovery client —
// still create tokens.
func TestStateChangingGETsRefusedCrossSite(t *testing.T) {
	cfg := testConfig(t)
	cfg.CORSAllowedOrigins = []string{"https://dash.example"}
	s := startServer(t, cfg)
	base := s.Endpoints().HTTP
	anon := as{t: t, base: base}
	tokens := func() int {
		t.Helper()
		kvs, _, err := s.Store().List(context.Background(), v2Prefix)
		if err != nil {
			t.Fatal(err)
		}
		n := 0
		for _, kv := range kvs {
			if strings.HasSuffix(kv.Key, "/_config/size") {
				n++
			}
		}
		return n
	}
	before := tokens()
	for _, hdr := range [][]string{
		{"Origin", "https://evil.example", "Sec-Fetch-Site", "cross-site"},
		{"Sec-Fetch-Site", "cross-site"},
		{"Sec-Fetch-Site", "same-site"},
		{"Origin", "https://evil.example"},
	} {
		for _, path := range []string{V2Path + "/new?size=3", V2Path + "/new/?size=3", V2Path + "/new"} {
			r := anon.do("GET", path, "", hdr...)
			if r.code != http.StatusForbidden || !strings.Contains(r.body, "cross-site request forgery") {
				t.Errorf("GET %s with %v: %d %s, want 403 saying why", path, hdr, r.code, r.body)
			}
		}
	}
	if n := tokens(); n != before {
		t.Fatalf("refused cross-site GETs created %d tokens", n-before)
	}
	self := strings.TrimSuffix(base, "/")
	for _, hdr := range [][]string{
		nil, // curl, etcd's discovery client
		{"Origin", self, "Sec-Fetch-Site", "same-origin"},
		{"Sec-Fetch-Site", "none"}, // typed into the address bar
		{"Origin", "https://dash.example", "Sec-Fetch-Site", "cross-site"},
	} {
		r := anon.do("GET", V2Path+"/new?size=3", "", hdr...)
		if r.code != http.StatusOK || !strings.HasPrefix(r.body, base+V2Path+"/") {
			t.Errorf("GET /new with %v: %d %s, want a token URL", hdr, r.code, r.body)
		}
	}
	if n := tokens(); n != before+4 {
		t.Fatalf("%d tokens created by the allowed GETs, want 4", n-before)
	}
	// Reads of the v2 keys API stay allowed cross-site.
	if r := anon.do("GET", V2Path+"/health", "", "Sec-Fetch-Site", "cross-site"); r.code != http.StatusOK {
		t.Errorf("a cross-site read: %d %s", r.code, r.body)
	}
}

// TestTokenCreationIsRateLimited: 1,500 GET /v2/discovery/new and 1,500
// POST /v1/tokens from one address all created tokens within seconds,
// although the threat model promises per-client caps. Token creations are
// now counted per client per minute, over both APIs, and one over the cap
// is answered 429 with Retry-After, creating nothing.
func TestTokenCreationIsRateLimited(t *testing.T) {
	cfg := testConfig(t)
	cfg.Security.Limits.MaxTokenCreationsPerClient = 2
	s := startServer(t, cfg)
	anon := as{t: t, base: s.Endpoints().HTTP}
	if r := anon.do("GET", V2Path+"/new?size=3", ""); r.code != http.StatusOK {
		t.Fatalf("first /new: %d %s", r.code, r.body)
	}
	if r := anon.do("POST", "/v1/tokens", `{"size":3}`, "Content-Type", "application/json"); r.code != http.StatusCreated {
		t.Fatalf("first POST /v1/tokens: %d %s", r.code, r.body)
	}
	for _, req := range [][]string{{"GET", V2Path + "/new?size=3", ""}, {"POST", "/v1/tokens", `{"size":3}`}} {
		r := anon.do(req[0], req[1], req[2], "Content-Type", "application/json")
		if r.code != http.StatusTooManyRequests || r.header.Get("Retry-After") == "" || !strings.Contains(r.body, "discovery tokens") {
			t.Errorf("%s %s over the cap: %d Retry-After %q %s, want 429", req[0], req[1], r.code, r.header.Get("Retry-After"), r.body)
		}
	}
	// Reading is not creating.
	if r := anon.do("GET", "/v1/tokens", ""); r.code != http.StatusOK {
		t.Fatalf("GET /v1/tokens: %d %s", r.code, r.body)
	}
}
