package registry

import (
	"context"
	"errors"
	"fmt"
	"sync"
	"time"

	"github.com/beaconplane/beacon"
	"github.com/beaconplane/beacon/internal/wait"
	"github.com/beaconplane/beacon/store"
)

// maxTxnOps bounds the operations of one transaction (etcd's default
// --max-txn-ops is 128).
const maxTxnOps = 128

// statesBuffer is the capacity of the States channel.
const statesBuffer = 16

// session holds the registry's lease: it grants it at the first Register,
// and when the lease is lost, retries forever with capped backoff to get a
// new one and write every registration again with the same IDs.
//
// Two goroutines share the work, so that nothing slow ever stands between
// the lease and its renewal:
//   - the lease keeper (keeper.go) only renews the lease, every TTL/3, each
//     attempt bounded by keepAliveTimeout (TTL/6, at most 2 s) and retried
//     at once when it times out, until one succeeds or the store says the
//     lease ended (never by the session's own clock: past a TTL without an
//     answer the lease is only unconfirmed);
//   - the worker (loop) does everything else: recovery after a loss,
//     writing registrations whose epoch is behind, retrying conflicts and
//     verifying every key now and then, each store call bounded by
//     workTimeoutFor the TTL.
//
// Registrations are written in epochs: every lease change starts a new
// epoch, and the worker has the reconciler (reconcile.go), which owns the
// registrations, write every one whose epoch is behind. The states, the parts and their lock order are drawn in
// session_design.md.
type session struct {
	r *StoreRegistry

	startSem chan struct{} // held while the first lease is granted

	k  *leaseKeeper // the lease: which, renewed, unconfirmed, previous ones
	rc *reconciler  // the registrations and their standing (reconcile.go)

	// Lock order: session.mu before leaseKeeper.mu and reconciler.mu.
	mu      sync.Mutex
	state   State
	started bool
	epoch   uint64
	suspect bool          // the lost lease may still be alive: try it first
	ready   chan struct{} // closed while state is active or recovered
	kick    chan struct{} // wakes the worker

	statesMu     sync.Mutex
	states       chan StateChange
	statesClosed bool
}

func newSession(r *StoreRegistry) *session {
	s := &session{
		r:        r,
		startSem: make(chan struct{}, 1),
		ready:    make(chan struct{}),
		kick:     make(chan struct{}, 1),
		states:   make(chan StateChange, statesBuffer),
	}
	s.k = newLeaseKeeper(r, s)
	s.rc = newReconciler(r, s.k, s)
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
		l, _ := s.k.current()
		return l
	}
	return store.NoLease
}

// ours reports whether id is a lease this session holds or held.
func (s *session) ours(id store.LeaseID) bool { return s.k.ours(id) }

