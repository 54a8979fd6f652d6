package kube

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"maps"
	"slices"
	"strings"
	"sync"
	"time"

	"github.com/beaconplane/beacon"
	"github.com/beaconplane/beacon/internal/wait"
	"github.com/beaconplane/beacon/registry"
	"github.com/beaconplane/beacon/registry/internal/defaults"
	apierrors "k8s.io/apimachinery/pkg/api/errors"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/apis/meta/v1/unstructured"
	"k8s.io/apimachinery/pkg/types"
)

// Registering. A process's registrations live in one InstanceSet, written
// whole with server-side apply by one goroutine (the writer): concurrent
// Register, Update and Close calls are coalesced into one write, and each
// call returns once a write that includes its change succeeded. A write
// that fails is retried with backoff until the InstanceSet holds what the
// process advertises; the call that made the change gets the error and its
// change is undone (Register, Update), so that nothing is half-written.
//
// The writer also follows the InstanceSet (a watch on that one object): if
// someone deletes it (kubectl) or edits it by hand, it is written again;
// if the pod itself is gone, writing stops; if another process (holding
// another incarnation ID) writes it, this process stops writing and every
// registration's Err reports ErrTakenOver.

const (
	retryFirst = 100 * time.Millisecond
	retryMax   = 5 * time.Second
)

type writer struct {
	r      *Registry
	ns     string
	name   string
	holder string
	pod    Pod

	mu       sync.Mutex
	regs     map[beacon.Ref]*registration
	gen      uint64 // bumped by every change of regs (or a forced re-write)
	applied  uint64 // gen of the last successful write
	attempt  uint64 // gen of the last write attempt
	lastErr  error  // error of the last attempt; nil if it succeeded
	fatal    error  // writing stopped for good (taken over, pod gone)
	uid      types.UID
	lastRV   int64
	lastSpec content  // what the last successful write applied
	inflight *content // what the write under way applies (nil: none)
	// verdicts are the verdicts of the checker this process runs
	// (VerdictSink), by ref key, written with the instances.
	verdicts map[string]beacon.Health
	tried    bool          // a write was attempted
	settled  chan struct{} // closed and replaced after every attempt
	kick     chan struct{}

	// followErr is why the watch of the process's own InstanceSet fails
	// (nil while it works): a deletion or edit by hand goes unnoticed.
	followErr error

	ctx    context.Context
	cancel context.CancelFunc
	wg     sync.WaitGroup
}

// writerFor returns the process's writer, starting it on first use: it
// checks the pod identity against the cluster and the writer's RBAC
// permissions first.
func (r *Registry) writerFor(ctx context.Context) (*writer, error) {
	r.writerMu.Lock()
	defer r.writerMu.Unlock()
	if r.writer != nil {
		return r.writer, nil
	}
	p := r.cfg.Pod
	if err := p.check(); err != nil {
		return nil, err
	}
	if err := r.checkAccess(ctx, r.writerPermissions()); err != nil {
		return nil, err
	}
	gctx, cancel := context.WithTimeout(ctx, r.cfg.Timeout)
	uid, containers, err := r.podInfo(gctx, p.Namespace, p.Name)
	cancel()
	switch {
	case apierrors.IsNotFound(err):
		return nil, fmt.Errorf("%w: there is no pod %q in namespace %q (%s, %s): set them from the Downward API "+
			"(fieldRef metadata.name, metadata.namespace)", ErrPodMismatch, p.Name, p.Namespace, EnvPodName, EnvPodNamespace)
	case err != nil:
		return nil, r.explain(op{"get", podsResource, p.Namespace}, err)
	case uid != p.UID:
		return nil, fmt.Errorf("%w: %s %q is not the UID of pod %s/%s (%s): set %s from the Downward API (fieldRef "+
			"metadata.uid); with a wrong UID the garbage collector would delete the InstanceSet at once",
			ErrPodMismatch, EnvPodUID, p.UID, p.Namespace, p.Name, uid, EnvPodUID)
	case p.Container != "" && !slices.Contains(containers, p.Container):
		return nil, fmt.Errorf("%w: %s %q is not a container of pod %s/%s (it has %s): in container mode each registering "+
			"container sets it to its own name; unset it for one InstanceSet per pod", ErrPodMismatch, EnvContainerName,
			p.Container, p.Namespace, p.Name, strings.Join(containers, ", "))
	}
	w := &writer{
		r:       r,
		ns:      p.Namespace,
		name:    p.resourceName(),
		holder:  newHolder(),
		pod:     p,
		regs:    map[beacon.Ref]*registration{},
		settled: make(chan struct{}),
		kick:    make(chan struct{}, 1),
	}
	w.ctx, w.cancel = context.WithCancel(r.ctx)
	w.wg.Add(2)
	go w.run()
	go w.follow()
	r.writer = w
	return w, nil
}

