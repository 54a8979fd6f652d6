package registry

import (
	"bytes"
	"context"
	"errors"
	"fmt"
	"sync"
	"sync/atomic"

	"github.com/beaconplane/beacon"
	"github.com/beaconplane/beacon/internal/wait"
	"github.com/beaconplane/beacon/store"
)

// registration is one instance registered through the session.
type registration struct {
	r   *StoreRegistry
	s   *session
	rc  *reconciler // the session's: its standing with the store
	key string
	ref beacon.Ref

	// val is what it advertises: its instance's stored value (encode),
	// the one copy of the instance it keeps; Instance decodes it. Replaced
	// whole (advertise), never changed in place: loaded without a lock,
	// stored with wmu held.
	val atomic.Pointer[[]byte]

	// Lock order: opMu before wmu before session.mu before reconciler.mu.
	opMu sync.Mutex // serialises Update, Drain and Close

	// standing is its standing with the store (admitted, epoch written,
	// conflict): the reconciler's, guarded by reconciler.mu, and read
	// only while the reconciler's map holds this registration.
	standing writeOutcome
	// held is whether the reconciler's map holds this registration at its
	// key (guarded by reconciler.mu; reserve sets it, letGoLocked and
	// close clear it, with the map). The registration's own paths read
	// it rather than look their key up: in a map of 100,000 keys the
	// lookup was a cache miss or three, a twentieth of a registration's
	// client CPU.
	held bool

	// wmu is held during every store write of this registration, by the
	// caller's goroutine or the session's worker (the reconciler).
	wmu      sync.Mutex
	lease    store.LeaseID
	modRev   int64
	removed  bool
	reported bool // a TTL report was written (report.go): deleted with the instance

	closeOnce sync.Once
	closeErr  error
}

var _ Registration = (*registration)(nil)

// spawn runs fn in a goroutine the registry owns, unless it is closed.
func (r *StoreRegistry) spawn(fn func()) bool {
	r.hub.mu.Lock()
	defer r.hub.mu.Unlock()
	if r.hub.closed {
		return false
	}
	r.wg.Add(1)
	go func() {
		defer r.wg.Done()
		fn()
	}()
	return true
}

// Register implements Registrar. Concurrent registrations are written
// together, in one transaction per batch, when the store supports
// transactions.
func (r *StoreRegistry) Register(ctx context.Context, in beacon.Instance) (Registration, error) {
	if err := r.refuseWrite("register an instance"); err != nil {
		return nil, err
	}
	if r.closed.Load() {
		return nil, ErrClosed
	}
	in, val, err := r.prepare(in, r.cfg.LeaseTTL)
	if err != nil {
		return nil, err
	}
	reg := &registration{r: r, s: r.sess, rc: r.sess.rc, key: r.ks.Key(in.Ref()), ref: in.Ref()}
	reg.advertise(val)
	if err := reg.rc.reserve(reg); err != nil {
		return nil, err
	}
	if err := r.register(ctx, reg); err != nil {
		reg.rc.unreserve(reg)
		return nil, err
	}
	return reg, nil
}

func (r *StoreRegistry) register(ctx context.Context, reg *registration) error {
	fo := r.newFailover()
	for {
		lease, epoch, err := r.sess.acquire(ctx)
		if err != nil {
			return err
		}
		reg.wmu.Lock()
		rev, err := r.create(ctx, reg.key, reg.value(), lease)
		if errors.Is(err, store.ErrKeyExists) {
			// Ours from an earlier lease is taken over; anyone else's is a
			// conflict.
			var (
				wrote    bool
				conflict error
			)
			wrote, conflict, err = reg.rc.writeOne(ctx, reg, reg.value(), lease, epoch, drainOverwrite)
			if err == nil && !wrote {
				err = conflict
			}
			if err == nil {
				rev = reg.modRev
			}
		}
		if err == nil {
			reg.modRev, reg.lease = rev, lease
		}
		reg.wmu.Unlock()
		switch {
		case err == nil:
			r.sess.admit(reg, epoch)
			return nil
		case errors.Is(err, beacon.ErrAlreadyRegistered):
			return err
		case errors.Is(err, store.ErrLeaseNotFound):
			r.sess.leaseGone(lease, err)
			continue
		case errors.Is(err, store.ErrInvalidKey), errors.Is(err, store.ErrValueTooLarge), errors.Is(err, store.ErrClosed):
			return fmt.Errorf("registry: register %s: %w", reg.ref, err)
		case fo.again(ctx, err):
			continue // create-if-absent: a repeat of a write that landed finds it ours
		}
		// The write may have been applied: make sure nothing stays behind.
		r.cleanup(reg.key, lease, reg.value(), reg)
		return fmt.Errorf("registry: register %s: %w", reg.ref, err)
	}
}

