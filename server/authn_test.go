package server

import (
	"context"
	"errors"
	"fmt"
	"log/slog"
	"net/http"
	"slices"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/beaconplane/beacon/internal/testkit/etcdtest"
	"github.com/beaconplane/beacon/registry"
	"github.com/beaconplane/beacon/store"
	"go.etcd.io/etcd/api/v3/v3rpc/rpctypes"
)

// The authenticator, constructed directly: its throttle with a clock the
// test moves, its verdicts with check functions that say what etcd would,
// and its identities against a real etcd with authentication on.

// testClock is a clock that moves only when told.
type testClock struct {
	mu sync.Mutex
	t  time.Time
}

func newTestClock() *testClock { return &testClock{t: time.Date(2026, 1, 2, 3, 4, 5, 0, time.UTC)} }

func (c *testClock) now() time.Time { c.mu.Lock(); defer c.mu.Unlock(); return c.t }

func (c *testClock) advance(d time.Duration) { c.mu.Lock(); c.t = c.t.Add(d); c.mu.Unlock() }

func pw(user, password string) identity {
	return identity{method: methodBasic, user: user, password: password}
}

// TestThrottleCountsPerAddressAndUser: maxFails failures of one user from
// one address within failWindow throttle that user from that address — for
// what is left of the window from the oldest failure that counts — and
// nobody else: not another user from the address, not the user from
// another address; the window passing lifts it.
func TestThrottleCountsPerAddressAndUser(t *testing.T) {
	clk := newTestClock()
	th := newLoginThrottle(clk.now)
	for i := range maxFails - 1 {
		th.failed("192.0.2.1", "carol")
		if w := th.throttled("192.0.2.1", pw("carol", "x")); w != 0 {
			t.Fatalf("throttled after %d failures (bound %d): %v", i+1, maxFails, w)
		}
	}
	clk.advance(10 * time.Second)
	th.failed("192.0.2.1", "carol")
	if w := th.throttled("192.0.2.1", pw("carol", "x")); w != failWindow-10*time.Second {
		t.Fatalf("after %d failures: wait %v, want %v (the window from the first failure)", maxFails, w, failWindow-10*time.Second)
	}
	if w := th.throttled("192.0.2.1", pw("dave", "x")); w != 0 {
		t.Errorf("another user from the same address is throttled: %v", w)
	}
	if w := th.throttled("192.0.2.2", pw("carol", "x")); w != 0 {
		t.Errorf("the user from another address is throttled: %v", w)
	}
	clk.advance(failWindow - 10*time.Second - time.Nanosecond)
	if w := th.throttled("192.0.2.1", pw("carol", "x")); w != time.Nanosecond {
		t.Fatalf("just before the window passes: wait %v, want 1ns", w)
	}
	clk.advance(time.Nanosecond)
	if w := th.throttled("192.0.2.1", pw("carol", "x")); w != 0 {
		t.Fatalf("the window has passed for the first failure, %d remain: wait %v", maxFails-1, w)
	}
	// Past maxFails, the wait runs from the oldest failure that still
	// counts (the maxFails-th newest), not from the oldest kept.
	th = newLoginThrottle(clk.now)
	for range maxFails + 5 {
		th.failed("192.0.2.9", "erin")
		clk.advance(time.Second)
	}
	if w := th.throttled("192.0.2.9", pw("erin", "x")); w != failWindow-time.Duration(maxFails)*time.Second {
		t.Fatalf("%d failures a second apart: wait %v, want %v", maxFails+5, w, failWindow-time.Duration(maxFails)*time.Second)
	}
}

// TestThrottleKeysHaveAFixedSize: failures under user names as long as a
// request's headers allow are kept under keys of a fixed size, and still
// throttle that name (and only it).
func TestThrottleKeysHaveAFixedSize(t *testing.T) {
	clk := newTestClock()
	th := newLoginThrottle(clk.now)
	long := func(i int) string { return fmt.Sprintf("%d-%s", i, strings.Repeat("\"x\x00", 16<<10)) }
	for i := range 200 {
		th.failed("192.0.2.1", long(i))
	}
	for range maxFails - 1 {
		th.failed("192.0.2.1", long(0))
	}
	for key := range th.fails {
		if len(key) > len("192.0.2.1")+32 {
			t.Fatalf("a key of %d bytes in the table of failures", len(key))
		}
	}
	if w := th.throttled("192.0.2.1", pw(long(0), "x")); w == 0 {
		t.Error("a long name that failed maxFails times is not throttled")
	}
	if w := th.throttled("192.0.2.1", pw(long(1), "x")); w != 0 {
		t.Errorf("another long name is throttled: %v", w)
	}
}