// bumpLocked records a change of what the process advertises.
func (w *writer) bumpLocked() uint64 {
	w.gen++
	select {
	case w.kick <- struct{}{}:
	default:
	}
	return w.gen
}

// run writes the InstanceSet whenever what the process advertises changed.
func (w *writer) run() {
	defer w.wg.Done()
	delay := time.Duration(0)
	for {
		if delay > 0 {
			if !wait.Sleep(w.ctx, delay) {
				return
			}
		} else {
			select {
			case <-w.ctx.Done():
				return
			case <-w.kick:
			}
		}
		w.mu.Lock()
		if w.gen == w.applied || w.fatal != nil {
			w.mu.Unlock()
			delay = 0
			continue
		}
		g := w.gen
		spec := w.contentLocked()
		body, err := w.render(spec)
		w.tried = true
		w.inflight = &spec
		w.mu.Unlock()

		var obj *unstructured.Unstructured
		if err == nil {
			ctx, cancel := context.WithTimeout(w.ctx, w.r.cfg.Timeout)
			start := time.Now()
			obj, err = w.r.dyn.Resource(GVR).Namespace(w.ns).Patch(ctx, w.name, types.ApplyPatchType, body,
				metav1.PatchOptions{FieldManager: FieldManager, Force: ptr(true)})
			w.r.m.write(err, time.Since(start))
			if err == nil {
				obj, err = w.converge(ctx, obj, spec)
			}
			cancel()
			if err != nil {
				err = w.r.explain(op{"patch", instanceSetsResource, w.ns}, err)
			}
		}
		if w.ctx.Err() != nil {
			return
		}
		w.mu.Lock()
		w.attempt = max(w.attempt, g)
		w.lastErr = err
		w.inflight = nil
		if err == nil {
			w.applied = max(w.applied, g)
			w.uid, w.lastRV, w.lastSpec = obj.GetUID(), max(w.lastRV, parseRV(obj.GetResourceVersion())), spec
		}
		close(w.settled)
		w.settled = make(chan struct{})
		pending := w.gen != w.applied
		n := len(w.regs)
		w.mu.Unlock()
		if err == nil {
			switch w.r.State() {
			case registry.StateIdle:
				w.r.transition(registry.StateActive, nil, n)
				w.wg.Add(1)
				go w.logVisibility()
			case registry.StateLost:
				w.r.transition(registry.StateRecovered, nil, n)
			}
		}
		switch {
		case err != nil:
			delay = min(max(2*delay, retryFirst), retryMax)
			w.r.log.Warn("writing the InstanceSet failed; retrying", "instanceset", w.ns+"/"+w.name, "err", err, "retry_in", delay)
		case pending:
			delay = 0
			select {
			case w.kick <- struct{}{}:
			default:
			}
		default:
			delay = 0
		}
	}
}

