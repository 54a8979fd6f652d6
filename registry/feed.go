package registry

import (
	"context"
	"errors"
	"fmt"
	"slices"
	"sync"
	"time"

	"github.com/beaconplane/beacon"
	"github.com/beaconplane/beacon/store"
	"github.com/google/btree"
)

// The watch side. One feed per watched prefix holds the shared state: the
// current instances (a copy-on-write B-tree), the store revision they are
// at, and a bounded log of recent changes. One goroutine per feed lists the
// prefix, watches it from the listing's revision + 1, and re-lists after
// compaction or a broken watch. Watchers never receive pushed events: each
// keeps a pointer to the immutable version of the tree it last delivered and,
// when it asks for more, computes the difference to the current version —
// from the log when it still covers the gap, by walking both trees when it
// does not. A slow watcher therefore costs nothing while it is slow, never
// blocks the feed or other watchers, and always catches up to the latest
// state in one batch.

// btreeDegree is the B-tree degree of feed state.
const btreeDegree = 16

// minLogLen is the least number of changes a feed keeps for watchers to
// catch up from (it keeps at least as many as it has instances).
const minLogLen = 4096

// item is one instance in a feed. Items are immutable once in a tree.
type item struct {
	key    string
	inst   beacon.Instance
	create int64
	mod    int64
	lease  store.LeaseID // the key's lease (NoLease where unknown): a burst counts distinct leases
	ttl    time.Duration // the lease TTL its value declares (0: none): bounds a hold of its removal
}

func itemLess(a, b *item) bool { return a.key < b.key }

// change is one entry of a feed's log.
type change struct {
	seq    uint64
	rev    int64
	key    string
	before *item // nil: absent before the change
	after  *item // nil: absent after it
	// late: a held removal delivered at a revision watchers had already
	// been given, so that one resuming from that revision gets it too.
	late bool
}

// version is an immutable copy of a feed's state.
type version struct {
	tree    *btree.BTreeG[*item]
	seq     uint64
	rev     int64
	relists uint64
}

// maxLingering bounds the feeds that linger without a watcher. Each is a
// store watch the registry keeps open for nobody: without a bound, a
// client that opens and closes watches of ever new prefixes (one at a
// time, so that no cap on open watches stops it) would keep a store watch
// per prefix for WatchLinger — thousands a second. Past the bound the
// feed that has lingered longest stops at once.
const maxLingering = 64

// hub owns the feeds of one registry.
type hub struct {
	r       *StoreRegistry
	mu      sync.Mutex
	feeds   map[string]*feed
	lingerQ []*feed // feeds lingering without a watcher, oldest first
	closed  bool
	probing bool
}

func newHub(r *StoreRegistry) *hub {
	return &hub{r: r, feeds: make(map[string]*feed)}
}

// acquire returns the feed of q's prefix, starting it if needed.
func (h *hub) acquire(q beacon.Query) (*feed, error) {
	prefix := h.r.ks.Prefix(q)
	h.mu.Lock()
	defer h.mu.Unlock()
	if h.closed {
		return nil, ErrClosed
	}
	f := h.feeds[prefix]
	if f == nil {
		ctx, cancel := context.WithCancel(h.r.ctx)
		f = &feed{
			h:        h,
			prefix:   prefix,
			ctx:      ctx,
			cancel:   cancel,
			tree:     btree.NewG(btreeDegree, itemLess),
			wake:     make(chan struct{}),
			holds:    newHolds(h.r.cfg.RemovalHold),
			holdWake: make(chan struct{}, 1),
		}
		h.feeds[prefix] = f
		h.r.m.addWatchStreams(1)
		h.r.wg.Add(2)
		go f.run()
		go f.expire()
		if !h.probing {
			h.probing = true
			h.r.wg.Add(1)
			go h.probe()
		}
	}
	f.refs++
	h.unlingerLocked(f)
	return f, nil
}

// unlingerLocked stops f's linger period (it has a watcher again, or
// stops).
func (h *hub) unlingerLocked(f *feed) {
	if f.linger == nil {
		return
	}
	f.linger.Stop()
	f.linger = nil
	if i := slices.Index(h.lingerQ, f); i >= 0 {
		h.lingerQ = slices.Delete(h.lingerQ, i, i+1)
	}
}

