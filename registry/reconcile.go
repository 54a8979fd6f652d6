package registry

import (
	"bytes"
	"context"
	"errors"
	"fmt"
	"slices"
	"sort"
	"sync"

	"github.com/beaconplane/beacon"
	"github.com/beaconplane/beacon/store"
)

// reconciler owns the session's registrations: the set of them (by key)
// and the standing of each with the store (admitted, the lease epoch it
// was last written in, a conflict). Its worker pass (reconcile, driven by
// the session's worker) makes the store hold what they advertise under the
// current lease (re-registration after a loss, registrations admitted
// during a recovery, conflicts retried, a periodic check of every key). It
// never overwrites a key another process holds (a key bound to a lease
// that is neither the session's nor one of its previous ones:
// leaseKeeper.ours), and it never undoes an operator's drain (adoptDrain).
//
// The session keeps the lease and the epoch; the reconciler is told them
// with each pass. It calls the session (drainAdopted) and the keeper (ours)
// without holding its own lock.
type reconciler struct {
	r     *StoreRegistry // the store, transactions, key space, config, log, metrics
	k     *leaseKeeper   // which leases are the session's (ours)
	notes reconcileNotes // the session, told of an adopted drain

	// Lock order: session.mu and registration.wmu before reconciler.mu; it
	// is held only around its own fields.
	mu       sync.Mutex
	closed   bool
	regs     map[string]*registration // by key: reserved, then admitted (their standing: registration.standing)
	conflict int                      // registrations in conflict, as last reported
}

// reconcileNotes is what the reconciler tells its session.
type reconcileNotes interface {
	// drainAdopted: the instance of ref was drained in the store by
	// someone else, and its registration now advertises it draining.
	drainAdopted(ref beacon.Ref)
}

// writeOutcome is a registration's standing with the store.
type writeOutcome struct {
	admitted bool   // written once and tracked by the session
	epoch    uint64 // lease epoch the key was last written in
	err      error  // why it is not advertised (conflict), or nil
}

func newReconciler(r *StoreRegistry, k *leaseKeeper, notes reconcileNotes) *reconciler {
	return &reconciler{r: r, k: k, notes: notes, regs: make(map[string]*registration)}
}

// reserve claims reg's key in this process.
func (rc *reconciler) reserve(reg *registration) error {
	rc.mu.Lock()
	defer rc.mu.Unlock()
	if rc.closed {
		return ErrClosed
	}
	if _, ok := rc.regs[reg.key]; ok {
		return fmt.Errorf("%w: %s is already registered by this process", beacon.ErrAlreadyRegistered, reg.ref)
	}
	reg.standing = writeOutcome{}
	rc.regs[reg.key] = reg
	reg.held = true
	return nil
}

// letGoLocked stops tracking reg, which holds its key.
func (rc *reconciler) letGoLocked(reg *registration) {
	delete(rc.regs, reg.key)
	reg.held = false
}

// unreserve gives up reg's key unless reg was admitted.
func (rc *reconciler) unreserve(reg *registration) {
	rc.mu.Lock()
	defer rc.mu.Unlock()
	if reg.held && !reg.standing.admitted {
		rc.letGoLocked(reg)
	}
}

// claimed reports whether a registration other than owner holds key.
func (rc *reconciler) claimed(key string, owner *registration) bool {
	rc.mu.Lock()
	defer rc.mu.Unlock()
	t, ok := rc.regs[key]
	return ok && t != owner
}

// admit records reg as written in epoch and tracked; it reports false
// when reg no longer holds its key (closed meanwhile).
func (rc *reconciler) admit(reg *registration, epoch uint64) bool {
	rc.mu.Lock()
	defer rc.mu.Unlock()
	if !reg.held {
		return false
	}
	reg.standing = writeOutcome{admitted: true, epoch: epoch}
	rc.r.m.addRegistrations(1)
	return true
}

// remove stops tracking reg and returns its last standing.
func (rc *reconciler) remove(reg *registration) writeOutcome {
	rc.mu.Lock()
	defer rc.mu.Unlock()
	if !reg.held {
		return writeOutcome{}
	}
	rc.letGoLocked(reg)
	if reg.standing.admitted {
		rc.r.m.addRegistrations(-1)
	}
	return reg.standing
}

// admitted returns the registration admitted at key, or nil.
func (rc *reconciler) admitted(key string) *registration {
	rc.mu.Lock()
	defer rc.mu.Unlock()
	if t := rc.regs[key]; t != nil && t.standing.admitted {
		return t
	}
	return nil
}

// outcome returns reg's standing (zero when it is not tracked).
func (rc *reconciler) outcome(reg *registration) writeOutcome {
	rc.mu.Lock()
	defer rc.mu.Unlock()
	if reg.held {
		return reg.standing
	}
	return writeOutcome{}
}

