package bootstrap

import (
	"errors"
	"strings"
	"testing"
	"unicode/utf8"
)

func TestValidateToken(t *testing.T) {
	for _, tc := range []struct {
		token string
		ok    bool
	}{
		{"8A591FAB-1D72-41FA-BDF2-A27162FDA1E0", true}, // etcd's e2e test token
		{"0d4c7a9e-21b6-4c1f-9a55-3f0f1b7e2c11", true},
		{"8f2e958f20b6fc88ed021a9d3a70c66e", true}, // discovery.etcd.io
		{"tok-1795320230", true},
		{"prod_cluster.1", true},
		{strings.Repeat("a", MaxTokenLen), true},
		{"", false},
		{strings.Repeat("a", MaxTokenLen+1), false},
		{"-leading-dash", false},
		{"_config", false},
		{".", false},
		{"..", false},
		{"a/b", false},
		{"a b", false},
		{"tok\n", false},
		{"tök", false},
	} {
		err := ValidateToken(tc.token)
		if (err == nil) != tc.ok {
			t.Errorf("ValidateToken(%q) = %v, want ok=%v", tc.token, err, tc.ok)
		}
		if err != nil && !errors.Is(err, ErrInvalidToken) {
			t.Errorf("ValidateToken(%q) = %v, want ErrInvalidToken", tc.token, err)
		}
	}
}

func TestKeys(t *testing.T) {
	const tok = "tok-1795320230"
	for _, tc := range []struct{ got, want string }{
		{TokenPrefix(tok), "/_etcd/registry/tok-1795320230/"},
		{SizeKey(tok), "/_etcd/registry/tok-1795320230/_config/size"},
		{MembersPrefix(tok), "/_etcd/registry/tok-1795320230/members"},
		{MemberKey(tok, 0x1279319cb331077f), "/_etcd/registry/tok-1795320230/members/1279319cb331077f"},
		{MemberKey(tok, 0x65), "/_etcd/registry/tok-1795320230/members/65"},
	} {
		if tc.got != tc.want {
			t.Errorf("got %q, want %q", tc.got, tc.want)
		}
	}
}

func TestParseSize(t *testing.T) {
	for _, tc := range []struct {
		in   string
		want int
	}{
		{"3", 3}, {"1", 1}, {"+5", 5}, {"007", 7},
		{"0", 0}, {"-1", 0}, {"", 0}, {" 3", 0}, {"3\n", 0}, {"three", 0}, {"3.0", 0}, {"99999999999999999999", 0},
	} {
		got, err := ParseSize(tc.in)
		if got != tc.want || (err == nil) != (tc.want > 0) {
			t.Errorf("ParseSize(%q) = %d, %v; want %d", tc.in, got, err, tc.want)
		}
		if err != nil && (!errors.Is(err, ErrBadSizeKey) || !strings.Contains(err.Error(), "discovery: size key is bad")) {
			t.Errorf("ParseSize(%q) error %q does not carry etcd's message", tc.in, err)
		}
	}
}

func TestValidateSize(t *testing.T) {
	for _, n := range []int{1, 3, 7, MaxSize} {
		if err := ValidateSize(n); err != nil {
			t.Errorf("ValidateSize(%d) = %v", n, err)
		}
	}
	for _, n := range []int{0, -3, MaxSize + 1} {
		if err := ValidateSize(n); !errors.Is(err, ErrInvalidSize) {
			t.Errorf("ValidateSize(%d) = %v, want ErrInvalidSize", n, err)
		}
	}
}

// The character a token may not hold is named as itself: a non-ASCII
// character was printed byte by byte as a rune, mojibake ('Ã' for é).
func TestValidateTokenNamesTheCharacter(t *testing.T) {
	for token, want := range map[string]string{
		"tök":                               `token "tök" has 'ö' (U+00F6) at byte 1`,
		"a\u200bb":                          `has '\u200b' (U+200B) at byte 1`,
		"a\nb":                              `has '\n' (U+000A) at byte 1`,
		"ab\xffc":                           `has the byte 0xff (not UTF-8) at byte 2`,
		strings.Repeat("a", 79) + "é" + "!": `…(82 bytes)" has 'é'`,
	} {
		err := ValidateToken(token)
		if err == nil || !strings.Contains(err.Error(), want) || strings.Contains(err.Error(), "Ã") {
			t.Errorf("ValidateToken(%q) = %v, want it to say %s", token, err, want)
		}
	}
}

func FuzzValidateToken(f *testing.F) {
	for _, s := range []string{"8A591FAB-1D72-41FA-BDF2-A27162FDA1E0", "", "a/b", "..", "tok\x00", strings.Repeat("x", 200)} {
		f.Add(s)
	}
	f.Fuzz(func(t *testing.T, token string) {
		if err := ValidateToken(token); err != nil {
			// The message is valid UTF-8 whatever the token (a cut inside
			// a character, or a byte printed as a rune, was not).
			if !utf8.ValidString(err.Error()) {
				t.Fatalf("ValidateToken(%q): message not UTF-8: %q", token, err)
			}
			return
		}
		// A valid token stays one path element: keys built from it never
		// escape or alias another token's keys.
		prefix := TokenPrefix(token)
		if prefix != RegistryPrefix+"/"+token+"/" {
			t.Fatalf("TokenPrefix(%q) = %q", token, prefix)
		}
		for _, k := range []string{SizeKey(token), MembersPrefix(token), MemberKey(token, 42)} {
			if !strings.HasPrefix(k, prefix) {
				t.Fatalf("key %q is outside %q", k, prefix)
			}
		}
	})
}

func FuzzParseSize(f *testing.F) {
	for _, s := range []string{"3", "0", "-1", "+2", "abc", "", "1e3", "9223372036854775807"} {
		f.Add(s)
	}
	f.Fuzz(func(t *testing.T, s string) {
		n, err := ParseSize(s)
		if err != nil {
			if n != 0 || !errors.Is(err, ErrBadSizeKey) {
				t.Fatalf("ParseSize(%q) = %d, %v", s, n, err)
			}
			return
		}
		if n <= 0 {
			t.Fatalf("ParseSize(%q) = %d without error", s, n)
		}
	})
}

func FuzzParseID(f *testing.F) {
	for _, s := range []string{"8e9e05c52164694d", "65", "0", "0065", "", "8E9E", "ffffffffffffffff", "10000000000000000", "-1", "+1"} {
		f.Add(s)
	}
	f.Fuzz(func(t *testing.T, s string) {
		id, err := ParseID(s)
		if err != nil {
			return
		}
		// Only etcd's own rendering parses, so IDs round-trip.
		if FormatID(id) != s {
			t.Fatalf("ParseID(%q) = %x, renders as %q", s, id, FormatID(id))
		}
	})
}
