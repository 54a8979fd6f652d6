package drill

import (
	"context"
	"errors"
	"fmt"
	"sync"
	"time"

	"github.com/beaconplane/beacon"
	"github.com/beaconplane/beacon/internal/gate"
	"github.com/beaconplane/beacon/registry"
	"github.com/beaconplane/beacon/store"
	"github.com/beaconplane/beacon/store/etcd"
)

// openStore connects a client of its own (as a separate process would
// have) to endpoints.
func (r *runner) openStore(ctx context.Context, endpoints []string) (*etcd.Store, error) {
	cfg := r.cfg.Store
	cfg.Endpoints = endpoints
	if cfg.Logger == nil {
		cfg.Logger = r.cfg.Log
	}
	ctx, cancel := context.WithTimeout(ctx, 30*time.Second)
	defer cancel()
	return etcd.Open(ctx, cfg)
}

// fleet is the steady registrants: one registry (and client) each, one
// instance each.
type fleet struct {
	ns     string
	stores []*etcd.Store
	regs   []*registry.StoreRegistry
	insts  []registry.Registration

	mu          sync.Mutex
	addrs       map[string]string // ref → advertised address
	lost        int               // leases lost so far (recovered under a new lease)
	kept        int               // losses by the session's clock whose lease etcd kept
	unconfirmed int               // times a session had no renewal answered for a TTL
	revoked     int               // leases etcd ended although the session renewed them in time
	revokedRefs []string          // the instance of each such lease, in order
	open        int               // losses not recovered yet
	why         []string          // what happened each time
	wg          sync.WaitGroup
}

func (r *runner) newFleet(ctx context.Context, endpoints []string, ns string) (*fleet, error) {
	f := &fleet{ns: ns, addrs: map[string]string{}}
	for i := range r.cfg.Sessions {
		st, err := r.openStore(ctx, endpoints)
		if err != nil {
			f.close()
			return nil, err
		}
		f.stores = append(f.stores, st)
		// Every keep-alive interval the session also verifies its keys
		// (a List): the slow work that once stood in the keep-alive path
		// runs all through every fault.
		reg, err := registry.New(st, registry.Config{LeaseTTL: r.cfg.TTL, VerifyInterval: r.cfg.TTL / 3,
			Logger: r.cfg.Log.With("session", i)})
		if err != nil {
			f.close()
			return nil, err
		}
		f.regs = append(f.regs, reg)
		in, err := reg.Register(ctx, beacon.Instance{Namespace: ns, Component: "steady", Endpoint: "rpc",
			Address: fmt.Sprintf("10.55.%d.%d:7000", i/250, i%250+1), Transport: "tcp"})
		if err != nil {
			f.close()
			return nil, fmt.Errorf("register steady instance %d: %w", i, err)
		}
		f.insts = append(f.insts, in)
		ref := in.Instance().Ref().String()
		f.addrs[in.Instance().Ref().String()] = in.Instance().Address
		f.wg.Add(1)
		go func() {
			defer f.wg.Done()
			var held store.LeaseID
			var lostErr error
			unconfirmed := false     // no renewal answered for a TTL, etcd not asked yet
			lostUnconfirmed := false // the loss came after such a TTL
			for c := range reg.States() {
				if c.State == registry.StateActive || c.State == registry.StateRecovered {
					switch {
					case errors.Is(c.Err, registry.ErrLeaseUnconfirmed):
						if !unconfirmed {
							f.mu.Lock()
							f.unconfirmed++
							f.mu.Unlock()
						}
						unconfirmed = true
					case c.Err == nil:
						unconfirmed = false
					}
				}
				switch c.State {
				case registry.StateActive:
					held = c.Lease
				case registry.StateLost:
					f.mu.Lock()
					if lostErr == nil {
						f.open++
						lostUnconfirmed = unconfirmed
					}
					f.mu.Unlock()
					lostErr, unconfirmed = c.Err, false
				case registry.StateRecovered:
					if lostErr == nil {
						continue
					}
					f.mu.Lock()
					f.open--
					switch {
					case c.Lease == held:
						f.kept++
						f.why = append(f.why, fmt.Sprintf("session %d reported its lease lost by its own clock (%v) and found etcd had kept it", i, lostErr))
					case errors.Is(lostErr, store.ErrLeaseNotFound) && !lostUnconfirmed:
						// etcd ended a lease the session had renewed in
						// time (no renewal had gone unanswered for a TTL).
						f.revoked++
						f.revokedRefs = append(f.revokedRefs, ref)
						f.why = append(f.why, fmt.Sprintf("session %d: etcd revoked lease %x, renewed in time: %v", i, held, lostErr))
					default:
						f.lost++
						f.why = append(f.why, fmt.Sprintf("session %d lost lease %x: %v", i, held, lostErr))
					}
					f.mu.Unlock()
					held, lostErr = c.Lease, nil
				}
			}
		}()
	}
	return f, nil
}

