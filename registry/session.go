package registry

import (
	"bytes"
	"context"
	"errors"
	"fmt"
	"slices"
	"sort"
	"sync"
	"time"

	"github.com/beaconplane/beacon"
	"github.com/beaconplane/beacon/store"
)

// maxTxnOps bounds the operations of one transaction (etcd's default
// --max-txn-ops is 128).
const maxTxnOps = 128

// statesBuffer is the capacity of the States channel.
const statesBuffer = 16

// oldLeasesKept is how many previous leases a session remembers, so that it
// recognises its own keys still bound to one of them.
const oldLeasesKept = 8

// session holds the registry's lease: it grants it at the first Register,
// and when the lease is lost, retries forever with capped backoff to get a
// new one and write every registration again with the same IDs.
//
// Two goroutines share the work, so that nothing slow ever stands between
// the lease and its renewal:
//   - the keeper (keeper.go) only renews the lease, every TTL/3, each
//     attempt bounded by keepAliveTimeout (TTL/6, at most 2 s) and retried
//     at once when it times out, until one succeeds or the store says the
//     lease ended (never by the session's own clock: past a TTL without an
//     answer the lease is only unconfirmed);
//   - the worker (loop) does everything else: recovery after a loss,
//     writing registrations whose epoch is behind, retrying conflicts and
//     verifying every key now and then, each store call bounded by
//     workTimeout.
//
// Registrations are written in epochs: every lease change starts a new
// epoch, and the worker writes every registration whose epoch is behind.
type session struct {
	r *StoreRegistry

	startSem chan struct{} // held while the first lease is granted

	mu      sync.Mutex
	state   State
	started bool
	lease   store.LeaseID
	held    bool          // the keeper renews lease (cleared when it is lost)
	ttl     time.Duration // as granted
	epoch   uint64
	lastOK  time.Time // start of the last successful keep-alive (or grant)
	// unconfirmed: no keep-alive of lease answered for a whole TTL, and
	// the store has not said it ended (keeper.go).
	unconfirmed bool
	suspect     bool          // the lost lease may still be alive: try it first
	ready       chan struct{} // closed while state is active or recovered
	regs        map[string]*registration
	old         []store.LeaseID // previous leases, newest last
	conflict    int             // registrations in conflict, as last reported
	kick        chan struct{}   // wakes the worker
	keepKick    chan struct{}   // wakes the keeper: the lease changed

	statesMu     sync.Mutex
	states       chan StateChange
	statesClosed bool
}

func newSession(r *StoreRegistry) *session {
	s := &session{
		r:        r,
		startSem: make(chan struct{}, 1),
		ready:    make(chan struct{}),
		regs:     make(map[string]*registration),
		kick:     make(chan struct{}, 1),
		keepKick: make(chan struct{}, 1),
		states:   make(chan StateChange, statesBuffer),
	}
	r.m.initState(StateIdle)
	return s
}

func (s *session) currentState() State {
	s.mu.Lock()
	defer s.mu.Unlock()
	return s.state
}

func (s *session) currentLease() store.LeaseID {
	s.mu.Lock()
	defer s.mu.Unlock()
	if s.state == StateActive || s.state == StateRecovered {
		return s.lease
	}
	return store.NoLease
}

// ours reports whether id is a lease this session holds or held.
func (s *session) oursLocked(id store.LeaseID) bool {
	return id != store.NoLease && (id == s.lease || slices.Contains(s.old, id))
}

func (s *session) ours(id store.LeaseID) bool {
	s.mu.Lock()
	defer s.mu.Unlock()
	return s.oursLocked(id)
}

// setLeaseLocked switches to a new lease and starts a new epoch.
func (s *session) setLeaseLocked(l store.LeaseID, ttl time.Duration) {
	if s.lease != store.NoLease && s.lease != l && !slices.Contains(s.old, s.lease) {
		s.old = append(s.old, s.lease)
		if len(s.old) > oldLeasesKept {
			s.old = s.old[1:]
		}
	}
	s.lease, s.ttl, s.held = l, ttl, true
	s.setUnconfirmedLocked(false)
	s.epoch++
	s.lastOK = time.Now()
	select {
	case s.keepKick <- struct{}{}:
	default:
	}
}

func (s *session) setStateLocked(to State) {
	s.r.m.setState(s.state, to)
	s.state = to
}

