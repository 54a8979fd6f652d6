package registry

import (
	"context"
	"fmt"
	"sync"

	"github.com/beaconplane/beacon"
	"github.com/beaconplane/beacon/registry/internal/view"
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
	w := &watcher{r: r, f: f, cur: cursor{from: o.fromRevision}, done: make(chan struct{})}
	r.m.addWatchers(1)
	// The callback must not read w.stop: it is written after AfterFunc
	// returns, with no ordering against the callback.
	w.stop = context.AfterFunc(ctx, w.end)
	return w, nil
}

// watcher is one consumer of a feed: its cursor is its position in it.
type watcher struct {
	r   *StoreRegistry
	f   *feed
	cur cursor

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
	v := w.cur.v.Load()
	if v == nil {
		return nil
	}
	out := make([]beacon.Instance, 0, v.Len())
	v.Ascend(func(it *item) bool {
		out = append(out, it.Inst.Clone())
		return true
	})
	return out
}

// Next implements Watcher.
func (w *watcher) Next(ctx context.Context) (Batch, error) {
	return view.Wait(ctx, w.done, w.ended, func() (Batch, bool, <-chan struct{}, error) {
		s := w.f.next(&w.cur)
		if s.checkFrom {
			return Batch{}, false, nil, w.f.checkFrom(ctx, &w.cur)
		}
		return s.batch, s.ok, s.wake, s.err
	})
}