// setWritten records the outcome of writing reg in epoch.
func (rc *reconciler) setWritten(reg *registration, epoch uint64, err error) {
	rc.mu.Lock()
	defer rc.mu.Unlock()
	if reg.held {
		reg.standing.epoch, reg.standing.err = epoch, err
	}
}

// invalidate has the next pass write reg again.
func (rc *reconciler) invalidate(reg *registration) {
	rc.mu.Lock()
	defer rc.mu.Unlock()
	if reg.held {
		reg.standing.epoch = 0
	}
}

// conflictsLocked lists the admitted registrations another process holds.
func (rc *reconciler) conflictsLocked() []beacon.Ref {
	var out []beacon.Ref
	for _, t := range rc.regs {
		if t.standing.admitted && errors.Is(t.standing.err, beacon.ErrAlreadyRegistered) {
			out = append(out, t.ref)
		}
	}
	sort.Slice(out, func(i, j int) bool { return out[i].String() < out[j].String() })
	return out
}

// conflicts returns the registrations in conflict now and as last
// reported.
func (rc *reconciler) conflicts() (now, reported int) {
	rc.mu.Lock()
	defer rc.mu.Unlock()
	return len(rc.conflictsLocked()), rc.conflict
}

// report lists the conflicts and counts the registrations advertised,
// for a StateChange; the conflicts are reported (metric and count).
func (rc *reconciler) report() (conflicts []beacon.Ref, registered int) {
	rc.mu.Lock()
	defer rc.mu.Unlock()
	conflicts = rc.conflictsLocked()
	rc.r.m.addConflicts(len(conflicts) - rc.conflict)
	rc.conflict = len(conflicts)
	for _, t := range rc.regs {
		if t.standing.admitted && t.standing.err == nil {
			registered++
		}
	}
	return conflicts, registered
}

// stale reports whether an admitted registration is behind epoch.
func (rc *reconciler) stale(epoch uint64) bool {
	rc.mu.Lock()
	defer rc.mu.Unlock()
	for _, t := range rc.regs {
		if t.standing.admitted && t.standing.epoch != epoch {
			return true
		}
	}
	return false
}

// pending returns the admitted registrations mode selects for epoch,
// sorted by key.
func (rc *reconciler) pending(epoch uint64, mode reconcileMode) []*registration {
	rc.mu.Lock()
	var todo []*registration
	for _, t := range rc.regs {
		if !t.standing.admitted {
			continue
		}
		if t.standing.epoch != epoch || (mode >= staleAndConflicts && t.standing.err != nil) || mode == verifyAll {
			todo = append(todo, t)
		}
	}
	rc.mu.Unlock()
	sort.Slice(todo, func(i, j int) bool { return todo[i].key < todo[j].key })
	return todo
}

// close forgets every registration (the lease is revoked) and refuses
// new ones.
func (rc *reconciler) close() {
	rc.mu.Lock()
	defer rc.mu.Unlock()
	rc.closed = true
	n := 0
	for _, t := range rc.regs {
		if t.standing.admitted {
			n++
		}
		t.held = false
	}
	rc.r.m.addRegistrations(-n)
	rc.r.m.addConflicts(-rc.conflict)
	rc.conflict = 0
	rc.regs = map[string]*registration{}
}

// reconcileMode selects the registrations reconcile looks at.
type reconcileMode uint8

const (
	staleOnly         reconcileMode = iota // epoch behind the lease
	staleAndConflicts                      // and those another process holds
	verifyAll                              // every registration
)

// reconcile makes the store hold the admitted registrations mode selects,
// as written under lease, in epoch. It returns the number of keys written.
func (rc *reconciler) reconcile(ctx context.Context, lease store.LeaseID, epoch uint64, mode reconcileMode) (int, error) {
	todo := rc.pending(epoch, mode)
	if len(todo) == 0 {
		return 0, nil
	}

	// Read what the store holds under each endpoint prefix once, rather
	// than one Get per instance.
	current := make(map[string]store.KeyValue)
	listed := make(map[string]bool)
	for _, reg := range todo {
		p := rc.r.ks.Prefix(beacon.Query{Namespace: reg.ref.Namespace, Component: reg.ref.Component, Endpoint: reg.ref.Endpoint})
		if listed[p] {
			continue
		}
		var kvs []store.KeyValue
		err := rc.r.bounded(ctx, func(ctx context.Context) (err error) {
			kvs, _, err = rc.r.st.List(ctx, p)
			return err
		})
		if err != nil {
			return 0, fmt.Errorf("list %s: %w", p, err)
		}
		listed[p] = true
		for _, kv := range kvs {
			current[kv.Key] = kv
		}
	}

	written := 0
	for len(todo) > 0 {
		n := min(len(todo), maxTxnOps)
		chunk := todo[:n]
		todo = todo[n:]
		var w int
		err := rc.r.bounded(ctx, func(ctx context.Context) (err error) {
			w, err = rc.writeChunk(ctx, chunk, current, lease, epoch)
			return err
		})
		written += w
		if err != nil {
			return written, err
		}
	}
	return written, nil
}

