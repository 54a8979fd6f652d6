// Package testpeer finds third-party programs that interop tests run as
// real peers (for example Debian's etcd 3.4 for the v2 discovery protocol).
//
// Locally a missing peer skips the test with instructions. In CI, where
// BEACON_REQUIRE_PEERS=1 is set by .ci/run after it installs every peer, a
// missing peer fails the test instead, so nothing is skipped silently.
package testpeer

import (
	"os"
	"os/exec"
	"testing"
)

// RequireEnv is the variable that turns a missing peer into a failure.
const RequireEnv = "BEACON_REQUIRE_PEERS"

// Binary returns the path of the first candidate found (an absolute path or
// a name looked up in PATH). If none exists the test is skipped, or failed
// when RequireEnv is set; install says how to get it (e.g. "apt-get install
// etcd-server").
func Binary(tb testing.TB, install string, candidates ...string) string {
	tb.Helper()
	for _, c := range candidates {
		if p, err := exec.LookPath(c); err == nil {
			return p
		}
	}
	msg := "peer program not found (looked for " + joinQuoted(candidates) + "); install it with: " + install
	if os.Getenv(RequireEnv) != "" {
		tb.Fatal(msg)
	}
	tb.Skip(msg)
	return ""
}

func joinQuoted(s []string) string {
	out := ""
	for i, c := range s {
		if i > 0 {
			out += ", "
		}
		out += "\"" + c + "\""
	}
	return out
}
