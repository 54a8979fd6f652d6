package nats

import (
	"strings"
	"testing"
	"unicode/utf8"
)

func TestKeyEncoding(t *testing.T) {
	for key, want := range map[string]string{
		"/services/prod/api/http/00000000000000a1": "=.services.prod.api.http.00000000000000a1",
		"a":          "a",
		"a/":         "a.=",
		"//":         "=.=.=",
		"a.b*c>d e=": "a=2Eb=2Ac=3Ed=20e=3D",
		"ü":          "=C3=BC",
	} {
		if got := encodeKey(key); got != want {
			t.Errorf("encodeKey(%q) = %q, want %q", key, got, want)
		}
		if back, err := decodeKey(want); err != nil || back != key {
			t.Errorf("decodeKey(%q) = %q, %v; want %q", want, back, err, key)
		}
	}
	for _, bad := range []string{"", "a..b", "=3", "=4", "=zz", "=41", "a b", "=2e", "=FF"} {
		if k, err := decodeKey(bad); err == nil {
			t.Errorf("decodeKey(%q) = %q, want an error", bad, k)
		}
	}
}

func TestPrefixFilter(t *testing.T) {
	for prefix, want := range map[string]struct {
		filter string
		exact  bool
	}{
		"":                {">", true},
		"/":               {"=.>", true},
		"/services/prod/": {"=.services.prod.>", true},
		"/services/pr":    {"=.services.>", false},
		"a":               {">", false},
	} {
		f, exact := prefixFilter(prefix)
		if f != want.filter || exact != want.exact {
			t.Errorf("prefixFilter(%q) = %q, %v; want %q, %v", prefix, f, exact, want.filter, want.exact)
		}
	}
}

// subjectMatches reports whether NATS would match subject tokens against a
// filter ending in ">".
func subjectMatches(filter, tokens string) bool {
	pre := strings.TrimSuffix(filter, ">")
	return strings.HasPrefix(tokens, pre) && len(tokens) > len(pre)
}

func FuzzKeyEncoding(f *testing.F) {
	for _, s := range []string{"/a/b", "a", "/", "x/y=z.", "\xff", "ü/ö", "a//b", "/services/p"} {
		f.Add(s, s[:len(s)/2])
	}
	f.Fuzz(func(t *testing.T, key, prefix string) {
		if !utf8.ValidString(key) || key == "" || len(key) > 1024 {
			return
		}
		enc := encodeKey(key)
		for _, c := range []byte(enc) {
			if !plain(c) && c != '=' && c != '.' {
				t.Fatalf("encodeKey(%q) = %q has byte %q outside the NATS key alphabet", key, enc, c)
			}
		}
		if strings.HasPrefix(enc, ".") || strings.HasSuffix(enc, ".") || strings.Contains(enc, "..") {
			t.Fatalf("encodeKey(%q) = %q has an empty token", key, enc)
		}
		back, err := decodeKey(enc)
		if err != nil || back != key {
			t.Fatalf("decodeKey(encodeKey(%q)) = %q, %v", key, back, err)
		}
		// The filter of a prefix matches every key that has the prefix,
		// and, when exact, nothing else.
		filter, exact := prefixFilter(prefix)
		match := subjectMatches(filter, enc)
		if strings.HasPrefix(key, prefix) && !match {
			t.Fatalf("filter %q of prefix %q misses key %q (%q)", filter, prefix, key, enc)
		}
		if exact && match && !strings.HasPrefix(key, prefix) {
			t.Fatalf("exact filter %q of prefix %q matches key %q", filter, prefix, key)
		}
	})
}
