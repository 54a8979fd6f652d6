package kube

import (
	"cmp"
	"context"
	"fmt"
	"slices"
	"sync"
	"sync/atomic"

	"github.com/beaconplane/beacon"
	"github.com/beaconplane/beacon/registry"
	"github.com/go-logr/logr"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/apis/meta/v1/unstructured"
	"k8s.io/apimachinery/pkg/fields"
	"k8s.io/apimachinery/pkg/runtime"
	"k8s.io/apimachinery/pkg/watch"
	"k8s.io/client-go/tools/cache"
	"k8s.io/klog/v2"
)

// Watch implements registry.Discoverer. It returns at once; the first
// batch comes once the view has listed every watched namespace. Every
// watcher of the registry shares one view (one reflector per resource and
// namespace). FromRevision is accepted but always answered with a
// Snapshot: see the view's documentation.
func (r *Registry) Watch(ctx context.Context, q beacon.Query, opts ...registry.WatchOption) (registry.Watcher, error) {
	if err := q.Validate(); err != nil {
		return nil, err
	}
	if from := registry.FromRevisionOf(opts...); from < 0 {
		return nil, fmt.Errorf("%w: watch from revision %d: revisions are positive", beacon.ErrInvalid, from)
	}
	if err := ctx.Err(); err != nil {
		return nil, err
	}
	if r.closed.Load() {
		return nil, registry.ErrClosed
	}
	if err := r.checkReader(ctx); err != nil {
		return nil, err
	}
	v := r.viewFor()
	w := &watcher{r: r, v: v, q: q, done: make(chan struct{})}
	r.m.watchers(1)
	w.stop = context.AfterFunc(ctx, w.end)
	return w, nil
}

type watcher struct {
	r *Registry
	v *view
	q beacon.Query

	last       atomic.Pointer[version]
	staleGen   uint64
	needResync bool

	done      chan struct{}
	closeOnce sync.Once
	stop      func() bool
}

var _ registry.Watcher = (*watcher)(nil)

func (w *watcher) Close() error {
	w.stop()
	w.end()
	return nil
}

func (w *watcher) end() {
	w.closeOnce.Do(func() {
		close(w.done)
		w.r.m.watchers(-1)
	})
}

func (w *watcher) ended() error {
	if w.r.closed.Load() {
		return registry.ErrClosed
	}
	return registry.ErrWatchClosed
}

// Instances implements registry.Watcher.
func (w *watcher) Instances() []beacon.Instance {
	v := w.last.Load()
	if v == nil {
		return nil
	}
	var out []beacon.Instance
	v.tree.Ascend(func(it *item) bool {
		if w.q.Matches(it.inst.Ref()) {
			out = append(out, it.inst.Clone())
		}
		return true
	})
	return out
}

// Next implements registry.Watcher.
func (w *watcher) Next(ctx context.Context) (registry.Batch, error) {
	v := w.v
	for {
		select {
		case <-w.done:
			return registry.Batch{}, w.ended()
		default:
		}
		v.mu.Lock()
		if v.err != nil {
			err := v.err
			v.mu.Unlock()
			return registry.Batch{}, err
		}
		wake := v.wake
		old := w.last.Load()
		switch {
		case old == nil && v.synced:
			cur := v.versionLocked()
			w.staleGen = v.staleGen
			v.mu.Unlock()
			w.last.Store(cur)
			return registry.Batch{Kind: registry.Snapshot, Events: w.snapshot(cur), Revision: cur.rev}, nil

		case old == nil:
			if v.stale != nil && w.staleGen != v.staleGen {
				w.staleGen = v.staleGen
				err := v.stale
				v.mu.Unlock()
				return registry.Batch{Kind: registry.Stale, Err: err}, nil
			}

		case v.stale != nil && w.staleGen != v.staleGen:
			w.staleGen = v.staleGen
			w.needResync = true
			err := v.stale
			v.mu.Unlock()
			return registry.Batch{Kind: registry.Stale, Err: err, Revision: old.rev}, nil

		case v.seq != old.seq || v.relists != old.relists || (w.needResync && v.stale == nil && v.held == nil):
			cur := v.versionLocked()
			entries, ok := v.sinceLocked(old.seq)
			v.mu.Unlock()
			var events []beacon.Event
			if ok {
				events = w.diffLog(old, cur, entries)
			} else {
				events = w.diffTrees(old, cur)
			}
			w.last.Store(cur)
			kind := registry.Changes
			if cur.relists != old.relists || w.needResync {
				kind = registry.Resync
			}
			if len(events) > 0 || w.needResync {
				w.needResync = false
				return registry.Batch{Kind: kind, Events: events, Revision: cur.rev}, nil
			}
			continue
		}
		v.mu.Unlock()
		select {
		case <-wake:
		case <-ctx.Done():
			return registry.Batch{}, ctx.Err()
		case <-w.done:
			return registry.Batch{}, w.ended()
		}
	}
}