// create writes a new key bound to lease, batching with concurrent creates
// when the store supports transactions.
func (r *StoreRegistry) create(ctx context.Context, key string, val []byte, lease store.LeaseID) (int64, error) {
	if r.creates != nil {
		return r.creates.create(ctx, key, val, lease)
	}
	return r.st.Create(ctx, key, val, store.WithLease(lease))
}

// cleanup deletes key if it holds val under lease and no other
// registration claims it: the remains of a write whose outcome the caller
// never learnt (owner is the registration that attempted it, or nil).
func (r *StoreRegistry) cleanup(key string, lease store.LeaseID, val []byte, owner *registration) {
	r.retryInBackground(func(ctx context.Context) error {
		kv, err := r.st.Get(ctx, key)
		if errors.Is(err, store.ErrNotFound) {
			return nil
		}
		if err != nil {
			return err
		}
		if kv.Lease != lease || !bytes.Equal(kv.Value, val) || r.sess.rc.claimed(key, owner) {
			return nil
		}
		return r.deleteAt(ctx, key, kv.ModRevision)
	})
}

// undo deletes the write of key at modRev, unless the key changed since.
func (r *StoreRegistry) undo(key string, modRev int64) {
	r.retryInBackground(func(ctx context.Context) error { return r.deleteAt(ctx, key, modRev) })
}

func (r *StoreRegistry) deleteAt(ctx context.Context, key string, modRev int64) error {
	_, err := r.st.Delete(ctx, key, store.IfModRevision(modRev))
	if errors.Is(err, store.ErrNotFound) || errors.Is(err, store.ErrConflict) {
		return nil
	}
	return err
}

// retryInBackground runs fn until it succeeds, with backoff, at most 10
// times, in a goroutine the registry owns. (Close revokes the session
// lease, which removes whatever is left.)
func (r *StoreRegistry) retryInBackground(fn func(ctx context.Context) error) {
	r.spawn(func() {
		bo := newBackoff(r.cfg.RetryMax)
		for range 10 {
			ctx, cancel := r.opContext()
			err := fn(ctx)
			cancel()
			if err == nil || r.ctx.Err() != nil {
				return
			}
			r.log.Debug("background cleanup failed; retrying", "err", err)
			if !wait.Sleep(r.ctx, bo.next()) {
				return
			}
		}
	})
}

// admit starts tracking a registration written in epoch. If the lease
// changed meanwhile, the worker writes it again under the new one.
func (s *session) admit(reg *registration, epoch uint64) {
	if !s.rc.admit(reg, epoch) {
		return
	}
	s.mu.Lock()
	stale := epoch != s.epoch
	s.mu.Unlock()
	if stale {
		s.kickLoop()
	}
}

// value returns what reg advertises: its instance's stored value.
func (reg *registration) value() []byte { return *reg.val.Load() }

// advertise makes val (encode's) what reg advertises; reg.wmu must be held
// once reg is shared.
func (reg *registration) advertise(val []byte) { reg.val.Store(&val) }

// Instance implements Registration: the instance it advertises, decoded
// from its stored value. A registration keeps no decoded copy: at 100,000
// registrations the copy (a struct and its metadata map) was a third of
// the memory the registering process kept for each, and copying the map
// on the way in a twentieth of a registration's CPU.
func (reg *registration) Instance() beacon.Instance {
	in, err := reg.r.decode(store.KeyValue{Key: reg.key, Value: reg.value()})
	if err != nil { // what prepare encodes decodes to it (FuzzEncodeRoundTrips)
		panic(fmt.Sprintf("registry: the stored value of %s does not decode: %v", reg.ref, err))
	}
	return in
}

