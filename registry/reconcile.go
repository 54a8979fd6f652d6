package registry

import (
	"bytes"
	"context"
	"errors"
	"fmt"
	"slices"
	"sort"

	"github.com/beaconplane/beacon"
	"github.com/beaconplane/beacon/store"
)

// The reconciler: the session's worker makes the store hold what its
// registrations advertise, under the current lease (re-registration
// after a loss, registrations admitted during a recovery, conflicts
// retried, a periodic check of every key). It never overwrites a key
// another process holds (a key bound to a lease that is neither the
// session's nor one of its previous ones: leaseKeeper.ours), and it never
// undoes an operator's drain (adoptDrain).

// reconcileMode selects the registrations reconcile looks at.
type reconcileMode uint8

const (
	staleOnly         reconcileMode = iota // epoch behind the lease
	staleAndConflicts                      // and those another process holds
	verifyAll                              // every registration
)

// reconcileStale writes the registrations whose epoch is behind (admitted
// after a recovery started) and retries conflicts (or, with verifyAll,
// checks every registration), reporting a change in the conflicts.
func (s *session) reconcileStale(mode reconcileMode) {
	s.mu.Lock()
	if s.state != StateActive && s.state != StateRecovered {
		s.mu.Unlock()
		return
	}
	lease, _ := s.k.current()
	epoch, before := s.epoch, s.conflict
	s.mu.Unlock()
	ctx, cancel := s.r.opContext()
	defer cancel()
	if _, err := s.reconcile(ctx, lease, epoch, mode); err != nil {
		if errors.Is(err, store.ErrLeaseNotFound) {
			s.leaseGone(lease, err)
			return
		}
		if refused(err) {
			// etcd refused the session's credentials or permission (a
			// changed password, a revoked role): the process may no
			// longer advertise. Stop keeping the lease alive (its
			// instances expire with it) and retry until the authority
			// allows it again; the state says why.
			s.markLost(lease, err, false)
			return
		}
		if s.r.ctx.Err() == nil {
			s.r.log.Warn("writing registrations failed; retrying", "err", err)
		}
		return
	}
	s.mu.Lock()
	if s.state != StateActive && s.state != StateRecovered {
		s.mu.Unlock()
		return
	}
	after := len(s.conflictsLocked())
	if after == before {
		s.mu.Unlock()
		return
	}
	c := s.changeLocked(nil)
	s.mu.Unlock()
	if after > before {
		s.logConflicts(c.Conflicts)
	} else {
		s.r.log.Info("reclaimed instance IDs", "conflicts_left", after)
	}
	s.emit(c)
}

