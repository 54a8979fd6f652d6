package kube

import (
	"context"
	"fmt"
	"slices"
	"sync"
	"time"

	"github.com/beaconplane/beacon"
	"github.com/beaconplane/beacon/internal/wait"
	"github.com/beaconplane/beacon/registry/internal/healthjoin"
	shared "github.com/beaconplane/beacon/registry/internal/view"
	"github.com/go-logr/logr"
	discoveryv1 "k8s.io/api/discovery/v1"
	apierrors "k8s.io/apimachinery/pkg/api/errors"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/apis/meta/v1/unstructured"
	"k8s.io/apimachinery/pkg/runtime"
	"k8s.io/apimachinery/pkg/watch"
	"k8s.io/client-go/tools/cache"
	"k8s.io/klog/v2"
)

// The watch side. One view per registry holds the live instances of every
// watched namespace: for each namespace, one reflector (list, then watch,
// re-list after 410 Gone or a lost connection: the machinery of client-go's
// informers) follows the InstanceSets and one the discovery EndpointSlices,
// feeding a store of ours. A re-list reaches it as one Replace of the whole
// namespace, applied atomically, so it produces exactly the difference to
// what was there: no phantom removal. Every watcher of the registry shares
// the view.
//
// The view keeps the current instances in the registry's shared view
// (registry/internal/view: a copy-on-write B-tree with a bounded log of
// recent changes). Watchers are never pushed events: each keeps the
// version it last delivered and, when it asks for more, gets the
// difference to the current version (from the log, or by walking both
// trees when the log no longer covers the gap). A slow watcher costs
// nothing while it is slow and catches up in one batch.
//
// Revisions are the API server's resourceVersions (etcd revisions): the
// view's revision is the largest one it has seen. They order one view's
// batches; a watch cannot resume from one (FromRevision always gives a
// snapshot), because the two resources' histories are not one ordered log.

const (
	// probeInterval is how often the view checks that the API server
	// answers while it runs; a watch that goes silent because the server
	// hangs is reported Stale within probeInterval + Config.Timeout.
	probeInterval = 5 * time.Second
)

// item is one live instance; its Rev is the view's revision when it
// last changed.
type item = shared.Item

// source is one reflector of the view.
type source struct {
	what   string // the objects' resource ("instancesets") or "endpointslices"
	ns     string
	synced bool
	err    error
	round  uint64          // the last re-listing round it took part in (relistedLocked)
	watch  *relistingWatch // its current watch, if any
}

// view is the registry's shared watch state. Lock order: view.mu, then
// the Registry's collisions.mu (a leaf, taken by resolve).
type view struct {
	r *Registry

	mu        sync.Mutex
	sets      map[string]*setInfo        // valid content by namespace/name
	setsByPod map[string]map[string]bool // podKey -> set keys
	refSets   map[string]map[string]bool // ref key -> set keys holding it
	// verdictSets are the set keys holding a verdict on a ref key.
	verdictSets map[string]map[string]bool
	health      *healthjoin.Join           // the live verdicts joined, and the services' panic (health.go)
	slices      map[string]map[string]bool // slice namespace/name -> ready podKeys
	readyCount  map[string]int             // podKey -> slices listing it ready

	state    *shared.View // the live instances, their log and versions
	sources  []*source
	synced   bool
	probeErr error
	stale    error
	// held, when not nil, are the ref keys whose changes a hold keeps
	// back during a re-listing round (relistedLocked); heldRelists the
	// re-listings it covers.
	held        map[string]bool
	heldSince   time.Time
	heldRelists uint64
	round       uint64
	staleGen    uint64
	wake        shared.Wake // news, and the terminal error
}