// converge removes from the InstanceSet what other field managers keep in
// it beside what this process applies — an instance added with kubectl
// edit, a field set in one of this process's instances, another owner —
// which a server-side apply cannot remove, since it removes only what its
// own field manager set. It JSON-patches the object as written (obj) until
// it holds exactly want, each operation guarded by a test of what it
// changes; a failed guard (the object changed meanwhile) is an error, and
// the write is retried.
func (w *writer) converge(ctx context.Context, obj *unstructured.Unstructured, want content) (*unstructured.Unstructured, error) {
	mine := make(map[beacon.Ref]beacon.Instance, len(want.instances))
	for _, in := range want.instances {
		mine[in.Ref()] = in
	}
	for range 3 {
		var ops []map[string]any
		guarded := func(path string, test any, op map[string]any) {
			ops = append(ops, map[string]any{"op": "test", "path": path, "value": test}, op)
		}
		owners, _, _ := unstructured.NestedSlice(obj.Object, "metadata", "ownerReferences")
		for i := len(owners) - 1; i >= 0; i-- {
			o, _ := owners[i].(map[string]any)
			if uid, _ := o["uid"].(string); uid != w.pod.UID {
				path := fmt.Sprintf("/metadata/ownerReferences/%d", i)
				guarded(path+"/uid", o["uid"], map[string]any{"op": "remove", "path": path})
			}
		}
		if c, ok, _ := unstructured.NestedString(obj.Object, "spec", "container"); ok && c != w.pod.Container && w.pod.Container == "" {
			guarded("/spec/container", c, map[string]any{"op": "remove", "path": "/spec/container"})
		}
		items, _, _ := unstructured.NestedSlice(obj.Object, "spec", "instances")
		for i := len(items) - 1; i >= 0; i-- { // from the end: removals leave earlier indexes alone
			raw, _ := json.Marshal(items[i])
			in, err := beacon.UnmarshalInstance(raw)
			m, _ := items[i].(map[string]any)
			path := fmt.Sprintf("/spec/instances/%d", i)
			want, ok := mine[in.Ref()]
			switch {
			case err != nil || !ok:
				guarded(path+"/id", m["id"], map[string]any{"op": "remove", "path": path})
			case !in.Equal(want):
				guarded(path+"/id", m["id"], map[string]any{"op": "replace", "path": path, "value": want})
			}
		}
		ops = append(ops, convergeVerdicts(obj, want.verdicts)...)
		if len(ops) == 0 {
			return obj, nil
		}
		body, err := json.Marshal(ops)
		if err != nil {
			return nil, fmt.Errorf("kube: encode a JSON patch: %w", err)
		}
		w.r.log.Warn("removing what someone else added to this process's InstanceSet", "instanceset", w.ns+"/"+w.name, "patch", string(body))
		start := time.Now()
		obj, err = w.r.dyn.Resource(GVR).Namespace(w.ns).Patch(ctx, w.name, types.JSONPatchType, body,
			metav1.PatchOptions{FieldManager: FieldManager})
		w.r.m.write(err, time.Since(start))
		if err != nil {
			return nil, err
		}
	}
	return nil, fmt.Errorf("kube: InstanceSet %s/%s keeps changing under this process's writes", w.ns, w.name)
}

// convergeVerdicts returns the guarded JSON patch operations that make the
// verdicts of obj exactly want: a verdict another field manager added is
// removed, one it changed is replaced.
func convergeVerdicts(obj *unstructured.Unstructured, want map[string]beacon.Health) []map[string]any {
	have, _, _ := unstructured.NestedMap(obj.Object, "spec", "verdicts")
	var ops []map[string]any
	for _, key := range slices.Sorted(maps.Keys(have)) {
		path := "/spec/verdicts/" + strings.NewReplacer("~", "~0", "/", "~1").Replace(key)
		raw, _ := json.Marshal(have[key])
		var h beacon.Health
		mine, ok := want[key]
		switch {
		case !ok:
			ops = append(ops, map[string]any{"op": "test", "path": path, "value": have[key]}, map[string]any{"op": "remove", "path": path})
		case json.Unmarshal(raw, &h) != nil || !sameHealth(h, mine):
			ops = append(ops, map[string]any{"op": "test", "path": path, "value": have[key]},
				map[string]any{"op": "replace", "path": path, "value": mine})
		}
	}
	return ops
}