// emit delivers a state change, dropping the oldest undelivered one if the
// buffer is full.
func (s *session) emit(c StateChange) {
	c.At = time.Now()
	s.statesMu.Lock()
	defer s.statesMu.Unlock()
	if s.statesClosed {
		return
	}
	for {
		select {
		case s.states <- c:
			return
		default:
		}
		select {
		case <-s.states:
		default:
		}
	}
}

// conflictsLocked lists the registrations another process holds.
func (s *session) conflictsLocked() []beacon.Ref {
	var out []beacon.Ref
	for _, reg := range s.regs {
		if reg.admitted && errors.Is(reg.err, beacon.ErrAlreadyRegistered) {
			out = append(out, reg.ref)
		}
	}
	sort.Slice(out, func(i, j int) bool { return out[i].String() < out[j].String() })
	return out
}

// changeLocked builds a StateChange for the current state.
func (s *session) changeLocked(err error) StateChange {
	c := StateChange{State: s.state, Err: err}
	if s.state == StateActive || s.state == StateRecovered {
		c.Lease = s.lease
	}
	conflicts := s.conflictsLocked()
	s.r.m.addConflicts(len(conflicts) - s.conflict)
	s.conflict = len(conflicts)
	c.Conflicts = conflicts
	for _, reg := range s.regs {
		if reg.admitted && reg.err == nil {
			c.Registered++
		}
	}
	if c.Err == nil && len(conflicts) > 0 {
		c.Err = fmt.Errorf("%w: %d instance(s) held by another live process; retrying", beacon.ErrAlreadyRegistered, len(conflicts))
	}
	return c
}

func (s *session) kickLoop() {
	select {
	case s.kick <- struct{}{}:
	default:
	}
}

// acquire returns the current lease and epoch, granting the first lease if
// needed and waiting (bounded by ctx) while a lost lease is recovered.
func (s *session) acquire(ctx context.Context) (store.LeaseID, uint64, error) {
	for {
		s.mu.Lock()
		switch s.state {
		case StateClosed:
			s.mu.Unlock()
			return 0, 0, ErrClosed
		case StateActive, StateRecovered:
			l, e := s.lease, s.epoch
			s.mu.Unlock()
			return l, e, nil
		}
		started, ready := s.started, s.ready
		s.mu.Unlock()
		if !started {
			if err := s.start(ctx); err != nil {
				return 0, 0, err
			}
			continue
		}
		select {
		case <-ready:
		case <-ctx.Done():
			return 0, 0, fmt.Errorf("%w (waiting for the session to recover: %w)", ctx.Err(), ErrLeaseLost)
		case <-s.r.ctx.Done():
			return 0, 0, ErrClosed
		}
	}
}

// start grants the first lease and starts the keep-alive loop.
func (s *session) start(ctx context.Context) error {
	select {
	case s.startSem <- struct{}{}:
	case <-ctx.Done():
		return ctx.Err()
	}
	defer func() { <-s.startSem }()
	s.mu.Lock()
	started := s.started
	s.mu.Unlock()
	if started {
		return nil
	}
	l, err := s.r.st.Grant(ctx, s.r.cfg.LeaseTTL)
	if err != nil {
		return fmt.Errorf("registry: grant the session lease: %w", err)
	}
	s.mu.Lock()
	if s.state == StateClosed {
		s.mu.Unlock()
		_ = s.revoke(l.ID, l.TTL) // best effort: the lease expires anyway
		return ErrClosed
	}
	s.setLeaseLocked(l.ID, l.TTL)
	s.started = true
	s.setStateLocked(StateActive)
	close(s.ready)
	c := s.changeLocked(nil)
	s.mu.Unlock()
	if !s.r.spawn(s.keeper) || !s.r.spawn(s.loop) {
		return ErrClosed
	}
	s.r.log.Info("session lease granted", "lease", fmt.Sprintf("%x", l.ID), "ttl", l.TTL)
	if w := TTLWarning(s.r.cfg.LeaseTTL); w != "" {
		s.r.log.Warn("lease TTL below the shortest that rides out an etcd leader election", "ttl", s.r.cfg.LeaseTTL,
			"min_election_ttl", MinElectionTTL, "warning", w)
	}
	s.emit(c)
	return nil
}

