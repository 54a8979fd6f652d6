package registry

import (
	"context"
	"errors"
	"fmt"
	"sync"
	"time"

	"github.com/beaconplane/beacon/internal/wait"
	"github.com/beaconplane/beacon/registry/internal/view"
	"github.com/beaconplane/beacon/store"
)

// The watch side. One feed per watched prefix holds the shared state: the
// current instances, the store revision they are at and a bounded log of
// recent changes (a view.View). One goroutine per feed lists the prefix,
// watches it from the listing's revision + 1, and re-lists after
// compaction or a broken watch. Watchers never receive pushed events: each
// keeps a cursor on the immutable version it last delivered and, when it
// asks for more, gets the difference to the current version (next). A
// slow watcher therefore costs nothing while it is slow, never blocks the
// feed or other watchers, and always catches up to the latest state in
// one batch.

// item is one instance in a feed.
type item = view.Item

// feed is the shared state of one watched prefix. Its mu guards four
// parts, each a type of its own: the view (instances, their log and
// versions), the connection to the store (conn), the removal hold (holds,
// hold.go) and the lifecycle (wake: news and the terminal error).
type feed struct {
	h      *hub
	prefix string
	ctx    context.Context
	cancel context.CancelFunc

	// Guarded by h.mu.
	refs   int
	linger *time.Timer

	mu       sync.Mutex
	view     *view.View
	conn     conn
	holds    *holds
	wake     view.Wake
	holdWake chan struct{} // pokes expire (not guarded: a buffered channel)
}

func newFeed(ctx context.Context, cancel context.CancelFunc, h *hub, prefix string) *feed {
	return &feed{h: h, prefix: prefix, ctx: ctx, cancel: cancel, view: view.New(),
		holds: newHolds(h.r.cfg.RemovalHold), holdWake: make(chan struct{}, 1)}
}

// conn is a feed's connection to the store: whether it has listed,
// whether (and why) its view may be out of date, and its store watch.
type conn struct {
	synced   bool
	stale    error              // set while disconnected
	staleGen uint64             // counts disconnections
	outage   bool               // stale because the store was unreachable (not just a silent stream)
	unfollow context.CancelFunc // ends the current store watch
	forced   bool               // unfollow was called by relist
}

// setStale marks the view out of date with err (a new disconnection
// unless it already was).
func (c *conn) setStale(err error) {
	if c.stale == nil {
		c.staleGen++
	}
	c.stale = err
}

// refused reports whether the store refuses the prefix to the registry's
// user (the last list or watch failed with a permission or authentication
// error).
func (c *conn) refused() bool {
	return c.stale != nil && (errors.Is(c.stale, store.ErrPermissionDenied) || errors.Is(c.stale, store.ErrUnauthenticated))
}

// relist makes a stale feed drop its store watch and list again.
func (f *feed) relist() {
	f.mu.Lock()
	defer f.mu.Unlock()
	if f.conn.stale != nil && f.conn.unfollow != nil {
		f.conn.forced = true
		f.conn.unfollow()
	}
}

// fail ends the feed for good (the registry or the store closed).
func (f *feed) fail(err error) {
	f.mu.Lock()
	defer f.mu.Unlock()
	f.wake.Fail(err)
}

// refused reports whether the store refuses the feed's prefix to the
// registry's user.
func (f *feed) refused() bool {
	f.mu.Lock()
	defer f.mu.Unlock()
	return f.conn.refused()
}

// setOutage turns the feed stale because the store is unreachable.
func (f *feed) setOutage(err error) { f.markStale(err, true) }

// setStale turns the feed stale: its view may have missed changes.
func (f *feed) setStale(err error) { f.markStale(err, false) }

func (f *feed) markStale(err error, outage bool) {
	f.mu.Lock()
	defer f.mu.Unlock()
	f.conn.setStale(err)
	f.conn.outage = f.conn.outage || outage
	f.wake.Notify()
}

// run lists, watches and re-lists until the feed is stopped.
func (f *feed) run() {
	defer f.h.r.wg.Done()
	r := f.h.r
	log := r.log.With("prefix", f.prefix)
	bo := newBackoff(r.cfg.RetryMax)
	for f.ctx.Err() == nil {
		kvs, rev, err := r.st.List(f.ctx, f.prefix)
		if err != nil {
			if f.ctx.Err() != nil {
				return
			}
			if errors.Is(err, store.ErrClosed) {
				f.fail(fmt.Errorf("registry: watch %s: %w", f.prefix, err))
				return
			}
			f.setOutage(fmt.Errorf("registry: watch %s: list: %w", f.prefix, err))
			d := bo.next()
			log.Warn("watch cannot list; retrying", "err", err, "retry_in", d)
			if !wait.Sleep(f.ctx, d) {
				return
			}
			continue
		}
		f.applyListing(kvs, rev)
		bo.reset()

		err = f.follow(rev + 1)
		if f.ctx.Err() != nil {
			return
		}
		f.mu.Lock()
		forced := f.conn.forced
		f.conn.forced = false
		f.mu.Unlock()
		switch {
		case forced:
			r.m.resync("reconnect")
		case errors.Is(err, store.ErrWatchSilent):
			// The view may have missed changes for as long as the stream
			// was silent: say so until the listing below replaces it.
			r.m.resync("silent")
			f.setStale(fmt.Errorf("registry: watch %s: %w", f.prefix, err))
			log.Warn("watch stream silent (its store server hangs or is cut off); re-listing", "err", err)
		case errors.Is(err, store.ErrCompacted):
			r.m.resync("compacted")
			log.Info("watch fell behind compaction; re-listing", "err", err)
		case errors.Is(err, store.ErrClosed):
			f.fail(fmt.Errorf("registry: watch %s: %w", f.prefix, err))
			return
		default:
			r.m.resync("error")
			log.Warn("watch broke; re-listing", "err", err)
		}
	}
}

