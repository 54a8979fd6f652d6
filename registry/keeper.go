package registry

import (
	"context"
	"errors"
	"fmt"
	"log/slog"
	"slices"
	"sync"
	"time"

	"github.com/beaconplane/beacon/internal/wait"
	"github.com/beaconplane/beacon/store"
)

// The keeper renews the session lease and does nothing else: no listing,
// no write, no recovery ever runs in its goroutine, so a store call stuck
// on a hung member can delay a renewal by one attempt at most.
//
// The bound: a renewal starts TTL/3 after the last success and leaves 2/3
// of the TTL before the lease would expire (by the session's clock: etcd
// counts from when it renewed it, and extends every lease at an election). Each attempt is bounded by
// keepAliveTimeout (TTL/6, at least 100 ms, at most 2 s), and an attempt
// that timed out is retried at once (the etcd store then sends it to
// another member: see store/etcd's member probe). So even when every
// attempt that reaches a hung member waits out its whole timeout, at least
// four attempts fit before the lease expires, and the first that reaches a
// healthy member renews it.

// keepAliveInterval is the time between renewals: a third of the TTL.
func keepAliveInterval(ttl time.Duration) time.Duration {
	return max(ttl/3, 10*time.Millisecond)
}

// keepAliveTimeout bounds one keep-alive attempt.
func keepAliveTimeout(ttl time.Duration) time.Duration {
	return min(max(ttl/6, 100*time.Millisecond), 2*time.Second)
}

// oldLeasesKept is how many previous leases the keeper remembers (ours),
// so that the session recognises its own keys still bound to one of them:
// a lease given up without the store saying it ended (a refused renewal,
// a recovery that started over) lives on until its TTL runs out, and the
// keys written under it are the session's to take over, not another
// process's to respect.
const oldLeasesKept = 8

// leaseVerdicts is what the keeper tells its session. The keeper calls
// them without holding its own lock; each takes the session's lock, then
// the keeper's.
type leaseVerdicts interface {
	// markLost: the store said lease l ended (or refused the credentials).
	markLost(l store.LeaseID, err error, suspect bool)
	// reportUnconfirmed: no renewal of l was answered for a whole TTL.
	reportUnconfirmed(l store.LeaseID, ttl time.Duration, err error)
	// reportRenewed: a renewal of l started at start succeeded.
	reportRenewed(l store.LeaseID, start time.Time, granted time.Duration)
}

// leaseKeeper holds the session's lease and renews it every TTL/3, in its
// own goroutine (run), until the registry closes. It owns everything about
// the lease but its use: which lease, whether it is held (renewed), its
// TTL as granted, the last renewal, whether it is unconfirmed, and the
// ring of previous leases. It never declares a lease lost by its own
// clock (see renew). It takes no lock but its own.
type leaseKeeper struct {
	st       store.Store
	ctx      context.Context // the registry's: ends run and every attempt
	m        *metrics
	log      *slog.Logger
	retryMax time.Duration
	v        leaseVerdicts
	kick     chan struct{} // the lease changed: look again

	mu          sync.Mutex
	lease       store.LeaseID
	held        bool            // renewed (cleared when lost or closed)
	ttl         time.Duration   // as granted
	lastOK      time.Time       // start of the last successful renewal (or grant)
	unconfirmed bool            // no renewal answered for a whole TTL (and the store did not say it ended)
	old         []store.LeaseID // previous leases, newest last, at most oldLeasesKept
}

func newLeaseKeeper(r *StoreRegistry, v leaseVerdicts) *leaseKeeper {
	return &leaseKeeper{st: r.st, ctx: r.ctx, m: r.m, log: r.log, retryMax: r.cfg.RetryMax, v: v,
		kick: make(chan struct{}, 1)}
}

// hold switches to lease l, granted with ttl, and renews it from now on;
// the lease it replaces joins the ring of previous leases.
func (k *leaseKeeper) hold(l store.LeaseID, ttl time.Duration) {
	k.mu.Lock()
	if k.lease != store.NoLease && k.lease != l && !slices.Contains(k.old, k.lease) {
		k.old = append(k.old, k.lease)
		if len(k.old) > oldLeasesKept {
			k.old = k.old[1:]
		}
	}
	k.lease, k.ttl, k.held = l, ttl, true
	k.setUnconfirmedLocked(false)
	k.lastOK = time.Now()
	k.mu.Unlock()
	select {
	case k.kick <- struct{}{}:
	default:
	}
}

// drop stops renewing l and reports whether it was the lease held.
func (k *leaseKeeper) drop(l store.LeaseID) bool {
	k.mu.Lock()
	defer k.mu.Unlock()
	if k.lease != l || !k.held {
		return false
	}
	k.held = false
	k.setUnconfirmedLocked(false)
	return true
}

// holds reports whether l is the lease held.
func (k *leaseKeeper) holds(l store.LeaseID) bool {
	k.mu.Lock()
	defer k.mu.Unlock()
	return k.lease == l && k.held
}

// current returns the lease (held or not) and its TTL as granted.
func (k *leaseKeeper) current() (store.LeaseID, time.Duration) {
	k.mu.Lock()
	defer k.mu.Unlock()
	return k.lease, k.ttl
}

// ours reports whether id is the lease or one of the previous ones.
func (k *leaseKeeper) ours(id store.LeaseID) bool {
	k.mu.Lock()
	defer k.mu.Unlock()
	return id != store.NoLease && (id == k.lease || slices.Contains(k.old, id))
}