// TestThrottleLetsAcceptedCredentialsThrough: credentials etcd accepted
// within goodFor are never throttled (and other passwords of the same user
// are), and a bearer token's failures count for the token, not for the
// user a forged JWT could name.
func TestThrottleLetsAcceptedCredentialsThrough(t *testing.T) {
	clk := newTestClock()
	th := newLoginThrottle(clk.now)
	th.succeeded(pw("dave", "dave-pw"))
	for range maxFails {
		th.failed("192.0.2.1", "dave")
	}
	if w := th.throttled("192.0.2.1", pw("dave", "dave-pw")); w != 0 {
		t.Errorf("a password etcd accepted lately is throttled: %v", w)
	}
	if w := th.throttled("192.0.2.1", pw("dave", "guess")); w == 0 {
		t.Error("another password of a throttled user is let through")
	}
	clk.advance(goodFor - failWindow)
	for range maxFails {
		th.failed("192.0.2.1", "dave")
	}
	clk.advance(failWindow)
	for range maxFails {
		th.failed("192.0.2.1", "dave")
	}
	if w := th.throttled("192.0.2.1", pw("dave", "dave-pw")); w == 0 {
		t.Error("a password accepted goodFor ago still bypasses the throttle")
	}

	forged := identity{method: methodBearer, token: "forged", user: "root"}
	for range maxFails {
		th.failed("192.0.2.3", forged.throttleName())
	}
	if w := th.throttled("192.0.2.3", forged); w == 0 {
		t.Error("a bearer token that failed maxFails times is not throttled")
	}
	if w := th.throttled("192.0.2.3", identity{method: methodBearer, token: "real", user: "root"}); w != 0 {
		t.Errorf("a forged token naming root throttles root's other tokens: %v", w)
	}
	if w := th.throttled("192.0.2.3", pw("root", "pw")); w != 0 {
		t.Errorf("a forged token naming root throttles root's password: %v", w)
	}
}

// TestGuardCheckVerdicts: etcd's refusal is a 401 that counts for the
// throttle; past maxFails the check is not even run (429 with its wait);
// any other error is a 503 that does not count; an accepted check is
// remembered (its credentials then bypass the throttle).
func TestGuardCheckVerdicts(t *testing.T) {
	clk := newTestClock()
	n := newAuthenticator(nil, authOptions{Now: clk.now})
	t.Cleanup(n.close)
	ctx := context.Background()
	refused := func(context.Context) error { return fmt.Errorf("%w: wrong password", store.ErrUnauthenticated) }
	down := func(context.Context) error { return fmt.Errorf("%w: no leader", store.ErrUnavailable) }
	ok := func(context.Context) error { return nil }

	for range maxFails + 3 {
		if f := n.guardCheck(ctx, "192.0.2.1", pw("erin", "x"), down); f == nil || f.code != http.StatusServiceUnavailable || f.kind != "unavailable" {
			t.Fatalf("etcd unavailable: %+v, want 503", f)
		}
	}
	if f := n.guardCheck(ctx, "192.0.2.1", pw("erin", "right"), ok); f != nil {
		t.Fatalf("unavailable answers counted as failures: %+v", f)
	}
	for i := range maxFails {
		f := n.guardCheck(ctx, "192.0.2.1", pw("frank", "x"), refused)
		if f == nil || f.code != http.StatusUnauthorized || f.kind != "unauthenticated" || f.msg != "store: not authenticated: wrong password" {
			t.Fatalf("refusal %d: %+v, want 401 with etcd's reason", i, f)
		}
	}
	ran := false
	f := n.guardCheck(ctx, "192.0.2.1", pw("frank", "y"), func(context.Context) error { ran = true; return nil })
	if f == nil || f.code != http.StatusTooManyRequests || f.kind != "resource_exhausted" || f.retryAfter != failWindow || ran {
		t.Fatalf("past maxFails: %+v (check ran: %v), want 429 after %v without asking etcd", f, ran, failWindow)
	}
	if f := n.guardCheck(ctx, "192.0.2.1", pw("erin", "right"), ok); f != nil {
		t.Fatalf("erin's accepted password: %+v", f)
	}
	for range maxFails {
		n.guardCheck(ctx, "192.0.2.1", pw("erin", "guess"), refused)
	}
	if f := n.guardCheck(ctx, "192.0.2.1", pw("erin", "right"), ok); f != nil {
		t.Fatalf("erin's accepted password after guesses at hers: %+v, want it let through", f)
	}
}

// TestAuthFailureAnswers: 429 and 503 say when to retry (whole seconds,
// at least one), 401 asks for credentials.
func TestAuthFailureAnswers(t *testing.T) {
	for _, tc := range []struct {
		f           authFailure
		retry, auth string
	}{
		{authFailure{code: http.StatusTooManyRequests, kind: "resource_exhausted", retryAfter: 1500 * time.Millisecond}, "2", ""},
		{authFailure{code: http.StatusServiceUnavailable, kind: "unavailable", retryAfter: time.Millisecond}, "1", ""},
		{authFailure{code: http.StatusServiceUnavailable, kind: "unavailable"}, "", ""},
		{authFailure{code: http.StatusUnauthorized, kind: "unauthenticated"}, "", `Basic realm="beacon", charset="UTF-8"`},
	} {
		w := &recorder{header: http.Header{}}
		tc.f.write(w)
		if w.code != tc.f.code || w.header.Get("Retry-After") != tc.retry || w.header.Get("WWW-Authenticate") != tc.auth {
			t.Errorf("%+v: %d Retry-After %q WWW-Authenticate %q, want %d %q %q", tc.f, w.code, w.header.Get("Retry-After"), w.header.Get("WWW-Authenticate"), tc.f.code, tc.retry, tc.auth)
		}
	}
}