// Err implements Registration.
func (reg *registration) Err() error {
	s := reg.s
	s.mu.Lock()
	defer s.mu.Unlock()
	o := reg.rc.outcome(reg)
	switch {
	case !o.admitted:
		return nil
	case o.err != nil:
		return o.err
	case s.state == StateLost:
		return ErrLeaseLost
	case o.epoch != s.epoch:
		return fmt.Errorf("%w: %s not yet written under the new lease", ErrLeaseLost, reg.ref)
	}
	return nil
}

// Update implements Registration.
func (reg *registration) Update(ctx context.Context, mutate func(*beacon.Instance)) error {
	reg.opMu.Lock()
	defer reg.opMu.Unlock()
	return reg.update(ctx, mutate)
}

// maxDrainAdoptions bounds how often one Update starts again from an
// instance an operator drained meanwhile.
const maxDrainAdoptions = 8

func (reg *registration) update(ctx context.Context, mutate func(*beacon.Instance)) error {
	for range maxDrainAdoptions {
		cur := reg.Instance()
		next := cur.Clone()
		mutate(&next)
		if next.Namespace != cur.Namespace || next.Component != cur.Component || next.Endpoint != cur.Endpoint ||
			next.ID != cur.ID || !next.RegisteredAt.Equal(cur.RegisteredAt) {
			return fmt.Errorf("%w (%s)", ErrIdentityChanged, cur.Ref())
		}
		next.RegisteredAt = cur.RegisteredAt
		if next.Status == "" {
			next.Status = beacon.StatusServing
		}
		next.Health = nil // the checkers' verdict: never advertised by a registrant
		if err := next.ValidateWith(reg.r.cfg.MaxMetadataSize); err != nil {
			return err
		}
		val, err := encode(next, reg.r.cfg.LeaseTTL)
		if err != nil {
			return err
		}
		// An operator drained the instance in the store: start again
		// from it, so that the drain stays unless mutate sets Status.
		if err := reg.write(ctx, val); !errors.Is(err, errDrainAdopted) {
			return err
		}
	}
	return fmt.Errorf("registry: update %s: %w (the instance kept being drained in the store)", reg.ref, store.ErrConflict)
}

// write makes the store hold val (an instance's stored value) for reg, under the
// session's lease, with compare-and-swap. It returns errDrainAdopted when
// it found (and adopted) an operator's drain instead of writing.
func (reg *registration) write(ctx context.Context, val []byte) error {
	r := reg.r
	fo := r.newFailover()
	for {
		if r.closed.Load() {
			return ErrClosed
		}
		lease, epoch, err := reg.s.acquire(ctx)
		if err != nil {
			return err
		}
		reg.wmu.Lock()
		if reg.removed {
			reg.wmu.Unlock()
			return fmt.Errorf("registry: update %s: %w", reg.ref, errRemoved)
		}
		o := reg.rc.outcome(reg)
		current := o.epoch == epoch && o.err == nil
		if current && reg.lease == lease {
			var rev int64
			rev, err = r.st.Update(ctx, reg.key, val, reg.modRev, store.WithLease(lease))
			if err == nil {
				reg.modRev = rev
				reg.advertise(val)
				reg.wmu.Unlock()
				return nil
			}
		}
		if !current || errors.Is(err, store.ErrConflict) || errors.Is(err, store.ErrNotFound) {
			// Not written under this lease yet, or changed under us:
			// settle it key by key (never overwriting another process,
			// nor an operator's drain).
			var conflict error
			_, conflict, err = reg.rc.writeOne(ctx, reg, val, lease, epoch, drainYield)
			if errors.Is(err, errDrainAdopted) {
				reg.wmu.Unlock()
				return err
			}
			if err == nil {
				err = conflict
			}
			if err == nil {
				reg.wmu.Unlock() // writeOne advertised val
				return nil
			}
		}
		reg.wmu.Unlock()
		switch {
		case errors.Is(err, store.ErrLeaseNotFound):
			reg.s.leaseGone(lease, err)
			continue
		case errors.Is(err, beacon.ErrAlreadyRegistered):
			return err
		case fo.again(ctx, err):
			continue // compare-and-swap: a repeat of a write that landed finds it ours
		}
		// Unknown outcome: have the session write the registration again
		// (with what it advertises) on its next pass.
		reg.rc.invalidate(reg)
		reg.s.kickLoop()
		return fmt.Errorf("registry: update %s: %w", reg.ref, err)
	}
}

