package bootstrap

import (
	"errors"
	"slices"
	"strings"
	"testing"

	"go.etcd.io/etcd/client/pkg/v3/types"
	"go.etcd.io/etcd/server/v3/etcdserver/api/membership"
)

// The IDs real etcd 3.7.3 members registered under tok-1795320230
// (reference/test-peers.md §1).
func TestMemberIDMatchesRecordedEtcdRegistry(t *testing.T) {
	for _, tc := range []struct {
		url, id string
	}{
		{"http://127.0.0.2:21380", "e490a1f97716759f"},
		{"http://127.0.0.2:22380", "e93820b94ae6d028"},
		{"http://127.0.0.2:23380", "1279319cb331077f"},
	} {
		id, err := MemberID([]string{tc.url}, "tok-1795320230")
		if err != nil {
			t.Fatal(err)
		}
		if got := FormatID(id); got != tc.id {
			t.Errorf("MemberID(%s) = %s, want %s", tc.url, got, tc.id)
		}
	}
}

// etcdMemberID is the ID etcd's own code gives a member bootstrapping with
// the discovery token as cluster token.
func etcdMemberID(t testing.TB, name string, urls []string, token string) uint64 {
	t.Helper()
	us, err := types.NewURLs(urls)
	if err != nil {
		t.Fatal(err)
	}
	return uint64(membership.NewMember(name, us, token, nil).ID)
}

func TestMemberIDAndValueMatchEtcd(t *testing.T) {
	for _, tc := range []struct {
		name  string
		urls  []string
		token string
	}{
		{"infra1", []string{"http://10.0.1.10:2380"}, "8A591FAB-1D72-41FA-BDF2-A27162FDA1E0"},
		{"m6", []string{"http://127.0.0.3:26380", "http://127.0.0.2:26380"}, "tok-1"},
		{"x", []string{"https://[::1]:2380", "unix://member.sock", "HTTP://Example.COM:2380"}, "abc"},
	} {
		id, err := MemberID(tc.urls, tc.token)
		if err != nil {
			t.Fatal(err)
		}
		if want := etcdMemberID(t, tc.name, tc.urls, tc.token); id != want {
			t.Errorf("MemberID(%v, %q) = %x, etcd computes %x", tc.urls, tc.token, id, want)
		}
		v, err := MemberValue(tc.name, tc.urls)
		if err != nil {
			t.Fatal(err)
		}
		us, _ := types.NewURLs(tc.urls)
		if want := (types.URLsMap{tc.name: us}).String(); v != want {
			t.Errorf("MemberValue = %q, etcd writes %q", v, want)
		}
	}
	v, _ := MemberValue("m6", []string{"http://127.0.0.3:26380", "http://127.0.0.2:26380"})
	if v != "m6=http://127.0.0.2:26380,m6=http://127.0.0.3:26380" {
		t.Errorf("two-URL value %q", v)
	}
}

func TestCanonicalPeerURLsRejects(t *testing.T) {
	for _, tc := range []struct {
		urls []string
		want error
	}{
		{nil, ErrInvalidMember},
		{[]string{""}, ErrInvalidMember},
		{[]string{"10.0.0.1:2380"}, ErrInvalidMember},             // no scheme
		{[]string{"ftp://10.0.0.1:2380"}, ErrInvalidMember},       // bad scheme
		{[]string{"http://10.0.0.1"}, ErrInvalidMember},           // no port
		{[]string{"http://10.0.0.1:2380/path"}, ErrInvalidMember}, // path
		{[]string{"http://10.0.0.1:2380?a=b"}, ErrInvalidMember},  // '=' breaks the value format
		{[]string{"http://a:1,http://b:2"}, ErrInvalidMember},     // two URLs in one element
		{[]string{"http://a:1", "HTTP://a:1"}, ErrDuplicateURL},   // same URL twice
		{[]string{"http://a:1", "http://b:1", "http://a:1"}, ErrDuplicateURL},
	} {
		if _, err := CanonicalPeerURLs(tc.urls); !errors.Is(err, tc.want) {
			t.Errorf("CanonicalPeerURLs(%q) = %v, want %v", tc.urls, err, tc.want)
		}
	}
}

func TestValidateName(t *testing.T) {
	for _, ok := range []string{"infra1", "default", "m-1.example", "ünïcode"} {
		if err := ValidateName(ok); err != nil {
			t.Errorf("ValidateName(%q) = %v", ok, err)
		}
	}
	for _, bad := range []string{"", "a b", "a,b", "a=b", "tab\t", "\x00", strings.Repeat("n", MaxNameLen+1), "\xff"} {
		if err := ValidateName(bad); !errors.Is(err, ErrInvalidMember) {
			t.Errorf("ValidateName(%q) = %v, want ErrInvalidMember", bad, err)
		}
	}
}