// visibilityDelay is how long after its first write the registry checks
// that its pod is visible to watchers, and logs why if it is not.
const visibilityDelay = 15 * time.Second

// logVisibility checks once, visibilityDelay after the first write, that
// watchers can see this process's instances, and logs a warning saying why
// not ("registered but not visible": the pod is not Ready, or no labelled
// EndpointSlice lists it).
func (w *writer) logVisibility() {
	defer w.wg.Done()
	if !wait.Sleep(w.ctx, visibilityDelay) {
		return
	}
	ctx, cancel := context.WithTimeout(w.ctx, w.r.cfg.Timeout)
	defer cancel()
	vis, err := w.r.Visibility(ctx)
	switch {
	case w.ctx.Err() != nil:
	case err != nil:
		w.r.log.Debug("cannot check whether watchers see this process's instances", "err", err)
	case !vis.Visible:
		w.r.log.Warn("registered, but not visible to watchers", "reason", vis.Reason)
	}
}

// content is what one write of the InstanceSet applies.
type content struct {
	instances []beacon.Instance        // sorted
	verdicts  map[string]beacon.Health // by ref key
}

// matches reports whether the decoded set s holds exactly c.
func (c content) matches(s *setInfo) bool {
	return slices.EqualFunc(s.instances, c.instances, func(a, b beacon.Instance) bool { return a.Equal(b) }) &&
		maps.EqualFunc(s.verdicts, c.verdicts, func(a, b beacon.Health) bool { return sameHealth(a, b) })
}

// sameHealth compares two verdicts as stored (times by instant).
func sameHealth(a, b beacon.Health) bool {
	return (beacon.Instance{Health: &a}).Equal(beacon.Instance{Health: &b})
}

// contentLocked returns what to advertise: the instances, sorted, and the
// verdicts.
func (w *writer) contentLocked() content {
	out := make([]beacon.Instance, 0, len(w.regs))
	for _, reg := range w.regs {
		out = append(out, reg.inst.Clone())
	}
	sortInstances(out)
	return content{instances: out, verdicts: maps.Clone(w.verdicts)}
}

// bodyLocked renders the InstanceSet to apply.
func (w *writer) bodyLocked() ([]byte, error) {
	return w.render(w.contentLocked())
}

func (w *writer) render(c content) ([]byte, error) {
	ins := c.instances
	draining := 0
	for _, in := range ins {
		if !in.Serving() {
			draining++
		}
	}
	set := InstanceSet{
		TypeMeta: metav1.TypeMeta{APIVersion: Group + "/" + Version, Kind: Kind},
		ObjectMeta: metav1.ObjectMeta{
			Name:      w.name,
			Namespace: w.ns,
			OwnerReferences: []metav1.OwnerReference{{
				APIVersion: "v1", Kind: "Pod", Name: w.pod.Name, UID: types.UID(w.pod.UID),
				Controller: ptr(false), BlockOwnerDeletion: ptr(false),
			}},
		},
		Spec: InstanceSetSpec{
			Pod:           PodRef{Name: w.pod.Name, UID: w.pod.UID},
			Container:     w.pod.Container,
			Holder:        w.holder,
			InstanceCount: len(ins),
			DrainingCount: draining,
			Instances:     ins,
			Verdicts:      c.verdicts,
		},
	}
	body, err := json.Marshal(&set)
	if err != nil {
		return nil, fmt.Errorf("kube: encode InstanceSet: %w", err)
	}
	if len(body) > MaxObjectSize {
		return nil, fmt.Errorf("%w: %d bytes with %d instances and %d health verdicts, more than %d", ErrTooLarge, len(body), len(ins),
			len(c.verdicts), MaxObjectSize)
	}
	return body, nil
}