// interval is the time between renewals of the current lease (of a
// lease of fallback before the first grant).
func (k *leaseKeeper) interval(fallback time.Duration) time.Duration {
	k.mu.Lock()
	defer k.mu.Unlock()
	ttl := k.ttl
	if ttl == 0 {
		ttl = fallback
	}
	return keepAliveInterval(ttl)
}

// run renews the lease every TTL/3 while one is held, until the registry
// closes.
func (k *leaseKeeper) run() {
	timer := time.NewTimer(time.Hour)
	defer timer.Stop()
	for {
		k.mu.Lock()
		l, held, due := k.lease, k.held, k.lastOK.Add(keepAliveInterval(k.ttl))
		k.mu.Unlock()
		wait := time.Until(due)
		if !held {
			wait = time.Hour
		}
		if wait > 0 {
			timer.Reset(wait) // no drain: since Go 1.23 a Reset timer never delivers a stale tick
			select {
			case <-k.ctx.Done():
				return
			case <-k.kick:
				continue // the lease changed: look again
			case <-timer.C:
				continue // due now (or the lease changed meanwhile)
			}
		}
		k.renew(l)
		if k.ctx.Err() != nil {
			return
		}
	}
}

// renew keeps lease l alive once, retrying until an attempt succeeds, the
// store says the lease ended (or refuses the credentials), or another
// lease replaced it. The keeper's own clock never declares the lease
// lost: when no attempt was answered for a whole TTL the lease is only
// unconfirmed (reportUnconfirmed), because the store may well still hold
// it — a new etcd leader extends every lease by its TTL plus an election
// timeout, so a session that gave up by its own clock during an election
// re-registered for nothing — and the attempts go on, each one asking the
// store whether the lease is alive.
func (k *leaseKeeper) renew(l store.LeaseID) {
	bo := newBackoff(k.retryMax)
	for {
		k.mu.Lock()
		if k.lease != l || !k.held {
			k.mu.Unlock()
			return
		}
		ttl := k.ttl
		deadline := k.lastOK.Add(ttl)
		k.mu.Unlock()
		limit := keepAliveTimeout(ttl)
		if remaining := time.Until(deadline); remaining > 0 {
			limit = min(limit, remaining) // unconfirmed is reported on time
		}
		start := time.Now()
		ctx, cancel := context.WithTimeout(k.ctx, limit)
		granted, err := k.st.KeepAlive(ctx, l)
		cancel()
		took := time.Since(start)
		switch {
		case err == nil:
			k.v.reportRenewed(l, start, granted)
			return
		case k.ctx.Err() != nil:
			return
		case errors.Is(err, store.ErrLeaseNotFound):
			k.v.markLost(l, err, false)
			return
		case refused(err):
			// A changed password or a revoked user: retrying the same
			// credentials cannot succeed. Say so now rather than after a
			// TTL of failed keep-alives.
			k.v.markLost(l, err, false)
			return
		}
		k.m.keepAliveFailed()
		if !time.Now().Before(deadline) {
			k.v.reportUnconfirmed(l, ttl, err)
		}
		d := retryDelay(bo, took, limit, deadline)
		k.log.Warn("session keep-alive failed; retrying", "lease", fmt.Sprintf("%x", l),
			"err", err, "took", took.Round(time.Millisecond), "retry_in", d,
			"since_last_renewal", time.Since(deadline.Add(-ttl)).Round(time.Millisecond), "ttl", ttl)
		if !wait.Sleep(k.ctx, d) {
			return
		}
	}
}

// retryDelay is the pause before the next keep-alive attempt. An attempt
// that used up its time already waited: the next goes at once (a hung
// member does not get it). One that failed fast (store unreachable) backs
// off, leaving time for more tries before the deadline, and with capped
// backoff once the deadline has passed.
func retryDelay(bo *backoff, took, limit time.Duration, deadline time.Time) time.Duration {
	if took >= limit*3/4 {
		return 0
	}
	if remaining := time.Until(deadline); remaining > 0 {
		return min(bo.next(), remaining/4)
	}
	return bo.next()
}

// renewed records a successful renewal of l started at start. It reports
// whether l is held and whether it was unconfirmed (now confirmed).
func (k *leaseKeeper) renewed(l store.LeaseID, start time.Time, granted time.Duration) (held, was bool) {
	k.mu.Lock()
	defer k.mu.Unlock()
	if k.lease != l || !k.held {
		return false, false
	}
	k.lastOK, k.ttl = start, granted
	was = k.unconfirmed
	k.setUnconfirmedLocked(false)
	return true, was
}

// markUnconfirmed records that l went unanswered for a TTL; it reports
// whether that starts an episode (l held and not yet unconfirmed).
func (k *leaseKeeper) markUnconfirmed(l store.LeaseID) bool {
	k.mu.Lock()
	defer k.mu.Unlock()
	if k.lease != l || !k.held || k.unconfirmed {
		return false
	}
	k.setUnconfirmedLocked(true)
	return true
}

// setUnconfirmedLocked sets whether the lease is unconfirmed, keeping the
// gauge beacon_registry_lease_unconfirmed in step.
func (k *leaseKeeper) setUnconfirmedLocked(on bool) {
	if k.unconfirmed == on {
		return
	}
	k.unconfirmed = on
	k.m.setUnconfirmed(on)
}