// writeChunk writes up to maxTxnOps registrations: in one transaction when
// the store has them, falling back to one key at a time for keys that
// changed under it.
func (rc *reconciler) writeChunk(ctx context.Context, chunk []*registration, current map[string]store.KeyValue, lease store.LeaseID, epoch uint64) (int, error) {
	for _, reg := range chunk {
		reg.wmu.Lock()
	}
	defer func() {
		for _, reg := range chunk {
			reg.wmu.Unlock()
		}
	}()
	writes := rc.planWrites(chunk, current, lease, epoch)
	if rc.r.tx != nil {
		return rc.commitWrites(ctx, writes, lease, epoch)
	}
	written := 0
	for _, w := range writes {
		n, err := rc.settle(ctx, w.reg, lease, epoch)
		written += n
		if err != nil {
			return written, err
		}
	}
	return written, nil
}

// settle writes reg alone (writeOne, adopting a drain made in the store)
// and returns the number of keys written (0 or 1).
func (rc *reconciler) settle(ctx context.Context, reg *registration, lease store.LeaseID, epoch uint64) (int, error) {
	ok, _, err := rc.writeOne(ctx, reg, reg.value(), lease, epoch, drainAdopt)
	if ok {
		return 1, err
	}
	return 0, err
}

// chunkWrite is a write planWrites found needed.
type chunkWrite struct {
	reg *registration
	op  store.Op
}

// planWrites compares each registration of chunk with what the store
// held at the listing (current): it records those already written under
// lease and those another process holds, and returns the writes needed.
// The registrations' wmu must be held.
func (rc *reconciler) planWrites(chunk []*registration, current map[string]store.KeyValue, lease store.LeaseID, epoch uint64) []chunkWrite {
	var writes []chunkWrite
	for _, reg := range chunk {
		if reg.removed {
			continue
		}
		kv, exists := current[reg.key]
		if exists && rc.k.ours(kv.Lease) {
			rc.adoptDrain(reg, kv)
		}
		switch {
		case !exists:
			o := rc.outcome(reg)
			if o.epoch == epoch && o.err == nil {
				rc.r.log.Warn("registered instance vanished from the store (deleted by someone else?); registering it again",
					"instance", reg.ref.String())
			}
			writes = append(writes, chunkWrite{reg, store.Op{Kind: store.OpPut, Key: reg.key, Value: reg.value(), Lease: lease, IfAbsent: true}})
		case kv.Lease == lease && bytes.Equal(kv.Value, reg.value()):
			reg.modRev, reg.lease = kv.ModRevision, lease
			rc.setWritten(reg, epoch, nil)
		case rc.k.ours(kv.Lease):
			writes = append(writes, chunkWrite{reg, store.Op{Kind: store.OpPut, Key: reg.key, Value: reg.value(), Lease: lease, IfModRevision: kv.ModRevision}})
		default:
			rc.setWritten(reg, epoch, holderError(reg.ref, kv))
		}
	}
	return writes
}

// commitWrites sends writes in one transaction; a key that changed since
// the listing is settled alone (writeOne) and the rest sent again.
func (rc *reconciler) commitWrites(ctx context.Context, writes []chunkWrite, lease store.LeaseID, epoch uint64) (int, error) {
	written := 0
	for len(writes) > 0 {
		ops := make([]store.Op, len(writes))
		for i, w := range writes {
			ops[i] = w.op
		}
		rev, err := rc.r.tx.Txn(ctx, ops...)
		if err == nil {
			for _, w := range writes {
				w.reg.modRev, w.reg.lease = rev, lease
				rc.setWritten(w.reg, epoch, nil)
			}
			return written + len(writes), nil
		}
		var ce *store.ConflictError
		if !errors.As(err, &ce) {
			return written, err
		}
		// One key changed since the listing: settle it alone.
		i := slices.IndexFunc(writes, func(w chunkWrite) bool { return w.reg.key == ce.Key })
		if i < 0 {
			return written, err
		}
		w := writes[i]
		writes = slices.Delete(writes, i, i+1)
		n, err := rc.settle(ctx, w.reg, lease, epoch)
		written += n
		if err != nil {
			return written, err
		}
	}
	return written, nil
}

