// Package minver compares the dotted versions servers report, for the
// stores that refuse a server too old for what they use (nats-server,
// etcd).
package minver

import (
	"slices"
	"strconv"
	"strings"
)

// AtLeast reports whether v ("2.12.1", "3.6.0-rc.1") is min or later,
// comparing major, minor and patch numbers; a pre-release counts as its
// release, and what does not parse counts as 0.
func AtLeast(v, min string) bool {
	a, b := parse(v), parse(min)
	return slices.Compare(a[:], b[:]) >= 0
}

func parse(s string) [3]int {
	var out [3]int
	s, _, _ = strings.Cut(s, "-")
	for i, p := range strings.SplitN(s, ".", 3) {
		out[i], _ = strconv.Atoi(p)
	}
	return out
}
