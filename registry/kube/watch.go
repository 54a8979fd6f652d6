package kube

import (
	"context"
	"fmt"

	"github.com/beaconplane/beacon"
	"github.com/beaconplane/beacon/registry"
	shared "github.com/beaconplane/beacon/registry/internal/view"
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
	w := &watcher{r: r, v: v, cur: cursor{q: q}}
	r.m.watchers(1)
	w.life = shared.Begin(ctx, func() { r.m.watchers(-1) })
	return w, nil
}

// watcher is one consumer of the view: its cursor is its position in it.
type watcher struct {
	r    *Registry
	v    *view
	cur  cursor
	life *shared.Life // ends by Close or the Watch context
}

var _ registry.Watcher = (*watcher)(nil)

func (w *watcher) Close() error {
	w.life.End()
	return nil
}

func (w *watcher) ended() error {
	if w.r.closed.Load() {
		return registry.ErrClosed
	}
	return registry.ErrWatchClosed
}

// Instances implements registry.Watcher.
func (w *watcher) Instances() []beacon.Instance {
	v := w.cur.last.Load()
	if v == nil {
		return nil
	}
	var out []beacon.Instance
	v.Ascend(func(it *item) bool {
		if w.cur.matches(it) {
			out = append(out, it.Inst.Clone())
		}
		return true
	})
	return out
}

// Next implements registry.Watcher.
func (w *watcher) Next(ctx context.Context) (registry.Batch, error) {
	return shared.Wait(ctx, w.life, w.ended, func() (registry.Batch, bool, <-chan struct{}, error) {
		s := w.v.next(&w.cur)
		return s.batch, s.ok, s.wake, s.err
	})
}

// follow watches the process's own InstanceSet for the writer.
func (w *writer) follow() {
	defer w.wg.Done()
	r := w.r
	ctx := w.ctx // derived from r.ctx: carries the klog logger (withKlog)
	logger := klog.FromContext(ctx)
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
