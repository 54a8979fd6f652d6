package etcd

import (
	"net"
	"slices"
	"strings"
	"testing"
)

func TestResolveNormalizesEndpoints(t *testing.T) {
	for _, tc := range []struct {
		cfg  Config
		want []string
	}{
		{Config{}, []string{"http://localhost:2379"}},
		{Config{Endpoints: []string{"a:1", "[::1]:2"}}, []string{"http://a:1", "http://[::1]:2"}},
		{Config{Endpoints: []string{"a:1", "https://b:2"}}, []string{"https://a:1", "https://b:2"}},
		{Config{Endpoints: []string{"a:1"}, CA: "ca.pem"}, []string{"https://a:1"}},
		{Config{Endpoints: []string{"a:1"}, ClientCert: "c", ClientKey: "k"}, []string{"https://a:1"}},
		{Config{Endpoints: []string{"HTTP://a:1/"}}, []string{"http://a:1"}},
	} {
		r, err := tc.cfg.resolve()
		if err != nil || !slices.Equal(r.endpoints, tc.want) {
			t.Errorf("resolve(%v) = %v, %v; want %v", tc.cfg.Endpoints, r.endpoints, err, tc.want)
		}
		if r.dialTimeout != DefaultDialTimeout || r.requestTimeout != DefaultRequestTimeout || r.listPageSize != DefaultListPageSize {
			t.Errorf("defaults not applied: %+v", r)
		}
	}
}

func FuzzParseEndpoint(f *testing.F) {
	for _, s := range []string{
		"localhost:2379", "http://127.0.0.1:2379", "https://[::1]:2379", "HTTPS://etcd:1/", "etcd", ":2379",
		"etcd:0", "etcd:+80", "etcd:080", "http://u@h:1", "http://h:1/p", "http://h:1?q", "http://h:1#f", "unix://x",
		"[::1]", "[fe80::1%eth0]:2379", "h:1:2", "http://h:1:2", "http://[::1:2379", "\x00:1", "ä:1", "http://%41:1",
	} {
		f.Add(s)
	}
	f.Fuzz(func(t *testing.T, s string) {
		ep, err := parseEndpoint(s)
		if err != nil {
			if err.Error() == "" {
				t.Fatal("empty error message")
			}
			return
		}
		if ep.Host == "" || ep.Port < 1 || ep.Port > 65535 || (ep.Scheme != "" && ep.Scheme != "http" && ep.Scheme != "https") {
			t.Fatalf("parseEndpoint(%q) accepted %+v", s, ep)
		}
		// The normalized URL parses back to the same endpoint.
		for _, useTLS := range []bool{false, true} {
			u := ep.url(useTLS)
			again, err := parseEndpoint(u)
			if err != nil || again.Host != ep.Host || again.Port != ep.Port {
				t.Fatalf("parseEndpoint(%q) = %+v, but its URL %q parses to %+v, %v", s, ep, u, again, err)
			}
			if _, _, err := net.SplitHostPort(strings.TrimPrefix(strings.TrimPrefix(u, "http://"), "https://")); err != nil {
				t.Fatalf("normalized %q is not host:port: %v", u, err)
			}
		}
	})
}

func FuzzConfigFromEnv(f *testing.F) {
	f.Add("http://a:2379,http://b:2379", "", "", "")
	f.Add(" a:1 , b:2 ", "user", "pw", "ca.pem")
	f.Add("https://a:1,http://b:2", "", "pw", "")
	f.Add(",,,", "u", "", "")
	f.Add("a:1,a:1", "", "", "")
	f.Fuzz(func(t *testing.T, endpoints, user, password, ca string) {
		env := map[string]string{EnvEndpoints: endpoints, EnvUsername: user, EnvPassword: password, EnvCA: ca}
		cfg := configFromLookup(func(k string) (string, bool) { v, ok := env[k]; return v, ok })
		r, err := cfg.resolve()
		if err != nil {
			return
		}
		if len(r.endpoints) == 0 {
			t.Fatal("a valid config resolved to no endpoints")
		}
		// Resolving the normalized endpoints again is the identity.
		cfg.Endpoints = r.endpoints
		again, err := cfg.resolve()
		if err != nil || !slices.Equal(again.endpoints, r.endpoints) || again.tls != r.tls {
			t.Fatalf("resolve is not idempotent: %v then %v (%v)", r.endpoints, again.endpoints, err)
		}
		for _, ep := range r.endpoints {
			if want := map[bool]string{false: "http://", true: "https://"}[r.tls]; !strings.HasPrefix(ep, want) {
				t.Fatalf("endpoint %q does not start with %q", ep, want)
			}
		}
	})
}