func TestParseMemberValue(t *testing.T) {
	name, urls, err := ParseMemberValue(" m6=http://127.0.0.2:26380,m6=http://127.0.0.3:26380\n")
	if err != nil || name != "m6" || !slices.Equal(urls, []string{"http://127.0.0.2:26380", "http://127.0.0.3:26380"}) {
		t.Fatalf("ParseMemberValue = %q, %q, %v", name, urls, err)
	}
	for _, bad := range []string{"", "noequals", "=http://a:1", "a=http://a:1,b=http://b:1", "a=", "a=ftp://x:1", "a=http://x:1,"} {
		if _, _, err := ParseMemberValue(bad); !errors.Is(err, ErrInvalidURL) {
			t.Errorf("ParseMemberValue(%q) = %v, want ErrInvalidURL", bad, err)
		}
	}
}

func FuzzMemberID(f *testing.F) {
	f.Add("http://10.0.1.10:2380", "http://10.0.1.11:2380", "8A591FAB-1D72-41FA-BDF2-A27162FDA1E0")
	f.Add("https://[::1]:2380", "unix://sock", "t")
	f.Add("http://a:1", "http://a:1", "dup")
	f.Fuzz(func(t *testing.T, u1, u2, token string) {
		urls := []string{u1, u2}
		id, err := MemberID(urls, token)
		if err != nil {
			return
		}
		if want := etcdMemberID(t, "n", urls, token); id != want {
			t.Fatalf("MemberID(%q, %q) = %x, etcd computes %x", urls, token, id, want)
		}
		// Order of the URLs does not matter.
		if id2, _ := MemberID([]string{u2, u1}, token); id2 != id {
			t.Fatalf("MemberID depends on URL order")
		}
	})
}

func FuzzMemberValue(f *testing.F) {
	f.Add("infra1", "http://10.0.1.10:2380", "http://10.0.1.11:2380")
	f.Add("a=b", "http://x:1", "http://y:2")
	f.Add("m", "unix://a", "https://[::1]:1")
	f.Fuzz(func(t *testing.T, name, u1, u2 string) {
		v, err := MemberValue(name, []string{u1, u2})
		if err != nil {
			return
		}
		// What Beacon writes is what etcd writes, and it parses back.
		us, _ := types.NewURLs([]string{u1, u2})
		if want := (types.URLsMap{name: us}).String(); v != want {
			t.Fatalf("MemberValue = %q, etcd writes %q", v, want)
		}
		gotName, gotURLs, err := ParseMemberValue(v)
		if err != nil || gotName != name || len(gotURLs) != 2 {
			t.Fatalf("ParseMemberValue(%q) = %q, %q, %v", v, gotName, gotURLs, err)
		}
		if _, err := types.NewURLsMap(v); err != nil {
			t.Fatalf("etcd cannot parse %q: %v", v, err)
		}
	})
}

func FuzzParseMemberValue(f *testing.F) {
	for _, s := range []string{"infra1=http://10.0.1.10:2380", "m6=http://127.0.0.2:26380,m6=http://127.0.0.3:26380", "", "=", "a=,a=", "a=http://x:1,b=http://y:2", ",,,"} {
		f.Add(s)
	}
	f.Fuzz(func(t *testing.T, v string) {
		name, urls, err := ParseMemberValue(v)
		if err != nil {
			if !errors.Is(err, ErrInvalidURL) {
				t.Fatalf("ParseMemberValue(%q) = %v, want ErrInvalidURL", v, err)
			}
			return
		}
		// Whatever Beacon accepts, etcd accepts as one member.
		m, err := types.NewURLsMap(v)
		if err != nil || len(m) != 1 || len(m[name]) != len(urls) {
			t.Fatalf("ParseMemberValue(%q) = %q, %q but etcd reads %v, %v", v, name, urls, m, err)
		}
	})
}

func FuzzValidateName(f *testing.F) {
	for _, s := range []string{"infra1", "", "a=b", "a,b", " x", "ü"} {
		f.Add(s)
	}
	f.Fuzz(func(t *testing.T, name string) {
		if ValidateName(name) != nil {
			return
		}
		// A valid name survives the value format.
		v := memberValue(name, []string{"http://10.0.0.1:2380"})
		got, _, err := ParseMemberValue(v)
		if err != nil || got != name {
			t.Fatalf("name %q does not survive %q: %q, %v", name, v, got, err)
		}
	})
}
