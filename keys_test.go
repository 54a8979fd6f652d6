package beacon

import (
	"errors"
	"strings"
	"testing"
)

func TestKeyspaceRoundTrip(t *testing.T) {
	for _, root := range []string{"", "/beacon", "/a/b"} {
		ks, err := NewKeyspace(root)
		if err != nil {
			t.Fatal(err)
		}
		r := Ref{Namespace: "prod", Component: "vllm", Endpoint: "generate", ID: "3f2a9c0d11e4b5a7"}
		key := ks.Key(r)
		if want := root + "/services/prod/vllm/generate/3f2a9c0d11e4b5a7"; key != want {
			t.Fatalf("Key = %q, want %q", key, want)
		}
		got, err := ks.Parse(key)
		if err != nil || got != r {
			t.Fatalf("Parse(%q) = %v, %v", key, got, err)
		}
		if !strings.HasPrefix(key, ks.Prefix(Query{Namespace: "prod", Component: "vllm"})) {
			t.Fatalf("key %q not under its prefix", key)
		}
	}
}

func TestKeyspaceBadRoots(t *testing.T) {
	for _, root := range []string{"beacon", "/beacon/", "//x", "/a//b", "/bea\ncon", "/a b", "/a\x00", "/\xff"} {
		if _, err := NewKeyspace(root); !errors.Is(err, ErrInvalidKey) {
			t.Errorf("NewKeyspace(%q) = %v, want ErrInvalidKey", root, err)
		}
	}
}

func TestParseRejectsKeysOutsideLayout(t *testing.T) {
	ks, _ := NewKeyspace("/beacon")
	for _, key := range []string{
		"",
		"/services/prod/vllm/generate/3f2a9c0d11e4b5a7", // wrong root
		"/beacon/services/prod/vllm/generate",
		"/beacon/services/prod/vllm/generate/3f2a9c0d11e4b5a7/extra",
		"/beacon/services/Prod/vllm/generate/3f2a9c0d11e4b5a7",
		"/beacon/services/prod/vllm/generate/xyz",
		"/beacon/services/prod//generate/3f2a9c0d11e4b5a7",
	} {
		if _, err := ks.Parse(key); !errors.Is(err, ErrInvalid) {
			t.Errorf("Parse(%q) = %v, want a validation error", key, err)
		}
	}
}

func TestPrefixIsolation(t *testing.T) {
	var ks Keyspace
	a := ks.Prefix(Query{Namespace: "a"})
	ab := ks.Key(Ref{Namespace: "ab", Component: "c", Endpoint: "e", ID: "0000000000000001"})
	if strings.HasPrefix(ab, a) {
		t.Fatalf("prefix %q matches key %q of another namespace", a, ab)
	}
	if got := ks.Prefix(Query{}); got != "/services/" {
		t.Fatalf("Prefix(all) = %q", got)
	}
}

func TestParseQuery(t *testing.T) {
	tests := []struct {
		in   string
		want Query
		ok   bool
	}{
		{"", Query{}, true},
		{"prod", Query{Namespace: "prod"}, true},
		{"prod/vllm", Query{Namespace: "prod", Component: "vllm"}, true},
		{"prod/vllm/generate", Query{"prod", "vllm", "generate"}, true},
		{"prod/vllm/generate/x", Query{}, false},
		{"prod//generate", Query{}, false},
		{"Prod", Query{}, false},
		{"prod/", Query{}, false},
	}
	for _, tt := range tests {
		got, err := ParseQuery(tt.in)
		if (err == nil) != tt.ok || got != tt.want {
			t.Errorf("ParseQuery(%q) = %v, %v; want %v ok=%v", tt.in, got, err, tt.want, tt.ok)
		}
		if err == nil && got.String() != tt.in {
			t.Errorf("Query.String() = %q, want %q", got.String(), tt.in)
		}
	}
	if err := (Query{Component: "x"}).Validate(); err == nil || !strings.Contains(err.Error(), "namespace") {
		t.Errorf("component without namespace: %v", err)
	}
}

func FuzzKeyspaceParse(f *testing.F) {
	f.Add("", "/services/prod/vllm/generate/3f2a9c0d11e4b5a7")
	f.Add("/beacon", "/beacon/services/a/b/c/0000000000000000")
	f.Add("/x", "/x/services/a/b/c/d/e")
	f.Fuzz(func(t *testing.T, root, key string) {
		ks, err := NewKeyspace(root)
		if err != nil {
			return
		}
		r, err := ks.Parse(key)
		if err != nil {
			if !errors.Is(err, ErrInvalid) {
				t.Fatalf("Parse error %v is not ErrInvalid", err)
			}
			return
		}
		if back := ks.Key(r); back != key {
			t.Fatalf("Parse(%q) = %v, which renders back as %q", key, r, back)
		}
	})
}

