package registry

import (
	"cmp"
	"context"
	"errors"
	"fmt"
	"slices"
	"sort"
	"sync"
	"sync/atomic"

	"github.com/beaconplane/beacon"
)

// Watch implements Discoverer. Watchers of the same query in one registry
// share one store watch.
func (r *StoreRegistry) Watch(ctx context.Context, q beacon.Query, opts ...WatchOption) (Watcher, error) {
	if err := q.Validate(); err != nil {
		return nil, err
	}
	var o watchOptions
	for _, opt := range opts {
		opt(&o)
	}
	if o.fromRevision < 0 {
		return nil, fmt.Errorf("%w: watch from revision %d: revisions are positive", beacon.ErrInvalid, o.fromRevision)
	}
	if err := ctx.Err(); err != nil {
		return nil, err
	}
	if r.closed.Load() {
		return nil, ErrClosed
	}
	f, err := r.hub.acquire(q)
	if err != nil {
		return nil, err
	}
	w := &watcher{r: r, f: f, from: o.fromRevision, done: make(chan struct{})}
	r.m.addWatchers(1)
	// The callback must not read w.stop: it is written after AfterFunc
	// returns, with no ordering against the callback.
	w.stop = context.AfterFunc(ctx, w.end)
	return w, nil
}

// watcher is one consumer of a feed.
type watcher struct {
	r    *StoreRegistry
	f    *feed
	from int64

	fromChecked bool // from was found not beyond the store's revision

	v          atomic.Pointer[version] // last delivered; nil before the first batch
	staleGen   uint64                  // last disconnection reported
	needResync bool                    // a Stale batch awaits its Resync

	done      chan struct{}
	closeOnce sync.Once
	stop      func() bool
}

var _ Watcher = (*watcher)(nil)

// Close implements Watcher.
func (w *watcher) Close() error {
	w.stop()
	w.end()
	return nil
}

// end ends the watch (Close, or its context done).
func (w *watcher) end() {
	w.closeOnce.Do(func() {
		close(w.done)
		w.r.hub.release(w.f)
		w.r.m.addWatchers(-1)
	})
}

func (w *watcher) ended() error {
	if w.r.closed.Load() {
		return ErrClosed
	}
	return ErrWatchClosed
}

// Instances implements Watcher.
func (w *watcher) Instances() []beacon.Instance {
	v := w.v.Load()
	if v == nil {
		return nil
	}
	out := make([]beacon.Instance, 0, v.tree.Len())
	v.tree.Ascend(func(it *item) bool {
		out = append(out, it.inst.Clone())
		return true
	})
	return out
}

// Next implements Watcher.
func (w *watcher) Next(ctx context.Context) (Batch, error) {
	f := w.f
	for {
		select {
		case <-w.done:
			return Batch{}, w.ended()
		default:
		}
		f.mu.Lock()
		if f.err != nil {
			err := f.err
			f.mu.Unlock()
			if errors.Is(err, ErrClosed) {
				return Batch{}, ErrClosed
			}
			return Batch{}, err
		}
		wake := f.wake
		old := w.v.Load()
		switch {
		case old == nil && f.synced && w.from > f.rev && !w.fromChecked:
			// A revision the feed has not reached: the store may have (it
			// follows this prefix only), or the revision was never given.
			prefix := f.prefix
			f.mu.Unlock()
			if err := w.checkFrom(ctx, prefix); err != nil {
				return Batch{}, err
			}
			continue

		case old == nil && f.synced:
			cur := f.versionLocked()
			f.reportedLocked(cur.rev)
			var entries []change
			resume := w.from > 0 && w.from >= f.floorRev && w.from <= f.rev
			if resume {
				// Everything after the revision, and the removals held
				// back and delivered at it after it was reported.
				i := sort.Search(len(f.log), func(i int) bool { return f.log[i].rev >= w.from })
				for i < len(f.log) && f.log[i].rev == w.from && !f.log[i].late {
					i++
				}
				entries = f.log[i:len(f.log):len(f.log)]
			}
			w.staleGen = f.staleGen
			f.mu.Unlock()
			w.v.Store(cur)
			if resume {
				return Batch{Kind: Changes, Events: resumeEvents(entries, cur), Revision: cur.rev}, nil
			}
			return Batch{Kind: Snapshot, Events: snapshotEvents(cur), Revision: cur.rev}, nil

		case old == nil:
			if f.stale != nil && w.staleGen != f.staleGen {
				w.staleGen = f.staleGen
				err := f.stale
				f.mu.Unlock()
				return Batch{Kind: Stale, Err: err}, nil
			}

		case f.stale != nil && w.staleGen != f.staleGen:
			w.staleGen = f.staleGen
			w.needResync = true
			err := f.stale
			f.mu.Unlock()
			return Batch{Kind: Stale, Err: err, Revision: old.rev}, nil

		case f.seq != old.seq || f.rev != old.rev || f.relists != old.relists || (w.needResync && f.stale == nil):
			cur := f.versionLocked()
			entries, ok := f.sinceLocked(old.seq)
			if !ok || len(entries) > 0 || w.needResync || cur.relists != old.relists {
				f.reportedLocked(cur.rev) // a batch is (most likely) on its way
			}
			f.mu.Unlock()
			var events []beacon.Event
			if ok {
				events = diffLog(old, cur, entries)
			} else {
				events = diffTrees(old, cur)
			}
			w.v.Store(cur)
			kind := Changes
			if cur.relists != old.relists || w.needResync {
				kind = Resync
			}
			if len(events) > 0 || w.needResync {
				w.needResync = false
				return Batch{Kind: kind, Events: events, Revision: cur.rev}, nil
			}
			continue
		}
		f.mu.Unlock()
		select {
		case <-wake:
		case <-ctx.Done():
			return Batch{}, ctx.Err()
		case <-w.done:
			return Batch{}, w.ended()
		}
	}
}