// lostCount returns the number of leases lost so far, of losses by the
// sessions' clocks whose leases etcd kept, and of leases etcd revoked
// although they were renewed in time.
func (f *fleet) lostCount() (lost, kept, revoked int) {
	f.mu.Lock()
	defer f.mu.Unlock()
	return f.lost, f.kept, f.revoked
}

// unconfirmedCount returns how many times so far a session had no renewal
// answered for a whole TTL.
func (f *fleet) unconfirmedCount() int {
	f.mu.Lock()
	defer f.mu.Unlock()
	return f.unconfirmed
}

// whyCount returns the number of loss reports so far.
func (f *fleet) whyCount() int {
	f.mu.Lock()
	defer f.mu.Unlock()
	return len(f.why)
}

// want returns the expected view: every steady instance at its address.
func (f *fleet) want() map[string]string {
	f.mu.Lock()
	defer f.mu.Unlock()
	out := make(map[string]string, len(f.addrs))
	for k, v := range f.addrs {
		out[k] = v
	}
	return out
}

// update changes instance i's address.
func (f *fleet) update(ctx context.Context, i int, addr string) error {
	err := f.insts[i].Update(ctx, func(in *beacon.Instance) { in.Address = addr })
	if err != nil {
		return err
	}
	f.mu.Lock()
	f.addrs[f.insts[i].Instance().Ref().String()] = addr
	f.mu.Unlock()
	return nil
}

// active waits until every session holds its lease and every loss was
// accounted for.
func (f *fleet) active(ctx context.Context) error {
	for {
		f.mu.Lock()
		ok := f.open == 0
		f.mu.Unlock()
		for _, reg := range f.regs {
			if s := reg.State(); s != registry.StateActive && s != registry.StateRecovered {
				ok = false
			}
		}
		if ok {
			return nil
		}
		select {
		case <-ctx.Done():
			return fmt.Errorf("steady sessions not all active: %w", ctx.Err())
		case <-time.After(50 * time.Millisecond):
		}
	}
}

func (f *fleet) close() {
	for _, reg := range f.regs {
		_ = reg.Close()
	}
	f.wg.Wait()
	for _, st := range f.stores {
		_ = st.Close()
	}
}

// watcher is one registry following the fleet's namespace.
type watcher struct {
	name string
	st   *etcd.Store
	reg  *registry.StoreRegistry
	w    registry.Watcher
	done chan struct{}
	held gate.Gate // a slow consumer: while held, the watcher sits on the batch it took

	mu        sync.Mutex
	view      map[string]beacon.Instance
	changed   chan struct{} // closed at every batch
	err       error
	stale     int
	events    int
	batches   int
	convBatch int                  // batches when the view first matched wantView
	removals  map[string]int       // removals of each ref since mark
	tracked   map[string]bool      // refs whose disappearance the trial times
	goneAt    map[string]time.Time // first batch since mark that left a tracked ref out
	wantView  map[string]string    // ref → address the trial waits for (nil: none)
	converged time.Time            // when the view first matched wantView
}