// leaseGone is called when a write found the lease ended.
func (s *session) leaseGone(l store.LeaseID, err error) {
	s.markLost(l, err, false)
}

// markLost records that lease l ended (or may have: suspect) if it is still
// the session's lease: the keeper stops renewing it, and an active session
// moves to StateLost and wakes the worker to recover. During a recovery
// (already StateLost) it only makes the recovery start over.
func (s *session) markLost(l store.LeaseID, err error, suspect bool) {
	s.mu.Lock()
	if s.lease != l || !s.held {
		s.mu.Unlock()
		return
	}
	s.held = false
	s.setUnconfirmedLocked(false)
	if s.state != StateActive && s.state != StateRecovered {
		s.suspect = suspect
		s.mu.Unlock()
		return
	}
	s.setStateLocked(StateLost)
	s.suspect = suspect
	s.ready = make(chan struct{})
	c := s.changeLocked(fmt.Errorf("%w: %w", ErrLeaseLost, err))
	s.mu.Unlock()
	s.r.m.leaseLost()
	s.r.log.Error("session lease lost: instances are not advertised until re-registered; retrying",
		"lease", fmt.Sprintf("%x", l), "err", err)
	s.emit(c)
	s.kickLoop()
}

// loop is the worker: it recovers the lease when lost and writes the
// registrations whose epoch is behind. It never renews the lease (the
// keeper does), so nothing it waits for can cost the lease.
func (s *session) loop() {
	timer := time.NewTimer(s.interval())
	defer timer.Stop()
	lastReconcile, lastVerify := time.Now(), time.Now()
	for {
		select {
		case <-s.r.ctx.Done():
			return
		case <-timer.C:
		case <-s.kick:
			if !timer.Stop() {
				select {
				case <-timer.C:
				default:
				}
			}
		}
		if s.currentState() == StateLost {
			s.recover()
		} else {
			// Write late registrations at once; retry conflicts once per
			// keep-alive interval; check every key now and then.
			switch {
			case s.r.cfg.VerifyInterval > 0 && time.Since(lastVerify) >= s.r.cfg.VerifyInterval:
				s.reconcileStale(verifyAll)
				lastReconcile, lastVerify = time.Now(), time.Now()
			case s.hasStale() || time.Since(lastReconcile) >= s.interval():
				s.reconcileStale(staleAndConflicts)
				lastReconcile = time.Now()
			}
		}
		if s.r.ctx.Err() != nil {
			return
		}
		timer.Reset(s.interval())
	}
}

func (s *session) interval() time.Duration {
	s.mu.Lock()
	defer s.mu.Unlock()
	ttl := s.ttl
	if ttl == 0 {
		ttl = s.r.cfg.LeaseTTL
	}
	return keepAliveInterval(ttl)
}

// workTimeout bounds each store call of the worker (a listing, a
// transaction of up to maxTxnOps writes, a grant): a call stuck on a hung
// member fails and is retried (the store then reaches another member)
// instead of holding up recovery and verification. It is a third of the
// TTL, at least 1 s and at most 5 s.
func (s *session) workTimeout() time.Duration { return workTimeoutFor(s.r.cfg.LeaseTTL) }

func workTimeoutFor(ttl time.Duration) time.Duration {
	return min(max(ttl/3, time.Second), minOpTimeout)
}

// bounded runs fn with a context bounded by workTimeout (and by ctx).
func (s *session) bounded(ctx context.Context, fn func(ctx context.Context) error) error {
	cctx, cancel := context.WithTimeout(ctx, s.workTimeout())
	defer cancel()
	return fn(cctx)
}

// recover gets a lease again (the old one if it is still alive, else a new
// one) and writes every registration, retrying with backoff until it
// succeeds or the registry closes.
func (s *session) recover() {
	bo := newBackoff(s.r.cfg.RetryMax)
	for attempt := 1; ; attempt++ {
		err := s.tryRecover()
		if err == nil {
			return
		}
		if s.r.ctx.Err() != nil {
			return
		}
		d := bo.next()
		s.r.log.Warn("session recovery failed; retrying", "attempt", attempt, "err", err, "retry_in", d)
		if !sleep(s.r.ctx, d) {
			return
		}
	}
}

