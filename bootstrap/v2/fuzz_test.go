package v2

import (
	"encoding/json"
	"errors"
	"net/http"
	"net/http/httptest"
	"net/url"
	"strings"
	"testing"
	"time"

	"github.com/beaconplane/beacon/bootstrap"
	"github.com/beaconplane/beacon/store/memory"
)

func FuzzParseSizeParam(f *testing.F) {
	for _, s := range []string{"", "3", "0", "-1", "abc", "1000", "1001", "+3", " 3", "3 "} {
		f.Add(s)
	}
	f.Fuzz(func(t *testing.T, s string) {
		n, err := ParseSizeParam(s)
		if err != nil {
			if !errors.Is(err, bootstrap.ErrInvalidSize) {
				t.Fatalf("ParseSizeParam(%q) = %v, want ErrInvalidSize", s, err)
			}
			return
		}
		if n < 1 || n > bootstrap.MaxSize || s != "" && (s[0] < '0' || s[0] > '9') {
			t.Fatalf("ParseSizeParam(%q) = %d", s, n)
		}
	})
}

func FuzzParseKeyRequest(f *testing.F) {
	for _, q := range []string{
		"wait=true&waitIndex=7&recursive=true", "quorum=false&recursive=false&sorted=false",
		"prevExist=false", "waitIndex=abc", "recursive=maybe", "ttl=3", "waitIndex=99999999999999999999",
	} {
		f.Add(q, "GET")
		f.Add(q, "PUT")
	}
	f.Fuzz(func(t *testing.T, query, method string) {
		form, err := url.ParseQuery(query)
		if err != nil {
			return
		}
		kr, verr := parseKeyRequest(form, method)
		if verr != nil {
			if verr.Message == "" || errorStatus(verr.ErrorCode) != http.StatusBadRequest {
				t.Fatalf("error %+v", verr)
			}
			return
		}
		if kr.waitIndex < 0 || (kr.wait && method != "GET") {
			t.Fatalf("accepted %q (%s) as %+v", query, method, kr)
		}
	})
}

func FuzzMatches(f *testing.F) {
	f.Add("p/t/", "p/t/", "p/t/abc", true)
	f.Add("p/t/", "p/t/abc", "p/t/abc", false)
	f.Add("p/t/", "p/t/", "p/t/_config/size", true)
	f.Add("p/t/", "p/t/x", "p/t/x/_y", true)
	f.Fuzz(func(t *testing.T, prefix, target, key string, recursive bool) {
		if !matches(key, target, prefix, recursive) || key == target {
			return
		}
		if !recursive || !strings.HasPrefix(key, target) {
			t.Fatalf("%q matches a wait on %q (recursive %v)", key, target, recursive)
		}
		dir := target
		if dir != prefix {
			dir += "/"
		}
		for _, elem := range strings.Split(strings.TrimPrefix(key, dir), "/") {
			if strings.HasPrefix(elem, "_") {
				t.Fatalf("hidden key %q matches a wait on %q", key, target)
			}
		}
	})
}

// FuzzHandler sends arbitrary requests: the service never panics, and
// every keys API answer is etcd v2 JSON with an X-Etcd-Index header.
func FuzzHandler(f *testing.F) {
	mem := memory.New(memory.Config{})
	f.Cleanup(func() { _ = mem.Close() })
	svc, err := New(Config{Store: mem, BaseURL: "http://disc.example", WaitTimeout: 10 * time.Millisecond})
	if err != nil {
		f.Fatal(err)
	}
	f.Cleanup(func() { _ = svc.Close() })
	rec := httptest.NewRecorder()
	svc.ServeHTTP(rec, httptest.NewRequest("GET", "/new?size=2", nil))
	token := strings.TrimPrefix(rec.Body.String(), "http://disc.example/")
	for _, tc := range []struct{ method, path, query, body string }{
		{"GET", "/T", "wait=true&recursive=true&waitIndex=1", ""},
		{"PUT", "/T/abc", "prevExist=false", "value=a%3Dhttp%3A%2F%2Fa%3A1"},
		{"GET", "/T/_config/size", "", ""},
		{"DELETE", "/T", "recursive=true", ""},
		{"GET", "/new", "size=5", ""},
		{"PUT", "/T/_config/size", "", "value=9"},
		{"GET", "/T/a/b/c", "", ""},
		{"POST", "/health", "", ""},
	} {
		f.Add(tc.method, tc.path, tc.query, tc.body)
	}
	f.Fuzz(func(t *testing.T, method, path, query, body string) {
		if !strings.HasPrefix(path, "/") || strings.ContainsAny(path, "?# \t\r\n") {
			return
		}
		switch method {
		case "GET", "PUT", "POST", "DELETE", "HEAD", "PATCH":
		default:
			return
		}
		path = strings.ReplaceAll(path, "/T", "/"+token)
		u := &url.URL{Path: path, RawQuery: query}
		req, err := http.NewRequest(method, "http://disc.example"+u.RequestURI(), strings.NewReader(body))
		if err != nil {
			return
		}
		req.Header.Set("Content-Type", "application/x-www-form-urlencoded")
		rec := httptest.NewRecorder()
		svc.ServeHTTP(rec, req)
		if rec.Header().Get("Content-Type") != "application/json" {
			return
		}
		if rec.Header().Get("X-Etcd-Index") == "" {
			t.Fatalf("%s %s?%s: JSON answer without X-Etcd-Index", method, path, query)
		}
		if rec.Body.Len() == 0 {
			return
		}
		var v map[string]any
		if err := json.Unmarshal(rec.Body.Bytes(), &v); err != nil {
			t.Fatalf("%s %s?%s: invalid JSON %q", method, path, query, rec.Body.String())
		}
		if rec.Code >= 300 {
			if _, ok := v["errorCode"]; !ok {
				t.Fatalf("%s %s?%s: error without errorCode: %s", method, path, query, rec.Body.String())
			}
		} else if _, ok := v["action"]; !ok {
			t.Fatalf("%s %s?%s: answer without action: %s", method, path, query, rec.Body.String())
		}
	})
}
