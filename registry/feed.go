package registry

import (
	"context"
	"errors"
	"fmt"
	"log/slog"
	"sync"
	"time"

	"github.com/beaconplane/beacon"
	"github.com/beaconplane/beacon/internal/wait"
	"github.com/beaconplane/beacon/registry/internal/healthjoin"
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

// feed is the shared state of one watched prefix. Its mu guards five
// parts, each a type of its own: the view (instances, their log and
// versions), the connection to the store (conn), the removal hold (holds,
// hold.go), the health join (health, healthjoin.Join: verdicts and panic) and
// the lifecycle (wake: news and the terminal error).
// Watchers take mu for reading (next: they move on together after each
// change), everything else for writing, unlocking through unlock.
// Lock order: hub.mu before feed.mu before healthBoard.mu.
type feed struct {
	h      *hub
	prefix string // the store prefix it lists and watches
	key    string // its key in the hub (the prefix, but in the dynamo layout)
	ctx    context.Context
	cancel context.CancelFunc

	// Guarded by h.mu.
	refs   int
	linger *time.Timer

	mu       sync.RWMutex
	view     *view.View
	cur      *view.Version // the view's version as the last writer left it: what watchers are served
	conn     conn
	holds    *holds
	health   *healthjoin.Join
	wake     view.Wake
	dyn      *dynView      // the dynamo layout's catalog of the query's entries (nil in Beacon's)
	holdWake chan struct{} // pokes expire (not guarded: a buffered channel)
	// diffs shares one diff among the watchers that move between the same
	// two versions (not guarded: it synchronizes itself, taking no lock).
	diffs view.Memo
}

func newFeed(ctx context.Context, cancel context.CancelFunc, h *hub, q beacon.Query) *feed {
	f := &feed{h: h, prefix: h.r.ReadPrefix(q), key: h.r.feedKey(q), ctx: ctx, cancel: cancel, view: view.New(),
		holds: newHolds(h.r.cfg.RemovalHold), health: healthjoin.New(h.r.cfg.HealthPanicThreshold),
		holdWake: make(chan struct{}, 1)}
	if h.r.dynamo() {
		f.dyn = newDynView(q, h.r.dynBad)
	}
	f.cur = f.view.Version()
	f.wake.C() // made before any reader: readers take it under the read lock
	return f
}

// unlock ends a writer's hold of f.mu, leaving the view's current version
// for readers: they serve f.cur under the read lock, where making a
// version (which marks the tree copy-on-write) would be a write.
func (f *feed) unlock() {
	f.cur = f.view.Version()
	f.mu.Unlock()
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
	heard    uint64             // watch responses received: the probe's evidence that the watch is live
	// resumable says the stale mark has no cause but a store that did not
	// answer (setSilent, setOutage; never setStale since): the store
	// watch's next response may end it (resumedLocked).
	resumable bool
}

// mark makes the view out of date with err (a new disconnection unless it
// already was).
func (c *conn) mark(err error) {
	if c.stale == nil {
		c.staleGen++
	}
	c.stale = err
}

// setStale marks the view out of date with err: only a listing ends the
// mark.
func (c *conn) setStale(err error) {
	c.mark(err)
	c.resumable = false
}

// setSilent marks the view out of date because the store watch heard
// nothing: a listing ends the mark, or, if nothing else marked it since,
// the store watch's next response.
func (c *conn) setSilent(err error) {
	resumable := c.stale == nil || c.resumable
	c.mark(err)
	c.resumable = resumable
}

// setOutage is setSilent for a store that did not answer at all: besides,
// removals just after it answers again are judged as after an outage
// (holds.cameBack), when etcd may end leases its registrants could not
// renew. A silent watch alone (one member hung, the others answering the
// registrants) is not that.
func (c *conn) setOutage(err error) {
	c.setSilent(err)
	c.outage = true
}

// refused reports whether the store refuses the prefix to the registry's
// user (the last list or watch failed with a permission or authentication
// error).
func (c *conn) refused() bool {
	return c.stale != nil && (errors.Is(c.stale, store.ErrPermissionDenied) || errors.Is(c.stale, store.ErrUnauthenticated))
}

// relist makes a stale feed drop its store watch and list again; it
// reports whether the feed was stale.
func (f *feed) relist() bool {
	f.mu.Lock()
	defer f.unlock()
	if f.conn.stale != nil && f.conn.unfollow != nil {
		f.conn.forced = true
		f.conn.unfollow()
	}
	return f.conn.stale != nil
}

// fail ends the feed for good (the registry or the store closed).
func (f *feed) fail(err error) {
	f.mu.Lock()
	defer f.unlock()
	f.wake.Fail(err)
}

// refused reports whether the store refuses the feed's prefix to the
// registry's user.
func (f *feed) refused() bool {
	f.mu.RLock()
	defer f.mu.RUnlock()
	return f.conn.refused()
}

// setOutage turns the feed stale because the store is unreachable.
func (f *feed) setOutage(err error) {
	f.mu.Lock()
	defer f.unlock()
	f.conn.setOutage(err)
	f.wake.Notify()
}

// heard returns how many responses the feed's store watches delivered.
func (f *feed) heard() uint64 {
	f.mu.RLock()
	defer f.mu.RUnlock()
	return f.conn.heard
}

// awaitsProgress reports whether the feed is stale only because the store
// was unreachable and its store watch still runs: the watch's next
// response ends the mark, without a re-listing.
func (f *feed) awaitsProgress() bool {
	f.mu.RLock()
	defer f.mu.RUnlock()
	return f.conn.stale != nil && f.conn.resumable && f.conn.unfollow != nil
}

// storeBack notes that the store answers again after an outage (the
// hub's probe found it so): removals from now on are judged as after one
// (holds.cameBack), from the store's return rather than from whatever
// ends the stale mark later — the watch's first delivery may be the
// first lease expiry itself.
func (f *feed) storeBack(now time.Time) {
	f.mu.Lock()
	defer f.unlock()
	if f.conn.outage {
		f.conn.outage = false
		f.holds.cameBack(now)
	}
}

// isStale reports whether the feed's view may be out of date.
func (f *feed) isStale() bool {
	f.mu.RLock()
	defer f.mu.RUnlock()
	return f.conn.stale != nil
}

// setOutageUnlessHeard turns the feed stale because the store did not
// answer the hub's probe, unless its store watch delivered since heard
// (the feed's heard() before the probe): a watch that delivers while the
// store is too busy to answer a read in time (a cluster past its
// capacity), or while the probe's read went to a hung member, is live and
// its view complete. It reports whether the feed was marked.
func (f *feed) setOutageUnlessHeard(heard uint64, err error) bool {
	f.mu.Lock()
	defer f.unlock()
	if f.conn.heard != heard {
		return false
	}
	f.conn.setOutage(err)
	f.wake.Notify()
	return true
}

// setStale turns the feed stale: its view may have missed changes.
func (f *feed) setStale(err error) {
	f.mu.Lock()
	defer f.unlock()
	f.conn.setStale(err)
	f.wake.Notify()
}

// maxFeedLists bounds the listings a registry's feeds make at once. A
// store watch stream that goes silent (a member hung, or too busy to
// answer) ends every feed on it together, and each re-lists: with 2,000
// watched prefixes per registry on a cluster already past its capacity,
// 2,000 listings at once all missed their deadline and were retried,
// 18,000 failures in two minutes, and the cluster did not recover before
// the benchmark gave up (issue 26, beacon bench cluster at 200,000
// instances). Queued, each listing gets the store to itself long enough
// to finish; a listing hung on a member holds one slot until its
// deadline.
const maxFeedLists = 16

// listFeed lists prefix for a feed, at most maxFeedLists at once; its
// deadline (the store's) starts once it has a slot.
func (r *StoreRegistry) listFeed(ctx context.Context, prefix string) ([]store.KeyValue, int64, error) {
	select {
	case r.lists <- struct{}{}:
	case <-ctx.Done():
		return nil, 0, ctx.Err()
	}
	defer func() { <-r.lists }()
	return r.st.List(ctx, prefix)
}

// run lists, watches and re-lists until the feed is stopped.
func (f *feed) run() {
	defer f.h.r.wg.Done()
	defer f.endHealth()
	r := f.h.r
	log := r.log.With("prefix", f.prefix)
	bo := newBackoff(r.cfg.RetryMax)
	for f.ctx.Err() == nil {
		kvs, rev, err := r.listFeed(f.ctx, f.prefix)
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

		err = f.followResuming(rev+1, log)
		if f.ctx.Err() != nil {
			return
		}
		f.mu.Lock()
		forced := f.conn.forced
		f.conn.forced = false
		f.unlock()
		switch {
		case forced:
			r.m.resync("reconnect")
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

// followResuming follows the store's watch from rev, and returns the
// error that calls for a listing. A watch that ends silent (its server
// hangs, is cut off, or is too busy to answer) is opened again from the
// revision after the last one the view applied, which loses nothing (a
// watch may start at any revision not compacted; a compacted one ends
// with ErrCompacted, and the prefix is listed), instead of the prefix
// being listed again: on a cluster too busy to answer, thousands of
// watched prefixes listed again made it busier (3,362 listings in one
// beacon bench cluster run at 200,000 instances). From the silence until
// the new watch delivers (an event, or progress: resumedLocked) the feed
// is stale, as it is when the store is unreachable.
func (f *feed) followResuming(rev int64, log *slog.Logger) error {
	for {
		err := f.follow(rev)
		if !errors.Is(err, store.ErrWatchSilent) || f.ctx.Err() != nil {
			return err
		}
		f.h.r.m.resync("silent")
		f.mu.Lock()
		f.conn.setSilent(fmt.Errorf("registry: watch %s: %w", f.prefix, err))
		f.wake.Notify()
		rev = f.view.Rev() + 1
		f.unlock()
		log.Warn("watch stream silent (its store server hangs or is cut off); watching again from the revision after the last one delivered",
			"err", err, "from", rev)
	}
}

// follow applies the store's watch from rev until it fails.
func (f *feed) follow(rev int64) error {
	ctx, cancel := context.WithCancel(f.ctx)
	defer cancel()
	f.mu.Lock()
	f.conn.unfollow = cancel
	f.unlock()
	defer func() {
		f.mu.Lock()
		f.conn.unfollow = nil
		f.unlock()
	}()
	var ch store.WatchChan
	if pw := f.h.r.progress; pw != nil {
		ch = pw.WatchProgress(ctx, f.prefix, rev) // progress ends an outage mark on a quiet prefix
	} else {
		ch = f.h.r.st.Watch(ctx, f.prefix, rev)
	}
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

// applyListing replaces the state with a listing at rev. After the first
// listing, every difference is logged as a change at rev. A key whose
// value is not a valid instance keeps its last valid instance, as it does
// when the garbage arrives through the watch: a re-list never turns it
// into a removal. Verdicts are reconciled as instances are.
func (f *feed) applyListing(kvs []store.KeyValue, rev int64) {
	l := f.h.r.readListing(kvs)
	f.mu.Lock()
	defer f.unlock()
	defer f.wake.Notify()
	if f.dyn != nil {
		f.dyn.replace(l.dyn)
		l.items = f.dyn.items()
	}
	if !f.conn.synced {
		f.health.ReplaceVerdicts(l.verdicts)
		f.reportPanics(f.health.JoinAll(l.items))
		f.view.Load(l.items, rev)
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
	f.relistLocked(l, rev, now)
	f.view.SetRev(rev)
	f.conn.stale = nil
	f.view.Trim()
}

// relistLocked logs the difference between the view and a re-listing at
// rev.
func (f *feed) relistLocked(l listing, rev int64, now time.Time) {
	fresh := make(map[string]*item, len(l.items))
	for _, it := range l.items {
		fresh[it.Key] = it
	}
	var gone []*item
	f.view.Ascend(func(old *item) bool {
		if fresh[old.Key] == nil && !l.invalid[old.Key] {
			gone = append(gone, old)
		}
		return true
	})
	for _, old := range gone {
		// Each happened at a revision of its own, unknown here: each
		// counts apart towards a burst.
		f.removeLocked(old, rev, f.holds.listingID(), now)
	}
	changed := f.health.ReplaceVerdicts(l.verdicts)
	for _, it := range l.items {
		f.rewrittenLocked(it.Key)
		it.Inst.Health = f.health.Health(it.Key, it.Inst)
		old, _ := f.view.Get(it.Key)
		if old != nil && old.Mod == it.Mod && old.Create == it.Create && old.Inst.Equal(it.Inst) {
			continue // unchanged: keep the item watchers already hold
		}
		f.putLocked(it, rev) // logged unless rewritten with the same value (e.g. re-registered)
	}
	for _, key := range changed {
		if fresh[key] == nil {
			f.rejoinLocked(key, rev, false) // a held removal, or a value that is not an instance
		}
	}
	f.settleLocked(rev, false)
}

// applyEvents applies one watch response (none: a progress notification,
// which still proves the watch live).
func (f *feed) applyEvents(evs []store.Event) {

	read := make([]entry, len(evs))
	for i, e := range evs {
		read[i] = f.h.r.readKV(e.KV, e.Type == store.EventPut)
	}
	f.mu.Lock()
	defer f.unlock()
	now := time.Now()
	f.conn.heard++
	f.resumedLocked(now)
	last := f.view.Rev()
	for i, e := range evs {
		rev := e.Revision()
		if rev <= f.view.Rev() {
			continue // already in the state (a listing overtook the watch)
		}
		last = max(last, rev)
		f.applyLocked(e.Type, read[i], rev, now)
	}
	if last == f.view.Rev() {
		return
	}
	f.settleLocked(last, false)
	f.view.SetRev(last)
	f.view.Trim()
	f.wake.Notify()
}

// resumedLocked ends a stale mark that only a store that did not answer
// set (setSilent, setOutage), now that the store watch delivers again.
// Every store watch starts at the revision after the feed's last listing
// or the last revision it applied, and resumes without a gap after an
// outage (store.Watcher's contract), so a watch that delivers is live and
// the view missed nothing: no re-listing is needed. The watchers get a
// Resync (their Stale batch's end); after an outage, removals that follow
// are judged as after one (holds.cameBack).
func (f *feed) resumedLocked(now time.Time) {
	if f.conn.stale == nil || !f.conn.resumable {
		return
	}
	if f.conn.outage {
		f.holds.cameBack(now)
	}
	f.conn.stale, f.conn.outage, f.conn.resumable = nil, false, false
	f.wake.Notify()
}

// applyLocked applies one event at rev, read as e.
func (f *feed) applyLocked(typ store.EventType, e entry, rev int64, now time.Time) {
	switch {
	case e.kind == dynamoKey:
		f.applyDynamoLocked(typ == store.EventPut, e.dyn, rev, now)
	case e.kind == reportKey:
		// The checker's to read.
	case e.kind == verdictKey:
		var changed bool
		if e.verdict != nil {
			changed = f.health.SetVerdict(e.key, *e.verdict)
		} else {
			changed = f.health.DeleteVerdict(e.key) // deleted, or malformed: no verdict
		}
		if changed {
			f.rejoinLocked(e.key, rev, false)
		}
	case typ == store.EventPut:
		if e.it == nil {
			return // not an instance: keep the last valid value, if any
		}
		f.rewrittenLocked(e.it.Key)
		f.putLocked(e.it, rev)
	default:
		if old, ok := f.view.Get(e.key); ok {
			f.removeLocked(old, rev, rev, now)
		}
	}
}

// putLocked installs it, joined with its verdict, at rev.
func (f *feed) putLocked(it *item, rev int64) {
	it.Inst.Health = f.health.Health(it.Key, it.Inst)
	old, _ := f.view.Set(it, rev)
	f.health.Count(it.Key, instanceOf(old), &it.Inst)
}

// deleteLocked removes it at rev if the view holds it.
func (f *feed) deleteLocked(it *item, rev int64) {
	if f.view.Delete(it, rev) {
		f.health.Count(it.Key, &it.Inst, nil)
	}
}

// rejoinLocked joins the instance at key with its verdict again (the
// verdict, or its level's panic, changed): its item is replaced at rev,
// or, late, at the view's revision outside any store event (view.Amend).
func (f *feed) rejoinLocked(key string, rev int64, late bool) {
	cur, ok := f.view.Get(key)
	if !ok {
		return // kept aside until the instance appears
	}
	next := *cur
	next.Inst = cur.Inst.Clone()
	next.Inst.Health = f.health.Health(key, cur.Inst)
	if next.Inst.Equal(cur.Inst) {
		return
	}
	if late {
		next.Rev = f.view.Rev()
		f.view.Amend(&next)
	} else {
		next.Rev = rev
		f.view.Set(&next, rev)
	}
	f.holds.replaced(cur, &next)
	f.health.Count(key, &cur.Inst, &next.Inst)
}

// settleLocked settles the services whose counts changed: the priority
// levels that entered or left panic are reported, and their failing
// instances joined again (at rev, or late: see rejoinLocked).
func (f *feed) settleLocked(rev int64, late bool) {
	changes := f.health.Settle()
	f.reportPanics(changes)
	for _, c := range changes {
		for _, key := range c.Keys {
			f.rejoinLocked(key, rev, late)
		}
	}
}

func (f *feed) reportPanics(changes []healthjoin.PanicChange) {
	for _, c := range changes {
		f.h.r.health.Report(c)
	}
}

// endHealth takes the feed's services out of the registry's panic count:
// the feed stops.
func (f *feed) endHealth() {
	f.mu.Lock()
	defer f.unlock()
	f.reportPanics(f.health.Close())
}

func instanceOf(it *item) *beacon.Instance {
	if it == nil {
		return nil
	}
	return &it.Inst
}
