package kube

import (
	"sync/atomic"

	"github.com/beaconplane/beacon"
	"github.com/beaconplane/beacon/registry"
	shared "github.com/beaconplane/beacon/registry/internal/view"
)

// cursor is one watcher's position in the view: the version it delivered
// last and what it was told. The watcher owns it (one Next at a time);
// the view moves it (next).
type cursor struct {
	q beacon.Query // what the watcher selects

	last       atomic.Pointer[shared.Version] // last delivered; nil before the first batch
	staleGen   uint64                         // last disconnection reported
	needResync bool                           // a Stale batch awaits its Resync
}

func (c *cursor) matches(it *item) bool { return c.q.Matches(it.Inst.Ref()) }

// step is what next decided: a batch to return, or a channel to wait on
// before asking again (nil: ask again at once), or the end of the watch.
type step struct {
	batch registry.Batch
	ok    bool
	wake  <-chan struct{}
	err   error
}

// next moves c on: a snapshot first, a Stale batch once per
// disconnection, the changes since c's version (a Resync after a
// re-listing round or a Stale batch, once the round is published), or
// nothing new yet.
func (v *view) next(c *cursor) step {
	v.mu.Lock()
	if err := v.wake.Err(); err != nil {
		v.mu.Unlock()
		return step{err: err}
	}
	old := c.last.Load()
	switch {
	case old == nil && v.synced:
		cur := v.state.Version()
		c.staleGen = v.staleGen
		v.mu.Unlock()
		c.last.Store(cur)
		return step{batch: registry.Batch{Kind: registry.Snapshot, Events: shared.Snapshot(cur, c.matches), Revision: cur.Rev}, ok: true}
	case v.stale != nil && c.staleGen != v.staleGen:
		c.staleGen = v.staleGen
		b := registry.Batch{Kind: registry.Stale, Err: v.stale}
		if old != nil {
			c.needResync = true
			b.Revision = old.Rev
		}
		v.mu.Unlock()
		return step{batch: b, ok: true}
	case old != nil && (v.state.Seq() != old.Seq || v.state.Relists() != old.Relists ||
		(c.needResync && v.stale == nil && v.held == nil)):
		return v.changesLocked(c, old)
	}
	wake := v.wake.C()
	v.mu.Unlock()
	return step{wake: wake}
}

// changesLocked gives c the changes since old and unlocks v; nothing if
// the versions differ only in what c does not select (nor owes a Resync).
func (v *view) changesLocked(c *cursor, old *shared.Version) step {
	cur := v.state.Version()
	entries, ok := v.state.Since(old.Seq)
	v.mu.Unlock()
	var events []beacon.Event
	if ok {
		events = shared.DiffLog(old, cur, entries, c.matches)
	} else {
		events = shared.DiffTrees(old, cur, c.matches)
	}
	c.last.Store(cur)
	kind := registry.Changes
	if cur.Relists != old.Relists || c.needResync {
		kind = registry.Resync
	}
	if len(events) == 0 && !c.needResync {
		return step{}
	}
	c.needResync = false
	return step{batch: registry.Batch{Kind: kind, Events: events, Revision: cur.Rev}, ok: true}
}