func FuzzParseQuery(f *testing.F) {
	for _, s := range []string{"", "a", "a/b", "a/b/c", "a/b/c/d", "/", "a//c"} {
		f.Add(s)
	}
	f.Fuzz(func(t *testing.T, s string) {
		q, err := ParseQuery(s)
		if err != nil {
			return
		}
		if q.String() != s {
			t.Fatalf("ParseQuery(%q).String() = %q", s, q.String())
		}
	})
}

func TestParseRef(t *testing.T) {
	want := Ref{Namespace: "prod", Component: "vllm", Endpoint: "generate", ID: "3f2a9c0d11e4b5a7"}
	if got, err := ParseRef(want.String()); err != nil || got != want {
		t.Fatalf("ParseRef(%q) = %v, %v", want.String(), got, err)
	}
	for _, tc := range []struct{ in, says string }{
		{"", "must be namespace/component/endpoint/id"},
		{"prod/vllm/generate", "must be namespace/component/endpoint/id"},
		{"prod/vllm/generate/3f2a9c0d11e4b5a7/x", "must be namespace/component/endpoint/id"},
		{"Prod/vllm/generate/3f2a9c0d11e4b5a7", `invalid namespace "Prod"`},
		{"prod/vllm.x/generate/3f2a9c0d11e4b5a7", `invalid component "vllm.x"`},
		{"prod/vllm/gen erate/3f2a9c0d11e4b5a7", `invalid endpoint "gen erate"`},
		{"prod..a/vllm/generate/3f2a9c0d11e4b5a7", `invalid namespace "prod..a"`},
		{"prod/vllm/generate/3F2A9C0D11E4B5A7", "must be 16 lower-case hex digits"},
	} {
		_, err := ParseRef(tc.in)
		if !errors.Is(err, ErrInvalid) || !strings.Contains(err.Error(), tc.says) {
			t.Errorf("ParseRef(%q) = %v, want an error saying %q", tc.in, err, tc.says)
		}
	}
}

func FuzzParseRef(f *testing.F) {
	for _, s := range []string{"prod/vllm/generate/3f2a9c0d11e4b5a7", "a/b/c/d", "a/b/c", "/a/b/c/0000000000000000", "a//c/0000000000000000"} {
		f.Add(s)
	}
	f.Fuzz(func(t *testing.T, s string) {
		r, err := ParseRef(s)
		if err != nil {
			if !errors.Is(err, ErrInvalid) {
				t.Fatalf("ParseRef(%q) error %v is not ErrInvalid", s, err)
			}
			return
		}
		if r.String() != s || r.Validate() != nil {
			t.Fatalf("ParseRef(%q) = %v, which renders back as %q", s, r, r.String())
		}
		var ks Keyspace
		back, err := ks.Parse(ks.Key(r))
		if written := r.ValidateWritten() == nil; written && (err != nil || back != r) {
			t.Fatalf("the key of %v parses as %v, %v", r, back, err)
		} else if !written && err == nil {
			t.Fatalf("Beacon's keyspace parsed %v, whose names its writers refuse", r)
		}
	})
}

// TestReadNamesRefsAndQueries pins the split between the names Beacon
// reads and serves (Query, Ref: Dynamo's names pass) and those its
// writers write (Instance.Validate, and Beacon's own key layout).
func TestReadNamesRefsAndQueries(t *testing.T) {
	dyn := Ref{Namespace: "dynamo.tenant_1", Component: "vllm_worker", Endpoint: "clear_kv_blocks", ID: "000000000000002a"}
	if got, err := ParseRef(dyn.String()); err != nil || got != dyn {
		t.Fatalf("ParseRef(%q) = %v, %v: a Dynamo name must be readable", dyn, got, err)
	}
	if _, err := ParseQuery("dynamo.tenant_1/vllm_worker/clear_kv_blocks"); err != nil {
		t.Fatalf("ParseQuery of Dynamo names: %v", err)
	}
	in := Instance{Namespace: dyn.Namespace, Component: dyn.Component, Endpoint: dyn.Endpoint, ID: dyn.ID, Address: "10.0.0.1:9999"}
	if err := in.Validate(); !errors.Is(err, ErrInvalidName) || !strings.Contains(err.Error(), "DNS label") {
		t.Fatalf("Instance.Validate of Dynamo names = %v, want the writers' DNS label rule", err)
	}
	if err := in.ValidateStored(DefaultMaxMetadataSize); !errors.Is(err, ErrInvalidName) {
		t.Fatalf("ValidateStored of Dynamo names = %v: Beacon's layout holds only its writers' names", err)
	}
	if err := in.ValidateRead(DefaultMaxMetadataSize); err != nil {
		t.Fatalf("ValidateRead of Dynamo names = %v", err)
	}
	var ks Keyspace
	if _, err := ks.Parse(ks.Key(dyn)); !errors.Is(err, ErrInvalidName) {
		t.Fatalf("Beacon's keyspace parsed a key with Dynamo's names: %v", err)
	}
}

