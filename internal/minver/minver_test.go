package minver

import "testing"

func TestAtLeast(t *testing.T) {
	for _, c := range []struct {
		v, min string
		want   bool
	}{
		{"2.12.0", "2.12.0", true},
		{"2.15.2", "2.12.0", true},
		{"2.11.9", "2.12.0", false},
		{"2.9.10", "2.12.0", false},
		{"3.0.0-beta.1", "2.12.0", true},
		{"", "2.12.0", false},
		{"3.4.23", "3.5.0", false},
		{"3.5.0", "3.5.0", true},
		{"3.7.3", "3.5.0", true},
	} {
		if got := AtLeast(c.v, c.min); got != c.want {
			t.Errorf("AtLeast(%q, %q) = %v", c.v, c.min, got)
		}
	}
}

func FuzzAtLeast(f *testing.F) {
	for _, v := range []string{"2.12.0", "2.9.10", "3.0.0-rc1", "x.y", "2..1", ""} {
		f.Add(v)
	}
	f.Fuzz(func(t *testing.T, v string) {
		if AtLeast(v, "2.12.0") && !AtLeast(v, "0.0.0") {
			t.Fatalf("%q is at least 2.12.0 but not 0.0.0", v)
		}
	})
}
