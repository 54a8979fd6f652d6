package server

import (
	"context"
	"errors"
	"fmt"
	"sync"
	"time"

	"github.com/beaconplane/beacon"
	"github.com/beaconplane/beacon/registry"
	"github.com/beaconplane/beacon/store"
)

// How a watch served to an authenticated user keeps checking that the user
// may read it (guardedWatch): etcd's auth revision, which moves with every
// change of users, roles or permissions, is read every authRevisionEvery
// by one goroutine for all watches (authRevisions; in-process on an
// embedded member, cached authStatusTTL for a cluster fronted), and each
// watch probes its permission again when it moved, and at the latest every
// permissionRecheck (a token that expired: etcd checks a watch's
// credentials when it opens it, never after). A probe that could not be
// made (etcd unreachable) is tried again after probeRetry.
const (
	authRevisionEvery = time.Second
	permissionRecheck = 30 * time.Second
	probeTimeout      = 5 * time.Second
	probeRetry        = time.Second
)

// authRevisions tells the guarded watches when etcd's auth revision
// moves: the authenticator's goroutine reads it (poll) while any watch
// listens, and closes the channel they wait on when it changed.
type authRevisions struct {
	read func(context.Context) (uint64, error)

	mu        sync.Mutex
	rev       uint64
	moved     chan struct{} // closed when rev moves, then replaced
	listeners int
}

func newAuthRevisions(read func(context.Context) (uint64, error)) *authRevisions {
	return &authRevisions{read: read, moved: make(chan struct{})}
}

// current is the revision last read, and a channel closed when it moves.
func (a *authRevisions) current() (uint64, <-chan struct{}) {
	a.mu.Lock()
	defer a.mu.Unlock()
	return a.rev, a.moved
}

// listen counts a watch that waits on current's channels until release.
func (a *authRevisions) listen() (release func()) {
	a.mu.Lock()
	a.listeners++
	a.mu.Unlock()
	var once sync.Once
	return func() {
		once.Do(func() {
			a.mu.Lock()
			a.listeners--
			a.mu.Unlock()
		})
	}
}

// poll reads the revision, if a watch listens, and tells them all when it
// moved. A failed read (etcd unreachable) tells nothing: the watches'
// own Stale batches say that the store is gone.
func (a *authRevisions) poll(ctx context.Context) {
	a.mu.Lock()
	idle := a.listeners == 0
	a.mu.Unlock()
	if idle {
		return
	}
	rctx, cancel := context.WithTimeout(ctx, probeTimeout)
	rev, err := a.read(rctx)
	cancel()
	if err != nil {
		return
	}
	a.mu.Lock()
	defer a.mu.Unlock()
	if rev != a.rev {
		a.rev = rev
		close(a.moved)
		a.moved = make(chan struct{})
	}
}

// userRegistry is the registry of one authenticated user's request. Writes,
// lists and gets go through the user's own registry (its view), as the
// user: etcd decides each. Watches come from the server's own registry, so
// that one copy of every watched state serves all users however many
// there are: each is opened once etcd has answered a probe made as the
// user that the user may read the exact key range the watch covers
// (StoreRegistry.ReadPrefix), and ends when etcd no longer says so
// (guardedWatch).
type userRegistry struct {
	*registry.StoreRegistry // the user's
	shared                  registry.Discoverer
	n                       *authenticator
	uv                      *userView
	self                    func() string // the server's own etcd user, for messages
}

// Watch implements registry.Discoverer.
func (u *userRegistry) Watch(ctx context.Context, q beacon.Query, opts ...registry.WatchOption) (registry.Watcher, error) {
	prefix := u.ReadPrefix(q)
	// The revision is taken before the probe, so that a change after it,
	// once the poller reads it, makes the watch probe again (one the
	// poller has not read yet costs a probe more, no more).
	rev, _ := u.n.revs.current()
	may := func(ctx context.Context) error { return probe(ctx, u.uv.cli, prefix, false) }
	if err := may(ctx); err != nil {
		return nil, err
	}
	w, err := u.shared.Watch(ctx, q, opts...)
	if err != nil {
		return nil, u.ownRefusal(prefix, err)
	}
	return newGuardedWatch(ctx, w, prefix, u.ownRefusal, recheck{
		rev:     rev,
		changes: u.n.revs,
		may:     may,
		atLeast: time.Duration(u.n.recheckEvery.Load()),
	}), nil
}