func TestValidateReadNames(t *testing.T) {
	long := strings.Repeat("a", 63)
	for _, tc := range []struct {
		in          string
		label, nsOK bool
	}{
		{"prod", true, true},
		{"clear_kv_blocks", true, true},
		{"_x", true, true},
		{"-x-", true, true},
		{long, true, true},
		{long + "a", false, false},
		{"ns1.ns2", false, true},
		{long + "." + long + "." + long + "." + strings.Repeat("b", 61), false, true}, // 253
		{long + "." + long + "." + long + "." + strings.Repeat("b", 62), false, false},
		{"", false, false},
		{"a..b", false, false},
		{".a", false, false},
		{"a.", false, false},
		{"A", false, false},
		{"a/b", false, false},
		{"a b", false, false},
		{"é", false, false},
	} {
		if err := ValidateReadLabel("endpoint", tc.in); (err == nil) != tc.label {
			t.Errorf("ValidateReadLabel(%q) = %v, want ok=%v", tc.in, err, tc.label)
		} else if err != nil && (!errors.Is(err, ErrInvalidName) || !strings.Contains(err.Error(), ReadLabelRule)) {
			t.Errorf("ValidateReadLabel(%q) = %v: not ErrInvalidName with the rule", tc.in, err)
		}
		if err := ValidateReadNamespace(tc.in); (err == nil) != tc.nsOK {
			t.Errorf("ValidateReadNamespace(%q) = %v, want ok=%v", tc.in, err, tc.nsOK)
		} else if err != nil && (!errors.Is(err, ErrInvalidName) || !strings.Contains(err.Error(), ReadNamespaceRule)) {
			t.Errorf("ValidateReadNamespace(%q) = %v: not ErrInvalidName with the rule", tc.in, err)
		}
	}
}

func FuzzValidateReadNamespace(f *testing.F) {
	for _, s := range []string{"a", "a.b", "a..b", "_", "a_b.c-d", "."} {
		f.Add(s)
	}
	f.Fuzz(func(t *testing.T, s string) {
		err := ValidateReadNamespace(s)
		// Every label Beacon writes is a namespace it reads.
		if ValidateLabel("namespace", s) == nil && err != nil {
			t.Fatalf("refused the written label %q: %v", s, err)
		}
		if err != nil {
			return
		}
		if len(s) > MaxNamespaceLength || strings.ContainsAny(s, "/ ABCDEFGHIJKLMNOPQRSTUVWXYZ") || strings.Contains(s, "..") ||
			s[0] == '.' || s[len(s)-1] == '.' {
			t.Fatalf("accepted bad namespace %q", s)
		}
	})
}

func TestHealthKeyRoundTrip(t *testing.T) {
	ks, err := NewKeyspace("/root")
	if err != nil {
		t.Fatal(err)
	}
	r := Ref{Namespace: "prod", Component: "api", Endpoint: "rpc", ID: "00000000000000ab"}
	key := ks.HealthKey(r)
	if key != "/root/services/prod/api/rpc/00000000000000ab/health" {
		t.Fatalf("HealthKey = %q", key)
	}
	if got, ok := ks.ParseHealthKey(key); !ok || got != r {
		t.Fatalf("ParseHealthKey(%q) = %v, %v", key, got, ok)
	}
	for _, bad := range []string{ks.Key(r), key + "/x", "/root/services/prod/api/health", "/other/services/prod/api/rpc/00000000000000ab/health"} {
		if _, ok := ks.ParseHealthKey(bad); ok {
			t.Errorf("ParseHealthKey(%q) accepted a key that is no verdict's", bad)
		}
	}
}