// reconcile makes the store hold the admitted registrations mode selects,
// as written under lease, in epoch. It returns the number of keys written.
func (s *session) reconcile(ctx context.Context, lease store.LeaseID, epoch uint64, mode reconcileMode) (int, error) {
	s.mu.Lock()
	var todo []*registration
	for _, reg := range s.regs {
		o := reg.outcome()
		if !o.admitted {
			continue
		}
		if o.epoch != epoch || (mode >= staleAndConflicts && o.err != nil) || mode == verifyAll {
			todo = append(todo, reg)
		}
	}
	s.mu.Unlock()
	if len(todo) == 0 {
		return 0, nil
	}
	sort.Slice(todo, func(i, j int) bool { return todo[i].key < todo[j].key })

	// Read what the store holds under each endpoint prefix once, rather
	// than one Get per instance.
	current := make(map[string]store.KeyValue)
	listed := make(map[string]bool)
	for _, reg := range todo {
		p := s.r.ks.Prefix(beacon.Query{Namespace: reg.ref.Namespace, Component: reg.ref.Component, Endpoint: reg.ref.Endpoint})
		if listed[p] {
			continue
		}
		var kvs []store.KeyValue
		err := s.bounded(ctx, func(ctx context.Context) (err error) {
			kvs, _, err = s.r.st.List(ctx, p)
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
		err := s.bounded(ctx, func(ctx context.Context) (err error) {
			w, err = s.writeChunk(ctx, chunk, current, lease, epoch)
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
func (s *session) writeChunk(ctx context.Context, chunk []*registration, current map[string]store.KeyValue, lease store.LeaseID, epoch uint64) (int, error) {
	for _, reg := range chunk {
		reg.wmu.Lock()
	}
	defer func() {
		for _, reg := range chunk {
			reg.wmu.Unlock()
		}
	}()
	writes := s.planWrites(chunk, current, lease, epoch)
	if s.r.tx != nil {
		return s.commitWrites(ctx, writes, lease, epoch)
	}
	written := 0
	for _, w := range writes {
		n, err := s.settle(ctx, w.reg, lease, epoch)
		written += n
		if err != nil {
			return written, err
		}
	}
	return written, nil
}

// settle writes reg alone (writeOne, adopting a drain made in the store)
// and returns the number of keys written (0 or 1).
func (s *session) settle(ctx context.Context, reg *registration, lease store.LeaseID, epoch uint64) (int, error) {
	ok, err := s.writeOne(ctx, reg, reg.val, lease, epoch, drainAdopt)
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
func (s *session) planWrites(chunk []*registration, current map[string]store.KeyValue, lease store.LeaseID, epoch uint64) []chunkWrite {
	var writes []chunkWrite
	for _, reg := range chunk {
		if reg.removed {
			continue
		}
		kv, exists := current[reg.key]
		if exists && s.ours(kv.Lease) {
			s.adoptDrain(reg, kv)
		}
		switch {
		case !exists:
			o := reg.outcome()
			if o.epoch == epoch && o.err == nil {
				s.r.log.Warn("registered instance vanished from the store (deleted by someone else?); registering it again",
					"instance", reg.ref.String())
			}
			writes = append(writes, chunkWrite{reg, store.Op{Kind: store.OpPut, Key: reg.key, Value: reg.val, Lease: lease, IfAbsent: true}})
		case kv.Lease == lease && bytes.Equal(kv.Value, reg.val):
			reg.modRev, reg.lease = kv.ModRevision, lease
			reg.setWritten(epoch, nil)
		case s.ours(kv.Lease):
			writes = append(writes, chunkWrite{reg, store.Op{Kind: store.OpPut, Key: reg.key, Value: reg.val, Lease: lease, IfModRevision: kv.ModRevision}})
		default:
			reg.setWritten(epoch, holderError(reg.ref, kv))
		}
	}
	return writes
}

// commitWrites sends writes in one transaction; a key that changed since
// the listing is settled alone (writeOne) and the rest sent again.
func (s *session) commitWrites(ctx context.Context, writes []chunkWrite, lease store.LeaseID, epoch uint64) (int, error) {
	written := 0
	for len(writes) > 0 {
		ops := make([]store.Op, len(writes))
		for i, w := range writes {
			ops[i] = w.op
		}
		rev, err := s.r.tx.Txn(ctx, ops...)
		if err == nil {
			for _, w := range writes {
				w.reg.modRev, w.reg.lease = rev, lease
				w.reg.setWritten(epoch, nil)
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
		n, err := s.settle(ctx, w.reg, lease, epoch)
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
	// drainAdopt adopts the drain and writes reg.val, now draining
	// (reconciling: val is reg.val).
	drainAdopt
	// drainYield adopts the drain and returns errDrainAdopted, so that the
	// caller (Update) computes its value again from the drained instance.
	drainYield
)

// errDrainAdopted tells Update that writeOne adopted an operator's drain.
var errDrainAdopted = errors.New("registry: adopted a drain made in the store")

// writeOne makes the store hold val at reg's key under lease, without ever
// overwriting a key another process holds. reg.wmu must be held. It reports
// whether it wrote; a conflict is recorded on reg, not returned. mode says
// what to do with a drain someone else made in the store.
func (s *session) writeOne(ctx context.Context, reg *registration, val []byte, lease store.LeaseID, epoch uint64, mode drainMode) (bool, error) {
	for range 8 {
		kv, err := s.r.st.Get(ctx, reg.key)
		if err == nil && mode != drainOverwrite && s.ours(kv.Lease) && s.adoptDrain(reg, kv) {
			if mode == drainYield {
				reg.modRev, reg.lease = kv.ModRevision, kv.Lease
				return false, errDrainAdopted
			}
			val = reg.val
		}
		var rev int64
		switch {
		case errors.Is(err, store.ErrNotFound):
			rev, err = s.r.st.Create(ctx, reg.key, val, store.WithLease(lease))
			if errors.Is(err, store.ErrKeyExists) {
				continue
			}
		case err != nil:
			return false, err
		case kv.Lease == lease && bytes.Equal(kv.Value, val):
			reg.modRev, reg.lease, reg.val = kv.ModRevision, lease, val
			reg.setWritten(epoch, nil)
			return false, nil
		case s.ours(kv.Lease):
			rev, err = s.r.st.Update(ctx, reg.key, val, kv.ModRevision, store.WithLease(lease))
			if errors.Is(err, store.ErrConflict) || errors.Is(err, store.ErrNotFound) {
				continue
			}
		default:
			reg.setWritten(epoch, holderError(reg.ref, kv))
			return false, nil
		}
		if err != nil {
			return false, err
		}
		reg.modRev, reg.lease, reg.val = rev, lease, val
		reg.setWritten(epoch, nil)
		return true, nil
	}
	return false, fmt.Errorf("registry: %s keeps changing under us; retrying later", reg.ref)
}

// adoptDrain adopts a drain someone else made in the store: kv, reg's key
// bound to one of the session's leases, holds reg's instance marked
// draining while reg advertises it serving. reg then advertises it
// draining (Instance, and every value the session writes), so that the
// session never undoes an operator's drain; the owner's Update may set
// Status again. It logs, counts and reports the adoption, and returns
// whether it adopted. reg.wmu must be held.
func (s *session) adoptDrain(reg *registration, kv store.KeyValue) bool {
	if reg.inst.Status != beacon.StatusServing || bytes.Equal(kv.Value, reg.val) {
		return false
	}
	stored, err := s.r.decode(kv)
	if err != nil || stored.Status != beacon.StatusDraining {
		return false
	}
	next := reg.inst.Clone()
	next.Status = beacon.StatusDraining
	val, err := encode(next, s.r.cfg.LeaseTTL)
	if err != nil {
		return false
	}
	reg.inst, reg.val = next, val
	reg.pub.Store(&next)
	s.r.m.drained()
	s.r.log.Warn("instance drained in the store by someone else (an operator?): advertising it as draining from now on; Update it with Status serving to serve again",
		"instance", reg.ref.String(), "revision", kv.ModRevision)
	s.mu.Lock()
	c := s.changeLocked(nil)
	s.mu.Unlock()
	c.Drained = []beacon.Ref{reg.ref}
	drained := fmt.Errorf("%w: %s", ErrDrainedElsewhere, reg.ref)
	if c.Err == nil {
		c.Err = drained
	} else {
		c.Err = errors.Join(c.Err, drained)
	}
	s.emit(c)
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