// release drops one reference to f; the last one stops it after the
// linger period.
func (h *hub) release(f *feed) {
	h.mu.Lock()
	defer h.mu.Unlock()
	f.refs--
	if f.refs > 0 || h.closed || h.feeds[f.prefix] != f {
		return
	}
	if h.r.cfg.WatchLinger <= 0 || f.refused() {
		// A prefix the store refuses to the registry's user serves
		// nobody: it does not linger.
		h.stopLocked(f)
		return
	}
	f.linger = time.AfterFunc(h.r.cfg.WatchLinger, func() {
		h.mu.Lock()
		defer h.mu.Unlock()
		if f.refs == 0 && !h.closed && h.feeds[f.prefix] == f {
			h.stopLocked(f)
		}
	})
	h.lingerQ = append(h.lingerQ, f)
	for len(h.lingerQ) > maxLingering {
		h.stopLocked(h.lingerQ[0])
	}
}

func (h *hub) stopLocked(f *feed) {
	delete(h.feeds, f.prefix)
	h.r.m.addWatchStreams(-1)
	h.unlingerLocked(f)
	f.cancel()
}

// close stops every feed; watchers then get ErrClosed.
func (h *hub) close() {
	h.mu.Lock()
	defer h.mu.Unlock()
	h.closed = true
	for _, f := range h.feeds {
		h.stopLocked(f)
		f.fail(ErrClosed)
	}
}

// probe checks that the store answers, while any feed exists. A store
// watch stays silent while the store is unreachable (the etcd client
// reconnects on its own), so without this a feed could not tell "nothing
// changed" from "cannot know": on a failed probe every feed turns stale
// (its watchers get a Stale batch), and on the first success after that
// every feed re-lists, so that its watchers get a Resync batch with the
// difference.
func (h *hub) probe() {
	defer h.r.wg.Done()
	r := h.r
	interval := max(r.cfg.RetryMax, time.Second)
	key := r.ks.Prefix(beacon.Query{}) // never a key: the answer is "not found"
	t := time.NewTicker(interval)
	defer t.Stop()
	failing := false
	for {
		select {
		case <-r.ctx.Done():
			return
		case <-t.C:
		}
		feeds := h.list()
		if len(feeds) == 0 {
			continue
		}
		err := h.ping(key, interval)
		unreachable := errors.Is(err, store.ErrUnavailable) || errors.Is(err, context.DeadlineExceeded)
		if unreachable && r.ctx.Err() == nil {
			// Once more at once: one member of several may hang while the
			// others answer (the next call goes to another one).
			err = h.ping(key, interval)
			unreachable = errors.Is(err, store.ErrUnavailable) || errors.Is(err, context.DeadlineExceeded)
		}
		switch {
		case r.ctx.Err() != nil:
			return
		case !unreachable && refused(err) && h.refusedFeeds(r.ctx, feeds, interval):
			// The store answers but refuses this registry's user some
			// watched prefix (a revoked role, a changed password): those
			// watches are stale with the refusal, which consumers report
			// (never a silent stop); they re-list once it is lifted.
			failing = true
		case !unreachable:
			// Any answer, even an error such as permission denied on
			// the root (a user limited to some namespaces), means the
			// store is there.
			if failing {
				failing = false
				r.log.Info("store reachable again; re-listing watched prefixes", "watches", len(feeds))
				for _, f := range feeds {
					f.relist()
				}
			}
		default:
			if !failing {
				r.log.Warn("store unreachable: watches may be stale until it answers again", "err", err)
			}
			failing = true
			for _, f := range feeds {
				f.setOutage(fmt.Errorf("registry: store unreachable: %w", err))
			}
		}
	}
}

// ping reads a key that never exists, bounded by d: nil or an error that
// still proves the store answered (not found, permission denied) means it
// is reachable.
func (h *hub) ping(key string, d time.Duration) error {
	ctx, cancel := context.WithTimeout(h.r.ctx, d)
	defer cancel()
	_, err := h.r.st.Get(ctx, key)
	return err
}

// refused reports errors that retrying does not cure: the store refused
// the credentials or the permission.
func refused(err error) bool {
	return errors.Is(err, store.ErrPermissionDenied) || errors.Is(err, store.ErrUnauthenticated)
}

