package clip

import (
	"strings"
	"testing"
	"unicode/utf8"
)

func TestString(t *testing.T) {
	for _, tc := range []struct {
		s    string
		max  int
		want string
	}{
		{"short", 80, "short"},
		{strings.Repeat("a", 80), 80, strings.Repeat("a", 80)},
		{strings.Repeat("a", 81), 80, strings.Repeat("a", 80) + "…(81 bytes)"},
		// A two-byte character across the limit is left out whole.
		{strings.Repeat("a", 79) + "é" + "b", 80, strings.Repeat("a", 79) + "…(82 bytes)"},
	} {
		got := String(tc.s, tc.max)
		if got != tc.want {
			t.Errorf("String(%q, %d) = %q, want %q", tc.s, tc.max, got, tc.want)
		}
		if !utf8.ValidString(got) {
			t.Errorf("String(%q, %d) = %q: not valid UTF-8", tc.s, tc.max, got)
		}
	}
}
