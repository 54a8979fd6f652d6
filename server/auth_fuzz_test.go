package server

import (
	"net/http/httptest"
	"strings"
	"testing"
	"unicode/utf8"
)

// FuzzCredentials: any Authorization header is either parsed into a
// usable identity or refused with a message; never a panic.
func FuzzCredentials(f *testing.F) {
	for _, s := range []string{"Basic YWxpY2U6cHc=", "Bearer abc.def.ghi", "Basic !!", "Bearer ", "Digest x", "basic YTpi", "", "Basic", "Bearer a b", "Basic\tYWxpY2U6YWxpY2UtcHc=", "Negotiate\tc2VjcmV0LXRpY2tldA=="} {
		f.Add(s)
	}
	f.Fuzz(func(t *testing.T, header string) {
		r := httptest.NewRequest("GET", "/v1/registry/instances", nil)
		r.Header["Authorization"] = []string{header}
		id, ok, err := credentials(r)
		switch {
		case err != nil:
			if ok || len(err.Error()) < 20 {
				t.Fatalf("%q: refusal %v (ok %v) says too little", header, err, ok)
			}
			// A refusal never repeats the credentials (they would reach
			// logs and proxies): at most the scheme.
			if _, creds, found := strings.Cut(strings.TrimSpace(header), "\t"); found && len(creds) > 3 && strings.Contains(err.Error(), creds) {
				t.Fatalf("%q: refusal %v repeats the credentials", header, err)
			}
		case ok:
			switch id.method {
			case methodBasic:
				if id.user == "" || !utf8.ValidString(id.user) {
					t.Fatalf("%q: basic identity without a valid user: %+v", header, id)
				}
			case methodBearer:
				if id.token == "" || strings.ContainsAny(id.token, " \t") {
					t.Fatalf("%q: bearer identity with token %q", header, id.token)
				}
			default:
				t.Fatalf("%q: method %q", header, id.method)
			}
		default:
			if header != "" {
				t.Fatalf("%q: neither parsed nor refused", header)
			}
		}
	})
}

// FuzzParseAuthToken: etcd's --auth-token syntax is parsed or refused,
// never a panic; parsed options round-trip.
func FuzzParseAuthToken(f *testing.F) {
	for _, s := range []string{"simple", "jwt,pub-key=a,priv-key=b,sign-method=ES256,ttl=5m", "jwt,=x", "jwt,a=b,a=c", "jwt,novalue", ""} {
		f.Add(s)
	}
	f.Fuzz(func(t *testing.T, s string) {
		typ, opts, err := parseAuthToken(s)
		if err != nil {
			return
		}
		if !strings.HasPrefix(s, typ) {
			t.Fatalf("%q: type %q", s, typ)
		}
		for k, v := range opts {
			if k == "" || !strings.Contains(s, k+"="+v) {
				t.Fatalf("%q: option %q=%q not in the input", s, k, v)
			}
		}
	})
}