// refusedFeeds reads each feed's own prefix (the registry's root may be
// outside a limited user's range) and marks stale the feeds the store
// refuses; it reports whether any was.
func (h *hub) refusedFeeds(ctx context.Context, feeds []*feed, timeout time.Duration) bool {
	found := false
	for _, f := range feeds {
		fctx, cancel := context.WithTimeout(ctx, timeout)
		_, err := h.r.st.Get(fctx, f.prefix)
		cancel()
		if refused(err) {
			found = true
			f.setStale(fmt.Errorf("registry: watch %s: %w", f.prefix, err))
		}
	}
	return found
}

func (h *hub) list() []*feed {
	h.mu.Lock()
	defer h.mu.Unlock()
	out := make([]*feed, 0, len(h.feeds))
	for _, f := range h.feeds {
		out = append(out, f)
	}
	return out
}

// streams returns the number of shared store watches (for tests and
// benchmarks).
func (h *hub) streams() int {
	h.mu.Lock()
	defer h.mu.Unlock()
	return len(h.feeds)
}

// WatchStreams returns the number of store watches the registry holds: one
// per watched prefix, shared by all its watchers (plus those lingering).
func (r *StoreRegistry) WatchStreams() int { return r.hub.streams() }

// feed is the shared state of one watched prefix.
type feed struct {
	h      *hub
	prefix string
	ctx    context.Context
	cancel context.CancelFunc

	// Guarded by h.mu.
	refs   int
	linger *time.Timer

	mu       sync.Mutex
	tree     *btree.BTreeG[*item]
	rev      int64
	seq      uint64
	log      []change // changes floorSeq+1 .. seq
	floorSeq uint64   // every change after it is in log
	floorRev int64    // every change at a revision above it is in log
	snap     *version // cached version at (seq, rev)
	relists  uint64   // re-listings after the first listing
	synced   bool
	stale    error  // set while disconnected
	staleGen uint64 // counts disconnections
	err      error  // terminal
	wake     chan struct{}
	unfollow context.CancelFunc // ends the current store watch
	forced   bool               // unfollow was called by relist
	outage   bool               // stale because the store was unreachable (not just a silent stream)
	holds    *holds             // removals held back (hold.go)
	holdWake chan struct{}      // pokes expire
	reported int64              // highest revision a batch was given at
	burstSeq int64              // distinct burst keys of re-listed removals
}

// relist makes a stale feed drop its store watch and list again.
func (f *feed) relist() {
	f.mu.Lock()
	defer f.mu.Unlock()
	if f.stale != nil && f.unfollow != nil {
		f.forced = true
		f.unfollow()
	}
}

// notifyLocked wakes every watcher waiting for news.
func (f *feed) notifyLocked() {
	close(f.wake)
	f.wake = make(chan struct{})
}

// fail ends the feed for good (the registry or the store closed).
func (f *feed) fail(err error) {
	f.mu.Lock()
	defer f.mu.Unlock()
	if f.err == nil {
		f.err = err
		f.notifyLocked()
	}
}

// setOutage turns the feed stale because the store is unreachable.
// refused reports whether the store refuses the feed's prefix to the
// registry's user (its last list or watch failed with a permission or
// authentication error).
func (f *feed) refused() bool {
	f.mu.Lock()
	defer f.mu.Unlock()
	return f.stale != nil && (errors.Is(f.stale, store.ErrPermissionDenied) || errors.Is(f.stale, store.ErrUnauthenticated))
}

func (f *feed) setOutage(err error) {
	f.setStale(err)
	f.mu.Lock()
	f.outage = true
	f.mu.Unlock()
}

func (f *feed) setStale(err error) {
	f.mu.Lock()
	defer f.mu.Unlock()
	if f.stale == nil {
		f.staleGen++
	}
	f.stale = err
	f.notifyLocked()
}