// drainMode says what writeOne does when it finds reg's instance drained
// in the store by someone else (adoptDrain).
type drainMode uint8

const (
	// drainOverwrite writes val regardless (a new registration).
	drainOverwrite drainMode = iota
	// drainAdopt adopts the drain and writes what reg advertises, now
	// draining (reconciling: val is reg.value()).
	drainAdopt
	// drainYield adopts the drain and returns errDrainAdopted, so that the
	// caller (Update) computes its value again from the drained instance.
	drainYield
)

// errDrainAdopted tells Update that writeOne adopted an operator's drain.
var errDrainAdopted = errors.New("registry: adopted a drain made in the store")

// writeOne makes the store hold val at reg's key under lease, without ever
// overwriting a key another process holds. reg.wmu must be held. It reports
// whether it wrote, and the conflict it found (also recorded as reg's
// standing; not an error of the write). mode says what to do with a drain
// someone else made in the store.
func (rc *reconciler) writeOne(ctx context.Context, reg *registration, val []byte, lease store.LeaseID, epoch uint64, mode drainMode) (wrote bool, conflict, err error) {
	for range 8 {
		kv, err := rc.r.st.Get(ctx, reg.key)
		if err == nil && mode != drainOverwrite && rc.k.ours(kv.Lease) && rc.adoptDrain(reg, kv) {
			if mode == drainYield {
				reg.modRev, reg.lease = kv.ModRevision, kv.Lease
				return false, nil, errDrainAdopted
			}
			val = reg.value()
		}
		var rev int64
		switch {
		case errors.Is(err, store.ErrNotFound):
			rev, err = rc.r.st.Create(ctx, reg.key, val, store.WithLease(lease))
			if errors.Is(err, store.ErrKeyExists) {
				continue
			}
		case err != nil:
			return false, nil, err
		case kv.Lease == lease && bytes.Equal(kv.Value, val):
			reg.modRev, reg.lease = kv.ModRevision, lease
			reg.advertise(val)
			rc.setWritten(reg, epoch, nil)
			return false, nil, nil
		case rc.k.ours(kv.Lease):
			rev, err = rc.r.st.Update(ctx, reg.key, val, kv.ModRevision, store.WithLease(lease))
			if errors.Is(err, store.ErrConflict) || errors.Is(err, store.ErrNotFound) {
				continue
			}
		default:
			conflict = holderError(reg.ref, kv)
			rc.setWritten(reg, epoch, conflict)
			return false, conflict, nil
		}
		if err != nil {
			return false, nil, err
		}
		reg.modRev, reg.lease = rev, lease
		reg.advertise(val)
		rc.setWritten(reg, epoch, nil)
		return true, nil, nil
	}
	return false, nil, fmt.Errorf("registry: %s keeps changing under us; retrying later", reg.ref)
}

// adoptDrain adopts a drain someone else made in the store: kv, reg's key
// bound to one of the session's leases, holds reg's instance marked
// draining while reg advertises it serving. reg then advertises it
// draining (Instance, and every value the session writes), so that the
// session never undoes an operator's drain; the owner's Update may set
// Status again. It logs, counts and reports the adoption, and returns
// whether it adopted. reg.wmu must be held.
func (rc *reconciler) adoptDrain(reg *registration, kv store.KeyValue) bool {
	if bytes.Equal(kv.Value, reg.value()) {
		return false
	}
	next := reg.Instance()
	if next.Status != beacon.StatusServing {
		return false
	}
	stored, err := rc.r.decode(kv)
	if err != nil || stored.Status != beacon.StatusDraining {
		return false
	}
	next.Status = beacon.StatusDraining
	val, err := encode(next, rc.r.cfg.LeaseTTL)
	if err != nil {
		return false
	}
	reg.advertise(val)
	rc.r.m.drained()
	rc.r.log.Warn("instance drained in the store by someone else (an operator?): advertising it as draining from now on; Update it with Status serving to serve again",
		"instance", reg.ref.String(), "revision", kv.ModRevision)
	rc.notes.drainAdopted(reg.ref)
	return true
}

// holderError describes a key another process holds.
func holderError(ref beacon.Ref, kv store.KeyValue) error {
	if kv.Lease == store.NoLease {
		return fmt.Errorf("%w: %s is stored without a lease (written by someone else since revision %d); not overwriting it",
			beacon.ErrAlreadyRegistered, ref, kv.CreateRevision)
	}
	return fmt.Errorf("%w: %s is held by another live process (lease %x, since revision %d); not overwriting it",
		beacon.ErrAlreadyRegistered, ref, kv.Lease, kv.CreateRevision)
}
