package server

import (
	"fmt"
	"net/http"
	"strconv"
	"strings"
	"testing"

	"github.com/beaconplane/beacon/server/registryapi"
)

// TestFailedAuthenticationsThrottled: a client that guesses passwords is
// slowed down per user name and per address, over a real etcd with
// authentication on. Spreading the guesses over many user names, or
// flooding the table of failures with unknown names to push its own entry
// out, does not lift the throttle (a flood of 15,000 unknown names from
// one address once did).
func TestFailedAuthenticationsThrottled(t *testing.T) {
	s := startServer(t, authConfig(t))
	grant(t, rootClient(t, s), "carol", "carol-pw", "read /services/")
	base := s.Endpoints().HTTP
	list := func(user, pw string) httpAnswer {
		return as{t: t, base: base, auth: basic(user, pw)}.do("GET", registryapi.InstancesPath, "")
	}
	for i := range maxFails {
		if r := list("carol", fmt.Sprint("guess-", i)); r.code != http.StatusUnauthorized {
			t.Fatalf("guess %d: %d %s", i, r.code, r.body)
		}
	}
	r := list("carol", "guess-last")
	if r.code != http.StatusTooManyRequests || !strings.Contains(r.body, "resource_exhausted") {
		t.Fatalf("guess %d: %d %s, want 429", maxFails, r.code, r.body)
	}
	if secs, err := strconv.Atoi(r.header.Get("Retry-After")); err != nil || secs < 1 || secs > int(failWindow.Seconds()) {
		t.Fatalf("Retry-After %q", r.header.Get("Retry-After"))
	}
	// Other names from the same address: allowed until the address has
	// failed maxAddrFails times, then refused whatever the name.
	for i := range maxAddrFails - maxFails {
		if r := list(fmt.Sprint("nobody-", i), "x"); r.code != http.StatusUnauthorized {
			t.Fatalf("unknown user %d: %d %s, want 401", i, r.code, r.body)
		}
	}
	if r := list("nobody-else", "x"); r.code != http.StatusTooManyRequests {
		t.Fatalf("failure %d from one address: %d %s, want 429", maxAddrFails+1, r.code, r.body)
	}
	if r := list("carol", "carol-pw"); r.code != http.StatusTooManyRequests {
		t.Fatalf("carol's password from the throttled address: %d %s", r.code, r.body)
	}

	// The table of failures is bounded; a flood from many addresses does
	// not push out an entry that throttles.
	v := s.state().views
	for range maxFails {
		v.failed("192.0.2.1", "carol")
	}
	for i := range 2 * maxFailEntries {
		v.failed(fmt.Sprintf("198.51.%d.%d", i/250, i%250), fmt.Sprint("spray-", i))
	}
	v.mu.Lock()
	n := len(v.fails)
	v.mu.Unlock()
	if n > maxFailEntries {
		t.Errorf("failure table holds %d keys, bound %d", n, maxFailEntries)
	}
	if v.throttled("192.0.2.1", "carol") == 0 {
		t.Error("a flood of failures from other addresses lifted carol's throttle")
	}
}
