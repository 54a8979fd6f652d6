package registry

import (
	"context"
	"errors"
	"fmt"
	"sync/atomic"

	"github.com/beaconplane/beacon"
	"github.com/beaconplane/beacon/registry/internal/view"
)

// cursor is one watcher's position in its feed: the version it delivered
// last and what it was told. The watcher owns it (one Next at a time);
// the feed moves it (next).
type cursor struct {
	from        int64 // FromRevision (0: none)
	fromChecked bool  // from was found not beyond the store's revision

	v          atomic.Pointer[view.Version] // last delivered; nil before the first batch
	staleGen   uint64                       // last disconnection reported
	needResync bool                         // a Stale batch awaits its Resync
}

// step is what next decided: a batch to return, a channel to wait on
// before asking again (nil: ask again at once), the resume revision to
// check first, or the end of the watch.
type step struct {
	batch     Batch
	ok        bool
	wake      <-chan struct{}
	checkFrom bool
	err       error
}

// next moves c on: the first batch (a snapshot, or the changes since the
// resume revision), a Stale batch once per disconnection, the changes
// since c's version (a Resync after a re-listing or a Stale batch), or
// nothing new yet. It holds f.mu for reading only: the watchers of a feed
// move on together when it changes, and would otherwise queue for the
// lock one by one (a mutex profile at 10,000 watchers: most of their time).
func (f *feed) next(c *cursor) step {
	f.mu.RLock()
	if err := f.wake.Err(); err != nil {
		f.mu.RUnlock()
		if errors.Is(err, ErrClosed) {
			return step{err: ErrClosed}
		}
		return step{err: err}
	}
	old := c.v.Load()
	switch {
	case old == nil && f.conn.synced && c.from > f.cur.Rev && !c.fromChecked:
		// A revision the feed has not reached: the store may have (it
		// follows this prefix only), or the revision was never given.
		f.mu.RUnlock()
		return step{checkFrom: true}
	case old == nil && f.conn.synced:
		return f.firstLocked(c)
	case f.conn.stale != nil && c.staleGen != f.conn.staleGen:
		c.staleGen = f.conn.staleGen
		b := Batch{Kind: Stale, Err: f.conn.stale}
		if old != nil {
			c.needResync = true
			b.Revision = old.Rev
		}
		f.mu.RUnlock()
		return step{batch: b, ok: true}
	case old != nil && (f.cur.Seq != old.Seq || f.cur.Rev != old.Rev || f.cur.Relists != old.Relists ||
		(c.needResync && f.conn.stale == nil)):
		return f.changesLocked(c, old)
	}
	wake := f.wake.C()
	f.mu.RUnlock()
	return step{wake: wake}
}

// firstLocked gives c its first batch and read-unlocks f: the changes after
// its resume revision while the log still has them, else a snapshot.
func (f *feed) firstLocked(c *cursor) step {
	cur := f.cur
	f.view.Given(cur.Rev)
	// Everything after the revision, and the removals held back and
	// delivered at it after it was reported.
	entries, resume := f.view.After(c.from)
	c.staleGen = f.conn.staleGen
	f.mu.RUnlock()
	c.v.Store(cur)
	if resume {
		return step{batch: Batch{Kind: Changes, Events: view.Resume(entries, cur), Revision: cur.Rev}, ok: true}
	}
	return step{batch: Batch{Kind: Snapshot, Events: view.Snapshot(cur, nil), Revision: cur.Rev}, ok: true}
}

// changesLocked gives c the changes since old and read-unlocks f; nothing if
// the versions differ only in what c does not see (nor owes a Resync).
func (f *feed) changesLocked(c *cursor, old *view.Version) step {
	cur := f.cur
	// A Stale batch's Resync waits for the mark's end: changes applied
	// while the feed is still stale (its view may still miss others) are
	// delivered as Changes.
	backFromStale := c.needResync && f.conn.stale == nil
	entries, ok := f.view.Since(old.Seq)
	if !ok || len(entries) > 0 || backFromStale || cur.Relists != old.Relists {
		f.view.Given(cur.Rev) // a batch is (most likely) on its way
	}
	f.mu.RUnlock()
	var events []beacon.Event
	if ok {
		events = f.diffs.Events(old, cur, func() []beacon.Event { return view.DiffLog(old, cur, entries, nil) })
	} else {
		events = view.DiffTrees(old, cur, nil)
	}
	c.v.Store(cur)
	kind := Changes
	if cur.Relists != old.Relists || backFromStale {
		kind = Resync
	}
	if len(events) == 0 && !backFromStale {
		return step{}
	}
	if backFromStale {
		c.needResync = false
	}
	return step{batch: Batch{Kind: kind, Events: events, Revision: cur.Rev}, ok: true}
}

// fromProbe is appended to a watch's key prefix to read the store's
// revision: a key that cannot be an instance's ("~" is in no name), inside
// the prefix, so a user who may watch the prefix may read it.
const fromProbe = "~"

// checkFrom refuses a resume revision beyond the store's current one: a
// revision the store never gave (another store's, or a typo), which would
// otherwise be taken silently as a fresh watch. If the store cannot say
// (unreachable), the watch goes on as a fresh one.
func (f *feed) checkFrom(ctx context.Context, c *cursor) error {
	r := f.h.r
	rctx, cancel := r.opContext()
	defer cancel()
	stop := context.AfterFunc(ctx, cancel)
	defer stop()
	_, cur, err := r.st.List(rctx, f.prefix+fromProbe)
	if err == nil && c.from > cur {
		return fmt.Errorf("%w: watch from revision %d: the store is only at revision %d: resume from a revision "+
			"this store gave (or watch afresh, without one)", beacon.ErrInvalid, c.from, cur)
	}
	c.fromChecked = true
	return nil
}