// viewFor returns the registry's view, starting it on first use.
func (r *Registry) viewFor() *view {
	r.viewMu.Lock()
	defer r.viewMu.Unlock()
	if r.view != nil {
		return r.view
	}
	v := &view{
		r:           r,
		sets:        map[string]*setInfo{},
		setsByPod:   map[string]map[string]bool{},
		refSets:     map[string]map[string]bool{},
		verdictSets: map[string]map[string]bool{},
		health:      healthjoin.New(r.cfg.HealthPanicThreshold),
		slices:      map[string]map[string]bool{},
		readyCount:  map[string]int{},
		state:       shared.New(),
	}
	r.view = v
	ctx := r.ctx // carries the klog logger (withKlog)
	logger := klog.FromContext(ctx)
	kind := r.kind
	for _, ns := range r.namespaces {
		sets := &source{what: kind.resource, ns: ns}
		sl := &source{what: "endpointslices", ns: ns}
		v.sources = append(v.sources, sets, sl)
		r.runReflector(ctx, logger, sets, &unstructured.Unstructured{}, &listWatch{
			r: r, src: sets, v: v,
			list: func(ctx context.Context, o metav1.ListOptions) (runtime.Object, error) {
				return r.dyn.Resource(kind.gvr()).Namespace(ns).List(ctx, o)
			},
			watch: func(ctx context.Context, o metav1.ListOptions) (watch.Interface, error) {
				return r.dyn.Resource(kind.gvr()).Namespace(ns).Watch(ctx, o)
			},
		}, &sink{
			add:     func(o any) { v.setChanged(o.(*unstructured.Unstructured)) },
			del:     func(o any) { v.setDeleted(o.(*unstructured.Unstructured)) },
			replace: func(objs []any, rv string) { v.replaceSets(sets, objs, rv) },
		})
		r.runReflector(ctx, logger, sl, &unstructured.Unstructured{}, &listWatch{
			r: r, src: sl, v: v,
			list: func(ctx context.Context, o metav1.ListOptions) (runtime.Object, error) {
				o.LabelSelector = kind.slices
				return r.dyn.Resource(endpointSlicesGVR).Namespace(ns).List(ctx, o)
			},
			watch: func(ctx context.Context, o metav1.ListOptions) (watch.Interface, error) {
				o.LabelSelector = kind.slices
				return r.dyn.Resource(endpointSlicesGVR).Namespace(ns).Watch(ctx, o)
			},
		}, &sink{
			add:     func(o any) { v.sliceChanged(v.slice(o)) },
			del:     func(o any) { v.sliceDeleted(v.slice(o)) },
			replace: func(objs []any, rv string) { v.replaceSlices(sl, objs, rv) },
		})
	}
	r.wg.Add(1)
	go v.probe()
	return v
}

func (r *Registry) runReflector(ctx context.Context, logger logr.Logger, src *source, typ any, lw *listWatch, s *sink) {
	refl := cache.NewReflectorWithOptions(lw, typ, s, cache.ReflectorOptions{
		Name:   fmt.Sprintf("beacon %s %s", src.what, nsName(src.ns)),
		Logger: &logger,
	})
	r.wg.Add(1)
	go func() {
		defer r.wg.Done()
		refl.RunWithContext(ctx)
	}()
}

func nsName(ns string) string {
	if ns == "" {
		return "(all namespaces)"
	}
	return ns
}

// listWatch wraps a resource's list and watch, reporting failures and
// recoveries to the view (a failing source makes the view stale).
type listWatch struct {
	r     *Registry
	src   *source
	v     *view
	list  func(context.Context, metav1.ListOptions) (runtime.Object, error)
	watch func(context.Context, metav1.ListOptions) (watch.Interface, error)
}

var (
	_ cache.ListerWatcher            = (*listWatch)(nil)
	_ cache.ListerWatcherWithContext = (*listWatch)(nil)
)

func (lw *listWatch) List(o metav1.ListOptions) (runtime.Object, error) {
	return lw.ListWithContext(lw.r.ctx, o)
}

func (lw *listWatch) Watch(o metav1.ListOptions) (watch.Interface, error) {
	return lw.WatchWithContext(lw.r.ctx, o)
}