var errWatchEnded = errors.New("store watch ended")

// follow applies the store's watch from rev until it fails.
func (f *feed) follow(rev int64) error {
	ctx, cancel := context.WithCancel(f.ctx)
	defer cancel()
	f.mu.Lock()
	f.conn.unfollow = cancel
	f.mu.Unlock()
	defer func() {
		f.mu.Lock()
		f.conn.unfollow = nil
		f.mu.Unlock()
	}()
	ch := f.h.r.st.Watch(ctx, f.prefix, rev)
	for {
		select {
		case resp, ok := <-ch:
			if !ok {
				return errWatchEnded
			}
			if resp.Err != nil {
				return resp.Err
			}
			f.applyEvents(resp.Events)
		case <-ctx.Done():
			return ctx.Err()
		}
	}
}

// parse turns a stored key/value into an item, or nil if it is not a valid
// instance.
func (f *feed) parse(kv store.KeyValue) *item {
	in, err := f.h.r.decode(kv)
	if err != nil {
		f.h.r.invalidValue(kv.Key, err)
		return nil
	}
	return &item{Key: kv.Key, Inst: in, Create: kv.CreateRevision, Rev: kv.ModRevision, Lease: kv.Lease, TTL: storedTTL(kv.Value)}
}

// applyListing replaces the state with a listing at rev. After the first
// listing, every difference is logged as a change at rev. A key whose
// value is not a valid instance keeps its last valid instance, as it does
// when the garbage arrives through the watch: a re-list never turns it
// into a removal.
func (f *feed) applyListing(kvs []store.KeyValue, rev int64) {
	items := make([]*item, 0, len(kvs))
	var invalid map[string]bool // listed keys whose values are not instances
	for _, kv := range kvs {
		if it := f.parse(kv); it != nil {
			items = append(items, it)
		} else {
			if invalid == nil {
				invalid = make(map[string]bool)
			}
			invalid[kv.Key] = true
		}
	}
	f.mu.Lock()
	defer f.mu.Unlock()
	defer f.wake.Notify()
	if !f.conn.synced {
		f.view.Load(items, rev)
		f.conn.synced, f.conn.stale = true, nil
		return
	}
	if rev < f.view.Rev() {
		// Restored from a backup? Revisions before this listing mean
		// nothing any more: nobody can resume from them.
		f.h.r.log.Warn("store revision went backwards; watchers resuming from older revisions get a snapshot",
			"prefix", f.prefix, "was", f.view.Rev(), "now", rev)
		f.view.Rebase(rev)
	}
	f.view.Relisted()
	now := time.Now()
	if f.conn.outage {
		f.conn.outage = false
		f.holds.cameBack(now)
	}
	f.relistLocked(items, invalid, rev, now)
	f.view.SetRev(rev)
	f.conn.stale = nil
	f.view.Trim()
}

// relistLocked logs the difference between the view and a re-listing at
// rev (invalid: listed keys that hold no instance).
func (f *feed) relistLocked(items []*item, invalid map[string]bool, rev int64, now time.Time) {
	fresh := make(map[string]*item, len(items))
	for _, it := range items {
		fresh[it.Key] = it
	}
	var gone []*item
	f.view.Ascend(func(old *item) bool {
		if fresh[old.Key] == nil && !invalid[old.Key] {
			gone = append(gone, old)
		}
		return true
	})
	for _, old := range gone {
		// Each happened at a revision of its own, unknown here: each
		// counts apart towards a burst.
		f.removeLocked(old, rev, f.holds.listingID(), now)
	}
	for _, it := range items {
		f.rewrittenLocked(it.Key)
		old, _ := f.view.Get(it.Key)
		if old != nil && old.Rev == it.Rev && old.Create == it.Create {
			continue // unchanged: keep the item watchers already hold
		}
		f.view.Set(it, rev) // logged unless rewritten with the same value (e.g. re-registered)
	}
}

// applyEvents applies one watch response.
func (f *feed) applyEvents(evs []store.Event) {
	if len(evs) == 0 {
		return
	}
	var parsed []*item
	for _, e := range evs {
		if e.Type == store.EventPut {
			parsed = append(parsed, f.parse(e.KV))
		}
	}
	f.mu.Lock()
	defer f.mu.Unlock()
	now := time.Now()
	last := f.view.Rev()
	i := 0
	for _, e := range evs {
		var it *item
		if e.Type == store.EventPut {
			it = parsed[i]
			i++
		}
		rev := e.Revision()
		if rev <= f.view.Rev() {
			continue // already in the state (a listing overtook the watch)
		}
		last = max(last, rev)
		switch e.Type {
		case store.EventPut:
			if it == nil {
				continue // not an instance: keep the last valid value, if any
			}
			f.rewrittenLocked(it.Key)
			f.view.Set(it, rev)
		case store.EventDelete:
			if old, ok := f.view.Get(e.KV.Key); ok {
				f.removeLocked(old, rev, rev, now)
			}
		}
	}
	if last == f.view.Rev() {
		return
	}
	f.view.SetRev(last)
	f.view.Trim()
	f.wake.Notify()
}
