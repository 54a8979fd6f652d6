package server

import (
	"context"
	"encoding/json"
	"fmt"
	"net/http"
	"strconv"
	"strings"
	"testing"

	"time"

	"github.com/beaconplane/beacon/server/registryapi"
)

// TestFailedAuthenticationsThrottled: a client that guesses a user's
// password is slowed down per address and user name, over a real etcd
// with authentication on — and nobody else is locked out: not other users
// from the same address (every local process shares 127.0.0.1), not the
// guessed user's own password that etcd accepted lately. Before, 110
// failed logins with random user names from 127.0.0.1 made the first
// login of root (and of any user not yet cached) answer 429 for tens of
// seconds.
func TestFailedAuthenticationsThrottled(t *testing.T) {
	s := startServer(t, authConfig(t))
	cli := rootClient(t, s)
	grant(t, cli, "carol", "carol-pw", "read /services/")
	grant(t, cli, "dave", "dave-pw", "read /services/")
	base := s.Endpoints().HTTP
	list := func(user, pw string) httpAnswer {
		return as{t: t, base: base, auth: basic(user, pw)}.do("GET", registryapi.InstancesPath, "")
	}
	// dave logs in once; his password is then known good.
	if r := list("dave", "dave-pw"); r.code != http.StatusOK {
		t.Fatalf("dave: %d %s", r.code, r.body)
	}
	// His view closes (as after viewIdle): the next login checks with
	// etcd again.
	v := s.authn().views
	v.mu.Lock()
	var daves []*userView
	for _, uv := range v.views {
		if uv.id.user == "dave" {
			daves = append(daves, uv)
		}
	}
	v.mu.Unlock()
	for _, uv := range daves {
		v.drop(uv)
	}

	// Guesses at carol's and dave's passwords: 429 for them, from here.
	for _, user := range []string{"carol", "dave"} {
		for i := range maxFails {
			if r := list(user, fmt.Sprint("guess-", i)); r.code != http.StatusUnauthorized {
				t.Fatalf("%s guess %d: %d %s", user, i, r.code, r.body)
			}
		}
		r := list(user, "guess-last")
		if r.code != http.StatusTooManyRequests || !strings.Contains(r.body, "resource_exhausted") || !strings.Contains(r.body, `as \"`+user+`\"`) {
			t.Fatalf("%s guess %d: %d %s, want 429 naming the user", user, maxFails, r.code, r.body)
		}
		if secs, err := strconv.Atoi(r.header.Get("Retry-After")); err != nil || secs < 1 || secs > int(failWindow.Seconds()) {
			t.Fatalf("Retry-After %q", r.header.Get("Retry-After"))
		}
	}
	// A password etcd accepted lately is let through (and checked).
	if r := list("dave", "dave-pw"); r.code != http.StatusOK {
		t.Fatalf("dave's known password while his guesses are throttled: %d %s", r.code, r.body)
	}
	if r := list("carol", "carol-pw"); r.code != http.StatusTooManyRequests {
		t.Fatalf("carol's password, never accepted before, while her guesses are throttled: %d %s", r.code, r.body)
	}

	// 110 failures with random user names from the same address: past
	// maxAddrFails, yet root's first login, and a token for root, work.
	for i := range 110 {
		if r := list(fmt.Sprintf("random-%d", i), "x"); r.code != http.StatusUnauthorized {
			t.Fatalf("unknown user %d: %d %s, want 401", i, r.code, r.body)
		}
	}
	if r := list("root", rootPassword); r.code != http.StatusOK {
		t.Fatalf("root's first login after 110 failures of other names from its address: %d %s", r.code, r.body)
	}
	r := as{t: t, base: base, auth: basic("root", rootPassword)}.do("POST", TokenPath, "")
	var tok TokenResponse
	if err := json.Unmarshal([]byte(r.body), &tok); err != nil || r.code != http.StatusOK || tok.Token == "" {
		t.Fatalf("a token for root after the failures: %d %s", r.code, r.body)
	}
	// Forged or wrong tokens count for themselves, not for the user a
	// token names: root's real token still works after many bad ones.
	for i := range maxFails + 5 {
		if r := (as{t: t, base: base, auth: fmt.Sprint("Bearer forged-", i)}).do("GET", registryapi.InstancesPath, ""); r.code != http.StatusUnauthorized {
			t.Fatalf("bad token %d: %d %s", i, r.code, r.body)
		}
	}
	if r := (as{t: t, base: base, auth: "Bearer " + tok.Token}).do("GET", registryapi.InstancesPath, ""); r.code != http.StatusOK {
		t.Fatalf("root's token after bad tokens from its address: %d %s", r.code, r.body)
	}

	// The table of failures is bounded; a flood from many addresses does
	// not push out an entry that throttles.
	th := s.authn().throttle
	for range maxFails {
		th.failed("192.0.2.1", "carol")
	}
	for i := range 2 * maxFailEntries {
		th.failed(fmt.Sprintf("198.51.%d.%d", i/250, i%250), fmt.Sprint("spray-", i))
	}
	th.mu.Lock()
	n := len(th.fails)
	th.mu.Unlock()
	if n > maxFailEntries {
		t.Errorf("failure table holds %d keys, bound %d", n, maxFailEntries)
	}
	if th.throttled("192.0.2.1", identity{method: methodBasic, user: "carol", password: "x"}) == 0 {
		t.Error("a flood of failures from other addresses lifted carol's throttle")
	}
	// So is the table of accepted credentials.
	for i := range 2 * maxGood {
		th.succeeded(identity{method: methodBasic, user: fmt.Sprint("u", i), password: "p"})
	}
	th.mu.Lock()
	n = len(th.good)
	th.mu.Unlock()
	if n > maxGood {
		t.Errorf("accepted-credentials table holds %d keys, bound %d", n, maxGood)
	}
}

// TestAddressGate: past maxAddrFails failures from one address within the
// window, its credential checks run one at a time (a delay, never a
// refusal); an address below it is not gated, and the gates go away with
// their last check.
func TestAddressGate(t *testing.T) {
	v := newLoginThrottle(time.Now)
	cancelled, cancel := context.WithCancel(context.Background())
	cancel()
	ctx := context.Background()
	for range maxAddrFails - 1 {
		v.failed("192.0.2.7", fmt.Sprint("n", len(v.fails)))
	}
	release, err := v.gate(cancelled, "192.0.2.7")
	if err != nil {
		t.Fatalf("an address below the bound is gated: %v", err)
	}
	release()
	v.failed("192.0.2.7", "one-more")
	hold, err := v.gate(ctx, "192.0.2.7")
	if err != nil {
		t.Fatal(err)
	}
	if _, err := v.gate(cancelled, "192.0.2.7"); err == nil {
		t.Fatal("a second check of a gated address ran while the first one runs")
	}
	if rel, err := v.gate(cancelled, "192.0.2.8"); err != nil {
		t.Fatalf("another address is gated: %v", err)
	} else {
		rel()
	}
	hold()
	next, err := v.gate(ctx, "192.0.2.7")
	if err != nil {
		t.Fatalf("the next check once the first ended: %v", err)
	}
	next()
	v.mu.Lock()
	defer v.mu.Unlock()
	if len(v.gates) != 0 {
		t.Fatalf("gates left: %v", v.gates)
	}
}