func (lw *listWatch) resource() string {
	if lw.src.what == lw.r.kind.resource {
		return lw.r.kind.rbacName()
	}
	return endpointSlicesResource
}

func (lw *listWatch) ListWithContext(ctx context.Context, o metav1.ListOptions) (runtime.Object, error) {
	obj, err := lw.list(ctx, o)
	if err != nil && ctx.Err() == nil {
		lw.v.sourceFailed(lw.src, lw.r.explain(op{"list", lw.resource(), lw.src.ns}, err))
	}
	return obj, err
}

func (lw *listWatch) WatchWithContext(ctx context.Context, o metav1.ListOptions) (watch.Interface, error) {
	if o.SendInitialEvents == nil && lw.v.failed(lw.src) {
		// Resuming after a failure would replay what this resource missed
		// while the other resources replay theirs, in no common order (a
		// pod replaced meanwhile would look removed, then added): the
		// source re-lists instead, and the view applies the re-listings of
		// every source as one step (see relistedLocked).
		return nil, apierrors.NewResourceExpired("beacon: re-listing " + lw.src.what + " after the watch failed")
	}
	w, err := lw.watch(ctx, o)
	if err != nil {
		if ctx.Err() == nil {
			lw.v.sourceFailed(lw.src, lw.r.explain(op{"watch", lw.resource(), lw.src.ns}, err))
		}
		return nil, err
	}
	rw := newRelistingWatch(w)
	lw.v.watching(lw.src, rw, o.SendInitialEvents == nil)
	return rw, nil
}

// relistingWatch passes a watch's events on to a reflector, and can end it
// with 410 Gone, which makes the reflector re-list (the view's way of
// re-reading a resource that did not fail itself, see relistedLocked).
type relistingWatch struct {
	inner    watch.Interface
	out      chan watch.Event
	stop     chan struct{} // closed by Stop
	relist   chan struct{} // closed by Relist
	stopOnce sync.Once
	relOnce  sync.Once
	done     chan struct{} // closed when forward returns
}

func newRelistingWatch(inner watch.Interface) *relistingWatch {
	w := &relistingWatch{inner: inner, out: make(chan watch.Event), stop: make(chan struct{}),
		relist: make(chan struct{}), done: make(chan struct{})}
	go w.forward() // ends with the inner watch, Stop or Relist; Stop waits for it
	return w
}

func (w *relistingWatch) forward() {
	defer close(w.done)
	defer close(w.out)
	in := w.inner.ResultChan()
	for {
		var ev watch.Event
		select {
		case e, ok := <-in:
			if !ok {
				return
			}
			ev = e
		case <-w.relist:
			ev = watch.Event{Type: watch.Error, Object: &apierrors.NewResourceExpired("beacon: re-listing with the other resources").ErrStatus}
		case <-w.stop:
			return
		}
		select {
		case w.out <- ev:
		case <-w.stop:
			return
		}
		if ev.Type == watch.Error {
			return
		}
	}
}

// Relist ends the watch with 410 Gone.
func (w *relistingWatch) Relist() { w.relOnce.Do(func() { close(w.relist) }) }

func (w *relistingWatch) Stop() {
	w.stopOnce.Do(func() {
		close(w.stop)
		w.inner.Stop()
	})
	<-w.done
}

func (w *relistingWatch) ResultChan() <-chan watch.Event { return w.out }

// sink is the store a reflector writes to.
type sink struct {
	add     func(any)
	del     func(any)
	replace func([]any, string)
}

func (s *sink) Add(o any) error                     { s.add(o); return nil }
func (s *sink) Update(o any) error                  { s.add(o); return nil }
func (s *sink) Delete(o any) error                  { s.del(o); return nil }
func (s *sink) Replace(objs []any, rv string) error { s.replace(objs, rv); return nil }
func (s *sink) Resync() error                       { return nil }

