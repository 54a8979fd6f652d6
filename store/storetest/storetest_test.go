package storetest

import (
	"strings"
	"testing"
)

func TestCheckCaveats(t *testing.T) {
	for _, tc := range []struct {
		name    string
		caveats map[string]string
		want    string // substring of the error, "" for none
	}{
		{"none", nil, ""},
		{"known", map[string]string{"Txn/Atomic": "no transactions"}, ""},
		{"unknown", map[string]string{"Txn/Atomically": "typo"}, `unknown checks ["Txn/Atomically"]`},
		{"no reason", map[string]string{"Watch/Compacted": " "}, `caveat "Watch/Compacted" has no reason`},
	} {
		t.Run(tc.name, func(t *testing.T) {
			err := checkCaveats(tc.caveats)
			switch {
			case tc.want == "" && err != nil:
				t.Fatalf("checkCaveats: %v", err)
			case tc.want != "" && (err == nil || !strings.Contains(err.Error(), tc.want)):
				t.Fatalf("checkCaveats: %v, want an error containing %q", err, tc.want)
			}
		})
	}
}

func TestCheckNamesAreUnique(t *testing.T) {
	seen := map[string]bool{}
	for _, n := range CheckNames() {
		if seen[n] {
			t.Fatalf("check %q is listed twice", n)
		}
		seen[n] = true
	}
	if len(seen) != len(checks)+len(soloChecks) {
		t.Fatalf("CheckNames returned %d names for %d checks", len(seen), len(checks)+len(soloChecks))
	}
}
