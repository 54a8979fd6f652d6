package registry

import (
	"context"
	"fmt"

	"github.com/beaconplane/beacon"
	"github.com/beaconplane/beacon/registry/internal/view"
)

// Watch implements Discoverer. Watchers of the same query in one registry
// share one store watch.
func (r *StoreRegistry) Watch(ctx context.Context, q beacon.Query, opts ...WatchOption) (Watcher, error) {
	if err := r.checkQuery(q); err != nil {
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
	w := &watcher{r: r, f: f, cur: cursor{from: o.fromRevision}}
	r.m.addWatchers(1)
	w.life = view.Begin(ctx, func() {
		r.hub.release(f)
		r.m.addWatchers(-1)
	})
	return w, nil
}

// watcher is one consumer of a feed: its cursor is its position in it.
type watcher struct {
	r    *StoreRegistry
	f    *feed
	cur  cursor
	life *view.Life // ends by Close or the Watch context
}

var _ Watcher = (*watcher)(nil)

// Close implements Watcher.
func (w *watcher) Close() error {
	w.life.End()
	return nil
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
	return view.Wait(ctx, w.life, w.ended, func() (Batch, bool, <-chan struct{}, error) {
		s := w.f.next(&w.cur)
		if s.checkFrom {
			return Batch{}, false, nil, w.f.checkFrom(ctx, &w.cur)
		}
		return s.batch, s.ok, s.wake, s.err
	})
}
