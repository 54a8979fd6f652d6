package beacon

import (
	"errors"
	"strings"
	"testing"
)

func TestValidateLabel(t *testing.T) {
	tests := []struct {
		in string
		ok bool
	}{
		{"a", true},
		{"prod", true},
		{"vllm-worker-2", true},
		{"0abc9", true},
		{strings.Repeat("a", 63), true},
		{strings.Repeat("a", 64), false},
		{"", false},
		{"-a", false},
		{"a-", false},
		{"A", false},
		{"a_b", false},
		{"a.b", false},
		{"a/b", false},
		{"é", false},
		{"a b", false},
	}
	for _, tt := range tests {
		err := ValidateLabel("component", tt.in)
		if (err == nil) != tt.ok {
			t.Errorf("ValidateLabel(%q) = %v, want ok=%v", tt.in, err, tt.ok)
		}
		if err != nil {
			if !errors.Is(err, ErrInvalid) || !errors.Is(err, ErrInvalidName) {
				t.Errorf("ValidateLabel(%q) error %v does not match ErrInvalid and ErrInvalidName", tt.in, err)
			}
			if !strings.Contains(err.Error(), "component") || !strings.Contains(err.Error(), "DNS label") {
				t.Errorf("error %q does not name the field and the rule", err)
			}
		}
	}
}

func TestIDs(t *testing.T) {
	seen := map[string]bool{}
	for range 1000 {
		id := NewID()
		if err := ValidateID(id); err != nil {
			t.Fatalf("NewID() = %q: %v", id, err)
		}
		if seen[id] {
			t.Fatalf("NewID() repeated %q", id)
		}
		seen[id] = true
	}
	if got := FormatID(0xff); got != "00000000000000ff" {
		t.Errorf("FormatID(0xff) = %q", got)
	}
	for _, bad := range []string{"", "123", "00000000000000FF", "00000000000000fg", "00000000000000fff"} {
		if err := ValidateID(bad); !errors.Is(err, ErrInvalidID) {
			t.Errorf("ValidateID(%q) = %v, want ErrInvalidID", bad, err)
		}
	}
}

func FuzzValidateLabel(f *testing.F) {
	for _, s := range []string{"a", "prod", "-x", "x-", "A", strings.Repeat("z", 64), "a\x00b"} {
		f.Add(s)
	}
	f.Fuzz(func(t *testing.T, s string) {
		err := ValidateLabel("namespace", s)
		if err != nil {
			if !errors.Is(err, ErrInvalidName) {
				t.Fatalf("error %v is not ErrInvalidName", err)
			}
			return
		}
		// Every accepted label is a valid DNS label and a valid key part.
		if len(s) == 0 || len(s) > 63 || strings.ContainsAny(s, "/.ABCDEFGHIJKLMNOPQRSTUVWXYZ_ ") ||
			s[0] == '-' || s[len(s)-1] == '-' {
			t.Fatalf("accepted bad label %q", s)
		}
	})
}

func FuzzValidateID(f *testing.F) {
	f.Add("3f2a9c0d11e4b5a7")
	f.Add("3F2A9C0D11E4B5A7")
	f.Fuzz(func(t *testing.T, s string) {
		if ValidateID(s) == nil && len(s) != IDLength {
			t.Fatalf("accepted %q", s)
		}
	})
}