var errRemoved = errors.New("registration closed")

// Drain implements Registration.
func (reg *registration) Drain(ctx context.Context, opts ...DrainOption) error {
	o := drainOptions{grace: reg.r.cfg.DrainGrace}
	for _, opt := range opts {
		opt(&o)
	}
	// Marking draining is bounded by the TTL, not by ctx: ending ctx ends
	// the grace period, not the drain.
	mctx, cancel := context.WithTimeout(context.WithoutCancel(ctx), reg.r.cfg.LeaseTTL)
	reg.opMu.Lock()
	err := reg.update(mctx, func(in *beacon.Instance) { in.Status = beacon.StatusDraining })
	reg.opMu.Unlock()
	cancel()
	if errors.Is(err, errRemoved) {
		return nil
	}
	if err == nil && o.grace > 0 {
		wait.Sleep(ctx, o.grace)
	}
	if cerr := reg.Close(); cerr != nil {
		return errors.Join(err, cerr)
	}
	if err != nil {
		return fmt.Errorf("registry: drain %s: marking it draining failed, removed it anyway: %w", reg.ref, err)
	}
	return nil
}

// Close implements Registration.
func (reg *registration) Close() error {
	reg.closeOnce.Do(func() { reg.closeErr = reg.close() })
	return reg.closeErr
}

func (reg *registration) close() error {
	reg.opMu.Lock()
	defer reg.opMu.Unlock()
	r := reg.r
	conflicted := reg.rc.remove(reg).err != nil
	reg.wmu.Lock()
	defer reg.wmu.Unlock()
	reg.removed = true
	if r.closed.Load() || conflicted || reg.modRev == 0 {
		return nil // revoked with the lease, or never written
	}
	ctx, cancel := r.opContext()
	defer cancel()
	err := r.deleteIfOurs(ctx, reg.key, reg.modRev)
	if reg.reported {
		// Bound to the session's lease, which lives on: the checker would
		// read it for an instance registered again with this ID.
		if _, rerr := r.st.Delete(ctx, reg.key+ReportSuffix); rerr != nil && !errors.Is(rerr, store.ErrNotFound) {
			r.log.Debug("deleting a deregistered instance's TTL report failed; it ends with the session's lease",
				"instance", reg.ref.String(), "err", rerr)
		}
	}
	if err != nil && !errors.Is(err, ErrClosed) {
		// Keep trying in the background: the key is bound to the session
		// lease, which is kept alive, so it must not be left behind.
		r.cleanup(reg.key, reg.lease, reg.value(), reg)
		return fmt.Errorf("registry: deregister %s: %w (retrying in the background)", reg.ref, err)
	}
	return nil
}

// deleteIfOurs deletes key if it is still the write at modRev, or bound to
// one of the session's leases.
func (r *StoreRegistry) deleteIfOurs(ctx context.Context, key string, modRev int64) error {
	for range 8 {
		_, err := r.st.Delete(ctx, key, store.IfModRevision(modRev))
		switch {
		case err == nil, errors.Is(err, store.ErrNotFound):
			return nil
		case !errors.Is(err, store.ErrConflict):
			return err
		}
		kv, err := r.st.Get(ctx, key)
		if errors.Is(err, store.ErrNotFound) {
			return nil
		}
		if err != nil {
			return err
		}
		if !r.sess.ours(kv.Lease) {
			return nil // someone else's now
		}
		modRev = kv.ModRevision
	}
	return fmt.Errorf("registry: %s keeps changing; giving up deleting it", key)
}