func (s *session) tryRecover() error {
	s.mu.Lock()
	old, suspect := s.lease, s.suspect
	s.mu.Unlock()
	ctx, cancel := s.r.opContext()
	defer cancel()
	var (
		lease store.LeaseID
		ttl   time.Duration
	)
	if suspect && old != store.NoLease {
		var granted time.Duration
		err := s.bounded(ctx, func(ctx context.Context) (err error) {
			granted, err = s.r.st.KeepAlive(ctx, old)
			return err
		})
		switch {
		case err == nil:
			lease, ttl = old, granted
		case errors.Is(err, store.ErrLeaseNotFound):
			s.mu.Lock()
			s.suspect = false
			s.mu.Unlock()
		default:
			return fmt.Errorf("keep-alive of the previous lease: %w", err)
		}
	}
	if lease == store.NoLease {
		var l store.Lease
		err := s.bounded(ctx, func(ctx context.Context) (err error) {
			l, err = s.r.st.Grant(ctx, s.r.cfg.LeaseTTL)
			return err
		})
		if err != nil {
			return fmt.Errorf("grant a new lease: %w", err)
		}
		lease, ttl = l.ID, l.TTL
	}
	s.mu.Lock()
	if s.state == StateClosed {
		s.mu.Unlock()
		if lease != old {
			_ = s.revoke(lease, ttl) // best effort: the lease expires anyway
		}
		return ErrClosed
	}
	s.setLeaseLocked(lease, ttl)
	// Until the registrations are written, a failure may leave the lease
	// alive: try it first next time.
	s.suspect = true
	epoch := s.epoch
	s.mu.Unlock()

	n, err := s.reconcile(ctx, lease, epoch, staleOnly)
	if err != nil {
		if errors.Is(err, store.ErrLeaseNotFound) {
			s.mu.Lock()
			s.suspect = false
			s.mu.Unlock()
		}
		return fmt.Errorf("re-register with lease %x: %w", lease, err)
	}
	s.mu.Lock()
	if s.state != StateLost || s.lease != lease {
		s.mu.Unlock()
		return nil
	}
	if !s.held {
		// The keeper lost the lease while the registrations were written.
		s.mu.Unlock()
		return fmt.Errorf("lease %x lapsed while re-registering", lease)
	}
	s.suspect = false
	s.setStateLocked(StateRecovered)
	close(s.ready)
	c := s.changeLocked(nil)
	s.mu.Unlock()
	s.r.m.recovered()
	s.r.log.Info("session recovered: instances re-registered", "lease", fmt.Sprintf("%x", lease),
		"written", n, "registered", c.Registered, "conflicts", len(c.Conflicts))
	if len(c.Conflicts) > 0 {
		s.logConflicts(c.Conflicts)
	}
	s.emit(c)
	return nil
}

func (s *session) logConflicts(refs []beacon.Ref) {
	for _, ref := range refs {
		s.r.log.Error("instance ID held by another live process: not advertised; retrying to reclaim it",
			"instance", ref.String())
	}
}