func (r *runner) newWatcher(ctx context.Context, name string, endpoints []string, ns string) (*watcher, error) {
	st, err := r.openStore(ctx, endpoints)
	if err != nil {
		return nil, err
	}
	reg, err := registry.New(st, registry.Config{LeaseTTL: r.cfg.TTL, Logger: r.cfg.Log.With("watcher", name)})
	if err != nil {
		_ = st.Close()
		return nil, err
	}
	w, err := reg.Watch(context.Background(), beacon.Query{Namespace: ns})
	if err != nil {
		_ = reg.Close()
		_ = st.Close()
		return nil, err
	}
	wt := &watcher{name: name, st: st, reg: reg, w: w, done: make(chan struct{}), view: map[string]beacon.Instance{},
		changed: make(chan struct{}), removals: map[string]int{}, goneAt: map[string]time.Time{}}
	go wt.run()
	return wt, nil
}

func (w *watcher) run() {
	defer close(w.done)
	for {
		b, err := w.w.Next(context.Background())
		_ = w.held.Wait(context.Background()) // released by close at the latest
		now := time.Now()
		w.mu.Lock()
		if err != nil {
			w.err = err
			close(w.changed)
			w.changed = make(chan struct{})
			w.mu.Unlock()
			return
		}
		w.batches++
		switch b.Kind {
		case registry.Stale:
			w.stale++
		case registry.Snapshot:
			w.view = map[string]beacon.Instance{}
		}
		for _, e := range b.Events {
			ref := e.Instance.Ref().String()
			w.events++
			if e.Type == beacon.Removed {
				delete(w.view, ref)
				w.removals[ref]++
			} else {
				w.view[ref] = e.Instance
			}
		}
		for ref := range w.tracked {
			if _, ok := w.view[ref]; !ok {
				if _, seen := w.goneAt[ref]; !seen {
					w.goneAt[ref] = now
				}
			}
		}
		if w.wantView != nil && w.converged.IsZero() && w.matchesLocked() {
			w.converged, w.convBatch = now, w.batches
		}
		close(w.changed)
		w.changed = make(chan struct{})
		w.mu.Unlock()
	}
}

// matchesLocked reports whether the view is exactly wantView.
func (w *watcher) matchesLocked() bool {
	if len(w.view) != len(w.wantView) {
		return false
	}
	for ref, addr := range w.wantView {
		in, ok := w.view[ref]
		if !ok || in.Address != addr {
			return false
		}
	}
	return true
}

// waitFor waits until cond holds on the watcher (checked at every batch),
// bounded by ctx.
func (w *watcher) waitFor(ctx context.Context, what string, cond func(w *watcher) bool) error {
	for {
		w.mu.Lock()
		ok, ch, err := cond(w), w.changed, w.err
		w.mu.Unlock()
		if ok {
			return nil
		}
		if err != nil {
			return fmt.Errorf("watcher %s ended waiting for %s: %w", w.name, what, err)
		}
		select {
		case <-ch:
		case <-ctx.Done():
			return fmt.Errorf("watcher %s: %s: %w", w.name, what, ctx.Err())
		}
	}
}

// mark starts a trial: forget removals, track refs' disappearance, and
// wait for want (nil: nothing yet).
func (w *watcher) mark(track ...string) {
	w.mu.Lock()
	defer w.mu.Unlock()
	w.removals = map[string]int{}
	w.goneAt = map[string]time.Time{}
	w.tracked = map[string]bool{}
	for _, ref := range track {
		w.tracked[ref] = true
	}
	w.wantView, w.converged = nil, time.Time{}
}

// expect sets the view the trial waits for; if it already matches,
// convergence is now.
func (w *watcher) expect(want map[string]string) {
	w.mu.Lock()
	defer w.mu.Unlock()
	w.wantView, w.converged = want, time.Time{}
	if w.matchesLocked() {
		w.converged = time.Now()
	}
	close(w.changed)
	w.changed = make(chan struct{})
}

func (w *watcher) close() {
	w.held.Release()
	_ = w.w.Close()
	<-w.done
	_ = w.reg.Close()
	_ = w.st.Close()
}

var errNoConvergence = errors.New("watchers did not converge")