// probe checks that the API server answers, while the view runs.
func (v *view) probe() {
	r := v.r
	defer r.wg.Done()
	wait.Every(r.ctx, probeInterval, func() {
		ctx, cancel := context.WithTimeout(r.ctx, r.cfg.Timeout)
		err := r.rawGet(ctx, "/version", nil)
		cancel()
		if r.ctx.Err() != nil {
			return
		}
		if err != nil && !isUnreachable(err) {
			err = nil // any answer means the server is there
		}
		v.mu.Lock()
		if err != nil {
			if v.probeErr == nil {
				r.log.Warn("the API server does not answer: watches may be stale until it does", "err", err)
			}
			v.probeErr = fmt.Errorf("%w at %s: %w", ErrUnreachable, r.host, err)
		} else {
			v.probeErr = nil
		}
		v.updateStaleLocked()
		if v.held != nil && time.Since(v.heldSince) >= maxHold {
			r.log.Warn("publishing re-listed resources while others still fail", "held_for", time.Since(v.heldSince).Round(time.Second), "err", v.stale)
			v.releaseLocked()
		}
		v.mu.Unlock()
	})
}

func (v *view) sourceFailed(src *source, err error) {
	v.mu.Lock()
	defer v.mu.Unlock()
	if src.err == nil {
		v.r.log.Warn("watch failing; retrying", "resource", src.what, "namespace", nsName(src.ns), "err", err)
	}
	src.err = err
	v.updateStaleLocked()
}

// failed reports whether src's last list or watch failed (it has not
// re-listed since).
func (v *view) failed(src *source) bool {
	v.mu.Lock()
	defer v.mu.Unlock()
	return src.err != nil
}

// watching records src's new watch; resumed (not a watch-list's initial
// stream, which ends with a Replace) means nothing was missed.
func (v *view) watching(src *source, w *relistingWatch, resumed bool) {
	v.mu.Lock()
	defer v.mu.Unlock()
	src.watch = w
	if resumed && v.held != nil && src.round != v.round {
		w.Relist() // a round is under way: this source must re-list too
	}
	if resumed {
		src.err = nil
		v.updateStaleLocked()
	}
}

func (v *view) updateStaleLocked() {
	err := v.probeErr
	for _, s := range v.sources {
		if err == nil && s.err != nil {
			err = s.err
		}
	}
	switch {
	case err != nil && v.stale == nil:
		v.staleGen++
		v.stale = err
		v.notifyLocked()
	case err != nil:
		v.stale = err
	case v.stale != nil:
		v.stale = nil
		v.r.log.Info("watches are current again")
		v.notifyLocked()
	}
}

// A re-listing (after 410 Gone, an API server restart, or a failure) is a
// round: every source re-lists, and what they change is applied but not
// published until all have, so that watchers get the round as one Resync
// computed from the state of every resource after it, never the mixture of
// one resource's new state with another's old one (a pod replaced meanwhile,
// its InstanceSet re-listed before the EndpointSlice saying that its new UID
// is Ready, would look removed, then added). The source that re-lists first
// starts the round and ends the other sources' watches with 410 Gone, so
// that they re-list too; changes that arrive meanwhile are held, in order.
// A round ends at the latest maxHold after it began (checked by the probe,
// so within maxHold + probeInterval), so that a resource that keeps failing
// (its RBAC revoked) does not freeze the others.
const maxHold = 10 * time.Second

// relistedLocked records src's re-listing in the current round, starting
// one if none is under way, and ends the round once every source re-listed.
func (v *view) relistedLocked(src *source) {
	if v.held == nil {
		v.round++
		v.held = map[string]bool{}
		v.heldSince = time.Now()
		for _, s := range v.sources {
			if s != src && s.watch != nil {
				s.watch.Relist()
			}
		}
	}
	src.round = v.round
	v.heldRelists++
	for _, s := range v.sources {
		if s.round != v.round {
			return
		}
	}
	v.releaseLocked()
}