func (w *watcher) matches(it *item) bool { return it != nil && w.q.Matches(it.inst.Ref()) }

func itemEvent(t beacon.EventType, it *item, rev int64) beacon.Event {
	return beacon.Event{Type: t, Instance: it.inst.Clone(), Revision: rev}
}

func (w *watcher) snapshot(v *version) []beacon.Event {
	out := []beacon.Event{}
	v.tree.Ascend(func(it *item) bool {
		if w.matches(it) {
			out = append(out, itemEvent(beacon.Added, it, it.rev))
		}
		return true
	})
	return out
}

// diffLog turns the log entries between two versions into one event per
// changed instance the query selects.
func (w *watcher) diffLog(old, cur *version, entries []change) []beacon.Event {
	latest := make(map[string]int64, len(entries))
	for _, c := range entries {
		latest[c.key] = c.rev
	}
	var out []beacon.Event
	for key, rev := range latest {
		probe := &item{key: key}
		o, _ := old.tree.Get(probe)
		n, _ := cur.tree.Get(probe)
		if !w.matches(o) {
			o = nil
		}
		if !w.matches(n) {
			n = nil
		}
		if e, ok := transition(o, n, rev); ok {
			out = append(out, e)
		}
	}
	sortEvents(out)
	return out
}

// diffTrees compares two versions in full.
func (w *watcher) diffTrees(old, cur *version) []beacon.Event {
	var a, b []*item
	old.tree.Ascend(func(it *item) bool {
		if w.matches(it) {
			a = append(a, it)
		}
		return true
	})
	cur.tree.Ascend(func(it *item) bool {
		if w.matches(it) {
			b = append(b, it)
		}
		return true
	})
	var out []beacon.Event
	i, j := 0, 0
	for i < len(a) || j < len(b) {
		switch {
		case j == len(b) || (i < len(a) && a[i].key < b[j].key):
			out = append(out, itemEvent(beacon.Removed, a[i], cur.rev))
			i++
		case i == len(a) || b[j].key < a[i].key:
			out = append(out, itemEvent(beacon.Added, b[j], b[j].rev))
			j++
		default:
			if e, ok := transition(a[i], b[j], b[j].rev); ok {
				out = append(out, e)
			}
			i++
			j++
		}
	}
	sortEvents(out)
	return out
}

func transition(o, n *item, rev int64) (beacon.Event, bool) {
	switch {
	case o == nil && n != nil:
		return itemEvent(beacon.Added, n, rev), true
	case o != nil && n == nil:
		return itemEvent(beacon.Removed, o, rev), true
	case o != nil && n != nil && !o.inst.Equal(n.inst):
		return itemEvent(beacon.Updated, n, rev), true
	}
	return beacon.Event{}, false
}

func sortEvents(evs []beacon.Event) {
	slices.SortFunc(evs, func(a, b beacon.Event) int {
		if c := cmp.Compare(a.Revision, b.Revision); c != 0 {
			return c
		}
		return cmp.Compare(refKey(a.Instance.Ref()), refKey(b.Instance.Ref()))
	})
}

// follow watches the process's own InstanceSet for the writer.
func (w *writer) follow() {
	defer w.wg.Done()
	r := w.r
	logger := logr.FromSlogHandler(r.log.Handler())
	ctx := klog.NewContext(w.ctx, logger)
	sel := fields.OneTermEqualSelector("metadata.name", w.name).String()
	lw := &cache.ListWatch{
		ListWithContextFunc: func(ctx context.Context, o metav1.ListOptions) (runtime.Object, error) {
			o.FieldSelector = sel
			obj, err := r.dyn.Resource(GVR).Namespace(w.ns).List(ctx, o)
			w.followed("list", err)
			return obj, err
		},
		WatchFuncWithContext: func(ctx context.Context, o metav1.ListOptions) (watch.Interface, error) {
			o.FieldSelector = sel
			wi, err := r.dyn.Resource(GVR).Namespace(w.ns).Watch(ctx, o)
			w.followed("watch", err)
			return wi, err
		},
	}
	own := func(o any) *unstructured.Unstructured {
		u, ok := o.(*unstructured.Unstructured)
		if !ok || u.GetName() != w.name {
			return nil
		}
		return u
	}
	s := &sink{
		add: func(o any) {
			if u := own(o); u != nil {
				w.observed(u)
			}
		},
		del: func(o any) {
			if u := own(o); u != nil {
				w.gone(parseRV(u.GetResourceVersion()))
			}
		},
		replace: func(objs []any, rv string) {
			for _, o := range objs {
				if u := own(o); u != nil {
					w.observed(u)
					return
				}
			}
			w.gone(parseRV(rv))
		},
	}
	refl := cache.NewReflectorWithOptions(lw, &unstructured.Unstructured{}, s, cache.ReflectorOptions{
		Name:   "beacon own InstanceSet " + w.ns + "/" + w.name,
		Logger: &logger,
	})
	refl.RunWithContext(ctx)
}
