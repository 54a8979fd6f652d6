package registry

import (
	"context"
	"errors"
	"fmt"
	"slices"
	"sync"
	"time"

	"github.com/beaconplane/beacon"
	"github.com/beaconplane/beacon/internal/wait"
	"github.com/beaconplane/beacon/store"
)

// maxLingering bounds the feeds that linger without a watcher. Each is a
// store watch the registry keeps open for nobody: without a bound, a
// client that opens and closes watches of ever new prefixes (one at a
// time, so that no cap on open watches stops it) would keep a store watch
// per prefix for WatchLinger — thousands a second. Past the bound the
// feed that has lingered longest stops at once.
const maxLingering = 64

// hub owns the feeds of one registry.
// Lock order: h.mu before any feed's mu.
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
	key := h.r.feedKey(q)
	h.mu.Lock()
	defer h.mu.Unlock()
	if h.closed {
		return nil, ErrClosed
	}
	f := h.feeds[key]
	if f == nil {
		ctx, cancel := context.WithCancel(h.r.ctx)
		f = newFeed(ctx, cancel, h, q)
		h.feeds[key] = f
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
	if f.refs > 0 || h.closed || h.feeds[f.key] != f {
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
		if f.refs == 0 && !h.closed && h.feeds[f.key] == f {
			h.stopLocked(f)
		}
	})
	h.lingerQ = append(h.lingerQ, f)
	for len(h.lingerQ) > maxLingering {
		h.stopLocked(h.lingerQ[0])
	}
}

func (h *hub) stopLocked(f *feed) {
	delete(h.feeds, f.key)
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
// changed" from "cannot know": on a failed probe every feed whose store
// watch delivered nothing while the probe waited turns stale (its
// watchers get a Stale batch). A feed whose watch delivered during the
// probe (events, or progress from a store.ProgressWatcher) is live
// whatever the probe's read met: a store too busy to answer one read in
// time still streams events, and re-listing every feed of a store past
// its capacity only adds to its load.
//
// A stale feed's mark ends when its watch delivers again (it resumed
// without a gap: feed.resumedLocked) or by a re-listing, which gives its
// watchers a Resync batch with the difference. Once the store answers
// again, feeds whose store promises progress (ProgressInterval) and whose
// watch still runs are given twice that interval to deliver before they
// re-list; the others re-list at once.
func (h *hub) probe() {
	defer h.r.wg.Done()
	r := h.r
	interval := max(r.cfg.RetryMax, time.Second)
	key := r.ks.Prefix(beacon.Query{}) // never a key: the answer is "not found"
	p := prober{h: h, awaiting: make(map[*feed]time.Time)}
	wait.Every(r.ctx, interval, func() {
		feeds := h.list()
		if len(feeds) == 0 {
			return
		}
		heard := make([]uint64, len(feeds))
		for i, f := range feeds {
			heard[i] = f.heard()
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
			p.failing = true
		case !unreachable:
			// Any answer, even an error such as permission denied on
			// the root (a user limited to some namespaces), means the
			// store is there.
			p.answered(feeds, time.Now())
		default:
			p.unanswered(feeds, heard, err)
		}
	})
}

// prober is the probe's state between its rounds.
type prober struct {
	h        *hub
	failing  bool                // the last round marked feeds stale
	awaiting map[*feed]time.Time // stale feeds given until then to deliver progress
}

// unanswered marks stale the feeds whose watch delivered nothing since
// heard (their counts before the probe's reads).
func (p *prober) unanswered(feeds []*feed, heard []uint64, err error) {
	stale := 0
	for i, f := range feeds {
		if f.setOutageUnlessHeard(heard[i], fmt.Errorf("registry: store unreachable: %w", err)) {
			stale++
		}
	}
	if !p.failing {
		p.h.r.log.Warn("store unreachable: watches that hear nothing from it are stale until it answers again",
			"err", err, "stale", stale, "live", len(feeds)-stale)
	}
	p.failing = true
}

// answered ends what the store's return ends: after failing rounds, a
// stale feed re-lists, unless its watch runs and the store promises it
// will report progress soon; one still stale when its time is up
// re-lists then.
func (p *prober) answered(feeds []*feed, now time.Time) {
	r := p.h.r
	if p.failing {
		p.failing = false
		relisted, awaiting := 0, 0
		for _, f := range feeds {
			f.storeBack(now)
			switch {
			case r.progress != nil && f.awaitsProgress():
				p.awaiting[f] = now.Add(2 * r.progress.ProgressInterval())
				awaiting++
			case f.relist():
				relisted++
			}
		}
		r.log.Info("store reachable again; re-listing the stale watched prefixes",
			"relisted", relisted, "awaiting_progress", awaiting, "watches", len(feeds))
	}
	for f, until := range p.awaiting {
		switch {
		case f.ctx.Err() != nil || !f.isStale(): // stopped, or it delivered
			delete(p.awaiting, f)
		case now.After(until):
			delete(p.awaiting, f)
			if f.relist() {
				r.log.Warn("watch reported no progress after the store came back; re-listing", "prefix", f.prefix)
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