// releaseLocked publishes what a round held back.
func (v *view) releaseLocked() {
	if v.held == nil {
		return
	}
	held := v.held
	v.held = nil
	for range v.heldRelists {
		v.state.Relisted()
	}
	v.heldRelists = 0
	v.publishLocked(held)
	v.notifyLocked()
}

func (v *view) notifyLocked() { v.wake.Notify() }

// fail ends the view (the registry closed).
func (v *view) fail(err error) {
	v.mu.Lock()
	defer v.mu.Unlock()
	v.wake.Fail(err)
	for _, c := range v.health.Close() {
		v.r.panics.Report(c)
	}
}

func (v *view) observeRV(rv string) {
	v.state.SetRev(max(v.state.Rev(), parseRV(rv)))
}

// setChanged applies an added or updated InstanceSet.
func (v *view) setChanged(u *unstructured.Unstructured) {
	s := v.r.parseSet(u) // outside the lock: logs and counts
	v.mu.Lock()
	defer v.mu.Unlock()
	v.observeRV(u.GetResourceVersion())
	dirty := v.putSetLocked(u.GetNamespace()+"/"+u.GetName(), s)
	v.publishLocked(dirty)
}

func (v *view) setDeleted(u *unstructured.Unstructured) {
	v.r.valid.forget(string(u.GetUID()))
	v.mu.Lock()
	defer v.mu.Unlock()
	v.observeRV(u.GetResourceVersion())
	dirty := v.putSetLocked(u.GetNamespace()+"/"+u.GetName(), nil)
	v.publishLocked(dirty)
}

// replaceSets applies a (re-)listing of one source's InstanceSets.
func (v *view) replaceSets(src *source, objs []any, rv string) {
	parsed := make(map[string]*setInfo, len(objs))
	keys := make([]string, 0, len(objs))
	for _, o := range objs {
		u := o.(*unstructured.Unstructured)
		key := u.GetNamespace() + "/" + u.GetName()
		parsed[key] = v.r.parseSet(u)
		keys = append(keys, key)
	}
	relist(v, src, rv, v.sets, keys, parsed, v.putSetLocked)
}

// relist applies a (re-)listing of one source's objects of one kind, at
// resource version rv: held is what the view holds of that kind, listed
// the listing by key (namespace/name), put in keys' order; put installs
// one object (the zero T: gone) and returns the ref keys whose live
// instance may have changed. Held objects of the source's namespace that
// the listing lacks are gone; the changes are published at once.
func relist[T any](v *view, src *source, rv string, held map[string]T, keys []string, listed map[string]T, put func(string, T) map[string]bool) {
	v.mu.Lock()
	defer v.mu.Unlock()
	v.observeRV(rv)
	dirty := map[string]bool{}
	var gone T
	for key := range held {
		if _, ok := listed[key]; !ok && inNamespace(key, src.ns) {
			for k := range put(key, gone) {
				dirty[k] = true
			}
		}
	}
	for _, key := range keys {
		for k := range put(key, listed[key]) {
			dirty[k] = true
		}
	}
	v.sourceSyncedLocked(src)
	v.publishLocked(dirty)
}

func inNamespace(key, ns string) bool {
	return ns == "" || len(key) > len(ns) && key[:len(ns)] == ns && key[len(ns)] == '/'
}

// putSetLocked installs the valid content of a set (nil: none) and returns
// the ref keys whose live instance may have changed.
func (v *view) putSetLocked(key string, s *setInfo) map[string]bool {
	dirty := map[string]bool{}
	if old := v.sets[key]; old != nil {
		if s == old {
			return dirty
		}
		delete(v.setsByPod[old.pod], key)
		if len(v.setsByPod[old.pod]) == 0 {
			delete(v.setsByPod, old.pod)
		}
		for _, in := range old.instances {
			k := refKey(in.Ref())
			dirty[k] = true
			unindex(v.refSets, k, key)
		}
		for k := range old.verdicts {
			dirty[k] = true
			unindex(v.verdictSets, k, key)
		}
		delete(v.sets, key)
	}
	if s == nil {
		return dirty
	}
	v.sets[key] = s
	if v.setsByPod[s.pod] == nil {
		v.setsByPod[s.pod] = map[string]bool{}
	}
	v.setsByPod[s.pod][key] = true
	for _, in := range s.instances {
		k := refKey(in.Ref())
		dirty[k] = true
		index(v.refSets, k, key)
	}
	for k := range s.verdicts {
		dirty[k] = true
		index(v.verdictSets, k, key)
	}
	return dirty
}

