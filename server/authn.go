package server

import (
	"cmp"
	"context"
	"errors"
	"fmt"
	"log/slog"
	"math"
	"net/http"
	"strconv"
	"sync"
	"sync/atomic"
	"time"

	"github.com/beaconplane/beacon/internal/wait"
	"github.com/beaconplane/beacon/registry"
	"github.com/beaconplane/beacon/store"
)

// authenticator is authentication as one unit: etcd's verdict on
// credentials (an authority), the cache of the views that act as the users
// it accepted (authViews), the throttle of failed attempts
// (loginThrottle), and etcd's auth revision as the watches served to users
// follow it (authRevisions). The HTTP API (requireAuth, whoami, issueToken)
// and xDS (authorizeXDS) authenticate through it alike; tests construct it
// directly with newAuthenticator. It takes no lock of its own: authViews,
// loginThrottle and authRevisions each hold theirs, never two at once.
type authenticator struct {
	auth     authority // nil: the backend has no users (memory, file, nats)
	views    *authViews
	throttle *loginThrottle

	stop context.CancelFunc // ends the janitor and the poller
	done chan struct{}      // closed when both have ended

	// revs tells the watches served to users when etcd's auth revision
	// moves (nil without an authority); recheckEvery is how often they
	// probe their permission again all the same (guardedWatch): a
	// time.Duration, permissionRecheck, shortened by tests.
	revs         *authRevisions
	recheckEvery atomic.Int64
}

// authOptions are what an authenticator needs besides its authority.
type authOptions struct {
	// Registry configures the registry of each user view.
	Registry registry.Config
	// MaxViews bounds the open user views (Security.MaxAuthClients).
	MaxViews int
	Log      *slog.Logger
	// Now is the clock of the throttle and of the views' idle times;
	// time.Now when nil.
	Now func() time.Time
	// SweepEvery is how often the janitor closes idle views; a minute
	// when zero.
	SweepEvery time.Duration
}

// newAuthenticator returns an authenticator over a, with its janitor (which
// closes idle views) and, with an authority, the poller of etcd's auth
// revision (authRevisions) running until close.
func newAuthenticator(a authority, o authOptions) *authenticator {
	if o.Now == nil {
		o.Now = time.Now
	}
	o.Log = cmp.Or(o.Log, slog.New(slog.DiscardHandler))
	o.SweepEvery = cmp.Or(o.SweepEvery, time.Minute)
	n := &authenticator{auth: a, views: newAuthViews(a, o.Registry, o.MaxViews, o.Log, o.Now), throttle: newLoginThrottle(o.Now)}
	n.recheckEvery.Store(int64(permissionRecheck))
	if a != nil {
		n.revs = newAuthRevisions(a.revision)
	}
	ctx, cancel := context.WithCancel(context.Background())
	n.stop, n.done = cancel, make(chan struct{})
	go func() {
		defer close(n.done)
		var poller sync.WaitGroup
		if n.revs != nil {
			poller.Go(func() { wait.Every(ctx, authRevisionEvery, func() { n.revs.poll(ctx) }) })
		}
		wait.Every(ctx, o.SweepEvery, n.views.sweep)
		poller.Wait()
	}()
	return n
}

// close stops the janitor and closes every view. It is idempotent, and a
// no-op on the zero authenticator (a backend without users).
func (n *authenticator) close() {
	if n.stop == nil {
		return
	}
	n.stop()
	<-n.done
	n.views.closeAll()
}

// authFailure is why checkIdentity authenticated no one: an HTTP status, an
// error kind and a message that says what to do (and, for 429 and 503,
// when to retry).
type authFailure struct {
	code       int
	kind, msg  string
	retryAfter time.Duration
}

func (f *authFailure) write(w http.ResponseWriter) {
	if f.retryAfter > 0 {
		w.Header().Set("Retry-After", strconv.Itoa(max(1, int(math.Ceil(f.retryAfter.Seconds())))))
	}
	if f.code == http.StatusUnauthorized {
		writeUnauthorized(w, f.msg)
		return
	}
	writeErr(w, f.code, f.kind, f.msg)
}

// checkIdentity authenticates id, presented from addr, with etcd (or finds
// its cached view) and returns a view that acts as it; release it when
// done. The HTTP API and xDS authenticate through it alike.
func (n *authenticator) checkIdentity(ctx context.Context, addr string, id identity) (*userView, *authFailure) {
	rev, err := n.auth.revision(ctx)
	if err != nil {
		return nil, &authFailure{code: http.StatusServiceUnavailable, kind: "unavailable", msg: err.Error()}
	}
	if uv := n.views.cached(id, rev); uv != nil {
		return uv, nil
	}
	var uv *userView
	fail := n.guardCheck(ctx, addr, id, func(ctx context.Context) (err error) {
		uv, err = n.views.acquire(ctx, id)
		return err
	})
	return uv, fail
}

// guardCheck runs check, etcd's verdict on id's credentials presented from
// addr, unless that address and user failed too often (429), one at a time
// for an address with many failures; it records the verdict for the
// throttle. An error of check matching store.ErrUnauthenticated is a 401,
// any other a 503.
func (n *authenticator) guardCheck(ctx context.Context, addr string, id identity, check func(context.Context) error) *authFailure {
	if wait := n.throttle.throttled(addr, id); wait > 0 {
		return &authFailure{code: http.StatusTooManyRequests, kind: "resource_exhausted", retryAfter: wait, msg: fmt.Sprintf(
			"too many failed authentications as %q from %s: wait %d s, and check the user name and password (other users, and a password etcd accepted lately, are not throttled)",
			id.throttleName(), addr, max(1, int(math.Ceil(wait.Seconds()))))}
	}
	release, err := n.throttle.gate(ctx, addr)
	if err != nil {
		return &authFailure{code: http.StatusServiceUnavailable, kind: "unavailable", retryAfter: time.Second, msg: fmt.Sprintf(
			"credential checks from %s run one at a time after many failed authentications from that address; this one did not start before the request ended: retry", addr)}
	}
	err = check(ctx)
	release()
	switch {
	case errors.Is(err, store.ErrUnauthenticated):
		n.throttle.failed(addr, id.throttleName())
		return &authFailure{code: http.StatusUnauthorized, kind: "unauthenticated", msg: err.Error()}
	case err != nil:
		return &authFailure{code: http.StatusServiceUnavailable, kind: "unavailable", msg: "authenticate with etcd: " + err.Error()}
	}
	n.throttle.succeeded(id)
	return nil
}

// token exchanges a user's password for an etcd token, guarded by the
// throttle as any other credential check.
func (n *authenticator) token(ctx context.Context, addr string, id identity) (string, *authFailure) {
	var tok string
	fail := n.guardCheck(ctx, addr, id, func(ctx context.Context) (err error) {
		tok, err = n.auth.token(ctx, id.user, id.password)
		return err
	})
	return tok, fail
}