// TestCheckIdentityAgainstEtcd: over a real etcd with authentication on,
// an accepted password gives a view acting as the user, served from the
// cache next time; a wrong password of that user is never served the
// cached view (etcd refuses it, and it counts); a changed password stops
// the old one at once (the auth revision moved); a token issued through
// the authenticator authenticates as its user.
func TestCheckIdentityAgainstEtcd(t *testing.T) {
	srv := etcdtest.Start(t, etcdtest.Options{User: "root", Password: rootPassword})
	root := srv.Client(t)
	grant(t, root, "alice", "alice-pw", "readwrite /services/")
	n := newAuthenticator(&embeddedAuthority{srv: srv.Etcd().Server, log: slog.New(slog.DiscardHandler)}, authOptions{Registry: registry.Config{}, MaxViews: 4})
	t.Cleanup(n.close)
	ctx, cancel := context.WithTimeout(context.Background(), time.Minute)
	defer cancel()

	uv, f := n.checkIdentity(ctx, "192.0.2.1", pw("alice", "alice-pw"))
	if f != nil {
		t.Fatalf("alice's password: %+v", f)
	}
	if uv.id.user != "alice" {
		t.Fatalf("view acts as %q", uv.id.user)
	}
	if _, err := uv.cli.Put(ctx, "/elsewhere", "x"); !errors.Is(rpctypes.Error(err), rpctypes.ErrPermissionDenied) {
		t.Fatalf("the view acts as alice, whose role has no /elsewhere: %v", err)
	}
	again, f := n.checkIdentity(ctx, "192.0.2.1", pw("alice", "alice-pw"))
	if f != nil || again != uv {
		t.Fatalf("second request: %p %+v, want the cached view %p", again, f, uv)
	}
	n.views.release(again)

	if wrong, f := n.checkIdentity(ctx, "192.0.2.1", pw("alice", "not-alice-pw")); f == nil || f.code != http.StatusUnauthorized || wrong != nil {
		t.Fatalf("a wrong password of a user with a cached view: %v %+v, want 401", wrong, f)
	}
	if nobody, f := n.checkIdentity(ctx, "192.0.2.1", pw("mallory", "alice-pw")); f == nil || f.code != http.StatusUnauthorized || nobody != nil {
		t.Fatalf("an unknown user: %v %+v, want 401", nobody, f)
	}
	if got := len(n.throttle.recentFailures("192.0.2.1")); got != 2 {
		t.Fatalf("%d failures recorded from the address, want 2", got)
	}
	n.views.release(uv)

	if _, err := root.UserChangePassword(ctx, "alice", "alice-pw-2"); err != nil {
		t.Fatal(err)
	}
	if old, f := n.checkIdentity(ctx, "192.0.2.1", pw("alice", "alice-pw")); f == nil || f.code != http.StatusUnauthorized {
		t.Fatalf("alice's old password after the change: %v %+v, want 401", old, f)
	}

	tok, f := n.token(ctx, "192.0.2.1", pw("alice", "alice-pw-2"))
	if f != nil || tok == "" {
		t.Fatalf("token: %q %+v", tok, f)
	}
	byToken, f := n.checkIdentity(ctx, "192.0.2.1", identity{method: methodBearer, token: tok})
	if f != nil || byToken.id.user != "alice" {
		t.Fatalf("the token: %+v %+v, want a view acting as alice", byToken, f)
	}
	n.views.release(byToken)
	if _, f := n.token(ctx, "192.0.2.1", pw("alice", "alice-pw")); f == nil || f.code != http.StatusUnauthorized {
		t.Fatalf("a token for a wrong password: %+v, want 401", f)
	}
}

// TestAuthenticatorClose: close ends the janitor and closes the views no
// request holds; it is idempotent, and the zero authenticator (a backend
// without users) closes too.
func TestAuthenticatorClose(t *testing.T) {
	(&authenticator{}).close()
	n := newAuthenticator(nil, authOptions{})
	n.close()
	n.close()
	select {
	case <-n.done:
	default:
		t.Fatal("the janitor still runs after close")
	}
}

// recentFailures are the failures counted under key within the window.
func (v *loginThrottle) recentFailures(key string) []time.Time {
	v.mu.Lock()
	defer v.mu.Unlock()
	return slices.Clone(v.recentLocked(key, v.now()))
}