// setLeaseLocked switches to a new lease and starts a new epoch.
func (s *session) setLeaseLocked(l store.LeaseID, ttl time.Duration) {
	s.k.hold(l, ttl)
	s.epoch++
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

// changeLocked builds a StateChange for the current state.
func (s *session) changeLocked(err error) StateChange {
	c := StateChange{State: s.state, Err: err}
	if s.state == StateActive || s.state == StateRecovered {
		c.Lease, _ = s.k.current()
	}
	c.Conflicts, c.Registered = s.rc.report()
	if c.Err == nil && len(c.Conflicts) > 0 {
		c.Err = fmt.Errorf("%w: %d instance(s) held by another live process; retrying", beacon.ErrAlreadyRegistered, len(c.Conflicts))
	}
	return c
}

// drainAdopted reports that the reconciler adopted a drain of ref made in
// the store by someone else.
func (s *session) drainAdopted(ref beacon.Ref) {
	s.mu.Lock()
	c := s.changeLocked(nil)
	s.mu.Unlock()
	c.Drained = []beacon.Ref{ref}
	drained := fmt.Errorf("%w: %s", ErrDrainedElsewhere, ref)
	if c.Err == nil {
		c.Err = drained
	} else {
		c.Err = errors.Join(c.Err, drained)
	}
	s.emit(c)
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
			l, _ := s.k.current()
			e := s.epoch
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
	if !s.r.spawn(s.k.run) || !s.r.spawn(s.loop) {
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

// reportRenewed records a successful renewal of l started at start, and
// reports a confirmation if the lease was unconfirmed.
func (s *session) reportRenewed(l store.LeaseID, start time.Time, granted time.Duration) {
	s.mu.Lock()
	held, was := s.k.renewed(l, start, granted)
	if !held || !was {
		s.mu.Unlock()
		return
	}
	c := s.changeLocked(nil)
	s.mu.Unlock()
	s.r.log.Info("session lease confirmed: the store renewed it; nothing was lost", "lease", fmt.Sprintf("%x", l), "ttl", granted)
	s.emit(c)
}

// reportUnconfirmed reports, once per episode, that no keep-alive of l was
// answered for a whole TTL (the last attempt failed with err).
func (s *session) reportUnconfirmed(l store.LeaseID, ttl time.Duration, err error) {
	s.mu.Lock()
	if !s.k.markUnconfirmed(l) {
		s.mu.Unlock()
		return
	}
	c := s.changeLocked(fmt.Errorf("%w (no answer for %v: %w)", ErrLeaseUnconfirmed, ttl, err))
	s.mu.Unlock()
	s.r.log.Error("session lease unconfirmed: no keep-alive answered for a whole TTL; renewing it until the store answers (lost only if it says the lease ended)",
		"lease", fmt.Sprintf("%x", l), "ttl", ttl, "err", err)
	s.emit(c)
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
	if !s.k.drop(l) {
		s.mu.Unlock()
		return
	}
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
		case <-s.kick: // the Reset below drops a tick due meanwhile (Go 1.23 timers)
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

func (s *session) interval() time.Duration { return s.k.interval(s.r.cfg.LeaseTTL) }

// workTimeoutFor bounds each store call of the worker (a listing, a
// transaction of up to maxTxnOps writes, a grant): a call stuck on a hung
// member fails and is retried (the store then reaches another member)
// instead of holding up recovery and verification. It is a third of the
// TTL, at least 1 s and at most 5 s.
func workTimeoutFor(ttl time.Duration) time.Duration {
	return min(max(ttl/3, time.Second), minOpTimeout)
}

// bounded runs fn with a context bounded by workTimeoutFor the lease TTL
// (and by ctx).
func (r *StoreRegistry) bounded(ctx context.Context, fn func(ctx context.Context) error) error {
	cctx, cancel := context.WithTimeout(ctx, workTimeoutFor(r.cfg.LeaseTTL))
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
		if !wait.Sleep(s.r.ctx, d) {
			return
		}
	}
}

func (s *session) tryRecover() error {
	s.mu.Lock()
	old, _ := s.k.current()
	suspect := s.suspect
	s.mu.Unlock()
	ctx, cancel := s.r.opContext()
	defer cancel()
	var (
		lease store.LeaseID
		ttl   time.Duration
	)
	if suspect && old != store.NoLease {
		var granted time.Duration
		err := s.r.bounded(ctx, func(ctx context.Context) (err error) {
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
		err := s.r.bounded(ctx, func(ctx context.Context) (err error) {
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

	n, err := s.rc.reconcile(ctx, lease, epoch, staleOnly)
	if err != nil {
		if errors.Is(err, store.ErrLeaseNotFound) {
			s.mu.Lock()
			s.suspect = false
			s.mu.Unlock()
		}
		return fmt.Errorf("re-register with lease %x: %w", lease, err)
	}
	s.mu.Lock()
	if cur, _ := s.k.current(); s.state != StateLost || cur != lease {
		s.mu.Unlock()
		return nil
	}
	if !s.k.holds(lease) {
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
	return s.rc.stale(s.epoch)
}

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
	epoch := s.epoch
	s.mu.Unlock()
	_, before := s.rc.conflicts()
	ctx, cancel := s.r.opContext()
	defer cancel()
	if _, err := s.rc.reconcile(ctx, lease, epoch, mode); err != nil {
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
	after, _ := s.rc.conflicts()
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

// close revokes the lease and closes States.
func (s *session) close() error {
	s.mu.Lock()
	prev := s.state
	lease, ttl := s.k.current()
	started := s.started
	s.k.drop(lease)
	s.setStateLocked(StateClosed)
	s.mu.Unlock()
	s.rc.close()
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