// index records that the set at setKey holds something at the ref key k.
func index(m map[string]map[string]bool, k, setKey string) {
	if m[k] == nil {
		m[k] = map[string]bool{}
	}
	m[k][setKey] = true
}

// unindex forgets it.
func unindex(m map[string]map[string]bool, k, setKey string) {
	delete(m[k], setKey)
	if len(m[k]) == 0 {
		delete(m, k)
	}
}

// slice converts an EndpointSlice from the reflector; one that does not
// decode (never seen from a real API server) counts as listing no pod.
func (v *view) slice(o any) *discoveryv1.EndpointSlice {
	u := o.(*unstructured.Unstructured)
	s, err := toSlice(u)
	if err != nil {
		v.r.log.Warn("an EndpointSlice does not decode; it counts as listing no ready pod", "err", err)
		return &discoveryv1.EndpointSlice{ObjectMeta: metav1.ObjectMeta{Namespace: u.GetNamespace(), Name: u.GetName(),
			ResourceVersion: u.GetResourceVersion()}}
	}
	return s
}

func (v *view) sliceChanged(s *discoveryv1.EndpointSlice) {
	v.mu.Lock()
	defer v.mu.Unlock()
	v.observeRV(s.ResourceVersion)
	v.publishLocked(v.putSliceLocked(s.Namespace+"/"+s.Name, readyPods(s)))
}

func (v *view) sliceDeleted(s *discoveryv1.EndpointSlice) {
	v.mu.Lock()
	defer v.mu.Unlock()
	v.observeRV(s.ResourceVersion)
	v.publishLocked(v.putSliceLocked(s.Namespace+"/"+s.Name, nil))
}

func (v *view) replaceSlices(src *source, objs []any, rv string) {
	fresh := make(map[string]map[string]bool, len(objs))
	keys := make([]string, 0, len(objs))
	for _, o := range objs {
		s := v.slice(o)
		key := s.Namespace + "/" + s.Name
		fresh[key] = readyPods(s)
		keys = append(keys, key)
	}
	relist(v, src, rv, v.slices, keys, fresh, v.putSliceLocked)
}

// putSliceLocked installs the ready pods of a slice (nil: deleted) and
// returns the ref keys whose live instance may have changed.
func (v *view) putSliceLocked(key string, ready map[string]bool) map[string]bool {
	old := v.slices[key]
	if ready == nil {
		delete(v.slices, key)
	} else {
		v.slices[key] = ready
	}
	var flipped []string
	for pod := range old {
		if !ready[pod] {
			v.readyCount[pod]--
			if v.readyCount[pod] <= 0 {
				delete(v.readyCount, pod)
				flipped = append(flipped, pod)
			}
		}
	}
	for pod := range ready {
		if !old[pod] {
			v.readyCount[pod]++
			if v.readyCount[pod] == 1 {
				flipped = append(flipped, pod)
			}
		}
	}
	dirty := map[string]bool{}
	for _, pod := range flipped {
		for key := range v.setsByPod[pod] {
			for _, in := range v.sets[key].instances {
				dirty[refKey(in.Ref())] = true
			}
			for k := range v.sets[key].verdicts {
				dirty[k] = true
			}
		}
	}
	return dirty
}