// fromProbe is appended to a watch's key prefix to read the store's
// revision: a key that cannot be an instance's ("~" is in no name), inside
// the prefix, so a user who may watch the prefix may read it.
const fromProbe = "~"

// checkFrom refuses a resume revision beyond the store's current one: a
// revision the store never gave (another store's, or a typo), which would
// otherwise be taken silently as a fresh watch. If the store cannot say
// (unreachable), the watch goes on as a fresh one.
func (w *watcher) checkFrom(ctx context.Context, prefix string) error {
	rctx, cancel := w.r.opContext()
	defer cancel()
	stop := context.AfterFunc(ctx, cancel)
	defer stop()
	_, cur, err := w.r.st.List(rctx, prefix+fromProbe)
	if err == nil && w.from > cur {
		return fmt.Errorf("%w: watch from revision %d: the store is only at revision %d: resume from a revision "+
			"this store gave (or watch afresh, without one)", beacon.ErrInvalid, w.from, cur)
	}
	w.fromChecked = true
	return nil
}

func event(t beacon.EventType, it *item, rev int64) beacon.Event {
	return beacon.Event{Type: t, Instance: it.inst.Clone(), Revision: rev}
}

// snapshotEvents lists a version as Added events, sorted by key.
func snapshotEvents(v *version) []beacon.Event {
	out := make([]beacon.Event, 0, v.tree.Len())
	v.tree.Ascend(func(it *item) bool {
		out = append(out, event(beacon.Added, it, it.mod))
		return true
	})
	return out
}

// diffLog turns the log entries between two versions into events: for each
// key, one event from its state in old to its state in cur.
func diffLog(old, cur *version, entries []change) []beacon.Event {
	latest := make(map[string]int64, len(entries))
	for _, c := range entries {
		latest[c.key] = c.rev
	}
	out := make([]beacon.Event, 0, len(latest))
	for key, rev := range latest {
		probe := &item{key: key}
		o, _ := old.tree.Get(probe)
		n, _ := cur.tree.Get(probe)
		if e, ok := transition(o, n, rev); ok {
			out = append(out, e)
		}
	}
	sortEvents(out)
	return out
}

// resumeEvents turns the log entries after a revision into events for a
// consumer whose state is unknown but was the state at that revision: the
// first entry of each key says what it was then.
func resumeEvents(entries []change, cur *version) []beacon.Event {
	type span struct {
		first *item // state at the resume revision
		last  *item // last state before the latest change
		rev   int64
	}
	spans := make(map[string]*span, len(entries))
	for _, c := range entries {
		s := spans[c.key]
		if s == nil {
			s = &span{first: c.before}
			spans[c.key] = s
		}
		if c.before != nil {
			s.last = c.before
		}
		s.rev = c.rev
	}
	out := make([]beacon.Event, 0, len(spans))
	for key, s := range spans {
		n, _ := cur.tree.Get(&item{key: key})
		switch {
		case s.first == nil && n != nil:
			out = append(out, event(beacon.Added, n, s.rev))
		case s.first != nil && n == nil:
			out = append(out, event(beacon.Removed, s.last, s.rev))
		case s.first != nil && n != nil && !s.first.inst.Equal(n.inst):
			out = append(out, event(beacon.Updated, n, s.rev))
		}
	}
	sortEvents(out)
	return out
}

// diffTrees compares two versions in full (a consumer so far behind that
// the log no longer covers its gap).
func diffTrees(old, cur *version) []beacon.Event {
	var a, b []*item
	old.tree.Ascend(func(it *item) bool { a = append(a, it); return true })
	cur.tree.Ascend(func(it *item) bool { b = append(b, it); return true })
	var out []beacon.Event
	i, j := 0, 0
	for i < len(a) || j < len(b) {
		switch {
		case j == len(b) || (i < len(a) && a[i].key < b[j].key):
			out = append(out, event(beacon.Removed, a[i], cur.rev))
			i++
		case i == len(a) || b[j].key < a[i].key:
			out = append(out, event(beacon.Added, b[j], b[j].mod))
			j++
		default:
			if e, ok := transition(a[i], b[j], b[j].mod); ok {
				out = append(out, e)
			}
			i++
			j++
		}
	}
	sortEvents(out)
	return out
}

// transition is the event taking a consumer from o to n (nil: absent).
func transition(o, n *item, rev int64) (beacon.Event, bool) {
	switch {
	case o == nil && n != nil:
		return event(beacon.Added, n, rev), true
	case o != nil && n == nil:
		return event(beacon.Removed, o, rev), true
	case o != nil && n != nil && !o.inst.Equal(n.inst):
		return event(beacon.Updated, n, rev), true
	}
	return beacon.Event{}, false
}

func sortEvents(evs []beacon.Event) {
	slices.SortFunc(evs, func(a, b beacon.Event) int {
		if c := cmp.Compare(a.Revision, b.Revision); c != 0 {
			return c
		}
		return cmp.Compare(a.Instance.Ref().String(), b.Instance.Ref().String())
	})
}
