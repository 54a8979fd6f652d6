package registry

import (
	"context"
	"errors"
	"fmt"
	"time"

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

// keeper renews the session's lease every TTL/3 while one is held, until
// the registry closes.
func (s *session) keeper() {
	timer := time.NewTimer(time.Hour)
	defer timer.Stop()
	for {
		s.mu.Lock()
		l, held, due := s.lease, s.held, s.lastOK.Add(keepAliveInterval(s.ttl))
		s.mu.Unlock()
		wait := time.Until(due)
		if !held {
			wait = time.Hour
		}
		if wait > 0 {
			if !timer.Stop() {
				select {
				case <-timer.C:
				default:
				}
			}
			timer.Reset(wait)
			select {
			case <-s.r.ctx.Done():
				return
			case <-s.keepKick:
				continue // the lease changed: look again
			case <-timer.C:
				continue // due now (or the lease changed meanwhile)
			}
		}
		s.renew(l)
		if s.r.ctx.Err() != nil {
			return
		}
	}
}

// renew keeps lease l alive once, retrying until an attempt succeeds, the
// store says the lease ended (or refuses the credentials), or another
// lease replaced it. The session's own clock never declares the lease
// lost: when no attempt was answered for a whole TTL the lease is only
// unconfirmed (markUnconfirmed), because the store may well still hold it —
// a new etcd leader extends every lease by its TTL plus an election
// timeout, so a session that gave up by its own clock during an election
// re-registered for nothing — and the attempts go on, each one asking the
// store whether the lease is alive.
func (s *session) renew(l store.LeaseID) {
	bo := newBackoff(s.r.cfg.RetryMax)
	for {
		s.mu.Lock()
		if s.lease != l || !s.held {
			s.mu.Unlock()
			return
		}
		ttl := s.ttl
		deadline := s.lastOK.Add(ttl)
		s.mu.Unlock()
		limit := keepAliveTimeout(ttl)
		if remaining := time.Until(deadline); remaining > 0 {
			limit = min(limit, remaining) // unconfirmed is reported on time
		}
		start := time.Now()
		ctx, cancel := context.WithTimeout(s.r.ctx, limit)
		granted, err := s.r.st.KeepAlive(ctx, l)
		cancel()
		took := time.Since(start)
		switch {
		case err == nil:
			s.renewed(l, start, granted)
			return
		case s.r.ctx.Err() != nil:
			return
		case errors.Is(err, store.ErrLeaseNotFound):
			s.markLost(l, err, false)
			return
		case refused(err):
			// A changed password or a revoked user: retrying the same
			// credentials cannot succeed. Say so now rather than after a
			// TTL of failed keep-alives.
			s.markLost(l, err, false)
			return
		}
		s.r.m.keepAliveFailed()
		if !time.Now().Before(deadline) {
			s.markUnconfirmed(l, ttl, err)
		}
		d := s.retryDelay(bo, took, limit, deadline)
		s.r.log.Warn("session keep-alive failed; retrying", "lease", fmt.Sprintf("%x", l),
			"err", err, "took", took.Round(time.Millisecond), "retry_in", d,
			"since_last_renewal", time.Since(deadline.Add(-ttl)).Round(time.Millisecond), "ttl", ttl)
		if !sleep(s.r.ctx, d) {
			return
		}
	}
}

// retryDelay is the pause before the next keep-alive attempt. An attempt
// that used up its time already waited: the next goes at once (a hung
// member does not get it). One that failed fast (store unreachable) backs
// off, leaving time for more tries before the deadline, and with capped
// backoff once the deadline has passed.
func (s *session) retryDelay(bo *backoff, took, limit time.Duration, deadline time.Time) time.Duration {
	if took >= limit*3/4 {
		return 0
	}
	if remaining := time.Until(deadline); remaining > 0 {
		return min(bo.next(), remaining/4)
	}
	return bo.next()
}

// renewed records a successful keep-alive of l started at start, and a
// confirmation if the lease was unconfirmed.
func (s *session) renewed(l store.LeaseID, start time.Time, granted time.Duration) {
	s.mu.Lock()
	if s.lease != l || !s.held {
		s.mu.Unlock()
		return
	}
	s.lastOK, s.ttl = start, granted
	was := s.unconfirmed
	s.setUnconfirmedLocked(false)
	var c StateChange
	if was {
		c = s.changeLocked(nil)
	}
	s.mu.Unlock()
	if was {
		s.r.log.Info("session lease confirmed: the store renewed it; nothing was lost", "lease", fmt.Sprintf("%x", l), "ttl", granted)
		s.emit(c)
	}
}

// markUnconfirmed reports, once per episode, that no keep-alive of l was
// answered for a whole TTL (the last attempt failed with err).
func (s *session) markUnconfirmed(l store.LeaseID, ttl time.Duration, err error) {
	s.mu.Lock()
	if s.lease != l || !s.held || s.unconfirmed {
		s.mu.Unlock()
		return
	}
	s.setUnconfirmedLocked(true)
	c := s.changeLocked(fmt.Errorf("%w (no answer for %v: %w)", ErrLeaseUnconfirmed, ttl, err))
	s.mu.Unlock()
	s.r.log.Error("session lease unconfirmed: no keep-alive answered for a whole TTL; renewing it until the store answers (lost only if it says the lease ended)",
		"lease", fmt.Sprintf("%x", l), "ttl", ttl, "err", err)
	s.emit(c)
}

// setUnconfirmedLocked sets whether the lease is unconfirmed, keeping the
// metric in step.
func (s *session) setUnconfirmedLocked(on bool) {
	if s.unconfirmed == on {
		return
	}
	s.unconfirmed = on
	s.r.m.setUnconfirmed(on)
}