// wait returns once a write including change g succeeded, or with the
// error of the attempt that covered it.
func (w *writer) wait(ctx context.Context, g uint64) error {
	for {
		w.mu.Lock()
		switch {
		case w.applied >= g:
			w.mu.Unlock()
			return nil
		case w.fatal != nil:
			err := w.fatal
			w.mu.Unlock()
			return err
		case w.attempt >= g && w.lastErr != nil:
			err := w.lastErr
			w.mu.Unlock()
			return err
		}
		ch := w.settled
		w.mu.Unlock()
		select {
		case <-ch:
		case <-ctx.Done():
			return fmt.Errorf("kube: waiting for the InstanceSet write: %w", context.Cause(ctx))
		case <-w.ctx.Done():
			return registry.ErrClosed
		}
	}
}

// close stops the writer and deletes the InstanceSet (unless another
// process took it over).
func (w *writer) close() error {
	w.cancel()
	w.wg.Wait()
	w.mu.Lock()
	tried, fatal, uid := w.tried, w.fatal, w.uid
	for _, reg := range w.regs {
		reg.closed = true
	}
	clear(w.regs)
	w.mu.Unlock()
	if !tried || errors.Is(fatal, ErrTakenOver) {
		return nil
	}
	ctx, cancel := context.WithTimeout(context.Background(), w.r.cfg.Timeout)
	defer cancel()
	opts := metav1.DeleteOptions{}
	if uid != "" {
		opts.Preconditions = &metav1.Preconditions{UID: &uid}
	}
	err := w.r.dyn.Resource(GVR).Namespace(w.ns).Delete(ctx, w.name, opts)
	if err == nil || apierrors.IsNotFound(err) || apierrors.IsConflict(err) {
		return nil
	}
	return fmt.Errorf("%w (the garbage collector deletes it with the pod)", w.r.explain(op{"delete", instanceSetsResource, w.ns}, err))
}

// Register implements registry.Registrar. It needs the pod identity
// (Config.Pod): the first call checks it against the cluster, and checks
// the writer's RBAC permissions. An instance whose caller-chosen ID is held
// by another InstanceSet of the namespace gives an error matching
// beacon.ErrAlreadyRegistered (a check, not a lock: two processes claiming
// one ID at the same moment can both succeed, and watchers then see the
// older InstanceSet's; generated IDs are random 64-bit numbers).
func (r *Registry) Register(ctx context.Context, in beacon.Instance) (registry.Registration, error) {
	if r.closed.Load() {
		return nil, registry.ErrClosed
	}
	chosenID := in.ID != ""
	in, err := r.prepare(in)
	if err != nil {
		return nil, err
	}
	w, err := r.writerFor(ctx)
	if err != nil {
		return nil, err
	}
	ref := in.Ref()
	if err := w.checkLocal(ref); err != nil {
		return nil, err
	}
	if chosenID {
		if err := w.checkCluster(ctx, ref); err != nil {
			return nil, err
		}
	}
	reg := &registration{w: w, inst: in}
	w.mu.Lock()
	if err := w.checkLocalLocked(ref); err != nil {
		w.mu.Unlock()
		return nil, err
	}
	if w.fatal != nil {
		err := w.fatal
		w.mu.Unlock()
		return nil, err
	}
	w.regs[ref] = reg
	if _, err := w.bodyLocked(); err != nil {
		delete(w.regs, ref)
		w.mu.Unlock()
		return nil, fmt.Errorf("kube: register %s: %w", ref, err)
	}
	g := w.bumpLocked()
	w.mu.Unlock()
	r.m.registrations(1)
	if err := w.wait(ctx, g); err != nil {
		w.mu.Lock()
		if w.regs[ref] == reg {
			delete(w.regs, ref)
			reg.closed = true
			w.bumpLocked()
		}
		w.mu.Unlock()
		r.m.registrations(-1)
		return nil, fmt.Errorf("kube: register %s: %w", ref, err)
	}
	return reg, nil
}

func (w *writer) checkLocal(ref beacon.Ref) error {
	w.mu.Lock()
	defer w.mu.Unlock()
	return w.checkLocalLocked(ref)
}

func (w *writer) checkLocalLocked(ref beacon.Ref) error {
	if _, dup := w.regs[ref]; dup {
		return fmt.Errorf("%w: %s (by this process)", beacon.ErrAlreadyRegistered, ref)
	}
	return nil
}