// newGuardedWatch guards w, the server registry's watch of prefix, with c
// until ctx ends or it is closed; own rewrites the refusals w meets
// (userRegistry.ownRefusal).
func newGuardedWatch(ctx context.Context, w registry.Watcher, prefix string, own func(string, error) error, c recheck) *guardedWatch {
	g := &guardedWatch{Watcher: w, prefix: prefix, own: own, done: make(chan struct{})}
	g.refused, g.deny = context.WithCancelCause(context.Background())
	cctx, stop := context.WithCancel(ctx) // the watch ends with ctx, as the inner one does
	g.stop = stop
	go func() {
		defer close(g.done)
		g.recheck(cctx, c)
	}()
	return g
}

// ownRefusal says that a refusal the server's own registry met is the
// server's own etcd user's, not the caller's: the server then cannot
// serve the watch (ErrUnavailable, with what to grant), whatever the
// caller may read.
func (u *userRegistry) ownRefusal(prefix string, err error) error {
	if !errors.Is(err, store.ErrPermissionDenied) && !errors.Is(err, store.ErrUnauthenticated) {
		return err
	}
	return fmt.Errorf("%w: this server's own etcd user (%s) may not read %s, which it watches on behalf of its callers: grant it read on that key prefix (beacon auth grant-namespace ROLE NAMESPACE --read-only, then etcdctl user grant-role USER ROLE) (%v)",
		store.ErrUnavailable, u.self(), prefix, err)
}

// guardedWatch is a watch of the server's own registry served to one
// user (userRegistry.Watch). While etcd says the user may read its range
// it passes the batches through; once etcd says no (a role revoked, the
// credentials no longer accepted) it delivers one Stale batch with that
// refusal and then ends, returning the refusal from Next.
type guardedWatch struct {
	registry.Watcher // the server registry's
	prefix           string
	own              func(prefix string, err error) error

	refused context.Context         // done once etcd refused the user; its cause is the refusal
	deny    context.CancelCauseFunc // refuses
	stop    context.CancelFunc      // ends recheck
	done    chan struct{}           // closed when recheck has returned

	closeOnce sync.Once
	ended     error // Next's answer once the refusal was delivered
}

// recheck is what guardedWatch.recheck needs.
type recheck struct {
	rev     uint64                      // the auth revision of the last probe that passed
	changes *authRevisions              // tells when the revision moves
	may     func(context.Context) error // the probe, as the user
	atLeast time.Duration               // how often to probe when the revision does not move
}

// recheck probes the permission again whenever etcd's auth revision moves
// past c.rev, and at the latest every c.atLeast, until ctx ends or etcd
// refuses (deny). A probe that fails otherwise (etcd unreachable) is
// tried again after probeRetry.
func (g *guardedWatch) recheck(ctx context.Context, c recheck) {
	defer c.changes.listen()()
	timer := time.NewTimer(c.atLeast)
	defer timer.Stop()
	due := false // the timer fired: probe whatever the revision
	for {
		cur, moved := c.changes.current()
		if due || cur != c.rev {
			pctx, cancel := context.WithTimeout(ctx, probeTimeout)
			err := c.may(pctx)
			cancel()
			next := c.atLeast
			switch {
			case errors.Is(err, store.ErrPermissionDenied), errors.Is(err, store.ErrUnauthenticated):
				g.deny(err)
				return
			case err == nil:
				c.rev = cur
			default:
				next = probeRetry
			}
			due = false
			timer.Reset(next)
		}
		select {
		case <-ctx.Done():
			return
		case <-moved:
		case <-timer.C:
			due = true
		}
	}
}

// Next implements registry.Watcher.
func (g *guardedWatch) Next(ctx context.Context) (registry.Batch, error) {
	if g.ended != nil {
		return registry.Batch{}, g.ended
	}
	nctx, cancel := context.WithCancel(ctx)
	defer cancel()
	stop := context.AfterFunc(g.refused, cancel)
	defer stop()
	b, err := g.Watcher.Next(nctx)
	if g.refused.Err() != nil && ctx.Err() == nil {
		// Refused: end, whatever the inner watch answered meanwhile.
		g.ended = context.Cause(g.refused)
		return registry.Batch{Kind: registry.Stale, Err: g.ended}, nil
	}
	if err == nil && b.Kind == registry.Stale && b.Err != nil {
		b.Err = g.own(g.prefix, b.Err)
	}
	return b, err
}

// Close implements registry.Watcher. It is idempotent.
func (g *guardedWatch) Close() error {
	g.closeOnce.Do(func() {
		g.stop()
		<-g.done
	})
	return g.Watcher.Close()
}