func (s *session) hasStale() bool {
	s.mu.Lock()
	defer s.mu.Unlock()
	for _, reg := range s.regs {
		if reg.admitted && reg.epoch != s.epoch {
			return true
		}
	}
	return false
}

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
	lease, epoch, before := s.lease, s.epoch, s.conflict
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
		if !reg.admitted {
			continue
		}
		if reg.epoch != epoch || (mode >= staleAndConflicts && reg.err != nil) || mode == verifyAll {
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
	type write struct {
		reg *registration
		op  store.Op
	}
	var writes []write
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
			s.mu.Lock()
			vanished := reg.epoch == epoch && reg.err == nil
			s.mu.Unlock()
			if vanished {
				s.r.log.Warn("registered instance vanished from the store (deleted by someone else?); registering it again",
					"instance", reg.ref.String())
			}
			writes = append(writes, write{reg, store.Op{Kind: store.OpPut, Key: reg.key, Value: reg.val, Lease: lease, IfAbsent: true}})
		case kv.Lease == lease && bytes.Equal(kv.Value, reg.val):
			reg.modRev, reg.lease = kv.ModRevision, lease
			s.setWritten(reg, epoch, nil)
		case s.ours(kv.Lease):
			writes = append(writes, write{reg, store.Op{Kind: store.OpPut, Key: reg.key, Value: reg.val, Lease: lease, IfModRevision: kv.ModRevision}})
		default:
			s.setWritten(reg, epoch, holderError(reg.ref, kv))
		}
	}
	written := 0
	if s.r.tx != nil {
		for len(writes) > 0 {
			ops := make([]store.Op, len(writes))
			for i, w := range writes {
				ops[i] = w.op
			}
			rev, err := s.r.tx.Txn(ctx, ops...)
			if err == nil {
				for _, w := range writes {
					w.reg.modRev, w.reg.lease = rev, lease
					s.setWritten(w.reg, epoch, nil)
				}
				return written + len(writes), nil
			}
			var ce *store.ConflictError
			if !errors.As(err, &ce) {
				return written, err
			}
			// One key changed since the listing: settle it alone.
			i := slices.IndexFunc(writes, func(w write) bool { return w.reg.key == ce.Key })
			if i < 0 {
				return written, err
			}
			w := writes[i]
			writes = slices.Delete(writes, i, i+1)
			ok, err := s.writeOne(ctx, w.reg, w.reg.val, lease, epoch, drainAdopt)
			if err != nil {
				return written, err
			}
			if ok {
				written++
			}
		}
		return written, nil
	}
	for _, w := range writes {
		ok, err := s.writeOne(ctx, w.reg, w.reg.val, lease, epoch, drainAdopt)
		if err != nil {
			return written, err
		}
		if ok {
			written++
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
		switch {
		case errors.Is(err, store.ErrNotFound):
			rev, err := s.r.st.Create(ctx, reg.key, val, store.WithLease(lease))
			if errors.Is(err, store.ErrKeyExists) {
				continue
			}
			if err != nil {
				return false, err
			}
			reg.modRev, reg.lease, reg.val = rev, lease, val
			s.setWritten(reg, epoch, nil)
			return true, nil
		case err != nil:
			return false, err
		case kv.Lease == lease && bytes.Equal(kv.Value, val):
			reg.modRev, reg.lease, reg.val = kv.ModRevision, lease, val
			s.setWritten(reg, epoch, nil)
			return false, nil
		case s.ours(kv.Lease):
			rev, err := s.r.st.Update(ctx, reg.key, val, kv.ModRevision, store.WithLease(lease))
			if errors.Is(err, store.ErrConflict) || errors.Is(err, store.ErrNotFound) {
				continue
			}
			if err != nil {
				return false, err
			}
			reg.modRev, reg.lease, reg.val = rev, lease, val
			s.setWritten(reg, epoch, nil)
			return true, nil
		default:
			s.setWritten(reg, epoch, holderError(reg.ref, kv))
			return false, nil
		}
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

// setWritten records the outcome of writing reg in epoch.
func (s *session) setWritten(reg *registration, epoch uint64, err error) {
	s.mu.Lock()
	reg.epoch = epoch
	reg.err = err
	s.mu.Unlock()
}

// close revokes the lease and closes States.
func (s *session) close() error {
	s.mu.Lock()
	prev := s.state
	lease, ttl, started := s.lease, s.ttl, s.started
	s.held = false
	s.setUnconfirmedLocked(false)
	s.setStateLocked(StateClosed)
	n := 0
	for _, reg := range s.regs {
		if reg.admitted {
			n++
		}
	}
	s.r.m.addRegistrations(-n)
	s.r.m.addConflicts(-s.conflict)
	s.conflict = 0
	s.regs = map[string]*registration{}
	s.mu.Unlock()
	var err error
	if started && prev != StateClosed {
		err = s.revoke(lease, ttl)
	}
	s.emit(StateChange{State: StateClosed, Err: err})
	s.statesMu.Lock()
	s.statesClosed = true
	close(s.states)
	s.statesMu.Unlock()
	return err
}

// revoke ends a lease within one TTL. A lease already gone is fine.
func (s *session) revoke(l store.LeaseID, ttl time.Duration) error {
	if ttl <= 0 {
		ttl = s.r.cfg.LeaseTTL
	}
	ctx, cancel := context.WithTimeout(context.Background(), ttl)
	defer cancel()
	if err := s.r.st.Revoke(ctx, l); err != nil && !errors.Is(err, store.ErrLeaseNotFound) && !errors.Is(err, store.ErrClosed) {
		return fmt.Errorf("registry: revoke lease %x: %w", l, err)
	}
	return nil
}