// checkCluster looks for ref in the namespace's other InstanceSets.
func (w *writer) checkCluster(ctx context.Context, ref beacon.Ref) error {
	list, err := w.r.dyn.Resource(GVR).Namespace(w.ns).List(ctx, metav1.ListOptions{})
	if err != nil {
		return w.r.explain(op{"list", instanceSetsResource, w.ns}, err)
	}
	for i := range list.Items {
		if list.Items[i].GetName() == w.name {
			continue
		}
		s := w.r.parseSet(&list.Items[i])
		if s == nil {
			continue
		}
		for _, in := range s.instances {
			if in.Ref() == ref {
				return fmt.Errorf("%w: %s is held by InstanceSet %s (pod %s)", beacon.ErrAlreadyRegistered, ref, s.key, s.podName)
			}
		}
	}
	return nil
}

// prepare fills an instance's defaults and validates it, in a copy that
// the registration keeps. An instance that declares a TTL check is refused
// (checkRefused).
func (r *Registry) prepare(in beacon.Instance) (beacon.Instance, error) {
	in, err := defaults.Fill(in.Clone(), r.cfg.MaxMetadataSize)
	if err != nil {
		return beacon.Instance{}, err
	}
	if err := checkRefused(in); err != nil {
		return beacon.Instance{}, err
	}
	in.Health = nil // never stored
	return in, nil
}

// registration is one registered instance.
type registration struct {
	w      *writer
	inst   beacon.Instance // guarded by w.mu
	closed bool            // guarded by w.mu
}

var _ registry.Registration = (*registration)(nil)

// Instance implements registry.Registration.
func (g *registration) Instance() beacon.Instance {
	g.w.mu.Lock()
	defer g.w.mu.Unlock()
	return g.inst.Clone()
}

// Update implements registry.Registration.
func (g *registration) Update(ctx context.Context, mutate func(*beacon.Instance)) error {
	w := g.w
	w.mu.Lock()
	if g.closed {
		w.mu.Unlock()
		return fmt.Errorf("%w: %s was deregistered", beacon.ErrNotFound, g.inst.Ref())
	}
	cur := g.inst.Clone()
	w.mu.Unlock()
	next := cur.Clone()
	mutate(&next)
	if next.Ref() != cur.Ref() || !next.RegisteredAt.Equal(cur.RegisteredAt) {
		return fmt.Errorf("%w (%s)", registry.ErrIdentityChanged, cur.Ref())
	}
	if next.Status == "" {
		next.Status = beacon.StatusServing
	}
	if err := next.ValidateWith(w.r.cfg.MaxMetadataSize); err != nil {
		return err
	}
	if err := checkRefused(next); err != nil {
		return err
	}
	next.Health = nil // never stored
	return g.set(ctx, next)
}

// set advertises next instead of the current instance, undoing it if the
// write fails.
func (g *registration) set(ctx context.Context, next beacon.Instance) error {
	w := g.w
	w.mu.Lock()
	if g.closed {
		w.mu.Unlock()
		return fmt.Errorf("%w: %s was deregistered", beacon.ErrNotFound, g.inst.Ref())
	}
	if w.fatal != nil {
		err := w.fatal
		w.mu.Unlock()
		return err
	}
	prev := g.inst
	g.inst = next.Clone()
	if _, err := w.bodyLocked(); err != nil {
		g.inst = prev
		w.mu.Unlock()
		return fmt.Errorf("kube: update %s: %w", next.Ref(), err)
	}
	gen := w.bumpLocked()
	w.mu.Unlock()
	if err := w.wait(ctx, gen); err != nil {
		w.mu.Lock()
		if !g.closed && g.inst.Equal(next) {
			g.inst = prev
			w.bumpLocked()
		}
		w.mu.Unlock()
		return fmt.Errorf("kube: update %s: %w", next.Ref(), err)
	}
	return nil
}