// versionLocked returns an immutable copy of the current state.
func (f *feed) versionLocked() *version {
	if f.snap == nil || f.snap.seq != f.seq || f.snap.rev != f.rev || f.snap.relists != f.relists {
		f.snap = &version{tree: f.tree.Clone(), seq: f.seq, rev: f.rev, relists: f.relists}
	}
	return f.snap
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
			if !sleep(f.ctx, d) {
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
		forced := f.forced
		f.forced = false
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
	f.unfollow = cancel
	f.mu.Unlock()
	defer func() {
		f.mu.Lock()
		f.unfollow = nil
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
	return &item{key: kv.Key, inst: in, create: kv.CreateRevision, mod: kv.ModRevision, lease: kv.Lease, ttl: storedTTL(kv.Value)}
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
	if !f.synced {
		for _, it := range items {
			f.tree.ReplaceOrInsert(it)
		}
		f.rev, f.floorRev, f.synced = rev, rev, true
		f.stale = nil
		f.notifyLocked()
		return
	}
	if rev < f.rev {
		// Restored from a backup? Revisions before this listing mean
		// nothing any more: nobody can resume from them.
		f.h.r.log.Warn("store revision went backwards; watchers resuming from older revisions get a snapshot",
			"prefix", f.prefix, "was", f.rev, "now", rev)
		f.log, f.floorSeq, f.floorRev = nil, f.seq, rev
	}
	f.relists++
	now := time.Now()
	if f.outage {
		f.outage = false
		f.holds.cameBack(now)
	}
	fresh := make(map[string]*item, len(items))
	for _, it := range items {
		fresh[it.key] = it
	}
	var gone []*item
	f.tree.Ascend(func(old *item) bool {
		if fresh[old.key] == nil && !invalid[old.key] {
			gone = append(gone, old)
		}
		return true
	})
	for _, old := range gone {
		// Each happened at a revision of its own, unknown here: each
		// counts apart towards a burst.
		f.burstSeq++
		f.removeLocked(old, rev, -f.burstSeq, now)
	}
	for _, it := range items {
		f.rewrittenLocked(it.key)
		old, _ := f.tree.Get(it)
		if old != nil && old.mod == it.mod && old.create == it.create {
			continue // unchanged: keep the item watchers already hold
		}
		if old != nil && old.inst.Equal(it.inst) {
			f.tree.ReplaceOrInsert(it)
			continue // rewritten with the same value (e.g. re-registered)
		}
		f.tree.ReplaceOrInsert(it)
		f.appendLocked(change{rev: rev, key: it.key, before: old, after: it})
	}
	f.rev = rev
	f.stale = nil
	f.trimLocked()
	f.notifyLocked()
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
	last := f.rev
	i := 0
	for _, e := range evs {
		var it *item
		if e.Type == store.EventPut {
			it = parsed[i]
			i++
		}
		rev := e.Revision()
		if rev <= f.rev {
			continue // already in the state (a listing overtook the watch)
		}
		last = max(last, rev)
		switch e.Type {
		case store.EventPut:
			if it == nil {
				continue // not an instance: keep the last valid value, if any
			}
			f.rewrittenLocked(it.key)
			old, _ := f.tree.ReplaceOrInsert(it)
			if old != nil && old.inst.Equal(it.inst) {
				continue
			}
			f.appendLocked(change{rev: rev, key: it.key, before: old, after: it})
		case store.EventDelete:
			if old, ok := f.tree.Get(&item{key: e.KV.Key}); ok {
				f.removeLocked(old, rev, rev, now)
			}
		}
	}
	if last == f.rev {
		return
	}
	f.rev = last
	f.trimLocked()
	f.notifyLocked()
}

func (f *feed) appendLocked(c change) {
	f.seq++
	c.seq = f.seq
	f.log = append(f.log, c)
}

// trimLocked keeps the log at most twice its allowance, dropping the oldest
// half when it grows past that (amortised O(1) per change).
func (f *feed) trimLocked() {
	keep := max(minLogLen, f.tree.Len())
	if len(f.log) <= 2*keep {
		return
	}
	drop := len(f.log) - keep
	f.floorSeq = f.log[drop-1].seq
	f.floorRev = max(f.floorRev, f.log[drop-1].rev)
	f.log = slices.Clone(f.log[drop:])
}

// since returns the log entries after seq, or false if some were trimmed.
// The returned slice is never modified afterwards.
func (f *feed) sinceLocked(seq uint64) ([]change, bool) {
	if seq < f.floorSeq {
		return nil, false
	}
	i := int(seq - f.floorSeq)
	return f.log[i:len(f.log):len(f.log)], true
}