func (v *view) sourceSyncedLocked(src *source) {
	relist := src.synced
	src.synced = true
	src.err = nil
	if !v.synced {
		all := true
		for _, s := range v.sources {
			all = all && s.synced
		}
		v.synced = all
	}
	v.updateStaleLocked()
	if relist {
		v.r.m.relist()
		v.relistedLocked(src)
	}
	v.notifyLocked()
}

// publishLocked recomputes the live instance of every dirty ref and logs
// the changes.
func (v *view) publishLocked(dirty map[string]bool) {
	if v.held != nil {
		for k := range dirty {
			v.held[k] = true
		}
		return
	}
	keys := make([]string, 0, len(dirty))
	for k := range dirty {
		keys = append(keys, k)
	}
	slices.Sort(keys)
	changed := false
	for _, k := range keys {
		if h, ok := v.verdictLocked(k); ok {
			v.health.SetVerdict(k, h)
		} else {
			v.health.DeleteVerdict(k)
		}
		best, ok := v.r.resolve(k, v.candidatesLocked(k))
		old, _ := v.state.Get(k)
		var inst beacon.Instance
		if ok {
			inst = best.inst
			inst.Health = v.health.Health(k, inst)
		}
		switch {
		case !ok && old == nil:
		case !ok:
			v.state.Delete(old, v.state.Rev())
			v.health.Count(k, &old.Inst, nil)
			changed = true
		case old != nil && old.Inst.Equal(inst):
			// unchanged: keep the item (and the revision) watchers hold
		default:
			v.state.Set(&item{Key: k, Inst: inst, Rev: v.state.Rev()}, v.state.Rev())
			v.health.Count(k, instanceOf(old), &inst)
			changed = true
		}
	}
	if v.settleLocked() {
		changed = true
	}
	if changed {
		v.state.Trim()
		v.notifyLocked()
	}
}

// settleLocked settles the services whose health counts changed: the
// priority levels that entered or left panic are reported, and their failing instances
// joined again. It reports whether an item changed.
func (v *view) settleLocked() bool {
	changed := false
	for _, c := range v.health.Settle() {
		v.r.panics.Report(c)
		for _, k := range c.Keys {
			changed = v.rejoinLocked(k) || changed
		}
	}
	return changed
}

// rejoinLocked joins the instance at the ref key k with its verdict again
// (its level's panic changed) and reports whether its item changed.
func (v *view) rejoinLocked(k string) bool {
	cur, ok := v.state.Get(k)
	if !ok {
		return false
	}
	next := *cur
	next.Inst = cur.Inst.Clone()
	next.Inst.Health = v.health.Health(k, cur.Inst)
	if next.Inst.Equal(cur.Inst) {
		return false
	}
	next.Rev = v.state.Rev()
	v.state.Set(&next, next.Rev)
	v.health.Count(k, &cur.Inst, &next.Inst)
	return true
}

// verdictLocked returns the verdict on the ref key k that counts: the
// most recent of those the sets of Ready pods hold (newerVerdict).
func (v *view) verdictLocked(k string) (beacon.Health, bool) {
	var best liveVerdict
	for setKey := range v.verdictSets[k] {
		s := v.sets[setKey]
		if v.readyCount[s.pod] == 0 {
			continue
		}
		best = newerVerdict(best, liveVerdict{h: s.verdicts[k], set: s})
	}
	return best.h, best.set != nil
}

func instanceOf(it *item) *beacon.Instance {
	if it == nil {
		return nil
	}
	return &it.Inst
}

// candidatesLocked returns what the objects of Ready pods offer at the ref
// key k.
func (v *view) candidatesLocked(k string) []candidate {
	var out []candidate
	for setKey := range v.refSets[k] {
		s := v.sets[setKey]
		if v.readyCount[s.pod] == 0 {
			continue
		}
		for _, in := range s.instances {
			if refKey(in.Ref()) == k {
				out = append(out, candidate{inst: in, set: s})
				break
			}
		}
	}
	return out
}