// Drain implements registry.Registration: draining is the instance's status
// in the InstanceSet, as on every backend. The draining mark and the
// removal are each bounded by Config.Timeout and happen even after ctx
// ends.
func (g *registration) Drain(ctx context.Context, opts ...registry.DrainOption) error {
	w := g.w
	grace, ok := registry.DrainGraceOf(opts...)
	if !ok {
		grace = w.r.cfg.DrainGrace
	}
	w.mu.Lock()
	closed, next := g.closed, g.inst.Clone()
	w.mu.Unlock()
	if closed {
		return nil
	}
	var markErr error
	if next.Serving() {
		next.Status = beacon.StatusDraining
		mctx, cancel := context.WithTimeout(context.WithoutCancel(ctx), w.r.cfg.Timeout)
		markErr = g.set(mctx, next)
		cancel()
	}
	if markErr == nil && grace > 0 {
		wait.Sleep(ctx, grace)
	}
	return errors.Join(markErr, g.Close())
}

// Close implements registry.Registration: the instance is removed from the
// InstanceSet. If the write fails it is retried in the background (the
// error says so).
func (g *registration) Close() error {
	w := g.w
	w.mu.Lock()
	if g.closed {
		w.mu.Unlock()
		return nil
	}
	g.closed = true
	ref := g.inst.Ref()
	if w.regs[ref] == g {
		delete(w.regs, ref)
	}
	gen := w.bumpLocked()
	w.mu.Unlock()
	w.r.m.registrations(-1)
	ctx, cancel := w.r.opContext()
	defer cancel()
	err := w.wait(ctx, gen)
	if err == nil || errors.Is(err, registry.ErrClosed) || errors.Is(err, ErrTakenOver) {
		return nil
	}
	return fmt.Errorf("kube: deregister %s: %w (the removal is retried in the background until the registry is closed, "+
		"which deletes the InstanceSet; the garbage collector deletes it with the pod in any case)", ref, err)
}

// Err implements registry.Registration: why the instance is not in the
// InstanceSet right now (a write that keeps failing, or another process
// took the InstanceSet over), or nil. Readiness is not reported here: see
// Registry.Visibility.
func (g *registration) Err() error {
	w := g.w
	w.mu.Lock()
	defer w.mu.Unlock()
	switch {
	case g.closed:
		return nil
	case w.fatal != nil:
		return w.fatal
	case w.applied < w.gen && w.lastErr != nil:
		return fmt.Errorf("kube: not written yet (retrying): %w", w.lastErr)
	case w.followErr != nil && (errors.Is(w.followErr, ErrForbidden) || errors.Is(w.followErr, ErrUnauthorized)):
		// Not a passing outage: until it is fixed, a deletion of the
		// InstanceSet would leave the instance unadvertised, unnoticed.
		return fmt.Errorf("kube: cannot follow this process's InstanceSet (a deletion or edit by hand would go unnoticed): %w", w.followErr)
	}
	return nil
}

// followed records the outcome of a list or watch of the process's own
// InstanceSet (verb), logging when following starts failing, changes
// reason, or works again (a watch opens): without it the writer cannot see its InstanceSet
// deleted or edited, and client-go alone logs only its raw retries.
func (w *writer) followed(verb string, err error) {
	if err != nil && w.ctx.Err() != nil || err == nil && verb != "watch" {
		return // stopping; or a listing, which alone follows nothing
	}
	if err != nil {
		err = w.r.explain(op{verb, instanceSetsResource, w.ns}, err)
	}
	w.mu.Lock()
	prev := w.followErr
	w.followErr = err
	w.mu.Unlock()
	switch {
	case err != nil && (prev == nil || prev.Error() != err.Error()):
		w.r.log.Warn("cannot follow this process's InstanceSet; a deletion or edit by hand goes unnoticed until it can",
			"instanceset", w.ns+"/"+w.name, "err", err)
	case err == nil && prev != nil:
		w.r.log.Info("following this process's InstanceSet again", "instanceset", w.ns+"/"+w.name)
	}
}

// gone handles the watch of the process's own InstanceSet seeing it
// absent at revision rv.
func (w *writer) gone(rv int64) {
	w.mu.Lock()
	defer w.mu.Unlock()
	if w.fatal != nil || w.ctx.Err() != nil || w.uid == "" || rv <= w.lastRV || len(w.regs)+len(w.verdicts) == 0 {
		return // stopped, never written, a listing older than the last write, or nothing to advertise
	}
	w.uid = ""
	w.checkPodThenRewriteLocked()
}

// observed handles the watch of the process's own InstanceSet seeing it.
func (w *writer) observed(u *unstructured.Unstructured) {
	w.mu.Lock()
	defer w.mu.Unlock()
	if w.fatal != nil || w.ctx.Err() != nil {
		return
	}
	rv := parseRV(u.GetResourceVersion())
	if w.uid == "" || rv <= w.lastRV {
		return // not written yet, or not newer than this process's last write
	}
	holder, _, _ := unstructured.NestedString(u.Object, "spec", "holder")
	if holder != w.holder {
		w.fatal = fmt.Errorf("%w: InstanceSet %s/%s is now written by process %q: two processes of one pod register "+
			"under one identity; give each container its own %s", ErrTakenOver, w.ns, w.name, holder, EnvContainerName)
		w.r.log.Error("another process took over this process's InstanceSet; its registrations are no longer advertised",
			"instanceset", w.ns+"/"+w.name, "holder", holder)
		w.r.transition(registry.StateLost, w.fatal, len(w.regs))
		close(w.settled)
		w.settled = make(chan struct{})
		return
	}
	s, err := decodeSet(u, w.r.cfg.MaxMetadataSize)
	// The write under way may be seen before its answer is: its content is
	// this process's own, not an edit.
	foreignOwner := slices.ContainsFunc(u.GetOwnerReferences(), func(o metav1.OwnerReference) bool { return string(o.UID) != w.pod.UID })
	if err == nil && s.podUID == w.pod.UID && s.podName == w.pod.Name && !foreignOwner &&
		(w.lastSpec.matches(s) || (w.inflight != nil && w.inflight.matches(s))) {
		w.lastRV = rv
		return
	}
	w.r.log.Warn("this process's InstanceSet was changed by someone else; writing it again",
		"instanceset", w.ns+"/"+w.name, "resourceVersion", u.GetResourceVersion())
	w.bumpLocked()
}

// checkPodThenRewriteLocked re-writes a deleted InstanceSet unless its pod
// is gone (then the garbage collector deleted it, and writing it again
// would only make it delete it again).
func (w *writer) checkPodThenRewriteLocked() {
	w.wg.Add(1)
	go func() {
		defer w.wg.Done()
		ctx, cancel := context.WithTimeout(w.ctx, w.r.cfg.Timeout)
		uid, err := w.r.podUID(ctx, w.ns, w.pod.Name)
		cancel()
		w.mu.Lock()
		defer w.mu.Unlock()
		if (apierrors.IsNotFound(err) || (err == nil && uid != w.pod.UID)) && w.fatal == nil {
			w.fatal = fmt.Errorf("kube: pod %s/%s (UID %s) is gone: its InstanceSet was garbage-collected and is not written again",
				w.ns, w.pod.Name, w.pod.UID)
			w.r.log.Warn("this process's pod is gone; not writing its InstanceSet again", "pod", w.ns+"/"+w.pod.Name)
			w.r.transition(registry.StateLost, w.fatal, len(w.regs))
			close(w.settled)
			w.settled = make(chan struct{})
			return
		}
		if w.fatal != nil || w.ctx.Err() != nil {
			return
		}
		w.r.log.Warn("this process's InstanceSet was deleted by someone else; writing it again",
			"instanceset", w.ns+"/"+w.name)
		w.r.transition(registry.StateLost, fmt.Errorf("kube: InstanceSet %s/%s was deleted; writing it again", w.ns, w.name), len(w.regs))
		w.bumpLocked()
	}()
}
